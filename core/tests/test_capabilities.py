"""Grants: intersect never widens (with attacks), saved grants on resume, and the store out of reach."""

# ``shell=`` here is the Capabilities shell grant, not subprocess's flag: S604.
# ruff: noqa: S604

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import Harness, defn, make_runtime, reply, run_to_rest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopwright import Capabilities, FileGrants, intersect
from loopwright._capabilities import capabilities_from_dict, capabilities_to_dict, is_within
from loopwright._config import definition_to_dict, load_assembly
from loopwright.errors import CapabilityError, GrantsError

SHELL_MODES = ["none", "loopApproval", "approval", "allow"]


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """granted/ (with a sub/ folder and a link to outside/), outside/ with a secret."""
    granted = tmp_path / "granted"
    (granted / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cret")
    (granted / "link").symlink_to(outside)
    return {"granted": granted.resolve(), "outside": outside.resolve(), "root": tmp_path.resolve()}


def caps(read: tuple[str, ...] = (), write: tuple[str, ...] = (), **kwargs: Any) -> Capabilities:
    return Capabilities(files=FileGrants(read=read, write=write), **kwargs)


# ------------------------------------------------------------------------------------------
# intersect never widens
# ------------------------------------------------------------------------------------------


def test_requested_root_inside_the_parent_is_kept(tree: dict[str, Path]) -> None:
    """A requested root under a parent root survives, resolved."""
    parent = caps(read=(str(tree["granted"]),))
    got = intersect(parent, caps(read=(str(tree["granted"] / "sub"),)))
    assert got.files.read == (str(tree["granted"] / "sub"),)


def test_requested_root_outside_the_parent_is_dropped(tree: dict[str, Path]) -> None:
    """A requested root outside every parent root is not granted."""
    parent = caps(read=(str(tree["granted"]),), write=(str(tree["granted"]),))
    got = intersect(parent, caps(read=(str(tree["outside"]),), write=(str(tree["outside"]),)))
    assert got.files == FileGrants()


def test_parent_of_a_granted_root_is_not_granted(tree: dict[str, Path]) -> None:
    """Asking for the folder that contains a granted root (a wider root) grants nothing."""
    parent = caps(read=(str(tree["granted"] / "sub"),))
    assert intersect(parent, caps(read=(str(tree["granted"]),))).files.read == ()


def test_dot_dot_traversal_is_resolved_and_rejected(tree: dict[str, Path]) -> None:
    """A root written as granted/../outside is resolved before comparing, so it is rejected."""
    parent = caps(read=(str(tree["granted"]),))
    sneaky = f"{tree['granted']}/sub/../../outside"
    assert intersect(parent, caps(read=(sneaky,))).files.read == ()
    assert intersect(parent, caps(read=(f"{tree['granted']}/sub/..",))).files.read == (str(tree["granted"]),)


def test_symlink_inside_a_granted_root_pointing_outside_is_rejected(tree: dict[str, Path]) -> None:
    """A link inside a granted root that points outside resolves outside, so it grants nothing."""
    parent = caps(read=(str(tree["granted"]),), write=(str(tree["granted"]),))
    link = str(tree["granted"] / "link")
    got = intersect(parent, caps(read=(link, f"{link}/secret.txt"), write=(link,)))
    assert got.files == FileGrants()
    assert not is_within(f"{link}/secret.txt", tree["granted"])


def test_prefix_sibling_is_not_inside(tree: dict[str, Path]) -> None:
    """granted-evil is not inside granted, although its name starts the same."""
    evil = tree["root"] / "granted-evil"
    evil.mkdir()
    assert intersect(caps(read=(str(tree["granted"]),)), caps(read=(str(evil),))).files.read == ()


def test_write_needs_a_write_root_but_read_may_come_from_either(tree: dict[str, Path]) -> None:
    """A write root must lie within a parent write root; a read root may lie within a read or write root."""
    sub = str(tree["granted"] / "sub")
    read_only = caps(read=(str(tree["granted"]),))
    assert intersect(read_only, caps(write=(sub,))).files.write == ()
    writable = caps(write=(str(tree["granted"]),))
    got = intersect(writable, caps(read=(sub,), write=(sub,)))
    assert (got.files.read, got.files.write) == ((sub,), (sub,))


@pytest.mark.parametrize(("parent", "requested", "expected"), [
    ("loopApproval", "allow", "loopApproval"),
    ("approval", "allow", "approval"),
    ("none", "allow", "none"),
    ("allow", "loopApproval", "loopApproval"),
    ("allow", "allow", "allow"),
])
def test_shell_takes_the_stricter_mode(parent: str, requested: str, expected: str) -> None:
    """Shell access takes the stricter of the two modes: allow under loopApproval is loopApproval."""
    assert intersect(caps(shell=parent), caps(shell=requested)).shell == expected


def test_network_spawn_and_depth_never_widen() -> None:
    """Network and spawning need both sides, and the depth is the smaller one."""
    parent = caps(network=False, agents_spawn=True, agents_max_depth=2)
    got = intersect(parent, caps(network=True, agents_spawn=True, agents_max_depth=5))
    assert (got.network, got.agents_spawn, got.agents_max_depth) == (False, True, 2)
    got = intersect(caps(network=True, agents_spawn=False), caps(network=True, agents_spawn=True))
    assert (got.network, got.agents_spawn) == (True, False)


def test_none_requested_means_everything_the_parent_holds(tree: dict[str, Path]) -> None:
    """intersect(parent, None) is the parent's grants."""
    parent = caps(read=(str(tree["granted"]),), shell="approval", network=True)
    assert intersect(parent, None) == parent


@settings(max_examples=60, deadline=None)
@given(
    parent_shell=st.sampled_from(SHELL_MODES), requested_shell=st.sampled_from(SHELL_MODES),
    parent_net=st.booleans(), requested_net=st.booleans(), parent_spawn=st.booleans(),
    requested_spawn=st.booleans(), parent_depth=st.integers(0, 10), requested_depth=st.integers(0, 10),
)
def test_intersect_never_widens_scalars(*, parent_shell: str, requested_shell: str, parent_net: bool,
                                        requested_net: bool, parent_spawn: bool, requested_spawn: bool,
                                        parent_depth: int, requested_depth: int) -> None:
    """For every combination, the result is no wider than the parent nor than the request."""
    parent = caps(shell=parent_shell, network=parent_net, agents_spawn=parent_spawn, agents_max_depth=parent_depth)
    requested = caps(shell=requested_shell, network=requested_net, agents_spawn=requested_spawn,
                     agents_max_depth=requested_depth)
    got = intersect(parent, requested)
    rank = SHELL_MODES.index
    assert rank(got.shell) <= min(rank(parent_shell), rank(requested_shell))
    assert got.network <= min(parent_net, requested_net)
    assert got.agents_spawn <= min(parent_spawn, requested_spawn)
    assert got.agents_max_depth <= min(parent_depth, requested_depth)
    assert intersect(got, requested) == got


def test_intersect_of_an_intersection_is_stable(tree: dict[str, Path]) -> None:
    """Narrowing twice with the same request gives the same grants (no drift on every resume)."""
    parent = caps(read=(str(tree["granted"]),), write=(str(tree["granted"] / "sub"),), shell="approval")
    requested = caps(read=(str(tree["granted"] / "sub"),), write=(str(tree["granted"] / "sub"),), shell="allow")
    once = intersect(parent, requested)
    assert intersect(once, requested) == once
    assert intersect(parent, once) == once


# ------------------------------------------------------------------------------------------
# Saved grants
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("yaml_form", [
    {},
    {"files": {"read": ["docs", "/abs/data"], "write": ["out"]}, "shell": "approval", "network": True},
    {"agents": {"spawn": True, "maxDepth": 2, "maxAgents": 0}},
    {"agents": {"maxDepth": 3.0}, "files": {"write": []}},
])
def test_one_codec_for_the_yaml_form_and_the_saved_form(yaml_form: dict[str, Any]) -> None:
    """The loader reads capabilities: with the one reader (saved=False), and writes them with the one writer."""
    loaded = load_assembly({"capabilities": yaml_form}).capabilities
    assert loaded == capabilities_from_dict(yaml_form, saved=False)
    assert capabilities_from_dict(capabilities_to_dict(loaded), saved=False) == loaded
    assert isinstance(loaded.agents_max_depth, int)


def test_a_relative_root_is_yaml_only() -> None:
    """A relative root is the YAML form's (resolved later against the assembly); a saved grant with one is malformed."""
    data = {"files": {"read": ["docs"]}}
    assert capabilities_from_dict(data, saved=False).files.read == ("docs",)
    with pytest.raises(ValueError, match="not absolute"):
        capabilities_from_dict(data)
    with pytest.raises(ValueError, match="whole numbers"):
        capabilities_from_dict({"agents": {"maxDepth": 3.0}})  # a saved count is an int, as written


def test_capabilities_round_trip_through_the_header_form(tree: dict[str, Path]) -> None:
    """The saved capabilities summary parses back to the same grants; malformed ones are rejected."""
    c = caps(read=(str(tree["granted"]),), shell="loopApproval", network=True, agents_spawn=True, agents_max_depth=3)
    assert capabilities_from_dict(capabilities_to_dict(c)) == c
    for bad in (None, "all", {"files": {"read": "/"}}, {"shell": "root"}, {"files": {}, "extra": 1},
                {"network": "yes"}, {"agents": {"maxDepth": "deep"}}):
        with pytest.raises(ValueError):  # noqa: PT011 - any ValueError: each is a different problem
            capabilities_from_dict(bad)


async def write_header(rt: Any, iid: str, **extra: Any) -> None:
    header = {"instanceId": iid, "name": "t", "version": 1, "definition": definition_to_dict(defn()),
              "state": "waiting", "stopReason": "waiting", "pendingApprovals": [], "inbox": [], **extra}
    await rt.store.create(iid, header)


@pytest.mark.anyio
@pytest.mark.parametrize("saved", [None, "everything", {"files": {"read": [1]}}, {"shell": "sudo"}],
                         ids=["missing", "string", "bad-roots", "bad-shell"])
async def test_marker_with_malformed_grants_fails_closed(tmp_path: Path, saved: Any) -> None:
    """A header with capabilitiesRecorded but no valid capabilities raises GrantsError naming the instance."""
    iid = "20260101-000000-00000bad"
    async with make_runtime(tmp_path, Harness()) as rt:
        extra: dict[str, Any] = {"capabilitiesRecorded": True}
        if saved is not None:
            extra["capabilities"] = saved
        await write_header(rt, iid, **extra)
        with pytest.raises(GrantsError) as info:
            await rt.get_agent(iid)
        assert info.value.instance_id == iid
        assert iid in str(info.value)
        with pytest.raises(GrantsError):
            await rt.message(iid, "hello")


@pytest.mark.anyio
async def test_capabilities_without_the_marker_fail_closed(tmp_path: Path) -> None:
    """A header with saved capabilities but no capabilitiesRecorded marker refuses to load (GrantsError).

    Without the marker the runtime could not tell saved grants from a header edited to widen
    them, so it does not guess; loading, messaging and resuming all refuse, naming the instance.
    """
    iid = "20260101-000000-0000cafe"
    async with make_runtime(tmp_path, Harness()) as rt:
        await write_header(rt, iid, capabilities={"shell": "allow"})
        with pytest.raises(GrantsError, match="no capabilitiesRecorded marker") as info:
            await rt.get_agent(iid)
        assert info.value.instance_id == iid
        with pytest.raises(GrantsError):
            await rt.message(iid, "hello")
        with pytest.raises(GrantsError):
            await rt.resume(iid)


@pytest.mark.anyio
async def test_no_marker_and_no_capabilities_gets_the_runtimes_grants(tmp_path: Path, tree: dict[str, Path],
                                                                      ) -> None:
    """An instance saved before grants were recorded runs with the resuming runtime's grants."""
    iid = "20260101-000000-0000001d"
    runtime_caps = caps(read=(str(tree["granted"]),), shell="approval")
    async with make_runtime(tmp_path, Harness(), capabilities=runtime_caps) as rt:
        await write_header(rt, iid)
        run = await rt.get_agent(iid)
        assert run.inst.grants == runtime_caps


@pytest.mark.anyio
async def test_saved_grants_never_widen_under_a_narrower_runtime(tmp_path: Path, tree: dict[str, Path]) -> None:
    """Saved grants are intersected with a narrower resuming runtime's, so they shrink to fit it."""
    wide = caps(read=(str(tree["granted"]),), write=(str(tree["granted"]),), shell="allow", network=True)
    async with make_runtime(tmp_path, Harness(reply("hi")), capabilities=wide) as rt:
        run, _ = await run_to_rest(rt, defn())
        assert run.inst.grants == wide
        header = await rt.store.read_header(run.instance_id)
        assert header["capabilitiesRecorded"] is True
        assert capabilities_from_dict(header["capabilities"]) == wide
    narrow = caps(read=(str(tree["granted"] / "sub"),), shell="loopApproval")
    async with make_runtime(tmp_path, Harness(), capabilities=narrow) as rt2:
        again = await rt2.get_agent(run.instance_id)
        got = again.inst.grants
        assert got.files.write == ()
        assert got.files.read == ()
        assert (got.shell, got.network) == ("loopApproval", False)


@pytest.mark.anyio
async def test_a_wider_runtime_does_not_widen_saved_grants(tmp_path: Path, tree: dict[str, Path]) -> None:
    """A read-only start stays read-only when a runtime with write grants resumes it."""
    read_only = caps(read=(str(tree["granted"]),))
    async with make_runtime(tmp_path, Harness(reply("hi")), capabilities=read_only) as rt:
        run, _ = await run_to_rest(rt, defn())
    wide = caps(read=(str(tree["granted"]),), write=(str(tree["granted"]),), shell="allow", network=True)
    async with make_runtime(tmp_path, Harness(), capabilities=wide) as rt2:
        again = await rt2.get_agent(run.instance_id)
        assert again.inst.grants == read_only


@pytest.mark.anyio
async def test_start_agent_narrows_requested_grants(tmp_path: Path, tree: dict[str, Path]) -> None:
    """Grants asked for at start are narrowed to the runtime's, and what is saved is the narrowed set."""
    runtime_caps = caps(read=(str(tree["granted"]),), shell="approval")
    async with make_runtime(tmp_path, Harness(reply("hi")), capabilities=runtime_caps) as rt:
        run = await rt.start_agent(defn(), None, "go", capabilities=caps(
            read=(str(tree["outside"]), str(tree["granted"] / "sub")), shell="allow", network=True))
        await run.wait()
        assert run.inst.grants == caps(read=(str(tree["granted"] / "sub"),), shell="approval")
        header = await rt.store.read_header(run.instance_id)
        assert capabilities_from_dict(header["capabilities"]) == run.inst.grants


# ------------------------------------------------------------------------------------------
# The store stays out of reach
# ------------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["read", "write"])
async def test_store_inside_a_granted_root_is_refused(tmp_path: Path, where: str) -> None:
    """A runtime refuses to open when its store lies inside a granted file root."""
    grant = caps(**{where: (str(tmp_path),)})
    with pytest.raises(CapabilityError, match="store"):
        async with make_runtime(tmp_path, Harness(), capabilities=grant):
            pass


@pytest.mark.anyio
async def test_granted_root_inside_the_store_is_refused(tmp_path: Path) -> None:
    """A runtime refuses to open when a granted root lies inside its store folder."""
    grant = caps(read=(str(tmp_path / "store" / "some-instance"),))
    with pytest.raises(CapabilityError):
        async with make_runtime(tmp_path, Harness(), capabilities=grant):
            pass


@pytest.mark.anyio
async def test_store_reached_through_a_symlink_is_refused(tmp_path: Path) -> None:
    """A granted root that is a symlink to the store folder is refused too (paths compared resolved)."""
    (tmp_path / "store").mkdir()
    (tmp_path / "innocent").symlink_to(tmp_path / "store")
    grant = caps(read=(str(tmp_path / "innocent"),))
    with pytest.raises(CapabilityError):
        async with make_runtime(tmp_path, Harness(), capabilities=grant):
            pass


@pytest.mark.anyio
async def test_store_beside_a_granted_root_is_fine(tmp_path: Path) -> None:
    """A store next to (not inside) a granted root opens normally."""
    (tmp_path / "work").mkdir()
    grant = caps(read=(str(tmp_path / "work"),), write=(str(tmp_path / "work"),))
    async with make_runtime(tmp_path, Harness(reply("hi")), capabilities=grant) as rt:
        _, result = await run_to_rest(rt, defn())
        assert result.text == "hi"


# ------------------------------------------------------------------------------------------
# Relative roots: the assembly's folder, never the working folder
# ------------------------------------------------------------------------------------------


def test_a_relative_root_lies_within_nothing(tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """is_within and intersect never resolve a relative root against the working folder."""
    monkeypatch.chdir(tree["root"])
    assert not is_within("granted/sub", tree["granted"])
    assert not is_within(tree["granted"] / "sub", "granted")
    assert intersect(caps(read=("granted",)), caps(read=(str(tree["granted"]),))).files.read == ()
    assert intersect(caps(read=(str(tree["granted"]),)), caps(read=("granted",))).files.read == ()


def test_saved_relative_roots_are_malformed() -> None:
    """A saved entry with a relative root is refused (the runtime then fails closed)."""
    with pytest.raises(ValueError, match="is not absolute"):
        capabilities_from_dict({"files": {"write": ["./work"]}})


def test_the_runtime_resolves_relative_roots_against_the_assembly_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Roots of an assembly file are taken from its folder, whatever the working folder."""
    from loopwright import Runtime  # noqa: PLC0415
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "loopwright.yaml").write_text("capabilities: {files: {read: [./x], write: [../y]}}\n")
    monkeypatch.chdir(tmp_path / "b")
    rt = Runtime(load_assembly(tmp_path / "a" / "loopwright.yaml"))
    got = rt.assembly.capabilities.files
    assert (got.read, got.write) == ((str(tmp_path / "a" / "x"),), (str(tmp_path / "y"),))


# Found by mutation testing (docs/testing.md, "Mutation score"): each of these survived a mutant.

SHELL_MODES = ("none", "loopApproval", "approval", "allow")  # strictest first, as docs/security.md says


@pytest.mark.parametrize("parent", SHELL_MODES)
@pytest.mark.parametrize("requested", SHELL_MODES)
def test_every_pair_of_shell_modes_takes_the_stricter(parent: str, requested: str) -> None:
    """For every pair, the intersection is the stricter mode in the documented order."""
    stricter = SHELL_MODES[min(SHELL_MODES.index(parent), SHELL_MODES.index(requested))]
    assert intersect(caps(shell=parent), caps(shell=requested)).shell == stricter


def test_a_saved_entry_without_its_keys_fails_closed_to_the_defaults() -> None:
    """Missing keys mean: no network, no spawning, depth 8, the default count; never more."""
    got = capabilities_from_dict({})
    assert (got.network, got.agents_spawn, got.shell) == (False, False, "none")
    assert (got.agents_max_depth, got.agents_max_agents) == (8, 64)
    assert capabilities_from_dict({"agents": {"spawn": True}}).agents_max_depth == 8


def test_saved_counts_of_zero_load_and_negative_ones_are_malformed() -> None:
    """0 is a count (no children); -1 is not."""
    got = capabilities_from_dict({"agents": {"maxDepth": 0, "maxAgents": 0}})
    assert (got.agents_max_depth, got.agents_max_agents) == (0, 0)
    for bad in ({"maxDepth": -1}, {"maxAgents": -1}):
        with pytest.raises(ValueError, match="whole numbers"):
            capabilities_from_dict({"agents": bad})


@pytest.mark.parametrize("entry", [{"files": [], "agents": {}}, {"files": {}, "agents": []}])
def test_saved_files_or_agents_that_are_not_mappings_are_malformed(entry: dict[str, Any]) -> None:
    """Either one being a list makes the entry malformed."""
    with pytest.raises(ValueError, match="mappings"):
        capabilities_from_dict(entry)


def test_no_grants_grants_nothing() -> None:
    """What a malformed saved grant fails closed to: no roots, no shell, no network, no agents."""
    from loopwright._capabilities import NO_GRANTS  # noqa: PLC0415 - the one test of the constant

    assert capabilities_to_dict(NO_GRANTS) == {
        "files": {"read": [], "write": []}, "shell": "none", "network": False,
        "agents": {"spawn": False, "maxDepth": 0, "maxAgents": 0}}

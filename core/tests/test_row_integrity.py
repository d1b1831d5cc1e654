"""Row integrity (``integrity.keyEnv``): every new row is signed, and a row that does not verify fails closed.

The subprocess attacks on the file, sqlite and postgres stores are in tests/attacks/test_attack_rows.py;
these tests hold the signer's contract and the places that make rows (start, submit, spawn, fork).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import Harness, call, defn, make_runtime, reply

from loopwright import Capabilities
from loopwright._definition import FileGrants, Integrity
from loopwright._integrity import SEALED_KEYS, SIGNATURE_KEY, RowSigner, row_signer_from_env
from loopwright.errors import ConfigError, RowIntegrityError, UnloadableInstanceError

pytestmark = pytest.mark.anyio

KEY = "an integrity key of more than 32 characters"
ENV = "LW_TEST_ROW_KEY"


def _header() -> dict[str, Any]:
    return {"instanceId": "i-1", "definition": {"name": "t", "requiresApproval": ["rm"]},
            "definitionPath": None, "capabilities": {"shell": "none"}, "capabilitiesRecorded": True,
            "state": "running", "inbox": []}


def test_a_signed_header_verifies_and_any_change_to_a_sealed_key_breaks_it() -> None:
    signer = RowSigner(ENV, key=KEY.encode())
    header = _header()
    signer.sign(header)
    assert header[SIGNATURE_KEY].startswith("hmac-sha256:v1:")
    signer.check("i-1", header)
    # What changes at every turn is not sealed.
    signer.check("i-1", {**header, "state": "waiting", "inbox": [{"text": "hi"}], "turns": 3})
    for key in SEALED_KEYS:
        changed = {**header, key: "changed"}
        with pytest.raises(RowIntegrityError, match="does not verify"):
            signer.check("i-1", changed)
        if key in header:
            removed = {k: v for k, v in header.items() if k != key}
            with pytest.raises(RowIntegrityError, match="does not verify"):
                signer.check("i-1", removed)
    # An absent key and a saved null are not the same row (absent inheritedGates means "none given").
    with pytest.raises(RowIntegrityError):
        signer.check("i-1", {**header, "inheritedGates": None})
    nested = json.loads(json.dumps(header))
    nested["definition"]["requiresApproval"] = []
    with pytest.raises(RowIntegrityError, match="does not verify"):
        signer.check("i-1", nested)


def test_another_key_or_no_signature_is_refused_and_the_key_is_never_shown() -> None:
    header = _header()
    RowSigner(ENV, key=KEY.encode()).sign(header)
    other = RowSigner(ENV, key=b"x" * 40)
    with pytest.raises(RowIntegrityError, match=f"another key than {ENV}") as caught:
        other.check("i-1", header)
    assert caught.value.instance_id == "i-1"
    assert isinstance(caught.value, UnloadableInstanceError)  # so a worker quarantines it
    for saved in (None, "", 42, "hmac-sha256:v1:" + "0" * 64):
        with pytest.raises(RowIntegrityError):
            other.check("i-1", {**header, SIGNATURE_KEY: saved})
    assert KEY not in repr(RowSigner(ENV, key=KEY.encode()))


def test_the_key_comes_from_the_environment_and_must_be_long() -> None:
    assert row_signer_from_env(ENV, {ENV: KEY}).key_env == ENV
    with pytest.raises(ValueError, match=f"{ENV} .* is not set"):
        row_signer_from_env(ENV, {})
    with pytest.raises(ValueError, match="holds 5 characters") as caught:
        row_signer_from_env(ENV, {ENV: "short"})
    assert "short" not in str(caught.value)


async def test_a_runtime_without_its_key_does_not_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(ConfigError, match=f"{ENV}"):
        async with make_runtime(tmp_path, Harness(), integrity=Integrity(key_env=ENV)):
            pass


async def test_started_spawned_and_forked_rows_are_signed_and_a_changed_child_fails_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A started instance, the child it spawns from a registered definition, and a fork: each row signed.

    The child's row names its registered definition and the caller's gates; removing those gates
    from the store makes it refuse to load in another runtime.
    """
    monkeypatch.setenv(ENV, KEY)
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "helper.yaml").write_text("name: helper\nmodel: c:m\ntools: [task_complete]\n")
    parent = Harness(reply(None, call("run_agent_async", definition="helper", prompt="help")),
                     reply("started it"), provider="p")
    child = Harness(reply(None, call("task_complete", result="4", summary="done")), provider="c")
    grants = Capabilities(agents_spawn=True, files=FileGrants(read=(str(agents),)))
    settings: dict[str, Any] = {"capabilities": grants, "agent_definitions": {"helper": str(agents / "helper.yaml")},
                                "integrity": Integrity(key_env=ENV)}
    signer = RowSigner(ENV, key=KEY.encode())
    async with make_runtime(tmp_path, parent, child, **settings) as rt:
        run = await rt.start_agent(defn(model="p:m", tools=("run_agent_async",), requires_approval=("note",)),
                                   prompt="go")
        with anyio.fail_after(10):
            await run.wait()
            await rt.wait_idle()
        (child_id,) = run.inst.header.children
        headers = {iid: await rt.store.read_header(iid) for iid in (run.instance_id, child_id)}
        for iid, header in headers.items():
            signer.check(iid, header)
        assert headers[child_id]["registeredDefinition"] == "helper"
        assert headers[child_id]["inheritedGates"]["requiresApproval"] == ["note"]
        assert "registeredDefinition" not in headers[run.instance_id]  # started from a Definition, not a name
        fork = await rt.fork(run.instance_id, at_turn=1)
        forked = await rt.store.read_header(fork.instance_id)
        signer.check(fork.instance_id, forked)
        assert forked[SIGNATURE_KEY] != headers[run.instance_id][SIGNATURE_KEY]  # it names its own id
        saved = dict(headers[child_id])
        saved["inheritedGates"] = {}
        await rt.store.write_header(child_id, saved)
    async with make_runtime(tmp_path, Harness(provider="p"), Harness(provider="c"), **settings) as rt:
        with pytest.raises(RowIntegrityError, match="does not verify") as caught:
            await rt.get_agent(child_id)
        assert caught.value.instance_id == child_id
        assert (await rt.get_agent(run.instance_id)).instance_id == run.instance_id  # the intact rows load

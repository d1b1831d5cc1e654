"""The JSON views (``loopwright._views``): one converter over frozen view classes, byte-identical to before.

Each view is compared, as JSON text, with what the hand-built views of commit 6489697 printed
(:mod:`views_before`) over the headers and results of real runs: completed, waiting with
pending approvals, an error, a cancel, a tree with children, and an instance a killed process
left ``running``.

Since issue 25 every shown held call also carries its ``digest`` (what a decision must name): the
expected views are :mod:`views_before`'s with that one key added to each held call (last in a saved
entry's view; after ``reason`` in a ``--json`` held call, before its holder, path and decision), its value
computed here from the documented canonical JSON (:func:`digest`), independently of the runtime.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import views_before as before
from helpers import Harness, call, defn, make_runtime, reply, run_to_rest

import loopwright
from loopwright import Capabilities, ModelRequest, State, Usage
from loopwright import _views as views
from loopwright._config import definition_to_dict
from loopwright._definition import FileGrants
from loopwright._header import InstanceHeader
from loopwright._instance import message_to_json
from loopwright._types import PendingApproval
from loopwright.errors import ProviderError

pytestmark = pytest.mark.anyio

KILLED = "20260101-000000-0000dead"
PRICES = {"p:m": {"input": 1.0, "output": 10.0}, "c:m": {"input": 1.0, "output": 10.0}, "s:m": {"input": 2.0,
                                                                                                 "output": 3.0}}
U = Usage(input_tokens=100, output_tokens=10, total_tokens=110, requests=1)


def text(value: Any) -> str:
    """The JSON text a view prints (key order, numbers and nulls included)."""
    return json.dumps(value, ensure_ascii=False)


def digest(tool_call_id: Any, tool: Any, arguments: Any, requested_at: Any) -> str:
    """sha256 (hex) of ``{"arguments", "name", "requestedAt", "toolCallId"}`` as canonical JSON."""
    fields = {"arguments": arguments, "name": tool, "requestedAt": requested_at, "toolCallId": tool_call_id}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class after:  # noqa: N801 - stands in for the module ``before``
    """The views of :mod:`views_before`, each held call with its ``digest`` added."""

    @staticmethod
    def approval_json(p: Mapping[str, Any]) -> dict[str, Any]:
        return {**before.approval_json(p), "digest": digest(p.get("toolCallId"), p.get("tool"), p.get("arguments"),
                                                             p.get("requestedAt"))}

    @staticmethod
    def approval_to_json(p: PendingApproval) -> dict[str, Any]:
        # The digest follows the keys always shown; a held call's holder, path and decision come after it.
        old = before.approval_to_json(p)
        shown = ("toolCallId", "tool", "arguments", "reason")
        return {**{k: old[k] for k in shown}, "digest": digest(p.tool_call_id, p.tool, dict(p.arguments),
                                                                p.requested_at),
                **{k: v for k, v in old.items() if k not in shown}}

    @staticmethod
    def summary(header: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        out = before.summary(header, **kwargs)
        out["pendingApprovals"] = [after.approval_json(p) for p in header.get("pendingApprovals") or []]
        return out

    @staticmethod
    def tree_node(header: Mapping[str, Any], by_id: Mapping[Any, Mapping[str, Any]], seen: set[Any],
                  ) -> dict[str, Any]:
        def with_digests(node: dict[str, Any]) -> dict[str, Any]:
            node["pendingApprovals"] = [after.approval_json(p) for p in node["pendingApprovals"]]
            node["children"] = [with_digests(child) for child in node["children"]]
            return node

        return with_digests(before.tree_node(header, by_id, seen))

    @staticmethod
    def result_to_json(result: loopwright.AgentResult) -> dict[str, Any]:
        out = before.result_to_json(result)
        out["pendingApprovals"] = [after.approval_to_json(p) for p in result.pending_approvals if p.decision is None]
        return out


@loopwright.tool(requires_approval=True)
def rm(path: str) -> str:
    """Remove a file."""
    return f"removed {path}"


async def _write_killed(rt: loopwright.Runtime) -> None:
    """What a process killed mid-turn leaves: a header saved ``running``, a turn in the entry log."""
    definition = defn(tools=[rm])
    await rt.store.create(KILLED, {
        "instanceId": KILLED, "name": "t", "version": 1, "definition": definition_to_dict(definition),
        "inputs": {}, "state": "running", "stopReason": None, "cancelled": False, "error": None,
        "pendingApprovals": [], "inbox": [], "spawnerInstanceId": None, "callerInstanceId": None,
        "callerToolCallId": None, "delegationPrompt": None, "createdAt": "2026-01-01T00:00:00.000Z",
        "updatedAt": "2026-01-01T00:00:00.000Z", "model": "s:m",
    })
    assistant = loopwright.Message(role="assistant", tool_calls=(call("rm", "k1", path="/k"),), model="s:m")
    await rt.store.append_entries(KILLED, [
        {"t": "seg", "at": "2026-01-01T00:00:00.000Z"},
        {"t": "msg", "m": message_to_json(loopwright.Message(role="user", content="go", source="api"))},
        {"t": "msg", "m": message_to_json(assistant),
         "turn": {"n": 1, "model": "s:m", "usage": {"inputTokens": 7, "outputTokens": 2}, "cost": 0.5}},
    ])


@pytest.fixture
async def store(tmp_path: Path) -> tuple[Path, list[loopwright.AgentResult]]:
    """A file store holding one instance of each kind; the results of the runs."""

    def wait_for_child(req: ModelRequest) -> Any:
        started = json.loads(next(m for m in reversed(req.messages) if m.role == "tool").content or "")
        return reply(None, call("await_agent", ids=[started["instanceId"]]), usage=U)

    parent = Harness(
        reply(None, call("run_agent_async", agentSwarmUri="helper", prompt="add"), usage=U), wait_for_child,
        reply("the child says 4", usage=U),
        provider="p", priced=True)
    child = Harness(reply(None, call("task_complete", result="4", summary="added"), usage=U), provider="c",
                    priced=True)
    other = Harness(
        reply(None, call("task_complete", result="ok", summary="done")),                  # completed
        reply(None, call("rm", "a", path="/a"), call("rm", "b", path="/b")),              # two held calls
        ProviderError("bad request", provider="s", model="m", status=400),               # error
        reply(None, call("rm", "w", path="/w")),                                          # held, then cancelled
        tools=[rm], priced=True)
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "helper.yaml").write_text("name: helper\nmodel: c:m\nsystemPrompt: You help.\ntools: [task_complete]\n")
    grants = Capabilities(agents_spawn=True, files=FileGrants(read=(str(agents),)))
    results = []
    async with make_runtime(tmp_path, parent, child, other, capabilities=grants, pricing=PRICES,
                            agent_definitions={"helper": str(agents / "helper.yaml")}) as rt:
        results.extend([(await run_to_rest(rt, d))[1] for d in (defn(tools=[rm, "task_complete"]),
                                                                defn(tools=[rm]), defn(tools=[rm]))])
        run, held = await run_to_rest(rt, defn(tools=[rm]))
        results.append(held)
        await rt.cancel(run.instance_id)
        results.append(run.inst.result())
        results.append((await run_to_rest(rt, defn(model="p:m", tools=("run_agent_async", "await_agent"))))[1])
        await _write_killed(rt)
    states = [r.state for r in results]
    assert states == [State.STOPPED, State.WAITING_FOR_APPROVAL, State.ERROR, State.WAITING_FOR_APPROVAL,
                      State.STOPPED, State.WAITING]
    return tmp_path, results


async def test_the_fixture_covers_every_kind(store: tuple[Path, list[loopwright.AgentResult]]) -> None:
    """The store holds each kind the comparisons are about (so none passes over an empty store)."""
    tmp_path, results = store
    async with make_runtime(tmp_path) as rt:
        headers = await rt.store.list_headers()
    kinds = {(h["state"], h.get("stopReason"), bool(h.get("cancelled"))) for h in headers}
    assert {("stopped", "completed", False), ("waiting_for_approval", "waiting_for_approval", False),
            ("error", "error", False), ("stopped", "cancelled", True), ("running", None, False)} <= kinds
    assert any(h.get("children") for h in headers)
    assert any(h.get("spawnerInstanceId") for h in headers)
    assert any(len(h.get("pendingApprovals") or []) == 2 for h in headers)
    assert any(r.pending_approvals and r.subtree_cost.amount for r in results) or any(
        r.subtree_cost.amount != r.cost.amount for r in results)


async def test_summaries_listings_and_trees_are_byte_identical(
        store: tuple[Path, list[loopwright.AgentResult]]) -> None:
    """``ls`` (summaries with subtree costs), each summary alone, each tree node and ``ls --tree``: as before."""
    tmp_path, _ = store
    async with make_runtime(tmp_path) as rt:
        headers = await rt.store.list_headers()
        listed = await rt.list_instances()
        trees = await rt.trees()
    by_id = {h.get("instanceId"): h for h in headers}
    assert text(listed) == text([after.summary(h, subtree_cost=before.subtree_in(h, by_id, set()))
                                 for h in headers])
    roots = [h for h in headers if h.get("spawnerInstanceId") not in by_id]
    assert text(trees) == text([after.tree_node(h, by_id, set()) for h in roots])
    for h in headers:
        assert text(views.summary(h)) == text(after.summary(h))
        assert text(views.summary(InstanceHeader.from_json(h))) == text(after.summary(h))
        assert text(views.tree_node(h, by_id, set())) == text(after.tree_node(h, by_id, set()))
        assert views.children_in(h, by_id, set()) == before.children_in(h, by_id, set())
        for p in h.get("pendingApprovals") or []:
            assert text(views.approval_json(p)) == text(after.approval_json(p))
            assert views.approval_json(p)["digest"] == loopwright.approval_digest(p)
        for subtree in (None, 0.25, before.subtree_in(h, by_id, set())):
            assert text(views.agent_report(h, instance_id=h["instanceId"], subtree_cost=subtree)) == text(
                before.agent_report(h, h["instanceId"], subtree))


async def test_show_is_byte_identical(store: tuple[Path, list[loopwright.AgentResult]]) -> None:
    """``show --json`` of each instance (the killed one's totals from its log) is what it was."""
    tmp_path, _ = store
    async with make_runtime(tmp_path) as rt:
        for h in await rt.store.list_headers():
            shown = await rt.summary(h["instanceId"])
            header = h if h["instanceId"] != KILLED else {**h, "usage": shown["usage"], "cost": 0.5, "turns": 1}
            expected = after.summary(header, subtree_cost=await rt.subtree_cost(h["instanceId"], header))
            expected["tree"] = await rt.tree(h["instanceId"])
            expected["treePendingApprovals"] = [after.approval_to_json(p)
                                                for p in await rt.tree_approvals(h["instanceId"])]
            assert text(shown) == text(expected)
            assert text(await rt.tree(h["instanceId"])) == text(after.tree_node(
                h, {x["instanceId"]: x for x in await rt.store.list_headers()}, set()))


async def test_results_usage_and_approvals_are_byte_identical(
        store: tuple[Path, list[loopwright.AgentResult]]) -> None:
    """``run --json`` of each result, its usage and its held calls (alone and found in a tree): as before."""
    _, results = store
    for result in results:
        assert text(views.result_to_json(result)) == text(after.result_to_json(result))
        assert text(views.usage_to_json(result.usage)) == text(before.usage_to_json(result.usage))
        for p in result.pending_approvals:
            found = attrs.evolve(p, instance_id=result.instance_id, path=({"instanceId": "x", "name": "t"},))
            for q in (p, found, attrs.evolve(found, decision="approved")):
                assert text(views.approval_to_json(q)) == text(after.approval_to_json(q))
                assert views.approval_to_json(q)["digest"] == loopwright.approval_digest(q)
    counts = Usage(input_tokens=1, output_tokens=2, total_tokens=3, cache_read_tokens=0, reasoning_tokens=4,
                   requests=2, unreported_requests=1)
    assert text(views.usage_to_json(counts)) == text(before.usage_to_json(counts))


def test_what_is_saved_oddly_is_shown_as_before() -> None:
    """What ``ls`` and ``show`` print of odd saved values is unchanged.

    An unknown state is shown raw (never refused), an int cost stays an int, absent and ``null``
    costs differ, a value not of its key's kind is shown as saved.
    """
    saved = {"instanceId": "a", "name": "n", "state": "sleeping", "stopReason": "dreaming", "createdAt": "c",
             "updatedAt": "u", "children": ["b", "gone"], "cost": 1, "usage": {"inputTokens": 3, "extra": 1},
             "forkedFrom": {"instanceId": "q", "turn": 2}, "queued": True, "depth": 0}
    absent = {"instanceId": "b", "name": 5, "state": "stopped", "createdAt": "c", "updatedAt": "u", "queued": 1,
              "children": None, "pendingApprovals": None, "turns": 2.0, "cancelled": "yes"}
    unknown = {**absent, "instanceId": "c", "cost": None}
    for by_id in ({"a": saved, "b": absent}, {"a": saved, "b": unknown}):
        for h in by_id.values():
            assert text(views.summary(h)) == text(before.summary(h))
            assert text(views.tree_node(h, by_id, set())) == text(before.tree_node(h, by_id, set()))
            assert views.subtree_in(h, by_id, set()) == before.subtree_in(h, by_id, set())
    assert views.summary(saved)["state"] == "sleeping"
    assert text(views.summary(saved)["cost"]) == "1"
    assert views.subtree_in(saved, {"a": saved, "b": absent}, set()) == 1
    assert views.subtree_in(saved, {"a": saved, "b": unknown}, set()) is None


def test_views_are_frozen_attrs_classes_turned_to_json_by_one_converter() -> None:
    """Each view is a frozen attrs class; the converter renames to camelCase and leaves out marked defaults."""
    for cls in (views.ApprovalView, views.HeldCallView, views.UsageView, views.ResultView, views.SummaryView,
                views.TreeNode, views.AgentReport):
        assert attrs.has(cls)
        assert all(a.name == a.name.lower() for a in attrs.fields(cls))  # snake_case fields
    node = views.TreeNode(instance_id="a", name="n", state="waiting", stop_reason=None, turns=0, depth=0,
                          pending_approvals=(), waiting_on=0, cost=0.0, subtree_cost=0.0, forked_from=None,
                          children=())
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        node.turns = 1  # type: ignore[misc]
    assert list(views.view_converter.unstructure(node)) == [
        "instanceId", "name", "state", "stopReason", "turns", "depth", "pendingApprovals", "waitingOn", "cost",
        "subtreeCost", "forkedFrom", "children"]
    assert views.view_converter.unstructure(views.UsageView()) == {"inputTokens": 0, "outputTokens": 0,
                                                                   "totalTokens": 0}


async def test_ls_and_show_print_an_unknown_state_raw_and_its_run_refuses_it(tmp_path: Path) -> None:
    """A header saved with a state this version does not know: listed and shown as saved; its run refuses it."""
    iid = "20260101-000000-0000beef"
    async with make_runtime(tmp_path) as rt:
        await rt.store.create(iid, {
            "instanceId": iid, "name": "t", "version": 1, "definition": definition_to_dict(defn()), "inputs": {},
            "state": "sleeping", "stopReason": None, "cancelled": False, "error": None, "pendingApprovals": [],
            "inbox": [], "spawnerInstanceId": None, "callerInstanceId": None, "callerToolCallId": None,
            "delegationPrompt": None, "createdAt": "2026-01-01T00:00:00.000Z",
            "updatedAt": "2026-01-01T00:00:00.000Z", "model": "s:m"})
        assert [s["state"] for s in await rt.list_instances()] == ["sleeping"]
        assert [s["state"] for s in await rt.list_instances("sleeping")] == ["sleeping"]
        assert (await rt.summary(iid))["state"] == "sleeping"
        assert [t["state"] for t in await rt.trees()] == ["sleeping"]
        run = await rt.get_agent(iid)  # loaded as before; its state is refused wherever it is read, as before
        with pytest.raises(ValueError, match="sleeping"):
            _ = run.state

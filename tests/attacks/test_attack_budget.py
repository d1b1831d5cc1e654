"""Attack 5 of issue 8: a tree of agents outspends its budget, or fans out without bound.

Each test is a host script, as a user would write one: an assembly and a definition file in a
folder, ``Runtime.from_file``, and a malicious model (a provider plugin) that makes every agent
start copies of itself, in parallel, for as long as it is let. The tree must stop at the root's
limits, give or take what was in flight (``docs/concepts.md``, "Limits"): at most one model call
per instance of the tree, and no tool call at all (tool calls are counted as they start).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import loopwright
from loopwright import Message, ModelRequest, ModelResponse, ToolCall, Usage, hookimpl
from loopwright.abc import Provider, ProviderSettings

pytestmark = pytest.mark.anyio

#: Tokens one model call of the malicious model uses (all input, priced at $1 per million).
CALL_TOKENS = 100
#: Generous hang guard: the tree must end long before this on any machine.
HANG_GUARD = 300


class Bomber(Provider):
    """The malicious model: every answer starts ``fan_out`` copies of the agent, forever."""

    free = False

    def __init__(self, settings: ProviderSettings, plugin: BomberPlugin) -> None:
        self.settings = settings
        self.plugin = plugin

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer with copies to start (or what the plugin's ``answer`` says)."""
        plugin = self.plugin
        plugin.calls += 1
        message = plugin.answer(request) if plugin.answer else None
        if inspect.isawaitable(message):
            message = await message
        if message is None:
            plugin.ids += 1
            calls = tuple(ToolCall(id=f"b{plugin.ids}_{k}", name="run_agent_async",
                                   arguments={"agentSwarmUri": "bomb", "prompt": "do it again"})
                          for k in range(plugin.fan_out))
            message = Message(role="assistant", content=None, tool_calls=calls)
        return ModelResponse(message=message, finish_reason="tool_calls" if message.tool_calls else "stop",
                             usage=Usage(input_tokens=CALL_TOKENS, output_tokens=0, total_tokens=CALL_TOKENS,
                                         requests=1))


class BomberPlugin:
    """Registers the ``bomber`` provider kind."""

    def __init__(self, fan_out: int,
                 answer: Callable[[ModelRequest], Message | Awaitable[Message | None] | None] | None = None) -> None:
        self.fan_out = fan_out
        self.answer = answer
        self.calls = 0
        self.ids = 0

    @hookimpl
    def loopwright_register_providers(self, register: Callable[..., None]) -> None:
        register("bomber", lambda settings: Bomber(settings, self))


def write_assembly(folder: Path, *, agents: str, limits: str, tools: str = "[run_agent_async]") -> Path:
    """Write an assembly and the self-starting definition ``bomb`` (which sets ``limits``) into ``folder``."""
    (folder / "agents").mkdir(parents=True)
    (folder / "agents" / "bomb.yaml").write_text(
        f"name: bomb\nmodel: evil:m\nsystemPrompt: Start copies of yourself.\ntools: {tools}\n"
        f"limits: {limits}\n")
    path = folder / "loopwright.yaml"
    path.write_text(
        "store: {kind: file, path: ./store}\n"
        "providers: {evil: {kind: bomber}}\n"
        f"capabilities: {{agents: {agents}}}\n"
        "agentDefinitions: {bomb: agents/bomb.yaml}\n"
        'pricing: {"evil:m": {input: 1.0, output: 1.0}}\n')
    return path


async def run_tree(assembly: Path, plugin: BomberPlugin) -> tuple[loopwright.AgentResult, dict[str, Any]]:
    """Run ``bomb`` from the assembly until the whole tree rests; return the root's result and the tree's spend."""
    async with loopwright.Runtime.from_file(assembly, plugins=[plugin], autoload=False) as rt:
        with anyio.fail_after(HANG_GUARD):
            run = await rt.start_agent("bomb", None, "go")
            result = await run.wait()
            await rt.wait_idle()
        headers = await rt.store.list_headers()
        calls = 0
        for h in headers:
            calls += sum(1 for e in await rt.store.read_entries(h["instanceId"]) if e.get("t") == "start")
    tokens = sum((h.get("usage") or {}).get("inputTokens", 0) + (h.get("usage") or {}).get("outputTokens", 0)
                 for h in headers)
    cost = sum(h.get("cost") or 0.0 for h in headers)
    return result, {"instances": len(headers), "tokens": tokens, "cost": cost, "toolCalls": calls,
                    "headers": headers, "root": run.instance_id}


@pytest.mark.parametrize(("limits", "binding"), [
    ("{tokens: 3000, elapsed: 10m}", "tokens"),
    ("{cost: 0.003, elapsed: 10m}", "cost"),
    ("{toolCalls: 30, tokens: 1000000, cost: 1, elapsed: 10m}", "toolCalls"),
])
async def test_a_tree_spends_one_budget(tmp_path: Path, limits: str, binding: str) -> None:
    """Copies of ``bomb`` (each setting the same limits for itself) start 3 copies each, in parallel.

    The whole tree stops at the root's limit: tokens and cost at most the limit plus one model
    call per instance (what may be in flight), tool calls exactly at the limit, and never more
    instances than ``agents.maxAgents`` allows.
    """
    max_agents = 12
    assembly = write_assembly(tmp_path, agents=f"{{spawn: true, maxDepth: 3, maxAgents: {max_agents}}}",
                              limits=limits)
    result, tree = await run_tree(assembly, BomberPlugin(fan_out=3))
    assert tree["instances"] <= max_agents + 1
    in_flight = tree["instances"] * CALL_TOKENS  # one model call per instance may be under way
    if binding == "tokens":
        assert tree["tokens"] <= 3000 + in_flight, tree
    if binding == "cost":
        assert tree["cost"] <= 0.003 + in_flight / 1_000_000 + 1e-9, tree
    if binding == "toolCalls":
        assert tree["toolCalls"] <= 30, tree
    assert (result.stop_reason.value, result.limit) == ("limit_exceeded", binding)
    root = tree["root"]
    stopped_by_root = [h for h in tree["headers"] if h["instanceId"] != root and h.get("limit") == binding
                       and f"of agent {root}" in (h.get("error") or "")]
    assert stopped_by_root, "no child was stopped by the root's budget"


async def test_a_fan_out_bomb_ends_with_a_bounded_tree(tmp_path: Path) -> None:
    """Ten copies each, depth 3, no limits set: the default ``agents.maxAgents`` (64) bounds the tree."""
    assembly = write_assembly(tmp_path, agents="{spawn: true, maxDepth: 3}", limits="{maxIterations: 1}")
    result, tree = await run_tree(assembly, BomberPlugin(fan_out=10))
    assert tree["instances"] <= 64 + 1, tree["instances"]
    # Its one turn ends it (max_iterations), unless the tree's default toolCalls (200) ran out first.
    assert (result.state.value, result.limit) in (("error", "maxIterations"), ("error", "toolCalls"))
    refused = 0
    async with loopwright.Runtime.from_file(assembly, plugins=[BomberPlugin(0)], autoload=False) as rt:
        for h in tree["headers"]:
            refused += sum(1 for r in await rt.records(h["instanceId"]) if r["kind"] == "tool_call"
                           and "agents.maxAgents 64" in (r["data"].get("error") or ""))
    assert refused, "no agent was told the tree is full"


async def test_max_agents_is_saved_narrowed_and_fails_closed(tmp_path: Path) -> None:
    """``maxAgents`` is saved in the header's capabilities, narrowed by ``intersect``, and a bad saved value refuses."""
    from loopwright import Capabilities, intersect  # noqa: PLC0415 - the public API under test
    from loopwright.errors import GrantsError  # noqa: PLC0415

    assert intersect(Capabilities(agents_max_agents=5), Capabilities(agents_max_agents=50)).agents_max_agents == 5
    assembly = write_assembly(tmp_path, agents="{spawn: true, maxDepth: 1, maxAgents: 2}", limits="{maxIterations: 2}")
    result, tree = await run_tree(assembly, BomberPlugin(fan_out=4))
    assert tree["instances"] == 3
    for h in tree["headers"]:
        assert h["capabilities"]["agents"]["maxAgents"] == 2
    # A header that claims more agents than the runtime grants gets the runtime's; garbage refuses.
    store = tmp_path / "store" / result.instance_id / "instance.json"
    header = json.loads(store.read_text())
    header["capabilities"]["agents"]["maxAgents"] = "lots"
    store.write_text(json.dumps(header))
    async with loopwright.Runtime.from_file(assembly, plugins=[BomberPlugin(0)], autoload=False) as rt:
        with pytest.raises(GrantsError, match="maxAgents"):
            await rt.get_agent(result.instance_id)
        header["capabilities"]["agents"]["maxAgents"] = 10_000
        store.write_text(json.dumps(header))
        run = await rt.get_agent(result.instance_id)
        assert run.inst.grants.agents_max_agents == 2


async def test_a_message_gives_a_child_no_fresh_budget(tmp_path: Path) -> None:
    """A child woken by a message after the root's ``elapsed`` ran out is held to the root's clock.

    Before, the child's budget was a copy taken when it started, renewed with each segment: a
    message gave it the whole ``elapsed`` again.
    """
    state: dict[str, Any] = {"child": None, "child_calls": 0}

    def answer(request: ModelRequest) -> Message | None:
        task = next((m.content for m in request.messages if m.role == "user"), "")
        if task == "do it again":  # the child: answer, rest, and answer again when woken
            state["child_calls"] += 1
            return Message(role="assistant", content=f"child answer {state['child_calls']}")
        results = [m for m in request.messages if m.role == "tool"]
        if not results:
            return Message(role="assistant", tool_calls=(ToolCall(
                id="spawn", name="run_agent_async", arguments={"agentSwarmUri": "bomb", "prompt": "do it again"}),))
        if len(results) == 1:
            state["child"] = json.loads(results[0].content or "{}")["instanceId"]
            return Message(role="assistant", tool_calls=(ToolCall(
                id="wait", name="await_agent", arguments={"ids": [state["child"]]}),))
        if len(results) == 2:
            state["slow"] = True
            return Message(role="assistant", tool_calls=(ToolCall(
                id="wake", name="message_agent", arguments={"agentId": state["child"], "prompt": "more"}),))
        return Message(role="assistant", content="done")

    class SlowPlugin(BomberPlugin):
        @hookimpl
        async def loopwright_before_tool_call(self, call: ToolCall) -> None:
            # The root's elapsed limit (1 s) runs out before its message wakes the child. (A model
            # call can no longer outlast the limit: it runs under the elapsed deadline.)
            if call.provider_id == "wake":  # the model's id (call.id is the runtime's)
                await anyio.sleep(1.5)

    assembly = write_assembly(tmp_path, agents="{spawn: true, maxDepth: 1}", limits="{elapsed: 1s}",
                              tools="[run_agent_async, await_agent, message_agent]")
    _result, tree = await run_tree(assembly, SlowPlugin(fan_out=0, answer=answer))
    child = next(h for h in tree["headers"] if h["instanceId"] == state["child"])
    assert state["child_calls"] == 1, "the woken child called its model after the root's time ran out"
    assert (child["stopReason"], child["limit"]) == ("limit_exceeded", "elapsed")
    assert f"of agent {tree['root']}" in child["error"]


async def test_a_childs_model_call_ends_with_its_ancestors_time(tmp_path: Path) -> None:
    """A child whose model call never returns is cut off when the root's ``elapsed`` runs out.

    The child's own definition allows 10 minutes: only the root's limit (the ceiling saved as the
    child's ``budget``, and the ancestors' deadlines a model call runs under) can end the call, so
    a child cannot hold the tree's time past the root's limit by stalling.
    """
    state: dict[str, Any] = {"child": None}

    async def answer(request: ModelRequest) -> Message | None:
        task = next((m.content for m in request.messages if m.role == "user"), "")
        if task == "stall":  # the child: a model call that never returns
            await anyio.sleep_forever()
        results = [m for m in request.messages if m.role == "tool"]
        if not results:
            return Message(role="assistant", tool_calls=(ToolCall(
                id="spawn", name="run_agent_async", arguments={"agentSwarmUri": "stall", "prompt": "stall"}),))
        if len(results) == 1:
            state["child"] = json.loads(results[0].content or "{}")["instanceId"]
            return Message(role="assistant", tool_calls=(ToolCall(
                id="wait", name="await_agent", arguments={"ids": [state["child"]]}),))
        return Message(role="assistant", content="done")

    assembly = write_assembly(tmp_path, agents="{spawn: true, maxDepth: 1}", limits="{elapsed: 2s}",
                              tools="[run_agent_async, await_agent]")
    # The child's own limit is far off: only the root's can end its call.
    text = (tmp_path / "agents" / "bomb.yaml").read_text()
    (tmp_path / "agents" / "stall.yaml").write_text(text.replace("name: bomb", "name: stall").replace(
        "limits: {elapsed: 2s}", "limits: {elapsed: 10m}"))
    (tmp_path / "loopwright.yaml").write_text((tmp_path / "loopwright.yaml").read_text().replace(
        "agentDefinitions: {bomb: agents/bomb.yaml}",
        "agentDefinitions: {bomb: agents/bomb.yaml, stall: agents/stall.yaml}"))
    plugin = BomberPlugin(fan_out=0, answer=answer)
    _result, tree = await run_tree(assembly, plugin)
    child = next(h for h in tree["headers"] if h["instanceId"] == state["child"])
    assert (child["stopReason"], child["limit"]) == ("limit_exceeded", "elapsed")
    assert f"of agent {tree['root']}" in child["error"]


@pytest.mark.parametrize("limits", ["{tokens: 1000}", "{toolCalls: 12}"])
async def test_a_restart_gives_no_fresh_budget(tmp_path: Path, limits: str) -> None:
    """Children left ``running`` by a stopped runtime, resumed one by one in a new one, draw from the root's
    budget as saved (its own spending, and its descendants' headers): not each a fresh copy of what remained.
    """
    assembly = write_assembly(tmp_path, agents="{spawn: true, maxDepth: 2, maxAgents: 4}", limits=limits)
    blocked = {"n": 0}
    all_blocked = anyio.Event()

    async def first_life(request: ModelRequest) -> Message | None:
        task = next((m.content for m in request.messages if m.role == "user"), "")
        answered = [m for m in request.messages if m.role == "tool"]
        if task == "go":  # the root: four copies, then rest
            if answered:
                return Message(role="assistant", content="resting")
            return Message(role="assistant", tool_calls=tuple(ToolCall(
                id=f"s{k}", name="run_agent_async", arguments={"agentSwarmUri": "bomb", "prompt": "do it again"})
                for k in range(4)))
        if not answered:
            return None  # a copy: try to start another (the tree is full), then hang until the runtime stops
        blocked["n"] += 1
        if blocked["n"] == 4:
            all_blocked.set()
        await anyio.sleep_forever()
        return None

    plugin = BomberPlugin(fan_out=1, answer=first_life)
    async with loopwright.Runtime.from_file(assembly, plugins=[plugin], autoload=False) as rt:
        with anyio.fail_after(HANG_GUARD):
            root = await rt.start_agent("bomb", None, "go")
            await root.wait()
            await all_blocked.wait()
        children = (await rt.store.read_header(root.instance_id))["children"]
    async with loopwright.Runtime.from_file(assembly, plugins=[BomberPlugin(fan_out=1)], autoload=False) as rt:
        assert [(await rt.store.read_header(c))["state"] for c in children] == ["running"] * 4
        with anyio.fail_after(HANG_GUARD):
            for child in children:
                await (await rt.resume(child)).wait()
            await rt.wait_idle()
        headers = await rt.store.list_headers()
    tokens = sum((h.get("usage") or {}).get("inputTokens", 0) for h in headers)
    assert len(headers) == 5
    if "tokens" in limits:
        assert tokens <= 1000 + len(headers) * CALL_TOKENS, tokens
    else:
        assert sum(h["toolCallsStarted"] for h in headers) <= 12, [h["toolCallsStarted"] for h in headers]
    assert all(f"of agent {root.instance_id}" in h["error"] for h in headers if h["instanceId"] in children[1:])

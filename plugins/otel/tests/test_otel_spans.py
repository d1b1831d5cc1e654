"""The otel record sink, end to end: a real Runtime runs scripted replies and tools, spans land in memory."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from opentelemetry.trace import SpanKind, StatusCode

import loopwright
import loopwright_otel
import loopwright_testing
from loopwright import Assembly, Block, Capabilities, Definition, Usage
from loopwright._definition import PluginSpec, StoreConfig
from loopwright_testing import FakeProvider, error, reply, tool_call

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytestmark = pytest.mark.anyio

#: Slack for comparing span times: records carry ``at`` to the millisecond.
MS = 2_000_000


@loopwright.tool(parallel_safe=False)
async def slow_add(a: int, b: int) -> int:
    """Add two integers, slowly."""
    await anyio.sleep(0.05)
    return a + b


@loopwright.tool(requires_approval=True)
def wire(amount: int) -> str:
    """Send money."""
    return f"sent {amount}"


@loopwright.tool
def explode() -> str:
    """Fail."""
    raise RuntimeError("kaboom")


class Tools:
    @loopwright.hookimpl
    def loopwright_register_tools(self, register: Any) -> None:
        for t in (slow_add, wire, explode):
            register(t)


class BlockWire:
    @loopwright.hookimpl
    def loopwright_before_tool_call(self, call: Any) -> Any:
        return Block("no wires today") if call.name == "wire" else None


@asynccontextmanager
async def runtime(tmp_path: Path, *providers: tuple[str, FakeProvider], extra: Sequence[object] = (),
                  **assembly: Any) -> AsyncIterator[loopwright.Runtime]:
    asm = Assembly(store=StoreConfig(kind="file", options={"path": str(tmp_path / "store")}),
                   records=(PluginSpec(kind="otel", options={"serviceName": "tests"}),), **assembly)
    plugins = [loopwright_testing, loopwright_otel, Tools(), *(f.as_plugin(k) for k, f in providers), *extra]
    async with loopwright.Runtime(asm, plugins=plugins, autoload=False) as rt:
        yield rt


def usage(i: int, o: int) -> Usage:
    return Usage(input_tokens=i, output_tokens=o, total_tokens=i + o, requests=1)


def by_name(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = by_name(spans, name)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return (span.parent is not None and span.parent.span_id == parent.context.span_id
            and span.context.trace_id == parent.context.trace_id)


def events(span: ReadableSpan, name: str) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == name]


def assert_in_order(segment: ReadableSpan, first: ReadableSpan, tool: ReadableSpan, second: ReadableSpan) -> None:
    """The spans' times: chat, then the tool (which slept 50 ms), then chat, all inside the segment."""
    assert tool.start_time is not None
    assert tool.end_time is not None
    assert tool.end_time - tool.start_time >= 50_000_000  # the tool slept 50 ms
    assert segment.start_time is not None
    assert segment.end_time is not None
    assert first.start_time is not None
    assert first.end_time is not None
    assert second.start_time is not None
    assert segment.start_time <= first.start_time <= first.end_time <= tool.start_time + MS
    assert tool.end_time <= second.start_time + MS
    assert second.end_time is not None
    assert second.end_time <= segment.end_time


async def test_a_run_is_a_segment_span_with_chat_and_tool_children(tmp_path: Path, spans: InMemorySpanExporter,
                                                                   ) -> None:
    """One invoke_agent span per segment; chat and execute_tool spans nest under it with model, tokens,
    tool name, call id, status and real timings; the segment adds up the usage and cost.
    """
    fake = FakeProvider(reply(None, tool_call("slow_add", a=1, b=2), usage=usage(100, 10)),
                        reply("3", usage=usage(120, 5)))
    async with runtime(tmp_path, ("fake", fake), pricing={"fake:any": {"input": 1.0, "output": 10.0}}) as rt:
        run = await rt.start_agent(Definition(name="adder", model="fake:any", tools=("slow_add",)), prompt="1+2")
        result = await run.result()
    assert result.text == "3"
    got = spans.get_finished_spans()
    assert sorted(s.name for s in got) == ["chat any", "chat any", "execute_tool slow_add", "invoke_agent adder"]
    segment = one(got, "invoke_agent adder")
    assert segment.parent is None
    assert segment.kind is SpanKind.INTERNAL
    attrs = dict(segment.attributes or {})
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.agent.name"] == "adder"
    assert attrs["gen_ai.agent.id"] == run.instance_id
    assert attrs["gen_ai.request.model"] == "any"
    assert attrs["gen_ai.provider.name"] == "fake"
    assert (attrs["loopwright.state"], attrs["loopwright.stop_reason"]) == ("waiting", "waiting")
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (220, 15)
    assert (attrs["loopwright.turns"], attrs["loopwright.tool_calls"]) == (2, 1)
    assert attrs["loopwright.cost"] == pytest.approx((220 + 15 * 10) / 1_000_000)
    assert segment.status.status_code is StatusCode.UNSET

    first, second = sorted(by_name(got, "chat any"), key=lambda s: s.start_time or 0)
    for chat in (first, second):
        assert child_of(chat, segment)
        assert chat.kind is SpanKind.CLIENT
        assert chat.attributes is not None
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.response.model"] == "any"
    assert dict(first.attributes or {})["gen_ai.usage.input_tokens"] == 100
    assert dict(first.attributes or {})["gen_ai.usage.output_tokens"] == 10
    assert dict(first.attributes or {})["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert dict(first.attributes or {})["loopwright.cost"] == pytest.approx(200 / 1_000_000)

    tool = one(got, "execute_tool slow_add")
    assert child_of(tool, segment)
    tattrs = dict(tool.attributes or {})
    assert tattrs["gen_ai.tool.name"] == "slow_add"
    assert tattrs["gen_ai.tool.call.id"] == fake.history[1].messages[-1].tool_call_id
    assert tattrs["loopwright.tool.status"] == "success"
    assert tool.status.status_code is StatusCode.UNSET
    assert_in_order(segment, first, tool, second)


async def test_a_failed_run_ends_its_segment_span_with_error_status(tmp_path: Path,
                                                                    spans: InMemorySpanExporter) -> None:
    """A provider failure puts the instance in the error state: the segment span's status is ERROR with the
    message, an error event is on it, and a failing tool's span is ERROR with its status as error.type.
    """
    fake = FakeProvider(reply(None, tool_call("explode"), usage=usage(5, 5)), error("the model is down"))
    async with runtime(tmp_path, ("fake", fake)) as rt:
        run = await rt.start_agent(Definition(name="doomed", model="fake:any", tools=("explode",)), prompt="go")
        result = await run.wait()
    assert result.state.value == "error"
    got = spans.get_finished_spans()
    segment = one(got, "invoke_agent doomed")
    assert segment.status.status_code is StatusCode.ERROR
    assert "the model is down" in (segment.status.description or "")
    assert dict(segment.attributes or {})["error.type"] == "error"
    assert any("the model is down" in str(e.get("loopwright.message")) for e in events(segment, "loopwright.error"))
    tool = one(got, "execute_tool explode")
    assert child_of(tool, segment)
    assert tool.status.status_code is StatusCode.ERROR
    assert dict(tool.attributes or {})["error.type"] == "tool_failed"
    assert "kaboom" in (tool.status.description or "")


async def test_an_approval_is_an_event_and_the_continuation_links_back(tmp_path: Path,
                                                                       spans: InMemorySpanExporter) -> None:
    """A held call ends the segment span (waiting_for_approval) with an approval event; the approval
    continues in a new span that carries the decision event, the tool span, and a link to the first.
    """
    fake = FakeProvider(reply(None, tool_call("wire", amount=5)), "done")
    async with runtime(tmp_path, ("fake", fake)) as rt:
        run = await rt.start_agent(Definition(name="payer", model="fake:any", tools=("wire",)), prompt="pay")
        held = await run.wait()
        assert held.state.value == "waiting_for_approval"
        paused = spans.get_finished_spans()
        assert [s.name for s in paused] == ["chat any", "invoke_agent payer"]
        first = one(paused, "invoke_agent payer")
        assert dict(first.attributes or {})["loopwright.stop_reason"] == "waiting_for_approval"
        (asked,) = events(first, "loopwright.approval")
        assert asked["gen_ai.tool.name"] == "wire"
        assert asked["gen_ai.tool.call.id"] == held.pending_approvals[0].tool_call_id
        assert "loopwright.decision" not in asked
        await run.approve()
        done = await run.wait()
    assert done.text == "done"
    got = spans.get_finished_spans()
    second = next(s for s in by_name(got, "invoke_agent payer") if s.context.span_id != first.context.span_id)
    (decided,) = events(second, "loopwright.approval")
    assert decided["loopwright.decision"] == "approved"
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    tool = one(got, "execute_tool wire")
    assert child_of(tool, second)
    assert dict(tool.attributes or {})["loopwright.tool.status"] == "success"


async def test_a_hook_decision_is_an_event_and_a_blocked_call_is_not_an_error(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """A Block from before_tool_call is a loopwright.hook event; the blocked call's span says blocked, status unset."""
    fake = FakeProvider(reply(None, tool_call("wire", amount=5)), "ok")
    async with runtime(tmp_path, ("fake", fake), extra=[BlockWire()]) as rt:
        run = await rt.start_agent(Definition(name="payer", model="fake:any", tools=("wire",)), prompt="pay")
        await run.result()
    got = spans.get_finished_spans()
    segment = one(got, "invoke_agent payer")
    (hook,) = events(segment, "loopwright.hook")
    assert (hook["loopwright.hook"], hook["loopwright.decision"]) == ("before_tool_call", "Block")
    assert hook["loopwright.reason"] == "no wires today"
    tool = one(got, "execute_tool wire")
    assert dict(tool.attributes or {})["loopwright.tool.status"] == "blocked"
    assert tool.status.status_code is StatusCode.UNSET


async def test_a_child_agent_span_is_a_child_of_its_spawners_segment(tmp_path: Path,
                                                                     spans: InMemorySpanExporter) -> None:
    """A child started with run_agent_async gets its own invoke_agent span in the parent's trace, under the
    parent's segment span, with its own chat spans under it; the parent's span has an agent start event.
    """
    helper = tmp_path / "agents" / "helper.yaml"
    helper.parent.mkdir()
    helper.write_text("name: helper\nmodel: c:any\nsystemPrompt: You help.\ntools: [task_complete]\n")

    def wait_for_child(req: Any) -> Any:
        started = json.loads(req.messages[-1].content)
        return reply(None, tool_call("await_agent", ids=[started["instanceId"]]))

    parent = FakeProvider(reply(None, tool_call("run_agent_async", agentSwarmUri="helper", prompt="add 2 and 2")),
                          wait_for_child, "the child says 4")
    child = FakeProvider(reply(None, tool_call("task_complete", result="4", summary="added"), usage=usage(7, 3)))
    async with runtime(tmp_path, ("p", parent), ("c", child), capabilities=Capabilities(agents_spawn=True),
                       agent_definitions={"helper": str(helper)}) as rt:
        run = await rt.start_agent(
            Definition(name="boss", model="p:any", tools=("run_agent_async", "await_agent")), prompt="go")
        result = await run.result()
    assert result.text == "the child says 4"
    got = spans.get_finished_spans()
    boss = one(got, "invoke_agent boss")
    kid = one(got, "invoke_agent helper")
    assert child_of(kid, boss)
    kattrs = dict(kid.attributes or {})
    assert kattrs["loopwright.spawner_instance_id"] == run.instance_id
    assert kattrs["loopwright.depth"] == 1
    assert kattrs["gen_ai.provider.name"] == "c"
    kid_chat = one([s for s in got if s.attributes and s.attributes.get("gen_ai.provider.name") == "c"
                    and s.name.startswith("chat")], "chat any")
    assert child_of(kid_chat, kid)
    assert dict(kid_chat.attributes or {})["gen_ai.usage.input_tokens"] == 7
    assert child_of(one(got, "execute_tool task_complete"), kid)
    (started,) = events(boss, "loopwright.agent")
    assert started["loopwright.action"] == "start"
    assert started["loopwright.instance_id"] == kattrs["gen_ai.agent.id"]


async def test_model_calls_and_tool_calls_are_measured(tmp_path: Path, spans: InMemorySpanExporter,
                                                       metric_reader: InMemoryMetricReader) -> None:
    """Token usage, operation duration, cost and tool duration reach the host's MeterProvider."""
    fake = FakeProvider(reply(None, tool_call("slow_add", a=1, b=2), usage=usage(40, 2)),
                        reply("3", usage=usage(50, 1)))
    async with runtime(tmp_path, ("metered", fake), pricing={"metered:any": {"input": 1.0, "output": 1.0}}) as rt:
        run = await rt.start_agent(Definition(name="m", model="metered:any", tools=("slow_add",)), prompt="1+2")
        await run.result()
    points: dict[str, list[Any]] = {}
    data = metric_reader.get_metrics_data()
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)

    def mine(name: str, **match: str) -> list[Any]:
        return [p for p in points.get(name, []) if p.attributes.get("gen_ai.provider.name", "metered") == "metered"
                and all(p.attributes.get(k) == v for k, v in match.items())]

    (tokens_in,) = mine("gen_ai.client.token.usage", **{"gen_ai.token.type": "input"})
    (tokens_out,) = mine("gen_ai.client.token.usage", **{"gen_ai.token.type": "output"})
    # Cumulative over the session's runs on this provider under both backends: at least this run's.
    assert tokens_in.sum >= 90
    assert tokens_in.sum % 90 == 0
    assert tokens_out.sum % 3 == 0
    assert tokens_out.sum >= 3
    (duration,) = mine("gen_ai.client.operation.duration")
    assert duration.count >= 2
    (cost,) = mine("loopwright.cost")
    assert cost.value == pytest.approx(93 / 1_000_000 * (tokens_in.sum // 90))
    (tool,) = mine("loopwright.tool.duration", **{"gen_ai.tool.name": "slow_add"})
    assert tool.min >= 0.05

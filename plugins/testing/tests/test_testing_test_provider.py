"""Tests of the ``test`` provider: its replies to transcripts, and full runs against a real Runtime."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from lwtesting_tools import ToolsPlugin, add, shout

import loopwright
import loopwright_testing
from loopwright import (
    Assembly,
    Definition,
    Message,
    ModelRequest,
    ProviderSettings,
    State,
    StopReason,
    ToolCall,
)
from loopwright._definition import ProviderConfig, StoreConfig
from loopwright.builtins.tools import ask_user, task_complete
from loopwright_testing import TestProvider

pytestmark = pytest.mark.anyio


def _request(*messages: Message, tools=(), **kw) -> ModelRequest:
    return ModelRequest(model="any", provider="test", messages=messages, tools=tools, **kw)


def _user(text: str = "please add") -> Message:
    return Message(role="user", content=text, source="api")


async def test_first_round_calls_every_tool_in_parallel():
    """With tools offered and none called yet, one reply calls each tool once with schema arguments."""
    response = await TestProvider().complete(_request(_user(), tools=(add.spec, shout.spec)))
    calls = response.message.tool_calls
    assert [(c.name, dict(c.arguments)) for c in calls] == [
        ("add", {"a": 1, "b": 2}),
        ("shout", {"word": "a"}),
    ]
    assert [c.id for c in calls] == ["test_1_1", "test_1_2"]
    assert response.finish_reason == "tool_calls"
    assert response.message.content is None
    for call, spec in zip(calls, (add.spec, shout.spec), strict=True):
        jsonschema.validate(dict(call.arguments), spec.parameters)


async def test_completion_tools_wait_for_the_second_round():
    """task_complete and ask_user are not called in the first round while other tools exist."""
    response = await TestProvider().complete(_request(_user(), tools=(task_complete.spec, add.spec, ask_user.spec)))
    assert [c.name for c in response.message.tool_calls] == ["add"]


async def test_only_task_complete_is_called_when_it_is_the_only_tool():
    """When task_complete and ask_user are the only tools, the first round calls task_complete."""
    response = await TestProvider().complete(_request(_user(), tools=(ask_user.spec, task_complete.spec)))
    [call] = response.message.tool_calls
    assert call.name == "task_complete"
    jsonschema.validate(dict(call.arguments), task_complete.spec.parameters)


def _after_results(*results: tuple[str, str]) -> list[Message]:
    calls = tuple(ToolCall(id=f"test_1_{k}", name=name, arguments={}) for k, (name, _) in enumerate(results, 1))
    return [
        _user(),
        Message(role="assistant", tool_calls=calls),
        *(
            Message(
                role="tool",
                tool_call_id=c.id,
                name=c.name,
                content=content,
                status=loopwright.ToolStatus.SUCCESS,
            )
            for c, (_, content) in zip(calls, results, strict=True)
        ),
    ]


async def test_results_are_summarised_as_text():
    """Once the tool results are in, the reply is a text summary of each result."""
    messages = _after_results(("add", "3"), ("shout", "A"))
    response = await TestProvider().complete(_request(*messages, tools=(add.spec, shout.spec)))
    assert response.message.content == "test answer: add -> 3; shout -> A"
    assert response.message.tool_calls == ()
    assert response.finish_reason == "stop"


async def test_error_statuses_show_in_the_summary():
    """A result that is not a success is shown with its status."""
    calls = (ToolCall(id="c1", name="add", arguments={}),)
    messages = [
        _user(),
        Message(role="assistant", tool_calls=calls),
        Message(
            role="tool",
            tool_call_id="c1",
            content="bad arguments",
            status=loopwright.ToolStatus.INVALID_ARGUMENTS,
        ),
    ]
    response = await TestProvider().complete(_request(*messages, tools=(add.spec,)))
    assert response.message.content == "test answer: add -> [invalid_arguments] bad arguments"


async def test_a_result_that_says_its_status_does_not_repeat_it():
    """Issue 31, point 6: ``denied: not now`` is shown as it is, never ``[denied] denied: not now``."""
    calls = (ToolCall(id="c1", name="add", arguments={}), ToolCall(id="c2", name="add", arguments={}))
    messages = [
        _user(),
        Message(role="assistant", tool_calls=calls),
        Message(role="tool", tool_call_id="c1", content="denied: not now", status=loopwright.ToolStatus.DENIED),
        Message(role="tool", tool_call_id="c2", content="blocked: policy", status=loopwright.ToolStatus.BLOCKED),
    ]
    response = await TestProvider().complete(_request(*messages, tools=(add.spec,)))
    assert response.message.content == "test answer: add -> denied: not now; add -> blocked: policy"


async def test_task_complete_follows_the_results_when_offered():
    """After the other tools' results, an offered task_complete is called with the summary."""
    messages = _after_results(("add", "3"))
    response = await TestProvider().complete(_request(*messages, tools=(add.spec, task_complete.spec)))
    [call] = response.message.tool_calls
    assert call.name == "task_complete"
    assert call.arguments["result"] == "test answer: add -> 3"
    assert call.id == "test_2_1"


async def test_no_tools_answers_the_prompt():
    """Without tools the reply is text that mentions the last user prompt."""
    response = await TestProvider().complete(_request(Message(role="system", content="be nice"), _user("what is up?")))
    assert response.message.content == "test answer to: what is up?"


async def test_a_new_user_message_starts_a_new_round():
    """After a later user message, the tools are called again with fresh ids."""
    messages = [
        *_after_results(("add", "3")),
        Message(role="assistant", content="test answer: add -> 3"),
        _user("again"),
    ]
    response = await TestProvider().complete(_request(*messages, tools=(add.spec,)))
    assert [c.id for c in response.message.tool_calls] == ["test_3_1"]


async def test_output_schema_gets_generated_json():
    """With an output schema, the final text is JSON generated from it."""
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}}
    response = await TestProvider().complete(_request(_user(), output_schema=schema))
    assert json.loads(response.message.content) == {"answer": 1}


async def test_options_choose_tools_and_answer():
    """callTools limits the tools called; answer fixes the final text; toolChoice none calls nothing."""
    provider = TestProvider(ProviderSettings(name="t", kind="test", options={"callTools": ["shout"], "answer": "ok"}))
    response = await provider.complete(_request(_user(), tools=(add.spec, shout.spec)))
    assert [c.name for c in response.message.tool_calls] == ["shout"]
    response = await provider.complete(_request(*_after_results(("shout", "A")), tools=(add.spec, shout.spec)))
    assert response.message.content == "ok"
    response = await TestProvider().complete(_request(_user(), tools=(add.spec,), settings={"toolChoice": "none"}))
    assert response.message.content == "test answer to: please add"
    with pytest.raises(ValueError, match="callTools"):
        TestProvider(ProviderSettings(name="t", kind="test", options={"callTools": 3}))


async def test_usage_is_deterministic():
    """Usage counts characters / 4 of request and answer, with one request, the same every time."""
    request = _request(_user("x" * 40))
    first = await TestProvider().complete(request)
    second = await TestProvider().complete(request)
    assert first.usage == second.usage
    assert first.usage.requests == 1
    assert first.usage.input_tokens == 10
    assert first.usage.output_tokens == -(-len(first.message.content) // 4)
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    assert first.model == "any"


async def test_transcript_is_read_not_copied():
    """A live Transcript is accepted and its per-message facts are cached on it."""
    transcript = loopwright.Transcript([_user()])
    await TestProvider().complete(ModelRequest(model="any", provider="test", messages=transcript, tools=(add.spec,)))
    assert len(transcript.encoded("loopwright-testing", lambda _m: None)) == 1


def _assembly(tmp_path, **kw) -> Assembly:
    return Assembly(store=StoreConfig(kind="file", options={"path": str(tmp_path / "store")}), **kw)


async def test_full_run_calls_a_tool_and_waits_with_a_summary(tmp_path):
    """On a real runtime and file store, test:any calls add for real and ends waiting with a summary."""
    tools = ToolsPlugin()
    async with loopwright.Runtime(_assembly(tmp_path), plugins=[tools], autoload=False) as rt:
        rt.register_plugin(loopwright_testing)
        run = await rt.start_agent(Definition(name="x", model="test:any", tools=("add",)), None, "add two numbers")
        result = await run.result()
        records = await rt.records(run.instance_id)
    assert result.state is State.WAITING
    assert result.stop_reason is StopReason.WAITING
    assert result.text == "test answer: add -> 3"
    assert result.usage.requests == 2
    assert result.cost.amount == 0
    assert tools.calls == ["add"]
    [call_record] = [r for r in records if r["kind"] == "tool_call"]
    assert call_record["data"]["status"] == "success"
    # The runtime gives the call its own id; the test provider's id is kept as the wire id.
    [made] = [c for m in run.inst.transcript if m.role == "assistant" for c in m.tool_calls]
    assert made.provider_id == "test_1_1"
    assert re.fullmatch(r"lw-1-0-[0-9a-f]{6}", made.id), made.id
    assert call_record["data"]["toolCallId"] == made.id
    assert (tmp_path / "store").is_dir()


async def test_full_run_with_task_complete_completes(tmp_path):
    """With task_complete offered, the run ends completed with the summary as its result."""
    plugins = [loopwright_testing, ToolsPlugin()]
    async with loopwright.Runtime(_assembly(tmp_path), plugins=plugins, autoload=False) as rt:
        run = await rt.start_agent(
            {"name": "y", "model": "test:any", "tools": ["add", "shout", "task_complete"]}, None, "go"
        )
        result = await run.result()
    assert result.stop_reason is StopReason.COMPLETED
    assert result.output["result"] == "test answer: add -> 3; shout -> A"


async def test_assembly_can_configure_the_test_kind(tmp_path):
    """An assembly provider of kind test takes options, and its name serves the model references."""
    assembly = _assembly(tmp_path, providers={"mock": ProviderConfig(kind="test", options={"answer": "fixed"})})
    async with loopwright.Runtime(assembly, plugins=[loopwright_testing], autoload=False) as rt:
        run = await rt.start_agent(Definition(name="z", model="mock:whatever"), None, "hi")
        result = await run.result()
    assert result.text == "fixed"


async def test_test_kind_needs_no_assembly_entry(tmp_path):
    """Through the loopwright entry point alone, test:any resolves with no provider in the assembly."""
    assembly = Assembly(
        store=StoreConfig(kind="file", options={"path": str(tmp_path / "store")}),
        disable_plugins=("openai",),  # another team's plugin, not under test here
    )
    async with loopwright.Runtime(assembly, autoload=True) as rt:
        assert rt.plugins.providers.plugin_of("test") == "testing"
        run = await rt.start_agent(Definition(name="x", model="test:any"), None, "hello")
        result = await run.result()
    assert result.text == "test answer to: hello"

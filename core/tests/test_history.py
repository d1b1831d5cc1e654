"""``Runtime.start_agent(history=...)``: a host's conversation goes before the task prompt, as it is."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from helpers import Harness, defn, entries_path, make_runtime, reply

from loopwright import Message
from loopwright.errors import ConfigError

pytestmark = pytest.mark.anyio


async def test_history_goes_between_the_system_prompt_and_the_task_prompt(tmp_path: Path) -> None:
    """The model sees system prompt, history (untemplated), then the prompt; the header keeps the history."""
    harness = Harness(reply("the answer"))
    history = [Message(role="user", content="my name is {{ name }}"), Message(role="assistant", content="hi")]
    async with make_runtime(tmp_path, harness) as rt:
        run = await rt.start_agent(defn(system_prompt="be brief"), prompt="what is my name?", history=history)
        with anyio.fail_after(10):
            result = await run.wait()
    assert result.text == "the answer"
    sent = [(m.role, m.content) for m in harness.sent[0]]
    assert sent == [("system", "be brief"), ("user", "my name is {{ name }}"), ("assistant", "hi"),
                    ("user", "what is my name?")]
    header = json.loads((entries_path(rt, run.instance_id).parent / "instance.json").read_text())
    assert header["taskHistory"] == [{"role": "user", "content": "my name is {{ name }}"},
                                     {"role": "assistant", "content": "hi"}]


async def test_history_with_a_tool_message_is_refused(tmp_path: Path) -> None:
    """A tool message (or a tool call) in the history is a ConfigError naming its index; nothing is created."""
    async with make_runtime(tmp_path, Harness()) as rt:
        with pytest.raises(ConfigError, match="history message 1"):
            await rt.start_agent(defn(), prompt="go", history=[
                Message(role="user", content="a"), Message(role="tool", content="b", tool_call_id="x")])
        assert await rt.list_instances() == []


async def test_history_is_refused_when_initial_prompts_inject_calls(tmp_path: Path) -> None:
    """Injected calls could hold the task prompt back, so such a definition takes no history."""
    from loopwright._definition import InitialPrompt, InitialToolCall  # noqa: PLC0415

    definition = defn(initial_prompts=(InitialPrompt(role="assistant", tool_calls=(
        InitialToolCall(name="task_complete", arguments={"result": "x", "summary": "y"}),)),))
    async with make_runtime(tmp_path, Harness()) as rt:
        with pytest.raises(ConfigError, match="initialPrompts"):
            await rt.start_agent(definition, prompt="go", history=[Message(role="user", content="a")])

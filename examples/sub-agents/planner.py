"""A provider kind ``planner``: a tiny offline model that delegates, for this example.

It plays a lead agent from the transcript alone (so any process can continue it):

1. no tool results yet: it starts one ``researcher`` per topic with ``run_agent_async``, all in one
   turn (the topics are the lines of the task prompt);
2. the agents were started: it waits for all of them with ``await_agent {ids, all: true}``, the ids
   read from the ``run_agent_async`` results;
3. ``await_agent`` reported (``{done, agents: [{instanceId, name, state, text, ...}]}``): it answers
   with each child's text.

A real model decides the same steps itself; the researchers run on the ``test`` model.
"""

import json
from collections.abc import Callable
from typing import Any

import loopwright
from loopwright.abc import Provider, ProviderSettings


def _json(text: str | None) -> Any:
    try:
        return json.loads(text or "")
    except ValueError:
        return None


class PlannerProvider(Provider):
    """Delegates each line of the task prompt to a ``researcher`` and reports their answers."""

    free = True  # its calls cost nothing (no price lookup)

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    async def complete(self, request: loopwright.ModelRequest) -> loopwright.ModelResponse:
        messages = list(request.messages)
        task = next(m.content or "" for m in reversed(messages) if m.role == "user")
        results = [m for m in messages if m.role == "tool"]
        started = [r for r in results if r.name == "run_agent_async"]
        awaited = [r for r in results if r.name == "await_agent"]
        calls: tuple[loopwright.ToolCall, ...] = ()
        text = None
        if awaited:
            report = _json(awaited[-1].content) or {}
            text = "\n".join(f"- {a['name']} {a['instanceId']}: {a['text']}" for a in report.get("agents", []))
        elif started:
            ids = [r["instanceId"] for r in map(_json, (s.content for s in started)) if isinstance(r, dict)]
            calls = (loopwright.ToolCall(id="await", name="await_agent", arguments={"ids": ids, "all": True}),)
        else:
            topics = [line.strip() for line in task.splitlines() if line.strip()]
            calls = tuple(
                loopwright.ToolCall(id=f"start_{k}", name="run_agent_async",
                                    arguments={"definition": "researcher", "prompt": topic})
                for k, topic in enumerate(topics))
        return loopwright.ModelResponse(
            message=loopwright.Message(role="assistant", content=text, tool_calls=calls),
            usage=loopwright.Usage(input_tokens=10, output_tokens=5, total_tokens=15, requests=1),
            finish_reason="tool_calls" if calls else "stop")


@loopwright.hookimpl
def loopwright_register_providers(register: Callable[..., None]) -> None:
    register("planner", PlannerProvider)

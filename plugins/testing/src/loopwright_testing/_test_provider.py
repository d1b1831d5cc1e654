"""The ``test`` provider: a deterministic, offline model that exercises every tool it is given.

Like PydanticAI's ``TestModel``, it needs no script: it reads the transcript and plays a
plausible, always identical part.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from loopwright import Message, ModelRequest, ModelResponse, ToolCall
from loopwright.abc import Provider, ProviderSettings
from loopwright_testing._common import estimate_usage, next_turn
from loopwright_testing._schema import generate_arguments, generate_value

if TYPE_CHECKING:
    from loopwright import ToolSpec

__all__ = ["COMPLETION_TOOLS", "TestProvider"]

#: Tools the ``test`` model keeps for last: it calls every other tool first.
COMPLETION_TOOLS = frozenset({"task_complete", "ask_user"})

_RESULT_CHARS = 80
_PROMPT_CHARS = 200


class TestProvider(Provider):
    """Provider kind ``test``: deterministic answers with no network and no script.

    Model references look like ``test:any``; the part after the colon is ignored. For each
    request it looks at the conversation since the last ``user`` message:

    1. No tool calls yet: it calls every tool of ``request.tools`` once, all in one reply
       (parallel calls), with arguments generated from each tool's JSON Schema (see
       :func:`~loopwright_testing.generate_arguments`). ``task_complete`` and ``ask_user`` are
       left out of this round; if they are the only tools, it calls ``task_complete``.
    2. Tool results are in: if ``task_complete`` is offered and was not called yet, it calls it
       with the summary as ``result`` and ``summary``; otherwise it answers with the summary
       text, ``"test answer: add -> 3; lookup -> ..."``.
    3. No tools at all: it answers ``test answer to: <the last user prompt>``.

    With ``request.output_schema`` set, every text answer is instead the JSON of a value
    generated from that schema. ``modelSettings.toolChoice: none`` suppresses tool calls.

    Options (``providers: {NAME: {kind: test, ...}}``):

    * ``callTools``: ``all`` (the default), ``none``, or a list of tool names to call.
    * ``answer``: a fixed final text instead of the summary.

    Usage is characters / 4 of the request and of the answer, with ``requests=1``; tool-call
    ids are ``test_<turn>_<k>``. The provider holds no per-call state, so it serves many runs
    at once.

    Attributes:
        settings: How the assembly configured it.
        free: Always ``True``: the runtime prices its calls at 0.
        price_provider_id: Always ``None``: it has no entry in the price table.

    """

    __test__: ClassVar[bool] = False  # not a pytest test class, despite its name

    free: ClassVar[bool] = True
    price_provider_id: ClassVar[str | None] = None

    def __init__(self, settings: ProviderSettings | None = None) -> None:
        """Build the provider from ``settings`` (default: name and kind ``test``)."""
        self.settings = settings or ProviderSettings(name="test", kind="test")
        options = self.settings.options
        call_tools = options.get("callTools", "all")
        if call_tools not in ("all", "none") and not (
            isinstance(call_tools, Sequence)
            and not isinstance(call_tools, str)
            and all(isinstance(n, str) for n in call_tools)
        ):
            raise ValueError(
                f"provider {self.settings.name!r}: callTools must be 'all', 'none' or a "
                f"list of tool names, not {call_tools!r}"
            )
        self._call_tools: str | frozenset[str] = call_tools if isinstance(call_tools, str) else frozenset(call_tools)
        answer = options.get("answer")
        self._answer: str | None = None if answer is None else str(answer)

    def __repr__(self) -> str:
        return f"TestProvider(name={self.settings.name!r})"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer deterministically as described on the class; never raises for a valid request."""
        messages = request.messages
        called, results = _since_last_user(messages)
        tools = self._callable(request)
        calls: list[tuple[str, dict[str, Any]]] = []
        if not called and tools:
            regular = [t for t in tools if t.name not in COMPLETION_TOOLS]
            if regular:
                calls = [(t.name, generate_arguments(t.parameters)) for t in regular]
            else:
                calls = [(t.name, generate_arguments(t.parameters)) for t in tools if t.name == "task_complete"]
        elif called and not any(c.name == "task_complete" for c in called):
            finisher = next((t for t in tools if t.name == "task_complete"), None)
            if finisher is not None and results:
                summary = self._final_text(request, results)
                args = {**generate_arguments(finisher.parameters), "result": summary, "summary": summary}
                calls = [("task_complete", args)]
        if calls:
            turn = next_turn(messages)
            message = Message(
                role="assistant",
                tool_calls=tuple(
                    ToolCall(id=f"test_{turn}_{k}", name=name, arguments=args)
                    for k, (name, args) in enumerate(calls, start=1)
                ),
            )
            finish = "tool_calls"
        else:
            message = Message(role="assistant", content=self._final_text(request, results))
            finish = "stop"
        return ModelResponse(
            message=message,
            usage=estimate_usage(request, message),
            finish_reason=finish,
            model=request.model,
            raw_finish_reason=finish,
        )

    def _callable(self, request: ModelRequest) -> list[ToolSpec]:
        if self._call_tools == "none" or request.settings.get("toolChoice") == "none":
            return []
        if self._call_tools == "all":
            return list(request.tools)
        return [t for t in request.tools if t.name in self._call_tools]

    def _final_text(self, request: ModelRequest, results: Sequence[Message]) -> str:
        if request.output_schema is not None:
            return json.dumps(generate_value(request.output_schema), sort_keys=True)
        if self._answer is not None:
            return self._answer
        if results:
            return "test answer: " + "; ".join(map(_describe, results))
        prompt = next((m.content for m in reversed(request.messages) if m.role == "user" and m.content), None)
        return f"test answer to: {_clip(prompt, _PROMPT_CHARS)}" if prompt else "test answer"


def _since_last_user(messages: Sequence[Message]) -> tuple[list[ToolCall], list[Message]]:
    """Return the calls made and the tool results received since the last user message."""
    called: list[ToolCall] = []
    results: list[Message] = []
    for m in reversed(messages):
        if m.role == "user":
            break
        if m.role == "assistant":
            called.extend(m.tool_calls)
        elif m.role == "tool":
            results.append(m)
    called.reverse()
    results.reverse()
    names = {c.id: c.name for c in called}
    return called, [m if m.name else _named(m, names) for m in results]


def _named(message: Message, names: Mapping[str, str]) -> Message:
    import attrs  # noqa: PLC0415 - rare path

    return attrs.evolve(message, name=names.get(message.tool_call_id or "", message.tool_call_id))


def _describe(result: Message) -> str:
    """``NAME -> CONTENT``, the status in front when the content does not already say it (``denied: ...``)."""
    content = result.content or ""
    said = result.status in (None, "success") or content.startswith(f"{result.status}:")
    status = "" if said else f"[{result.status}] "
    return f"{result.name or result.tool_call_id} -> {status}{_clip(content, _RESULT_CHARS)}"


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"

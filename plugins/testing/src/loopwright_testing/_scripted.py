"""The ``scripted`` provider and :class:`FakeProvider`: replay replies written in advance.

A script is a queue of replies. Each model request takes the next one; a request that finds the
queue empty fails with a (non-transient) :class:`~loopwright.errors.ProviderError` saying the
script ran out, so a test that makes more calls than it planned fails loudly.

The ``scripted`` kind also goes on across processes: each answer it gives is marked, in the
assistant message's ``provider_data``, with its place in the script, and a request whose
transcript holds a later mark than the provider has reached skips ahead to it. So ``approve``,
``message`` or ``resume`` from a new process continue the script where the instance left it
(docs/testing-providers.md).
"""

from __future__ import annotations

import collections
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import anyio
import attrs

from loopwright import Message, ModelRequest, ModelResponse, ToolCall, Usage, hookimpl
from loopwright.abc import Provider, ProviderSettings
from loopwright.errors import ConfigError, ConfigProblem, ProviderError
from loopwright_testing._common import estimate_usage, next_turn

if TYPE_CHECKING:
    import os

__all__ = [
    "FakeProvider",
    "Reply",
    "ScriptedError",
    "ScriptedProvider",
    "error",
    "load_script",
    "reply",
    "text",
    "tool_call",
]


@attrs.frozen(kw_only=True)
class ScriptedError:
    """A provider failure to replay.

    At replay it is raised as a :class:`~loopwright.errors.ProviderError` that names the provider
    and the requested model.

    Attributes:
        message: What went wrong.
        status: The HTTP status to pretend, if any.
        transient: Whether a retry may help (the runtime then retries or falls back).
        retry_after: Seconds the "server" asks to wait.
        body: A response body to pretend.

    """

    message: str = "scripted failure"
    status: int | None = None
    transient: bool = False
    retry_after: float | None = None
    body: str | None = None


#: What a script holds: a text answer, a :class:`~loopwright.ModelResponse`, an assistant
#: :class:`~loopwright.Message`, an exception instance to raise, a :class:`ScriptedError`, a
#: YAML-style mapping, or a callable ``fn(request)`` (sync or async) returning any of those.
Reply: TypeAlias = (
    str | ModelResponse | Message | BaseException | ScriptedError | Mapping[str, Any] | Callable[[ModelRequest], Any]
)

#: Statuses a scripted ``error`` is transient for when it does not say (as real providers treat them).
_TRANSIENT = frozenset({408, 429})
_SERVER_ERRORS = 500

#: The ``provider_data`` key of the mark an answer carries: ``{"script": NAME, "reply": N}``.
_MARK = "scripted"

_REPLY_KEYS = frozenset({"text", "toolCalls", "finishReason", "usage", "error", "delay", "model"})
_CALL_KEYS = frozenset({"name", "arguments", "id"})
_ERROR_KEYS = frozenset({"status", "message", "transient", "retryAfter", "body"})
_USAGE_KEYS: Mapping[str, str] = {
    "inputTokens": "input_tokens",
    "outputTokens": "output_tokens",
    "totalTokens": "total_tokens",
    "cacheReadTokens": "cache_read_tokens",
    "cacheWriteTokens": "cache_write_tokens",
    "reasoningTokens": "reasoning_tokens",
    "requests": "requests",
}


# -- helpers to write scripts ---------------------------------------------------------------------


def text(content: str, *, usage: Usage | None = None, finish_reason: str = "stop") -> ModelResponse:
    """Return a scripted text answer.

    :param content: The assistant's text.
    :param usage: Token counts; default: estimated from the request at replay (characters / 4).
    :param finish_reason: The normalised finish reason.
    """
    return ModelResponse(
        message=Message(role="assistant", content=content),
        usage=usage or Usage(),
        finish_reason=finish_reason,
    )


def tool_call(name: str, arguments: Mapping[str, Any] | None = None, /, **kwargs: Any) -> ToolCall:
    """Return a scripted tool call; its id is filled in at replay (``call_<turn>_<k>``).

    ``tool_call("add", a=1, b=2)``; pass a mapping for argument names that clash with Python
    (``tool_call("f", {"name": "x"})``). For a fixed id, use ``ToolCall(id=..., ...)`` instead.
    """
    return ToolCall(id="", name=name, arguments={**(arguments or {}), **kwargs})


def reply(
    text: str | None = None,
    *calls: ToolCall,
    usage: Usage | None = None,
    finish_reason: str | None = None,
) -> ModelResponse:
    """Return a scripted answer with text and/or tool calls: ``reply(None, tool_call("add", a=1))``.

    :param text: The assistant's text, or ``None``.
    :param calls: Tool calls, made with :func:`tool_call` or :class:`~loopwright.ToolCall`.
    :param usage: Token counts; default: estimated at replay.
    :param finish_reason: Default ``tool_calls`` when there are calls, else ``stop``.
    """
    return ModelResponse(
        message=Message(role="assistant", content=text, tool_calls=tuple(calls)),
        usage=usage or Usage(),
        finish_reason=finish_reason or ("tool_calls" if calls else "stop"),
    )


def error(
    message: str = "scripted failure",
    *,
    status: int | None = None,
    transient: bool = False,
    retry_after: float | None = None,
    body: str | None = None,
) -> ScriptedError:
    """Return a scripted provider failure (see :class:`ScriptedError`)."""
    return ScriptedError(message=message, status=status, transient=transient, retry_after=retry_after, body=body)


# -- normalising replies ------------------------------------------------------------------------


@attrs.frozen
class _Step:
    """One queued reply, checked and normalised when it was enqueued."""

    outcome: ModelResponse | BaseException | ScriptedError | Callable[[ModelRequest], Any]
    delay: float = 0.0
    key: str = ""


def _keyed(value: Any, where: str, file: str | None, previous: str) -> _Step:
    """Return the step of ``value``, keyed for the answer marks.

    The key digests what was written for this reply and every reply before it (``previous`` is
    the key of the one before), so it names the script up to this reply.
    """
    import hashlib  # noqa: PLC0415 - only scripts need it

    step = _step(value, where, file)
    try:
        written = previous + json.dumps(value, sort_keys=True, default=repr)
    except (RecursionError, ValueError):  # a reply built in Python that no file can hold: unique to this object
        written = f"{previous}<reply {id(value)}>"
    return attrs.evolve(step, key=hashlib.sha256(written.encode()).hexdigest()[:16])


def _step(value: Any, where: str, file: str | None) -> _Step:
    if isinstance(value, _Step):
        return value
    if isinstance(value, str):
        return _Step(text(value))
    if isinstance(value, (ModelResponse, BaseException, ScriptedError)):
        return _Step(value)
    if isinstance(value, Message):
        return _Step(reply(value.content, *value.tool_calls))
    if isinstance(value, Mapping):
        return _from_mapping(value, where, file)
    if callable(value):
        return _Step(value)
    raise TypeError(
        f"{where}: a scripted reply is a str, ModelResponse, Message, exception, ScriptedError, "
        f"mapping or callable, not {type(value).__name__}"
    )


def _problem(message: str, where: str, file: str | None) -> ConfigError:
    return ConfigError(
        f"invalid scripted reply at {where}",
        path=file,
        problems=[ConfigProblem(message, file=file, path=where)],
    )


def _from_mapping(data: Mapping[str, Any], where: str, file: str | None) -> _Step:  # noqa: C901
    unknown = sorted(set(data) - _REPLY_KEYS)
    if unknown:
        raise _problem(f"unknown keys {', '.join(unknown)}; allowed: {', '.join(sorted(_REPLY_KEYS))}", where, file)
    delay = data.get("delay", 0)
    if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
        raise _problem("delay must be a number of seconds >= 0", f"{where}.delay", file)
    if "error" in data:
        extra = sorted(set(data) - {"error", "delay"})
        if extra:
            raise _problem(f"an error reply takes no {', '.join(extra)}", where, file)
        return _Step(_error_from(data["error"], f"{where}.error", file), float(delay))
    content = data.get("text")
    if content is not None and not isinstance(content, str):
        raise _problem("text must be a string", f"{where}.text", file)
    calls = []
    raw_calls = data.get("toolCalls") or []
    if not isinstance(raw_calls, Sequence) or isinstance(raw_calls, str):
        raise _problem("toolCalls must be a list", f"{where}.toolCalls", file)
    for k, raw in enumerate(raw_calls):
        calls.append(_call_from(raw, f"{where}.toolCalls[{k}]", file))
    usage = None
    if data.get("usage") is not None:
        usage = _usage_from(data["usage"], f"{where}.usage", file)
    finish = data.get("finishReason")
    if finish is not None and not isinstance(finish, str):
        raise _problem("finishReason must be a string", f"{where}.finishReason", file)
    model = data.get("model")
    response = reply(content, *calls, usage=usage, finish_reason=finish)
    if model is not None:
        response = attrs.evolve(response, model=str(model))
    return _Step(response, float(delay))


def _call_from(raw: Any, where: str, file: str | None) -> ToolCall:
    if not isinstance(raw, Mapping):
        raise _problem("a tool call is a mapping {name, arguments, id?}", where, file)
    unknown = sorted(set(raw) - _CALL_KEYS)
    if unknown:
        raise _problem(f"unknown keys {', '.join(unknown)}; allowed: arguments, id, name", where, file)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise _problem("name is required and must be a string", f"{where}.name", file)
    args = raw.get("arguments", {})
    call_id = raw.get("id") or ""
    if isinstance(args, str):
        from loopwright.http import parse_tool_arguments  # noqa: PLC0415 - httpx only for text arguments

        # A string is what the model "wrote", decoded as every provider decodes it: a JSON object
        # becomes arguments, anything else stays raw (to test invalid_arguments handling).
        parsed, raw_args = parse_tool_arguments(args) if args.strip() else ({}, args)
        return ToolCall(id=str(call_id), name=name, arguments=dict(parsed), raw_arguments=raw_args)
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise _problem("arguments must be a mapping or a string", f"{where}.arguments", file)
    return ToolCall(id=str(call_id), name=name, arguments=dict(args))


def _usage_from(raw: Any, where: str, file: str | None) -> Usage:
    if not isinstance(raw, Mapping):
        raise _problem("usage must be a mapping", where, file)
    unknown = sorted(set(raw) - set(_USAGE_KEYS))
    if unknown:
        raise _problem(f"unknown keys {', '.join(unknown)}; allowed: {', '.join(sorted(_USAGE_KEYS))}", where, file)
    values: dict[str, int] = {}
    for key, field in _USAGE_KEYS.items():
        if key in raw:
            v = raw[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise _problem(f"{key} must be an integer >= 0", f"{where}.{key}", file)
            values[field] = v
    values.setdefault("total_tokens", values.get("input_tokens", 0) + values.get("output_tokens", 0))
    values.setdefault("requests", 1)
    return Usage(**values)


def _error_from(raw: Any, where: str, file: str | None) -> ScriptedError:
    if isinstance(raw, str):
        return ScriptedError(message=raw)
    if not isinstance(raw, Mapping):
        raise _problem("error must be a string or a mapping {status, message, transient, retryAfter}", where, file)
    unknown = sorted(set(raw) - _ERROR_KEYS)
    if unknown:
        raise _problem(f"unknown keys {', '.join(unknown)}; allowed: {', '.join(sorted(_ERROR_KEYS))}", where, file)
    status = raw.get("status")
    if status is not None and (not isinstance(status, int) or isinstance(status, bool)):
        raise _problem("status must be an integer", f"{where}.status", file)
    retry_after = raw.get("retryAfter")
    if retry_after is not None and (not isinstance(retry_after, (int, float)) or isinstance(retry_after, bool)):
        raise _problem("retryAfter must be a number of seconds", f"{where}.retryAfter", file)
    transient = raw.get("transient", status is not None and (status in _TRANSIENT or status >= _SERVER_ERRORS))
    if not isinstance(transient, bool):
        raise _problem("transient must be true or false", f"{where}.transient", file)
    return ScriptedError(
        message=str(raw.get("message", "scripted failure")),
        status=status,
        transient=transient,
        retry_after=None if retry_after is None else float(retry_after),
        body=None if raw.get("body") is None else str(raw["body"]),
    )


def load_script(path: str | os.PathLike[str]) -> list[Any]:
    """Read replies from a YAML file: a list of replies, or a mapping with a ``replies`` list.

    :raises ConfigError: The file is missing, is not YAML, is over the loader's limits (size,
        values counting aliases, depth; see :func:`loopwright.read_yaml`), carries a tag other
        than YAML's plain ones, or holds no list of replies.
    """
    from loopwright import read_yaml  # noqa: PLC0415 - only scripts from files need the YAML machinery

    file = Path(path)
    try:
        data = read_yaml(file)
    except ConfigError as exc:
        unread = any(p.line is None for p in exc.problems)  # a read error has no position
        message = f"cannot read script {file}" if unread else f"script {file} is not valid YAML"
        raise ConfigError(f"{message}: {exc}", path=str(file), problems=exc.problems) from None
    if isinstance(data, Mapping) and set(data) == {"replies"}:
        data = data["replies"]
    if not isinstance(data, list):
        raise ConfigError(
            f"script {file} must hold a list of replies (or a mapping with a 'replies' list)", path=str(file)
        )
    return data


# -- the providers --------------------------------------------------------------------------------


class ScriptedProvider(Provider):
    """Provider kind ``scripted``: each request takes the next reply of a script.

    From an assembly::

        providers:
          script:
            kind: scripted
            replies:                  # or: file: replies.yaml (a list, or {replies: [...]})
              - text: "hello"
              - toolCalls: [{name: add, arguments: {a: 1, b: 2}}]
                usage: {inputTokens: 10, outputTokens: 5}
              - error: {status: 503, message: overloaded, transient: true, retryAfter: 0}
              - "a plain string is a text answer"

    A mapping reply takes ``text``, ``toolCalls`` (each ``{name, arguments, id?}``; a string
    ``arguments`` that is not a JSON object is kept as ``raw_arguments``), ``finishReason``,
    ``usage`` (``inputTokens``, ``outputTokens`` ...), ``model`` and ``delay`` (seconds to sleep
    first), or ``error`` (``{status, message, transient, retryAfter, body}``). From Python,
    :meth:`enqueue` also takes the forms listed under :data:`Reply`. A relative ``file`` is
    read from the current directory.

    At replay: tool calls without an id get ``call_<turn>_<k>``; a zero ``Usage()`` is replaced
    by the estimate (characters / 4); ``model`` defaults to the requested one.

    Across processes: each answer's message carries ``provider_data={"scripted": {"script":
    NAME, "reply": N, "key": DIGEST}}`` (N counts from 1, errors included; DIGEST is of the
    script as written up to reply N), and a request whose transcript's latest such mark (of
    this provider's name) is ahead of the provider skips the replies up to it first, if the
    script up to reply N is still the one marked. A fresh process taking up an instance
    (``approve``, ``message``, ``resume``) so goes on with the reply after the instance's last
    answer; in one process nothing is skipped, since the provider is always at or past the
    marks it wrote. (:class:`FakeProvider` marks nothing: its queue is whatever the test
    enqueued.)

    Attributes:
        settings: How the assembly configured it.
        history: Every request received, in order, each with a snapshot of its messages (so
            later turns do not show up in earlier requests).
        free: Always ``True``: the runtime prices its calls at 0.
        price_provider_id: Always ``None``.

    """

    free: ClassVar[bool] = True
    price_provider_id: ClassVar[str | None] = None
    #: Whether answers carry the mark a fresh process finds its place by (see the class doc).
    marks_answers: ClassVar[bool] = True

    def __init__(self, settings: ProviderSettings | None = None) -> None:
        """Build the provider; the script comes from ``settings.options`` (``replies`` or ``file``).

        :raises ConfigError: A reply is malformed, or both ``replies`` and ``file`` are given.
        """
        self.settings = settings or ProviderSettings(name="scripted", kind="scripted")
        self.history: list[ModelRequest] = []
        self._queue: collections.deque[_Step] = collections.deque()
        self._served = 0
        self._key = ""  # the key of the reply served last
        self._last_key = ""  # the key of the reply enqueued last
        options = self.settings.options
        base = f"$.providers.{self.settings.name}"
        if options.get("replies") is not None and options.get("file") is not None:
            raise _problem("give either replies or file, not both", base, None)
        if options.get("file") is not None:
            file = str(options["file"])
            for i, item in enumerate(load_script(file)):
                self._append(_keyed(item, f"$[{i}]", file, self._last_key))
        elif options.get("replies") is not None:
            replies = options["replies"]
            if not isinstance(replies, Sequence) or isinstance(replies, str):
                raise _problem("replies must be a list", f"{base}.replies", None)
            for i, item in enumerate(replies):
                self._append(_keyed(item, f"{base}.replies[{i}]", None, self._last_key))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.settings.name!r}, remaining={len(self._queue)})"

    @property
    def remaining(self) -> int:
        """How many replies are still queued."""
        return len(self._queue)

    @property
    def served(self) -> int:
        """How many requests took a reply so far."""
        return self._served

    def enqueue(self, *replies: Reply) -> None:
        """Append replies to the script (see :data:`Reply` for the accepted forms).

        :raises TypeError: A reply is of no accepted type.
        :raises ConfigError: A mapping reply is malformed.
        """
        start = self._served + len(self._queue)
        for i, item in enumerate(replies):
            self._append(_keyed(item, f"replies[{start + i}]", None, self._last_key))

    def _append(self, step: _Step) -> None:
        self._queue.append(step)
        self._last_key = step.key

    def clear(self) -> None:
        """Drop every queued reply (the history is kept)."""
        self._queue.clear()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Replay the next reply.

        :raises ProviderError: The reply is a :class:`ScriptedError`, or the script ran out
            (``transient=False``).
        :raises BaseException: The reply is an exception instance: it is raised as it is.
        """
        self.history.append(attrs.evolve(request, messages=tuple(request.messages)))
        if self.marks_answers:
            self._catch_up(request.messages)
        if not self._queue:
            raise ProviderError(
                f"the script ran out: all {self._served} scripted replies were used, and request "
                f"{self._served + 1} has none; enqueue more replies (or add them under replies:)",
                provider=self.settings.name,
                model=request.model,
                transient=False,
            )
        step = self._queue.popleft()
        self._served += 1
        self._key = step.key
        if step.delay:
            await anyio.sleep(step.delay)
        outcome: Any = step.outcome
        if callable(outcome) and not isinstance(outcome, (BaseException, ScriptedError, ModelResponse)):
            produced = outcome(request)
            if inspect.isawaitable(produced):
                produced = await produced
            if callable(produced) and not isinstance(produced, (BaseException, ScriptedError)):
                raise TypeError("a scripted reply function must not return another function")
            outcome = _step(produced, f"replies[{self._served - 1}]()", None).outcome
        if isinstance(outcome, BaseException):
            raise outcome
        if isinstance(outcome, ScriptedError):
            raise ProviderError(
                outcome.message,
                provider=self.settings.name,
                model=request.model,
                status=outcome.status,
                body=outcome.body,
                retry_after=outcome.retry_after,
                transient=outcome.transient,
            )
        response = _finish(outcome, request)
        if not self.marks_answers:
            return response
        mark = {_MARK: {"script": self.settings.name, "reply": self._served, "key": self._key}}
        message = attrs.evolve(response.message, provider_data={**(response.message.provider_data or {}), **mark})
        return attrs.evolve(response, message=message)

    def _catch_up(self, messages: Sequence[Message]) -> None:
        """Skip the replies up to the latest mark of this script in ``messages``, if it is ahead.

        Only when the script up to the marked reply is still the one marked (same key): a script
        rewritten between processes (say, to hold only what comes next) is not skipped.
        """
        for message in reversed(messages):
            if message.role != "assistant" or not message.provider_data:
                continue
            mark = message.provider_data.get(_MARK)
            if not isinstance(mark, Mapping) or mark.get("script") != self.settings.name:
                continue
            reached = mark.get("reply")
            if not isinstance(reached, int) or isinstance(reached, bool):
                return
            ahead = reached - self._served
            if 0 < ahead <= len(self._queue) and self._queue[ahead - 1].key == mark.get("key"):
                for _ in range(ahead):
                    self._queue.popleft()
                self._served = reached
            return

    @property
    def script(self) -> Sequence[Any]:
        """The queued replies, normalised (read-only; for debugging a test)."""
        return tuple(s.outcome for s in self._queue)


class FakeProvider(ScriptedProvider):
    """A :class:`ScriptedProvider` for Python tests: ``enqueue()`` replies, then read ``history``.

    Usage::

        fake = FakeProvider("hello")
        fake.enqueue(reply(None, tool_call("add", a=1, b=2)), "the sum is 3")
        async with Runtime(assembly, plugins=[fake.as_plugin("fake")]) as rt:
            run = await rt.start_agent(Definition(name="x", model="fake:any", tools=("add",)), prompt="1+2?")
            assert (await run.result()).text == "the sum is 3"
        assert fake.history[1].messages[-1].role == "tool"

    The ``fake_provider`` pytest fixture is one of these, registered as provider ``fake``.
    It marks no answer and skips nothing: a test resuming an instance in a new runtime
    enqueues the replies that come next.
    """

    marks_answers: ClassVar[bool] = False

    def __init__(self, *replies: Reply, settings: ProviderSettings | None = None) -> None:
        """Build a fake provider holding ``replies`` (default name and kind: ``fake``)."""
        super().__init__(settings or ProviderSettings(name="fake", kind="fake"))
        self.enqueue(*replies)

    def as_plugin(self, kind: str = "fake") -> object:
        """Return a plugin object that registers this very provider as provider kind ``kind``.

        Every runtime it is registered on then serves ``KIND:any`` with this instance.
        """
        return _ProviderPlugin(kind, self)


@attrs.frozen
class _ProviderPlugin:
    """A plugin registering one ready-made provider instance under a kind."""

    kind: str
    provider: Provider

    @hookimpl
    def loopwright_register_providers(self, register: Callable[..., None]) -> None:
        """Register the provider instance under ``kind``, whatever settings the runtime passes."""
        provider = self.provider
        register(self.kind, lambda _settings: provider)


def _finish(response: ModelResponse, request: ModelRequest) -> ModelResponse:
    """Fill in what a scripted response leaves open: call ids, model and usage."""
    message = response.message
    changes: dict[str, Any] = {}
    if message.role != "assistant":
        message = attrs.evolve(message, role="assistant")
    if any(not c.id for c in message.tool_calls):
        turn = next_turn(request.messages)
        message = attrs.evolve(
            message,
            tool_calls=tuple(
                c if c.id else attrs.evolve(c, id=f"call_{turn}_{k}") for k, c in enumerate(message.tool_calls, 1)
            ),
        )
    if message is not response.message:
        changes["message"] = message
    if response.model is None:
        changes["model"] = request.model
    if response.usage == Usage():
        changes["usage"] = estimate_usage(request, message)
    return attrs.evolve(response, **changes) if changes else response

"""The OpenAI-compatible Chat Completions surface, mounted at ``/openai/v1`` (issue 14).

``GET /openai/v1/models`` lists the assembly's ``agentDefinitions`` as models named
``loopwright/<name>``. ``POST /openai/v1/chat/completions`` (``stream`` true or false) starts one
instance of the named definition per request: the last message (a ``user`` one) is the task
prompt, the earlier ones the instance's history (:meth:`loopwright.Runtime.start_agent`'s
``history``), and the answer is the agent's final text. The agent's own tool calls run inside
the server; none is returned to the client, and a request that offers client tools is refused.

Every response names the instance: the ``x-loopwright-instance`` header and
``metadata.instance_id`` (with ``state`` and ``stop_reason``). A run that rests holding calls for
approval answers with an assistant message saying so and ``finish_reason``
``"waiting_for_approval"``; a limit that ends the run gives ``"length"``. Errors have OpenAI's
shape, ``{"error": {"message", "type", "param", "code"}}``, with ``x-should-retry: false`` so that
SDKs do not send again what would fail again or run the agent again. A request that names an
instance in ``x-loopwright-instance`` continues that (resting) instance with its last message
instead of starting one. The mapping is in ``docs/protocols.md``.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route

from loopwright import AgentResult, Message, State, StopReason, Usage, approval_digest
from loopwright.errors import ConfigError, InstanceNotFoundError
from loopwright_serve._auth import Scope
from loopwright_serve._problems import ProblemError
from loopwright_serve._resting import Started, question_of, start
from loopwright_serve._schema import load_json
from loopwright_serve._steer import new_id
from loopwright_serve._surface import null_lifespan

if TYPE_CHECKING:
    from starlette.requests import Request

    from loopwright import AgentRun, PendingApproval
    from loopwright_serve._context import ServeContext
    from loopwright_serve._deltas import LiveEvent, Subscription

__all__ = ["OpenAICompatSurface"]

#: The prefix of every model id this surface lists and accepts.
MODEL_PREFIX = "loopwright/"
#: The response header that names the instance a request started.
INSTANCE_HEADER = "x-loopwright-instance"
#: The finish reason of a run that rests holding calls for approval.
FINISH_WAITING_FOR_APPROVAL = "waiting_for_approval"
#: What an instance id named in a request may look like (the ids stores make; no path tricks).
_INSTANCE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
#: Seconds between SSE comments while a streamed run works (clients ignore them; proxies see traffic).
KEEPALIVE = 10.0
#: Request keys that would hand tools or several choices to the client, which this surface cannot do.
_REFUSED_KEYS = ("tools", "functions", "tool_choice", "function_call")
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_FINISH = {
    StopReason.MAX_ITERATIONS: "length",
    StopReason.LIMIT_EXCEEDED: "length",
    StopReason.CONTENT_FILTER: "content_filter",
    StopReason.WAITING_FOR_APPROVAL: FINISH_WAITING_FOR_APPROVAL,
}


class ChatError(Exception):
    """A request this surface answers with an OpenAI-shaped error.

    Attributes:
        status: The HTTP status.
        message: What went wrong, for the client.
        type: OpenAI's error ``type`` (``invalid_request_error``, ``authentication_error`` ...).
        param: The request field at fault, if one is.
        code: A short machine-readable code.
        instance_id: The instance concerned, once one exists.
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",  # noqa: A002 - OpenAI's name
                 param: str | None = None, code: str | None = None, instance_id: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = dict(headers or {})
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.instance_id = instance_id

    def response(self) -> JSONResponse:
        """Return the error as OpenAI sends it."""
        headers = dict(self.headers)
        if self.instance_id:
            headers[INSTANCE_HEADER] = self.instance_id
        # None of these is transient: a retry would fail the same way, or run the agent again.
        headers["x-should-retry"] = "false"
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=headers)


@attrs.frozen(kw_only=True)
class ChatRequest:
    """A chat completion request, checked.

    Attributes:
        name: The definition's registered name (the model id without ``loopwright/``).
        model: The model id as the client sent it.
        prompt: The last message's text: the task prompt.
        history: The earlier messages, as loopwright messages.
        inputs: The definition's inputs (the ``inputs`` extension key), if any.
        stream: Whether to answer as server-sent events.
        include_usage: Whether a streamed answer ends with a usage chunk (``stream_options``).
    """

    name: str
    model: str
    prompt: str
    history: tuple[Message, ...] = ()
    inputs: Mapping[str, Any] | None = None
    stream: bool = False
    include_usage: bool = False


class OpenAICompatSurface:
    """The ``/openai/v1`` mount: models and chat completions over the runtime's registered definitions.

    Each request is authorised with the ``run`` scope (the SDK's ``api_key`` is the serve token,
    sent as ``Authorization: Bearer``); a missing or wrong token is a 401 in OpenAI's shape.
    """

    name = "openai"

    def routes(self, ctx: ServeContext) -> list[BaseRoute]:
        """Return the ``/openai/v1`` mount."""

        async def models(request: Request) -> Response:
            return await _guarded(ctx, request, _models)

        async def completions(request: Request) -> Response:
            return await _guarded(ctx, request, _completions)

        return [Mount("/openai/v1", routes=[
            Route("/models", models, methods=["GET"]),
            Route("/chat/completions", completions, methods=["POST"]),
        ])]

    def lifespan(self, ctx: ServeContext) -> contextlib.AbstractAsyncContextManager[None]:  # noqa: ARG002
        """Hold nothing open: every request uses the serve runtime."""
        return null_lifespan()


async def _guarded(ctx: ServeContext, request: Request, handler: Any) -> Response:
    """Authorise ``request`` with the ``run`` scope, then answer it; every error in OpenAI's shape."""
    try:
        try:
            await ctx.authorize(request, Scope.RUN)
            response: Response = await handler(ctx, request)
        except ProblemError as exc:
            raise _from_problem(exc) from exc
    except ChatError as exc:
        return exc.response()
    return response


def _from_problem(exc: ProblemError) -> ChatError:
    """Return the serve layer's problem (401, 403, 503 ...) as an OpenAI-shaped error, headers kept."""
    kind = {401: "authentication_error", 403: "permission_error"}.get(exc.status, "invalid_request_error")
    if exc.status >= 500:  # noqa: PLR2004
        kind = "server_error"
    return ChatError(exc.status, exc.detail or exc.title, type=kind, code=exc.title.lower().replace(" ", "_"),
                     headers=exc.headers)


async def _models(ctx: ServeContext, _request: Request) -> Response:
    """``GET /models``: one model per registered definition."""
    data = [{"id": MODEL_PREFIX + name, "object": "model", "created": 0, "owned_by": "loopwright"}
            for name in sorted(ctx.runtime.assembly.agent_definitions)]
    return JSONResponse({"object": "list", "data": data})


async def _completions(ctx: ServeContext, request: Request) -> Response:
    """``POST /chat/completions``: start the instance, then answer once it rests, at once or as a stream."""
    try:
        body = load_json(await request.body())
    except ValueError as exc:
        raise ChatError(400, f"the request body is not JSON: {exc}") from exc
    chat = parse_request(body, ctx.runtime.assembly.agent_definitions)
    continued = request.headers.get(INSTANCE_HEADER)
    if continued and not ctx.settings.run:
        raise ChatError(501, "continuing an instance needs a server that runs agents; this one has server.run: "
                             "false (send the message through the serve API)", type="server_error",
                        code="not_implemented", param=INSTANCE_HEADER)
    if chat.stream:
        ctx.streams.enter()  # before the instance exists: a refused stream starts nothing
    # A streamed answer run here follows the instance's deltas: subscribed before it runs.
    live = ctx.live.subscribe(continued or new_id()) if chat.stream and ctx.settings.run else None
    try:
        if continued:
            started = Started(continued, await _continue(ctx, chat, continued))
        else:
            started = await start(ctx.runtime, chat.name, chat.inputs, chat.prompt, runs=ctx.settings.run,
                                  history=chat.history, stream=chat.stream,
                                  instance_id=live.instance_id if live else None)
    except BaseException as exc:
        if live is not None:
            ctx.live.unsubscribe(live)
        if chat.stream:
            ctx.streams.leave()
        if isinstance(exc, ConfigError):
            raise ChatError(400, str(exc), code="invalid_agent_input") from exc
        raise
    instance_id = started.instance_id
    completion_id = f"chatcmpl-{instance_id}"
    created = int(time.time())
    if chat.stream:
        return StreamingResponse(_stream(ctx, started, chat, _Chunks(completion_id, created, chat.model), live),
                                 media_type="text/event-stream",
                                 headers={INSTANCE_HEADER: instance_id, "cache-control": "no-cache"})
    rested = await started.rest(ctx.runtime, ctx.streams.closing)
    run, result = _raise_failure(instance_id, rested)
    text, finish = answer_of(result, question_of(run))
    body = {
        "id": completion_id, "object": "chat.completion", "created": created, "model": chat.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                     "finish_reason": finish, "logprobs": None}],
        "usage": usage_json(result.usage), "metadata": metadata_of(result),
    }
    return JSONResponse(body, headers={INSTANCE_HEADER: instance_id})


async def _continue(ctx: ServeContext, chat: ChatRequest, instance_id: str) -> AgentRun:
    """Send the last message to the resting instance ``instance_id`` and return it running again.

    The instance must be a root instance of the requested definition, resting (``waiting``,
    ``stopped`` or ``error``); the earlier messages of the request are not used (it has its own).

    :raises ChatError: 404 no such instance; 400 another definition's, or a sub-agent; 409 it is
        running, waits for approval, or was taken up by another process meanwhile.
    """
    runtime = ctx.runtime
    if not _INSTANCE_ID.fullmatch(instance_id) or ".." in instance_id:
        raise ChatError(400, f"{instance_id!r} is not an instance id", param=INSTANCE_HEADER,
                        code="invalid_instance_id")
    try:
        found = await runtime.summary(instance_id)
    except InstanceNotFoundError as exc:
        raise ChatError(404, f"no instance {instance_id!r}", param=INSTANCE_HEADER,
                        code="instance_not_found") from exc
    if found.get("name") != runtime.load_definition(chat.name).name or found.get("spawnerInstanceId"):
        raise ChatError(400, f"instance {instance_id} is not a root instance of {chat.model!r}",
                        param=INSTANCE_HEADER, code="instance_mismatch")
    state = found.get("state")
    if state in (State.RUNNING.value, State.WAITING_FOR_APPROVAL.value):
        held = ", ".join(f"{p.get('toolCallId')} (digest {p.get('digest')})"
                         for p in found.get("pendingApprovals") or [] if p.get("decision") is None)
        why = f"waits for approval of {held}: decide it first" if held else "is running: wait until it rests"
        raise ChatError(409, f"instance {instance_id} {why}", param=INSTANCE_HEADER, code="instance_busy",
                        instance_id=instance_id)
    run = await runtime.get_agent(instance_id)
    run.stream = run.stream or chat.stream
    await run.message(chat.prompt)
    if not run.running:
        raise ChatError(409, f"instance {instance_id} was taken up by another process; the message is in its "
                             "mailbox, and it reads it at its next turn", code="instance_busy",
                        instance_id=instance_id)
    return run


class _Chunks:
    """The ``chat.completion.chunk`` events of one streamed answer, as SSE ``data:`` lines."""

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        self.head = (f'data: {{"id":{json.dumps(completion_id)},"object":"chat.completion.chunk",'
                     f'"created":{created},"model":{json.dumps(model)},')
        self.completion_id, self.created, self.model = completion_id, created, model

    def delta(self, delta: Mapping[str, Any], finish: str | None = None, **extra: Any) -> str:
        """Return one chunk whose only choice carries ``delta``."""
        choice = {"index": 0, "delta": dict(delta), "finish_reason": finish, "logprobs": None}
        return self.head + json.dumps({"choices": [choice], **extra})[1:] + "\n\n"

    def content(self, text: str) -> str:
        """Return a chunk of content (the hot path: one per streamed piece)."""
        return self.head + '"choices":[{"index":0,"delta":{"content":' + json.dumps(text) + \
            '},"finish_reason":null,"logprobs":null}]}\n\n'

    def usage(self, usage: Usage) -> str:
        """Return the last chunk of a stream asked with ``include_usage``: no choices, the usage."""
        return self.head + json.dumps({"choices": [], "usage": usage_json(usage)})[1:] + "\n\n"


class _Streamed:
    """What a streamed answer has sent of the agent's turns: their text, and the agent's tool calls.

    Each turn's text is sent as it streams; a later turn's is set off from an earlier one by a
    blank line. The agent's own tool calls are sent as they stream under the delta's
    ``agent_tool_calls`` key, shaped like OpenAI's ``tool_calls`` (``index``, ``id``,
    ``function.name``, ``function.arguments`` in pieces; each call of the stream its own index,
    whatever ids the model repeats across turns): never under ``tool_calls``, which would ask the
    client to run them.
    """

    def __init__(self, chunks: _Chunks) -> None:
        self.chunks = chunks
        self.text: dict[int | None, str] = {}
        self.last_turn: int | None = None
        self.lost: set[int | None] = set()
        self.calls: dict[tuple[int | None, str], int] = {}  # (turn, the model's id): its index in the stream
        self.rested = False

    def frames(self, event: LiveEvent) -> list[str]:
        """Return the chunks for one live event (none for a turn whose pieces were lost or reset)."""
        kind, turn = event.kind, event.turn
        if kind == "text_delta":
            if turn in self.lost or not event.delta:
                return []
            piece = event.delta
            if turn not in self.text:
                if any(self.text.values()):
                    piece = "\n\n" + piece
                self.text[turn] = ""
            self.text[turn] += event.delta
            self.last_turn = turn
            return [self.chunks.content(piece)]
        if kind in ("gap", "stream_reset"):  # the rest of the turn comes with the result, if it is the answer
            self.lost.add(turn)
        elif kind == "tool_call_start":
            call_id = str(event.data.get("id"))
            index = self.calls.setdefault((turn, call_id), len(self.calls))
            return [self.chunks.delta({"agent_tool_calls": [{"index": index, "id": call_id, "type": "function",
                                                             "function": {"name": event.data.get("name"),
                                                                          "arguments": ""}}]})]
        elif kind == "tool_call_delta":
            index = self.calls.get((turn, str(event.data.get("id"))))
            if index is not None and turn not in self.lost:
                return [self.chunks.delta({"agent_tool_calls": [{"index": index,
                                                                 "function": {"arguments": event.delta}}]})]
        elif kind == "state" and event.data.get("state") != State.RUNNING.value:
            self.rested = True
        return []

    def rest_of(self, answer: str) -> str:
        """Return what is still to send of the final ``answer`` after what was streamed."""
        last = self.text.get(self.last_turn, "")  # the text of the last turn that streamed any
        if answer == last:
            return ""
        if last and answer.startswith(last):
            return answer[len(last):]
        if not answer:
            return ""
        return ("\n\n" if any(self.text.values()) else "") + answer


async def _stream(ctx: ServeContext, started: Started, chat: ChatRequest, chunks: _Chunks,
                  live: Subscription | None) -> AsyncIterator[str]:
    """Yield the answer as ``chat.completion.chunk`` events, then ``[DONE]``.

    The role comes first, at once. For an instance run here (``live``), each piece of text the
    provider streams is a chunk as it arrives, and the agent's tool calls stream under
    ``agent_tool_calls`` (:class:`_Streamed`); once the run rests, what the answer has beyond
    what was streamed (a ``task_complete`` result, a question, the approval message) follows.
    An instance a worker runs (``server.run: false``) sends its final text once it rests. While
    nothing comes, an SSE comment goes every :data:`KEEPALIVE` seconds (clients ignore it;
    proxies see traffic). A failure after the stream started is an ``error`` event in OpenAI's
    shape, as OpenAI sends one.
    """
    try:
        yield chunks.delta({"role": "assistant", "content": ""}, metadata={"instance_id": started.instance_id})
        streamed = _Streamed(chunks)
        if live is not None:
            async for frame in _follow_live(ctx, started, live, streamed):
                yield frame
        rested = None
        while rested is None:
            rested = await started.rest(ctx.runtime, ctx.streams.closing, KEEPALIVE)
            if rested is None:
                if ctx.streams.closing.is_set():
                    _raise_failure(started.instance_id, None)
                yield ": the agent is working\n\n"
        run, result = _raise_failure(started.instance_id, rested)
        text, finish = answer_of(result, question_of(run))
        if rest := streamed.rest_of(text):
            yield chunks.content(rest)
        yield chunks.delta({}, finish, metadata=metadata_of(result))
        if chat.include_usage:
            yield chunks.usage(result.usage)
        yield "data: [DONE]\n\n"
    except ChatError as exc:
        error = {"message": exc.message, "type": exc.type, "param": None, "code": exc.code}
        yield f"data: {json.dumps({'error': error})}\n\n"
    finally:
        if live is not None:
            ctx.live.unsubscribe(live)
        ctx.streams.leave()


async def _follow_live(ctx: ServeContext, started: Started, live: Subscription,
                       streamed: _Streamed) -> AsyncIterator[str]:
    """Yield the chunks of the instance's live events until its segment rests (or the server closes)."""
    run = started.run
    while not streamed.rested:
        batch = await live.get(KEEPALIVE)
        # The pieces that came meanwhile: one chunk each, written to the socket at once.
        if frames := [frame for event in batch for frame in streamed.frames(event)]:
            yield "".join(frames)
        if not batch:
            if ctx.streams.closing.is_set() or run is None or not run.running:
                return  # resting (its state event missed) or closing: the caller reads the result
            yield ": the agent is working\n\n"


def parse_request(body: Any, registered: Mapping[str, Any]) -> ChatRequest:  # noqa: C901 - one check per field
    """Check a chat completion request and return it as a :class:`ChatRequest`.

    :raises ChatError: 400 for a malformed request (naming the field), 404 for an unknown model.
    """
    if not isinstance(body, Mapping):
        raise ChatError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise ChatError(400, "'model' must be a string such as 'loopwright/NAME'", param="model")
    name = model.removeprefix(MODEL_PREFIX)
    if not model.startswith(MODEL_PREFIX) or name not in registered:
        known = ", ".join(MODEL_PREFIX + n for n in sorted(registered)) or "none"
        raise ChatError(404, f"the model {model!r} does not exist; models: {known}", param="model",
                        code="model_not_found")
    for key in _REFUSED_KEYS:
        if body.get(key):
            raise ChatError(400, f"'{key}' is not supported: the agent's own tools run inside the server, "
                                 "and client tools are not offered to it", param=key, code="unsupported_parameter")
    if body.get("n", 1) != 1:
        raise ChatError(400, "'n' must be 1: one request runs one agent instance", param="n",
                        code="unsupported_parameter")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ChatError(400, "'stream' must be true or false", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise ChatError(400, "'stream_options' must be an object", param="stream_options")
    inputs = body.get("inputs")
    if inputs is not None and not isinstance(inputs, Mapping):
        raise ChatError(400, "'inputs' must be an object of the definition's inputs", param="inputs")
    messages = _messages(body.get("messages"))
    last = messages[-1]
    if last.role != "user":
        raise ChatError(400, "the last message must be a 'user' message: it is the agent's task prompt",
                        param=f"messages[{len(messages) - 1}]")
    return ChatRequest(name=name, model=model, prompt=last.content or "", history=tuple(messages[:-1]),
                       inputs=inputs, stream=stream, include_usage=bool(options.get("include_usage")))


def _messages(raw: Any) -> list[Message]:
    """Return the request's messages as loopwright messages; only text is accepted."""
    if not isinstance(raw, list) or not raw:
        raise ChatError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for n, item in enumerate(raw):
        where = f"messages[{n}]"
        if not isinstance(item, Mapping):
            raise ChatError(400, f"{where} must be an object", param=where)
        role = _ROLES.get(str(item.get("role")))
        if role is None:
            raise ChatError(400, f"{where}: the role {item.get('role')!r} is not supported (system, developer, user "
                                 "and assistant are; tool results belong to the agent's own tools)", param=where)
        if item.get("tool_calls") or item.get("function_call"):
            raise ChatError(400, f"{where}: assistant tool calls are not accepted: the agent's tools run inside",
                            param=where)
        out.append(Message(role=role, content=_text(item.get("content"), where)))
    return out


def _text(content: Any, where: str) -> str:
    """Return a message's text: a string, or a list of ``text`` parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ChatError(400, f"{where}.content[{k}]: only text parts are supported", param=where)
            parts.append(part["text"])
        return "".join(parts)
    raise ChatError(400, f"{where}.content must be a string or a list of text parts", param=where)


def answer_of(result: AgentResult, question: str | None = None) -> tuple[str, str]:
    """Return the assistant's content and the finish reason for a resting instance.

    :param question: The question of an ``ask_user`` call the instance waits on: it is the content.
    """
    finish = _FINISH.get(result.stop_reason, "stop") if result.stop_reason else "stop"
    if result.state is State.WAITING_FOR_APPROVAL:
        return approval_message(result), FINISH_WAITING_FOR_APPROVAL
    if question:
        return question, "stop"
    return result.text or "", finish


def _undecided(result: AgentResult) -> list[PendingApproval]:
    return [p for p in result.pending_approvals if p.decision is None]


def approval_message(result: AgentResult) -> str:
    """Return the assistant message of a run that rests holding calls for approval.

    Each held call is named with its digest, which a decision on it must carry.
    """
    held = "; ".join(f"{p.tool} {json.dumps(dict(p.arguments), sort_keys=True)} (call {p.tool_call_id}, "
                     f"digest {approval_digest(p)})" for p in _undecided(result)) or "a tool call"
    return (f"The agent is waiting for approval before it goes on. Held: {held}. Approve or deny it through "
            f"the loopwright serve API (with the digest) or `loopwright approve {result.instance_id} --call "
            f"CALL_ID --digest DIGEST` (instance {result.instance_id}); the instance then continues.")


def metadata_of(result: AgentResult) -> dict[str, str]:
    """Return the response's ``metadata``: the instance, its state and stop reason (strings, as OpenAI's).

    With calls held: ``pending_tool_call_ids`` and ``pending_digests``, comma-separated, in the same order.
    """
    data = {"instance_id": result.instance_id, "state": result.state.value,
            "stop_reason": result.stop_reason.value if result.stop_reason else ""}
    if held := _undecided(result):
        data["pending_tool_call_ids"] = ",".join(p.tool_call_id for p in held)
        data["pending_digests"] = ",".join(approval_digest(p) for p in held)
    return data


def usage_json(usage: Usage) -> dict[str, Any]:
    """Return the instance's usage in OpenAI's ``usage`` shape."""
    body: dict[str, Any] = {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens,
                            "total_tokens": usage.total_tokens or usage.input_tokens + usage.output_tokens}
    if usage.cache_read_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": usage.cache_read_tokens}
    if usage.reasoning_tokens is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return body


def _raise_failure(instance_id: str, rested: tuple[AgentRun, AgentResult] | None) -> tuple[AgentRun, AgentResult]:
    """Return the rested run and result; raise ChatError for an error, a cancel, or a server closing first."""
    if rested is None:
        raise ChatError(503, f"the server is shutting down; the instance {instance_id} is kept, and "
                             "`loopwright resume` continues it", type="server_error", code="shutting_down",
                        instance_id=instance_id)
    result = rested[1]
    if result.state is State.ERROR:
        raise ChatError(500, f"the agent failed: {result.error}", type="server_error", code="agent_error",
                        instance_id=result.instance_id)
    if result.cancelled:
        raise ChatError(500, "the agent's run was cancelled", type="server_error", code="cancelled",
                        instance_id=result.instance_id)
    return rested

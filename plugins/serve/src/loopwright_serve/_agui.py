"""The AG-UI surface: ``POST /agui/<name>`` runs a registered definition and streams AG-UI events.

Built on the official ``ag-ui-protocol`` package (extra ``loopwright-serve[agui]``; without it
the server leaves this surface out with a log line): its ``RunAgentInput`` reads the request,
its event models and ``EventEncoder`` write the stream.

What maps to what (docs/protocols.md, "AG-UI"):

- **Thread.** ``threadId`` is the instance id. A thread that names no instance starts one of the
  definition (prompt: the last user message; ``forwardedProps.inputs``: its inputs); one that
  names an instance of it continues it (the last user message is sent to it). A thread naming an
  instance of another agent is refused.
- **Events.** ``RUN_STARTED``; a ``STATE_SNAPSHOT`` of the instance (id, state, pending
  approvals, question, usage) at the start and the end; each answer as ``TEXT_MESSAGE_START``,
  one ``TEXT_MESSAGE_CONTENT`` per piece the provider streams (runs started or steered here ask
  providers to stream), ``TEXT_MESSAGE_END``;
  each tool call as ``TOOL_CALL_START``, ``TOOL_CALL_ARGS`` (one per piece of its JSON arguments
  the provider streams, or the whole JSON), ``TOOL_CALL_END`` (once the answer holding it is
  saved) and its ``TOOL_CALL_RESULT``; then ``RUN_FINISHED`` or ``RUN_ERROR``.
- **Tool call ids.** A call the model named is ``t<TURN>-<the model's id>`` (known while it
  streams, unique per turn however the model repeats ids); one it did not name keeps the
  runtime's id. An interrupt's ``id`` is always the runtime's id (what ``resume`` and the serve
  API name), its ``toolCallId`` the call's AG-UI id.
- **A slow client.** The run is followed through the live channel's bounds (:mod:`._feed`),
  never an unbounded queue: a client that reads too slowly misses the rest of a turn's pieces,
  told by a ``CUSTOM`` event ``loopwright.gap`` (``{"turn"}``); once the turn's answer is saved,
  what its message and calls missed is sent as one more ``TEXT_MESSAGE_CONTENT`` (or
  ``TOOL_CALL_ARGS``) before their ends.
- **Interrupts.** A held call ends the run with ``RUN_FINISHED`` whose outcome is ``interrupt``:
  one interrupt per held call (id = tool call id, reason ``approval``, ``metadata``: the call's
  tool, arguments and digest), or one for an ``ask_user`` question (id = its call id, reason
  ``question``). The next run on the thread answers them in ``resume``: ``{"interruptId",
  "status": "resolved", "payload": {"approved": true, "digest": DIGEST}}`` approves,
  ``{"approved": false, "digest": DIGEST, "reason": ...}`` or ``"status": "cancelled"`` (with the
  digest in payload or metadata) denies, and ``{"answer": TEXT}`` answers a question. Deciding
  needs the ``approve`` scope; a decision without the digest is a 400, one with another call's a
  409 naming the current digest, and nothing runs.
- **Ends.** ``completed`` and ``waiting`` finish with outcome ``success`` (``result``: text and
  output); a cancelled instance with outcome ``cancelled``; ``error`` and limits with ``RUN_ERROR``
  (``code``: the stop reason).
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from ag_ui.core import (
    CustomEvent,
    Interrupt,
    ResumeEntry,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StateSnapshotEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)
from ag_ui.encoder import EventEncoder
from pydantic import ValidationError
from starlette.responses import StreamingResponse
from starlette.routing import Route

from loopwright import INSTANCE_ID_RULE, HeaderFields, State, StopReason, approval_digest
from loopwright.errors import ApprovalDigestMismatchError, ConfigError, LoopwrightError
from loopwright_serve._auth import Scope
from loopwright_serve._feed import Cursor, follow_segment, turn_of
from loopwright_serve._problems import ProblemError
from loopwright_serve._steer import GatedResponse, Session, valid_id
from loopwright_serve._surface import null_lifespan

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from ag_ui.core import BaseEvent
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from loopwright import AgentRun
    from loopwright_serve._context import ServeContext
    from loopwright_serve._deltas import LiveEvent, Subscription

__all__ = ["AguiAgent", "AguiSurface", "call_id", "call_names", "final_events", "interrupts_of", "state_of"]

_log = logging.getLogger("loopwright.serve")

#: The AG-UI protocol version this surface speaks.
PROTOCOL_VERSION = "1.0"
#: The name of the ``CUSTOM`` event that tells a slow client it missed the rest of a turn's pieces.
GAP_EVENT = "loopwright.gap"


def call_id(turn: int | None, wire_id: Any, runtime_id: Any) -> str:
    """Return a tool call's AG-UI id: ``t<TURN>-<WIRE>`` for a call the model named, else the runtime's id."""
    return f"t{turn or 0}-{wire_id}" if isinstance(wire_id, str) and wire_id else str(runtime_id)


def call_names(entries: list[dict[str, Any]]) -> dict[str, str]:
    """Return the AG-UI id of every tool call an entry log holds, by the runtime's id."""
    names: dict[str, str] = {}
    turn: int | None = 0
    for entry in entries:
        message = entry.get("m") if entry.get("t") == "msg" else None
        if not isinstance(message, dict):
            continue
        turn = turn_of(entry) or turn
        for call in message.get("toolCalls") or ():
            if isinstance(call, dict):
                names[str(call.get("id"))] = call_id(turn, call.get("wireId"), call.get("id"))
    return names


def _approval_schema(digest: str) -> dict[str, Any]:
    """Return the response schema of an approval interrupt: ``approved``, and the digest of the call shown."""
    return {"type": "object", "required": ["approved", "digest"],
            "properties": {"approved": {"type": "boolean"}, "digest": {"const": digest},
                           "reason": {"type": "string"}}}


_QUESTION_SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}


def _pending(header: HeaderFields) -> list[dict[str, Any]]:
    return [p for p in header.pending_approvals if p.get("decision") is None]


def state_of(header: HeaderFields) -> dict[str, Any]:
    """Return the ``STATE_SNAPSHOT`` of an instance: what a UI shows of it."""
    state: dict[str, Any] = {
        "instanceId": header.instance_id, "state": header.state, "stopReason": header.stop_reason,
        "pendingApprovals": [{"toolCallId": p.get("toolCallId"), "digest": approval_digest(p), "tool": p.get("tool"),
                              "arguments": p.get("arguments"), "reason": p.get("reason")} for p in _pending(header)],
        "usage": dict(header.usage or {}), "cost": header.cost,
    }
    if header.awaiting_answer:
        state["question"] = header.awaiting_answer.get("question")
    return state


def interrupts_of(header: HeaderFields, names: Mapping[str, str] | None = None) -> list[Interrupt]:
    """Return what the instance waits for, as AG-UI interrupts (none when it waits for nothing).

    :param names: The AG-UI ids of the calls (:func:`call_names`), by the runtime's id: each
        interrupt's ``toolCallId``; its ``id`` is the runtime's.
    """
    names = names or {}
    if header.state == State.WAITING_FOR_APPROVAL:
        return [Interrupt(id=str(p.get("toolCallId")), reason="approval",
                          tool_call_id=names.get(str(p.get("toolCallId")), str(p.get("toolCallId"))),
                          message=f"approve the call of {p.get('tool')}? ({p.get('reason')})",
                          response_schema=_approval_schema(approval_digest(p)),
                          metadata={"digest": approval_digest(p), "tool": p.get("tool"),
                                    "arguments": p.get("arguments")})
                for p in _pending(header)]
    awaiting = header.awaiting_answer
    if awaiting and header.state == State.WAITING:
        asked = str(header.asked_call_id)
        return [Interrupt(id=asked, reason="question", tool_call_id=names.get(asked, asked),
                          message=awaiting.get("question"),
                          response_schema=_QUESTION_SCHEMA)]
    return []


def _usage(header: HeaderFields) -> list[TokenUsage] | None:
    usage = header.usage or {}
    if not usage:
        return None
    model = str(header.served_by or header.model or "")
    provider, _, name = model.partition(":")
    return [TokenUsage(provider=provider or None, model=name or None, input_tokens=usage.get("inputTokens"),
                       output_tokens=usage.get("outputTokens"), total_tokens=usage.get("totalTokens"))]


def final_events(header: HeaderFields, thread_id: str, run_id: str,
                 names: Mapping[str, str] | None = None) -> list[BaseEvent]:
    """Return the events that end a run, from where the instance rests (``names`` as :func:`interrupts_of`)."""
    out: list[BaseEvent] = [StateSnapshotEvent(snapshot=state_of(header))]
    state, stop = header.state, header.stop_reason
    interrupts = interrupts_of(header, names)
    if state == State.ERROR:
        out.append(RunErrorEvent(message=f"the agent failed: {header.error}", code="error"))
    elif interrupts:
        out.append(RunFinishedEvent(thread_id=thread_id, run_id=run_id, usage=_usage(header),
                                    outcome=RunFinishedInterruptOutcome(interrupts=interrupts)))
    elif header.cancelled or stop == StopReason.CANCELLED:
        out.append(RunFinishedEvent(thread_id=thread_id, run_id=run_id, usage=_usage(header),
                                    outcome=RunFinishedCancelledOutcome()))
    elif state == State.STOPPED and stop != StopReason.COMPLETED:
        limit = f" ({header.limit})" if header.limit else ""
        out.append(RunErrorEvent(message=f"the agent stopped: {stop}{limit}", code=str(stop)))
    else:
        out.append(RunFinishedEvent(thread_id=thread_id, run_id=run_id, usage=_usage(header),
                                    result={"text": header.text, "output": header.output,
                                            "instanceId": header.instance_id},
                                    outcome=RunFinishedSuccessOutcome()))
    return out


def _last_user_text(body: RunAgentInput) -> str | None:
    for message in reversed(body.messages):
        if isinstance(message, UserMessage):
            content = message.content
            if isinstance(content, str):
                return content
            return "\n".join(str(getattr(part, "text", "")) for part in content if getattr(part, "text", None))
        if message.role == "assistant":
            return None
    return None


class AguiAgent:
    """One registered definition, served as an AG-UI agent at ``POST /agui/<name>``."""

    def __init__(self, ctx: ServeContext, key: str) -> None:
        """Read the definition registered as ``key``."""
        self.ctx = ctx
        self.session = Session(ctx.runtime, key)
        self.path = f"/agui/{key}"

    async def serve_run(self, request: Request) -> Response:
        """Authorize, read the ``RunAgentInput``, start or steer the instance, then stream the run's events."""
        await self.ctx.authorize(request, Scope.RUN)
        if not self.ctx.settings.run:
            raise _problem(501, "Not implemented", "server.run false (workers run the instances) is not available "
                                                   "to AG-UI yet")
        try:
            body = RunAgentInput.model_validate_json(await request.body())
        except ValidationError as exc:
            raise _problem(400, "invalid RunAgentInput", str(exc)) from exc
        gate = self.ctx.streams
        gate.enter()  # the run's event stream: counted against server.maxEventStreams
        # Subscribed before the instance starts or is steered, so no piece of the segment is missed.
        live = self.ctx.live.subscribe(body.thread_id, landed=True)
        try:
            response = await self._start(request, body, live)
        except BaseException:
            self.ctx.live.unsubscribe(live)
            gate.leave()
            raise
        return GatedResponse(response, gate, lambda: self.ctx.live.unsubscribe(live))  # type: ignore[return-value]

    async def _start(self, request: Request, body: RunAgentInput, live: Subscription) -> Response:
        """Start or steer the thread's instance; return the response that streams the run."""
        thread = body.thread_id
        if not valid_id(thread):
            raise _problem(400, "invalid threadId", f"threadId {thread!r} is used as the instance id: use "
                                                    f"{INSTANCE_ID_RULE}")
        header = await self.session.header(thread)
        if header is not None and not self.session.owns(header):
            raise _problem(409, "thread belongs to another agent",
                           f"thread {thread} is an instance that is not a thread of {self.session.key}")
        rt = self.session.runtime
        entries = await rt.store.read_entries(thread) if header is not None else []
        cursor, names = Cursor.at_end(entries), call_names(entries)
        del entries
        resumed: set[str] = set()
        answered: dict[str, str] = {}
        if header is None:
            if body.resume:
                raise _problem(409, "nothing to resume", f"thread {thread} has no run to resume")
            inputs = body.forwarded_props.get("inputs") if isinstance(body.forwarded_props, dict) else None
            try:
                run = await rt.start_agent(self.session.key, inputs=inputs if isinstance(inputs, dict) else None,
                                           prompt=_last_user_text(body), instance_id=thread, stream=True)
            except ConfigError as exc:
                raise _problem(400, "the agent cannot start", str(exc)) from exc
        else:
            run = await rt.get_agent(thread)
            run.stream = True  # the segment this run begins streams its answers (TEXT_MESSAGE_CONTENT per piece)
            if body.resume:
                resumed, answered = await self._resume(request, run, header, body.resume)
            else:
                text = _last_user_text(body)
                if text:
                    await run.message(text)
        events = self._stream(run, body, _Mapper(thread, names, resumed | set(answered)), answered,
                              live=live, cursor=cursor)
        encoder = EventEncoder(accept=request.headers.get("accept"))
        return StreamingResponse((encoder.encode(e) async for e in events), media_type=encoder.get_content_type(),
                                 headers={"X-Loopwright-Instance-Id": thread})

    async def _resume(self, request: Request, run: AgentRun, header: HeaderFields,
                      entries: list[ResumeEntry]) -> tuple[set[str], dict[str, str]]:
        """Apply the resume entries (decisions need the ``approve`` scope).

        :return: The calls decided, and the ``ask_user`` calls answered with their answers.
        """
        held = {str(p.get("toolCallId")) for p in _pending(header)}
        question = str(header.asked_call_id) if header.awaiting_answer else None
        unknown = [e.interrupt_id for e in entries if e.interrupt_id not in held and e.interrupt_id != question]
        if unknown:
            raise _problem(409, "no such interrupt", f"thread {run.instance_id} waits for no interrupt "
                                                     f"{', '.join(unknown)} (answered already, or never asked)")
        by = None
        if any(e.interrupt_id in held for e in entries):
            by = (await self.ctx.authorize(request, Scope.APPROVE)).source
        # Every decision's digest is read, and checked against the calls held now, before any
        # entry is applied: a resume with one blind or stale decision decides (and runs) nothing.
        digests = {e.interrupt_id: _digest_of(e, e.payload if isinstance(e.payload, dict) else {})
                   for e in entries if e.interrupt_id in held}
        shown = {str(p.get("toolCallId")): approval_digest(p) for p in _pending(header)}
        for call_id, digest in digests.items():
            if digest != shown[call_id]:
                raise ProblemError(409, "Not the pending call",
                                   f"thread {run.instance_id}: the call pending as {call_id} has digest "
                                   f"{shown[call_id]}, not the digest {digest} decided on; nothing was decided",
                                   instanceId=run.instance_id, toolCallId=call_id, currentDigest=shown[call_id])
        decided: set[str] = set()
        answered: dict[str, str] = {}
        try:
            for entry in entries:
                payload = entry.payload if isinstance(entry.payload, dict) else {}
                if entry.interrupt_id in held:
                    digest = digests[entry.interrupt_id]
                    if entry.status == "resolved" and payload.get("approved") is True:
                        await run.approve(entry.interrupt_id, by=by, digest=digest)
                    else:
                        reason = payload.get("reason") if isinstance(payload.get("reason"), str) else None
                        await run.deny(entry.interrupt_id, reason or "denied through AG-UI", by=by, digest=digest)
                    decided.add(entry.interrupt_id)
                else:
                    answer = payload.get("answer") if payload else entry.payload
                    text = (answer if isinstance(answer, str) else json.dumps(answer)) \
                        if entry.status == "resolved" else "(the user declined to answer)"
                    await run.message(text)
                    answered[entry.interrupt_id] = text
        except ApprovalDigestMismatchError as exc:
            raise ProblemError(409, "Not the pending call", str(exc), instanceId=exc.instance_id,
                               toolCallId=exc.tool_call_id, currentDigest=exc.current_digest) from exc
        except LoopwrightError as exc:
            raise _problem(409, "cannot resume", str(exc)) from exc
        return decided, answered

    async def _stream(self, run: AgentRun, body: RunAgentInput, mapper: _Mapper, answered: Mapping[str, str], *,
                      live: Subscription, cursor: Cursor) -> AsyncIterator[BaseEvent]:
        """Yield the run's AG-UI events, from ``RUN_STARTED`` to ``RUN_FINISHED`` or ``RUN_ERROR``.

        The segment is followed through ``live`` and the entry log from ``cursor``
        (:func:`~loopwright_serve._feed.follow_segment`): bounded, however slowly the client reads.
        An ``ask_user`` answered by this run's ``resume`` gets its ``TOOL_CALL_RESULT`` first: the
        answer is that call's result.
        """
        store = self.session.runtime.store
        thread, run_id = body.thread_id, body.run_id
        yield RunStartedEvent(thread_id=thread, run_id=run_id, protocol_version=PROTOCOL_VERSION, input=body)
        try:
            yield StateSnapshotEvent(snapshot=state_of(HeaderFields(await store.read_header(thread))))
            for asked, text in answered.items():
                yield mapper.result(asked, text)
            closing = self.ctx.streams.closing
            async for batch in follow_segment(run, live, cursor, closing):
                for event in batch:
                    for out in mapper.map(event):
                        yield out
            if closing.is_set() and run.running:
                yield RunErrorEvent(message="the server is shutting down; the instance is kept: run the thread "
                                            "again to go on", code="shutting_down")
                return
            await run.wait()
            header = HeaderFields(await store.read_header(thread))
            for out in [*mapper.close(), *mapper.held_calls(header),
                        *final_events(header, thread, run_id, mapper.names)]:
                yield out
        except Exception as exc:  # noqa: BLE001 - the stream is under way: any failure becomes its last event
            _log.exception("AG-UI run of %s failed", thread)
            yield RunErrorEvent(message=f"{type(exc).__name__}: {exc}", code="server_error")
        finally:
            self.ctx.live.unsubscribe(live)


class _Mapper:
    """Turns one segment's events (:mod:`._feed`) into AG-UI events, keeping messages and calls well nested.

    Streamed pieces open a message (or a call) at once; the saved answer closes it, adding what
    the client missed (a gap's pieces, or arguments the provider did not stream) when what it
    got is the start of the whole (else the ``CUSTOM`` gap event is all it has).
    """

    def __init__(self, instance_id: str, names: dict[str, str], resumed: set[str]) -> None:
        self.iid = instance_id
        #: The AG-UI id of each tool call, by the runtime's id (:func:`call_names`).
        self.names = names
        #: Calls announced to the client (in this run, or held in an earlier one), by AG-UI id.
        self.announced = {names.get(c, c) for c in resumed}
        #: Calls whose result was sent in this run (AG-UI ids).
        self.answered: set[str] = set()
        self.open_message: str | None = None
        self.open_turn: int | None = None
        self.open_text = ""
        self.last_message: dict[int | None, str] = {}
        #: Turns whose text streamed (their saved text is not sent again), and turns that lost pieces.
        self.streamed: set[int | None] = set()
        self.lost: set[int | None] = set()
        self.resets: dict[int | None, int] = {}
        #: Calls streaming (started, not ended): their arguments sent so far, and their turns.
        self.streaming: dict[str, tuple[int | None, str]] = {}

    def _message_id(self, turn: int | None) -> str:
        again = self.resets.get(turn, 0)
        return f"{self.iid}-t{turn}-text" + (f"-{again}" if again else "")

    def map(self, event: LiveEvent) -> list[BaseEvent]:  # noqa: PLR0911 - one answer per kind
        """Return the AG-UI events for ``event``."""
        data, turn, kind = event.data, event.turn, event.kind
        if kind == "text_delta":
            return [] if turn in self.lost else self._delta(turn, str(data.get("delta") or ""))
        if kind == "tool_call_start":
            return [*self.close_text(), *self._call_start(call_id(turn, data.get("id"), data.get("id")),
                                                          str(data.get("name")), turn)]
        if kind == "tool_call_delta":
            return [] if turn in self.lost else self._call_args(call_id(turn, data.get("id"), data.get("id")),
                                                               str(data.get("delta") or ""))
        if kind == "gap":
            self.lost.add(turn)
            return [CustomEvent(name=GAP_EVENT, value={"turn": turn})]
        if kind == "stream_reset":
            return self._reset(turn)
        if kind == "text":
            return self._whole_text(turn, str(data.get("text") or ""))
        if kind == "tool_call":
            name = self.names[str(data.get("id"))] = call_id(turn, data.get("wireId"), data.get("id"))
            return [*self.close_text(), *self._call(name, str(data.get("name")), data.get("arguments"), turn)]
        if kind == "tool_result":
            name = self.names.get(str(data.get("id")), str(data.get("id")))
            return [*self.close_text(), *([] if name in self.answered else [self.result(name, data.get("content"))])]
        return []

    def result(self, call: str, content: Any) -> ToolCallResultEvent:
        """Return the ``TOOL_CALL_RESULT`` of a call (once: a later result of the same call is left out)."""
        name = self.names.get(call, call)
        self.answered.add(name)
        return ToolCallResultEvent(message_id=f"{self.iid}-{name}-result", tool_call_id=name, role="tool",
                                   content=content if isinstance(content, str) else json.dumps(content, default=str))

    def _delta(self, turn: int | None, delta: str) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        if self.open_message is not None and self.open_turn != turn:
            out += self.close_text()
        if self.open_message is None:
            self.open_message = self.last_message[turn] = self._message_id(turn)
            self.open_turn, self.open_text = turn, ""
            self.streamed.add(turn)
            out.append(TextMessageStartEvent(message_id=self.open_message, role="assistant"))
        self.open_text += delta
        out.append(TextMessageContentEvent(message_id=self.open_message, delta=delta))
        return out

    def _whole_text(self, turn: int | None, text: str) -> list[BaseEvent]:
        if self.open_message is not None and self.open_turn == turn:  # streamed: send only what was missed
            out: list[BaseEvent] = []
            if text.startswith(self.open_text) and len(text) > len(self.open_text):
                out.append(TextMessageContentEvent(message_id=self.open_message, delta=text[len(self.open_text):]))
            return [*out, *self.close_text()]
        out = self.close_text()
        if not text or turn in self.streamed:
            return out
        message_id = self._message_id(turn)
        self.last_message[turn] = message_id
        return [*out, TextMessageStartEvent(message_id=message_id, role="assistant"),
                TextMessageContentEvent(message_id=message_id, delta=text), TextMessageEndEvent(message_id=message_id)]

    def _call_start(self, name: str, tool: str, turn: int | None) -> list[BaseEvent]:
        if name in self.announced:
            return []
        self.announced.add(name)
        self.streaming[name] = (turn, "")
        return [ToolCallStartEvent(tool_call_id=name, tool_call_name=tool,
                                   parent_message_id=self.last_message.get(turn))]

    def _call_args(self, name: str, delta: str) -> list[BaseEvent]:
        if name not in self.streaming or not delta:
            return []
        turn, sent = self.streaming[name]
        self.streaming[name] = (turn, sent + delta)
        return [ToolCallArgsEvent(tool_call_id=name, delta=delta)]

    def _call(self, name: str, tool: str, arguments: Any, turn: int | None) -> list[BaseEvent]:
        args = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})
        if name in self.streaming:  # streamed: what the client missed (a gap, or no pieces), then its end
            _turn, sent = self.streaming.pop(name)
            rest = [ToolCallArgsEvent(tool_call_id=name, delta=args[len(sent):])] \
                if args.startswith(sent) and len(args) > len(sent) else []
            return [*rest, ToolCallEndEvent(tool_call_id=name)]
        if name in self.announced:
            return []
        self.announced.add(name)
        return [ToolCallStartEvent(tool_call_id=name, tool_call_name=tool,
                                   parent_message_id=self.last_message.get(turn)),
                ToolCallArgsEvent(tool_call_id=name, delta=args), ToolCallEndEvent(tool_call_id=name)]

    def _reset(self, turn: int | None) -> list[BaseEvent]:
        """Start the turn's streamed answer over: end what it opened; its new pieces open a new message."""
        out = self.close_text()
        for name, (call_turn, _sent) in list(self.streaming.items()):
            if call_turn == turn:
                del self.streaming[name]
                out.append(ToolCallEndEvent(tool_call_id=name))
        self.lost.discard(turn)
        self.streamed.discard(turn)
        self.resets[turn] = self.resets.get(turn, 0) + 1
        return out

    def held_calls(self, header: HeaderFields) -> list[BaseEvent]:
        """Announce the calls the instance holds for approval (start, arguments, end) not announced yet."""
        out: list[BaseEvent] = []
        for p in _pending(header):
            runtime_id = str(p.get("toolCallId"))
            out += self._call(self.names.get(runtime_id, runtime_id), str(p.get("tool")), p.get("arguments"), None)
        return out

    def close_text(self) -> list[BaseEvent]:
        """End a streamed message still open."""
        if self.open_message is None:
            return []
        message_id, self.open_message, self.open_turn = self.open_message, None, None
        return [TextMessageEndEvent(message_id=message_id)]

    def close(self) -> list[BaseEvent]:
        """End a streamed message and every streamed call still open (the segment is over)."""
        ends: list[BaseEvent] = [ToolCallEndEvent(tool_call_id=name) for name in self.streaming]
        self.streaming.clear()
        return [*self.close_text(), *ends]


def _digest_of(entry: ResumeEntry, payload: Mapping[str, Any]) -> str:
    """Return the digest a decision carries (its payload's ``digest``, else its metadata's).

    :raises ProblemError: 400: the entry carries none; a decision names the call it saw.
    """
    metadata = entry.metadata if isinstance(entry.metadata, dict) else {}
    digest = payload.get("digest", metadata.get("digest"))
    if not isinstance(digest, str) or not digest:
        raise _problem(400, "No digest", f"the resume of interrupt {entry.interrupt_id} decides a held call: give "
                                         "the digest of the call shown (the interrupt's metadata.digest) as "
                                         "payload.digest")
    return digest


def _problem(status: int, title: str, detail: str) -> ProblemError:
    return ProblemError(status, title, detail)


class AguiSurface:
    """Mounts ``POST /agui/<name>`` for each registered definition."""

    name = "agui"

    def routes(self, ctx: ServeContext) -> list[BaseRoute]:
        """Return one route per registered definition."""
        agents = [AguiAgent(ctx, key) for key in sorted(ctx.runtime.assembly.agent_definitions)]
        return [Route(agent.path, agent.serve_run, methods=["POST"]) for agent in agents]

    def lifespan(self, ctx: ServeContext) -> contextlib.AbstractAsyncContextManager[None]:  # noqa: ARG002
        """Hold nothing open: each run's stream ends with its request (or when the server closes)."""
        return null_lifespan()

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
  each tool call as ``TOOL_CALL_START``, ``TOOL_CALL_ARGS`` (the arguments as JSON),
  ``TOOL_CALL_END`` and its ``TOOL_CALL_RESULT``; then ``RUN_FINISHED`` or ``RUN_ERROR``.
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
from loopwright_serve._problems import ProblemError
from loopwright_serve._steer import GatedResponse, Session, segment_events, valid_id
from loopwright_serve._surface import null_lifespan

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from ag_ui.core import BaseEvent
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from loopwright import AgentRun, Event
    from loopwright_serve._context import ServeContext

__all__ = ["AguiAgent", "AguiSurface", "final_events", "interrupts_of", "state_of"]

_log = logging.getLogger("loopwright.serve")

#: The AG-UI protocol version this surface speaks.
PROTOCOL_VERSION = "1.0"


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


def interrupts_of(header: HeaderFields) -> list[Interrupt]:
    """Return what the instance waits for, as AG-UI interrupts (none when it waits for nothing)."""
    if header.state == State.WAITING_FOR_APPROVAL:
        return [Interrupt(id=str(p.get("toolCallId")), reason="approval", tool_call_id=str(p.get("toolCallId")),
                          message=f"approve the call of {p.get('tool')}? ({p.get('reason')})",
                          response_schema=_approval_schema(approval_digest(p)),
                          metadata={"digest": approval_digest(p), "tool": p.get("tool"),
                                    "arguments": p.get("arguments")})
                for p in _pending(header)]
    awaiting = header.awaiting_answer
    if awaiting and header.state == State.WAITING:
        call_id = str(header.asked_call_id)
        return [Interrupt(id=call_id, reason="question", tool_call_id=call_id, message=awaiting.get("question"),
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


def final_events(header: HeaderFields, thread_id: str, run_id: str) -> list[BaseEvent]:
    """Return the events that end a run, from where the instance rests."""
    out: list[BaseEvent] = [StateSnapshotEvent(snapshot=state_of(header))]
    state, stop = header.state, header.stop_reason
    interrupts = interrupts_of(header)
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
        try:
            return GatedResponse(await self._start(request, body), gate)  # type: ignore[return-value] - ASGI
        except BaseException:
            gate.leave()
            raise

    async def _start(self, request: Request, body: RunAgentInput) -> Response:
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
        events = self._stream(run, header, body, resumed, answered)
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

    async def _stream(self, run: AgentRun, before: HeaderFields | None, body: RunAgentInput,
                      resumed: set[str], answered: Mapping[str, str]) -> AsyncIterator[BaseEvent]:
        """Yield the run's AG-UI events, from ``RUN_STARTED`` to ``RUN_FINISHED`` or ``RUN_ERROR``.

        An ``ask_user`` answered by this run's ``resume`` gets its ``TOOL_CALL_RESULT`` first: the
        answer is that call's result.
        """
        store = self.session.runtime.store
        thread, run_id = body.thread_id, body.run_id
        yield RunStartedEvent(thread_id=thread, run_id=run_id, protocol_version=PROTOCOL_VERSION, input=body)
        try:
            yield StateSnapshotEvent(snapshot=state_of(HeaderFields(await store.read_header(thread))))
            mapper = _Mapper(thread, resumed | set(answered))
            for call_id, text in answered.items():
                yield mapper.result(call_id, text)
            closing = self.ctx.streams.closing
            async for event in segment_events(run, before):
                if closing.is_set():
                    yield RunErrorEvent(message="the server is shutting down; the instance is kept: run the thread "
                                                "again to go on", code="shutting_down")
                    return
                for out in mapper.map(event):
                    yield out
            await run.wait()
            header = HeaderFields(await store.read_header(thread))
            for out in [*mapper.close(), *mapper.held_calls(header), *final_events(header, thread, run_id)]:
                yield out
        except Exception as exc:  # noqa: BLE001 - the stream is under way: any failure becomes its last event
            _log.exception("AG-UI run of %s failed", thread)
            yield RunErrorEvent(message=f"{type(exc).__name__}: {exc}", code="server_error")


class _Mapper:
    """Turns one segment's loopwright events into AG-UI events, keeping messages and calls well nested."""

    def __init__(self, instance_id: str, resumed: set[str]) -> None:
        self.iid = instance_id
        #: Calls already announced to the client (in this run, or held in an earlier one).
        self.announced = set(resumed)
        #: Calls whose result was sent in this run.
        self.answered: set[str] = set()
        self.open_message: str | None = None
        self.last_message: dict[int | None, str] = {}
        #: Calls held for approval in this segment, with their turns.
        self.held_turns: dict[str, int | None] = {}

    def _message_id(self, turn: int | None) -> str:
        return f"{self.iid}-t{turn}-text"

    def map(self, event: Event) -> list[BaseEvent]:
        """Return the AG-UI events for ``event``."""
        data, turn = event.data, event.turn
        if event.kind == "text_delta":
            return self._delta(turn, str(data.get("delta") or ""))
        if event.kind == "text":
            return self._whole_text(turn, str(data.get("text") or ""))
        if event.kind == "tool_call":
            return [*self.close(), *self._call(str(data.get("id")), str(data.get("name")), data.get("arguments"), turn)]
        if event.kind == "approval":  # announced with its arguments once the hold is saved (held_calls)
            self.held_turns[str(data.get("toolCallId"))] = turn
            return self.close()
        if event.kind == "tool_result":
            call_id = str(data.get("id"))
            return [*self.close(), *([] if call_id in self.answered else [self.result(call_id, data.get("content"))])]
        return []

    def result(self, call_id: str, content: Any) -> ToolCallResultEvent:
        """Return the ``TOOL_CALL_RESULT`` of a call (once: a later result of the same call is left out)."""
        self.answered.add(call_id)
        return ToolCallResultEvent(message_id=f"{self.iid}-{call_id}-result", tool_call_id=call_id, role="tool",
                                   content=content if isinstance(content, str) else json.dumps(content, default=str))

    def _delta(self, turn: int | None, delta: str) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        if self.open_message is None:
            self.open_message = self.last_message[turn] = self._message_id(turn)
            out.append(TextMessageStartEvent(message_id=self.open_message, role="assistant"))
        out.append(TextMessageContentEvent(message_id=self.open_message, delta=delta))
        return out

    def _whole_text(self, turn: int | None, text: str) -> list[BaseEvent]:
        if self.open_message is not None:  # streamed: the pieces are out already
            return self.close()
        if not text:
            return []
        message_id = self._message_id(turn)
        self.last_message[turn] = message_id
        return [TextMessageStartEvent(message_id=message_id, role="assistant"),
                TextMessageContentEvent(message_id=message_id, delta=text), TextMessageEndEvent(message_id=message_id)]

    def _call(self, call_id: str, name: str, arguments: Any, turn: int | None) -> list[BaseEvent]:
        if call_id in self.announced:
            return []
        self.announced.add(call_id)
        args = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})
        return [ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name,
                                   parent_message_id=self.last_message.get(turn)),
                ToolCallArgsEvent(tool_call_id=call_id, delta=args), ToolCallEndEvent(tool_call_id=call_id)]

    def held_calls(self, header: HeaderFields) -> list[BaseEvent]:
        """Announce the calls the instance holds for approval (start, arguments, end), once each."""
        return [event for p in _pending(header)
                for event in self._call(str(p.get("toolCallId")), str(p.get("tool")), p.get("arguments"),
                                        self.held_turns.get(str(p.get("toolCallId"))))]

    def close(self) -> list[BaseEvent]:
        """End a streamed message still open."""
        if self.open_message is None:
            return []
        message_id, self.open_message = self.open_message, None
        return [TextMessageEndEvent(message_id=message_id)]


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

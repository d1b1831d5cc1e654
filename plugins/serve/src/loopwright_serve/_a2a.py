"""The A2A surface: every registered definition as an A2A (protocol v1.0) agent, on ``a2a-sdk``.

Each name of the assembly's ``agentDefinitions`` gets an agent card at
``/a2a/<name>/.well-known/agent-card.json`` and a JSON-RPC endpoint at ``/a2a/<name>``, served by
the official ``a2a-sdk``'s request handler (extra ``loopwright-serve[a2a]``; without it the
server leaves this surface out with a log line saying what to install).

What maps to what (docs/protocols.md, "A2A"):

- **Agent card.** One per registered definition: its name, description, one skill, the JSON-RPC
  interface at ``/a2a/<name>``, streaming, and a Bearer security scheme (the serve tokens).
- **Task.** A task is an instance of that definition. The task id *is* the instance id, and so is
  the context id; a message naming a context (or a task) continues that instance. The
  :class:`InstanceTaskStore` is a view of the instance, read from loopwright's store every time,
  so a task survives a restart of the server and reflects what the serve API did to it.
- **States.** ``running`` → working; an open ``ask_user`` question (``waiting``) and a held call
  (``waiting_for_approval``) → input-required; an answer with nothing open (``waiting``) and
  ``completed`` → completed (a completed task is final, as A2A says); cancelled → canceled;
  ``error`` and the other stop reasons (limits) → failed. A start refused for bad inputs → rejected.
- **Messages.** The text parts of the first message are the task prompt (``metadata.inputs``
  fills the definition's inputs). A follow-up's text is a message to the instance (the answer
  to an ``ask_user``). A data part ``{"approve": CALL_ID, "digest": DIGEST}`` or ``{"deny": CALL_ID,
  "digest": DIGEST, "reason": ...}`` decides a held call, and needs the ``approve`` scope. DIGEST is
  the one shown with the call in ``pendingApprovals``; a decision without it, or with another
  call's, is an invalid-params error (its data names the current digest) and nothing runs.
- **Streaming.** The instance's events become task updates: each answer is the ``answer``
  artifact (each piece the provider streams appended while the task works, then the whole
  text), tool calls and results are working status updates whose message holds a data part,
  a call held for approval an ``approvalRequired`` one, and the segment's end is the final status.
  The segment is followed through the live channel's bounds (:mod:`._feed`), never an unbounded
  queue: when a client reads so slowly that a2a-sdk's queue is full, the pieces of the turn it
  cannot take are dropped, a working status update with the data part ``{"gap": {"turn"}}``
  says so, and the whole text (the artifact replaced, ``append: false``) follows once the
  turn's answer is saved. An answer given through ``task_complete`` is the
  ``answer`` artifact too, streamed or not.
- **Scopes.** ``run`` sends messages and cancels, ``read`` gets, lists and subscribes, and
  ``approve`` decides held calls.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from a2a.helpers.proto_helpers import get_data_parts, get_text_parts, new_data_part, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext, SimpleRequestContextBuilder
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.tasks import TaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    HTTPAuthSecurityScheme,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    StringList,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_CURRENT, TransportProtocol
from a2a.utils.errors import InvalidParamsError, InvalidRequestError
from google.protobuf.json_format import MessageToDict, ParseDict
from starlette.responses import JSONResponse
from starlette.routing import Route

from loopwright import INSTANCE_ID_RULE, HeaderFields, State, StopReason, approval_digest
from loopwright.errors import ApprovalDigestMismatchError, ConfigError, LoopwrightError
from loopwright_serve._auth import Principal, Scope
from loopwright_serve._feed import Cursor, follow_segment
from loopwright_serve._problems import ProblemError
from loopwright_serve._schema import unpaired_surrogate
from loopwright_serve._steer import GatedResponse, Session, new_id, valid_id

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from a2a.server.context import ServerCallContext
    from a2a.server.events import EventQueue
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from loopwright_serve._context import ServeContext
    from loopwright_serve._deltas import LiveEvent, Subscription

__all__ = ["A2AAgent", "A2ASurface", "InstanceTaskStore", "LoopwrightExecutor", "decisions_of", "task_view"]

_log = logging.getLogger("loopwright.serve")

#: The scope each JSON-RPC method needs; a method not listed needs ``run``.
_METHOD_SCOPES = {
    "SendMessage": Scope.RUN, "SendStreamingMessage": Scope.RUN, "CancelTask": Scope.RUN,
    "GetTask": Scope.READ, "ListTasks": Scope.READ, "SubscribeToTask": Scope.READ,
    "GetExtendedAgentCard": Scope.READ,
}
#: The methods that start or steer an instance.
_STEERING = frozenset({"SendMessage", "SendStreamingMessage", "CancelTask"})
#: The methods answered with an event stream.
_STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask"})
#: Where the endpoint leaves the scopes it checked, for the call context.
_SCOPES_KEY = "loopwright_a2a_scopes"
#: Where the endpoint leaves who asks (``token:NAME``), recorded with the decisions they make.
_BY_KEY = "loopwright_a2a_by"
#: The artifact that holds the instance's latest answer.
ANSWER = "answer"
_LIST_PAGE = 50
#: Seconds a2a-sdk keeps an idle input-required task in memory; a later message reads it from the store.
_IDLE_RELEASE = 60.0


def decisions_of(message: Message | None) -> list[tuple[str, str, str, str | None]]:
    """Return the decisions a message carries: ``(decision, call_id, digest, reason)``, in order.

    A decision is a data part ``{"approve": CALL_ID, "digest": DIGEST}`` or ``{"deny": CALL_ID,
    "digest": DIGEST, "reason": TEXT}``, where DIGEST is the one shown with the held call in
    ``pendingApprovals``: the call is decided only if it is still exactly that call.

    :raises InvalidParamsError: A decision part is malformed (a call id that is not a string, or
        no digest).
    """
    if message is None:
        return []
    out: list[tuple[str, str, str, str | None]] = []
    for data in get_data_parts(message.parts):
        if not isinstance(data, Mapping):
            continue
        for key, decision in (("approve", "approved"), ("deny", "denied")):
            if key not in data:
                continue
            call_id, digest = data[key], data.get("digest")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidParamsError(message=f'"{key}" names the held call to decide: give its call id as a string')
            if not isinstance(digest, str) or not digest:
                raise InvalidParamsError(message=f'a decision carries the digest of the call it decides: give "digest" '
                                                 f'as shown with call {call_id!r} in pendingApprovals')
            reason = data.get("reason")
            out.append((decision, call_id, digest, reason if isinstance(reason, str) else None))
    return out


def _asks_decision(message: Message | None) -> bool:
    """Whether ``message`` has a decision part (well formed or not): it needs the ``approve`` scope."""
    return message is not None and any(isinstance(d, Mapping) and ("approve" in d or "deny" in d)
                                       for d in get_data_parts(message.parts))


def _other_data(message: Message) -> list[Any]:
    """Return the data parts that are not decisions (sent to the agent as JSON text)."""
    return [d for d in get_data_parts(message.parts)
            if not (isinstance(d, Mapping) and ("approve" in d or "deny" in d))]


def _message_text(message: Message | None) -> str:
    if message is None:
        return ""
    pieces = list(get_text_parts(message.parts))
    pieces += [json.dumps(d, sort_keys=True) for d in _other_data(message)]
    return "\n".join(p for p in pieces if p)


def _state_of(header: HeaderFields) -> TaskState:
    """Return the A2A state of an instance (issue 27): only what it waits on from someone is input-required.

    An open ``ask_user`` question or a held call is ``input-required``; an instance that answered
    and rests ``waiting`` with nothing open is ``completed``, as one that ended with
    ``task_complete`` is.
    """
    state, stop = header.state, header.stop_reason
    if state == State.RUNNING:
        return TaskState.TASK_STATE_WORKING
    if state == State.WAITING_FOR_APPROVAL or (state == State.WAITING and header.awaiting_answer):
        return TaskState.TASK_STATE_INPUT_REQUIRED
    if state == State.WAITING or (state == State.STOPPED and stop == StopReason.COMPLETED):
        return TaskState.TASK_STATE_COMPLETED
    if header.cancelled or stop == StopReason.CANCELLED:
        return TaskState.TASK_STATE_CANCELED
    return TaskState.TASK_STATE_FAILED


def _undecided(header: HeaderFields) -> list[dict[str, Any]]:
    """Return the calls the instance holds for approval that are not decided yet."""
    return [p for p in header.pending_approvals if p.get("decision") is None]


def _details(header: HeaderFields) -> dict[str, Any]:
    """Return the ``loopwright`` data of a status message: what a client needs to answer the task."""
    pending = [{"toolCallId": p.get("toolCallId"), "digest": approval_digest(p), "tool": p.get("tool"),
                "arguments": p.get("arguments"), "reason": p.get("reason")}
               for p in _undecided(header)]
    data: dict[str, Any] = {"instanceId": header.instance_id, "state": header.state,
                            "stopReason": header.stop_reason}
    if pending:
        data["pendingApprovals"] = pending
    if header.awaiting_answer:
        data["question"] = header.awaiting_answer.get("question")
    if header.error:
        data["error"] = header.error
    if header.limit:
        data["limit"] = header.limit
    return {"loopwright": data}


def _status_text(header: HeaderFields) -> str:
    pending = _undecided(header)
    if header.state == State.WAITING_FOR_APPROVAL and pending:
        calls = ", ".join(f"{p.get('tool')} (call {p.get('toolCallId')}, digest {approval_digest(p)})"
                          for p in pending)
        return (f"waiting for approval of {calls}: send a data part "
                '{"approve": CALL_ID, "digest": DIGEST} or {"deny": CALL_ID, "digest": DIGEST, "reason": "..."}')
    if header.awaiting_answer:
        return str(header.awaiting_answer.get("question") or "")
    if header.state == State.ERROR:
        return f"error: {header.error}"
    if header.state == State.STOPPED and header.stop_reason not in (StopReason.COMPLETED, StopReason.CANCELLED):
        limit = f" ({header.limit})" if header.limit else ""
        return f"stopped: {header.stop_reason}{limit}"
    return str(header.text or "")


def status_of(header: HeaderFields) -> TaskStatus:
    """Return the A2A status of an instance, from its saved header."""
    iid = str(header.instance_id)
    parts = [new_data_part(_details(header))]
    text = _status_text(header)
    if text:
        parts.insert(0, new_text_part(text))
    message = Message(message_id=f"{iid}-{header.updated_at}", role=Role.ROLE_AGENT, task_id=iid,
                      context_id=iid, parts=parts)
    status = TaskStatus(state=_state_of(header), message=message)
    status.timestamp.GetCurrentTime()
    return status


def _answer_artifact(header: HeaderFields) -> Artifact | None:
    parts = []
    if header.text:
        parts.append(new_text_part(str(header.text)))
    if header.output is not None:
        parts.append(new_data_part(header.output))
    if not parts:
        return None
    return Artifact(artifact_id=ANSWER, name=ANSWER, description="the agent's latest answer", parts=parts)


def task_view(header: HeaderFields) -> Task:
    """Return the A2A task that an instance is, from its saved header (id = context id = instance id)."""
    iid = str(header.instance_id)
    task = Task(id=iid, context_id=iid, status=status_of(header))
    artifact = _answer_artifact(header) if header.state != State.RUNNING else None
    if artifact is not None:
        task.artifacts.append(artifact)
    task.metadata.update({"loopwright": {"instanceId": iid, "name": header.name,
                                         "usage": dict(header.usage or {}), "cost": header.cost}})
    return task


class A2AAgent:
    """One registered definition, served over A2A: its card, its task store and its request handler."""

    def __init__(self, ctx: ServeContext, key: str) -> None:
        """Build the pieces for the definition registered as ``key`` (read once, here)."""
        self.ctx = ctx
        self.key = key
        self.session = Session(ctx.runtime, key)
        self.description = self.session.description
        self.path = f"/a2a/{key}"
        self.store = InstanceTaskStore(self)
        self.handler = DefaultRequestHandler(
            agent_executor=LoopwrightExecutor(self), task_store=self.store, agent_card=self.card("http://localhost"),
            request_context_builder=_ContextBuilder(self), interrupted_task_timeout=_IDLE_RELEASE)
        self.dispatcher = JsonRpcDispatcher(request_handler=self.handler, context_builder=_CallContextBuilder())

    @property
    def runtime(self) -> Any:
        """The serve context's open runtime."""
        return self.ctx.runtime

    def card(self, base_url: str) -> AgentCard:
        """Return the agent card, its interface URL under ``base_url``."""
        return AgentCard(
            name=self.key, description=self.description, version="1.0.0",
            supported_interfaces=[AgentInterface(url=base_url.rstrip("/") + self.path,
                                                 protocol_binding=TransportProtocol.JSONRPC.value,
                                                 protocol_version=PROTOCOL_VERSION_CURRENT)],
            capabilities=AgentCapabilities(streaming=True, push_notifications=False),
            default_input_modes=["text/plain", "application/json"],
            default_output_modes=["text/plain", "application/json"],
            skills=[AgentSkill(id=self.key, name=self.key, description=self.description, tags=["loopwright"])],
            security_schemes={"bearer": SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
                scheme="Bearer", description="a token of `loopwright serve` (server.tokens): scope `run` to send "
                "messages, `read` to get tasks, `approve` to decide held calls"))},
            security_requirements=[SecurityRequirement(schemes={"bearer": StringList()})],
        )

    def owns(self, header: HeaderFields) -> bool:
        """Whether an instance is a task of this agent: a top-level instance of its definition."""
        return self.session.owns(header)

    async def read(self, instance_id: str) -> HeaderFields | None:
        """Return the header of a task of this agent, or ``None`` (none, or not this agent's)."""
        return await self.session.read(instance_id)

    # -- HTTP -------------------------------------------------------------------------------

    async def serve_card(self, request: Request) -> Response:
        """``GET /a2a/<name>/.well-known/agent-card.json``: the agent card.

        With ``server.tokens`` it is public (no token needed: it is how a client discovers the
        agent and the scheme to authenticate with); without tokens it answers the requests the
        server answers at all (loopback, a loopback ``Host``, no foreign ``Origin``).
        """
        if not self.ctx.settings.tokens:
            await self.ctx.authorize(request, Scope.READ)
        return JSONResponse(agent_card_to_dict(self.card(str(request.base_url))))

    async def serve_rpc(self, request: Request) -> Response:
        """``POST /a2a/<name>``: check the token's scopes for the method, then hand over to a2a-sdk."""
        scopes, method, principal, unreadable = await self._authorize(request)
        if unreadable:  # a2a-sdk would answer it as its own failure (-32603, or a 500 echoing the id)
            error = {"code": -32700, "message": f"the request body is not JSON: {unreadable}"}  # parse error
            return JSONResponse({"error": error, "id": None, "jsonrpc": "2.0"})
        if not self.ctx.settings.run and method in _STEERING:
            raise ProblemError(501, "Not implemented", "server.run false (workers run the instances) is not "
                                                       "available to A2A yet")
        request.state.loopwright_a2a_scopes = frozenset(scopes)
        request.state.loopwright_a2a_by = principal.source
        if method not in _STREAMING:
            return await self.dispatcher.handle_requests(request)
        gate = self.ctx.streams
        gate.enter()  # an event stream: counted against server.maxEventStreams
        try:
            response = await self.dispatcher.handle_requests(request)
        except BaseException:
            gate.leave()
            raise
        return GatedResponse(response, gate)  # type: ignore[return-value] - an ASGI response

    async def _authorize(self, request: Request) -> tuple[set[str], str | None, Principal, str]:
        """Authorize the scopes the request needs; return them, the method, who asks, and why the body is no text.

        Raises the serve context's :class:`~loopwright_serve.ProblemError` (401, 403) if refused.

        The body is parsed as the dispatcher parses it, so the decisions checked here are the
        ones the executor will apply. The last value is empty, or says why the body is JSON
        that holds no text: bytes that do not decode in the encoding :func:`json.loads` picks
        (UTF-8, -16 or -32), or a string with an unpaired surrogate (which no answer can echo).
        """
        unreadable = ""
        try:
            body = json.loads(await request.body())
        except UnicodeDecodeError as exc:
            body, unreadable = None, f"its bytes are no text ({exc})"
        except ValueError:
            body = None
        else:
            if found := unpaired_surrogate(body):
                unreadable = f"a string holds the unpaired surrogate U+{ord(found):04X}, which is not text"
        method = body.get("method") if isinstance(body, dict) else None
        needed = [_METHOD_SCOPES.get(method, Scope.RUN) if isinstance(method, str) else Scope.RUN]
        if method in ("SendMessage", "SendStreamingMessage") and isinstance(body.get("params"), dict):
            try:
                params = ParseDict(body["params"], SendMessageRequest(), ignore_unknown_fields=True)
                if _asks_decision(params.message):
                    needed.append(Scope.APPROVE)
            except Exception:  # noqa: BLE001 - the dispatcher answers a malformed request itself
                _log.debug("A2A request params do not parse; the dispatcher will say so")
        principals = [await self.ctx.authorize(request, scope) for scope in needed]
        return {s.value for s in needed}, method if isinstance(method, str) else None, principals[0], unreadable

    async def aclose(self) -> None:
        """Drain the request handler's background tasks."""
        await self.handler.aclose()


class _CallContextBuilder(DefaultServerCallContextBuilder):
    """The default call context, plus the scopes the endpoint checked."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[_SCOPES_KEY] = getattr(request.state, "loopwright_a2a_scopes", frozenset())
        context.state[_BY_KEY] = getattr(request.state, "loopwright_a2a_by", None)
        return context


class _ContextBuilder(SimpleRequestContextBuilder):
    """Resolve a message's task: the task id, the context id and the instance id are one id.

    A message naming a task or a context continues that instance; one naming neither starts a
    new instance with a fresh id. An id that names an instance that is not a task of this agent,
    or that no store could hold, is refused.
    """

    def __init__(self, agent: A2AAgent) -> None:
        super().__init__()
        self.agent = agent

    async def build(self, context: ServerCallContext, params: SendMessageRequest | None = None,
                    task_id: str | None = None, context_id: str | None = None, task: Task | None = None,
                    ) -> RequestContext:
        message = params.message if params is not None else None
        tid = task_id or (message.task_id if message is not None else "") or None
        cid = context_id or (message.context_id if message is not None else "") or None
        if tid and cid and tid != cid:
            raise InvalidParamsError(message=f"task {tid} belongs to context {tid}, not {cid}: a loopwright task "
                                             "is its own context")
        iid = tid or cid
        if iid is not None:
            if not valid_id(iid):
                raise InvalidParamsError(message=f"invalid task or context id {iid!r}: use {INSTANCE_ID_RULE}")
            header = await self.agent.session.header(iid)
            if header is not None and not self.agent.owns(header):
                raise InvalidParamsError(message=f"{iid} is not a task of the agent {self.agent.key}")
        else:
            iid = new_id()
        if _asks_decision(message) and Scope.APPROVE.value not in context.state.get(_SCOPES_KEY, ()):
            raise InvalidRequestError(message="deciding a held call needs a token with the approve scope")
        return await super().build(context, params, iid, iid, task)


class InstanceTaskStore(TaskStore):
    """A2A tasks as a view of loopwright instances (nothing of its own is kept).

    ``get`` and ``list`` read the instances' headers from the runtime's store; ``save`` keeps
    nothing, since every event it is given came from the instance, except a cancel written by
    a2a-sdk for a task not running here, which cancels the instance.
    """

    def __init__(self, agent: A2AAgent) -> None:
        """Serve the tasks of ``agent``."""
        self.agent = agent
        #: Tasks announced (a ``Task`` event queued) but not yet saved by a2a-sdk: not shown yet.
        self.creating: set[str] = set()

    async def save(self, task: Task, context: ServerCallContext) -> None:  # noqa: ARG002 - the TaskStore signature
        """Apply a cancel to the instance; everything else the instance has saved already."""
        self.creating.discard(task.id)
        if task.status.state != TaskState.TASK_STATE_CANCELED:
            return
        header = await self.agent.read(task.id)
        if header is not None and header.state not in (State.STOPPED, State.ERROR):
            await self.agent.runtime.cancel(task.id)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:  # noqa: ARG002
        """Return the task that instance ``task_id`` is, or ``None`` if it is not a task of this agent."""
        if task_id in self.creating:
            return None
        header = await self.agent.read(task_id)
        return None if header is None else task_view(header)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:  # noqa: ARG002
        """List this agent's tasks, newest first; ``page_token`` is an offset."""
        headers = [h for h in map(HeaderFields, await self.agent.runtime.store.list_headers()) if self.agent.owns(h)]
        tasks = [task_view(h) for h in reversed(headers)]
        if params.context_id:
            tasks = [t for t in tasks if t.context_id == params.context_id]
        if params.status != TaskState.TASK_STATE_UNSPECIFIED:
            tasks = [t for t in tasks if t.status.state == params.status]
        start = int(params.page_token) if params.page_token.isdigit() else 0
        size = params.page_size if params.HasField("page_size") and params.page_size > 0 else _LIST_PAGE
        page = tasks[start:start + size]
        more = start + size < len(tasks)
        return ListTasksResponse(tasks=page, next_page_token=str(start + size) if more else "",
                                 page_size=size, total_size=len(tasks))

    async def delete(self, task_id: str, context: ServerCallContext) -> None:  # noqa: ARG002
        """Refuse: an instance is never deleted through A2A."""
        raise InvalidRequestError(message=f"task {task_id} is a loopwright instance; it is not deleted over A2A")


class LoopwrightExecutor(AgentExecutor):
    """Run a message against its instance and publish what the instance does as task updates."""

    def __init__(self, agent: A2AAgent) -> None:
        """Execute for ``agent``."""
        self.agent = agent

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Start the instance (a new task) or steer it (decisions, then the text), and follow it until it rests.

        The live channel is subscribed to before anything starts, and given back however this ends.
        """
        iid = str(context.task_id)
        channel = self.agent.ctx.live
        live = channel.subscribe(iid, landed=True)
        try:
            await self._execute(context, event_queue, live)
        finally:
            channel.unsubscribe(live)

    async def _execute(self, context: RequestContext, event_queue: EventQueue, live: Subscription) -> None:
        iid = str(context.task_id)
        updater = TaskUpdater(event_queue, iid, iid)
        rt = self.agent.runtime
        message = context.message
        text = _message_text(message)
        cursor = Cursor()
        if context.current_task is None:
            # The new task is announced first, then the instance made; until a2a-sdk has saved
            # that announcement, the store does not show the instance as the task yet.
            self.agent.store.creating.add(iid)
            await event_queue.enqueue_event(Task(id=iid, context_id=iid, history=[message] if message else [],
                                                 status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)))
            try:
                run = await rt.start_agent(self.agent.key, inputs=_inputs_of(context), prompt=text or None,
                                           instance_id=iid, stream=True)
            except ConfigError as exc:
                await updater.reject(updater.new_agent_message([new_text_part(f"refused: {exc}")]))
                return
        else:
            run = await rt.get_agent(iid)
            run.stream = True  # the segment this message begins streams its answers (artifact updates per piece)
            before = HeaderFields(await rt.store.read_header(iid))
            cursor = Cursor.at_end(await rt.store.read_entries(iid))
            decisions = decisions_of(message)
            # Every decision is checked against the calls held now before any is made: a message
            # with one stale decision decides (and runs) nothing.
            shown = {str(p.get("toolCallId")): approval_digest(p) for p in _undecided(before)}
            for _decision, call_id, digest, _reason in decisions:
                if call_id in shown and digest != shown[call_id]:
                    raise InvalidParamsError(
                        message=f"task {iid}: the call pending as {call_id} has digest {shown[call_id]}, not the "
                                f"digest {digest} decided on; nothing was decided",
                        data={"toolCallId": call_id, "currentDigest": shown[call_id]})
            try:
                by = context.call_context.state.get(_BY_KEY)
                for decision, call_id, digest, reason in decisions:
                    if decision == "approved":
                        await run.approve(call_id, by=by, digest=digest)
                    else:
                        await run.deny(call_id, reason, by=by, digest=digest)
            except ApprovalDigestMismatchError as exc:
                raise InvalidParamsError(message=str(exc), data={
                    "toolCallId": exc.tool_call_id, "currentDigest": exc.current_digest}) from exc
            except LoopwrightError as exc:
                raise InvalidParamsError(message=str(exc)) from exc
            if text:
                await run.message(text)
        await updater.start_work()
        sent = await self._follow(follow_segment(run, live, cursor, self.agent.ctx.streams.closing), updater)
        await run.wait()
        await self._finish(updater, sent)

    async def _finish(self, updater: TaskUpdater, sent: str | None) -> None:
        """Publish where the instance rests: the ``answer`` artifact if no event carried it whole, then the status."""
        iid = updater.task_id
        header = HeaderFields(await self.agent.runtime.store.read_header(iid))
        if header.state == State.WAITING_FOR_APPROVAL:
            for p in _undecided(header):
                await updater.update_status(TaskState.TASK_STATE_WORKING, message=updater.new_agent_message([
                    new_data_part(_json_safe({"approvalRequired": {
                        "toolCallId": p.get("toolCallId"), "tool": p.get("tool"), "arguments": p.get("arguments"),
                        "digest": approval_digest(p), "reason": p.get("reason")}}))]))
        answer = _answer_artifact(header) if header.state in (State.WAITING, State.STOPPED) else None
        if answer is not None and (sent != header.text or header.output is not None):
            # An answer no text event carried (a task_complete result, a structured output): the
            # task SendMessage returns, and the stream, get it as GetTask shows it.
            await updater.event_queue.enqueue_event(TaskArtifactUpdateEvent(
                task_id=iid, context_id=iid, append=False, last_chunk=True, artifact=answer))
        await updater.update_status(status_of(header).state, message=status_of(header).message,
                                    metadata={"loopwright": {"instanceId": iid, "usage": dict(header.usage or {}),
                                                             "cost": header.cost}})

    async def _follow(self, batches: AsyncIterator[list[LiveEvent]], updater: TaskUpdater) -> str | None:
        """Publish a segment's events: answers as the ``answer`` artifact, tool activity as status updates.

        Each piece a streaming provider sends is an artifact update appended to the answer
        while the task works; the whole text replaces it once the answer is saved. A ``gap``
        (this client fell behind) is a working status update saying which turn lost pieces.

        :return: The last answer text sent whole, if any.
        """
        streamed = False
        sent: str | None = None
        lost: set[int | None] = set()
        queue = updater.event_queue
        async for batch in batches:
            for event in batch:
                data = event.data
                if event.kind == "text_delta" and event.turn not in lost:
                    await queue.enqueue_event(TaskArtifactUpdateEvent(
                        task_id=updater.task_id, context_id=updater.context_id, append=streamed,
                        artifact=Artifact(artifact_id=ANSWER, name=ANSWER, parts=[new_text_part(event.delta)])))
                    streamed = True
                elif event.kind in ("gap", "stream_reset"):
                    if event.kind == "gap":
                        lost.add(event.turn)
                        await updater.update_status(TaskState.TASK_STATE_WORKING, message=updater.new_agent_message([
                            new_data_part({"gap": {"turn": event.turn, "detail": "this client read too slowly: the "
                                                   "rest of the turn's pieces were dropped; the whole answer "
                                                   "replaces the artifact once saved"}})]))
                    else:
                        lost.discard(event.turn)
                    streamed = False  # the next piece (or the whole text) replaces the artifact
                elif event.kind == "text" and data.get("text"):
                    await queue.enqueue_event(TaskArtifactUpdateEvent(
                        task_id=updater.task_id, context_id=updater.context_id, append=False, last_chunk=True,
                        artifact=Artifact(artifact_id=ANSWER, name=ANSWER, parts=[new_text_part(str(data["text"]))])))
                    streamed = False
                    sent = str(data["text"])
                elif event.kind in ("tool_call", "tool_result"):
                    payload = {"toolCall": {"id": data.get("id"), "name": data.get("name"),
                                            "arguments": data.get("arguments")}} if event.kind == "tool_call" else \
                              {"toolResult": {"id": data.get("id"), "name": data.get("name"),
                                              "status": data.get("status"), "content": data.get("content")}}
                    await updater.update_status(TaskState.TASK_STATE_WORKING,
                                                message=updater.new_agent_message([new_data_part(_json_safe(payload))]))
        return sent

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Cancel the instance; the task becomes canceled."""
        iid = str(context.task_id)
        await self.agent.runtime.cancel(iid)
        await TaskUpdater(event_queue, iid, iid).cancel()


def _inputs_of(context: RequestContext) -> dict[str, Any] | None:
    """Return the definition's inputs: ``metadata.inputs`` of the request, or of its message.

    Whole numbers come back from protobuf as floats; they are made integers again.
    """
    inputs = context.metadata.get("inputs")
    if inputs is None and context.message is not None:
        inputs = MessageToDict(context.message.metadata).get("inputs")
    return _integers(inputs) if isinstance(inputs, dict) else None


def _integers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integers(v) for v in value]
    return value


def _json_safe(value: Any) -> Any:
    """``value`` as plain JSON (tool results may hold anything)."""
    return json.loads(json.dumps(value, default=str))


class A2ASurface:
    """Mounts ``/a2a/<name>`` (card and JSON-RPC endpoint) for each registered definition."""

    name = "a2a"

    def __init__(self) -> None:
        """Make the surface; the agents are built by :meth:`routes`."""
        self.agents: list[A2AAgent] = []

    def routes(self, ctx: ServeContext) -> list[BaseRoute]:
        """Return the card and JSON-RPC routes of every registered definition."""
        routes: list[BaseRoute] = []
        self.agents = [A2AAgent(ctx, key) for key in sorted(ctx.runtime.assembly.agent_definitions)]
        for agent in self.agents:
            routes.append(Route(agent.path + AGENT_CARD_WELL_KNOWN_PATH, agent.serve_card, methods=["GET"]))
            routes.append(Route(agent.path, agent.serve_rpc, methods=["POST"]))
        return routes

    @contextlib.asynccontextmanager
    async def lifespan(self, ctx: ServeContext) -> AsyncIterator[None]:  # noqa: ARG002 - the Surface signature
        """Run while the server runs; on the way out, drain the request handlers' background tasks."""
        try:
            yield
        finally:
            for agent in self.agents:
                await agent.aclose()


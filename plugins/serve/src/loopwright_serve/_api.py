"""The ``/v1`` API surface: instances, their events, records, messages, approvals and cancels.

Also ``/healthz`` and ``/openapi.json``. JSON keys are camelCase, as the CLI's ``--json``: the
summaries are the runtime's own (``ls --json``, ``show --json``). Every endpoint is a row of
:data:`ENDPOINTS`, which both builds the routes and writes ``/openapi.json``; request bodies are
the attrs classes below, checked against the schemas derived from them (:mod:`._schema`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote

import attrs
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, NoMatchFound, Route

from loopwright import INSTANCE_ID_RULE, Definition, HeaderFields, PendingApproval, State, is_instance_id
from loopwright._types import approval_digest
from loopwright.errors import (
    ApprovalDigestMismatchError,
    CapabilityError,
    ConfigError,
    InstanceLockedError,
    InstanceNotFoundError,
    LoopwrightError,
    StoreError,
    UnloadableInstanceError,
)
from loopwright_serve._auth import Principal, Scope
from loopwright_serve._events import event_stream, parse_event_id
from loopwright_serve._notify import Wakeups
from loopwright_serve._problems import PROBLEM_MEDIA_TYPE, ProblemError
from loopwright_serve._progress import inputs_schema, live_numbers
from loopwright_serve._schema import body_field, json_schema, read_model

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import Receive, Send
    from starlette.types import Scope as AsgiScope

    from loopwright_serve._context import ServeContext

__all__ = [
    "ENDPOINTS", "ApiSurface", "DecisionBody", "Endpoint", "ForkBody", "MessageBody", "RewindBody", "StartBody",
    "ThreadBody",
    "openapi",
]

#: A tool call id: printable, bounded (providers make them; nothing is read by it but the header).
_CALL_ID = re.compile(r"[\x21-\x7e]{1,256}")
_STATES = tuple(s.value for s in State)


# ---------------------------------------------------------------------------------------------
# Request bodies
# ---------------------------------------------------------------------------------------------


@attrs.frozen
class StartBody:
    """Start an instance of a definition the assembly registers (agentDefinitions)."""

    definition: str = body_field("A name from the assembly's agentDefinitions (never a file path).",
                                 minLength=1, maxLength=200)
    inputs: Mapping[str, Any] = body_field("Values for the definition's inputs.", default=attrs.Factory(dict))
    prompt: str | None = body_field("The task prompt, sent after the definition's initial prompts.", default=None,
                                    maxLength=1_000_000)


@attrs.frozen
class ThreadBody:
    """Say something in a thread: start the instance with this id, or send it the text as a message."""

    definition: str = body_field("A name from the assembly's agentDefinitions (never a file path); a thread "
                                 "keeps the one it started with.", minLength=1, maxLength=200)
    text: str = body_field("What is said: the prompt of a new thread, else a message to it.", minLength=1,
                           maxLength=1_000_000)
    inputs: Mapping[str, Any] = body_field("Values for the definition's inputs (used when the thread starts).",
                                           default=attrs.Factory(dict))


@attrs.frozen
class MessageBody:
    """Send a message to an instance: read at its next turn boundary, or it starts a new segment."""

    text: str = body_field("The message.", minLength=1, maxLength=1_000_000)


@attrs.frozen
class DecisionBody:
    """Approve or deny one held tool call, anywhere in the instance's tree."""

    decision: Literal["approve", "deny"] = body_field("What to do with the call.")
    digest: str = body_field("The digest of the call as shown (its ``digest`` in pendingApprovals): the call is "
                             "decided only if it is still exactly that call, else 409 naming the current digest.",
                             pattern="^[0-9a-f]{64}$")
    reason: str | None = body_field("Why (a denial's reason reaches the model).", default=None, maxLength=10_000)


@attrs.frozen
class ForkBody:
    """Fork an instance: a new instance whose history is the original's up to the end of a turn."""

    turn: int | None = body_field("The turn whose end the fork starts from (default: the history as it stands).",
                                  default=None, minimum=0)


@attrs.frozen
class RewindBody:
    """Rewind a resting instance to the end of a turn (what came after stays in its logs)."""

    turn: int = body_field("The turn to go back to the end of.", minimum=0)


@attrs.frozen
class EmptyBody:
    """No fields (an empty body is accepted)."""


# ---------------------------------------------------------------------------------------------
# The endpoint table
# ---------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Endpoint:
    """One operation of the API: how it is routed, who may call it, and what it takes and returns.

    Attributes:
        key: The handler's name on :class:`_Handlers`, and the OpenAPI ``operationId``.
        method: ``GET``, ``POST``, ``PUT`` or ``DELETE``.
        path: The route, with ``{instance_id}`` and ``{call_id}`` parameters.
        summary: One line for the document.
        scope: The scope it needs (``None``: anyone, as ``/healthz``).
        body: The request body's class, if it takes one.
        query: Query parameters: name → (JSON Schema, description).
        responses: Status → description of the success answers.
        errors: The problem statuses it may answer with.
        media_type: The success answers' media type.
    """

    key: str
    method: Literal["GET", "POST", "PUT", "DELETE"]
    path: str
    summary: str
    scope: Scope | None
    body: type[Any] | None = None
    query: Mapping[str, tuple[Mapping[str, Any], str]] = attrs.field(factory=dict)
    responses: Mapping[int, str]
    errors: tuple[int, ...] = ()
    media_type: str = "application/json"


_AUTH_ERRORS = (401, 403)
_LIVE_HELP = ("Add to each summary (and tree node) live: {turns, usage, cost, runningSince}, the counters as "
              "the instance writes them while it runs; question: the ask_user question it waits on, or null; "
              "and forkedFrom.")
#: The most summaries (or trees) one page of GET /v1/instances holds.
_MAX_PAGE = 500
ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(key="healthz", method="GET", path="/healthz",
             summary="Whether the server is up, its version, and how many event streams are open.", scope=None,
             responses={200: "It is up: {status: ok, version, eventStreams}."}),
    Endpoint(key="openapi", method="GET", path="/openapi.json", summary="This document.", scope=None,
             responses={200: "The OpenAPI 3.1 document of the API."}),
    Endpoint(key="list_instances", method="GET", path="/v1/instances",
             summary="Every instance's summary (as ls --json, with live and question), oldest first; or every "
                     "tree (tree=true).",
             scope=Scope.READ, query={
                 "state": ({"enum": list(_STATES)}, "Only instances in this state."),
                 "name": ({"type": "string"}, "Only instances of this definition name."),
                 "q": ({"type": "string", "maxLength": 200},
                       ("Only instances whose id, name, task prompt, error or question contains this text "
                        "(case-insensitive); with tree=true, the trees with such an instance.")),
                 "tree": ({"type": "boolean"}, "Every tree in the store as nested nodes (as ls --tree --json)."),
                 "live": ({"type": "boolean"}, _LIVE_HELP),
                 "order": ({"enum": ["oldest", "newest"]}, "oldest first (the default) or newest first."),
                 "offset": ({"type": "integer", "minimum": 0}, "Skip this many (summaries, or trees) first."),
                 "limit": ({"type": "integer", "minimum": 1, "maximum": _MAX_PAGE},
                           (f"At most this many (default: all; at most {_MAX_PAGE}). X-Total-Count says how "
                            "many matched.")),
             }, responses={200: "The summaries (or the trees' root nodes)."}, errors=(*_AUTH_ERRORS, 422)),
    Endpoint(key="list_definitions", method="GET", path="/v1/definitions",
             summary="The definitions the assembly registers (agentDefinitions), each with its inputs as a JSON "
                     "Schema: what POST /v1/instances may start.", scope=Scope.READ,
             responses={200: "[{name, description, model, tools, inputs}] by name; one that cannot be read has "
                             "error instead."}, errors=_AUTH_ERRORS),
    Endpoint(key="start_instance", method="POST", path="/v1/instances",
             summary="Start an instance of a registered definition.", scope=Scope.RUN, body=StartBody,
             responses={201: "Started (or, with server.run false, written for a worker): its summary."},
             errors=(400, *_AUTH_ERRORS, 413, 415, 422)),
    Endpoint(key="show_instance", method="GET", path="/v1/instances/{instance_id}",
             summary="One instance's summary (as show --json): its tree and the tree's pending approvals.",
             scope=Scope.READ, query={"live": ({"type": "boolean"}, _LIVE_HELP)}, responses={200: "The summary."},
             errors=(400, *_AUTH_ERRORS, 404)),
    Endpoint(key="say_in_thread", method="PUT", path="/v1/instances/{instance_id}",
             summary="A thread: start the instance with this id (the caller's) with the text as its prompt, or, if "
                     "it exists, send it the text as a message.", scope=Scope.RUN, body=ThreadBody,
             responses={201: "Started: its summary.", 202: "Delivered to the thread: its summary."},
             errors=(400, *_AUTH_ERRORS, 409, 413, 415, 422)),
    Endpoint(key="delete_instance", method="DELETE", path="/v1/instances/{instance_id}",
             summary="Delete a root instance (a thread), the instances below it and everything the store keeps "
                     "of them; refused while any of them runs.", scope=Scope.ADMIN,
             responses={200: "Deleted: {deleted: [ids, children first]}."}, errors=(400, *_AUTH_ERRORS, 404, 409)),
    Endpoint(key="events", method="GET", path="/v1/instances/{instance_id}/events",
             summary="Server-Sent Events: the instance's transcript and records as they are written.",
             scope=Scope.READ, query={
                 "lastEventId": ({"type": "string", "pattern": r"^\d+-\d+$"},
                                 "Resume after this event id (as the Last-Event-ID header does)."),
             }, responses={200: "An event stream: `transcript` (a message of the entry log) and `record` events, "
                                "each with an id RECORDS-ENTRIES; a client that reconnects with Last-Event-ID "
                                "gets what it missed."},
             errors=(400, *_AUTH_ERRORS, 404, 503), media_type="text/event-stream"),
    Endpoint(key="records", method="GET", path="/v1/instances/{instance_id}/records",
             summary="The instance's record log.", scope=Scope.READ, query={
                 "kind": ({"type": "string"}, "Only records of this kind."),
                 "after": ({"type": "integer", "minimum": 0}, "Only records after the first AFTER."),
             }, responses={200: "The records, oldest first."}, errors=(400, *_AUTH_ERRORS, 404, 422)),
    Endpoint(key="message", method="POST", path="/v1/instances/{instance_id}/messages",
             summary="Send a message to the instance.", scope=Scope.RUN, body=MessageBody,
             responses={202: "Delivered: {instanceId, delivered, state}."},
             errors=(400, *_AUTH_ERRORS, 404, 409, 413, 415, 422)),
    Endpoint(key="decide", method="POST", path="/v1/instances/{instance_id}/approvals/{call_id}",
             summary="Approve or deny a call held anywhere in the instance's tree.", scope=Scope.APPROVE,
             body=DecisionBody, responses={200: "Decided: {decided: [...], instance: summary}."},
             errors=(400, *_AUTH_ERRORS, 404, 409, 413, 415, 422)),
    Endpoint(key="fork", method="POST", path="/v1/instances/{instance_id}/fork",
             summary="Fork the instance at the end of a turn: a new instance, resting waiting, with forkedFrom; "
                     "the original is not changed.", scope=Scope.RUN, body=ForkBody,
             responses={201: "Forked: the new instance's summary."},
             errors=(400, *_AUTH_ERRORS, 404, 409, 413, 415, 422)),
    Endpoint(key="rewind", method="POST", path="/v1/instances/{instance_id}/rewind",
             summary="Rewind the resting instance to the end of a turn: it rests waiting, ready for a message; what "
                     "came after stays in its logs.", scope=Scope.RUN, body=RewindBody,
             responses={200: "Rewound: its summary."}, errors=(400, *_AUTH_ERRORS, 404, 409, 413, 415, 422)),
    Endpoint(key="cancel", method="POST", path="/v1/instances/{instance_id}/cancel",
             summary="Cancel the instance: it becomes stopped, with cancelled true.", scope=Scope.RUN, body=EmptyBody,
             responses={200: "Cancelled: its summary."}, errors=(400, *_AUTH_ERRORS, 404, 409, 413, 415)),
)


# ---------------------------------------------------------------------------------------------
# The surface
# ---------------------------------------------------------------------------------------------


class ApiSurface:
    """The ``/v1`` API, ``/healthz`` and ``/openapi.json`` (docs/serve.md lists every endpoint)."""

    name = "api"

    def __init__(self) -> None:
        self.wakeups = Wakeups()

    def routes(self, ctx: ServeContext) -> list[BaseRoute]:
        """Return one route per row of :data:`ENDPOINTS`, bound to ``ctx``, then :class:`_RefusedInstanceId`."""
        handlers = _Handlers(ctx, self.wakeups)
        routes: list[BaseRoute] = [
            Route(ep.path, _endpoint(ctx, ep, getattr(handlers, ep.key)), methods=[ep.method], name=ep.key)
            for ep in ENDPOINTS]
        return [*routes, _RefusedInstanceId()]

    def lifespan(self, ctx: ServeContext) -> contextlib.AbstractAsyncContextManager[None]:
        """Register the event streams' wake-ups on the runtime while the server runs."""
        return self._wakeups_registered(ctx)

    @contextlib.asynccontextmanager
    async def _wakeups_registered(self, ctx: ServeContext) -> AsyncIterator[None]:
        name = ctx.runtime.register_plugin(self.wakeups, "loopwright-serve-events")
        try:
            yield
        finally:
            ctx.runtime.unregister_plugin(name)


#: Where the instance id is in every ``/v1/instances/{instance_id}...`` path.
_INSTANCES_PATH = "/v1/instances/"


def _path_instance_id(scope: AsgiScope) -> str | None:
    """Return the instance id a ``/v1/instances/ID...`` request names, as its client wrote it; else ``None``.

    The id is the path segment after ``/v1/instances/``, percent-decoded from the raw path (the
    ASGI ``raw_path``): so ``a%2Fb`` is the id ``a/b``, not the id ``a`` and a route ``b``. A
    server without ``raw_path`` gives the decoded path's segment. ``None`` for any other path, and
    for ``/v1/instances/`` itself (an empty segment: the list, with a slash too many).
    """
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else scope["path"]
    root = scope.get("root_path", "")
    if root and not path.startswith(_INSTANCES_PATH) and path.startswith(root):
        path = path[len(root):]
    if not path.startswith(_INSTANCES_PATH):
        return None
    segment = path[len(_INSTANCES_PATH):].partition("/")[0]
    return unquote(segment) if segment else None


def _refused_instance_id(value: str) -> ProblemError:
    """Return the 400 problem for an id in the path that breaks the instance id rule, stating the rule."""
    shown = value if len(value) <= 80 else value[:80] + "..."  # noqa: PLR2004 - enough to recognise it
    return ProblemError(400, "Invalid instance id", f"{shown!r} is not an instance id: ids are {INSTANCE_ID_RULE}")


class _RefusedInstanceId(BaseRoute):
    """The route after every endpoint's: a ``/v1/instances/ID...`` path whose ID breaks the rule is a 400.

    An endpoint's route checks the id itself (after the token); this one answers the paths no
    endpoint matches, like ``/v1/instances/..%2Fx`` or ``/v1/instances/-rf/nothing``, with the
    same problem instead of an unknown route's 404. A path whose id follows the rule is left to
    the router (a 404 unknown route, a 405, a redirect of a trailing slash).
    """

    def matches(self, scope: AsgiScope) -> tuple[Match, AsgiScope]:
        """Match (fully) an HTTP request whose path names an id that breaks the rule."""
        if scope["type"] != "http":
            return Match.NONE, {}
        named = _path_instance_id(scope)
        return (Match.FULL, {}) if named is not None and not is_instance_id(named) else (Match.NONE, {})

    async def handle(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        """Answer the 400 problem document stating the rule."""
        await _refused_instance_id(_path_instance_id(scope) or "").response()(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        """Never: this route has no name."""
        raise NoMatchFound(name, path_params)


_Handler = Callable[["Request", "Principal | None", Any], Awaitable[Response]]


def _endpoint(ctx: ServeContext, ep: Endpoint, handler: _Handler) -> Callable[[Request], Awaitable[Response]]:
    """Wrap ``handler``: authorize, check the ids in the path, read the body, map loopwright's errors.

    An instance id that breaks the rule (:data:`loopwright.INSTANCE_ID_RULE`) is a 400 stating the
    rule, never looked up; one that follows it but names no instance is a 404.
    """

    async def endpoint(request: Request) -> Response:
        principal = await ctx.authorize(request, ep.scope) if ep.scope is not None else None
        instance_id = request.path_params.get("instance_id")
        if instance_id is not None:
            named = _path_instance_id(request.scope) or instance_id  # "a%2Fb" names "a/b", not "a"
            if not is_instance_id(named):
                raise _refused_instance_id(named)
        call_id = request.path_params.get("call_id")
        if call_id is not None and not _CALL_ID.fullmatch(call_id):
            raise ProblemError(404, "Unknown call", "that is not a tool call id")
        body = None
        if ep.body is not None:
            kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
            raw = await request.body()
            if raw.strip() and kind != "application/json":
                raise ProblemError(415, "Unsupported Media Type", "send the body as Content-Type: application/json")
            body = read_model(raw, ep.body, empty_ok=ep.body is EmptyBody)
        with _loopwright_errors(instance_id):
            return await handler(request, principal, body)

    return endpoint


#: Runtime errors that are the request's answer as they are: their status and title (first match wins).
_PLAIN_PROBLEMS: tuple[tuple[type[Exception], int, str], ...] = (
    (InstanceLockedError, 409, "Running elsewhere"),
    (CapabilityError, 422, "Not allowed here"),
    # A row that cannot run as saved (malformed, tampered with, or failing its integrity check).
    (UnloadableInstanceError, 409, "Cannot run"),
)


@contextlib.contextmanager
def _loopwright_errors(instance_id: str | None) -> Iterator[None]:
    """Turn the runtime's errors into problem documents, with the instance they concern."""
    extra: dict[str, Any] = {"instanceId": instance_id} if instance_id else {}
    try:
        yield
    except InstanceNotFoundError:
        raise ProblemError(404, "Unknown instance", f"no instance {instance_id!r} in the store", **extra) from None
    except ApprovalDigestMismatchError as exc:
        raise ProblemError(409, "Not the pending call", str(exc), instanceId=exc.instance_id,
                           toolCallId=exc.tool_call_id, currentDigest=exc.current_digest) from None
    except ConfigError as exc:
        errors = [{"path": p.path or "$", "message": p.message} for p in exc.problems] or \
            [{"path": "$", "message": str(exc)}]
        raise ProblemError(422, "Invalid request", str(exc).split("\n", 1)[0], errors=errors, **extra) from None
    except LoopwrightError as exc:
        raise _problem_of(exc, extra) from None


def _problem_of(exc: LoopwrightError, extra: dict[str, Any]) -> Exception:
    """Return the problem a runtime error answers with, or ``exc`` itself (a 500) when it is no answer."""
    for kind, status, title in _PLAIN_PROBLEMS:
        if isinstance(exc, kind):
            return ProblemError(status, title, str(exc), **extra)
    if isinstance(exc, StoreError) and "invalid instance id" in str(exc):  # the store's own check_instance_id
        return ProblemError(400, "Invalid instance id", str(exc), **extra)
    if type(exc) is LoopwrightError:
        # A decision on a call that does not wait (any more), an instance busy in another process.
        return ProblemError(409, "Conflict", str(exc), **extra)
    return exc


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name)
    if value is None:
        return False
    if value.lower() in {"true", "1", "yes"}:
        return True
    if value.lower() in {"false", "0", "no"}:
        return False
    raise ProblemError(422, "Invalid query", f"{name} must be true or false, not {value!r}")


#: The longest text filter (``q``) of GET /v1/instances.
_MAX_QUERY = 200


def _whole(request: Request, name: str, default: int | None, most: int | None) -> Any:
    """Return the query parameter ``name`` as a whole number (``default`` when absent); 422 otherwise."""
    text = request.query_params.get(name)
    if text is None:
        return default
    if not text.isdigit() or (most is not None and not 1 <= int(text) <= most):
        bound = f" from 1 to {most}" if most is not None else ""
        raise ProblemError(422, "Invalid query", f"{name} must be a whole number{bound}, not {text[:40]!r}")
    return int(text)


def _node_ids(node: Mapping[str, Any]) -> Iterator[str]:
    """Yield the ids of a tree node and of every node below it."""
    yield str(node.get("instanceId"))
    for child in node.get("children") or ():
        if isinstance(child, Mapping):
            yield from _node_ids(child)


def _matches(header: HeaderFields | None, text: str) -> bool:
    """Whether the instance's id, name, task prompt, error or open question contains ``text`` (lower case)."""
    if header is None:
        return False
    question = _question(header)
    fields = (header.instance_id, header.name, header.json.get("taskPrompt"), header.error,
              question and question.get("question"))
    return any(isinstance(f, str) and text in f.lower() for f in fields)


def _question(header: HeaderFields) -> dict[str, Any] | None:
    """Return the ``ask_user`` question the instance waits for an answer to (a message answers it), or ``None``."""
    awaiting = header.awaiting_answer
    if not awaiting or str(getattr(header.state, "value", header.state)) not in {"waiting", "stopped"}:
        return None
    return {"toolCallId": awaiting.get("toolCallId"), "question": awaiting.get("question")}


def _decision_json(p: PendingApproval) -> dict[str, Any]:
    return {"toolCallId": p.tool_call_id, "digest": approval_digest(p), "tool": p.tool,
            "arguments": dict(p.arguments), "reason": p.reason,
            "decision": p.decision, "decisionReason": p.decision_reason, "decidedBy": p.decided_by,
            "instanceId": p.instance_id, "path": [dict(step) for step in p.path]}


class _Handlers:
    """The endpoints' work, one method per :data:`ENDPOINTS` key."""

    def __init__(self, ctx: ServeContext, wakeups: Wakeups) -> None:
        self.ctx = ctx
        self.rt = ctx.runtime
        self.wakeups = wakeups
        self._definitions: dict[str, tuple[tuple[int, int], Definition]] = {}

    async def healthz(self, _request: Request, _principal: Principal | None, _body: None) -> Response:
        return JSONResponse({"status": "ok", "version": version("loopwright-serve"),
                             "eventStreams": self.ctx.streams.open})

    async def openapi(self, _request: Request, _principal: Principal | None, _body: None) -> Response:
        return JSONResponse(openapi(tokens=bool(self.ctx.settings.tokens)))

    async def list_instances(self, request: Request, _principal: Principal | None, _body: None) -> Response:
        state, name = request.query_params.get("state"), request.query_params.get("name")
        text = (request.query_params.get("q") or "").strip().lower()
        if state is not None and state not in _STATES:
            raise ProblemError(422, "Invalid query", f"state must be one of {', '.join(_STATES)}, not {state!r}")
        if len(text) > _MAX_QUERY:
            raise ProblemError(422, "Invalid query", f"q is longer than {_MAX_QUERY} characters")
        offset = _whole(request, "offset", 0, None)
        limit = _whole(request, "limit", None, _MAX_PAGE)
        live = _flag(request, "live")
        order = request.query_params.get("order", "oldest")
        if order not in {"oldest", "newest"}:
            raise ProblemError(422, "Invalid query", f"order must be oldest or newest, not {order[:40]!r}")
        headers: dict[Any, HeaderFields] = {}
        if live or text:  # the headers again: what the summaries leave out
            headers = {h.get("instanceId"): HeaderFields(h) for h in await self.rt.store.list_headers()}
        if _flag(request, "tree"):
            nodes = [n for n in await self.rt.trees()
                     if (state is None or n.get("state") == state) and (name is None or n.get("name") == name)
                     and (not text or any(_matches(headers.get(i), text) for i in _node_ids(n)))]
            if order == "newest":
                nodes.reverse()
            page = nodes[offset:None if limit is None else offset + limit]
            for node in page if live else ():
                await self._dress_node(node, headers)
            return JSONResponse(page, headers={"X-Total-Count": str(len(nodes))})
        found = [s for s in await self.rt.list_instances(state) if (name is None or s.get("name") == name)
                 and (not text or _matches(headers.get(s.get("instanceId")), text))]
        if order == "newest":
            found.reverse()
        page = found[offset:None if limit is None else offset + limit]
        for summary in page if live else ():
            await self._dress(summary, headers.get(summary.get("instanceId")))
        return JSONResponse(page, headers={"X-Total-Count": str(len(found))})

    async def _dress(self, summary: dict[str, Any], header: HeaderFields | None) -> None:
        """Add ``live`` (the counters as the instance writes them) and ``question`` (an open ask_user) to a summary."""
        if header is None:
            return
        summary["live"] = await live_numbers(self.rt.store, header)
        summary["question"] = _question(header)
        summary["forkedFrom"] = header.forked_from

    async def _dress_node(self, node: dict[str, Any], headers: Mapping[Any, HeaderFields]) -> None:
        """Add ``live`` and ``question`` to a tree node and every node below it."""
        header = headers.get(node.get("instanceId"))
        if header is not None:
            node["live"] = await live_numbers(self.rt.store, header)
            node["question"] = _question(header)
        for child in node.get("children") or ():
            if isinstance(child, dict):
                await self._dress_node(child, headers)

    async def list_definitions(self, _request: Request, _principal: Principal | None, _body: None) -> Response:
        out: list[dict[str, Any]] = []
        for name, path in sorted(self.rt.assembly.agent_definitions.items()):
            try:
                defn = self._definition(name, path)
            except LoopwrightError as exc:
                out.append({"name": name, "error": str(exc).split("\n", 1)[0]})
                continue
            out.append({"name": name, "agentName": defn.name, "description": defn.description, "model": defn.model,
                        "tools": list(defn.tool_names), "inputs": inputs_schema(defn)})
        return JSONResponse(out)

    async def start_instance(self, _request: Request, _principal: Principal | None, body: StartBody) -> Response:
        registered = self.rt.assembly.agent_definitions
        if body.definition not in registered:
            names = ", ".join(sorted(registered)) or "none"
            raise ProblemError(
                422, "Unknown definition",
                f"{body.definition!r} is not a name in the assembly's agentDefinitions (only those start over "
                f"HTTP, never a file path); they are: {names}",
                errors=[{"path": "$.definition", "message": "not a registered definition name"}])
        defn = self._definition(body.definition, registered[body.definition])
        if self.ctx.settings.run:
            # Providers are asked to stream, so that followers of the event stream get text_delta events.
            instance_id = (await self.rt.start_agent(defn, dict(body.inputs), body.prompt, stream=True)).instance_id
        else:  # written, queued, for a worker: nothing runs here
            instance_id = await self.rt.submit(defn, dict(body.inputs), body.prompt)
        summary = await self.rt.summary(instance_id)
        return JSONResponse(summary, status_code=201, headers={"Location": f"/v1/instances/{instance_id}"})

    def _definition(self, name: str, path: str) -> Definition:
        """Return the registered definition ``name``, read again only when its file changed.

        Parsing and checking a definition file is most of what a start costs; the file's
        modification time and size say when the copy read last is stale.
        """
        file = Path(path) if Path(path).is_absolute() else self.rt.assembly.base_dir / path
        try:
            stat = file.stat()
            stamp: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            stamp = None  # let the loader say what is wrong with it
        cached = self._definitions.get(name)
        if stamp is not None and cached is not None and cached[0] == stamp:
            return cached[1]
        defn = self.rt.load_definition(name)
        if stamp is not None:
            self._definitions[name] = (stamp, defn)
        return defn

    async def show_instance(self, request: Request, _principal: Principal | None, _body: None) -> Response:
        instance_id = request.path_params["instance_id"]
        summary = await self.rt.summary(instance_id)
        if _flag(request, "live"):
            await self._dress(summary, HeaderFields(await self.rt.store.read_header(instance_id)))
        return JSONResponse(summary)

    async def fork(self, request: Request, _principal: Principal | None, body: ForkBody) -> Response:
        instance_id = request.path_params["instance_id"]
        forked = await self.rt.fork(instance_id, body.turn)
        summary = await self.rt.summary(forked.instance_id)
        return JSONResponse(summary, status_code=201, headers={"Location": f"/v1/instances/{forked.instance_id}"})

    async def rewind(self, request: Request, _principal: Principal | None, body: RewindBody) -> Response:
        instance_id = request.path_params["instance_id"]
        await self.rt.rewind(instance_id, body.turn)
        return JSONResponse(await self.rt.summary(instance_id))

    async def events(self, request: Request, _principal: Principal | None, _body: None) -> Response:
        instance_id = request.path_params["instance_id"]
        given = request.headers.get("last-event-id") or request.query_params.get("lastEventId")
        cursor = parse_event_id(given)
        await self.rt.store.read_header(instance_id)  # a 404 now, before the stream starts
        return event_stream(self.ctx, instance_id, cursor, self.wakeups)

    async def records(self, request: Request, _principal: Principal | None, _body: None) -> Response:
        kind = request.query_params.get("kind")
        after_text = request.query_params.get("after", "0")
        if not after_text.isdigit():
            raise ProblemError(422, "Invalid query", f"after must be a whole number, not {after_text!r}")
        records = (await self.rt.records(request.path_params["instance_id"]))[int(after_text):]
        return JSONResponse([r for r in records if kind is None or r.get("kind") == kind])

    async def say_in_thread(self, request: Request, _principal: Principal | None, body: ThreadBody) -> Response:
        instance_id = request.path_params["instance_id"]
        registered = self.rt.assembly.agent_definitions
        if body.definition not in registered:
            names = ", ".join(sorted(registered)) or "none"
            raise ProblemError(422, "Unknown definition", f"{body.definition!r} is not a name in the assembly's "
                               f"agentDefinitions; they are: {names}",
                               errors=[{"path": "$.definition", "message": "not a registered definition name"}])
        try:
            await self.rt.store.read_header(instance_id)
            exists = True
        except InstanceNotFoundError:
            exists = False
        if self.ctx.settings.run:
            defn = self._definition(body.definition, registered[body.definition])
            await self.rt.thread(instance_id, defn).send(body.text, inputs=dict(body.inputs), stream=True)
        elif exists:  # written for a worker: nothing runs here (the path's id was checked above)
            await self.rt.submit_message(instance_id, body.text, source="api")
        else:
            await self.rt.submit(body.definition, dict(body.inputs), body.text, instance_id=instance_id)
        return JSONResponse(await self.rt.summary(instance_id), status_code=202 if exists else 201,
                            headers={"Location": f"/v1/instances/{instance_id}"})

    async def delete_instance(self, request: Request, _principal: Principal | None, _body: None) -> Response:
        deleted = await self.rt.delete(request.path_params["instance_id"])
        return JSONResponse({"deleted": deleted})

    async def message(self, request: Request, _principal: Principal | None, body: MessageBody) -> Response:
        instance_id = request.path_params["instance_id"]
        if self.ctx.settings.run:
            run = await self.rt.get_agent(instance_id)
            run.stream = True  # the segment it starts streams: followers get text_delta events
            await run.message(body.text, source="api")
        else:
            await self.rt.submit_message(instance_id, body.text, source="api")
        state = HeaderFields(await self.rt.store.read_header(instance_id)).state
        return JSONResponse({"instanceId": instance_id, "delivered": True, "state": state}, status_code=202)

    async def decide(self, request: Request, principal: Principal | None, body: DecisionBody) -> Response:
        instance_id, call_id = request.path_params["instance_id"], request.path_params["call_id"]
        assert principal is not None  # noqa: S101 - the endpoint needs a scope
        decision: Literal["approved", "denied"] = "approved" if body.decision == "approve" else "denied"
        if self.ctx.settings.run:
            run = await self.rt.get_agent(instance_id)
            run.stream = True  # the segment the decision continues streams
            decided = await self.rt.decide(run, call_id, decision, body.reason, by=principal.source,
                                           digest=body.digest)
        else:  # saved, and handed to the engine for a worker to continue
            decided = await self.rt.submit_decision(instance_id, call_id, decision, body.reason,
                                                    by=principal.source, digest=body.digest)
        return JSONResponse({"decided": [_decision_json(p) for p in decided],
                             "instance": await self.rt.summary(instance_id)})

    async def cancel(self, request: Request, _principal: Principal | None, _body: EmptyBody) -> Response:
        instance_id = request.path_params["instance_id"]
        await self.rt.get_agent(instance_id)
        await self.rt.cancel(instance_id)
        return JSONResponse(await self.rt.summary(instance_id))


# ---------------------------------------------------------------------------------------------
# /openapi.json
# ---------------------------------------------------------------------------------------------

_PROBLEM_SCHEMA = {
    "type": "object", "description": "An RFC 9457 problem document.",
    "required": ["type", "title", "status"],
    "properties": {"type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
                   "detail": {"type": "string"}, "instanceId": {"type": "string"},
                   "errors": {"type": "array", "items": {"type": "object", "properties": {
                       "path": {"type": "string"}, "message": {"type": "string"}}}}},
}


def openapi(*, tokens: bool = True) -> dict[str, Any]:
    """Return the OpenAPI 3.1 document of :data:`ENDPOINTS`, the request bodies' schemas derived from their classes.

    :param tokens: Whether the server has tokens (then every scoped operation needs ``bearer``).
    """
    from http import HTTPStatus  # noqa: PLC0415 - only for this document

    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {"Problem": _PROBLEM_SCHEMA}
    for ep in ENDPOINTS:
        op: dict[str, Any] = {"operationId": ep.key, "summary": ep.summary}
        params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in re.findall(r"\{(\w+)\}", ep.path)]
        params += [{"name": name, "in": "query", "required": False, "schema": dict(schema), "description": text}
                   for name, (schema, text) in ep.query.items()]
        if params:
            op["parameters"] = params
        if ep.body is not None:
            schemas[ep.body.__name__] = json_schema(ep.body)
            op["requestBody"] = {"required": ep.body is not EmptyBody, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{ep.body.__name__}"}}}}
        responses: dict[str, Any] = {str(status): {"description": text, "content": {ep.media_type: {"schema": {}}}}
                                     for status, text in ep.responses.items()}
        for status in ep.errors:
            responses[str(status)] = {"description": HTTPStatus(status).phrase, "content": {
                PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
        op["responses"] = responses
        if ep.scope is not None:
            op["security"] = [{"bearer": [ep.scope.value]}] if tokens else []
            op["x-scope"] = ep.scope.value
        paths.setdefault(ep.path, {})[ep.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "loopwright serve", "version": version("loopwright-serve"),
                 "description": "The HTTP API of loopwright serve (docs/serve.md)."},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "A token from the assembly's server.tokens; its scopes: read, run, approve, admin."}}},
    }

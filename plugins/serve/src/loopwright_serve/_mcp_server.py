"""The MCP server: every registered definition as an MCP tool (issue 14).

Built on the official ``mcp`` package's low-level :class:`mcp.server.lowlevel.Server`, served two
ways over the same handlers:

* streamable HTTP at ``/mcp`` inside ``loopwright serve`` (:class:`McpSurface`). Each HTTP
  request is authorised with the ``run`` scope before the SDK sees it, and the principal is
  handed to the SDK, which binds each MCP session to the token that opened it;
* stdio, for editors: ``loopwright mcp-serve [-c ASSEMBLY]`` (:func:`serve_stdio`). The editor
  starts the process as its user, so there is no token.

A tool is named as its definition is registered in ``agentDefinitions``. Its input is
``{prompt, inputs?}``; a call starts one instance and waits until it rests. The result's text is
the agent's answer, and its structured content is ``{instanceId, state, stopReason, text,
pendingApprovals, question}``. A run that rests holding calls for approval, or asking the user
(``ask_user``), is not an error: its text says which calls wait and how to decide them, or what
the agent asks. While the agent works, each finished turn and each tool
call it starts sends a progress notification, when the client asked for progress.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from loopwright import AgentResult, Runtime, State, approval_digest
from loopwright.errors import ConfigError, LoopwrightError
from loopwright_serve._auth import Scope
from loopwright_serve._problems import ProblemError
from loopwright_serve._resting import question_of, start

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext
    from starlette.types import Receive, Send
    from starlette.types import Scope as AsgiScope

    from loopwright import AgentRun
    from loopwright_serve._context import ServeContext

__all__ = ["McpSurface", "build_server", "serve_stdio"]

_log = logging.getLogger("loopwright.serve")

#: Event kinds that move a run on, each reported as one step of progress.
_PROGRESS_KINDS = ("usage", "tool_call")

#: The structured content of every tool's result.
OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "instanceId": {"type": "string", "description": "The loopwright instance the call started."},
        "state": {"type": "string", "description": "Its state: waiting, waiting_for_approval, stopped or error."},
        "stopReason": {"type": ["string", "null"]},
        "text": {"type": ["string", "null"], "description": "The agent's answer."},
        "pendingApprovals": {"type": "array", "items": {"type": "object"},
                             "description": "Calls held for approval: {toolCallId, digest, tool, arguments}; "
                                            "a decision (serve API, CLI) carries the digest."},
        "question": {"type": ["string", "null"], "description": "What the agent asks (ask_user), if it waits on that."},
    },
    "required": ["instanceId", "state"],
}


def build_server(runtime: Runtime, closing: anyio.Event | None = None, *, runs: bool = True) -> Server[Any]:
    """Return an MCP server whose tools are the runtime's registered definitions.

    :param runtime: An open runtime; the tools start instances in it.
    :param closing: Set when the server shuts down: a call still waiting then answers an error
        naming its instance (kept in the store, resumable) instead of holding the shutdown.
    :param runs: Whether this server runs agents (``server.run``); when not, each call is
        submitted for a ``loopwright worker`` and answered once the worker's run rests (no progress).
    """

    async def list_tools(_ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None,
                         ) -> types.ListToolsResult:
        names = sorted(runtime.assembly.agent_definitions)
        return types.ListToolsResult(tools=[_tool(runtime, name) for name in names])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        return await _call(runtime, params.name, dict(params.arguments or {}), ctx.session.report_progress,
                           closing, runs=runs)

    return Server("loopwright", instructions="Each tool runs a loopwright agent and returns its answer.",
                  on_list_tools=list_tools, on_call_tool=call_tool)


def _tool(runtime: Runtime, name: str) -> types.Tool:
    """Describe the definition ``name`` as an MCP tool (a definition that does not load says so)."""
    inputs: dict[str, Any] = {"type": "object", "description": "Values for the definition's inputs."}
    try:
        defn = runtime.load_definition(name)
    except LoopwrightError as exc:
        description = f"Run the loopwright agent {name!r} (its definition does not load: {exc})"
    else:
        description = defn.description or f"Run the loopwright agent {name!r} and return its answer."
        if defn.inputs:
            inputs["properties"] = {key: {"type": spec.type, **({"description": spec.description}
                                                                if spec.description else {})}
                                    for key, spec in defn.inputs.items()}
            required = [key for key, spec in defn.inputs.items() if spec.required]
            if required:
                inputs["required"] = required
    schema = {
        "type": "object",
        "properties": {"prompt": {"type": "string", "description": "The task for the agent."}, "inputs": inputs},
        "required": ["prompt"],
        "additionalProperties": False,
    }
    return types.Tool(name=name, description=description, input_schema=schema, output_schema=OUTPUT_SCHEMA)


async def _call(runtime: Runtime, name: str, arguments: Mapping[str, Any],
                progress: Callable[..., Any], closing: anyio.Event | None, *, runs: bool = True,
                ) -> types.CallToolResult:
    """Run the definition ``name`` until it rests; errors are results with ``is_error``, naming the instance."""
    if name not in runtime.assembly.agent_definitions:
        known = ", ".join(sorted(runtime.assembly.agent_definitions)) or "none"
        return _error(f"unknown tool {name!r}: the tools are the registered agents ({known})")
    prompt, inputs = arguments.get("prompt"), arguments.get("inputs")
    if not isinstance(prompt, str) or not prompt:
        return _error("'prompt' must be a non-empty string")
    if inputs is not None and not isinstance(inputs, Mapping):
        return _error("'inputs' must be an object of the definition's inputs")
    try:
        started = await start(runtime, name, inputs, prompt, runs=runs)
    except ConfigError as exc:
        return _error(f"the agent {name!r} cannot start: {exc}")
    async with anyio.create_task_group() as tg:
        if started.run is not None:  # ends by itself once the run rests and its events are sent
            tg.start_soon(_report, started.run, progress)
        rested = await started.rest(runtime, closing)
        if rested is None:
            tg.cancel_scope.cancel()
    if rested is None:
        return _error(f"the server is shutting down; the instance {started.instance_id} is kept, and "
                      "`loopwright resume` continues it", {"instanceId": started.instance_id, "state": "running"})
    run, result = rested
    return _result(result, question_of(run))


async def _report(run: AgentRun, progress: Callable[..., Any]) -> None:
    """Send one progress notification per finished turn and per tool call started, until the run rests."""
    step = 0
    async for event in run.events():
        if event.kind not in _PROGRESS_KINDS:
            continue
        step += 1
        what = f"turn {event.turn} done" if event.kind == "usage" else f"calling {event.data.get('name')}"
        try:
            await progress(step, None, f"{run.instance_id}: {what}")
        except Exception:  # noqa: BLE001 - a client gone away loses its progress, not the call's result
            _log.debug("progress notification for %s not sent", run.instance_id, exc_info=True)


def _result(result: AgentResult, question: str | None = None) -> types.CallToolResult:
    """Return the tool result of a resting instance (``question``: of the ``ask_user`` call it waits on)."""
    pending = [{"toolCallId": p.tool_call_id, "digest": approval_digest(p), "tool": p.tool,
                "arguments": dict(p.arguments)} for p in result.pending_approvals if p.decision is None]
    structured = {"instanceId": result.instance_id, "state": result.state.value,
                  "stopReason": result.stop_reason.value if result.stop_reason else None,
                  "text": result.text, "pendingApprovals": pending, "question": question}
    if result.state is State.ERROR or result.cancelled:
        why = "was cancelled" if result.cancelled else f"failed: {result.error}"
        return _error(f"the agent {why} (instance {result.instance_id})", structured)
    if result.state is State.WAITING_FOR_APPROVAL:
        held = "; ".join(f"{p['tool']} {json.dumps(p['arguments'], sort_keys=True)} "
                         f"(call {p['toolCallId']}, digest {p['digest']})" for p in pending)
        text = (f"The agent is waiting for approval before it goes on (instance {result.instance_id}). Held: "
                f"{held}. Decide through the loopwright serve API (with the digest) or "
                f"`loopwright approve {result.instance_id} --call CALL_ID --digest DIGEST`.")
    elif question:
        text = (f"The agent asks: {question} (instance {result.instance_id}; answer it with "
                f"`loopwright message {result.instance_id} TEXT` or the serve API)")
    else:
        text = result.text or ""
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=structured)


def _error(message: str, structured: Mapping[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True,
                                structured_content=dict(structured) if structured else None)


class McpSurface:
    """The ``/mcp`` mount: streamable HTTP over :func:`build_server`, each request authorised with ``run``."""

    name = "mcp"

    def __init__(self) -> None:
        self._manager: StreamableHTTPSessionManager | None = None

    def _session_manager(self, ctx: ServeContext) -> StreamableHTTPSessionManager:
        if self._manager is None:
            # No transport_security: tokens, and loopback only without them, are the serve app's
            # rules for every surface alike (docs/serve.md), and --host may be any address.
            server = build_server(ctx.runtime, ctx.streams.closing, runs=ctx.settings.run)
            self._manager = StreamableHTTPSessionManager(app=server)
        return self._manager

    def routes(self, ctx: ServeContext) -> list[BaseRoute]:
        """Return the ``/mcp`` route (an ASGI endpoint: the SDK answers its GET, POST and DELETE)."""
        return [Route("/mcp", _Endpoint(ctx, self._session_manager(ctx)))]

    @asynccontextmanager
    async def lifespan(self, ctx: ServeContext) -> AsyncIterator[None]:
        """Run the SDK's session manager (its task group holds the sessions) while the app runs."""
        async with self._session_manager(ctx).run():
            yield


class _Endpoint:
    """The ASGI app at ``/mcp``: authorise the request with ``run``, then hand it to the SDK."""

    def __init__(self, ctx: ServeContext, manager: StreamableHTTPSessionManager) -> None:
        self.ctx = ctx
        self.manager = manager

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        try:
            principal = await self.ctx.authorize(Request(scope, receive), Scope.RUN)
        except ProblemError as exc:
            await exc.response()(scope, receive, send)
            return
        # The SDK binds a session to the principal that opened it (a session id is no
        # credential): it compares the user it finds in the ASGI scope.
        token = AccessToken(token="", client_id=principal.name, scopes=[Scope.RUN.value])
        await self.manager.handle_request({**scope, "user": AuthenticatedUser(token)}, receive, send)


async def serve_stdio(config: str | None) -> None:
    """Serve the assembly's registered definitions over stdio until the client closes the pipe.

    :param config: The assembly file (``None``: ``./loopwright.yaml`` when it exists, else defaults).
    """
    from mcp.server.stdio import stdio_server  # noqa: PLC0415 - only this command needs the stdio transport

    async with Runtime.from_file(config) as runtime, stdio_server() as (read, write):
        server = build_server(runtime)
        await server.run(read, write, server.create_initialization_options())

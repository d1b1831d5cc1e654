"""The plugin object: connects to MCP servers and registers their tools.

The ``mcp`` SDK runs in one background thread per :class:`MCPServers`, on an asyncio event
loop of its own (an anyio blocking portal). That is what lets the sync
``loopwright_register_tools`` hook list tools while the runtime's event loop is running, and
what keeps a server's session open across tool calls, runs and runtimes: a session is entered
and left by a task of that loop, never by the task of one tool call. The runtime's side only
awaits a thread (``anyio.to_thread``), so it works under asyncio and trio alike.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.from_thread
import anyio.to_thread

from loopwright import Tool, hookimpl
from loopwright.errors import PluginError
from loopwright_mcp._config import ServerConfig, load_servers, parse_servers
from loopwright_mcp._results import result_value, schema_of, tool_name

__all__ = ["MCPServers"]

#: Seconds a server may take to start, answer the handshake and list its tools.
CONNECT_TIMEOUT = 30.0
#: Seconds a call may wait for its answer when the server sets no ``timeout``; the loop's own
#: per-tool timeout (60 s by default) ends the call long before.
_CALL_READ_TIMEOUT = 24 * 3600.0


class MCPServers:
    """A plugin registering the tools of MCP servers, named ``SERVER__TOOL``.

    Register it as a plugin object: ``Runtime(assembly, plugins=[servers])``. When the runtime
    loads plugins, each server is connected and asked for its tools (once per object: other
    runtimes reuse the list). The sessions stay open for the tools' calls until :meth:`close`
    (or ``async with servers``, or :meth:`aclose`); at interpreter exit they are closed too.

    :param servers: ``{NAME: {...}}`` (or ``{"mcpServers": {NAME: {...}}}``), or
        :class:`~loopwright_mcp.ServerConfig` objects. The keys are in ``docs/tools/mcp.md``.
    :param connect_timeout: Seconds a server may take to start and list its tools.
    """

    def __init__(
        self, servers: Mapping[str, Any] | Sequence[ServerConfig], *, connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        if isinstance(servers, Mapping):
            self.servers: tuple[ServerConfig, ...] = parse_servers(servers)
        else:
            self.servers = tuple(servers)
        self.connect_timeout = connect_timeout
        self._tools: tuple[Tool, ...] | None = None
        self._conns = _Connections(connect_timeout)
        self._finalizer = weakref.finalize(self, self._conns.close)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **kwargs: Any) -> Self:
        """Read the servers from a JSON or YAML file (``{mcpServers: {NAME: {...}}}``)."""
        return cls(load_servers(Path(path)), **kwargs)

    def __repr__(self) -> str:
        return f"<MCPServers {', '.join(s.name for s in self.servers)}>"

    # -- the plugin -------------------------------------------------------------------------

    @hookimpl
    def loopwright_register_tools(self, register: Callable[..., None]) -> None:
        """Register every server's tools (connecting to the servers on first use)."""
        register(*self.tools())

    def tools(self) -> tuple[Tool, ...]:
        """Return the servers' tools as loopwright tools; connect and list them the first time.

        Blocks while servers start. Call it from a thread without an event loop, or accept
        that the loop waits (as it does while a runtime loads plugins).

        :raises PluginError: A server could not be reached, or lists a tool loopwright cannot use.
        """
        if self._tools is None:
            tools: list[Tool] = []
            for server in self.servers:
                tools.extend(self._server_tools(server))
            self._tools = tuple(tools)
        return self._tools

    def _server_tools(self, server: ServerConfig) -> list[Tool]:
        try:
            listed = self._conns.list_tools(server)
        except Exception as exc:
            raise PluginError(f"MCP server {server.name!r}: could not list its tools: {_message(exc)}") from exc
        if server.tools is not None:
            missing = sorted(set(server.tools) - {t.name for t in listed})
            if missing:
                raise PluginError(f"MCP server {server.name!r} has no tool {', '.join(missing)}; "
                                  f"it has: {', '.join(sorted(t.name for t in listed))}")
            listed = [t for t in listed if t.name in server.tools]
        out = []
        for mcp_tool in listed:
            try:
                out.append(Tool(
                    name=tool_name(server.name, mcp_tool.name),
                    description=mcp_tool.description or mcp_tool.title or "",
                    parameters=schema_of(mcp_tool.input_schema),
                    function=self._caller(server, mcp_tool.name),
                    parallel_safe=server.parallel_for(mcp_tool.name),
                    requires_approval=server.approval_for(mcp_tool.name),
                    timeout=server.timeout,
                ))
            except Exception as exc:
                raise PluginError(f"MCP server {server.name!r}: tool {mcp_tool.name!r} cannot be used: "
                                  f"{_message(exc)}") from exc
        return out

    def _caller(self, server: ServerConfig, name: str) -> Callable[..., Any]:
        conns = self._conns

        async def call_mcp_tool(**arguments: Any) -> Any:
            return result_value(await conns.call(server, name, arguments))

        call_mcp_tool.__qualname__ = f"{server.name}.{name}"
        return call_mcp_tool

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close every session (stopping stdio servers) and the background thread.

        The servers connect again if a tool is called afterwards.
        """
        self._conns.close()

    async def aclose(self) -> None:
        """Close every session, without blocking the event loop."""
        await anyio.to_thread.run_sync(self._conns.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        with anyio.CancelScope(shield=True):
            await self.aclose()


class _Connections:
    """The background event loop and the open session of each server (thread-safe)."""

    def __init__(self, connect_timeout: float) -> None:
        self._timeout = connect_timeout
        self._lock = threading.Lock()
        self._portal_cm: Any = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._server_locks: dict[str, threading.Lock] = {}
        self._open: dict[str, tuple[Any, Any]] = {}  # name -> (sync context manager, mcp Client)

    def _get_portal(self) -> anyio.from_thread.BlockingPortal:
        with self._lock:
            if self._portal is None:
                cm = anyio.from_thread.start_blocking_portal("asyncio", name="loopwright-mcp")
                self._portal = cm.__enter__()
                self._portal_cm = cm
            return self._portal

    def client(self, server: ServerConfig) -> tuple[anyio.from_thread.BlockingPortal, Any]:
        """Return the portal and the server's open client, connecting first if needed (blocks)."""
        portal = self._get_portal()
        with self._lock:
            lock = self._server_locks.setdefault(server.name, threading.Lock())
        with lock:
            hit = self._open.get(server.name)
            if hit is not None:
                return portal, hit[1]
            cm = portal.wrap_async_context_manager(_client_cm(server, self._timeout))
            client = cm.__enter__()
            self._open[server.name] = (cm, client)
            return portal, client

    def list_tools(self, server: ServerConfig) -> list[Any]:
        """Connect (if needed) and return every tool the server lists, following pagination."""
        portal, client = self.client(server)
        return portal.call(_list_all, client)

    async def call(self, server: ServerConfig, name: str, arguments: Mapping[str, Any]) -> Any:
        """Call the server's tool ``name`` and return its ``CallToolResult``.

        Awaited on the runtime's event loop (asyncio or trio); the call itself runs on the
        background loop, and is cancelled there when the awaiting task is cancelled (timeout).
        A call that fails for another reason than the server's answer drops the session, so the
        next call connects again.
        """
        portal, client = await anyio.to_thread.run_sync(self.client, server, abandon_on_cancel=True)
        timeout = server.timeout + 1 if server.timeout else _CALL_READ_TIMEOUT
        future = portal.start_task_soon(_call, client, name, dict(arguments), timeout)
        try:
            return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        except _ServerAnswer as exc:
            raise exc.error from None
        except Exception:
            await anyio.to_thread.run_sync(self.drop, server.name)
            raise
        finally:
            if not future.done():
                future.cancel()

    def drop(self, name: str) -> None:
        """Close one server's session (it reconnects on the next call)."""
        with self._lock:
            hit = self._open.pop(name, None)
        if hit is not None:
            with contextlib.suppress(Exception):
                hit[0].__exit__(None, None, None)

    def close(self) -> None:
        """Close every session, then stop the background loop."""
        for name in list(self._open):
            self.drop(name)
        with self._lock:
            cm, self._portal_cm, self._portal = self._portal_cm, None, None
        if cm is not None:
            with contextlib.suppress(Exception):
                cm.__exit__(None, None, None)


class _ServerAnswer(Exception):  # noqa: N818 - a wrapper, not an error of its own
    """Carries an error the server answered (the session is fine) out of the background loop."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@contextlib.asynccontextmanager
async def _client_cm(server: ServerConfig, read_timeout: float) -> AsyncIterator[Any]:
    """Open an ``mcp.Client`` for ``server``; ``mcp`` is imported here, on first connection."""
    from mcp import Client, StdioServerParameters  # noqa: PLC0415 - mcp costs about 1 s to import

    target: Any
    if server.transport == "stdio":
        target = StdioServerParameters(command=server.command or "", args=list(server.args),
                                       env=dict(server.env) if server.env is not None else None, cwd=server.cwd)
    elif server.transport == "sse":
        from mcp.client.sse import sse_client  # noqa: PLC0415

        target = sse_client(server.url or "", headers=dict(server.headers or {}))
    else:
        target = _http(server.url or "", server.headers) if server.headers else server.url
    async with Client(target, read_timeout_seconds=read_timeout) as client:
        yield client


@contextlib.asynccontextmanager
async def _http(url: str, headers: Mapping[str, str]) -> AsyncIterator[Any]:
    """Open a streamable HTTP transport that sends ``headers`` with every request."""
    from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415
    from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: PLC0415 - the SDK's own defaults

    async with create_mcp_http_client(headers=dict(headers)) as http, \
            streamable_http_client(url, http_client=http) as streams:
        yield streams


async def _list_all(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


async def _call(client: Any, name: str, arguments: dict[str, Any], read_timeout: float) -> Any:
    from mcp import MCPError  # noqa: PLC0415 - imported already: a client exists

    try:
        return await client.call_tool(name, arguments, read_timeout_seconds=read_timeout)
    except MCPError as exc:
        from loopwright.errors import ToolError  # noqa: PLC0415

        # A JSON-RPC error answer (unknown tool, invalid params): the session is fine, and the
        # model can act on the message.
        raise _ServerAnswer(ToolError(f"the MCP server answered with an error: {exc}")) from exc


def _message(exc: BaseException) -> str:
    """Return an exception's message, looking inside exception groups (anyio task groups)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"

"""The ASGI app: the surfaces' routes, the body bound, CORS, problem documents, and the lifespan."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from loopwright import Runtime
from loopwright_serve._context import ServeContext
from loopwright_serve._problems import ProblemError, problem
from loopwright_serve._settings import ServerSettings
from loopwright_serve._surfaces import SURFACES

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from loopwright_serve._surface import Surface

__all__ = ["MAX_BODY_DEPTH", "BodyLimit", "JSONDepth", "build_app", "load_surfaces"]

log = logging.getLogger("loopwright.serve")

#: The optional packages a surface may need, by the top-level module a missing import names.
_EXTRAS: Mapping[str, str] = {"a2a": "loopwright[a2a]", "ag_ui": "loopwright[agui]"}


def build_app(
    source: ServeContext | Runtime | str | os.PathLike[str] | None = None, *,
    surfaces: Sequence[str] = SURFACES, environ: Mapping[str, str] | None = None,
) -> Starlette:
    """Return the server's ASGI app.

    :param source: A :class:`ServeContext`; or a runtime (not yet open) whose assembly's
        ``server:`` key gives the settings; or an assembly file (``None``: ``./loopwright.yaml``
        if it exists, else the defaults).
    :param surfaces: ``"module:Class"`` references of the surfaces to mount, in order.
    :param environ: Where tokens are read (default ``os.environ``).
    :return: A Starlette app whose lifespan opens the runtime, then enters each surface's
        lifespan, and on the way out ends the event streams and closes them in reverse order.
        ``app.state.ctx`` is the :class:`ServeContext`.
    :raises ConfigError: A token's variable is unset (see :meth:`ServerSettings.from_runtime`),
        or the assembly is invalid.
    """
    if isinstance(source, ServeContext):
        ctx = source
    else:
        runtime = source if isinstance(source, Runtime) else Runtime.from_file(_assembly_file(source))
        ctx = ServeContext(runtime, ServerSettings.from_runtime(runtime, environ))
    built = load_surfaces(surfaces)
    routes: list[BaseRoute] = [route for surface in built for route in surface.routes(ctx)]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with ctx.runtime, contextlib.AsyncExitStack() as stack:
            live = ctx.runtime.register_plugin(ctx.live, "loopwright-serve-live")  # stream deltas (issue 27)
            stack.callback(ctx.runtime.unregister_plugin, live)
            for surface in built:
                await stack.enter_async_context(surface.lifespan(ctx))
            try:
                yield
            finally:
                ctx.streams.closing.set()

    middleware = [Middleware(BodyLimit, limit=ctx.settings.max_body_bytes, timeout=ctx.settings.body_timeout)]
    if ctx.settings.cors_origins:
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=list(ctx.settings.cors_origins), allow_credentials=False,
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"], max_age=ctx.settings.cors_max_age))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers={
        ProblemError: _problem_error, HTTPException: _http_error, Exception: _server_error})
    app.state.ctx = ctx
    return app


def _assembly_file(source: str | os.PathLike[str] | None) -> str | os.PathLike[str] | None:
    if source is None and os.path.isfile("loopwright.yaml"):  # noqa: PTH113 - the CLI's default, as it says it
        return "loopwright.yaml"
    return source


def load_surfaces(refs: Sequence[str]) -> list[Surface]:
    """Import and build each ``"module:Class"``; leave out (and log) one whose optional package is missing.

    :raises ImportError: A surface's own module (or a required package) cannot be imported.
    """
    built: list[Surface] = []
    for ref in refs:
        module_name, _, class_name = ref.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            top = (exc.name or "").partition(".")[0]
            if top not in _EXTRAS:
                raise
            log.warning("loopwright serve: surface %s left out: it needs the package %r "
                        '(pip install "%s")', ref, top, _EXTRAS[top])
            continue
        built.append(getattr(module, class_name)())
    return built


async def _problem_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProblemError)  # noqa: S101 - registered for this type only
    return exc.response()


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)  # noqa: S101
    from http import HTTPStatus  # noqa: PLC0415 - only on an error

    title = HTTPStatus(exc.status_code).phrase
    detail = exc.detail if exc.detail != title else ""
    return problem(exc.status_code, title, detail, headers=exc.headers)


async def _server_error(_request: Request, exc: Exception) -> Response:
    log.error("loopwright serve: unexpected error", exc_info=exc)
    return problem(500, "Internal Server Error", "the server failed; its log says why")


class BodyLimit:
    """ASGI middleware: refuse a request body larger than ``limit`` bytes with 413, before reading it whole.

    A declared ``Content-Length`` above the limit is refused at once; a body sent without one
    (chunked) is counted as it arrives, and refused when it passes the limit. A body that takes
    longer than ``timeout`` seconds to arrive, counted from the app's first read, is refused
    with 408 (``server.bodyTimeout``); reads after the body's end (an event stream waiting for
    the client to go away) are not bounded.
    """

    def __init__(self, app: ASGIApp, limit: int, timeout: float = 30.0) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self._refused_length(scope)
        if refused is not None:
            await refused(scope, receive, send)
            return
        seen = 0
        # Whatever its Content-Type says: the surfaces read every body as JSON (the OpenAI-compatible
        # and A2A ones a text/plain body too, which nested 10,000 deep was a 500 before).
        depth = JSONDepth()
        deadline: float | None = None
        body_done = False

        async def bounded() -> Message:
            nonlocal seen, deadline, body_done
            if body_done:
                return await receive()
            if deadline is None:
                deadline = anyio.current_time() + self.timeout
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as late:
                message = await receive()
            if late.cancelled_caught:
                raise ProblemError(408, "Request Timeout", f"the request body did not arrive within "
                                   f"{self.timeout:g} s (server.bodyTimeout)", limit=self.timeout)
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                seen += len(chunk)
                if seen > self.limit:
                    raise ProblemError(413, "Content Too Large", self._detail(), limit=self.limit)
                if not depth.feed(chunk):
                    raise ProblemError(400, "Malformed JSON", f"the request body nests objects and arrays more "
                                       f"than {MAX_BODY_DEPTH} deep", limit=MAX_BODY_DEPTH)
            return message

        await self.app(scope, bounded, send)

    def _refused_length(self, scope: Scope) -> Response | None:
        """Return the answer to a declared ``Content-Length`` that is no number or over the limit, else None."""
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is None:
            return None
        try:
            size = int(declared)
        except ValueError:
            size = -1
        if size < 0:
            return problem(400, "Bad Request", "Content-Length is not a number")
        return self._too_large(size) if size > self.limit else None

    def _detail(self, size: Any = None) -> str:
        told = f"of {size} bytes " if size is not None else ""
        return f"the request body {told}is larger than the {self.limit} bytes this server accepts (server.maxBodyBytes)"

    def _too_large(self, size: int) -> Response:
        return problem(413, "Content Too Large", self._detail(size), limit=self.limit)


#: The deepest nesting of objects and arrays a JSON request body may have (400 beyond). Tool
#: arguments nest at most 64 deep (:data:`loopwright._arguments.MAX_ARGUMENT_DEPTH`), which leaves
#: room for any surface's envelope around them.
MAX_BODY_DEPTH = 128


class JSONDepth:
    """The nesting depth of a JSON text fed in chunks, counted in one linear pass without recursion.

    Brackets inside strings (escapes included) do not count, so the count is the one a JSON parser
    would reach; a text that is not JSON at all is left for the parser to refuse. Each byte costs
    a constant, so any body is checked in time linear in its size and constant memory, before a
    recursive parser could run out of stack on it.
    """

    __slots__ = ("_depth", "_escaped", "_in_string")

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, chunk: bytes) -> bool:
        """Count ``chunk``; return False once the text has nested deeper than :data:`MAX_BODY_DEPTH`."""
        depth, in_string = self._depth, self._in_string
        skip = 0 if self._escaped else -1  # the index of a byte a backslash escapes
        self._escaped = False
        for found in _JSON_SPECIAL.finditer(chunk):  # only quotes, backslashes and brackets
            at = found.start()
            if at == skip:
                continue
            byte = chunk[at]
            if in_string:
                if byte == _BACKSLASH:  # it escapes the byte after it
                    skip = at + 1
                    self._escaped = skip == len(chunk)
                elif byte == _QUOTE:
                    in_string = False
            elif byte == _QUOTE:
                in_string = True
            elif byte in (0x5B, 0x7B):  # [ {
                depth += 1
                if depth > MAX_BODY_DEPTH:
                    return False
            elif byte in (0x5D, 0x7D) and depth:
                depth -= 1
        self._depth, self._in_string = depth, in_string
        return True


_BACKSLASH, _QUOTE = 0x5C, 0x22
_JSON_SPECIAL = re.compile(rb'["\\\[\]{}]')

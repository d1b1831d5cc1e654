"""loopwright-serve: ``loopwright serve``, an HTTP API over an assembly's store, and its surfaces.

:func:`build_app` returns a Starlette app: the ``/v1`` API (JSON with camelCase keys, as the
CLI's ``--json``; Server-Sent Events; RFC 9457 problem documents), ``/healthz`` and
``/openapi.json``, and the other surfaces named in ``loopwright_serve._surfaces.SURFACES``, each
a :class:`Surface`. Tokens and scopes come from the assembly's ``server:`` key
(:class:`ServerSettings`); without tokens the server listens on loopback only. The rules are in
``docs/serve.md``.
"""

from __future__ import annotations

from loopwright_serve._app import build_app
from loopwright_serve._auth import Principal, Scope
from loopwright_serve._context import ServeContext
from loopwright_serve._problems import ProblemError, problem
from loopwright_serve._server import run_server
from loopwright_serve._settings import ServerSettings, TokenSpec
from loopwright_serve._surface import Surface

__all__ = [
    "Principal",
    "ProblemError",
    "Scope",
    "ServeContext",
    "ServerSettings",
    "Surface",
    "TokenSpec",
    "build_app",
    "problem",
    "run_server",
]

"""loopwright-serve: ``loopwright serve``, an HTTP API over an assembly's store, and its surfaces.

:func:`build_app` returns a Starlette app: the ``/v1`` API (JSON with camelCase keys, as the
CLI's ``--json``; Server-Sent Events; RFC 9457 problem documents), ``/healthz`` and
``/openapi.json``, and the other surfaces named in ``loopwright_serve._surfaces.SURFACES``, each
a :class:`Surface`. Tokens and scopes come from the assembly's ``server:`` key
(:class:`ServerSettings`); without tokens the server listens on loopback only. The rules are in
``docs/serve.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loopwright_serve._app import build_app
    from loopwright_serve._auth import Principal, Scope
    from loopwright_serve._context import ServeContext
    from loopwright_serve._problems import ProblemError, problem
    from loopwright_serve._server import run_server
    from loopwright_serve._settings import ServerSettings, TokenSpec
    from loopwright_serve._surface import Surface

#: Where each public name lives. This package is an entry point, and every run imports every
#: installed entry point (their hooks take part in every run): importing Starlette and uvicorn
#: here would cost every run a few hundred milliseconds for a server it does not start. The names
#: are imported on first access instead (PEP 562); ``dir()`` of the package does not list them,
#: so registering it as a plugin (which reads every attribute ``dir()`` lists) imports nothing.
_LAZY = {
    "Principal": "_auth",
    "ProblemError": "_problems",
    "Scope": "_auth",
    "ServeContext": "_context",
    "ServerSettings": "_settings",
    "Surface": "_surface",
    "TokenSpec": "_settings",
    "build_app": "_app",
    "problem": "_problems",
    "run_server": "_server",
}

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


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (see ``_LAZY``); raise AttributeError for others."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

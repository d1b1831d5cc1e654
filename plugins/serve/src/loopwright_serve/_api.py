"""The ``/v1`` API surface: instances, their events, records, messages, approvals and cancels.

Also ``/healthz`` and ``/openapi.json``. JSON keys are camelCase, as the CLI's ``--json``.
"""

from __future__ import annotations

import contextlib
from importlib.metadata import version
from typing import TYPE_CHECKING

from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from loopwright_serve._auth import Scope
from loopwright_serve._surface import null_lifespan

if TYPE_CHECKING:
    from starlette.requests import Request

    from loopwright_serve._context import ServeContext

__all__ = ["ApiSurface"]


class ApiSurface:
    """The ``/v1`` API, ``/healthz`` and ``/openapi.json`` (docs/serve.md lists every endpoint)."""

    name = "api"

    def routes(self, ctx: ServeContext) -> list[BaseRoute]:
        """Return the API's routes, bound to ``ctx``."""

        async def healthz(_request: Request) -> JSONResponse:
            return JSONResponse({"status": "ok", "version": version("loopwright-serve")})

        async def list_instances(request: Request) -> JSONResponse:
            await ctx.authorize(request, Scope.READ)
            return JSONResponse(await ctx.runtime.list_instances())

        return [
            Route("/healthz", healthz, methods=["GET"]),
            Route("/v1/instances", list_instances, methods=["GET"]),
        ]

    def lifespan(self, ctx: ServeContext) -> contextlib.AbstractAsyncContextManager[None]:  # noqa: ARG002
        """Hold nothing open."""
        return null_lifespan()

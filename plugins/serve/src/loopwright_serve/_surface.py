"""The seam every surface of the server is built on (the ``/v1`` API, the UI, the protocol mounts)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from loopwright_serve._context import ServeContext

__all__ = ["Surface", "null_lifespan"]


class Surface(Protocol):
    """One part of the server: its routes, and what it holds open while the server runs.

    A surface is a class named in :data:`loopwright_serve._surfaces.SURFACES` and built with no
    arguments. :func:`~loopwright_serve.build_app` mounts the routes of each, and enters each
    one's lifespan inside the app's own (after the runtime is open, before the first request).
    Handlers call :meth:`ServeContext.authorize` with the scope they need, and may raise
    :class:`~loopwright_serve.ProblemError` for any error.

    Attributes:
        name: A short name for logs (``api``, ``ui``, ``mcp`` ...).
    """

    name: str

    def routes(self, ctx: ServeContext) -> list[BaseRoute]:
        """Return the routes (or mounts) this surface serves."""
        ...  # pragma: no cover

    def lifespan(self, ctx: ServeContext) -> contextlib.AbstractAsyncContextManager[None]:
        """Return what runs while the server does (a task group, a session manager); see :func:`null_lifespan`."""
        ...  # pragma: no cover


@contextlib.asynccontextmanager
async def null_lifespan() -> AsyncIterator[None]:
    """Hold nothing open: the lifespan of a surface that needs none."""
    yield

"""The web control plane: the page at ``/ui`` and its static files, served from this package.

The page (``ui/`` beside this module: HTML, CSS and plain JavaScript modules, no build step) runs
in the browser and talks only to the ``/v1`` API, with the bearer token the person signs in with
in the ``Authorization`` header. Serving it needs no token: the files hold no data and no secret.

Every response carries a strict Content-Security-Policy: scripts and styles only from this
origin's files (no inline script, no ``eval``), connections only to this origin, nothing framed
or framing (``frame-ancestors 'none'``), and Trusted Types required, so that a string can never
be assigned as HTML (the page writes what models and tools wrote with ``textContent`` only).
Only the files shipped in ``ui/`` are served, looked up by exact name: a request path never
reaches the file system.
"""

from __future__ import annotations

import contextlib
import hashlib
from importlib import resources
from typing import TYPE_CHECKING

import attrs
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from loopwright_serve._problems import problem
from loopwright_serve._surface import null_lifespan

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.routing import BaseRoute

    from loopwright_serve._context import ServeContext

__all__ = ["CONTENT_SECURITY_POLICY", "UiSurface"]

#: The directives of the policy every ``/ui`` response carries.
_DIRECTIVES = (
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
    "require-trusted-types-for 'script'",
    "trusted-types 'none'",
)
#: The Content-Security-Policy of every ``/ui`` response.
CONTENT_SECURITY_POLICY = "; ".join(_DIRECTIVES)

_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-cache",
}

_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


@attrs.frozen(kw_only=True)
class _Asset:
    """One shipped file: its bytes, media type and entity tag."""

    body: bytes
    media_type: str
    etag: str


def _load_assets() -> dict[str, _Asset]:
    """Read the files of ``ui/`` (those with a known media type) into memory, by file name."""
    assets: dict[str, _Asset] = {}
    folder = resources.files("loopwright_serve") / "ui"
    for entry in folder.iterdir():
        suffix = entry.name[entry.name.rfind("."):] if "." in entry.name else ""
        media_type = _MEDIA_TYPES.get(suffix)
        if media_type is None or not entry.is_file():
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        assets[entry.name] = _Asset(body=body, media_type=media_type, etag=etag)
    if "index.html" not in assets:
        msg = "loopwright_serve is installed without its ui/index.html: the control plane cannot be served"
        raise RuntimeError(msg)
    return assets


def _not_found() -> Response:
    """Return the 404 problem document for a name that is not one of the shipped files."""
    return problem(404, "Not Found", "the control plane has no such file", headers=_HEADERS)


@attrs.frozen(kw_only=True)
class _Files:
    """The handlers over one set of loaded assets."""

    assets: dict[str, _Asset]

    def respond(self, request: Request, name: str) -> Response:
        """Return the asset ``name`` (304 when the client's copy is current), or a 404."""
        asset = self.assets.get(name)
        if asset is None:
            return _not_found()
        headers = {**_HEADERS, "ETag": asset.etag}
        if request.headers.get("if-none-match") == asset.etag:
            return Response(status_code=304, headers=headers)
        return Response(asset.body, media_type=asset.media_type, headers=headers)

    async def index(self, request: Request) -> Response:
        """``GET /ui/``: the page."""
        return self.respond(request, "index.html")

    async def asset(self, request: Request) -> Response:
        """``GET /ui/{name}``: one of the page's files, by exact name."""
        return self.respond(request, str(request.path_params["name"]))


async def _to_index(request: Request) -> Response:
    """``GET /ui``: redirect to ``ui/``, where the page's relative links resolve.

    The location is relative, so a reverse proxy may serve the whole server under a prefix.
    """
    del request
    return RedirectResponse("ui/", status_code=308, headers=_HEADERS)


async def _root(request: Request) -> Response:
    """``GET /``: a browser (``Accept`` names ``text/html``) is sent to the control plane; others get a 404 problem.

    An API client asking for JSON keeps a JSON answer, so ``/`` never turns into a page for programs.
    """
    accepts = request.headers.get("accept", "")
    if "text/html" in accepts.lower():
        return RedirectResponse("ui/", status_code=303, headers=_HEADERS)
    return problem(404, "Not Found", "nothing is served at /: the API is under /v1 (GET /openapi.json "
                   "describes it), the control plane at /ui/")


class UiSurface:
    """The ``ui`` surface: the control plane page under ``/ui``.

    It adds no API of its own and needs nothing at start-up or shutdown: the page uses ``/v1``.
    """

    name = "ui"

    def routes(self, ctx: ServeContext) -> list[BaseRoute]:
        """Return the routes of ``/`` (browsers: to ``ui/``), ``/ui``, ``/ui/`` and ``/ui/{name}`` over ``ui/``."""
        del ctx
        files = _Files(assets=_load_assets())
        return [
            Route("/", _root, methods=["GET"]),
            Route("/ui", _to_index, methods=["GET"]),
            Route("/ui/", files.index, methods=["GET"]),
            Route("/ui/{name}", files.asset, methods=["GET"]),
        ]

    def lifespan(self, ctx: ServeContext) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold nothing open."""
        del ctx
        return null_lifespan()

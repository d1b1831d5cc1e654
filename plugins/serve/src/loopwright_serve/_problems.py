"""RFC 9457 problem documents: the one shape of every error the server answers with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

__all__ = ["PROBLEM_MEDIA_TYPE", "ProblemError", "problem"]

#: The media type of a problem document (RFC 9457, section 3).
PROBLEM_MEDIA_TYPE = "application/problem+json"


class ProblemResponse(JSONResponse):
    """A JSON response whose media type is ``application/problem+json``."""

    media_type = PROBLEM_MEDIA_TYPE


def problem(status: int, title: str, detail: str = "", *, headers: Mapping[str, str] | None = None,
            **extra: Any) -> JSONResponse:
    """Return the problem document ``{type, title, status, detail, ...extra}`` as a response.

    :param status: The HTTP status, repeated in the body as ``status``.
    :param title: A short summary that is the same for every problem of its kind.
    :param detail: What went wrong this time (the instance, the call, the field).
    :param headers: Extra response headers (``WWW-Authenticate`` for a 401).
    :param extra: Extension members, camelCase (``instanceId``, ``errors`` ...).
    """
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body.update(extra)
    return ProblemResponse(body, status_code=status, headers=dict(headers or {}))


class ProblemError(Exception):
    """Raised by a handler (or :meth:`ServeContext.authorize`) to answer with a problem document.

    The app's exception handler turns it into :func:`problem`'s response, so any surface may raise it.

    Attributes:
        status: The HTTP status.
        title: The summary of its kind.
        detail: What went wrong this time.
        headers: Extra response headers.
        extra: Extension members of the document.
    """

    def __init__(self, status: int, title: str, detail: str = "", *, headers: Mapping[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(f"{status} {title}: {detail}" if detail else f"{status} {title}")
        self.status = status
        self.title = title
        self.detail = detail
        self.headers: Mapping[str, str] = dict(headers or {})
        self.extra: Mapping[str, Any] = extra

    def response(self) -> JSONResponse:
        """Return the problem document this error stands for."""
        return problem(self.status, self.title, self.detail, headers=self.headers, **self.extra)

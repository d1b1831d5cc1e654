"""Who is asking, and what they may do: scopes and principals."""

from __future__ import annotations

import enum

import attrs

__all__ = ["LOCAL", "Principal", "Scope"]


class Scope(enum.StrEnum):
    """What a token may do. ``admin`` implies every other scope.

    * ``read``: list and show instances, read their records, follow their events.
    * ``run``: start instances, send them messages, cancel them.
    * ``approve``: approve and deny held tool calls.
    * ``admin``: all of the above (and whatever later surfaces reserve to it).
    """

    READ = "read"
    RUN = "run"
    APPROVE = "approve"
    ADMIN = "admin"


@attrs.frozen
class Principal:
    """The caller of one request, as its token names it.

    Attributes:
        name: The token's name from ``server.tokens`` (``"local"`` for a server without tokens).
            Decisions record it as ``token:NAME``.
        scopes: What it may do.
    """

    name: str
    scopes: frozenset[Scope]

    def allows(self, scope: Scope) -> bool:
        """Whether this principal has ``scope``, directly or through ``admin``."""
        return Scope.ADMIN in self.scopes or scope in self.scopes

    @property
    def source(self) -> str:
        """How decisions and messages it makes are recorded: ``token:NAME`` (``local`` without tokens)."""
        return "local" if self.name == "local" else f"token:{self.name}"


#: Every request to a server without tokens (bound to loopback only): every scope.
LOCAL = Principal("local", frozenset(Scope))

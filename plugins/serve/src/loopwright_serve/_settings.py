"""The assembly's ``server:`` key, read and checked: tokens, ``run``, CORS and the bounds."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from loopwright import parse_duration
from loopwright.errors import ConfigError
from loopwright_serve._auth import Scope

if TYPE_CHECKING:
    from loopwright import Runtime

__all__ = ["MIN_TOKEN_LENGTH", "ServerSettings", "TokenSpec", "is_loopback"]

#: The shortest token accepted: a shorter one is guessable, and refused when the server starts.
MIN_TOKEN_LENGTH = 16


@attrs.frozen
class TokenSpec:
    """One entry of ``server.tokens``, with its secret read from the environment.

    Attributes:
        name: The token's name, recorded with what it does (``token:NAME``).
        token_env: The environment variable the secret was read from.
        scopes: What it may do.
        secret: The token itself (never shown: left out of ``repr``).
    """

    name: str
    token_env: str
    scopes: frozenset[Scope]
    secret: str = attrs.field(repr=False)


@attrs.frozen(kw_only=True)
class ServerSettings:
    """What ``server:`` in the assembly says (docs/serve.md).

    Attributes:
        tokens: The tokens accepted. Empty: the server binds only to loopback, and every request
            has every scope (the principal ``local``).
        run: Whether the server runs the instances it starts (``True``), or only writes the
            work for ``loopwright worker`` processes (``False``).
        cors_origins: The origins browsers may call from; empty means no CORS headers at all.
        cors_max_age: Seconds a preflight answer may be cached.
        max_body_bytes: The largest request body accepted (413 beyond, before it is read whole).
        max_event_streams: The most SSE connections open at once (503 beyond).
        max_connections: The most connections open at once (one more is answered 503 and closed).
        header_timeout: Seconds a client has to send a request's head (408 and closed beyond).
        body_timeout: Seconds a client has to send a request's body once its head is in (408 beyond).
    """

    tokens: tuple[TokenSpec, ...] = ()
    run: bool = True
    cors_origins: tuple[str, ...] = ()
    cors_max_age: int = 600
    max_body_bytes: int = 1024 * 1024
    max_event_streams: int = 256
    max_connections: int = 1024
    header_timeout: float = 10.0
    body_timeout: float = 30.0

    @classmethod
    def from_runtime(cls, runtime: Runtime, environ: Mapping[str, str] | None = None) -> ServerSettings:
        """Read the runtime's assembly ``server:`` key (already checked against the schema).

        :param environ: Where ``tokenEnv`` variables are read (default ``os.environ``).
        :raises ConfigError: A token's variable is unset or shorter than 16 characters, two tokens
            share a name or a secret, or a token is named ``local``; placed at file:line:column.
        """
        env = os.environ if environ is None else environ
        data: Mapping[str, Any] = runtime.assembly.server or {}
        tokens: list[TokenSpec] = []
        names: set[str] = set()
        secrets: set[str] = set()
        for index, entry in enumerate(data.get("tokens") or ()):
            at = ("server", "tokens", index)
            name, var = str(entry["name"]), str(entry["tokenEnv"])
            if name == "local" or name in names:
                why = "is reserved for a server without tokens" if name == "local" else "is used by another token"
                raise runtime.assembly_error(f"token name {name!r} {why}", (*at, "name"))
            secret = env.get(var)
            if not secret:
                raise runtime.assembly_error(
                    f"token {name!r}: the environment variable {var} (tokenEnv) is not set", (*at, "tokenEnv"))
            if len(secret) < MIN_TOKEN_LENGTH:
                raise runtime.assembly_error(
                    f"token {name!r}: the token in {var} is shorter than {MIN_TOKEN_LENGTH} characters",
                    (*at, "tokenEnv"))
            if secret in secrets:
                raise runtime.assembly_error(f"token {name!r}: {var} holds the same token as another entry",
                                             (*at, "tokenEnv"))
            names.add(name)
            secrets.add(secret)
            tokens.append(TokenSpec(name, var, frozenset(Scope(s) for s in entry["scopes"]), secret))
        cors: Mapping[str, Any] = data.get("cors") or {}
        return cls(
            tokens=tuple(tokens),
            run=bool(data.get("run", True)),
            cors_origins=tuple(cors.get("origins") or ()),
            cors_max_age=int(cors.get("maxAge", 600)),
            max_body_bytes=int(data.get("maxBodyBytes", 1024 * 1024)),
            max_event_streams=int(data.get("maxEventStreams", 256)),
            max_connections=int(data.get("maxConnections", 1024)),
            header_timeout=parse_duration(data.get("headerTimeout", 10.0)),
            body_timeout=parse_duration(data.get("bodyTimeout", 30.0)),
        )

    def check_host(self, host: str) -> None:
        """Refuse to listen on ``host`` when it is not loopback and no token is configured.

        :raises ConfigError: (exit 2) a non-loopback host without ``server.tokens``.
        """
        if not self.tokens and not is_loopback(host):
            raise ConfigError(
                f"refusing to listen on {host!r} without tokens: anyone who can reach it could start agents "
                "and approve their calls. Add server: {tokens: [{name, tokenEnv, scopes}]} to the assembly "
                "(docs/serve.md), or listen on 127.0.0.1")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names the loopback interface only (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False

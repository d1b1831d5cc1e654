"""Reading a provider's options (:class:`OptionReader`, :class:`HTTPOptions`) and building its client."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self, overload

import attrs
import httpx

from loopwright._duration import parse_duration as _parse_duration
from loopwright._http._transports import (
    DEFAULT_POOL_SHARDS,
    AiohttpTransport,
    ShardedTransport,
    environment_proxy,
    ssl_context,
)
from loopwright.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from loopwright.abc import ProviderSettings

__all__ = [
    "TRANSPORTS",
    "HTTPOptions",
    "OptionReader",
    "build_transport",
    "check_base_url",
    "make_client",
    "override_headers",
    "parse_duration",
    "require_api_key",
    "resolve_api_key",
    "transport_kind",
]

#: installed), ``httpcore`` otherwise (see the module docstring).
TRANSPORTS = ("auto", "aiohttp", "httpcore")


def parse_duration(value: Any) -> float | None:
    """Return ``value`` as seconds, or ``None`` if it is not a duration.

    The grammar is loopwright's one duration grammar (:func:`loopwright.parse_duration`): a finite
    number of seconds (>= 0, not a boolean), a numeric string, or number-unit pairs with units
    ``ms``, ``s``, ``m`` and ``h`` (``"500ms"``, ``"30s"``, ``"2m"``, ``"1m30s"``).
    """
    try:
        return _parse_duration(value)
    except ValueError:
        return None


class OptionReader:
    """Reads a provider's options, collecting every problem for one :class:`ConfigError`.

    Each reader method returns the value, or its default after recording a problem at the
    option's JSON path (``$.providers.NAME.KEY``); :meth:`check` raises them all at once::

        reader = OptionReader(settings)
        api = reader.choice("api", ("chat", "responses"), "chat")
        options = HTTPOptions.read(reader)
        reader.check()

    Attributes:
        name: The provider's name in the assembly.
        options: The options as written (``ProviderSettings.options``).
        problems: The problems found so far.

    """

    def __init__(self, settings: ProviderSettings) -> None:
        """Read the options of ``settings``."""
        self.name = settings.name
        self.options: Mapping[str, Any] = settings.options
        self.problems: list[ConfigProblem] = []

    def path(self, key: str) -> str:
        """Return the JSON path of option ``key``."""
        return f"$.providers.{self.name}.{key}"

    def problem(self, key: str, message: str) -> None:
        """Record a problem with option ``key``."""
        self.problems.append(ConfigProblem(message, path=self.path(key)))

    def check(self) -> None:
        """Raise the problems found, if any.

        :raises ConfigError: Naming the provider and listing every problem.
        """
        if self.problems:
            raise ConfigError(f"invalid options for provider {self.name!r}", problems=self.problems)

    @overload
    def integer(self, key: str, default: int, minimum: int, *, nullable: Literal[False] = False) -> int: ...

    @overload
    def integer(self, key: str, default: int | None, minimum: int, *, nullable: bool) -> int | None: ...

    def integer(self, key: str, default: int | None, minimum: int, *, nullable: bool = False) -> int | None:
        """Return option ``key``, an integer >= ``minimum`` (or ``None`` when ``nullable``)."""
        value = self.options.get(key, default)
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            null = " or null" if nullable else ""
            self.problem(key, f"must be an integer >= {minimum}{null}, not {value!r}")
            return default
        return value

    @overload
    def duration(self, key: str, default: float, *, nullable: Literal[False] = False) -> float: ...

    @overload
    def duration(self, key: str, default: float | None, *, nullable: bool) -> float | None: ...

    def duration(self, key: str, default: float | None, *, nullable: bool = False) -> float | None:
        """Return option ``key`` in seconds (see :func:`parse_duration`), or ``None`` when ``nullable``."""
        value = self.options.get(key, default)
        if value is None and nullable:
            return None
        seconds = parse_duration(value)
        if seconds is None:
            self.problem(key, f"must be a duration (seconds, or a string such as '500ms', '30s', '2m'), "
                              f"not {value!r}")
            return default
        return seconds

    def text(self, key: str, default: str | None = None) -> str | None:
        """Return option ``key``, a string, or ``default`` when it is absent."""
        value = self.options.get(key, default)
        if value is not None and not isinstance(value, str):
            self.problem(key, f"must be a string, not {value!r}")
            return default
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        """Return option ``key``, one of ``choices``."""
        value = self.options.get(key, default)
        if value not in choices:
            self.problem(key, f"must be one of {', '.join(choices)}, not {value!r}")
            return default
        return str(value)

    def headers(self, key: str = "headers") -> dict[str, str]:
        """Return option ``key``, a mapping of header names to strings (``{}`` when absent)."""
        headers = self.options.get(key) or {}
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            self.problem(key, "must map header names to strings")
            return {}
        return dict(headers)


@attrs.frozen(kw_only=True)
class HTTPOptions:
    """The options every HTTP provider takes (camelCase keys in the assembly).

    A provider with more options subclasses it (``@attrs.frozen(kw_only=True)``) and passes its
    own to :meth:`read`.

    Attributes:
        max_retries: ``maxRetries``: retries of a transient failure (default 2).
        retry_base_delay: ``retryBaseDelay``: first backoff delay (default 0.5 s).
        retry_max_delay: ``retryMaxDelay``: longest backoff delay (default 30 s).
        timeout: ``timeout``: read/write/pool timeout, ``None`` for none (default 600 s).
        connect_timeout: ``connectTimeout``: connect timeout (default 5 s).
        headers: ``headers``: extra request headers.
        max_connections: ``maxConnections``: most open connections (default 1000).
        max_keepalive_connections: ``maxKeepaliveConnections``: most idle connections kept
            (default: ``maxConnections``; see the module docstring for why); httpcore only
            (aiohttp keeps every idle connection until ``keepaliveExpiry``).
        keepalive_expiry: ``keepaliveExpiry``: how long an idle connection is kept (default 5 s).
        pool_shards: ``poolShards``: most connection pools to spread requests over (default 64;
            1 for a single plain pool); httpcore only.
        transport: ``transport``: the HTTP stack under httpx, one of :data:`TRANSPORTS`: ``auto``
            (default: :class:`AiohttpTransport` under asyncio when aiohttp is installed, else
            :class:`ShardedTransport`), ``aiohttp`` or ``httpcore``.
        proxy: ``proxy``: a proxy URL; by default the environment's (``HTTPS_PROXY`` ...).
        timeout_set: Whether ``timeout`` or ``connectTimeout`` was given (they then apply to
            an injected client too).

    """

    max_retries: int = 2
    retry_base_delay: float = 0.5
    retry_max_delay: float = 30.0
    timeout: float | None = 600.0
    connect_timeout: float | None = 5.0
    headers: Mapping[str, str] = attrs.field(factory=dict)
    max_connections: int | None = 1000
    max_keepalive_connections: int | None = None
    keepalive_expiry: float | None = 5.0
    pool_shards: int = DEFAULT_POOL_SHARDS
    transport: str = "auto"
    proxy: str | None = None
    timeout_set: bool = False

    @classmethod
    def read(cls, reader: OptionReader, **fields: Any) -> Self:
        """Read the shared options with ``reader`` and return them with ``fields`` (a subclass's own).

        Problems are recorded on ``reader``; call :meth:`OptionReader.check` afterwards.
        """
        opts = reader.options
        headers = reader.headers()
        max_connections = reader.integer("maxConnections", 1000, 1, nullable=True)
        return cls(
            max_retries=reader.integer("maxRetries", 2, 0),
            retry_base_delay=reader.duration("retryBaseDelay", 0.5),
            retry_max_delay=reader.duration("retryMaxDelay", 30.0),
            timeout=reader.duration("timeout", 600.0, nullable=True),
            connect_timeout=reader.duration("connectTimeout", 5.0, nullable=True),
            headers=headers,
            max_connections=max_connections,
            max_keepalive_connections=reader.integer("maxKeepaliveConnections", max_connections, 0, nullable=True),
            keepalive_expiry=reader.duration("keepaliveExpiry", 5.0, nullable=True),
            pool_shards=reader.integer("poolShards", DEFAULT_POOL_SHARDS, 1),
            transport=reader.choice("transport", TRANSPORTS, "auto"),
            proxy=reader.text("proxy"),
            timeout_set="timeout" in opts or "connectTimeout" in opts,
            **fields,
        )

    def httpx_timeout(self) -> httpx.Timeout:
        """Return ``timeout`` and ``connectTimeout`` as an ``httpx.Timeout``."""
        return httpx.Timeout(self.timeout, connect=self.connect_timeout)

    def httpx_limits(self) -> httpx.Limits:
        """Return the connection limits as an ``httpx.Limits`` (for the whole transport)."""
        return httpx.Limits(
            max_connections=self.max_connections,
            max_keepalive_connections=self.max_keepalive_connections,
            keepalive_expiry=self.keepalive_expiry,
        )


def check_base_url(settings: ProviderSettings, *, default: str) -> str:
    """Return ``settings.base_url`` (or ``default``) without a trailing slash, checked.

    :raises ConfigError: If it is not an ``http://`` or ``https://`` URL with a host; the
        problem's path is ``$.providers.NAME.baseUrl``.
    """
    base_url = (settings.base_url or default).rstrip("/")
    try:
        parsed = httpx.URL(base_url)
    except httpx.InvalidURL as exc:
        reason = str(exc)
    else:
        if parsed.scheme in ("http", "https") and parsed.host:
            return base_url
        reason = "must be an http:// or https:// URL"
    raise ConfigError(f"invalid baseUrl for provider {settings.name!r}", problems=[ConfigProblem(
        f"{reason}, not {base_url!r}", path=f"$.providers.{settings.name}.baseUrl")])


def resolve_api_key(settings: ProviderSettings, env: str) -> str | None:
    """Return ``settings.api_key``; without one, the variable ``env`` if no ``baseUrl`` is set.

    The environment's key is for the vendor's own server only: it is never sent to a ``baseUrl``
    the assembly chose. An empty variable counts as unset.
    """
    if settings.api_key is None and settings.base_url is None:
        return os.environ.get(env) or None
    return settings.api_key


def require_api_key(settings: ProviderSettings, env: str, headers: Mapping[str, str], *,
                    url: str, auth_headers: Sequence[str] = ("authorization",)) -> None:
    """Refuse to call the vendor's own server without a key: raise a ConfigError naming ``env``.

    Call it when the provider is built, so that nothing is dialled: with no ``baseUrl``, no
    ``apiKey``/``apiKeyEnv``, ``env`` unset (or empty) and none of ``auth_headers`` among the
    configured ``headers``, every request would be refused (or, offline, fail on the network).

    :param url: The vendor's endpoint, for the message.
    :raises ConfigError: The key is missing.
    """
    if settings.base_url is not None or settings.api_key is not None or os.environ.get(env):
        return
    wanted = {h.lower() for h in auth_headers}
    if any(name.lower() in wanted for name in headers):
        return
    raise ConfigError(
        f"provider {settings.name!r}: the environment variable {env} is not set",
        problems=[ConfigProblem(
            f"provider {settings.name!r}: the environment variable {env} is not set, and {url} needs an "
            f"API key: set {env}, or give the provider apiKeyEnv (or a baseUrl for a server that needs no key)",
            path=f"$.providers.{settings.name}")])


def override_headers(headers: dict[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """Add ``extra`` to ``headers`` (in place), each replacing any header of the same name in any case."""
    for name, value in extra.items():
        for existing in [k for k in headers if k.lower() == name.lower()]:
            del headers[existing]
        headers[name] = value
    return headers


def make_client(
    options: HTTPOptions, *, url: str, headers: Mapping[str, str], transport: str | None = None,
) -> httpx.AsyncClient:
    """Return an ``httpx.AsyncClient`` for requests to ``url``, over the transport the options choose.

    :param options: Limits, shards, proxy (by default the environment's for ``url``), timeouts
        and the transport.
    :param url: The endpoint: it chooses the environment's proxy, and plain ``http://`` without a
        proxy skips loading the CA bundle.
    :param headers: Headers sent with every request.
    :param transport: One of :data:`TRANSPORTS`, instead of ``options.transport``. ``auto`` gives an
        :class:`AiohttpTransport` when called under asyncio with aiohttp installed, a
        :class:`ShardedTransport` otherwise (under trio, or outside any event loop).
    :raises RuntimeError: For ``aiohttp`` under another event loop than asyncio's, or without aiohttp.
    """
    kind = transport_kind(options.transport if transport is None else transport)
    return httpx.AsyncClient(transport=build_transport(options, url=url, kind=kind), headers=headers,
                             timeout=options.httpx_timeout())


def transport_kind(choice: str) -> Literal["aiohttp", "httpcore"]:
    """Return the transport ``choice`` (one of :data:`TRANSPORTS`) means here and now.

    :raises RuntimeError: If ``choice`` is ``aiohttp`` and aiohttp cannot serve.
    """
    if choice == "httpcore":
        return "httpcore"
    if choice not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {choice!r}")
    library = _async_library()
    if library not in ("asyncio", None):
        if choice == "auto":
            return "httpcore"
        raise RuntimeError(f"the aiohttp transport needs asyncio, not {library} (use transport: auto or httpcore)")
    try:
        import aiohttp  # noqa: F401, PLC0415 - the transport's own import, made here to choose
    except ImportError as exc:
        if choice == "auto":
            return "httpcore"
        raise RuntimeError(f"the aiohttp transport needs the aiohttp package ({exc})") from exc
    if library is None and choice == "auto":
        return "httpcore"  # no event loop to judge by: the transport that serves both
    return "aiohttp"


def _async_library() -> str | None:
    """Return the async library running this code (``asyncio``, ``trio`` ...), or ``None``."""
    try:
        import sniffio  # noqa: PLC0415 - a dependency of trio: without it, only asyncio can run
    except ImportError:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return None
        return "asyncio"
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


def build_transport(options: HTTPOptions, *, url: str, kind: str) -> httpx.AsyncBaseTransport:
    """Return the transport of kind ``aiohttp`` or ``httpcore`` for requests to ``url``."""
    proxy = options.proxy or environment_proxy(url)
    # Plain http without a proxy never uses TLS: skip loading the CA bundle.
    plain = proxy is None and url.startswith("http://")
    verify = ssl_context(verify=False) if plain else ssl_context()
    if kind == "aiohttp":
        return AiohttpTransport(limits=options.httpx_limits(), proxy=proxy, verify=verify)
    return ShardedTransport(shards=options.pool_shards, limits=options.httpx_limits(), proxy=proxy, verify=verify)

"""The MCP server list: parsed from a mapping or a JSON/YAML file, checked, frozen.

Imports nothing of the ``mcp`` package: configuration is read when a runtime loads plugins,
and ``mcp`` is imported only when a server is connected.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from loopwright.errors import ConfigError

__all__ = ["ServerConfig", "load_servers", "parse_servers"]

_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TRANSPORTS = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamableHttp": "http", "sse": "sse"}
_KEYS = frozenset({"command", "args", "env", "cwd", "url", "type", "transport", "headers", "timeout",
                   "requiresApproval", "parallelSafe", "tools", "disabled"})


@attrs.frozen(kw_only=True)
class ServerConfig:
    """One MCP server and how its tools become loopwright tools.

    Attributes:
        name: The server's name; its tools are named ``NAME__TOOL``.
        transport: ``stdio`` (a command), ``http`` (streamable HTTP) or ``sse``.
        command: The program a ``stdio`` server runs.
        args: Its arguments.
        env: Variables added to the environment the SDK passes on (``PATH``, ``HOME`` ... only).
        cwd: Its working folder.
        url: The endpoint of an ``http`` or ``sse`` server.
        headers: HTTP headers sent to it (an ``Authorization`` header, say).
        timeout: Seconds a call may take (the loop's ``timeout`` result); ``None``: the definition's limit.
        requires_approval: ``True`` holds every call for approval; a tuple holds those tools' calls.
        parallel_safe: ``True`` lets calls run at the same time as other calls of the turn; a tuple
            does so for those tools only. Default: none.
        tools: When given, only these of the server's tools are registered.
    """

    name: str
    transport: str = "stdio"
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    timeout: float | None = None
    requires_approval: bool | tuple[str, ...] = False
    parallel_safe: bool | tuple[str, ...] = False
    tools: tuple[str, ...] | None = None

    def approval_for(self, tool: str) -> bool:
        """Whether calls of the server's tool ``tool`` are held for approval."""
        flag = self.requires_approval
        return flag if isinstance(flag, bool) else tool in flag

    def parallel_for(self, tool: str) -> bool:
        """Whether calls of the server's tool ``tool`` may run alongside other calls."""
        flag = self.parallel_safe
        return flag if isinstance(flag, bool) else tool in flag


def load_servers(path: str | os.PathLike[str]) -> tuple[ServerConfig, ...]:
    """Read a server file: JSON (``.json``) or YAML, ``{mcpServers: {NAME: {...}}}``.

    A relative ``cwd`` is taken from the file's folder.

    :raises ConfigError: The file is missing, unreadable or describes servers wrongly.
    """
    from loopwright import read_yaml  # noqa: PLC0415 - only for server files

    file = Path(path)
    try:
        data = read_yaml(file)  # JSON is YAML; the loader's limits on size, aliases and depth apply
    except ConfigError as exc:
        unread = any(p.line is None for p in exc.problems)  # a read error has no position
        what = "cannot read the MCP server file" if unread else \
            f"the MCP server file is not valid {file.suffix[1:] or 'YAML'}"
        raise ConfigError(f"{what}: {exc}", path=str(file), problems=exc.problems) from None
    return parse_servers(data, base_dir=file.parent, source=str(file))


def parse_servers(
    data: Any, *, base_dir: Path | None = None, source: str = "MCP servers",
) -> tuple[ServerConfig, ...]:
    """Check a server mapping: ``{mcpServers: {NAME: {...}}}``, ``{servers: ...}`` or ``{NAME: {...}}``.

    Servers with ``disabled: true`` are left out.

    :raises ConfigError: Every problem names the server and the key.
    """
    if isinstance(data, Mapping) and set(data) <= {"mcpServers", "servers"} and len(data) == 1:
        data = next(iter(data.values()))
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of server names to servers")
    out = []
    for name, raw in data.items():
        server = _server(str(name), raw, base_dir, source)
        if server is not None:
            out.append(server)
    return tuple(out)


def _server(name: str, raw: Any, base_dir: Path | None, source: str) -> ServerConfig | None:  # noqa: C901, PLR0912
    where = f"{source}: server {name!r}"
    if not _SERVER_NAME.match(name) or "__" in name:
        raise ConfigError(f"{where}: a server name is 1-64 of A-Z a-z 0-9 _ - without '__' "
                          "(it starts the names of its tools)")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}")
    if raw.get("disabled") is True:
        return None
    kind = raw.get("transport", raw.get("type"))
    if kind is None:
        kind = "http" if "url" in raw else "stdio"
    if kind not in _TRANSPORTS:
        raise ConfigError(f"{where}: transport {kind!r} is not one of stdio, http, sse")
    transport = _TRANSPORTS[kind]
    fields: dict[str, Any] = {"name": name, "transport": transport}
    if transport == "stdio":
        command = raw.get("command")
        if not isinstance(command, str) or not command:
            raise ConfigError(f"{where}: a stdio server needs a command")
        fields["command"] = command
        fields["args"] = _strings(raw.get("args", []), f"{where}: args")
        if "env" in raw:
            fields["env"] = _string_map(raw["env"], f"{where}: env")
        if "cwd" in raw:
            cwd = Path(str(raw["cwd"]))
            fields["cwd"] = str(cwd if cwd.is_absolute() or base_dir is None else base_dir / cwd)
        for key in ("url", "headers"):
            if key in raw:
                raise ConfigError(f"{where}: {key} is for http and sse servers, not stdio ones")
    else:
        url = raw.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}: an {transport} server needs an http(s) url")
        fields["url"] = url
        if "headers" in raw:
            fields["headers"] = _string_map(raw["headers"], f"{where}: headers")
        for key in ("command", "args", "env", "cwd"):
            if key in raw:
                raise ConfigError(f"{where}: {key} is for stdio servers, not {transport} ones")
    if "timeout" in raw:
        timeout = raw["timeout"]
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (0 < timeout < math.inf):
            raise ConfigError(f"{where}: timeout must be a positive number of seconds")
        fields["timeout"] = float(timeout)
    for key, field in (("requiresApproval", "requires_approval"), ("parallelSafe", "parallel_safe")):
        if key in raw:
            value = raw[key]
            fields[field] = value if isinstance(value, bool) else _strings(value, f"{where}: {key}")
    if "tools" in raw:
        fields["tools"] = _strings(raw["tools"], f"{where}: tools")
    return ServerConfig(**fields)


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a list of strings")
    return tuple(value)


def _string_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"{where}: expected a mapping of strings to strings")
    return dict(value)

"""loopwright-mcp: the tools of MCP servers as loopwright tools, named ``SERVER__TOOL``.

Three ways to say which servers:

* the assembly: ``pluginSettings: {mcp: {servers: {NAME: {...}}}}`` in ``loopwright.yaml``, read
  by the entry point ``mcp = "loopwright_mcp"`` (loaded in every runtime of the environment, or
  listed in ``plugins:``);
* the file named by the environment variable ``LOOPWRIGHT_MCP_CONFIG`` (JSON or YAML,
  ``{mcpServers: {NAME: {command, args, env, cwd} | {url, headers, type}}}``), read by the same
  entry point; a server named in both replaces the assembly's;
* a plugin object a host registers: ``Runtime(assembly, plugins=[MCPServers({...})])``, closed
  by the host with ``async with`` or :meth:`MCPServers.aclose`.

The entry point opens the servers of each runtime for that runtime alone, when it loads its
plugins, and closes them in ``loopwright_on_runtime_close``. Importing this package does not
import ``mcp``: the SDK is imported when a server is first connected. The rules are in
``docs/tools/mcp.md``.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopwright import hookimpl
from loopwright.errors import ConfigError
from loopwright_mcp._config import ServerConfig, load_servers, parse_servers
from loopwright_mcp._results import result_value, tool_name
from loopwright_mcp._servers import MCPServers

if TYPE_CHECKING:
    from collections.abc import Callable

    from loopwright import Runtime

__all__ = [
    "CONFIG_ENV",
    "SETTINGS_KEY",
    "MCPServers",
    "ServerConfig",
    "configured_servers",
    "load_servers",
    "loopwright_on_runtime_close",
    "loopwright_register_tools",
    "parse_servers",
    "result_value",
    "tool_name",
]

#: The environment variable naming the server file the entry point reads.
CONFIG_ENV = "LOOPWRIGHT_MCP_CONFIG"

#: The entry of the assembly's ``pluginSettings`` this plugin reads: ``{servers: {NAME: {...}}}``.
SETTINGS_KEY = "mcp"

# The servers the entry point opened for each runtime; closed when that runtime closes. Keyed
# weakly, so a runtime that is dropped without being closed (``loopwright plugins`` only loads
# plugins) takes its servers along: MCPServers closes its sessions when collected or at exit.
_by_runtime: weakref.WeakKeyDictionary[Runtime, MCPServers] = weakref.WeakKeyDictionary()
# Without a runtime (a PluginHost used on its own): one MCPServers per server list in the
# process, closed at interpreter exit.
_shared: dict[str, MCPServers] = {}


def configured_servers(
    settings: Mapping[str, Any], *, base_dir: Path | None = None, source: str = "the assembly",
) -> tuple[ServerConfig, ...]:
    """Return the servers of ``settings["mcp"]["servers"]``, then of ``$LOOPWRIGHT_MCP_CONFIG``.

    A server named in both is the file's: the environment overrides the assembly. Servers with
    ``disabled: true`` are left out.

    :param settings: The assembly's ``pluginSettings``.
    :param base_dir: The folder a relative ``cwd`` of the assembly's servers is taken from.
    :param source: Where the settings come from, for error messages.
    :raises ConfigError: A server is described wrongly (the message names it and the key).
    """
    section = settings.get(SETTINGS_KEY)
    where = f"{source}: pluginSettings.{SETTINGS_KEY}"
    servers: dict[str, ServerConfig] = {}
    if section is not None:
        if not isinstance(section, Mapping):
            raise ConfigError(f"{where}: expected a mapping with the key servers")
        unknown = sorted(set(section) - {"servers"})
        if unknown:
            raise ConfigError(f"{where}: unknown keys {', '.join(map(str, unknown))}; known: servers")
        raw = section.get("servers")
        if raw is not None:
            servers.update((s.name, s) for s in parse_servers(raw, base_dir=base_dir, source=f"{where}.servers"))
    value = os.environ.get(CONFIG_ENV, "").strip()
    if value:
        servers.update((s.name, s) for s in load_servers(Path(value).resolve()))
    return tuple(servers.values())


@hookimpl
def loopwright_register_tools(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register the tools of the servers the assembly and ``$LOOPWRIGHT_MCP_CONFIG`` name, if any.

    The servers are connected now, for ``runtime`` alone, and closed when it closes.
    """
    if runtime is None:
        configs = configured_servers(settings)
        if not configs:
            return
        key = repr(configs)
        servers = _shared.get(key)
        if servers is None:
            servers = _shared[key] = MCPServers(configs)
    else:
        servers = _by_runtime.get(runtime)
        if servers is None:
            assembly = runtime.assembly
            configs = configured_servers(settings, base_dir=assembly.base_dir,
                                         source=str(assembly.path or "the assembly"))
            if not configs:
                return
            servers = _by_runtime[runtime] = MCPServers(configs)
    try:
        tools = servers.tools()
    except BaseException:
        # The runtime does not open, so it will not close: stop what did start now.
        servers.close()
        if runtime is not None:
            _by_runtime.pop(runtime, None)
        else:
            _shared.pop(repr(servers.servers), None)
        raise
    register(*tools)


@hookimpl
async def loopwright_on_runtime_close(runtime: Runtime) -> None:
    """Close the sessions opened for ``runtime`` (stopping its stdio servers)."""
    servers = _by_runtime.get(runtime)
    if servers is not None:
        await servers.aclose()

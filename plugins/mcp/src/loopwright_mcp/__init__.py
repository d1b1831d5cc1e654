"""loopwright-mcp: the tools of MCP servers as loopwright tools, named ``SERVER__TOOL``.

Two ways to say which servers:

* a host registers a plugin object: ``Runtime(assembly, plugins=[MCPServers({...})])``, and
  closes it with ``async with`` or :meth:`MCPServers.aclose`;
* the entry point ``mcp = "loopwright_mcp"`` (loaded in every runtime of the environment) reads
  the file named by the environment variable ``LOOPWRIGHT_MCP_CONFIG`` (JSON or YAML,
  ``{mcpServers: {NAME: {command, args, env, cwd} | {url, headers, type}}}``); without the
  variable it registers nothing.

Importing this package does not import ``mcp``: the SDK is imported when a server is first
connected. The rules are in ``docs/tools/mcp.md``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from loopwright import hookimpl
from loopwright_mcp._config import ServerConfig, load_servers, parse_servers
from loopwright_mcp._results import result_value, tool_name
from loopwright_mcp._servers import MCPServers

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "CONFIG_ENV",
    "MCPServers",
    "ServerConfig",
    "load_servers",
    "loopwright_register_tools",
    "parse_servers",
    "result_value",
    "tool_name",
]

#: The environment variable naming the server file the entry point reads.
CONFIG_ENV = "LOOPWRIGHT_MCP_CONFIG"

# One MCPServers per server file (and its modification time) in this process, so that every
# runtime of the process shares the servers' sessions; they are closed at interpreter exit.
_from_env: dict[tuple[str, int], MCPServers] = {}


@hookimpl
def loopwright_register_tools(register: Callable[..., None]) -> None:
    """Register the tools of the servers in ``$LOOPWRIGHT_MCP_CONFIG``, if it is set."""
    value = os.environ.get(CONFIG_ENV, "").strip()
    if not value:
        return
    path = Path(value).resolve()
    try:
        key = (str(path), path.stat().st_mtime_ns)
    except OSError:
        key = (str(path), 0)  # load_servers reports the missing file
    servers = _from_env.get(key)
    if servers is None:
        servers = _from_env[key] = MCPServers.from_file(path)
    register(*servers.tools())

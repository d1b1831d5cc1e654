"""A real MCP server for the tests, written with the SDK's own server API (MCPServer, once FastMCP).

Run as ``python mcp_test_server.py`` (stdio) or ``python mcp_test_server.py http PORT``
(streamable HTTP on 127.0.0.1:PORT, path ``/mcp``) or ``... sse PORT`` (``/sse``).
Each call is appended to the file named by ``$MCP_TEST_CALL_LOG`` when it is set, so tests can
tell whether the server was called at all.
"""

from __future__ import annotations

import base64
import os
import sys
import time

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from pydantic import BaseModel

server = MCPServer("loopwright-test")


def _log(line: str) -> None:
    path = os.environ.get("MCP_TEST_CALL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:  # noqa: PTH123
            f.write(line + "\n")


@server.tool()
def echo(text: str, times: int = 1) -> str:
    """Return the text, repeated."""
    _log(f"echo {text}")
    return " ".join([text] * times)


@server.tool()
def fail(message: str) -> str:
    """Always fail with the message."""
    _log(f"fail {message}")
    raise ToolError(message)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    _log(f"slow {seconds}")
    await anyio.sleep(seconds)
    return f"slept {seconds}"


class Weather(BaseModel):
    """A structured answer."""

    city: str
    celsius: float


@server.tool()
def weather(city: str) -> Weather:
    """Return the weather of a city as structured content."""
    _log(f"weather {city}")
    return Weather(city=city, celsius=21.5)


@server.tool()
def picture() -> Image:
    """Return a small PNG."""
    _log("picture")
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
    return Image(data=png, format="png")


@server.tool(name="dotted.name")
def dotted() -> str:
    """A tool whose name has a character loopwright names cannot hold."""
    return "dotted"


if __name__ == "__main__":
    _log(f"started {os.getpid()} {time.time()}")
    if len(sys.argv) >= 3 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "sse":
        server.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()

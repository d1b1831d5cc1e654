"""Test helpers: the test server's command, its call log and the processes it left running."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

SERVER = Path(__file__).with_name("mcp_test_server.py")


def stdio_server(log: Path | None = None, **options: Any) -> dict[str, Any]:
    """Return a server entry that runs the test server over stdio, logging its calls to ``log``."""
    entry: dict[str, Any] = {"command": sys.executable, "args": [str(SERVER)], **options}
    if log is not None:
        entry["env"] = {"MCP_TEST_CALL_LOG": str(log)}
    return entry


def server_processes() -> list[int]:
    """Return the ids of this process's children that run the test server."""
    out = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        state = stat.rsplit(")", 1)[1].split()[0]
        if ppid == me and SERVER.name in cmdline and state != "Z":
            out.append(int(entry.name))
    return out

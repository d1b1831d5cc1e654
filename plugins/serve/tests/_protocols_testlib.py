"""A project for the protocol surfaces' tests: an assembly with tokens, scripted agents and two tools.

Each agent has a scripted provider of its own, so the tests of one module can share one
``loopwright serve`` process: each test uses its own agents, whose replies nobody else takes.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

#: The tokens of the test server, by name: ``runner`` and ``other`` have ``run``, ``reader`` only ``read``.
TOKENS = {
    "runner": "run-token-0123456789abcdef",
    "other": "other-token-0123456789abcdef",
    "reader": "read-token-0123456789abcdef",
}
#: The environment the server needs for :data:`TOKENS`.
TOKEN_ENV = {f"PROTO_TOKEN_{name.upper()}": secret for name, secret in TOKENS.items()}

_TOOLS = '''\
import loopwright


@loopwright.tool(parallel_safe=True)
def echo(text: str) -> str:
    """Return the text."""
    return f"echo: {text}"


@loopwright.tool(requires_approval=True)
def delete(path: str) -> str:
    """Delete a file (held for approval)."""
    return f"deleted {path}"


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(echo, delete)
'''


def make_project(root: Path, agents: Mapping[str, Sequence[Any]], *, tools: Mapping[str, Sequence[str]] = {},
                 keys: Mapping[str, Mapping[str, Any]] = {}, extra: str = "") -> Path:
    """Write an assembly under ``root`` serving ``agents`` (name → scripted replies); return its path.

    :param tools: The tools of each agent (default: ``echo`` and ``delete``).
    :param keys: More definition keys of some agents (``inputs``, ``systemPrompt`` ...).
    :param extra: More assembly YAML, appended.
    """
    (root / "agents").mkdir(parents=True, exist_ok=True)
    (root / "tools.py").write_text(_TOOLS)
    providers = {name: {"kind": "scripted", "replies": list(replies)} for name, replies in agents.items()}
    registered = {name: f"agents/{name}.yaml" for name in agents}
    for name in agents:
        definition = {"name": name, "description": f"The test agent {name}.", "model": f"{name}:any",
                      "tools": list(tools.get(name, ("echo", "delete"))), **keys.get(name, {})}
        (root / "agents" / f"{name}.yaml").write_text(json.dumps(definition))
    tokens = [{"name": name, "tokenEnv": f"PROTO_TOKEN_{name.upper()}",
               "scopes": ["read"] if name == "reader" else ["run"]} for name in TOKENS]
    assembly = root / "loopwright.yaml"
    assembly.write_text(textwrap.dedent(f"""\
        store: {{kind: file, path: ./store}}
        plugins: [tools.py]
        providers: {json.dumps(providers)}
        agentDefinitions: {json.dumps(registered)}
        server: {{tokens: {json.dumps(tokens)}}}
        """) + extra)
    return assembly


def transcript(assembly: Path, instance_id: str) -> list[dict[str, Any]]:
    """Return the messages of an instance, read from the file store's ``entries.jsonl``."""
    entries = assembly.parent / "store" / instance_id / "entries.jsonl"
    lines = [json.loads(line) for line in entries.read_text().splitlines() if line.strip()]
    return [entry["m"] for entry in lines if entry.get("t") == "msg"]


@contextlib.contextmanager
def working(assembly: Path, env: Mapping[str, str]) -> Iterator[subprocess.Popen[str]]:
    """Run ``loopwright worker`` over ``assembly``'s store until the block ends (SIGTERM, then wait)."""
    proc = subprocess.Popen([sys.executable, "-m", "loopwright.cli", "worker", "-c", str(assembly), "--poll", "100ms"],
                            cwd=assembly.parent, env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()

"""Attacks on the protocol surfaces' tokens: OpenAI-compatible ``/openai/v1`` and the MCP server ``/mcp`` (issue 14).

A client on the network tries to start agents through ``loopwright serve`` without the right token:

* **No token, a wrong token, a token without ``run``.** Every request to ``/openai/v1`` and
  ``/mcp`` is authorised with the ``run`` scope before the surface (or the MCP SDK) reads it: 401
  (403 for a ``read`` token), and no instance is created.
* **A borrowed MCP session.** An MCP session id travels in a header (``Mcp-Session-Id``) and is no
  credential: a second token, even one with ``run``, may not drive a session the first one
  opened. The surface hands the SDK the request's principal, and the SDK answers such a request
  as if the session did not exist (404).

Each test starts ``python -m loopwright.cli serve --port 0`` as a user would and talks raw HTTP;
a control next to each refusal shows the same request succeeding with the right token, so a
broken test cannot pass by refusing everything. Timeouts are hang guards only.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "serve" / "tests"))
from _serve_testlib import serving

RUNNER = "runner-token-0123456789abcdef"
OTHER = "other-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
#: Seconds before the server counts as hung (a guard only).
GUARD = 60.0
_MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tokens")
    (root / "agents").mkdir()
    (root / "agents" / "target.yaml").write_text(json.dumps({"name": "target", "model": "script:any"}))
    tokens = [{"name": "runner", "tokenEnv": "ATTACK_RUNNER", "scopes": ["run"]},
              {"name": "other", "tokenEnv": "ATTACK_OTHER", "scopes": ["run"]},
              {"name": "reader", "tokenEnv": "ATTACK_READER", "scopes": ["read"]}]
    (root / "loopwright.yaml").write_text(json.dumps({
        "store": {"kind": "file", "path": "./store"}, "plugins": ["testing"],
        "providers": {"script": {"kind": "scripted", "replies": ["answer"] * 20}},
        "agentDefinitions": {"target": "agents/target.yaml"}, "server": {"tokens": tokens},
    }))
    return root


@pytest.fixture(scope="module")
def url(project: Path) -> Iterator[str]:
    env = {"ATTACK_RUNNER": RUNNER, "ATTACK_OTHER": OTHER, "ATTACK_READER": READER,
           "LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    with serving(project / "loopwright.yaml", env=env) as server:
        yield server.url


def _instances(project: Path) -> set[str]:
    store = project / "store"
    return {p.name for p in store.iterdir()} if store.is_dir() else set()


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _chat(url: str, token: str | None) -> httpx.Response:
    return httpx.post(f"{url}/openai/v1/chat/completions", headers=_auth(token), timeout=GUARD,
                      json={"model": "loopwright/target", "messages": [{"role": "user", "content": "hi"}]})


def _rpc(method: str, params: dict[str, object], rid: int | None = 1) -> dict[str, object]:
    body: dict[str, object] = {"jsonrpc": "2.0", "method": method, "params": params}
    if rid is not None:
        body["id"] = rid
    return body


_INITIALIZE = _rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                  "clientInfo": {"name": "attacker", "version": "1"}})
_CALL = _rpc("tools/call", {"name": "target", "arguments": {"prompt": "hi"}}, rid=2)


def _mcp(url: str, token: str | None, body: dict[str, object], session: str | None = None) -> httpx.Response:
    headers = {**_MCP_HEADERS, **_auth(token)}
    if session:
        headers["Mcp-Session-Id"] = session
        headers["Mcp-Protocol-Version"] = "2025-06-18"
    return httpx.post(f"{url}/mcp", headers=headers, json=body, timeout=GUARD)


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789abcdef", READER], ids=["none", "wrong", "read-only"])
def test_chat_completions_without_a_run_token_start_nothing(url: str, project: Path, token: str | None) -> None:
    """``/openai/v1/chat/completions`` refuses (401, or 403 for ``read``) and creates no instance."""
    before = _instances(project)
    response = _chat(url, token)
    assert response.status_code == (403 if token == READER else 401), response.text
    assert response.json()["error"]["type"] in ("authentication_error", "permission_error")
    assert _instances(project) == before


def test_chat_completions_with_the_run_token_start_the_agent(url: str, project: Path) -> None:
    """Control: the same request with the ``run`` token answers and creates one instance."""
    before = _instances(project)
    response = _chat(url, RUNNER)
    assert response.status_code == 200, response.text
    assert _instances(project) - before == {response.headers["x-loopwright-instance"]}


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789abcdef", READER], ids=["none", "wrong", "read-only"])
def test_mcp_without_a_run_token_is_refused_before_the_sdk(url: str, project: Path, token: str | None) -> None:
    """``/mcp`` refuses the handshake (401, or 403 for ``read``) and opens no session; no instance starts."""
    before = _instances(project)
    response = _mcp(url, token, _INITIALIZE)
    assert response.status_code == (403 if token == READER else 401), response.text
    assert "mcp-session-id" not in response.headers
    assert _instances(project) == before


def _open_session(url: str, token: str) -> str:
    response = _mcp(url, token, _INITIALIZE)
    assert response.status_code == 200, response.text
    session = response.headers["mcp-session-id"]
    done = _mcp(url, token, _rpc("notifications/initialized", {}, rid=None), session)
    assert done.status_code in (200, 202), done.text
    return session


def test_an_mcp_session_cannot_be_driven_with_another_token(url: str, project: Path) -> None:
    """A session opened with one ``run`` token answers 404 to another ``run`` token, and starts no agent."""
    session = _open_session(url, RUNNER)
    before = _instances(project)
    borrowed = _mcp(url, OTHER, _CALL, session)
    assert borrowed.status_code == 404, borrowed.text
    assert _instances(project) == before


def test_an_mcp_session_works_with_the_token_that_opened_it(url: str, project: Path) -> None:
    """Control: the opener's own token calls a tool in its session, which starts one instance."""
    session = _open_session(url, RUNNER)
    before = _instances(project)
    with contextlib.closing(httpx.Client(timeout=GUARD)) as client:
        response = client.post(f"{url}/mcp", json=_CALL, headers={
            **_MCP_HEADERS, **_auth(RUNNER), "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-06-18"})
    assert response.status_code == 200, response.text
    assert "answer" in response.text
    assert len(_instances(project) - before) == 1

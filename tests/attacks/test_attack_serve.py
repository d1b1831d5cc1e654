"""Attacks on ``loopwright serve`` (issue 13, item 3): nobody gets in who doesn't belong.

Each test starts ``python -m loopwright.cli serve`` as a subprocess over an assembly it writes
(the ``scripted`` provider plays the model: one provider per definition, so each script is read
once per server), and attacks it over real HTTP as a client on the network would. A test fails
if the attack succeeds: a request is served without the token or scope it needs, an instance
starts from a file path, a file outside the store is read, an oversized body is read whole, a
call of another tree is decided, or a page on another origin drives a server without tokens.

Requests whose path must reach the server unnormalised (``..``, ``%2F``, NUL) are written on a
raw socket. Timeouts are hang guards only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from loopwright_serve._api import ENDPOINTS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "serve" / "tests"))
from _serve_testlib import serving as served

# The tokens here are test values, made up for these servers.
# ruff: noqa: S106, S107

pytestmark = pytest.mark.slow

#: Seconds before a server, a request or a stream counts as hung (guards only).
GUARD = 60.0

TOKENS = {
    "ADMIN_TOKEN": "admin-0123456789abcdef-secret",
    "READER_TOKEN": "reader-0123456789abcdef-secret",
    "RUNNER_TOKEN": "runner-0123456789abcdef-secret",
    "APPROVER_TOKEN": "approver-0123456789abcdef-secret",
}
SERVER_TOKENS = """\
  tokens:
    - {name: admin, tokenEnv: ADMIN_TOKEN, scopes: [admin]}
    - {name: reader, tokenEnv: READER_TOKEN, scopes: [read]}
    - {name: runner, tokenEnv: RUNNER_TOKEN, scopes: [read, run]}
    - {name: approver, tokenEnv: APPROVER_TOKEN, scopes: [read, approve]}
"""

TOOLS = '''
"""A tool held for approval: its call is what the attacks try to decide."""
import loopwright


@loopwright.tool(requires_approval=True)
def delete(path: str) -> str:
    """Pretend to delete a file.

    Args:
        path: The file.
    """
    return f"deleted {path}"


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(delete)
'''

#: name → the replies of its own scripted provider.
AGENTS = {
    "chat": ["hello", "again"],
    "held": [{"toolCalls": [{"name": "delete", "arguments": {"path": "notes.txt"}, "id": "call_del"}]}, "deleted"],
    "held2": [{"toolCalls": [{"name": "delete", "arguments": {"path": "mine.txt"}, "id": "call_del"}]}, "deleted"],
    "victim": [{"toolCalls": [{"name": "delete", "arguments": {"path": "theirs.txt"}, "id": "call_victim"}]}, "x"],
}


def write_project(root: Path, server: str = "") -> Path:
    """An assembly with a file store in ./store, one scripted provider and definition per agent of AGENTS."""
    (root / "agents").mkdir(parents=True, exist_ok=True)
    (root / "tools.py").write_text(TOOLS)
    lines = ["store: {kind: file, path: ./store}", "plugins: [loopwright_testing, tools.py]", "providers:"]
    for name, replies in AGENTS.items():
        lines.append(f"  {name}: {{kind: scripted, replies: {json.dumps(replies)}}}")
        tools = "[delete]" if name != "chat" else "[]"
        (root / "agents" / f"{name}.yaml").write_text(f"name: {name}\nmodel: {name}:any\ntools: {tools}\n")
    lines.append("agentDefinitions:")
    lines += [f"  {name}: agents/{name}.yaml" for name in AGENTS]
    if server:
        lines += ["server:", server.rstrip("\n")]
    assembly = root / "loopwright.yaml"
    assembly.write_text("\n".join(lines) + "\n")
    return assembly


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.update(TOKENS)
    env.update(extra or {})
    return env


@contextlib.contextmanager
def serving(assembly: Path, *extra: str) -> Iterator[str]:
    """Run ``loopwright serve -c ASSEMBLY --port 0``; yield its URL once /healthz answers; SIGTERM it after."""
    with served(assembly, *extra, env=_env()) as server:
        yield server.url


def bearer(name: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"} if name else {}


def start(url: str, definition: str, token: str | None = "ADMIN_TOKEN") -> str:
    response = httpx.post(f"{url}/v1/instances", json={"definition": definition}, headers=bearer(token), timeout=GUARD)
    assert response.status_code == 201, response.text
    return str(response.json()["instanceId"])


def wait_state(url: str, instance_id: str, state: str, token: str | None = "ADMIN_TOKEN") -> dict:
    deadline = time.monotonic() + GUARD
    while True:
        shown = httpx.get(f"{url}/v1/instances/{instance_id}", headers=bearer(token), timeout=GUARD).json()
        if shown["state"] == state:
            return shown
        assert time.monotonic() < deadline, shown
        time.sleep(0.05)


def raw(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as written on a socket to the server; return its status, headers and body."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=GUARD) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return int(lines[0].split()[1]), headers, body


#: The runtime's own id for a tool call (the model's id is kept as the call's wire id).
RUNTIME_ID = re.compile(r"^lw-\d+-\d+-[0-9a-f]{6}$")


def runtime_call_id(root: Path, instance_id: str, model_id: str) -> str:
    """The runtime's id of the call the model named ``model_id``, read from the instance's saved transcript."""
    lines = (root / "store" / instance_id / "entries.jsonl").read_text().splitlines()
    found = [c["id"] for entry in map(json.loads, lines) if entry.get("t") == "msg"
             for c in entry["m"].get("toolCalls") or () if c.get("wireId", c["id"]) == model_id]
    assert len(found) == 1, (model_id, found)
    assert RUNTIME_ID.match(found[0]), found[0]
    return str(found[0])


def held_call(root: Path, shown: dict, model_id: str) -> dict:
    """The one undecided pending approval of ``shown``: the call the model named ``model_id``."""
    (pending,) = [p for p in shown["pendingApprovals"] if p["decision"] is None]
    assert pending["toolCallId"] == runtime_call_id(root, shown["instanceId"], model_id), pending
    return dict(pending)


def stored(root: Path) -> list[str]:
    """The instances in the project's store (none before the first one is created)."""
    store = root / "store"
    return sorted(p.name for p in store.iterdir()) if store.is_dir() else []


def _port(url: str) -> int:
    return int(urlsplit(url).port or 80)


# ---------------------------------------------------------------------------------------------
# Tokens and scopes
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("serve-tokens")
    with serving(write_project(root, SERVER_TOKENS)) as url:
        yield url, root


def _calls(instance_id: str, held: dict) -> list[tuple[str, str, dict | None]]:
    """Every scoped operation, with real ids in its path and a valid body (``held``: the pending approval)."""
    bodies = {"start_instance": {"definition": "chat"}, "message": {"text": "hi"},
              "decide": {"decision": "approve", "digest": held["digest"]}, "cancel": {},
              "say_in_thread": {"definition": "chat", "text": "hi"}, "fork": {}, "rewind": {"turn": 0}}
    out = []
    for ep in ENDPOINTS:
        if ep.scope is None:
            continue
        path = ep.path.replace("{instance_id}", instance_id).replace("{call_id}", held["toolCallId"])
        out.append((ep.method, path, bodies.get(ep.key) if ep.method in {"POST", "PUT"} else None))
    return out


def test_a_missing_or_wrong_token_gets_401_on_every_endpoint(tokened: tuple[str, Path]) -> None:
    url, root = tokened
    instance_id = start(url, "held")
    held = held_call(root, wait_state(url, instance_id, "waiting_for_approval"), "call_del")
    before = stored(root)
    right = TOKENS["ADMIN_TOKEN"]
    wrong = [None, "", "Bearer", f"Bearer {right[:-1]}", f"Bearer {right}x", f"Bearer {right.upper()}",
             f"Basic {right}", f"Bearer {right[:8]}", "Bearer admin", f"Token {right}"]
    for method, path, body in _calls(instance_id, held):
        for header in wrong:
            headers = {"Authorization": header} if header is not None else {}
            response = httpx.request(method, f"{url}{path}", json=body, headers=headers, timeout=GUARD)
            assert response.status_code == 401, (method, path, header, response.status_code)
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert response.headers["content-type"] == "application/problem+json"
    # Nothing was started, decided or cancelled.
    assert stored(root) == before
    shown = wait_state(url, instance_id, "waiting_for_approval")
    assert held_call(root, shown, "call_del") == held


def test_a_token_without_the_scope_gets_403(tokened: tuple[str, Path]) -> None:
    url, root = tokened
    instance_id = start(url, "held2", token="RUNNER_TOKEN")
    held = held_call(root, wait_state(url, instance_id, "waiting_for_approval", token="READER_TOKEN"), "call_del")
    denied = {
        "READER_TOKEN": {"start_instance", "say_in_thread", "message", "decide", "fork", "rewind", "cancel",
                         "delete_instance"},
        "RUNNER_TOKEN": {"decide", "delete_instance"},
        "APPROVER_TOKEN": {"start_instance", "say_in_thread", "message", "fork", "rewind", "cancel",
                           "delete_instance"},
    }
    # Every scoped endpoint is refused to some token here, and only admin may delete.
    assert set().union(*denied.values()) == {ep.key for ep in ENDPOINTS if ep.scope is not None} - {
        "list_instances", "list_definitions", "show_instance", "events", "records"}
    keys = [ep.key for ep in ENDPOINTS if ep.scope is not None]
    before = stored(root)
    for token, refused in denied.items():
        for key, (method, path, body) in zip(keys, _calls(instance_id, held), strict=True):
            if key not in refused:
                continue
            response = httpx.request(method, f"{url}{path}", json=body, headers=bearer(token), timeout=GUARD)
            assert response.status_code == 403, (token, key, response.status_code, response.text)
            assert "scope" in response.json()["detail"]
    assert stored(root) == before
    shown = wait_state(url, instance_id, "waiting_for_approval", token="READER_TOKEN")
    assert held_call(root, shown, "call_del") == held
    # Reading is what the reader may do; the approver's decision records its token.
    assert httpx.get(f"{url}/v1/instances", headers=bearer("READER_TOKEN"), timeout=GUARD).status_code == 200
    decided = httpx.post(f"{url}/v1/instances/{instance_id}/approvals/{held['toolCallId']}",
                         json={"decision": "deny", "digest": held["digest"]},
                         headers=bearer("APPROVER_TOKEN"), timeout=GUARD)
    assert decided.status_code == 200, decided.text
    assert decided.json()["decided"][0]["decidedBy"] == "token:approver"
    wait_state(url, instance_id, "waiting", token="READER_TOKEN")
    records = httpx.get(f"{url}/v1/instances/{instance_id}/records", params={"kind": "approval"},
                        headers=bearer("READER_TOKEN"), timeout=GUARD).json()
    assert records[-1]["data"]["by"] == "token:approver"


def test_a_server_without_tokens_refuses_a_non_loopback_host(tmp_path: Path) -> None:
    assembly = write_project(tmp_path)
    for host in ("0.0.0.0", "::", "192.0.2.1"):  # noqa: S104 - refused before anything is bound
        proc = subprocess.run([sys.executable, "-m", "loopwright.cli", "serve", "-c", str(assembly), "--host", host,
                               "--port", "0"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                              timeout=GUARD, check=False)
        assert proc.returncode == 2, (host, proc.stderr)
        assert "without tokens" in proc.stderr
        assert "listening" not in proc.stdout


def test_a_server_without_tokens_refuses_other_origins_and_rebound_names(tmp_path: Path) -> None:
    """A page elsewhere (a plain cross-site POST, or DNS rebinding to 127.0.0.1) cannot drive a tokenless server."""
    with serving(write_project(tmp_path)) as url:
        port = _port(url)
        body = json.dumps({"definition": "chat"}).encode()
        attacks = [
            f"Host: 127.0.0.1:{port}\r\nOrigin: https://evil.example\r\nContent-Type: application/json",
            f"Host: 127.0.0.1:{port}\r\nOrigin: null\r\nContent-Type: application/json",
            f"Host: evil.example:{port}\r\nContent-Type: application/json",
            f"Host: 127.0.0.1.evil.example:{port}\r\nContent-Type: application/json",
            f"Host: 127.0.0.1:{port}\r\nOrigin: https://evil.example\r\nContent-Type: text/plain",
        ]
        for headers in attacks:
            request = (f"POST /v1/instances HTTP/1.1\r\n{headers}\r\nContent-Length: {len(body)}\r\n"
                       "Connection: close\r\n\r\n").encode() + body
            status, _headers, answer = raw(url, request)
            assert status in {403, 415}, (headers, status, answer)
        assert stored(tmp_path) == []
        # The same request from this machine's own page (or a program) is served.
        ok = httpx.post(f"{url}/v1/instances", json={"definition": "chat"},
                        headers={"Origin": f"http://127.0.0.1:{port}"}, timeout=GUARD)
        assert ok.status_code == 201, ok.text


def test_no_cors_unless_configured(tmp_path: Path) -> None:
    preflight = {"Origin": "https://ops.example.com", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    with serving(write_project(tmp_path / "none", SERVER_TOKENS)) as url:
        answer = httpx.options(f"{url}/v1/instances", headers=preflight, timeout=GUARD)
        assert "access-control-allow-origin" not in answer.headers
        listed = httpx.get(f"{url}/v1/instances", headers={**bearer("READER_TOKEN"), "Origin": preflight["Origin"]},
                           timeout=GUARD)
        assert "access-control-allow-origin" not in listed.headers
    cors = SERVER_TOKENS + '  cors: {origins: ["https://ops.example.com"]}\n'
    with serving(write_project(tmp_path / "some", cors)) as url:
        answer = httpx.options(f"{url}/v1/instances", headers=preflight, timeout=GUARD)
        assert answer.headers["access-control-allow-origin"] == "https://ops.example.com"
        other = httpx.options(f"{url}/v1/instances", headers={**preflight, "Origin": "https://evil.example"},
                              timeout=GUARD)
        assert other.headers.get("access-control-allow-origin") != "https://evil.example"


# ---------------------------------------------------------------------------------------------
# What a request may name
# ---------------------------------------------------------------------------------------------


def test_only_registered_names_start_never_a_definition_path(tokened: tuple[str, Path]) -> None:
    url, root = tokened
    (root / "evil.yaml").write_text("name: evil\nmodel: chat:any\n")
    before = stored(root)
    for definition in ("evil.yaml", str(root / "evil.yaml"), "agents/chat.yaml", str(root / "agents" / "chat.yaml"),
                       "./agents/chat.yaml", "../serve-tokens0/evil.yaml", "chat/../evil.yaml", "CHAT", " chat"):
        response = httpx.post(f"{url}/v1/instances", json={"definition": definition}, headers=bearer("ADMIN_TOKEN"),
                              timeout=GUARD)
        assert response.status_code == 422, (definition, response.text)
        assert response.json()["errors"][0]["path"] == "$.definition"
    for definition in ({"name": "inline", "model": "chat:any"}, ["chat"], None):
        response = httpx.post(f"{url}/v1/instances", json={"definition": definition}, headers=bearer("ADMIN_TOKEN"),
                              timeout=GUARD)
        assert response.status_code == 422, (definition, response.text)
    assert stored(root) == before


def test_path_tricks_in_ids_reach_no_file_outside_the_store(tokened: tuple[str, Path]) -> None:
    url, root = tokened
    instance_id = start(url, "chat")
    wait_state(url, instance_id, "waiting")
    # A look-alike instance outside the store, holding a canary.
    outside = root / "outside" / "stolen"
    outside.mkdir(parents=True)
    header = json.loads((root / "store" / instance_id / "instance.json").read_text())
    (outside / "instance.json").write_text(json.dumps({**header, "instanceId": "stolen", "name": "CANARY-OUTSIDE"}))
    for name in ("entries.jsonl", "records.jsonl"):
        (outside / name).write_text((root / "store" / instance_id / name).read_text().replace(instance_id, "stolen"))
    auth = f"Authorization: Bearer {TOKENS['ADMIN_TOKEN']}\r\n"
    tricks = ["..%2Foutside%2Fstolen", "%2e%2e%2Foutside%2Fstolen", "..", "%2e%2e", "..%5Coutside%5Cstolen",
              "stolen%00", "%00", "a" * 5000, "....%2F%2F", f"{instance_id}%2F..%2F..%2Foutside%2Fstolen",
              ".%2E/outside/stolen", "%C0%AE%C0%AE%2Foutside", f"{instance_id}%00"]
    for trick in tricks:
        for suffix in ("", "/records", "/events"):
            status, _headers, body = raw(url, (f"GET /v1/instances/{trick}{suffix} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                               f"{auth}Connection: close\r\n\r\n").encode())
            # None of them is an instance id: a 400 stating the rule (issue 25), never a look-up.
            assert status == 400, (trick, suffix, status, body[:200])
            assert b"Invalid instance id" in body
            assert b"CANARY-OUTSIDE" not in body
        body_text = b'{"decision": "approve"}'
        status, _headers, body = raw(url, (
            f"POST /v1/instances/{instance_id}/approvals/{trick} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
            f"Content-Type: application/json\r\nContent-Length: {len(body_text)}\r\nConnection: close\r\n\r\n"
        ).encode() + body_text)
        assert status in {307, 400, 404, 409, 422}, (trick, status, body[:200])
    # The look-alike is still there, untouched, and no instance of that name was listed.
    assert json.loads((outside / "instance.json").read_text())["name"] == "CANARY-OUTSIDE"
    listed = httpx.get(f"{url}/v1/instances", headers=bearer("READER_TOKEN"), timeout=GUARD).text
    assert "CANARY-OUTSIDE" not in listed


# ---------------------------------------------------------------------------------------------
# Bodies
# ---------------------------------------------------------------------------------------------


def test_oversized_bodies_are_refused_before_they_are_read(tmp_path: Path) -> None:
    with serving(write_project(tmp_path, SERVER_TOKENS + "  maxBodyBytes: 4096\n")) as url:
        auth = f"Authorization: Bearer {TOKENS['ADMIN_TOKEN']}\r\n"
        # Declared: answered at once, though not one byte of the 1 GB follows.
        status, _headers, body = raw(url, (
            f"POST /v1/instances HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n"
            "Content-Length: 1000000000\r\n\r\n").encode())
        assert status == 413, body
        assert json.loads(body)["status"] == 413
        # Chunked, without a length: counted as it arrives.
        chunk = b'{"definition": "chat", "prompt": "' + b"x" * 3000
        request = (f"POST /v1/instances HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n"
                   "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
        for _ in range(3):
            request += f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        request += b"0\r\n\r\n"
        status, _headers, body = raw(url, request)
        assert status == 413, body
        for path in ("/v1/instances/x/messages", "/v1/instances/x/approvals/y", "/v1/instances/x/cancel"):
            big = httpx.post(f"{url}{path}", content=b"{" + b" " * 10_000 + b"}", headers={
                **bearer("ADMIN_TOKEN"), "Content-Type": "application/json"}, timeout=GUARD)
            assert big.status_code == 413, (path, big.text)
        assert stored(tmp_path) == []
        assert httpx.get(f"{url}/healthz", timeout=GUARD).status_code == 200


def test_malformed_bodies_get_a_problem_document_never_a_crash(tokened: tuple[str, Path]) -> None:
    url, root = tokened
    before = stored(root)
    headers = {**bearer("ADMIN_TOKEN"), "Content-Type": "application/json"}
    bodies = [b"", b"{", b"nul", b"\xff\xfe{}", b'{"definition": "chat"}{}', b'"chat"', b"[]", b"null",
              b'{"definition": "chat", "inputs": []}', b'{"definition": "chat", "prompt": 7}',
              b'{"definition": "chat", "inputs": {"x": Infinity}}', b"[" * 200_000, b'{"a":' * 50_000,
              b'{"definition": "chat", "definition": {"name": "x"}}', b'{"definition": "chat", "__proto__": {}}']
    for body in bodies:
        response = httpx.post(f"{url}/v1/instances", content=body, headers=headers, timeout=GUARD)
        assert response.status_code in {400, 422}, (body[:40], response.status_code, response.text[:300])
        assert response.headers["content-type"] == "application/problem+json"
    assert stored(root) == before
    assert httpx.get(f"{url}/healthz", timeout=GUARD).status_code == 200


# ---------------------------------------------------------------------------------------------
# Trees
# ---------------------------------------------------------------------------------------------


def test_a_url_naming_another_root_decides_nothing(tokened: tuple[str, Path]) -> None:
    """POST /v1/instances/A/approvals/CALL for a call held in B's tree: refused, and B's call stays held."""
    url, _root = tokened
    mine = start(url, "chat")
    wait_state(url, mine, "waiting")
    theirs = start(url, "victim")
    victim = held_call(_root, wait_state(url, theirs, "waiting_for_approval"), "call_victim")
    for decision in ("approve", "deny"):  # the right id and the right digest, on the wrong root's URL
        response = httpx.post(f"{url}/v1/instances/{mine}/approvals/{victim['toolCallId']}",
                              json={"decision": decision, "digest": victim["digest"]},
                              headers=bearer("ADMIN_TOKEN"), timeout=GUARD)
        assert response.status_code in {404, 409}, response.text
        assert response.headers["content-type"] == "application/problem+json"
    shown = wait_state(url, theirs, "waiting_for_approval")
    (held,) = shown["pendingApprovals"]
    assert held == victim
    assert held["decision"] is None
    header = json.loads((_root / "store" / theirs / "instance.json").read_text())
    assert [p.get("decision") for p in header["pendingApprovals"]] == [None]
    records = httpx.get(f"{url}/v1/instances/{theirs}/records", params={"kind": "tool_call"},
                        headers=bearer("READER_TOKEN"), timeout=GUARD).json()
    assert records == []


# ---------------------------------------------------------------------------------------------
# Deep JSON on every surface (issue 25, item 5)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/instances", "/openai/v1/chat/completions", "/a2a/chat", "/agui/chat", "/mcp"])
def test_a_deeply_nested_body_is_a_400_on_every_surface(tokened: tuple[str, Path], path: str) -> None:
    """200,000 levels of arrays or objects: a 400 problem document at once, never a 500, nothing started."""
    url, root = tokened
    before = stored(root)
    headers = {**bearer("ADMIN_TOKEN"), "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    for body in (b"[" * 200_000, b'{"a":' * 100_000, b'{"jsonrpc": "2.0", "params": ' + b"[" * 200_000,
                 b'["\\"' + b"[" * 200 + b'", ' + b"{" * 200_000):
        started = time.monotonic()
        response = httpx.post(f"{url}{path}", content=body, headers=headers, timeout=GUARD)
        assert response.status_code == 400, (path, body[:40], response.status_code, response.text[:300])
        assert "deep" in response.text, response.text[:300]
        assert time.monotonic() - started < 10  # a guard: the check is linear, not a parse that blows up
    assert stored(root) == before
    assert httpx.get(f"{url}/healthz", timeout=GUARD).status_code == 200


def test_a_body_nested_within_the_limit_is_not_refused_for_its_depth(tokened: tuple[str, Path]) -> None:
    """The control: brackets inside strings do not count, and 100 real levels are only checked by the schema."""
    url, _root = tokened
    headers = {**bearer("ADMIN_TOKEN"), "Content-Type": "application/json"}
    deep_inputs = {"definition": "chat", "prompt": "[" * 5000 + '\\"{' * 3000,
                   "inputs": {"x": json.loads("[" * 100 + "]" * 100)}}
    response = httpx.post(f"{url}/v1/instances", content=json.dumps(deep_inputs).encode(), headers=headers,
                          timeout=GUARD)
    assert "deep" not in response.text, response.text[:300]
    assert response.status_code != 500, response.text[:300]

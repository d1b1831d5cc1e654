"""Fuzzing the HTTP bodies of every surface of ``loopwright serve``: a 4xx, never a 5xx, never a hang.

One real server per module (``python -m loopwright.cli serve`` in a subprocess, started with
``_serve_testlib.serving``): a file store, the ``test`` provider (offline, it answers at once and
holds a call of a tool that needs approval), two registered definitions (``chat`` answers,
``held`` holds a ``delete`` call), a token with every scope, and a small ``maxBodyBytes`` so that
bodies near and above it are cheap. Before the examples a ``chat`` instance rests, a ``held``
instance holds its call and an MCP session is open, so that the bodies reach past "no such
instance" and "no session".

Every POST endpoint gets generated bodies: ``/v1/instances``, ``/v1/instances/ID/messages``,
``/v1/instances/ID/approvals/CALL``, ``/openai/v1/chat/completions``, ``/a2a/NAME`` (JSON-RPC),
``/agui/NAME`` and ``/mcp``. The bodies are arbitrary JSON, objects with the endpoint's own keys
holding values of the right or a random type (NaN and infinity included, which are no JSON),
arrays and objects nested 10,000 to 200,000 deep (built as text), strings just under, at and over
the body limit (declared or chunked), bytes that are no JSON or no UTF-8, under several
``Content-Type`` headers. Ids of calls and instances in the path are any Unicode.

For each request: the answer is a 2xx or a 4xx, never a 5xx, within the hang guard; a 4xx is a
problem document or the protocol's own error (OpenAI's ``{"error": {...}}``, a JSON-RPC error for
A2A and MCP); a 2xx of the REST API answers a body that its published schema accepts; and the
server still answers ``GET /v1/instances/ID`` with 200 afterwards.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
import httpx
import jsonschema
import pytest
from fuzzing import HANG_GUARD, fuzz
from hypothesis import example, given
from hypothesis import strategies as st

from loopwright import approval_digest
from loopwright_serve._api import ENDPOINTS
from loopwright_serve._schema import json_schema

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "serve" / "tests"))
from _serve_testlib import DELETE_TOOL_PLUGIN, Server, serving

pytestmark = pytest.mark.slow

TOKEN = "fuzz-admin-0123456789abcdef"  # noqa: S105 - a made-up token for this server
#: The server's ``maxBodyBytes``: small, so bodies around it cost little.
LIMIT = 256 * 1024
ASSEMBLY = f"""\
store: {{kind: file, path: ./store}}
plugins: [testing, tools.py]
providers:
  model: {{kind: test}}
agentDefinitions:
  chat: agents/chat.yaml
  held: agents/held.yaml
server:
  maxBodyBytes: {LIMIT}
  tokens:
    - {{name: admin, tokenEnv: FUZZ_ADMIN_TOKEN, scopes: [admin]}}
"""
MCP_VERSION = "2025-06-18"


@attrs.frozen
class Target:
    """The running server, and what is in its store before the examples.

    Attributes:
        server: The server.
        chat: A resting (``waiting``) instance of ``chat``.
        held: An instance of ``held`` that holds one call for approval (a valid body may decide it).
        call: That call's runtime id.
        digest: That call's digest.
        kept: Another instance of ``held``, whose call no example may decide.
        kept_call: That call's runtime id.
        kept_digest: That call's digest.
        session: An MCP session the token opened.
        client: A client of the server with the token.
    """

    server: Server
    chat: str
    held: str
    call: str
    digest: str
    kept: str
    kept_call: str
    kept_digest: str
    session: str
    client: httpx.Client


def _client(server: Server) -> httpx.Client:
    """A client with the token; every request on a connection of its own (``Connection: close``).

    So a connection the server closed after refusing a body it did not read is never reused.
    """
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}", "Connection": "close"},
                        timeout=httpx.Timeout(HANG_GUARD))


def _rest_until(server: Server, instance_id: str, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    with _client(server) as client:
        while True:
            summary = client.get(f"/v1/instances/{instance_id}").json()
            if summary.get("state") == state:
                return summary
            assert time.monotonic() < deadline, summary
            time.sleep(0.05)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    root = tmp_path_factory.mktemp("fuzz-http")
    (root / "agents").mkdir()
    (root / "agents" / "chat.yaml").write_text("name: chat\nmodel: model:any\n")
    (root / "agents" / "held.yaml").write_text("name: held\nmodel: model:any\ntools: [delete]\n")
    (root / "tools.py").write_text(DELETE_TOOL_PLUGIN)
    (root / "loopwright.yaml").write_text(ASSEMBLY)
    env = {"FUZZ_ADMIN_TOKEN": TOKEN, "LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    with serving(root / "loopwright.yaml", env=env) as server, _client(server) as client:
        chat = client.post("/v1/instances", json={"definition": "chat", "prompt": "hello"}).json()["instanceId"]
        held, kept = (client.post("/v1/instances", json={"definition": "held", "prompt": "delete it"}).json()
                      ["instanceId"] for _ in range(2))
        _rest_until(server, chat, "waiting")
        (pending,) = _rest_until(server, held, "waiting_for_approval")["pendingApprovals"]
        (other,) = _rest_until(server, kept, "waiting_for_approval")["pendingApprovals"]
        opened = client.post("/mcp", headers=_mcp_headers(None), json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": MCP_VERSION, "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "1"}}})
        assert opened.status_code == 200, opened.text
        session = opened.headers["mcp-session-id"]
        done = client.post("/mcp", headers=_mcp_headers(session),
                           json={"jsonrpc": "2.0", "method": "notifications/initialized", "params": {}})
        assert done.status_code in (200, 202), done.text
        yield Target(server, chat, held, pending["toolCallId"], approval_digest(pending), kept,
                     other["toolCallId"], approval_digest(other), session, client)
        assert server.process.poll() is None, server.stderr[-3000:]
    # Every refusal is a client's fault: none may have been logged as the server's own failure.
    assert not any(m in server.stderr for m in SERVER_FAILURES), server.stderr[-5000:]


def _mcp_headers(session: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if session:
        headers |= {"Mcp-Session-Id": session, "Mcp-Protocol-Version": MCP_VERSION}
    return headers


# -- what is sent ------------------------------------------------------------------------------

#: Strings that are no text: unpaired surrogates (sent as ``\\ud800`` escapes, or as their UTF-8-like bytes).
SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=12),
                    st.sampled_from(["", "chat", "held", "loopwright/chat", "approve", "user", "2.0", "../x"]),
                    SURROGATES)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
TEXT = st.one_of(st.text(max_size=30), st.sampled_from(["", " ", "\x00", "\u202e", "🙂", "x" * 5000]), SURROGATES)


def either(right: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A value of the right type (two times in three), or any JSON."""
    return st.one_of(right, right, JSON)


def shaped(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """An object with some of ``fields`` (each maybe of a wrong type), maybe more keys; or any JSON at all."""
    known = st.fixed_dictionaries({}, optional={key: either(value) for key, value in fields.items()})
    extra = st.dictionaries(st.text(max_size=8), JSON, max_size=2)
    return st.one_of(known, known, st.builds(lambda a, b: {**b, **a}, known, extra), JSON)


MESSAGE_PARTS = st.lists(either(shaped({"type": st.sampled_from(["text", "image_url"]), "text": TEXT})), max_size=3)
CHAT_MESSAGE = shaped({"role": st.sampled_from(["user", "system", "developer", "assistant", "tool", "bot"]),
                       "content": st.one_of(TEXT, MESSAGE_PARTS), "tool_calls": JSON, "name": TEXT})
A2A_PART = shaped({"text": TEXT, "data": JSON, "mediaType": TEXT})
A2A_MESSAGE = shaped({"messageId": TEXT, "role": st.sampled_from(["ROLE_USER", "ROLE_AGENT", "user", "ROLE_X"]),
                      "parts": st.lists(A2A_PART, max_size=3), "taskId": TEXT, "contextId": TEXT,
                      "metadata": JSON})
AGUI_MESSAGE = shaped({"id": TEXT, "role": st.sampled_from(["user", "assistant", "system", "tool", "x"]),
                       "content": TEXT})
THREAD = st.one_of(st.text(max_size=20), st.from_regex(r"\Afz[a-z0-9]{6}\Z"), st.sampled_from(["..", "-rf", ""]))


def _nodes(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) of ``value``'s objects and arrays, outermost first."""
    found: list[tuple[Any, Any]] = []
    todo = [value]
    while todo:
        node = todo.pop(0)
        pairs = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in pairs:
            found.append((node, key))
            todo.append(child)
    return found


def _replaced(valid: Any, at: int, value: Any) -> Any:
    """``valid`` with one of its fields (the ``at``-th, round the count) replaced by ``value``."""
    copy = json.loads(json.dumps(valid))
    nodes = _nodes(copy)
    if nodes:
        node, key = nodes[at % len(nodes)]
        node[key] = value
    return copy


def bodies(valid: st.SearchStrategy[Any], fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """A valid body, a valid body with one field of any type, or an object of ``fields`` (or none) as they come."""
    return st.one_of(valid, st.builds(_replaced, valid, st.integers(0, 1000), JSON), shaped(fields))


def _rest(key: str) -> Callable[[Target], str]:
    path = next(ep.path for ep in ENDPOINTS if ep.key == key)
    return lambda t: path.format(instance_id=t.chat if key == "message" else t.held, call_id=t.call)


@attrs.frozen
class Surface:
    """One POST endpoint: which error shapes it may answer with, where it is, what its bodies look like."""

    kind: str
    path: Callable[[Target], str]
    body: Callable[[Target], st.SearchStrategy[Any]]


PROMPT = st.text(min_size=1, max_size=30)
NAMES = st.sampled_from(["chat", "held"])
RPC_ID = st.one_of(st.integers(), st.text(max_size=5), st.none())


def _start(t: Target) -> st.SearchStrategy[Any]:
    valid = st.fixed_dictionaries({"definition": NAMES}, optional={"prompt": PROMPT, "inputs": st.just({})})
    return bodies(valid, {"definition": st.sampled_from(["chat", "held", "nope", "", "agents/chat.yaml", "../chat"]),
                          "inputs": st.dictionaries(st.text(max_size=5), JSON, max_size=3), "prompt": TEXT})


def _message(t: Target) -> st.SearchStrategy[Any]:
    return bodies(st.fixed_dictionaries({"text": PROMPT}), {"text": TEXT})


def _decide(t: Target) -> st.SearchStrategy[Any]:
    # The first valid one decides the held call (200); those after it are 409s.
    valid = st.fixed_dictionaries({"decision": st.sampled_from(["approve", "deny"]), "digest": st.just(t.digest)},
                                  optional={"reason": PROMPT})
    return bodies(valid, {"decision": st.sampled_from(["approve", "deny", "approved", "yes"]),
                          "digest": st.sampled_from([t.digest, "0" * 64, t.digest.upper(), ""]), "reason": TEXT})


def _openai(t: Target) -> st.SearchStrategy[Any]:
    user = st.fixed_dictionaries({"role": st.just("user"), "content": PROMPT})
    valid = st.fixed_dictionaries({"model": st.sampled_from(["loopwright/chat", "loopwright/held"]),
                                   "messages": st.lists(user, min_size=1, max_size=2)},
                                  optional={"stream": st.booleans(),
                                            "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()})})
    return bodies(valid, {
        "model": st.sampled_from(["loopwright/chat", "loopwright/held", "loopwright/", "chat", "gpt-4o"]),
        "messages": st.lists(CHAT_MESSAGE, max_size=3), "stream": st.booleans(),
        "stream_options": shaped({"include_usage": st.booleans()}), "n": st.integers(0, 2),
        "inputs": JSON, "tools": JSON, "temperature": st.floats(0, 2)})


def _a2a(t: Target) -> st.SearchStrategy[Any]:
    message = st.fixed_dictionaries({"messageId": st.uuids().map(str), "role": st.just("ROLE_USER"),
                                     "parts": st.lists(st.fixed_dictionaries({"text": PROMPT}), min_size=1,
                                                       max_size=2)})
    valid = st.one_of(
        st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "id": st.integers(0, 99),
                               "method": st.sampled_from(["SendMessage", "SendStreamingMessage"]),
                               "params": st.fixed_dictionaries({"message": message})}),
        st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "id": st.integers(0, 99),
                               "method": st.sampled_from(["GetTask", "ListTasks", "CancelTask"]),
                               "params": st.fixed_dictionaries({}, optional={"id": st.sampled_from([t.chat, "x"])})}))
    return bodies(valid, {
        "jsonrpc": st.just("2.0"), "id": RPC_ID,
        # No SubscribeToTask: on a task that rests it waits for the next event, as it should.
        "method": st.sampled_from(["SendMessage", "SendStreamingMessage", "GetTask", "ListTasks", "CancelTask",
                                   "GetExtendedAgentCard", "message/send", "nope"]),
        "params": shaped({"message": A2A_MESSAGE, "id": TEXT, "configuration": JSON, "metadata": JSON,
                          "historyLength": st.integers(-2, 5)})})


def _agui(t: Target) -> st.SearchStrategy[Any]:
    user = st.fixed_dictionaries({"id": st.just("m1"), "role": st.just("user"), "content": PROMPT})
    valid = st.fixed_dictionaries({"threadId": st.from_regex(r"\Afz[a-z0-9]{8}\Z"), "runId": st.just("r1"),
                                   "messages": st.lists(user, min_size=1, max_size=2), "state": st.just({}),
                                   "tools": st.just([]), "context": st.just([]), "forwardedProps": st.just({})})
    return bodies(valid, {
        "threadId": THREAD, "runId": TEXT, "parentRunId": TEXT, "state": JSON,
        "messages": st.lists(AGUI_MESSAGE, max_size=3), "tools": st.lists(JSON, max_size=2),
        "context": st.lists(JSON, max_size=2), "forwardedProps": shaped({"inputs": JSON}),
        "resume": st.lists(shaped({"interruptId": st.sampled_from([t.call, "x"]),
                                   "status": st.sampled_from(["resolved", "cancelled"]),
                                   "payload": shaped({"approved": st.booleans(), "digest": st.just(t.digest)})}),
                           max_size=2)})


def _mcp(t: Target) -> st.SearchStrategy[Any]:
    valid = st.one_of(
        st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "id": st.integers(2, 99), "method": st.just("tools/call"),
                               "params": st.fixed_dictionaries({
                                   "name": NAMES, "arguments": st.fixed_dictionaries({"prompt": PROMPT})})}),
        st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "id": st.integers(2, 99),
                               "method": st.sampled_from(["tools/list", "ping"])}))
    return bodies(valid, {
        "jsonrpc": st.just("2.0"), "id": RPC_ID,
        "method": st.sampled_from(["initialize", "tools/list", "tools/call", "ping", "notifications/initialized",
                                   "resources/list", "nope"]),
        "params": shaped({"name": NAMES, "arguments": shaped({"prompt": TEXT, "inputs": JSON}),
                          "protocolVersion": TEXT, "capabilities": JSON, "clientInfo": JSON})})


SURFACES: dict[str, Surface] = {
    "start_instance": Surface("rest", _rest("start_instance"), _start),
    "message": Surface("rest", _rest("message"), _message),
    "decide": Surface("rest", _rest("decide"), _decide),
    "openai": Surface("openai", lambda _t: "/openai/v1/chat/completions", _openai),
    "a2a": Surface("jsonrpc", lambda _t: "/a2a/chat", _a2a),
    "agui": Surface("agui", lambda _t: "/agui/chat", _agui),
    "mcp": Surface("jsonrpc", lambda _t: "/mcp", _mcp),
}
CONTENT_TYPES = st.sampled_from(["application/json", "application/json", "application/json; charset=utf-8",
                                 "APPLICATION/JSON", "text/plain", "application/x-www-form-urlencoded",
                                 "application/problem+json", None])
#: The REST endpoints' request schemas, as ``/openapi.json`` publishes them.
SCHEMAS = {ep.key: json_schema(ep.body) for ep in ENDPOINTS if ep.body is not None}


# -- what must come back -----------------------------------------------------------------------


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json(data: bytes) -> Any:
    """``data`` decoded as strict JSON (no NaN, no infinity, only text in its strings), or ``None``."""
    try:
        value = json.loads(data, parse_constant=_refuse)
        json.dumps(value, ensure_ascii=False).encode()  # an unpaired surrogate does not encode
    except ValueError:
        return None
    return value


def _internal_errors(media: str, data: bytes) -> list[Any]:
    """The JSON-RPC ``-32603`` (internal error: the server's own failure) errors of an answer, or of its events."""
    if media == "text/event-stream":
        docs = [_json(line[5:]) for line in data.splitlines() if line.startswith(b"data:")]
    else:
        docs = [_json(data)]
    errors = [d.get("error") for d in docs if isinstance(d, dict)]
    return [e for e in errors if isinstance(e, dict) and e.get("code") == -32603]


def _is_error_shape(kind: str, status: int, media: str, data: bytes) -> bool:
    """Whether a 4xx answer is a problem document, or the surface's protocol's own error."""
    doc = _json(data)
    if not isinstance(doc, dict):
        return kind == "jsonrpc" and status == 400 and data == b"Invalid Content-Type header"
    if media == "application/problem+json":
        return doc.get("status") == status and isinstance(doc.get("title"), str)
    error = doc.get("error")
    if kind == "openai" and media == "application/json":
        return isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)
    if kind == "jsonrpc" and media == "application/json":
        return doc.get("jsonrpc") == "2.0" and isinstance(error, dict) and isinstance(error.get("code"), int)
    return False


def post(target: Target, name: str, body: bytes | Iterator[bytes], content_type: str | None, *,
         path: str | None = None, sent: Any = None) -> int:
    """POST ``body`` to surface ``name``; check the answer and that the server still answers; return the status.

    :param sent: The decoded body, when it is JSON, for the REST endpoints' schema check.
    """
    surface = SURFACES[name]
    headers = _mcp_headers(target.session) if name == "mcp" else {"A2A-Version": "1.0"} if name == "a2a" else {}
    headers.pop("Content-Type", None)
    if content_type is not None:
        headers["Content-Type"] = content_type
    started, logged = time.monotonic(), len(target.server.stderr_lines)
    data = b""
    try:
        with target.client.stream("POST", path or surface.path(target), content=body, headers=headers) as response:
            for piece in response.iter_bytes():  # a stream (a valid AG-UI run, SSE) is read to its end
                data += piece
                assert time.monotonic() - started < HANG_GUARD, f"no end after {HANG_GUARD} s: {data[-500:]!r}"
    except httpx.TimeoutException as exc:
        raise AssertionError(f"{name}: no answer within {HANG_GUARD} s ({exc!r})") from None
    status, media = response.status_code, response.headers.get("content-type", "").partition(";")[0].strip()
    said = f"{name} {status} {media}: {data[:400]!r}"
    assert 200 <= status < 300 or 400 <= status < 500, said
    assert not _internal_errors(media, data), said  # JSON-RPC's 500
    if status >= 400:
        assert _is_error_shape(surface.kind, status, media, data), said
    elif surface.kind == "rest" and path is None:
        # A 2xx of the API answers a body that is JSON and that its published schema accepts.
        assert sent is not None, said
        jsonschema.validate(sent, SCHEMAS[name])
    up = target.client.get(f"/v1/instances/{target.chat}")
    assert up.status_code == 200, (up.text[:300], target.server.stderr[-3000:])
    assert target.server.process.poll() is None, target.server.stderr[-3000:]
    failed = [line for line in target.server.stderr_lines[logged:] if any(m in line for m in SERVER_FAILURES)]
    assert not failed, "".join(target.server.stderr_lines[logged:])[-5000:]
    return status


#: What the server logs when it fails itself: uvicorn's 500, the app's own handler, a2a-sdk's -32603.
SERVER_FAILURES = ("Exception in ASGI application", "loopwright serve: unexpected error", "Unhandled exception")


def _encode(value: Any, ascii_only: bool) -> tuple[bytes, Any]:
    """The body's bytes, and the value when it is strict JSON (NaN and infinity are not)."""
    body = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    return body, _json(body)


# -- the properties ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SURFACES))
@fuzz(20)
@given(data=st.data(), content_type=CONTENT_TYPES, ascii_only=st.booleans())
def test_json_bodies_get_a_4xx_or_a_2xx(target: Target, name: str, data: st.DataObject, content_type: str | None,
                                        ascii_only: bool) -> None:
    """Any JSON, or an object of the endpoint's keys with values of any type: never a 5xx."""
    value = data.draw(SURFACES[name].body(target), label="body")
    body, sent = _encode(value, ascii_only)
    post(target, name, body, content_type, sent=sent)


def _deep(depth: int, shape: str) -> bytes:
    if shape == "arrays":
        return b"[" * depth + b"]" * depth
    if shape == "objects":
        return b'{"a":' * depth + b"1" + b"}" * depth
    if shape == "open":  # never closed
        return b"[" * depth
    if shape == "in_a_field":
        return b'{"definition": "chat", "text": "x", "messages": ' + b"[{" * (depth // 2) + b"]"
    return b'["\\"' + b"[" * 200 + b'", ' + b"{" * depth  # brackets in a string first, then real ones


@fuzz(25)
@given(name=st.sampled_from(list(SURFACES)), depth=st.integers(10_000, 200_000),
       shape=st.sampled_from(["arrays", "objects", "open", "in_a_field", "after_a_string"]),
       content_type=CONTENT_TYPES, chunked=st.booleans())
@example(name="openai", depth=10_000, shape="arrays", content_type="text/plain", chunked=False)
@example(name="a2a", depth=10_000, shape="objects", content_type="text/plain", chunked=False)
def test_deep_bodies_get_a_4xx(target: Target, name: str, depth: int, shape: str,  # noqa: PLR0917 - drawn
                               content_type: str | None, chunked: bool) -> None:
    """Nested 10,000 to 200,000 deep (or too big): a 400, 413 or 415 whatever the Content-Type says, never a 500.

    The two examples were 500s: a body sent as ``text/plain`` skipped the depth count, and the
    OpenAI-compatible and A2A surfaces parse it as JSON all the same (a ``RecursionError``).
    """
    body = _deep(depth, shape)
    status = post(target, name, iter([body[:4096], body[4096:]]) if chunked else body, content_type)
    assert status in {400, 413, 415}, status


@fuzz(12)
@given(name=st.sampled_from(list(SURFACES)), size=st.one_of(st.integers(LIMIT - 64, LIMIT + 64),
                                                            st.integers(LIMIT + 65, 2 * LIMIT)),
       chunked=st.booleans(), content_type=st.sampled_from(["application/json", "text/plain", None]))
def test_bodies_around_the_limit_get_an_answer(target: Target, name: str, size: int, chunked: bool,
                                               content_type: str | None) -> None:
    """A string in a known field, the whole body just under, at or over ``maxBodyBytes``: over it is a 413."""
    head = b'{"definition": "chat", "model": "loopwright/chat", "text": "'
    body = head + b"x" * max(0, size - len(head) - 2) + b'"}'
    pieces = iter([body[i:i + 65536] for i in range(0, len(body), 65536)]) if chunked else body
    status = post(target, name, pieces, content_type, sent=_json(body))
    if len(body) > LIMIT:
        assert status == 413, status


NOT_JSON = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"", b" ", b"{", b"nul", b"[]", b"null", b'"x"', b"{'a': 1}", b'{"a": NaN}', b'{"a": 1e999}',
                     b'{"a": -Infinity}', b"{}{}", b'{"a":1,}', b"\xef\xbb\xbf{}", b"\xff\xfe{\x00}\x00",
                     b'{"text": "\xed\xa0\x80"}', b'{"text": "\xc3\x28"}', b'{"text": "\\ud800"}', b"\x00" * 10]),
    st.tuples(JSON.map(lambda v: json.dumps(v).encode()), st.integers(0, 100),
              st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00", b"\x80", b"\xf4\x90\x80\x80"]))
    .map(lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:]),
)


@fuzz(40)
@given(name=st.sampled_from(list(SURFACES)), body=NOT_JSON, content_type=CONTENT_TYPES)
@example(name="a2a", body=b"\x80", content_type="application/json")
@example(name="a2a", body=b"\x00\x00\x00{\x00", content_type="application/json")
@example(name="a2a", body=b'{"jsonrpc": "2.0", "id": "\\ud800", "method": "GetTask", "params": {}}',
         content_type="application/json")
@example(name="a2a", body=b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": "\\ud800"}',
         content_type="application/json")
@example(name="start_instance", body=b'{"definition": "chat", "prompt": "\\ud800"}', content_type="application/json")
@example(name="message", body=b'{"text": "\xed\xa0\x80"}', content_type="application/json")
@example(name="openai", body=b'{"model": "loopwright/chat", "messages": [{"role": "user", "content": "\\udfff"}]}',
         content_type="application/json")
def test_bytes_that_are_no_json_get_a_4xx(target: Target, name: str, body: bytes, content_type: str | None) -> None:
    """Random bytes, invalid UTF-8 spliced into JSON, literals JSON has not, a BOM: a 4xx (or a 2xx if valid).

    The examples were failures: bytes that do not decode (as UTF-8, or as the UTF-32 that JSON
    guesses from NULs) were a JSON-RPC internal error (-32603) on A2A; an unpaired surrogate (an
    escape or its bytes) in a string was a 500 on the REST API and ``/openai/v1`` (the store cannot
    write it as UTF-8), and on A2A a 500 (the id echoed) or a -32603 (the error echoing it).
    """
    post(target, name, body, content_type, sent=_json(body))


@fuzz(30)
@given(call=st.text(min_size=1, max_size=300), instance=st.text(min_size=1, max_size=40),
       which=st.sampled_from(["call", "instance_message", "instance_decide"]))
def test_ids_in_the_path_get_a_4xx(target: Target, call: str, instance: str, which: str) -> None:
    """Any Unicode as the call id or the instance id of a path (percent-encoded): a 4xx, nothing decided."""
    if call == target.kept_call or instance in (target.kept, target.chat):
        return
    body = json.dumps({"decision": "deny", "digest": target.kept_digest}).encode()
    if which == "call":
        path, name = f"/v1/instances/{target.kept}/approvals/{quote(call, safe='')}", "decide"
    elif which == "instance_message":
        path, name = f"/v1/instances/{quote(instance, safe='')}/messages", "message"
        body = b'{"text": "hi"}'
    else:
        path, name = f"/v1/instances/{quote(instance, safe='')}/approvals/{target.kept_call}", "decide"
    assert 400 <= post(target, name, body, "application/json", path=path) < 500
    (pending,) = target.client.get(f"/v1/instances/{target.kept}").json()["pendingApprovals"]
    assert pending["toolCallId"] == target.kept_call  # the call still waits: no other path decided it

"""Fuzzing the ids a model gives its tool calls: any Unicode text, and the runtime still names each call once.

A model chooses its calls' ids, and nothing makes them unique, URL-safe or even non-empty. The
runtime gives each call its own id, ``lw-TURN-INDEX-RANDOM6HEX``, and keeps the model's as the
call's wire id (:attr:`loopwright.ToolCall.provider_id`), which goes back to the model with the
call's result. Here the model's ids are any text: empty, ``/``, ``..``, ``%2F``, control
characters, right-to-left marks, 100,000 characters long, the shape of a runtime id, and the
same id twice in one reply or again in a later turn.

In process (a host runtime, a file store, a model that answers with the ids exactly as drawn:
the ``scripted`` provider would fill in an empty one), for 1 to 3 turns of 1 to 4 calls, some of
a tool that needs approval:

* every call gets a runtime id of that shape, unique in the instance;
* the model's id is the call's wire id, unless it is empty or repeats an earlier id of the same
  reply (then the runtime's id goes on the wire);
* every call gets exactly one result, under its runtime id with its wire id, and on the wire (the
  next request as the Chat Completions encoder writes it) each assistant message's calls are
  answered by the tool messages after it, one each, with the ids the model gave;
* a held call is approved or denied by its runtime id and its digest; the instance rests
  (``waiting``), never ``error``.

Over HTTP (one ``loopwright serve`` for the module, a provider plugin that makes the calls its
prompt lists), the held calls are decided with ``POST /v1/instances/ID/approvals/RUNTIME_ID``
and their digests, and the saved transcript is checked the same way.
"""

from __future__ import annotations

import collections
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import anyio.from_thread
import httpx
import ids_plugin
import pytest
from fuzzing import HANG_GUARD, fuzz
from hypothesis import example, given
from hypothesis import strategies as st
from ids_plugin import ARGUMENTS, echo, guarded

import loopwright
from loopwright import Message, ModelRequest, ModelResponse, ToolCall, approval_digest, hookimpl
from loopwright._definition import Assembly, StoreConfig
from loopwright.abc import Provider
from loopwright_openai._wire import encode_message

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "serve" / "tests"))
from _serve_testlib import Server, serving

RUNTIME_ID = re.compile(r"^lw-\d+-\d+-[0-9a-f]{6}$")
"""The shape of the runtime's own id for a tool call: ``lw-TURN-INDEX-RANDOM6HEX``."""


class IdsModel(Provider):
    """Answers with the replies queued, the calls' ids exactly as given; keeps each request's messages."""

    def __init__(self) -> None:
        self.replies: collections.deque[ModelResponse] = collections.deque()
        self.requests: list[tuple[Message, ...]] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(tuple(request.messages))
        return self.replies.popleft()


class _Plugin:
    def __init__(self, model: IdsModel) -> None:
        self.model = model

    @hookimpl
    def loopwright_register_providers(self, register: Callable[..., None]) -> None:
        register("ids", lambda _settings: self.model)

    @hookimpl
    def loopwright_register_tools(self, register: Callable[..., None]) -> None:
        register(echo, guarded)


class Host:
    """A runtime open in a blocking portal's event loop, shared by the examples of the module."""

    def __init__(self, portal: anyio.from_thread.BlockingPortal, rt: loopwright.Runtime, model: IdsModel) -> None:
        self.portal = portal
        self.rt = rt
        self.model = model
        self.definition = loopwright.Definition(name="ids", model="ids:m", tools=("echo", "guarded"))

    def run(self, turns: Sequence[Sequence[tuple[str, str]]], approve: Sequence[bool]) -> tuple[str, list[Any]]:
        """Run one agent whose model makes ``turns`` of (model id, tool) calls, then answers.

        Each held call is approved (``approve[k]`` true, round the list) or denied by its runtime
        id and digest. Return the final state and the saved messages.
        """
        self.model.requests.clear()
        self.model.replies.clear()
        for turn in turns:
            calls = tuple(ToolCall(id=i, name=tool, arguments=ARGUMENTS[tool]) for i, tool in turn)
            self.model.replies.append(ModelResponse(message=Message(role="assistant", tool_calls=calls),
                                                    finish_reason="tool_calls"))
        self.model.replies.append(ModelResponse(message=Message(role="assistant", content="done")))

        async def run() -> tuple[str, list[Any]]:
            agent = await self.rt.start_agent(self.definition, prompt="go")
            decided = 0
            with anyio.fail_after(HANG_GUARD):
                result = await agent.wait()
                while result.state is loopwright.State.WAITING_FOR_APPROVAL:
                    for held in [p for p in await agent.pending_approvals() if p.decision is None]:
                        assert RUNTIME_ID.match(held.tool_call_id), held
                        decide = agent.approve if approve[decided % len(approve)] else agent.deny
                        decided += 1
                        await decide(held.tool_call_id, digest=approval_digest(held))
                    result = await agent.wait()
            entries = await self.rt.store.read_entries(agent.instance_id)
            return str(result.state), [e["m"] for e in entries if e.get("t") == "msg"]

        return self.portal.call(run)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    store = tmp_path_factory.mktemp("fuzz-ids") / "store"
    model = IdsModel()
    asm = Assembly(store=StoreConfig(kind="file", options={"path": str(store)}))
    with anyio.from_thread.start_blocking_portal() as portal:
        rt = loopwright.Runtime(asm, plugins=(_Plugin(model),), autoload=False)
        with portal.wrap_async_context_manager(rt):
            yield Host(portal, rt, model)


#: Ids that have broken something somewhere: paths, escapes, controls, bidi, runtime look-alikes.
SPECIAL = ["", " ", "/", "..", "../..", "%2F", "%2e%2e", "a/b", "a\\b", "\x00", "\n", "\r\n", "\t", "\x7f",
           "\u202e", "\ufeff", "🙂", "call_1", "lw-1-0-abcdef", "lw-0-0-000000", "?x=1#y", "<script>", '"', "'",
           "x" * 100_000]
IDS = st.one_of(st.sampled_from(SPECIAL), st.text(max_size=12), st.text(min_size=200, max_size=600))
TOOLS = st.sampled_from(["echo", "echo", "guarded"])


@st.composite
def plans(draw: st.DrawFn, turns: int = 3) -> list[list[tuple[str, str]]]:
    """1 to ``turns`` turns of 1 to 4 calls; ids often drawn again from the example's earlier ones."""
    pool = draw(st.lists(IDS, min_size=1, max_size=3), label="pool")
    out = []
    for _ in range(draw(st.integers(1, turns))):
        ids = st.one_of(st.sampled_from(pool), IDS)
        out.append(draw(st.lists(st.tuples(ids, TOOLS), min_size=1, max_size=4)))
    return out


def _expected_wire(turn: Sequence[tuple[str, str]]) -> list[str | None]:
    """The wire id each call of a reply keeps: the model's, unless it is empty or came earlier in the reply."""
    seen: set[str] = set()
    out: list[str | None] = []
    for model_id, _tool in turn:
        out.append(model_id if model_id and model_id not in seen else None)
        seen.add(model_id)
    return out


def check_transcript(turns: Sequence[Sequence[tuple[str, str]]], messages: list[dict[str, Any]]) -> None:
    """The saved calls and results: runtime ids, unique; the model's ids kept; one result per call."""
    made = [m["toolCalls"] for m in messages if m.get("role") == "assistant" and m.get("toolCalls")]
    assert len(made) == len(turns), made
    ids = [c["id"] for calls in made for c in calls]
    assert all(RUNTIME_ID.match(i) for i in ids), ids
    assert len(set(ids)) == len(ids), ids
    for turn, calls in zip(turns, made, strict=True):
        assert [c["name"] for c in calls] == [tool for _, tool in turn]
        assert [c.get("wireId") for c in calls] == _expected_wire(turn)
    results = collections.Counter((m["toolCallId"], m.get("toolCallWireId"))
                                  for m in messages if m.get("role") == "tool")
    calls_made = collections.Counter((c["id"], c.get("wireId")) for calls in made for c in calls)
    assert results == calls_made  # each call exactly one result, under its ids


def check_wire(turns: Sequence[Sequence[tuple[str, str]]], sent: tuple[Message, ...]) -> None:
    """The last request, as Chat Completions sends it: each call answered once after it, under the model's id."""
    wire = [encode_message(m) for m in sent]
    calls_seen = 0
    for k, message in enumerate(wire):
        if message["role"] != "assistant" or not message.get("tool_calls"):
            continue
        asked = [c["id"] for c in message["tool_calls"]]
        turn = turns[calls_seen]
        calls_seen += 1
        # The model's own ids go back to it (the runtime's where it gave none, or repeated one).
        expected = _expected_wire(turn)
        assert [a for a, e in zip(asked, expected, strict=True) if e is not None] == [e for e in expected if e]
        assert all(RUNTIME_ID.match(a) for a, e in zip(asked, expected, strict=True) if e is None), asked
        assert len(set(asked)) == len(asked), asked  # within one message, a provider can pair them
        answers = []
        for after in wire[k + 1:]:
            if after["role"] != "tool":
                break
            answers.append(after["tool_call_id"])
        assert collections.Counter(answers) == collections.Counter(asked)
    assert calls_seen == len(turns)


@fuzz(60)
@given(turns=plans(), approve=st.lists(st.booleans(), min_size=1, max_size=4))
@example(turns=[[("", "echo"), ("", "guarded"), ("", "echo")]], approve=[True])
@example(turns=[[("a", "guarded"), ("a", "guarded")], [("a", "guarded")]], approve=[True, False])
@example(turns=[[("lw-1-0-abcdef", "echo"), ("/", "guarded"), ("..", "echo"), ("%2F", "guarded")]], approve=[True])
def test_any_call_ids_get_runtime_ids_and_go_back_on_the_wire(host: Host, turns: list[list[tuple[str, str]]],
                                                              approve: list[bool]) -> None:
    state, messages = host.run(turns, approve)
    assert state == "waiting", (state, messages[-1])
    check_transcript(turns, messages)
    check_wire(turns, host.model.requests[-1])
    held = [m for m in messages if m.get("role") == "tool" and m.get("name") == "guarded"]
    assert all(m["status"] in ("success", "denied") for m in held), held


# -- over HTTP ---------------------------------------------------------------------------------

TOKEN = "fuzz-ids-0123456789abcdef"  # noqa: S105 - a made-up token for this server
#: The model of the served agent: its prompt lists the calls to make, ``[[id, tool], ...]``.
MODEL_PLUGIN = Path(ids_plugin.__file__).read_text(encoding="utf-8")
ASSEMBLY = """\
store: {kind: file, path: ./store}
plugins: [model.py]
providers:
  model: {kind: planned}
agentDefinitions:
  ids: agents/ids.yaml
server:
  tokens:
    - {name: admin, tokenEnv: FUZZ_IDS_TOKEN, scopes: [admin]}
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, httpx.Client, Path]]:
    root = tmp_path_factory.mktemp("fuzz-ids-http")
    (root / "agents").mkdir()
    (root / "agents" / "ids.yaml").write_text("name: ids\nmodel: model:any\ntools: [echo, guarded]\n")
    (root / "model.py").write_text(MODEL_PLUGIN)
    (root / "loopwright.yaml").write_text(ASSEMBLY)
    env = {"FUZZ_IDS_TOKEN": TOKEN, "LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    with serving(root / "loopwright.yaml", env=env) as server, httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=HANG_GUARD) as client:
        yield server, client, root / "store"


def _rests(client: httpx.Client, instance_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + HANG_GUARD
    while True:
        summary = client.get(f"/v1/instances/{instance_id}").json()
        if summary["state"] not in ("running", "created"):
            return summary
        assert time.monotonic() < deadline, f"no rest within {HANG_GUARD} s: {summary}"
        time.sleep(0.02)


@pytest.mark.slow
@fuzz(25)
@given(turns=plans(turns=1).filter(lambda t: all(len(i) < 10_000 for i, _ in t[0])),
       approve=st.lists(st.booleans(), min_size=1, max_size=4))
@example(turns=[[("", "guarded"), ("/", "guarded"), ("/", "guarded"), ("%2F", "echo")]], approve=[True, False])
def test_held_calls_are_decided_over_http_by_runtime_id(served: tuple[Server, httpx.Client, Path],
                                                        turns: list[list[tuple[str, str]]],
                                                        approve: list[bool]) -> None:
    """``POST /v1/instances/ID/approvals/RUNTIME_ID`` with the digest decides each held call, whatever its model id."""
    server, client, store = served
    (turn,) = turns
    started = client.post("/v1/instances", json={"definition": "ids", "prompt": json.dumps(turn)})
    assert started.status_code == 201, started.text
    instance_id = started.json()["instanceId"]
    summary = _rests(client, instance_id)
    held = [p for p in summary["pendingApprovals"] if p.get("decision") is None]
    assert len(held) == sum(tool == "guarded" for _, tool in turn), summary
    for k, pending in enumerate(held):
        assert RUNTIME_ID.match(pending["toolCallId"]), pending
        decision = "approve" if approve[k % len(approve)] else "deny"
        answer = client.post(f"/v1/instances/{instance_id}/approvals/{quote(pending['toolCallId'], safe='')}",
                             json={"decision": decision, "digest": approval_digest(pending)})
        assert answer.status_code == 200, answer.text
        assert [d["toolCallId"] for d in answer.json()["decided"]] == [pending["toolCallId"]]
    summary = _rests(client, instance_id)
    assert summary["state"] == "waiting", summary
    # Split at newlines only: str.splitlines() also splits at U+0085 and U+2028, which ids hold.
    lines = (store / instance_id / "entries.jsonl").read_bytes().split(b"\n")
    messages = [m for m in (json.loads(line).get("m") for line in lines if line.strip()) if m]
    check_transcript(turns, messages)
    # The model's answer lists the ids it got back with the results: its own, where it kept them.
    made = next(m["toolCalls"] for m in messages if m.get("toolCalls"))
    assert sorted(json.loads(messages[-1]["content"])) == sorted(c.get("wireId") or c["id"] for c in made)
    assert server.process.poll() is None, server.stderr[-3000:]

"""Attacks on deciding held calls and on naming instances, over A2A, AG-UI and the ``/v1`` API (issue 25, points 2-4).

Each surface is played with its protocol's own client: a2a-sdk's client for A2A, ag-ui-protocol's
``RunAgentInput`` and event models over httpx for AG-UI (as ``plugins/serve/tests/test_agui.py``),
httpx for the ``/v1`` API. One ``python -m loopwright.cli serve`` serves the module, over an
assembly with a file store and one scripted provider per agent.

* **A stale digest.** Every agent here plays the same script: it asks to ``touch`` the file
  ``first`` and, once that is denied, ``second``, naming both calls by one model id
  (``call_same``). The runtime gives the second call a new id and digest; a client that decides
  it with the digest of the first (what a person saw before) is refused, with the current digest
  in the error, and nothing runs: no file is touched, the call stays pending and undecided. So is
  a decision on the first call's id, or on the model's id. With the digest shown, the call runs:
  the file appears (the control).
* **Ids that are no instance ids.** ``-rf``, ``--help``, ``.``, ``.hidden``, ``a/b`` as an A2A
  context or task id, an AG-UI thread id, or the id in a ``/v1/instances/ID`` path: a clear error
  the client sees (A2A an error response naming the rule, AG-UI and ``/v1`` a 400 problem
  document stating it), never a 500, and never an instance: the store gets no such entry. A
  valid id that names nothing is still a new instance (A2A, AG-UI) or a 404 (``/v1``): the controls.

A test fails if the attack succeeds: a file is touched by a refused decision, a decision is
saved, an instance is created from a refused id, or the server answers 500. Timeouts are hang
guards only.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Self

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import get_data_parts, new_data_part, new_text_part
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from ag_ui.core import Event, ResumeEntry, RunAgentInput, RunFinishedEvent, StateSnapshotEvent, UserMessage
from pydantic import TypeAdapter

from loopwright import INSTANCE_ID_RULE

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "serve" / "tests"))
from _serve_testlib import serving

# The token is a test value, made up for this server.
# ruff: noqa: S105

pytestmark = pytest.mark.slow

#: Seconds before a server or a request counts as hung (guards only).
GUARD = 60.0
TOKEN = "approver-0123456789abcdef-secret"
#: The ids the attacks name: each reads as an option, a folder of its own, a hidden file or a path.
REFUSED_IDS = ("-rf", "--help", ".", ".hidden", "a/b")

TOOLS = '''
"""A tool held for approval whose effect is visible: it creates effects/NAME beside this file."""
import re
from pathlib import Path

import loopwright

EFFECTS = Path(__file__).resolve().parent / "effects"


@loopwright.tool(requires_approval=True)
def touch(name: str) -> str:
    """Create the file effects/NAME.

    Args:
        name: The file's name (lowercase letters, digits and _).
    """
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"not a name: {name!r}")
    EFFECTS.mkdir(exist_ok=True)
    (EFFECTS / name).write_text("touched")
    return f"touched {name}"


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(touch)
'''



def reuser(surface: str) -> list[Any]:
    """The script of an agent that asks to touch SURFACE_first, then (once denied) SURFACE_second, both as call_same."""
    return [{"text": f"I will touch {surface}_first", "toolCalls": [
                {"name": "touch", "arguments": {"name": f"{surface}_first"}, "id": "call_same"}]},
            {"text": f"then {surface}_second", "toolCalls": [
                {"name": "touch", "arguments": {"name": f"{surface}_second"}, "id": "call_same"}]},
            "done"]


#: name → the replies of its own scripted provider.
AGENTS: dict[str, list[Any]] = {
    "a2a_reuser": reuser("a2a"), "agui_reuser": reuser("agui"), "rest_reuser": reuser("rest"),
    "a2a_chat": ["hello"] * 5, "agui_chat": ["hello"] * 5,
}

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("decisions")
    (root / "agents").mkdir()
    (root / "tools.py").write_text(TOOLS)
    for name in AGENTS:
        tools = ["touch"] if name.endswith("_reuser") else []
        (root / "agents" / f"{name}.yaml").write_text(json.dumps({"name": name, "model": f"{name}:any",
                                                                  "tools": tools}))
    (root / "loopwright.yaml").write_text(json.dumps({
        "store": {"kind": "file", "path": "./store"}, "plugins": ["loopwright_testing", "tools.py"],
        "providers": {name: {"kind": "scripted", "replies": replies} for name, replies in AGENTS.items()},
        "agentDefinitions": {name: f"agents/{name}.yaml" for name in AGENTS},
        "server": {"tokens": [{"name": "approver", "tokenEnv": "ATTACK_APPROVER",
                               "scopes": ["read", "run", "approve"]}]},
    }))
    return root


@pytest.fixture(scope="module")
def url(project: Path) -> Iterator[str]:
    env = {"ATTACK_APPROVER": TOKEN, "LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    with serving(project / "loopwright.yaml", env=env) as server:
        yield server.url
        # No request of this module made the server fail (a 500 logs "unexpected error").
        assert "unexpected error" not in server.stderr, server.stderr


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def stored(root: Path) -> list[str]:
    """Every entry of the store folder (none before the first instance)."""
    store = root / "store"
    return sorted(p.name for p in store.iterdir()) if store.is_dir() else []


def effects(root: Path, surface: str) -> list[str]:
    """What ran: the files the ``touch`` tool created for the agent of ``surface`` (``first``, ``second``)."""
    folder = root / "effects"
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    return [name.removeprefix(f"{surface}_") for name in names if name.startswith(f"{surface}_")]


def saved_approvals(root: Path, instance_id: str) -> list[tuple[str, str | None]]:
    """``(toolCallId, decision)`` of every pending approval the store saved for the instance."""
    header = json.loads((root / "store" / instance_id / "instance.json").read_text())
    return [(p["toolCallId"], p.get("decision")) for p in header.get("pendingApprovals") or []]


def ran(root: Path, instance_id: str) -> list[tuple[str, str]]:
    """``(toolCallId, status)`` of every tool call record of the instance: what ran, or was denied."""
    lines = (root / "store" / instance_id / "records.jsonl").read_text().splitlines()
    return [(r["data"]["toolCallId"], r["data"]["status"]) for r in map(json.loads, lines)
            if r.get("kind") == "tool_call" and r["data"].get("status")]


# ---------------------------------------------------------------------------------------------
# A2A
# ---------------------------------------------------------------------------------------------


class A2A:
    """a2a-sdk's client of ``/a2a/NAME``, not streaming, with the test's token."""

    def __init__(self, url: str, name: str) -> None:
        self.http = httpx.AsyncClient(headers=AUTH, timeout=GUARD)
        self.url = f"{url}/a2a/{name}"
        self.client: Any = None

    async def __aenter__(self) -> Self:
        self.client = await create_client(self.url, client_config=ClientConfig(httpx_client=self.http,
                                                                                  streaming=False))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        await self.http.aclose()

    async def send(self, *parts: Any, task_id: str = "", context_id: str = "") -> list[StreamResponse]:
        message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=list(parts), task_id=task_id,
                          context_id=context_id)
        return [r async for r in _responses(self.client, SendMessageRequest(message=message))]

    async def held(self, task_id: str) -> list[dict[str, Any]]:
        """The calls the task waits on, as A2A shows them (its status message's ``loopwright`` data)."""
        task: Task = await self.client.get_task(GetTaskRequest(id=task_id))
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, task
        data = next(d["loopwright"] for d in get_data_parts(task.status.message.parts) if "loopwright" in d)
        return list(data["pendingApprovals"])


async def _responses(client: Any, request: SendMessageRequest) -> AsyncIterator[StreamResponse]:
    async for response in client.send_message(request):
        yield response


def task_of(responses: list[StreamResponse]) -> tuple[str, TaskState]:
    """The task id and its last state, from a send's responses."""
    (response,) = responses
    assert response.HasField("task"), response
    return response.task.id, response.task.status.state


@pytest.mark.anyio
async def test_a2a_a_stale_digest_decides_and_runs_nothing(url: str, project: Path) -> None:
    async with A2A(url, "a2a_reuser") as agent:
        task_id, state = task_of(await agent.send(new_text_part("touch the files")))
        assert state == TaskState.TASK_STATE_INPUT_REQUIRED
        (first,) = await agent.held(task_id)
        assert first["arguments"] == {"name": "a2a_first"}
        denied = await agent.send(new_data_part({"deny": first["toolCallId"], "digest": first["digest"],
                                                 "reason": "not first"}), task_id=task_id)
        assert task_of(denied)[1] == TaskState.TASK_STATE_INPUT_REQUIRED
        (second,) = await agent.held(task_id)
        # The same model id (call_same), a new call: its own runtime id and digest.
        assert second["arguments"] == {"name": "a2a_second"}
        assert second["toolCallId"] != first["toolCallId"]
        assert second["digest"] != first["digest"]

        # Approving the new call with the digest the client saw before: refused, naming the current digest.
        with pytest.raises(InvalidParamsError) as stale:
            await agent.send(new_data_part({"approve": second["toolCallId"], "digest": first["digest"]}),
                             task_id=task_id)
        assert stale.value.data == {"toolCallId": second["toolCallId"], "currentDigest": second["digest"]}
        assert second["digest"] in stale.value.message
        # The first call's id with its own digest, and the model's id: neither decides the new call.
        for call, digest in ((first["toolCallId"], first["digest"]), ("call_same", first["digest"]),
                             ("call_same", second["digest"])):
            with pytest.raises(InvalidParamsError):
                await agent.send(new_data_part({"approve": call, "digest": digest}), task_id=task_id)
        assert await agent.held(task_id) == [second]
        assert saved_approvals(project, task_id)[-1] == (second["toolCallId"], None)
        assert effects(project, "a2a") == []
        assert ran(project, task_id) == [(first["toolCallId"], "denied")]

        # The control: with the digest shown, the call runs.
        done = await agent.send(new_data_part({"approve": second["toolCallId"], "digest": second["digest"]}),
                                task_id=task_id)
        assert task_of(done)[1] == TaskState.TASK_STATE_COMPLETED  # "done": answered, nothing open (issue 27)
    assert effects(project, "a2a") == ["second"]
    assert ran(project, task_id) == [(first["toolCallId"], "denied"), (second["toolCallId"], "success")]


@pytest.mark.anyio
async def test_a2a_an_id_that_is_no_instance_id_is_an_error_and_no_instance(url: str, project: Path) -> None:
    async with A2A(url, "a2a_chat") as agent:
        before = stored(project)
        for refused in REFUSED_IDS:
            with pytest.raises(InvalidParamsError) as caught:
                await agent.send(new_text_part("hello"), context_id=refused)
            assert repr(refused) in caught.value.message
            assert INSTANCE_ID_RULE in caught.value.message
            # As a task id, to continue, read or cancel: no such task (never an internal error). A client
            # never chooses a task id: only an instance this agent has is a task.
            for attempt in (agent.send(new_text_part("hello"), task_id=refused),
                            agent.client.get_task(GetTaskRequest(id=refused)),
                            agent.client.cancel_task(CancelTaskRequest(id=refused))):
                with pytest.raises(TaskNotFoundError):
                    await attempt
            assert stored(project) == before, refused
        # The control: a context id that follows the rule starts the instance of that id.
        task_id, state = task_of(await agent.send(new_text_part("hello"), context_id="ctx-ok"))
    assert (task_id, state) == ("ctx-ok", TaskState.TASK_STATE_COMPLETED)  # answered, nothing open (issue 27)
    assert stored(project) == sorted([*before, "ctx-ok"])


# ---------------------------------------------------------------------------------------------
# AG-UI
# ---------------------------------------------------------------------------------------------


def agui(url: str, name: str, thread: str, text: str | None = None,
         resume: list[ResumeEntry] | None = None) -> httpx.Response:
    """POST a ``RunAgentInput`` to ``/agui/NAME``, as an AG-UI client does."""
    body = RunAgentInput(thread_id=thread, run_id=str(uuid.uuid4()), resume=resume,
                         messages=[UserMessage(id=str(uuid.uuid4()), content=text)] if text else [])
    return httpx.post(f"{url}/agui/{name}", headers={**AUTH, "Accept": "text/event-stream"},
                      content=body.model_dump_json(by_alias=True), timeout=GUARD)


def agui_events(response: httpx.Response) -> list[Any]:
    """Parse each SSE ``data:`` line into the package's event model."""
    assert response.status_code == 200, response.text
    return [EVENTS.validate_json(line.removeprefix("data: ")) for line in response.text.splitlines()
            if line.startswith("data: ")]


def held_in(events: list[Any]) -> dict[str, Any]:
    """The one call a run ended waiting on, from its last state snapshot; its interrupt names it."""
    (pending,) = [e for e in events if isinstance(e, StateSnapshotEvent)][-1].snapshot["pendingApprovals"]
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent)
    assert [(i.id, i.metadata["digest"]) for i in finished.outcome.interrupts] == [
        (pending["toolCallId"], pending["digest"])]
    return dict(pending)


def approve(call: str, digest: str) -> list[ResumeEntry]:
    return [ResumeEntry(interrupt_id=call, status="resolved", payload={"approved": True, "digest": digest})]


def test_agui_a_stale_digest_decides_and_runs_nothing(url: str, project: Path) -> None:
    thread = "agui-stale"
    first = held_in(agui_events(agui(url, "agui_reuser", thread, "touch the files")))
    assert first["arguments"] == {"name": "agui_first"}
    denied = ResumeEntry(interrupt_id=first["toolCallId"], status="cancelled", metadata={"digest": first["digest"]})
    second = held_in(agui_events(agui(url, "agui_reuser", thread, resume=[denied])))
    assert second["arguments"] == {"name": "agui_second"}
    assert (second["toolCallId"], second["digest"]) != (first["toolCallId"], first["digest"])

    # The new call, approved with the digest of the one shown before: a 409 naming the current digest.
    stale = agui(url, "agui_reuser", thread, resume=approve(second["toolCallId"], first["digest"]))
    assert stale.status_code == 409, stale.text
    assert stale.headers["content-type"] == "application/problem+json"
    assert (stale.json()["toolCallId"], stale.json()["currentDigest"]) == (second["toolCallId"], second["digest"])
    # The first call's interrupt, or the model's id: no such interrupt; nothing decided either.
    for call, digest in ((first["toolCallId"], first["digest"]), ("call_same", second["digest"])):
        refused = agui(url, "agui_reuser", thread, resume=approve(call, digest))
        assert refused.status_code in {400, 409}, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
    assert saved_approvals(project, thread)[-1] == (second["toolCallId"], None)
    assert effects(project, "agui") == []
    assert ran(project, thread) == [(first["toolCallId"], "denied")]

    # The control: the digest shown runs the call.
    done = agui_events(agui(url, "agui_reuser", thread, resume=approve(second["toolCallId"], second["digest"])))
    assert done[-1].outcome.type == "success"
    assert effects(project, "agui") == ["second"]
    assert ran(project, thread) == [(first["toolCallId"], "denied"), (second["toolCallId"], "success")]


def test_agui_a_thread_id_that_is_no_instance_id_is_a_400_and_no_instance(url: str, project: Path) -> None:
    before = stored(project)
    for refused in REFUSED_IDS:
        for resume in (None, approve("lw-1-0-000000", "0" * 64)):
            answer = agui(url, "agui_chat", refused, "hello", resume=resume)
            assert answer.status_code == 400, (refused, answer.status_code, answer.text)
            assert answer.headers["content-type"] == "application/problem+json"
            problem = answer.json()
            assert problem["status"] == 400
            assert repr(refused) in problem["detail"]
            assert INSTANCE_ID_RULE in problem["detail"]
        assert stored(project) == before, refused
    # The control: a thread id that follows the rule starts the instance of that id.
    started = agui_events(agui(url, "agui_chat", "thread-ok", "hello"))
    assert started[-1].outcome.type == "success"
    assert stored(project) == sorted([*before, "thread-ok"])


# ---------------------------------------------------------------------------------------------
# The /v1 API
# ---------------------------------------------------------------------------------------------


def wait_held(url: str, instance_id: str, name: str) -> dict[str, Any]:
    """Wait until the instance waits on the ``touch`` call of ``name``; return that pending approval."""
    deadline = time.monotonic() + GUARD
    while True:
        shown = httpx.get(f"{url}/v1/instances/{instance_id}", headers=AUTH, timeout=GUARD).json()
        waiting = [p for p in shown["pendingApprovals"] if p["decision"] is None]
        if shown["state"] == "waiting_for_approval" and [p["arguments"] for p in waiting] == [{"name": name}]:
            return dict(waiting[0])
        assert time.monotonic() < deadline, shown
        time.sleep(0.05)


def test_rest_the_digest_of_a_call_whose_model_id_was_reused_runs_nothing(url: str, project: Path) -> None:
    created = httpx.post(f"{url}/v1/instances", json={"definition": "rest_reuser", "prompt": "touch the files"},
                         headers=AUTH, timeout=GUARD)
    assert created.status_code == 201, created.text
    iid = created.json()["instanceId"]
    first = wait_held(url, iid, "rest_first")
    base = f"{url}/v1/instances/{iid}/approvals"
    denied = httpx.post(f"{base}/{first['toolCallId']}", json={"decision": "deny", "digest": first["digest"]},
                        headers=AUTH, timeout=GUARD)
    assert denied.status_code == 200, denied.text
    second = wait_held(url, iid, "rest_second")
    assert second["toolCallId"].startswith("lw-2-0-"), second  # turn 2's call, under the model's id call_same
    assert second["digest"] != first["digest"]

    stale = httpx.post(f"{base}/{second['toolCallId']}", json={"decision": "approve", "digest": first["digest"]},
                       headers=AUTH, timeout=GUARD)
    assert stale.status_code == 409, stale.text
    assert stale.headers["content-type"] == "application/problem+json"
    problem = stale.json()
    assert (problem["instanceId"], problem["toolCallId"], problem["currentDigest"]) == (
        iid, second["toolCallId"], second["digest"])
    for call, digest in ((first["toolCallId"], first["digest"]), ("call_same", second["digest"])):
        refused = httpx.post(f"{base}/{call}", json={"decision": "approve", "digest": digest}, headers=AUTH,
                             timeout=GUARD)
        assert refused.status_code == 409, refused.text
    assert wait_held(url, iid, "rest_second") == second
    assert saved_approvals(project, iid)[-1] == (second["toolCallId"], None)
    assert effects(project, "rest") == []
    assert ran(project, iid) == [(first["toolCallId"], "denied")]

    approved = httpx.post(f"{base}/{second['toolCallId']}", json={"decision": "approve", "digest": second["digest"]},
                          headers=AUTH, timeout=GUARD)
    assert approved.status_code == 200, approved.text
    deadline = time.monotonic() + GUARD
    while (iid_state := httpx.get(f"{url}/v1/instances/{iid}", headers=AUTH, timeout=GUARD).json())["state"] != \
            "waiting":
        assert time.monotonic() < deadline, iid_state
        time.sleep(0.05)
    assert effects(project, "rest") == ["second"]
    assert ran(project, iid) == [(first["toolCallId"], "denied"), (second["toolCallId"], "success")]


def _segment(instance_id: str) -> str:
    """The id as one path segment: every byte percent-encoded, so no client or server reads ``.`` or ``/`` in it."""
    return "".join(f"%{byte:02X}" for byte in instance_id.encode())


def test_rest_an_id_in_the_path_that_is_no_instance_id_is_a_400(url: str, project: Path) -> None:
    before = stored(project)
    routes = [("GET", ""), ("GET", "/records"), ("GET", "/events"), ("POST", "/messages"), ("POST", "/cancel"),
              ("POST", "/approvals/lw-1-0-000000"), ("GET", "/nothing")]
    bodies = {"/messages": {"text": "hi"}, "/approvals/lw-1-0-000000": {"decision": "approve", "digest": "0" * 64},
              "/cancel": {}}
    for refused in REFUSED_IDS:
        # As written (where the client keeps it one segment), and with every byte percent-encoded.
        written = [refused] if refused not in {".", "a/b"} else []
        for segment in [*written, _segment(refused)]:
            for method, suffix in routes:
                answer = httpx.request(method, f"{url}/v1/instances/{segment}{suffix}", json=bodies.get(suffix),
                                       headers=AUTH, timeout=GUARD)
                assert answer.status_code == 400, (refused, segment, method, suffix, answer.text)
                assert answer.headers["content-type"] == "application/problem+json"
                problem = answer.json()
                assert (problem["status"], problem["title"]) == (400, "Invalid instance id")
                assert repr(refused) in problem["detail"]
                assert INSTANCE_ID_RULE in problem["detail"]
    assert stored(project) == before
    # The control: an id that follows the rule but names nothing is a 404; without the token, still a 401 first.
    unknown = httpx.get(f"{url}/v1/instances/20990101-000000-deadbeef", headers=AUTH, timeout=GUARD)
    assert unknown.status_code == 404, unknown.text
    assert httpx.get(f"{url}/v1/instances/-rf", timeout=GUARD).status_code == 401

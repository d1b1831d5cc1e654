"""The A2A surface, through ``loopwright serve`` in a subprocess and a2a-sdk's own client.

The agent ``helper`` plays a script: it calls ``delete`` (held for approval), then asks a
question with ``ask_user``, then completes with ``task_complete``. Each test starts its own
server over its own store; the restart test starts two over one store.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Self

import httpx
import pytest
from _serve_testlib import DELETE_TOOL_PLUGIN, Server, read_events, rests_in, serving
from a2a.client import A2ACardResolver, A2AClientError, ClientConfig, create_client
from a2a.helpers.proto_helpers import get_data_parts, get_text_parts, new_data_part, new_text_part
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from a2a.utils.errors import A2AError, InvalidParamsError

pytestmark = pytest.mark.anyio

#: Tokens (read from the environment by the server); each is at least 16 characters.
TOKENS = {"SERVE_TEST_RUN": "run-token-0123456789", "SERVE_TEST_APPROVE": "approve-token-0123456789",
          "SERVE_TEST_READ": "read-token-0123456789"}
RUN, APPROVE, READ = TOKENS["SERVE_TEST_RUN"], TOKENS["SERVE_TEST_APPROVE"], TOKENS["SERVE_TEST_READ"]

ASSEMBLY = """\
store: {kind: file, path: ./store}
plugins: [testing, tools.py]
server:
  tokens:
    - {name: runner, tokenEnv: SERVE_TEST_RUN, scopes: [read, run]}
    - {name: approver, tokenEnv: SERVE_TEST_APPROVE, scopes: [read, run, approve]}
    - {name: reader, tokenEnv: SERVE_TEST_READ, scopes: [read]}
providers:
  script:
    kind: scripted
    replies:
      - text: "I will delete it"
        toolCalls: [{name: delete, arguments: {path: old/notes.txt}, id: call_del}]
      - toolCalls: [{name: ask_user, arguments: {question: "Which colour?"}, id: call_ask}]
      - toolCalls: [{name: task_complete, arguments: {result: "all done", summary: "deleted"}, id: call_done}]
  other-script:
    kind: scripted
    stream: true
    replies: ["the other agent answers"]
agentDefinitions:
  helper: agents/helper.yaml
  other: agents/other.yaml
"""
DEFINITION = """\
name: helper
description: Deletes files when allowed, and asks when unsure.
model: script:any
tools: [delete, ask_user, task_complete]
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def assembly(tmp_path: Path) -> Path:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "helper.yaml").write_text(DEFINITION)
    (tmp_path / "agents" / "other.yaml").write_text("name: other\nmodel: other-script:any\n")
    (tmp_path / "tools.py").write_text(DELETE_TOOL_PLUGIN)
    path = tmp_path / "loopwright.yaml"
    path.write_text(ASSEMBLY)
    return path


class Agent:
    """An a2a-sdk client of ``/a2a/helper`` with one token."""

    def __init__(self, server: Server, token: str | None, *, streaming: bool) -> None:
        self.url = f"{server.url}/a2a/helper"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(headers=headers, timeout=60)
        self.streaming = streaming
        self.client: Any = None

    async def __aenter__(self) -> Self:
        self.client = await create_client(self.url, client_config=ClientConfig(httpx_client=self.http,
                                                                                  streaming=self.streaming))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        await self.http.aclose()

    async def send(self, *parts: Any, task_id: str = "", context_id: str = "") -> list[StreamResponse]:
        """Send a user message; return every response (one when not streaming)."""
        message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=list(parts), task_id=task_id,
                          context_id=context_id)
        return [response async for response in _responses(self.client, message)]

    async def get(self, task_id: str) -> Task:
        return await self.client.get_task(GetTaskRequest(id=task_id))


async def _responses(client: Any, message: Message) -> AsyncIterator[StreamResponse]:
    async for response in client.send_message(SendMessageRequest(message=message)):
        yield response


def final_task_state(responses: list[StreamResponse]) -> tuple[str, TaskState, Any]:
    """The task id, its last state and the last status message, from a run of responses."""
    task_id, state, message = "", TaskState.TASK_STATE_UNSPECIFIED, None
    for response in responses:
        if response.HasField("task"):
            task_id, state, message = response.task.id, response.task.status.state, response.task.status.message
        elif response.HasField("status_update"):
            update = response.status_update
            task_id, state, message = update.task_id, update.status.state, update.status.message
    return task_id, state, message


def loopwright_data(message: Any) -> dict[str, Any]:
    return next(d["loopwright"] for d in get_data_parts(message.parts) if "loopwright" in d)


async def test_the_card_describes_the_agent_its_endpoint_and_its_bearer_scheme(assembly: Path) -> None:
    with serving(assembly, env=TOKENS) as server:
        async with httpx.AsyncClient() as http:
            card = await A2ACardResolver(http, f"{server.url}/a2a/helper").get_agent_card()
        async with Agent(server, RUN, streaming=False) as agent:  # bad inputs: rejected, and no instance made
            message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[new_text_part("go")])
            message.metadata.update({"inputs": {"bogus": 1}})
            rejected = [r async for r in _responses(agent.client, message)]
        with server.client(READ) as client:
            assert client.get("/v1/instances").json() == []
    _, state, why = final_task_state(rejected)
    assert state == TaskState.TASK_STATE_REJECTED
    assert "unknown input 'bogus'" in next(iter(get_text_parts(why.parts)))
    assert card.name == "helper"
    assert card.description.startswith("Deletes files")
    assert [(i.url, i.protocol_binding, i.protocol_version) for i in card.supported_interfaces] == [
        (f"{server.url}/a2a/helper", "JSONRPC", "1.0")]
    assert card.capabilities.streaming
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert [list(r.schemes) for r in card.security_requirements] == [["bearer"]]
    assert [s.id for s in card.skills] == ["helper"]


async def test_a_streamed_task_asks_for_approval_and_input_then_completes(assembly: Path) -> None:
    with serving(assembly, env=TOKENS) as server:
        async with Agent(server, APPROVE, streaming=True) as agent:
            first = await agent.send(new_text_part("delete the old notes"))
            assert first[0].HasField("task"), "the stream starts with the task"
            task_id, state, message = final_task_state(first)
            assert state == TaskState.TASK_STATE_INPUT_REQUIRED
            held = loopwright_data(message)
            assert held["state"] == "waiting_for_approval"
            (pending,) = held["pendingApprovals"]
            assert (pending["tool"], pending["arguments"]) == ("delete", {"path": "old/notes.txt"})
            call = pending["toolCallId"]
            assert re.fullmatch(r"lw-1-0-[0-9a-f]{6}", call)  # the runtime's id (the model named it call_del)
            with server.client(READ) as http:  # the digest the serve API shows for the same held call
                assert [p["digest"] for p in http.get(f"/v1/instances/{task_id}").json()["pendingApprovals"]] == [
                    pending["digest"]]
            # The streamed approvalRequired update names the call, its arguments and its digest too.
            streamed = [d["approvalRequired"] for r in first if r.HasField("status_update")
                        and r.status_update.status.HasField("message")
                        for d in get_data_parts(r.status_update.status.message.parts) if "approvalRequired" in d]
            assert [(a["toolCallId"], a["digest"], a["arguments"]) for a in streamed] == [
                (call, pending["digest"], {"path": "old/notes.txt"})]
            assert pending["digest"] in next(iter(get_text_parts(message.parts)))
            # The answer streams as the artifact (the provider's piece), then is sent whole.
            updates = [r.artifact_update for r in first if r.HasField("artifact_update")]
            assert [(list(get_text_parts(u.artifact.parts)), u.append, u.last_chunk) for u in updates] == [
                (["I will delete it"], False, False), (["I will delete it"], False, True)]

            second = await agent.send(new_data_part({"approve": call, "digest": pending["digest"]}), task_id=task_id)
            data = [d for r in second if r.HasField("status_update") and r.status_update.status.HasField("message")
                    for d in get_data_parts(r.status_update.status.message.parts)]
            results = [d["toolResult"] for d in data if "toolResult" in d]
            assert {"id": call, "name": "delete", "status": "success", "content": "deleted old/notes.txt"} in [
                {k: r[k] for k in ("id", "name", "status", "content")} for r in results]
            _, state, message = final_task_state(second)
            assert state == TaskState.TASK_STATE_INPUT_REQUIRED
            assert loopwright_data(message)["question"] == "Which colour?"
            assert list(get_text_parts(message.parts)) == ["Which colour?"]

            third = await agent.send(new_text_part("blue"), task_id=task_id)
            _, state, message = final_task_state(third)
            assert state == TaskState.TASK_STATE_COMPLETED
            # The task_complete result is the answer artifact of the stream too (no text event carried it).
            (done,) = [r.artifact_update for r in third if r.HasField("artifact_update")]
            assert (list(get_text_parts(done.artifact.parts)), done.artifact.artifact_id, done.last_chunk) == (
                ["all done"], "answer", True)
            task = await agent.get(task_id)
            listed = await agent.client.list_tasks(ListTasksRequest())
            working = await agent.client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_WORKING))
        with server.client(READ) as http:
            instances = {i["instanceId"]: i for i in http.get("/v1/instances").json()}
    assert [t.id for t in listed.tasks] == [task_id]
    assert list(working.tasks) == []
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.context_id == task.id
    assert [list(get_text_parts(a.parts)) for a in task.artifacts] == [["all done"]]
    assert task.metadata["loopwright"]["instanceId"] == task_id
    assert instances[task_id]["state"] == "stopped"
    assert instances[task_id]["stopReason"] == "completed"


async def test_a_task_goes_on_after_the_server_restarts(assembly: Path) -> None:
    with serving(assembly, env=TOKENS) as server, server.client(READ):
        async with Agent(server, RUN, streaming=False) as agent:
            responses = await agent.send(new_text_part("delete the old notes"))
    assert len(responses) == 1
    task_id, state, _ = final_task_state(responses)
    assert state == TaskState.TASK_STATE_INPUT_REQUIRED

    with serving(assembly, env=TOKENS) as server:
        async with Agent(server, APPROVE, streaming=False) as agent:
            task = await agent.get(task_id)
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            (pending,) = loopwright_data(task.status.message)["pendingApprovals"]
            assert pending["tool"] == "delete"
            call = pending["toolCallId"]
            blind = {"deny": call, "reason": "keep it"}
            with pytest.raises(InvalidParamsError, match="digest"):  # a decision names the call it saw
                await agent.send(new_data_part(blind), task_id=task_id)
            # A digest that is not the pending call's is refused too, naming the current one; nothing is decided.
            with pytest.raises(InvalidParamsError) as stale:
                await agent.send(new_data_part({**blind, "digest": "0" * 64}), task_id=task_id)
            assert pending["digest"] in stale.value.message
            assert stale.value.data == {"toolCallId": call, "currentDigest": pending["digest"]}
            still = await agent.get(task_id)
            assert still.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            assert loopwright_data(still.status.message)["pendingApprovals"] == [pending]
            denied = await agent.send(new_data_part({**blind, "digest": pending["digest"]}), task_id=task_id)
            _, state, message = final_task_state(denied)
            assert state == TaskState.TASK_STATE_INPUT_REQUIRED
            assert loopwright_data(message)["question"] == "Which colour?"
            done = await agent.send(new_text_part("blue"), task_id=task_id)
            assert final_task_state(done)[1] == TaskState.TASK_STATE_COMPLETED
        with server.client(READ) as http:
            records = http.get(f"/v1/instances/{task_id}/records").json()
    calls = [r["data"] for r in records if r["kind"] == "tool_call" and r["data"].get("tool") == "delete"]
    assert calls[-1]["status"] == "denied"
    decisions = [r["data"] for r in records if r["kind"] == "approval" and r["data"].get("decision")]
    assert decisions == [{"toolCallId": call, "tool": "delete", "decision": "denied", "reason": "keep it",
                          "by": "token:approver"}]


async def test_a_call_approved_through_the_serve_api_goes_on_as_the_task(assembly: Path) -> None:
    with serving(assembly, env=TOKENS) as server:
        async with Agent(server, RUN, streaming=True) as agent:
            task_id, state, message = final_task_state(await agent.send(new_text_part("delete the old notes")))
            assert state == TaskState.TASK_STATE_INPUT_REQUIRED
            (pending,) = loopwright_data(message)["pendingApprovals"]
            with server.client(APPROVE) as http:
                decided = http.post(f"/v1/instances/{task_id}/approvals/{pending['toolCallId']}",
                                    json={"decision": "approve", "digest": pending["digest"]})
                assert decided.status_code == 200, decided.text
                read_events(http, task_id, rests_in("waiting"))  # the serve API's events: it asks its question
            task = await agent.get(task_id)
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            assert loopwright_data(task.status.message)["question"] == "Which colour?"
            done = await agent.send(new_text_part("blue"), task_id=task_id)
            assert final_task_state(done)[1] == TaskState.TASK_STATE_COMPLETED


async def test_deciding_needs_the_approve_scope_reading_the_read_scope_and_cancel_the_run_scope(assembly: Path) -> None:
    with serving(assembly, env=TOKENS) as server:
        async with Agent(server, RUN, streaming=False) as agent:
            task_id, state, message = final_task_state(await agent.send(new_text_part("delete the old notes")))
            assert state == TaskState.TASK_STATE_INPUT_REQUIRED
            (pending,) = loopwright_data(message)["pendingApprovals"]
            # The held call exactly as shown, its digest and all: still a 403 without the approve scope.
            with pytest.raises(A2AClientError, match="403"):
                await agent.send(new_data_part({"approve": pending["toolCallId"], "digest": pending["digest"]}),
                                 task_id=task_id)
            with pytest.raises(A2AClientError, match="403"):  # and so is a decision without its digest
                await agent.send(new_data_part({"approve": pending["toolCallId"]}), task_id=task_id)
            task = await agent.get(task_id)
            assert loopwright_data(task.status.message)["state"] == "waiting_for_approval"
        async with Agent(server, READ, streaming=False) as reader:
            with pytest.raises(A2AClientError, match="403"):
                await reader.send(new_text_part("start something"))
            assert (await reader.get(task_id)).id == task_id
            with pytest.raises(A2AClientError, match="403"):
                await reader.client.cancel_task(CancelTaskRequest(id=task_id))
        async with Agent(server, RUN, streaming=False) as agent:
            cancelled = await agent.client.cancel_task(CancelTaskRequest(id=task_id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            assert (await agent.get(task_id)).status.state == TaskState.TASK_STATE_CANCELED
        with server.client(READ) as http:
            instance = next(i for i in http.get("/v1/instances").json() if i["instanceId"] == task_id)
    assert (instance["state"], instance["cancelled"]) == ("stopped", True)


@pytest.mark.parametrize("token", [None, "not-a-token-0123456789"])
async def test_a_missing_or_wrong_token_is_refused(assembly: Path, token: str | None) -> None:
    with serving(assembly, env=TOKENS) as server:
        async with Agent(server, token, streaming=False) as agent:
            with pytest.raises(A2AClientError, match="401"):
                await agent.send(new_text_part("delete the old notes"))
            with pytest.raises(A2AClientError, match="401"):
                await agent.get("20260101-000000-00000000")
        with server.client(READ) as http:
            assert http.get("/v1/instances").json() == []


async def test_a_task_id_of_another_agents_instance_is_refused(assembly: Path) -> None:
    with serving(assembly, env=TOKENS) as server:
        async with Agent(server, APPROVE, streaming=False) as agent:
            other = Agent(server, APPROVE, streaming=False)
            other.url = f"{server.url}/a2a/other"
            async with other:
                streamed = await other.send(new_text_part("hello"))
                theirs, state, message = final_task_state(streamed)
                # It answered and waits on nobody: a completed task (issue 27), not input-required.
                assert state == TaskState.TASK_STATE_COMPLETED
                assert list(get_text_parts(message.parts)) == ["the other agent answers"]
                (task,) = [r.task for r in streamed if r.HasField("task")]
                assert [list(get_text_parts(a.parts)) for a in task.artifacts] == [["the other agent answers"]]
                # A completed task is final (A2A's rule, kept by a2a-sdk): a follow-up is refused, nothing runs.
                with pytest.raises(A2AError, match="terminal state"):
                    await other.send(new_text_part("and then?"), task_id=theirs)
            with pytest.raises(A2AError, match=f"Task {theirs} not found"):
                await agent.send(new_text_part("delete the old notes"), task_id=theirs)
            with pytest.raises(A2AError, match="not a task of the agent helper"):
                await agent.send(new_text_part("delete the old notes"), context_id=theirs)
            with pytest.raises(A2AError):
                await agent.get(theirs)
        with server.client(READ) as http:
            instance = next(i for i in http.get("/v1/instances").json() if i["instanceId"] == theirs)
    assert instance["name"] == "other"
    assert instance["state"] == "waiting"
    assert instance["usage"]["requests"] == 1

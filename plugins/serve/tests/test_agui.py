"""The AG-UI surface, through ``loopwright serve`` in a subprocess, decoded with ag-ui-protocol's own models.

A run's input is built with the package's ``RunAgentInput``; each SSE ``data:`` line of the
answer is parsed into the package's event union (``ag_ui.core.Event``), so an event the package
does not know, or a field it does not accept, fails the test. The agent plays the same script as
in test_a2a.py: ``delete`` (held for approval), ``ask_user``, ``task_complete``.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from _serve_testlib import DELETE_TOOL_PLUGIN, Server, serving
from ag_ui.core import (
    Event,
    EventType,
    ResumeEntry,
    RunAgentInput,
    RunFinishedEvent,
    StateSnapshotEvent,
    TextMessageContentEvent,
    ToolCallArgsEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)
from pydantic import TypeAdapter

TOKENS = {"SERVE_TEST_RUN": "run-token-0123456789", "SERVE_TEST_APPROVE": "approve-token-0123456789"}
RUN, APPROVE = TOKENS["SERVE_TEST_RUN"], TOKENS["SERVE_TEST_APPROVE"]

ASSEMBLY = """\
store: {kind: file, path: ./store}
plugins: [testing, tools.py]
server:
  tokens:
    - {name: runner, tokenEnv: SERVE_TEST_RUN, scopes: [read, run]}
    - {name: approver, tokenEnv: SERVE_TEST_APPROVE, scopes: [read, run, approve]}
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
model: script:any
tools: [delete, ask_user, task_complete]
"""

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)


@pytest.fixture
def assembly(tmp_path: Path) -> Path:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "helper.yaml").write_text(DEFINITION)
    (tmp_path / "agents" / "other.yaml").write_text("name: other\nmodel: other-script:any\n")
    (tmp_path / "tools.py").write_text(DELETE_TOOL_PLUGIN)
    path = tmp_path / "loopwright.yaml"
    path.write_text(ASSEMBLY)
    return path


def run_input(thread: str, text: str | None = None, resume: list[ResumeEntry] | None = None) -> RunAgentInput:
    messages = [UserMessage(id=str(uuid.uuid4()), content=text)] if text else []
    return RunAgentInput(thread_id=thread, run_id=str(uuid.uuid4()), messages=messages, resume=resume)


def post(server: Server, token: str | None, body: RunAgentInput) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{server.url}/agui/helper", headers={**headers, "Accept": "text/event-stream"},
                      content=body.model_dump_json(by_alias=True), timeout=60)


def events_of(response: httpx.Response) -> list[Any]:
    """Parse each SSE ``data:`` line into the package's event model."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return [EVENTS.validate_json(line.removeprefix("data: ")) for line in response.text.splitlines()
            if line.startswith("data: ")]


def kinds(events: list[Any]) -> list[str]:
    return [e.type.value if isinstance(e.type, EventType) else str(e.type) for e in events]


def test_a_run_with_a_tool_call_and_an_approval_interrupt_resumes_on_the_same_thread(assembly: Path) -> None:
    thread = "thread-1"
    with serving(assembly, env=TOKENS) as server:
        first = events_of(post(server, APPROVE, run_input(thread, "delete the old notes")))
        assert kinds(first) == [
            "RUN_STARTED", "STATE_SNAPSHOT",
            "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
            "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END",
            "STATE_SNAPSHOT", "RUN_FINISHED"]
        assert first[0].thread_id == thread
        assert [e.delta for e in first if isinstance(e, TextMessageContentEvent)] == ["I will delete it"]
        start = next(e for e in first if isinstance(e, ToolCallStartEvent))
        # A call the model named is t<TURN>-<its id> on AG-UI (known while it streams); interrupts and
        # resume name it by the runtime's own id, as the serve API does.
        assert start.tool_call_id == "t1-call_del"
        assert start.tool_call_name == "delete"
        assert json.loads(next(e for e in first if isinstance(e, ToolCallArgsEvent)).delta) == {"path": "old/notes.txt"}
        snapshot = [e for e in first if isinstance(e, StateSnapshotEvent)][-1].snapshot
        assert snapshot["instanceId"] == thread
        assert snapshot["state"] == "waiting_for_approval"
        (held,) = snapshot["pendingApprovals"]
        call = held["toolCallId"]
        assert re.fullmatch(r"lw-1-0-[0-9a-f]{6}", call), call
        assert (held["tool"], held["arguments"]) == ("delete", {"path": "old/notes.txt"})
        digest = held["digest"]
        assert re.fullmatch(r"[0-9a-f]{64}", digest)
        finished = first[-1]
        assert isinstance(finished, RunFinishedEvent)
        assert finished.outcome.type == "interrupt"
        assert [(i.id, i.reason, i.tool_call_id) for i in finished.outcome.interrupts] == [
            (call, "approval", "t1-call_del")]
        (interrupt,) = finished.outcome.interrupts
        # The interrupt shows the call with its digest, and the response it takes must carry that digest.
        assert interrupt.metadata == {"digest": digest, "tool": "delete", "arguments": {"path": "old/notes.txt"}}
        assert interrupt.response_schema["properties"]["digest"] == {"const": digest}
        assert "digest" in interrupt.response_schema["required"]
        with server.client(APPROVE) as http:  # the same digest as the serve API's
            assert [p["digest"] for p in http.get(f"/v1/instances/{thread}").json()["pendingApprovals"]] == [digest]

        approved = ResumeEntry(interrupt_id=call, status="resolved", payload={"approved": True, "digest": digest})
        second = events_of(post(server, APPROVE, run_input(thread, resume=[approved])))
        assert kinds(second) == [
            "RUN_STARTED", "STATE_SNAPSHOT",
            "TOOL_CALL_RESULT",
            "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END",
            "STATE_SNAPSHOT", "RUN_FINISHED"]
        result = next(e for e in second if isinstance(e, ToolCallResultEvent))
        assert (result.tool_call_id, result.content) == ("t1-call_del", "deleted old/notes.txt")
        asked = second[-1].outcome
        assert asked.type == "interrupt"
        (question,) = asked.interrupts
        assert re.fullmatch(r"lw-2-0-[0-9a-f]{6}", question.id), question.id  # the model named it call_ask
        assert (question.reason, question.message, question.tool_call_id) == (
            "question", "Which colour?", "t2-call_ask")

        answer = ResumeEntry(interrupt_id=question.id, status="resolved", payload={"answer": "blue"})
        third = events_of(post(server, RUN, run_input(thread, resume=[answer])))
        assert kinds(third) == [
            "RUN_STARTED", "STATE_SNAPSHOT",
            "TOOL_CALL_RESULT",
            "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT",
            "STATE_SNAPSHOT", "RUN_FINISHED"]
        assert next(e.content for e in third if isinstance(e, ToolCallResultEvent)) == "blue"
        done = third[-1]
        assert done.outcome.type == "success"
        assert done.result["text"] == "all done"
        assert done.result["instanceId"] == thread
        with server.client(APPROVE) as http:
            instances = {i["instanceId"]: i for i in http.get("/v1/instances").json()}
    assert instances[thread]["stopReason"] == "completed"


def test_resuming_an_approval_needs_the_approve_scope(assembly: Path) -> None:
    thread = "thread-2"
    with serving(assembly, env=TOKENS) as server:
        first = events_of(post(server, RUN, run_input(thread, "delete the old notes")))
        assert first[-1].outcome.type == "interrupt"
        (interrupt,) = first[-1].outcome.interrupts
        call, digest = interrupt.id, interrupt.metadata["digest"]
        approved = ResumeEntry(interrupt_id=call, status="resolved", payload={"approved": True, "digest": digest})
        refused = post(server, RUN, run_input(thread, resume=[approved]))
        assert refused.status_code == 403, refused.text
        assert "approve" in refused.json()["detail"]
        unknown = post(server, APPROVE, run_input(thread, resume=[ResumeEntry(
            interrupt_id="lw-1-9-000000", status="resolved", payload={"approved": True, "digest": digest})]))
        assert unknown.status_code == 409, unknown.text
        # A decision must carry the digest of the call it was made on: without one, a 400.
        blind = post(server, APPROVE, run_input(thread, resume=[ResumeEntry(
            interrupt_id=call, status="resolved", payload={"approved": True})]))
        assert blind.status_code == 400, blind.text
        assert "digest" in blind.json()["detail"]
        # With a digest that is not the pending call's, a 409 naming the current one.
        stale = post(server, APPROVE, run_input(thread, resume=[ResumeEntry(
            interrupt_id=call, status="resolved", payload={"approved": True, "digest": "0" * 64})]))
        assert stale.status_code == 409, stale.text
        assert stale.headers["content-type"] == "application/problem+json"
        assert (stale.json()["toolCallId"], stale.json()["currentDigest"]) == (call, digest)
        with server.client(RUN) as http:  # nothing was decided, nothing ran
            instance = next(i for i in http.get("/v1/instances").json() if i["instanceId"] == thread)
            approvals = http.get(f"/v1/instances/{thread}/records", params={"kind": "approval"}).json()
        assert instance["state"] == "waiting_for_approval"
        assert [(p["toolCallId"], p["digest"], p["decision"]) for p in instance["pendingApprovals"]] == [
            (call, digest, None)]
        assert [r for r in approvals if r["data"].get("decision")] == []
        cancelled = ResumeEntry(interrupt_id=call, status="cancelled", metadata={"digest": digest})
        denied = events_of(post(server, APPROVE, run_input(thread, resume=[cancelled])))
        assert next(e.content for e in denied if isinstance(e, ToolCallResultEvent)).startswith("denied")
        assert denied[-1].outcome.interrupts[0].reason == "question"
        with server.client(RUN) as http:
            records = http.get(f"/v1/instances/{thread}/records", params={"kind": "approval"}).json()
    assert [(r["data"]["decision"], r["data"]["by"]) for r in records if r["data"].get("decision")] == [
        ("denied", "token:approver")]


@pytest.mark.parametrize("token", [None, "not-a-token-0123456789"])
def test_a_missing_or_wrong_token_is_refused(assembly: Path, token: str | None) -> None:
    with serving(assembly, env=TOKENS) as server:
        refused = post(server, token, run_input("thread-3", "delete the old notes"))
        assert refused.status_code == 401, refused.text
        assert refused.headers["www-authenticate"].startswith("Bearer")
        with server.client(RUN) as http:
            assert http.get("/v1/instances").json() == []


def test_a_thread_id_that_cannot_be_an_instance_id_is_refused(assembly: Path) -> None:
    with serving(assembly, env=TOKENS) as server:
        refused = post(server, RUN, run_input("../escape", "hello"))
        assert refused.status_code == 400, refused.text
        assert "threadId" in refused.json()["detail"]


def test_a_thread_of_another_agents_instance_is_refused(assembly: Path) -> None:
    with serving(assembly, env=TOKENS) as server:
        theirs = events_of(httpx.post(f"{server.url}/agui/other", headers={"Authorization": f"Bearer {APPROVE}"},
                                      content=run_input("thread-other", "hello").model_dump_json(by_alias=True),
                                      timeout=60))
        assert theirs[-1].outcome.type == "success"
        assert kinds(theirs) == ["RUN_STARTED", "STATE_SNAPSHOT", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
                                 "TEXT_MESSAGE_END", "STATE_SNAPSHOT", "RUN_FINISHED"]
        assert "".join(e.delta for e in theirs if isinstance(e, TextMessageContentEvent)) == "the other agent answers"
        refused = post(server, APPROVE, run_input("thread-other", "delete the old notes"))
        assert refused.status_code == 409, refused.text
        with server.client(RUN) as http:
            instance = next(i for i in http.get("/v1/instances").json() if i["instanceId"] == "thread-other")
    assert instance["name"] == "other"
    assert instance["usage"]["totalTokens"] == theirs[-1].usage[0].total_tokens

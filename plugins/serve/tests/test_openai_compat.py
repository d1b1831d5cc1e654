"""The OpenAI-compatible surface, driven by the official ``openai`` SDK against a ``loopwright serve`` subprocess."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from _protocols_testlib import TOKEN_ENV, TOKENS, make_project, transcript, working
from _serve_testlib import Server, clean_env, serving

from loopwright import approval_digest

AGENTS = {
    "oa_plain": ["the answer is 42"],
    "oa_history": ["you are Ada"],
    "oa_tools": [{"text": "let me look", "toolCalls": [{"name": "echo", "arguments": {"text": "inside"}}]},
                 "the echo said inside"],
    "oa_stream": [{"text": "a moment", "toolCalls": [{"name": "echo", "arguments": {"text": "streamed"}}]},
                  "streamed answer"],
    "oa_approve": [{"toolCalls": [{"name": "delete", "arguments": {"path": "old.txt"}, "id": "call_del"}]},
                   "deleted it"],
    "oa_approve_stream": [{"toolCalls": [{"name": "delete", "arguments": {"path": "b.txt"}, "id": "call_b"}]},
                          "deleted b"],
    "oa_chat": ["first answer", "second answer"],
    "oa_busy": [{"toolCalls": [{"name": "delete", "arguments": {"path": "c.txt"}, "id": "call_c"}]}, "deleted c"],
    "oa_ask": [{"toolCalls": [{"name": "ask_user", "arguments": {"question": "Which file?"}}]}, "deleting notes.txt"],
    "oa_inputs": ["sunny"],
    "oa_fail": [{"error": {"message": "the model is down", "transient": False}}],
}

INPUTS = {"oa_inputs": {"systemPrompt": "Weather for {{ city }}.", "inputs": {"city": {"type": "string"}}}}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("openai"), AGENTS, tools={"oa_ask": ["ask_user"]}, keys=INPUTS)


@pytest.fixture(scope="module")
def server(project: Path) -> Iterator[Server]:
    with serving(project, env=TOKEN_ENV) as running:
        yield running


def _client(server: Server, token: str = TOKENS["runner"]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=token, max_retries=0, timeout=60)


def _held(project: Path, instance_id: str) -> tuple[str, str]:
    """The runtime's id of the one call ``instance_id`` holds, and its digest (from the saved header)."""
    header = json.loads((project.parent / "store" / instance_id / "instance.json").read_text())
    (saved,) = header["pendingApprovals"]
    call = str(saved["toolCallId"])
    assert re.fullmatch(r"lw-1-0-[0-9a-f]{6}", call), call
    return call, approval_digest(saved)


def test_models_list_the_registered_definitions(server: Server) -> None:
    """``models.list()`` names every registered definition ``loopwright/<name>``."""
    models = _client(server).models.list()
    assert sorted(m.id for m in models) == sorted(f"loopwright/{name}" for name in AGENTS)
    assert all(m.owned_by == "loopwright" for m in models)


def test_a_completion_answers_with_the_agents_text_usage_and_instance(server: Server, project: Path) -> None:
    """A non-streamed completion: the final text, finish ``stop``, usage, the instance in header and metadata."""
    raw = _client(server).chat.completions.with_raw_response.create(
        model="loopwright/oa_plain", messages=[{"role": "user", "content": "what is the answer?"}])
    completion = raw.parse()
    instance_id = raw.headers["x-loopwright-instance"]
    assert completion.choices[0].message.content == "the answer is 42"
    assert completion.choices[0].message.tool_calls is None
    assert completion.choices[0].finish_reason == "stop"
    assert completion.metadata == {"instance_id": instance_id, "state": "waiting", "stop_reason": "waiting"}
    assert completion.usage is not None
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens > 0
    assert transcript(project, instance_id)[0] == {"role": "user", "content": "what is the answer?", "source": "api"}


def test_earlier_messages_become_the_instances_history(server: Server, project: Path) -> None:
    """System, user and assistant messages before the last user message are the history, in order, as sent."""
    raw = _client(server).chat.completions.with_raw_response.create(model="loopwright/oa_history", messages=[
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "I am "}, {"type": "text", "text": "Ada {{ x }}"}]},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "Who am I?"},
    ])
    assert raw.parse().choices[0].message.content == "you are Ada"
    sent = [(m["role"], m.get("content")) for m in transcript(project, raw.headers["x-loopwright-instance"])]
    assert sent == [("system", "Answer briefly."), ("user", "I am Ada {{ x }}"), ("assistant", "Hello Ada."),
                    ("user", "Who am I?"), ("assistant", "you are Ada")]


def test_the_agents_tool_calls_stay_inside(server: Server, project: Path) -> None:
    """The agent calls its own tool; the client gets only the final text, with no tool calls."""
    raw = _client(server).chat.completions.with_raw_response.create(
        model="loopwright/oa_tools", messages=[{"role": "user", "content": "echo something"}])
    choice = raw.parse().choices[0]
    assert choice.message.content == "the echo said inside"
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    tool_results = [m for m in transcript(project, raw.headers["x-loopwright-instance"]) if m["role"] == "tool"]
    assert [m["content"] for m in tool_results] == ["echo: inside"]


def test_a_streamed_completion_decodes_with_the_sdk_and_ends_with_usage(server: Server) -> None:
    """``stream=True`` with ``include_usage``: each turn's text as it streams (a blank line between turns), the
    agent's own call under ``agent_tool_calls`` (never ``tool_calls``), then the finish, then usage."""
    stream = _client(server).chat.completions.create(
        model="loopwright/oa_stream", messages=[{"role": "user", "content": "stream it"}], stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == "a moment\n\nstreamed answer"
    assert all(c.choices[0].delta.tool_calls is None for c in with_choices)
    agent_calls = [call for c in with_choices for call in (c.choices[0].delta.model_extra or {}).get(
        "agent_tool_calls", [])]
    assert [(call["index"], call["function"]["name"]) for call in agent_calls] == [(0, "echo")]
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert with_choices[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens > 0
    instance_id = chunks[0].model_extra["metadata"]["instance_id"]
    assert with_choices[-1].model_extra["metadata"]["instance_id"] == instance_id
    assert {c.id for c in chunks} == {f"chatcmpl-{instance_id}"}


def test_a_run_held_for_approval_says_so(server: Server, project: Path) -> None:
    """A held call: a clear assistant message, finish ``waiting_for_approval``, the call and the instance named.

    The call is named by the runtime's own id (the model named it call_del), with its digest.
    """
    raw = _client(server).chat.completions.with_raw_response.create(
        model="loopwright/oa_approve", messages=[{"role": "user", "content": "delete old.txt"}])
    completion = raw.parse()
    instance_id = raw.headers["x-loopwright-instance"]
    call, digest = _held(project, instance_id)
    choice = completion.choices[0]
    assert choice.finish_reason == "waiting_for_approval"
    assert "waiting for approval" in (choice.message.content or "")
    assert instance_id in (choice.message.content or "")
    assert f"(call {call}, digest {digest})" in (choice.message.content or "")
    assert "call_del" not in (choice.message.content or "")
    assert completion.metadata == {"instance_id": instance_id, "state": "waiting_for_approval",
                                   "stop_reason": "waiting_for_approval", "pending_tool_call_ids": call,
                                   "pending_digests": digest}


def test_a_streamed_run_held_for_approval_says_so(server: Server, project: Path) -> None:
    """The same rest, streamed: the message, then the finish reason ``waiting_for_approval``."""
    chunks = list(_client(server).chat.completions.create(
        model="loopwright/oa_approve_stream", messages=[{"role": "user", "content": "delete b.txt"}], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    call, digest = _held(project, chunks[0].model_extra["metadata"]["instance_id"])
    assert "waiting for approval" in text
    assert f"(call {call}, digest {digest})" in text
    assert chunks[-1].choices[0].finish_reason == "waiting_for_approval"


def test_a_failed_agent_is_an_openai_error_not_retried(server: Server) -> None:
    """The model fails for good: a 500 in OpenAI's error shape naming the instance, marked not to retry."""
    with pytest.raises(openai.InternalServerError) as caught:
        _client(server).chat.completions.create(
            model="loopwright/oa_fail", messages=[{"role": "user", "content": "fail"}])
    error = caught.value
    assert error.code == "agent_error"
    assert "the model is down" in error.message
    assert error.response.headers["x-should-retry"] == "false"
    assert error.response.headers["x-loopwright-instance"]


def test_an_unknown_model_is_not_found(server: Server) -> None:
    """A model that is not a registered definition is a 404 ``model_not_found`` listing the models."""
    with pytest.raises(openai.NotFoundError) as caught:
        _client(server).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "model_not_found"
    assert "loopwright/oa_plain" in caught.value.message


def test_client_tools_and_a_trailing_assistant_message_are_bad_requests(server: Server) -> None:
    """Client tools would never be called, and the prompt must be a user message: 400, naming the field."""
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="loopwright/oa_plain", messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    assert caught.value.param == "tools"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="loopwright/oa_plain", messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    assert caught.value.param == "messages[1]"


def test_a_wrong_token_is_refused_with_the_sdks_authentication_error(server: Server) -> None:
    """A wrong bearer token: 401, raised by the SDK as AuthenticationError; no instance starts."""
    with pytest.raises(openai.AuthenticationError) as caught:
        _client(server, "not-the-token-at-all-000").chat.completions.create(
            model="loopwright/oa_plain", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 401
    assert caught.value.body["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        _client(server, "not-the-token-at-all-000").models.list()


def test_a_token_without_run_is_forbidden(server: Server) -> None:
    """A token with only ``read`` may not start agents: 403 PermissionDeniedError."""
    with pytest.raises(openai.PermissionDeniedError):
        _client(server, TOKENS["reader"]).chat.completions.create(
            model="loopwright/oa_plain", messages=[{"role": "user", "content": "hi"}])


def test_a_request_without_a_token_is_refused(server: Server) -> None:
    """No Authorization header at all: 401 in OpenAI's error shape, with the Bearer challenge."""
    response = httpx.post(f"{server.url}/openai/v1/chat/completions", timeout=30,
                          json={"model": "loopwright/oa_plain", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_a_request_naming_an_instance_continues_it(server: Server, project: Path) -> None:
    """``x-loopwright-instance`` on a request: its last message goes to that instance, which answers again."""
    client = _client(server)
    first = client.chat.completions.with_raw_response.create(
        model="loopwright/oa_chat", messages=[{"role": "user", "content": "hello"}])
    instance_id = first.headers["x-loopwright-instance"]
    second = client.chat.completions.with_raw_response.create(
        model="loopwright/oa_chat", messages=[{"role": "user", "content": "and again"}],
        extra_headers={"x-loopwright-instance": instance_id})
    assert second.headers["x-loopwright-instance"] == instance_id
    assert second.parse().choices[0].message.content == "second answer"
    said = [(m["role"], m.get("content")) for m in transcript(project, instance_id)]
    assert said == [("user", "hello"), ("assistant", "first answer"), ("user", "and again"),
                    ("assistant", "second answer")]


def test_continuing_an_instance_held_for_approval_or_unknown_is_refused(server: Server, project: Path) -> None:
    """A held instance is a 409 naming the held call (nothing is queued); an unknown one a 404; never retried."""
    client = _client(server)
    held = client.chat.completions.with_raw_response.create(
        model="loopwright/oa_busy", messages=[{"role": "user", "content": "delete c.txt"}])
    instance_id = held.headers["x-loopwright-instance"]
    call, digest = _held(project, instance_id)
    with pytest.raises(openai.ConflictError) as caught:
        client.chat.completions.create(model="loopwright/oa_busy", messages=[{"role": "user", "content": "go on"}],
                                       extra_headers={"x-loopwright-instance": instance_id})
    assert f"{call} (digest {digest})" in caught.value.message
    assert caught.value.response.headers["x-should-retry"] == "false"
    for unknown in ("20990101-000000-00000000", "../oa_busy"):
        with pytest.raises((openai.NotFoundError, openai.BadRequestError)):
            client.chat.completions.create(model="loopwright/oa_busy", messages=[{"role": "user", "content": "x"}],
                                           extra_headers={"x-loopwright-instance": unknown})
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="loopwright/oa_chat", messages=[{"role": "user", "content": "x"}],
                                       extra_headers={"x-loopwright-instance": instance_id})
    assert caught.value.code == "instance_mismatch"


def test_an_ask_user_question_is_the_answer_and_the_next_request_answers_it(server: Server, project: Path) -> None:
    """The agent asks: the content is its question; a request naming the instance answers it, and the agent goes on."""
    client = _client(server)
    asked = client.chat.completions.with_raw_response.create(
        model="loopwright/oa_ask", messages=[{"role": "user", "content": "delete a file"}])
    assert asked.parse().choices[0].message.content == "Which file?"
    instance_id = asked.headers["x-loopwright-instance"]
    answered = client.chat.completions.create(
        model="loopwright/oa_ask", messages=[{"role": "user", "content": "notes.txt"}],
        extra_headers={"x-loopwright-instance": instance_id})
    assert answered.choices[0].message.content == "deleting notes.txt"
    tool_results = [m for m in transcript(project, instance_id) if m["role"] == "tool"]
    assert [(m["name"], m["content"]) for m in tool_results] == [("ask_user", "notes.txt")]


def test_inputs_go_to_the_definition_and_a_missing_one_is_a_bad_request(server: Server, project: Path) -> None:
    """``extra_body={"inputs": ...}`` fills the definition's inputs; a required input left out is a 400 naming it."""
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="loopwright/oa_inputs", messages=[{"role": "user", "content": "?"}])
    assert "city" in caught.value.message
    raw = client.chat.completions.with_raw_response.create(
        model="loopwright/oa_inputs", messages=[{"role": "user", "content": "weather?"}],
        extra_body={"inputs": {"city": "Paris"}})
    assert raw.parse().choices[0].message.content == "sunny"
    assert transcript(project, raw.headers["x-loopwright-instance"])[0]["content"] == "Weather for Paris."


def test_a_server_that_does_not_run_agents_answers_through_a_worker(tmp_path: Path) -> None:
    """``server.run: false``: the completion is submitted, a ``loopwright worker`` runs it, the answer comes back."""
    assembly = make_project(tmp_path, {"oa_queued": ["answered by the worker"]})
    assembly.write_text(assembly.read_text().replace("server: {tokens:", "server: {run: false, tokens:"))
    with serving(assembly, env=TOKEN_ENV) as queued, working(assembly, clean_env(TOKEN_ENV)):
        raw = _client(queued).chat.completions.with_raw_response.create(
            model="loopwright/oa_queued", messages=[{"role": "user", "content": "queue it"}])
        with pytest.raises(openai.APIStatusError) as caught:
            _client(queued).chat.completions.create(
                model="loopwright/oa_queued", messages=[{"role": "user", "content": "again"}],
                extra_headers={"x-loopwright-instance": raw.headers["x-loopwright-instance"]})
    assert raw.parse().choices[0].message.content == "answered by the worker"
    assert caught.value.status_code == 501
    header = json.loads((tmp_path / "store" / raw.headers["x-loopwright-instance"] / "instance.json").read_text())
    assert header["submittedBy"] != header["runner"]

"""The provider conformance kit itself: it passes a correct provider and fails broken ones where they break.

``ChatProvider`` below is a small, correct OpenAI Chat Completions provider (plain calls, SSE
streaming, retries). Each ``Broken*`` subclass breaks one behaviour; the matrix test runs every
scenario against every broken provider and checks that exactly the scenarios covering the broken
behaviour fail, so the kit's checks can fail and do not fail elsewhere.
"""

from __future__ import annotations

import functools
import json
import re
import ssl
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import anyio
import httpx
import pytest

import loopwright_testing.conformance as kit
from loopwright import Message, ModelResponse, StreamDelta, ToolCall, Usage, parse_retry_after, retry_transient
from loopwright.abc import Provider
from loopwright.errors import ProviderError
from loopwright_testing.conformance import (
    SCENARIOS,
    AnthropicMessagesDialect,
    CapturedRequest,
    ConformanceFailure,
    OpenAIChatDialect,
    ProviderConformance,
    ScriptedAnswer,
    ScriptedCall,
    ScriptedError,
    UnrepresentableError,
    WireFormatError,
    WireReply,
    WireServer,
)

DOC = Path(__file__).resolve().parents[3] / "docs" / "provider-conformance.md"


# -- a small correct provider over Chat Completions -------------------------------------------------

TLS = ssl.create_default_context()  # once per process: loading the CA bundle costs about 0.1 s


class ChatProvider(Provider):
    """Chat Completions over httpx: encodes the transcript, decodes answers and SSE streams, retries."""

    def __init__(self, settings):
        self.settings = settings
        self.url = f"{settings.base_url}/chat/completions"
        self.client = httpx.AsyncClient(headers=self.headers(), timeout=5, verify=TLS)

    def headers(self):
        return {"Authorization": f"Bearer {self.settings.api_key}"}

    async def aclose(self):
        await self.client.aclose()

    # encoding
    def encode(self, m):
        if m.role == "tool":
            return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content or ""}
        if m.role == "assistant" and m.tool_calls:
            return {"role": "assistant", "content": m.content, "tool_calls": [
                {"id": c.id, "type": "function", "function": {
                    "name": c.name, "arguments": c.raw_arguments or json.dumps(dict(c.arguments))}}
                for c in m.tool_calls]}
        return {"role": m.role, "content": m.content or ""}

    def body(self, request, *, stream):
        body = {"model": request.model, "messages": [self.encode(m) for m in request.messages]}
        if request.tools:
            body["tools"] = [{"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": dict(t.parameters)}}
                for t in request.tools]
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        return body

    # decoding
    def parse(self, text):
        try:
            value = json.loads(text) if text else {}
        except ValueError:
            return {}, text
        return (value, None) if isinstance(value, dict) else ({}, text)

    def call(self, call_id, name, arguments):
        parsed, raw = self.parse(arguments)
        return ToolCall(id=call_id, name=name, arguments=parsed, raw_arguments=raw)

    def calls(self, raw_calls):
        return tuple(self.call(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in raw_calls)

    def finish(self, raw):
        return raw or "stop"

    def usage(self, raw):
        raw = raw or {}
        return Usage(input_tokens=raw.get("prompt_tokens", 0), output_tokens=raw.get("completion_tokens", 0),
                     total_tokens=raw.get("total_tokens", 0), requests=1)

    def answer(self, text, calls, finish, usage):
        return ModelResponse(message=Message(role="assistant", content=text, tool_calls=calls),
                             finish_reason=self.finish(finish), raw_finish_reason=finish, usage=self.usage(usage))

    def error(self, request, response):
        message = response.json()["error"]["message"]
        status = response.status_code
        return ProviderError(message, provider=self.settings.name, model=request.model, status=status,
                             transient=self.transient(status), retry_after=parse_retry_after(response.headers))

    def transient(self, status):
        return status == 429 or status >= 500

    async def retrying(self, call):
        return await retry_transient(call, max_retries=2, base_delay=0.001)

    async def complete(self, request):
        return await self.retrying(functools.partial(self.post, request))

    async def post(self, request):
        response = await self.client.post(self.url, json=self.body(request, stream=False))
        if response.status_code != 200:
            raise self.error(request, response)
        choice = response.json()["choices"][0]
        message = choice["message"]
        return self.answer(message.get("content"), self.calls(message.get("tool_calls") or ()),
                           choice["finish_reason"], response.json().get("usage"))

    async def open_stream(self, request):
        http_request = self.client.build_request("POST", self.url, json=self.body(request, stream=True))
        response = await self.client.send(http_request, stream=True)
        if response.status_code != 200:
            await response.aread()
            await response.aclose()
            raise self.error(request, response)
        return response

    async def lines(self, response):
        async for line in response.aiter_lines():
            yield line

    async def stream(self, request):
        response = await self.retrying(functools.partial(self.open_stream, request))
        text, calls, finish, usage = [], {}, None, None
        try:
            async for line in self.lines(response):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk["choices"]:
                    delta = choice["delta"]
                    finish = choice["finish_reason"] or finish
                    if delta.get("content"):
                        text.append(delta["content"])
                        yield StreamDelta(kind="text", text=delta["content"])
                    for piece in delta.get("tool_calls") or ():
                        if "id" in piece:
                            calls[piece["index"]] = [piece["id"], piece["function"]["name"], ""]
                            yield StreamDelta(kind="tool_call", tool_call_id=piece["id"],
                                              name=piece["function"]["name"])
                        part = piece["function"].get("arguments")
                        if part:
                            calls[piece["index"]][2] += part
                            yield StreamDelta(kind="arguments", tool_call_id=calls[piece["index"]][0], text=part)
        finally:
            await response.aclose()
        decoded = tuple(self.call(*calls[i]) for i in sorted(calls))
        yield StreamDelta(kind="done", response=self.answer("".join(text) or None, decoded, finish, usage))


class TestReferenceProvider(ProviderConformance):
    """A correct minimal provider passes every scenario, under asyncio and trio."""

    dialect = OpenAIChatDialect()
    provider_kind = "reference"

    def make_provider(self, settings):
        return ChatProvider(settings)


# -- broken providers, each failing where it breaks -------------------------------------------------


class NoRetry(ChatProvider):
    async def retrying(self, call):
        return await call()


class RetriesBadRequests(ChatProvider):
    def transient(self, status):
        return True


class DropsToolResults(ChatProvider):
    def body(self, request, *, stream):
        body = super().body(request, stream=stream)
        body["messages"] = [m for m in body["messages"] if m["role"] != "tool"]
        return body


class FirstCallOnly(ChatProvider):
    def calls(self, raw_calls):
        return super().calls(raw_calls)[:1]


class StrictArguments(ChatProvider):
    def parse(self, text):
        return json.loads(text), None


class BuffersStream(ChatProvider):
    async def lines(self, response):
        await response.aread()
        for line in response.text.splitlines():
            yield line


class StopOnly(ChatProvider):
    def finish(self, raw):
        return "tool_calls" if raw == "tool_calls" else "stop"


class NoUsage(ChatProvider):
    def usage(self, raw):
        return Usage(requests=1)


class SystemAsUser(ChatProvider):
    def encode(self, m):
        encoded = super().encode(m)
        if encoded["role"] == "system":
            encoded["role"] = "user"
        return encoded


class WrongAuthHeader(ChatProvider):
    def headers(self):
        return {"Authorization": f"Key {self.settings.api_key}"}


class NoStreaming(ChatProvider):
    stream = Provider.stream


#: Each broken provider, the scenarios it must fail, and a phrase the first failure must contain.
BROKEN = [
    (NoRetry, {"rate_limit_retry", "streaming_retry"}, "raised ProviderError"),
    (RetriesBadRequests, {"final_error"}, "returned instead of raising"),
    (DropsToolResults, {"tool_round_trip", "parallel_tool_calls"}, "must be followed by tool messages"),
    (FirstCallOnly, {"parallel_tool_calls", "malformed_tool_arguments"}, "1 tool call(s)"),
    (StrictArguments, {"malformed_tool_arguments"}, "raised JSONDecodeError"),
    (BuffersStream, {"streaming"}, "had not yielded the first streamed piece"),
    (StopOnly, {"content_filter"}, "finish_reason is 'stop'"),
    (NoUsage, {"plain_answer", "streaming"}, "usage (input, output, total) is (0, 0, 0)"),
    (SystemAsUser, {"plain_answer", "tool_round_trip"}, "('user', 'You are a terse assistant.')"),
    (WrongAuthHeader, set(SCENARIOS), "Authorization: Bearer"),
    (NoStreaming, {"streaming", "streaming_retry"}, "did not ask"),
]


def suite_for(provider_class):
    """Return a conformance suite instance whose provider is ``provider_class``."""

    class Suite(ProviderConformance):
        dialect = OpenAIChatDialect()
        provider_kind = "broken"
        stream_gate_timeout = 0.3

        def make_provider(self, settings):
            return provider_class(settings)

    return Suite()


async def run_scenario(suite, name):
    """Run one scenario in-process; return the ConformanceFailure it raised, or None."""
    async with suite.open_conformance() as harness:
        try:
            await getattr(suite, f"test_{name}")(harness)
        except ConformanceFailure as failure:
            return failure
    return None


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(("broken", "fails", "phrase"), BROKEN, ids=[b[0].__name__ for b in BROKEN])
async def test_a_broken_provider_fails_exactly_the_scenarios_it_breaks(broken, fails, phrase):
    """Each broken provider fails the scenarios covering what it breaks, with a telling message, and passes the rest."""
    suite = suite_for(broken)
    failures = {name: await run_scenario(suite, name) for name in SCENARIOS}
    failed = {name for name, failure in failures.items() if failure is not None}
    assert failed == fails, {name: str(f) for name, f in failures.items() if f is not None}
    first = failures[min(fails, key=list(SCENARIOS).index)]
    assert phrase in str(first), str(first)


class Hangs(ChatProvider):
    async def complete(self, request):
        await anyio.sleep_forever()


@pytest.mark.anyio
async def test_a_hanging_provider_fails_after_the_scenario_timeout():
    """A provider call that never returns fails the scenario after scenario_timeout, instead of hanging the run."""
    suite = suite_for(Hangs)
    suite.scenario_timeout = 0.2
    failure = await run_scenario(suite, "plain_answer")
    assert "complete() did not finish within 0.2 s (after 0 request(s))" in str(failure)


@pytest.mark.anyio
async def test_the_harness_rejects_an_incomplete_subclass():
    """A missing dialect or provider_kind, or a make_provider returning no Provider, is a clear TypeError."""

    class NoDialect(ProviderConformance):
        provider_kind = "x"

    class NoKind(ProviderConformance):
        dialect = OpenAIChatDialect()

    class NotAProvider(ProviderConformance):
        dialect = OpenAIChatDialect()
        provider_kind = "x"

        async def make_provider(self, settings):
            return object()

    for suite, message in ((NoDialect(), "must set dialect"), (NoKind(), "must set provider_kind"),
                           (NotAProvider(), "returned object, not a loopwright.abc.Provider")):
        with pytest.raises(TypeError, match=re.escape(message)):
            async with suite.open_conformance():
                pass


# -- declarations: unsupported, expected failures, backends ----------------------------------------


def run_pytest(folder: Path, files: dict[str, str], *args: str) -> str:
    """Run pytest in a fresh process on ``files`` written to ``folder``; return its output."""
    for name, source in files.items():
        (folder / name).write_text(source, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-rsx", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
         "--rootdir", str(folder), *args, str(folder)],
        cwd=folder, capture_output=True, text=True, check=False, timeout=120,
    )
    return done.stdout + done.stderr


def test_declarations_name_known_scenarios_with_reasons():
    """An unknown scenario or tag, or an empty reason, in unsupported/expected_failures is an error, not ignored."""

    class Typo(ProviderConformance):
        dialect = OpenAIChatDialect()
        provider_kind = "x"
        unsupported: ClassVar = {"streamin": "typo"}

    class NoReason(ProviderConformance):
        dialect = OpenAIChatDialect()
        provider_kind = "x"
        expected_failures: ClassVar = {"streaming": " "}

    with pytest.raises(ValueError, match="'streamin', which is no scenario or tag"):
        Typo._check_declarations()
    with pytest.raises(ValueError, match="must give the reason"):
        NoReason._check_declarations()


THIRD_PARTY = """
import sys
sys.path.insert(0, {here!r})
from test_conformance_kit import ChatProvider, NoStreaming, StopOnly
from loopwright_testing.conformance import OpenAIChatDialect, ProviderConformance

class TestGood(ProviderConformance):
    dialect = OpenAIChatDialect()
    provider_kind = "good"
    anyio_backends = ("asyncio",)

    def make_provider(self, base_url):
        from loopwright.abc import ProviderSettings
        return ChatProvider(ProviderSettings(name="good", kind="good", base_url=base_url, api_key=self.api_key))

class TestNoStreams(ProviderConformance):
    dialect = OpenAIChatDialect()
    provider_kind = "nostreams"
    anyio_backends = ("asyncio",)
    unsupported = {{"streaming": "the backend has no streaming endpoint"}}
    expected_failures = {{"content_filter": "finish reasons are not mapped yet (#12)"}}

    async def make_provider(self, settings):
        class Provider(NoStreaming, StopOnly):
            pass
        return Provider(settings)
"""


def doc_files():
    """Return the files the doc's complete example is made of: ``<!-- file: NAME -->`` then a python block."""
    text = DOC.read_text(encoding="utf-8")
    return dict(re.findall(r"<!-- file: (\S+) -->\s*```python\n(.*?)```", text, flags=re.DOTALL))


@pytest.fixture(scope="module")
def third_party_run(tmp_path_factory):
    """One pytest process (starting one costs seconds) over the doc's example and a third party's test module."""
    files = {**doc_files(), "test_mine.py": THIRD_PARTY.format(here=str(Path(__file__).parent))}
    return files, run_pytest(tmp_path_factory.mktemp("third_party"), files)


def test_a_subclass_runs_every_scenario_and_shows_skips_and_xfails(third_party_run):
    """A subclass gets one test per scenario and backend; unsupported ones are skips showing the reason."""
    _, output = third_party_run
    for name in SCENARIOS:
        assert re.search(rf"TestGood::test_{name}\[asyncio\] PASSED", output), output
    assert "TestGood::test_plain_answer[trio]" not in output
    for name in ("streaming", "streaming_retry"):
        assert re.search(rf"SKIPPED \[1\] .*nostreams does not support {name}: the backend has no streaming "
                         "endpoint", output), output
    assert re.search(r"TestNoStreams::test_content_filter\[asyncio\] XFAIL", output), output
    assert "finish reasons are not mapped yet (#12)" in output
    assert re.search(r"TestNoStreams::test_malformed_tool_arguments\[asyncio\] PASSED", output), output


# -- the documented example --------------------------------------------------------------------------


def test_the_documented_example_runs_and_passes(third_party_run):
    """The complete example in docs/provider-conformance.md (provider, dialect, test class) passes as written."""
    files, output = third_party_run
    assert set(files) == {"parrot_provider.py", "parrot_dialect.py", "test_parrot.py", "test_mine.py"}, sorted(files)
    for name in SCENARIOS:
        for backend in ("asyncio", "trio"):
            assert re.search(rf"TestParrotProvider::test_{name}\[{backend}\] PASSED", output), output
    # The parrot's 18, TestGood's 9 and TestNoStreams' 6 pass; nothing fails.
    assert re.search(r"\b33 passed, 2 skipped, 1 xfailed\b", output), output


def test_every_scenario_is_documented():
    """docs/provider-conformance.md has a heading for every scenario, and lists no other."""
    documented = re.findall(r"^### `(\w+)`", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert documented == list(SCENARIOS)


def test_exports_are_sorted_and_complete():
    """The kit's __all__ is sorted and names only what the package has."""
    assert kit.__all__ == sorted(kit.__all__, key=lambda name: (not name.isupper(), name))  # ruff's RUF022 order
    assert all(hasattr(kit, name) for name in kit.__all__)


# -- the dialects --------------------------------------------------------------------------------------


def captured(body, **headers):
    return CapturedRequest(index=0, method="POST", path="/", query="", headers=headers,
                           body=json.dumps(body).encode(), at=0.0)


def call(call_id, name="add", arguments='{"a": 1}'):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(("body", "rule"), [
    ({"model": "m", "messages": [{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": None, "tool_calls": [call("c1")]},
                                 {"role": "user", "content": "and?"}]}, "must be followed by tool messages"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"},
                                 {"role": "tool", "tool_call_id": "c9", "content": "3"}]}, "answers no call"),
    ({"model": "m", "messages": [{"role": "assistant", "content": None,
                                  "tool_calls": [call("c1") | {"function": {"name": "add", "arguments": {}}}]},
                                 {"role": "tool", "tool_call_id": "c1", "content": "3"}]}, "must be a string"),
    ({"model": "m", "messages": [{"role": "user", "content": None}]}, "must not be null"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"},
     "only allowed when 'tools'"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}},
     "only allowed when 'stream'"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "model: must be a string"),
])
def test_the_openai_dialect_rejects_what_the_api_rejects(body, rule):
    """Requests that OpenAI would answer with 400 are wire-format errors naming the rule."""
    with pytest.raises(WireFormatError, match=re.escape(rule)):
        OpenAIChatDialect().read_request(captured(body))


def test_the_openai_dialect_reads_a_transcript():
    """System, user, assistant calls and tool results are read in order; content parts are joined."""
    wire = OpenAIChatDialect().read_request(captured({
        "model": "m", "stream": True, "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}],
        "messages": [{"role": "developer",
                      "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "nice"}]},
                     {"role": "assistant", "content": None, "tool_calls": [call("c1", arguments="{bad")]},
                     {"role": "tool", "tool_call_id": "c1", "content": "3"}]}))
    assert wire.stream
    assert list(wire.tools) == ["add"]
    assert [(m.role, m.text) for m in wire.messages] == [("system", "be nice"), ("assistant", None), ("tool", "3")]
    assert wire.messages[1].tool_calls[0].arguments == "{bad"


def test_the_openai_stream_sends_usage_only_when_asked():
    """The usage chunk (choices: []) comes only with stream_options.include_usage, before [DONE]."""
    answer = ScriptedAnswer(text="hi there", tool_calls=(ScriptedCall(id="c", name="add", arguments="{}"),))
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    plain = OpenAIChatDialect().render_stream(answer, captured(base))
    counted = OpenAIChatDialect().render_stream(answer, captured(base | {"stream_options": {"include_usage": True}}))
    assert all("usage" not in json.loads(e.data) for e in plain[:-1])
    assert json.loads(counted[-2].data)["choices"] == []
    assert json.loads(counted[-2].data)["usage"]["total_tokens"] == answer.total_tokens
    assert plain[-1].data == counted[-1].data == "[DONE]"


def anthropic(messages, **extra):
    return captured({"model": "claude", "max_tokens": 100, "messages": messages, **extra})


def use(call_id, **extra):
    return {"type": "tool_use", "id": call_id, "name": "add", "input": {"a": 1}} | extra


def result(call_id):
    return {"type": "tool_result", "tool_use_id": call_id, "content": "3"}


@pytest.mark.parametrize(("request_", "rule"), [
    (captured({"model": "c", "messages": [{"role": "user", "content": "hi"}]}), "max_tokens: is required"),
    (anthropic([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]),
     "must be 'user' or 'assistant'"),
    (anthropic([{"role": "assistant", "content": "hi"}]), "the first turn must be the user's"),
    (anthropic([{"role": "user", "content": [{"type": "text", "text": "  "}]}]), "non-whitespace text"),
    (anthropic([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [use("a.b")]},
                {"role": "user", "content": [result("a.b")]}]), "must match ^[a-zA-Z0-9_-]+$"),
    (anthropic([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [use("t1", input="{}")]},
                {"role": "user", "content": [result("t1")]}]), "must be an object"),
    (anthropic([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [use("t1"), use("t2")]},
                {"role": "user", "content": [result("t1")]}]), "without tool_result blocks immediately after: t2"),
    (anthropic([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [use("t1")]},
                {"role": "user", "content": [{"type": "text", "text": "ok"}, result("t1")]}]), "must come first"),
    (anthropic([{"role": "user", "content": [result("t1")]}]), "unexpected tool_use_id 't1'"),
])
def test_the_anthropic_dialect_rejects_what_the_api_rejects(request_, rule):
    """Requests that Anthropic would answer with 400 are wire-format errors naming the rule."""
    with pytest.raises(WireFormatError, match=re.escape(rule)):
        AnthropicMessagesDialect().read_request(request_)


def test_the_anthropic_dialect_reads_a_transcript():
    """The top-level system prompt comes first; a user turn's tool results become tool messages, then its text."""
    wire = AnthropicMessagesDialect().read_request(anthropic(
        [{"role": "user", "content": "hi"},
         {"role": "assistant", "content": [{"type": "text", "text": "on it"}, use("t1")]},
         {"role": "user", "content": [result("t1") | {"is_error": True}, {"type": "text", "text": "next"}]}],
        system=[{"type": "text", "text": "terse"}]))
    assert [(m.role, m.text, m.tool_call_id) for m in wire.messages] == [
        ("system", "terse", None), ("user", "hi", None), ("assistant", "on it", None), ("tool", "3", "t1"),
        ("user", "next", None)]
    assert wire.messages[3].is_error is True


def test_anthropic_cannot_carry_malformed_input_outside_a_stream():
    """A non-streamed tool_use input is an object, so malformed arguments are unrepresentable there but stream fine."""
    answer = ScriptedAnswer(tool_calls=(ScriptedCall(id="t", name="add", arguments='{"a": 1'),),
                            finish_reason="tool_calls")
    request = anthropic([{"role": "user", "content": "hi"}])
    with pytest.raises(UnrepresentableError):
        AnthropicMessagesDialect().render_answer(answer, request)
    events = AnthropicMessagesDialect().render_stream(answer, request)
    pieces = [json.loads(e.data)["delta"]["partial_json"] for e in events
              if e.event == "content_block_delta"]
    assert "".join(pieces) == '{"a": 1'
    assert AnthropicMessagesDialect.raw_arguments_on == {"stream"}


def test_scripted_values_check_themselves():
    """Pieces must join into their whole, and finish reasons and error kinds must be known ones."""
    with pytest.raises(ValueError, match="do not join"):
        ScriptedCall(id="c", name="n", arguments="{}", pieces=("{",))
    with pytest.raises(ValueError, match="finish_reason"):
        ScriptedAnswer(finish_reason="end_turn")
    with pytest.raises(ValueError, match="kind"):
        ScriptedError(status=429, message="slow down", kind="rate_limited")


# -- the server ---------------------------------------------------------------------------------------


def test_the_server_records_requests_and_problems():
    """Requests are recorded; a wrong path gets 404, an unscripted request 400, and both are problems."""
    with WireServer(path="/v1/x") as server:
        server.enqueue(lambda request: WireReply.json({"ok": request.json["n"]}))
        with httpx.Client(base_url=server.url) as client:
            assert client.post("/v1/y", json={}).status_code == 404
            assert server.pending == 1  # a refused request takes no scripted reply
            assert client.post("/v1/x", json={"n": 1}).json() == {"ok": 1}
            assert client.post("/v1/x?q=1", json={}).status_code == 400
    assert server.pending == 0
    assert [(r.path, r.query) for r in server.requests] == [("/v1/y", ""), ("/v1/x", ""), ("/v1/x", "q=1")]
    assert len(server.problems) == 2
    assert "POST /v1/y" in server.problems[0]
    assert "after every scripted reply was used" in server.problems[1]


@pytest.mark.anyio
async def test_concurrent_requests_get_distinct_indexes():
    """Requests arriving at once are each recorded once, with distinct indexes in arrival order."""
    with WireServer(path="/v1/x") as server:
        server.enqueue(*[lambda request: WireReply.json({"index": request.index})] * 20)
        async with httpx.AsyncClient(base_url=server.url, verify=TLS) as client, anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(functools.partial(client.post, "/v1/x", content=b"{}"))
    assert sorted(r.index for r in server.requests) == list(range(20))
    assert [r.index for r in server.requests] == list(range(20))
    assert not server.problems

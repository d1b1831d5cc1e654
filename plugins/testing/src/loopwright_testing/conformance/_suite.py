"""The scenarios, as test methods of :class:`ProviderConformance`, and the harness they run on."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import anyio
import attrs
import pytest

from loopwright import Message, ModelRequest, ModelResponse, StreamDelta, ToolCall, ToolSpec, ToolStatus
from loopwright.abc import Provider, ProviderSettings
from loopwright.errors import ProviderError
from loopwright_testing.conformance._model import (
    CapturedRequest,
    ScriptedAnswer,
    ScriptedCall,
    ScriptedError,
    WireFormatError,
    WireMessage,
    WireReply,
    WireRequest,
)
from loopwright_testing.conformance._server import WireServer

if TYPE_CHECKING:
    from loopwright_testing.conformance._dialect import Dialect

__all__ = ["SCENARIOS", "Conformance", "ConformanceFailure", "ProviderConformance", "Scenario"]

F = TypeVar("F", bound=Callable[..., Any])


class ConformanceFailure(AssertionError):  # noqa: N818 - an assertion, reported as a test failure
    """A provider broke a conformance check; the message says which check and what was seen."""


@attrs.frozen(kw_only=True)
class Scenario:
    """One conformance scenario.

    Attributes:
        name: Its name: the test method is ``test_<name>``, and ``unsupported`` /
            ``expected_failures`` keys use it.
        summary: What it checks, in a sentence.
        tags: Groups it belongs to; a tag (``streaming``) in ``unsupported`` skips all of them.
    """

    name: str
    summary: str
    tags: frozenset[str] = frozenset()


#: Every scenario, by name, in the order the class defines them.
SCENARIOS: dict[str, Scenario] = {}


def _scenario(name: str, summary: str, *, tags: Sequence[str] = ()) -> Callable[[F], F]:
    SCENARIOS[name] = Scenario(name=name, summary=summary, tags=frozenset(tags))

    def mark(function: F) -> F:
        function._conformance_scenario = name  # type: ignore[attr-defined]  # noqa: SLF001
        return pytest.mark.anyio(function)  # type: ignore[no-any-return]

    return mark


def expect(condition: object, message: str) -> None:
    """Raise :class:`ConformanceFailure` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConformanceFailure(message)


# -- the fixed inputs of the scenarios --------------------------------------------------------------

SYSTEM = "You are a terse assistant."

ADD = ToolSpec(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
)


def _jsonable(value: Any) -> Any:
    """Return ``value`` with every Mapping a dict and every tuple a list (for comparisons)."""
    return json.loads(json.dumps(value, default=lambda v: dict(v) if isinstance(v, Mapping) else list(v)))


# -- the harness ------------------------------------------------------------------------------------


class Conformance:
    """What a scenario works with: the server, the provider under test and helpers.

    The ``conformance`` fixture of :class:`ProviderConformance` yields one per test, and
    :meth:`ProviderConformance.open_conformance` opens one outside pytest's fixtures.

    Attributes:
        suite: The test class instance (its ``model``, ``api_key`` ... ).
        dialect: The wire format the server speaks.
        server: The local server.
        provider: The provider under test.
    """

    def __init__(self, suite: ProviderConformance, server: WireServer, provider: Provider) -> None:
        self.suite = suite
        self.dialect = suite.dialect
        self.server = server
        self.provider = provider

    # -- scripting the server -------------------------------------------------------------------

    def answer(self, answer: ScriptedAnswer, *, gate: threading.Event | None = None) -> None:
        """Queue ``answer``: a JSON body, or a stream when the request asks for one.

        With ``gate``, a stream is held after the event carrying the first text piece until the
        gate is set (the scenario sets it when the provider yields that piece).
        """
        dialect, suite = self.dialect, self.suite

        def script(request: CapturedRequest) -> WireReply:
            wire = dialect.read_request(request)
            self._check_auth(request)
            if not wire.stream:
                return WireReply.json(dialect.render_answer(answer, request))
            events = tuple(dialect.render_stream(answer, request))
            gate_after = None
            pieces = answer.stream_text_pieces
            if gate is not None and pieces:
                marker = json.dumps(pieces[0], ensure_ascii=False)[1:-1]
                escaped = json.dumps(pieces[0])[1:-1]
                gate_after = next((i for i, e in enumerate(events) if marker in e.data or escaped in e.data), None)
                if gate_after is None:
                    self.server.report(f"the {dialect.name} dialect's stream has no event carrying the first "
                                       f"text piece {pieces[0]!r} verbatim; the stream was sent ungated")
            reply = WireReply.sse(events)
            if gate_after is not None:
                reply = attrs.evolve(reply, gate=gate, gate_after=gate_after, gate_timeout=suite.stream_gate_timeout)
            return reply

        self.server.enqueue(script)

    def fail_with(self, error: ScriptedError) -> None:
        """Queue a failure: ``error.status`` with the dialect's error body and headers."""
        dialect = self.dialect

        def script(request: CapturedRequest) -> WireReply:
            dialect.read_request(request)
            self._check_auth(request)
            headers = {**dialect.error_headers(error), **error.headers}
            return WireReply.json(dialect.render_error(error, request), status=error.status, headers=headers)

        self.server.enqueue(script)

    def _check_auth(self, request: CapturedRequest) -> None:
        problem = self.dialect.auth_problem(request, self.suite.api_key)
        if problem is not None:
            self.server.report(f"request #{request.index} does not carry the API key as {self.dialect.name} "
                               f"expects: {problem}")

    # -- calling the provider -------------------------------------------------------------------

    def request(self, *messages: Message, tools: tuple[ToolSpec, ...] = (), stream: bool = False) -> ModelRequest:
        """Return a request for the provider under test (see :meth:`ProviderConformance.make_request`)."""
        return self.suite.make_request(messages, tools=tools, stream=stream)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Return ``provider.complete(request)``, failing clearly if it raises or hangs."""
        try:
            with anyio.fail_after(self.suite.scenario_timeout):
                response = await self.provider.complete(request)
        except Exception as exc:  # noqa: BLE001 - any exception is the provider's failure, reported as one
            self._fail_on_exception("complete()", exc)
        self.check_server()
        expect(isinstance(response, ModelResponse),
               f"complete() returned {type(response).__name__}, not a ModelResponse")
        expect(response.message.role == "assistant",
               f"the answer's message has role {response.message.role!r}, not 'assistant'")
        return response

    async def stream(self, request: ModelRequest, *, gate: threading.Event | None = None) -> list[StreamDelta]:
        """Return every delta of ``provider.stream(request)``, failing clearly if it raises or hangs.

        Sets ``gate`` when the first non-empty text delta arrives.
        """
        deltas: list[StreamDelta] = []
        try:
            with anyio.fail_after(self.suite.scenario_timeout):
                iterator = self.provider.stream(request)
                try:
                    async for delta in iterator:
                        deltas.append(delta)
                        if gate is not None and isinstance(delta, StreamDelta) and delta.kind == "text" and delta.text:
                            gate.set()
                finally:
                    aclose = getattr(iterator, "aclose", None)
                    if aclose is not None:
                        await aclose()
        except Exception as exc:  # noqa: BLE001 - any exception is the provider's failure, reported as one
            self._fail_on_exception("stream()", exc)
        self.check_server()
        self._check_deltas(deltas)
        return deltas

    async def provider_error(self, request: ModelRequest) -> ProviderError:
        """Return the :class:`~loopwright.errors.ProviderError` that ``complete(request)`` must raise."""
        try:
            with anyio.fail_after(self.suite.scenario_timeout):
                response = await self.provider.complete(request)
        except ProviderError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - any exception is the provider's failure, reported as one
            self._fail_on_exception("complete()", exc, wanted="a ProviderError")
        self.check_server()
        raise ConformanceFailure(
            f"complete() returned instead of raising a ProviderError (after {len(self.server.requests)} "
            f"request(s)); it returned {response!r}")

    def _fail_on_exception(self, what: str, exc: Exception, *, wanted: str | None = None) -> Any:
        problems = self.server.problems
        if problems:
            raise ConformanceFailure(self._problems_text(f"{what} raised {type(exc).__name__}: {exc}")) from exc
        if isinstance(exc, TimeoutError):
            raise ConformanceFailure(
                f"{what} did not finish within {self.suite.scenario_timeout:g} s (after "
                f"{len(self.server.requests)} request(s))") from exc
        instead = f", not {wanted}" if wanted else ""
        raise ConformanceFailure(f"{what} raised {type(exc).__name__}{instead}: {exc}") from exc

    def _problems_text(self, head: str) -> str:
        lines = "\n".join(f"  - {p}" for p in self.server.problems)
        return f"{head}\nthe server saw problems:\n{lines}"

    def check_server(self) -> None:
        """Fail if the server recorded a problem (a bad path or request, a missing key, a held stream ...)."""
        if self.server.problems:
            raise ConformanceFailure(self._problems_text("the provider did not talk to the server as expected"))

    def _check_deltas(self, deltas: list[StreamDelta]) -> None:
        for i, delta in enumerate(deltas):
            expect(isinstance(delta, StreamDelta),
                   f"stream() yielded {type(delta).__name__} at #{i}, not a StreamDelta")
        kinds = [d.kind for d in deltas]
        expect(kinds and kinds[-1] == "done", f"stream() must end with a 'done' delta; the kinds were {kinds}")
        expect(kinds.count("done") == 1,
               f"stream() yielded {kinds.count('done')} 'done' deltas; the kinds were {kinds}")
        unknown = sorted(set(kinds) - {"text", "tool_call", "arguments", "done"})
        expect(not unknown, f"stream() yielded deltas of unknown kinds {unknown}")
        expect(isinstance(deltas[-1].response, ModelResponse),
               f"the 'done' delta carries {type(deltas[-1].response).__name__}, not a ModelResponse")

    # -- reading what the provider sent ---------------------------------------------------------

    def sent(self, index: int) -> WireRequest:
        """Return request number ``index`` as the dialect reads it."""
        requests = self.server.requests
        expect(index < len(requests), f"the provider sent {len(requests)} request(s); expected at least {index + 1}")
        try:
            return self.dialect.read_request(requests[index])
        except WireFormatError as exc:  # pragma: no cover - the server already reported it
            raise ConformanceFailure(f"request #{index} breaks the {self.dialect.name} wire format: {exc}") from exc

    def expect_requests(self, count: int, why: str) -> None:
        """Fail unless the server received exactly ``count`` requests."""
        got = len(self.server.requests)
        expect(got == count, f"the provider sent {got} request(s); expected {count} ({why})")


# -- checks shared by scenarios -----------------------------------------------------------------------


def _check_usage(response: ModelResponse, answer: ScriptedAnswer, where: str) -> None:
    usage = response.usage
    got = (usage.input_tokens, usage.output_tokens, usage.total_tokens)
    want = (answer.input_tokens, answer.output_tokens, answer.total_tokens)
    expect(got == want, f"{where}: usage (input, output, total) is {got}; the server reported {want}")


def _check_calls(calls: Sequence[ToolCall], scripted: Sequence[ScriptedCall], where: str) -> None:
    expect(len(calls) == len(scripted),
           f"{where}: {len(calls)} tool call(s) {[c.name for c in calls]}; the server sent {len(scripted)} "
           f"{[c.id for c in scripted]}")
    for i, (call, want) in enumerate(zip(calls, scripted, strict=True)):
        expect(isinstance(call, ToolCall), f"{where}: tool call #{i} is {type(call).__name__}, not a ToolCall")
        expect(call.id == want.id, f"{where}: tool call #{i} has id {call.id!r}; the server sent {want.id!r}")
        expect(call.name == want.name, f"{where}: tool call {want.id} is named {call.name!r}, not {want.name!r}")
        if want.well_formed:
            expect(_jsonable(call.arguments) == want.parsed and call.raw_arguments is None,
                   f"{where}: tool call {want.id} has arguments={_jsonable(call.arguments)!r}, "
                   f"raw_arguments={call.raw_arguments!r}; the server sent {want.arguments!r}, so "
                   f"arguments={want.parsed!r} and raw_arguments=None")
        else:
            expect(call.raw_arguments == want.arguments and not call.arguments,
                   f"{where}: tool call {want.id} has arguments={_jsonable(call.arguments)!r}, "
                   f"raw_arguments={call.raw_arguments!r}; its arguments text {want.arguments!r} is not valid "
                   "JSON, so arguments must be empty and raw_arguments must hold the text as sent")


def _find_assistant_turn(wire: WireRequest, call_ids: Sequence[str], where: str) -> int:
    for i, message in enumerate(wire.messages):
        if message.role == "assistant" and [c.id for c in message.tool_calls] == list(call_ids):
            return i
    seen = [(m.role, [c.id for c in m.tool_calls]) for m in wire.messages]
    raise ConformanceFailure(
        f"{where}: no assistant message carries the tool calls {list(call_ids)} (in that order, in one message); "
        f"the transcript sent was (role, call ids): {seen}")


def _check_results(wire: WireRequest, after: int, results: Sequence[tuple[str, str]], where: str) -> None:
    following = list(wire.messages[after + 1: after + 1 + len(results)])
    got = [(m.role, m.tool_call_id, m.text) for m in following]
    want = [("tool", call_id, text) for call_id, text in results]
    expect(got == want,
           f"{where}: the messages right after the assistant's tool calls are (role, call id, text) {got}; "
           f"expected the results {want}")
    for message in following:
        expect(not message.is_error, f"{where}: the successful result of {message.tool_call_id} is flagged as an error")


def _refusal(dialect: Dialect, status: int, message: str) -> WireReply:
    """Render one of the server's own refusals in the dialect's error format."""
    error = ScriptedError(status=status, message=message, kind="not_found" if status == 404 else "invalid_request")  # noqa: PLR2004
    empty = CapturedRequest(index=-1, method="POST", path=dialect.path, query="", headers={}, body=b"{}", at=0.0)
    headers = {**dialect.error_headers(error)}
    return WireReply.json(dialect.render_error(error, empty), status=status, headers=headers)


def _roles_and_texts(messages: Sequence[WireMessage]) -> list[tuple[str, str | None]]:
    return [(m.role, m.text) for m in messages]


# -- the test class ---------------------------------------------------------------------------------


class ProviderConformance:
    """Subclass as ``Test<Something>``; every scenario becomes a test method of your class.

    Set :attr:`dialect` and :attr:`provider_kind`, and implement :meth:`make_provider`::

        class TestMyProvider(ProviderConformance):
            dialect = OpenAIChatDialect()
            provider_kind = "my-kind"

            def make_provider(self, settings):
                return MyProvider(settings)

    Each test starts a local server speaking :attr:`dialect` on 127.0.0.1, builds the provider
    with settings pointing at it, runs one scenario and closes both. The tests run under anyio,
    once per backend in :attr:`anyio_backends`.

    Attributes:
        dialect: The wire format the provider speaks.
        provider_kind: The provider's registered kind (goes into the settings).
        provider_name: The provider's name in the settings and requests.
        model: The model id put in the requests.
        api_key: The API key put in the settings; the dialect checks that it is sent.
        provider_options: Extra ``options`` for the settings (camelCase, as in YAML).
        unsupported: Scenario names or tags (``streaming``) the provider cannot support, each
            with the reason; those tests are skipped and the reason shown.
        expected_failures: Scenario names or tags that are known to fail for now, each with the
            reason; those tests are marked ``xfail(strict=False)``.
        anyio_backends: The backends to run under; ``None`` uses your ``anyio_backend`` fixture.
            ``trio`` is skipped (with a reason) when it is not installed.
        scenario_timeout: Seconds a provider call may take before the scenario fails.
        stream_gate_timeout: Seconds the streaming scenario holds the stream back, waiting for
            the first text piece to be yielded, before it records a failure and goes on.
    """

    dialect: ClassVar[Dialect]
    provider_kind: ClassVar[str]
    provider_name: ClassVar[str] = "conformance"
    model: ClassVar[str] = "conformance-model"
    api_key: ClassVar[str] = "sk-conformance-0123456789"
    provider_options: ClassVar[Mapping[str, Any]] = {}
    unsupported: ClassVar[Mapping[str, str]] = {}
    expected_failures: ClassVar[Mapping[str, str]] = {}
    anyio_backends: ClassVar[Sequence[str] | None] = ("asyncio", "trio")
    scenario_timeout: ClassVar[float] = 10.0
    stream_gate_timeout: ClassVar[float] = 5.0

    # -- what a subclass provides ----------------------------------------------------------------

    def make_provider(self, settings: ProviderSettings) -> Provider | Awaitable[Provider]:
        """Return a fresh provider built from ``settings``; may be ``async def``.

        ``settings.base_url`` points at the local server. A method whose parameter is named
        ``base_url`` gets that URL instead of the settings.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement make_provider(settings)")

    def provider_settings(self, server_url: str) -> ProviderSettings:
        """Return the settings :meth:`make_provider` gets (default: the dialect's, from the class attributes)."""
        return self.dialect.settings(server_url, name=self.provider_name, kind=self.provider_kind,
                                     api_key=self.api_key, options=self.provider_options)

    def make_request(self, messages: Sequence[Message], *, tools: tuple[ToolSpec, ...] = (),
                     stream: bool = False) -> ModelRequest:
        """Return the request a scenario sends (override to add ``settings`` your provider needs)."""
        return ModelRequest(model=self.model, provider=self.provider_name, messages=tuple(messages), tools=tools,
                            stream=stream)

    # -- pytest plumbing -------------------------------------------------------------------------

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Check the declarations, and run each scenario once per backend of :attr:`anyio_backends`."""
        self._check_declarations()
        backends = self.anyio_backends
        if backends is not None and "anyio_backend" in metafunc.fixturenames:
            params = [
                pytest.param(b, marks=pytest.mark.skip(reason="trio is not installed"))
                if b == "trio" and importlib.util.find_spec("trio") is None else b
                for b in backends
            ]
            metafunc.parametrize("anyio_backend", params)

    @classmethod
    def _check_declarations(cls) -> None:
        known = set(SCENARIOS) | {tag for s in SCENARIOS.values() for tag in s.tags}
        for attribute in ("unsupported", "expected_failures"):
            for key, reason in getattr(cls, attribute).items():
                if key not in known:
                    raise ValueError(f"{cls.__name__}.{attribute} names {key!r}, which is no scenario or tag; "
                                     f"known: {', '.join(sorted(known))}")
                if not isinstance(reason, str) or not reason.strip():
                    raise ValueError(f"{cls.__name__}.{attribute}[{key!r}] must give the reason as a non-empty string")

    @classmethod
    def declared(cls, name: str, attribute: str) -> str | None:
        """Return the reason ``attribute`` (``unsupported`` ...) gives for scenario ``name`` or its tags."""
        declarations: Mapping[str, str] = getattr(cls, attribute)
        scenario = SCENARIOS[name]
        for key in (name, *sorted(scenario.tags)):
            if key in declarations:
                return declarations[key]
        return None

    @pytest.fixture
    def _conformance_declarations(self, request: pytest.FixtureRequest) -> None:
        """Skip an unsupported scenario, or mark an expected failure, before anything starts."""
        name = getattr(request.function, "_conformance_scenario", None)
        if name is None:
            return
        reason = self.declared(name, "unsupported")
        if reason is not None:
            pytest.skip(f"{self.provider_kind} does not support {name}: {reason}")
        reason = self.declared(name, "expected_failures")
        if reason is not None:
            request.node.add_marker(pytest.mark.xfail(reason=reason, strict=False))

    @pytest.fixture
    async def conformance(self, anyio_backend: Any, _conformance_declarations: None) -> AsyncIterator[Conformance]:
        """Yield a :class:`Conformance` harness: a running server and a provider pointed at it."""
        del anyio_backend  # requested so that anyio's plugin runs this fixture
        async with self.open_conformance() as harness:
            yield harness

    @contextlib.asynccontextmanager
    async def open_conformance(self) -> AsyncIterator[Conformance]:
        """Start a server and a provider, yield the harness, and close both (also outside pytest)."""
        dialect = getattr(self, "dialect", None)
        if dialect is None:
            raise TypeError(f"{type(self).__name__} must set dialect (for example OpenAIChatDialect())")
        if not getattr(self, "provider_kind", None):
            raise TypeError(f"{type(self).__name__} must set provider_kind")
        with WireServer(path=dialect.path, error_reply=functools.partial(_refusal, dialect)) as server:
            settings = self.provider_settings(server.url)
            made = self._call_make_provider(settings)
            if inspect.isawaitable(made):
                made = await made
            if not isinstance(made, Provider):
                raise TypeError(f"make_provider() returned {type(made).__name__}, not a loopwright.abc.Provider")
            try:
                yield Conformance(self, server, made)
            finally:
                with anyio.CancelScope(shield=True):
                    await made.aclose()

    def _call_make_provider(self, settings: ProviderSettings) -> Any:
        parameters = list(inspect.signature(self.make_provider).parameters)
        if parameters[:1] == ["base_url"]:
            return self.make_provider(settings.base_url)  # type: ignore[arg-type]
        return self.make_provider(settings)

    # -- the scenarios ----------------------------------------------------------------------------

    @_scenario("plain_answer", "A text answer: the request carries the model, system prompt, user text and "
                               "API key; the response has the text, finish_reason stop and the usage.")
    async def test_plain_answer(self, conformance: Conformance) -> None:
        """A plain text answer comes back whole, and the request was well formed."""
        h = conformance
        answer = ScriptedAnswer(text="Hello — glad to help ✓", input_tokens=11, output_tokens=7)
        h.answer(answer)
        response = await h.complete(h.request(Message(role="system", content=SYSTEM),
                                              Message(role="user", content="Say hello.")))
        h.expect_requests(1, "one call, one request")
        wire = h.sent(0)
        expect(not wire.stream, "complete() asked for a streamed answer")
        expect(wire.model == self.model, f"the request asks for model {wire.model!r}, not {self.model!r}")
        got = _roles_and_texts(wire.messages)
        want = [("system", SYSTEM), ("user", "Say hello.")]
        expect(got == want, f"the request's transcript is (role, text) {got}; expected {want}")
        expect(not wire.tools, f"the request offers tools {list(wire.tools)} though none were given")
        message = response.message
        expect(message.content == answer.text, f"the answer's text is {message.content!r}, not {answer.text!r}")
        expect(not message.tool_calls, f"the answer has tool calls {message.tool_calls!r}; the server sent none")
        expect(response.finish_reason == "stop", f"finish_reason is {response.finish_reason!r}, not 'stop'")
        _check_usage(response, answer, "the answer")
        expect(response.model in (None, answer.model),
               f"response.model is {response.model!r}; the server said {answer.model!r}")

    @_scenario("tool_round_trip", "A tool call comes back with its id, name and parsed arguments; the next "
                                  "request carries the call and its result in the vendor's format.")
    async def test_tool_round_trip(self, conformance: Conformance) -> None:
        """A tool call is decoded, and the call and its result travel back in the next request."""
        h = conformance
        call = ScriptedCall(id="call_rt_1", name="add", arguments='{"a": 1, "b": 2}')
        h.answer(ScriptedAnswer(tool_calls=(call,), finish_reason="tool_calls"))
        h.answer(ScriptedAnswer(text="1 + 2 = 3"))
        system = Message(role="system", content=SYSTEM)
        user = Message(role="user", content="What is 1 + 2? Use the add tool.")
        first = await h.complete(h.request(system, user, tools=(ADD,)))
        _check_calls(first.message.tool_calls, [call], "the first answer")
        expect(first.finish_reason == "tool_calls", f"finish_reason is {first.finish_reason!r}, not 'tool_calls'")
        offered = h.sent(0).tools
        expect(list(offered) == ["add"], f"the first request offers the tools {list(offered)}, not ['add']")
        expect(_jsonable(offered["add"]) == _jsonable(ADD.parameters),
               f"the add tool's schema was sent as {offered['add']!r}, not {_jsonable(ADD.parameters)!r}")
        result = Message(role="tool", tool_call_id=first.message.tool_calls[0].id, name="add", content="3",
                         status=ToolStatus.SUCCESS)
        second = await h.complete(h.request(system, user, first.message, result, tools=(ADD,)))
        expect(second.message.content == "1 + 2 = 3", f"the second answer's text is {second.message.content!r}")
        h.expect_requests(2, "one per call")
        wire = h.sent(1)
        where = "the request after the tool call"
        turn = _find_assistant_turn(wire, ["call_rt_1"], where)
        sent_call = wire.messages[turn].tool_calls[0]
        expect((sent_call.name, _jsonable(sent_call.arguments)) == ("add", {"a": 1, "b": 2}),
               f"{where}: the call was sent as {sent_call.name!r} with arguments {sent_call.arguments!r}")
        _check_results(wire, turn, [("call_rt_1", "3")], where)
        before = _roles_and_texts(wire.messages[:turn])
        expect(before == [("system", SYSTEM), ("user", user.content)],
               f"{where}: the messages before the call are (role, text) {before}")
        expect(list(wire.tools) == ["add"], f"{where}: the tools offered are {list(wire.tools)}, not ['add']")

    @_scenario("parallel_tool_calls", "Two calls in one answer come back in order; the next request carries "
                                      "both in one assistant turn, then both results in order.")
    async def test_parallel_tool_calls(self, conformance: Conformance) -> None:
        """Parallel calls keep their order, and both calls and both results travel back."""
        h = conformance
        calls = (ScriptedCall(id="call_p_1", name="add", arguments='{"a": 1, "b": 2}'),
                 ScriptedCall(id="call_p_2", name="add", arguments='{"a": 3, "b": 4}'))
        h.answer(ScriptedAnswer(text="Adding both.", tool_calls=calls, finish_reason="tool_calls"))
        h.answer(ScriptedAnswer(text="3 and 7."))
        user = Message(role="user", content="What are 1 + 2 and 3 + 4?")
        first = await h.complete(h.request(user, tools=(ADD,)))
        _check_calls(first.message.tool_calls, calls, "the answer")
        expect(first.message.content == "Adding both.",
               f"the text beside the calls is {first.message.content!r}, not 'Adding both.'")
        expect(first.finish_reason == "tool_calls", f"finish_reason is {first.finish_reason!r}, not 'tool_calls'")
        results = [Message(role="tool", tool_call_id=c.id, name=c.name, content=text, status=ToolStatus.SUCCESS)
                   for c, text in zip(first.message.tool_calls, ("3", "7"), strict=True)]
        second = await h.complete(h.request(user, first.message, *results, tools=(ADD,)))
        expect(second.message.content == "3 and 7.", f"the second answer's text is {second.message.content!r}")
        wire = h.sent(1)
        where = "the request after the parallel calls"
        turn = _find_assistant_turn(wire, ["call_p_1", "call_p_2"], where)
        sent = [(c.name, _jsonable(c.arguments)) for c in wire.messages[turn].tool_calls]
        expect(sent == [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})],
               f"{where}: the calls were sent as {sent}")
        expect(wire.messages[turn].text == "Adding both.",
               f"{where}: the assistant's text beside the calls was sent as {wire.messages[turn].text!r}")
        _check_results(wire, turn, [("call_p_1", "3"), ("call_p_2", "7")], where)

    @_scenario("streaming", "stream() asks for a stream and yields text pieces as they arrive, a tool_call "
                            "delta and its argument pieces, then one done delta with the reassembled answer.",
               tags=["streaming"])
    async def test_streaming(self, conformance: Conformance) -> None:
        """A streamed answer arrives piece by piece and the done delta holds all of it."""
        h = conformance
        call = ScriptedCall(id="call_s_1", name="add", arguments='{"a": 1, "b": 2}',
                            pieces=('{"a": ', '1, "b"', ": 2}"))
        answer = ScriptedAnswer(text="Let me add those — un moment ✓.",
                                text_pieces=("Let me ", "add those — ", "un moment ✓."),
                                tool_calls=(call,), finish_reason="tool_calls")
        gate = threading.Event()
        h.answer(answer, gate=gate)
        deltas = await h.stream(h.request(Message(role="user", content="Add 1 and 2."), tools=(ADD,), stream=True),
                                gate=gate)
        h.expect_requests(1, "one stream, one request")
        expect(h.sent(0).stream, "stream() did not ask the server for a streamed answer")
        kinds = [d.kind for d in deltas]
        texts = [d.text for d in deltas if d.kind == "text"]
        expect("".join(texts) == answer.text, f"the text deltas join into {''.join(texts)!r}, not {answer.text!r}")
        expect(len([t for t in texts if t]) >= 2,  # noqa: PLR2004 - "in pieces": more than one
               f"the text came in {len(texts)} delta(s) {texts}; the server sent it in "
               f"{len(answer.stream_text_pieces)} pieces, which must reach the caller as they arrive")
        starts = [d for d in deltas if d.kind == "tool_call"]
        expect([(d.tool_call_id, d.name) for d in starts] == [("call_s_1", "add")],
               f"the tool_call deltas are {[(d.tool_call_id, d.name) for d in starts]}; expected [('call_s_1', 'add')]")
        start = kinds.index("tool_call")
        expect(max(i for i, k in enumerate(kinds) if k == "text") < start,
               f"a text delta came after the tool call started, though the server sent all text first: {kinds}")
        pieces = [d for d in deltas if d.kind == "arguments"]
        if pieces:
            expect(all(d.tool_call_id == "call_s_1" for d in pieces),
                   f"arguments deltas name the calls {[d.tool_call_id for d in pieces]}, not 'call_s_1'")
            expect(kinds.index("arguments") > start, "an arguments delta came before its tool_call delta")
            joined = "".join(d.text for d in pieces)
            expect(joined == call.arguments, f"the arguments deltas join into {joined!r}, not {call.arguments!r}")
        done = deltas[-1].response
        assert done is not None  # noqa: S101 - checked by Conformance.stream; narrows the type
        expect(done.message.content == answer.text,
               f"the done delta's text is {done.message.content!r}, not {answer.text!r}")
        _check_calls(done.message.tool_calls, [call], "the done delta")
        expect(done.finish_reason == "tool_calls", f"the done delta's finish_reason is {done.finish_reason!r}")
        _check_usage(done, answer, "the done delta")

    @_scenario("streaming_retry", "A 429 (Retry-After: 0) answering a stream request is retried, and the "
                                  "stream then succeeds.", tags=["streaming"])
    async def test_streaming_retry(self, conformance: Conformance) -> None:
        """A rate limit before the stream starts is retried like a plain call."""
        h = conformance
        h.fail_with(ScriptedError(status=429, kind="rate_limit", headers={"Retry-After": "0"},
                                  message="Rate limit reached for requests; please try again in 0s."))
        answer = ScriptedAnswer(text="Streamed after a retry.")
        h.answer(answer)
        deltas = await h.stream(h.request(Message(role="user", content="Hi."), stream=True))
        h.expect_requests(2, "the 429, then the retry")
        expect(h.sent(1).stream, "the retry did not ask for a streamed answer")
        done = deltas[-1].response
        assert done is not None  # noqa: S101 - checked by Conformance.stream; narrows the type
        expect(done.message.content == answer.text, f"the done delta's text is {done.message.content!r}")

    @_scenario("rate_limit_retry", "A 429 with Retry-After: 0 is retried with the same request, and the "
                                   "answer to the retry is returned.")
    async def test_rate_limit_retry(self, conformance: Conformance) -> None:
        """A 429 is transient: the provider retries and returns the next answer."""
        h = conformance
        h.fail_with(ScriptedError(status=429, kind="rate_limit", headers={"Retry-After": "0"},
                                  message="Rate limit reached for requests; please try again in 0s."))
        answer = ScriptedAnswer(text="Recovered.")
        h.answer(answer)
        response = await h.complete(h.request(Message(role="user", content="Hi.")))
        h.expect_requests(2, "the 429, then the retry")
        first, second = (h.server.requests[i].json for i in (0, 1))
        expect(first == second, f"the retry's body differs from the first request's: {first!r} then {second!r}")
        expect(response.message.content == answer.text, f"the answer's text is {response.message.content!r}")

    @_scenario("final_error", "A 400 raises ProviderError at once: status 400, not transient, carrying the "
                              "API's message; it is not retried.")
    async def test_final_error(self, conformance: Conformance) -> None:
        """A 400 is final: one request, and a ProviderError that says what the API said."""
        h = conformance
        message = "max_tokens: 1000000 > 8192, the most this model can write"
        h.fail_with(ScriptedError(status=400, kind="invalid_request", message=message))
        h.answer(ScriptedAnswer(text="This answer to a retry must never be read."))
        err = await h.provider_error(h.request(Message(role="user", content="Hi.")))
        h.check_server()
        h.expect_requests(1, "a 400 must not be retried")
        expect(err.status == 400, f"ProviderError.status is {err.status!r}, not 400")  # noqa: PLR2004
        expect(err.transient is False, f"ProviderError.transient is {err.transient!r} for a 400; it must be False")
        expect(message in str(err), f"the ProviderError does not carry the API's message {message!r}: {str(err)!r}")

    @_scenario("content_filter", "An answer the vendor stopped with its content filter gives "
                                 "finish_reason content_filter, with the text sent so far.")
    async def test_content_filter(self, conformance: Conformance) -> None:
        """The vendor's content-filter stop is normalised to content_filter, without an exception."""
        h = conformance
        answer = ScriptedAnswer(text="I can't help with that.", finish_reason="content_filter")
        h.answer(answer)
        response = await h.complete(h.request(Message(role="user", content="Something forbidden.")))
        expect(response.finish_reason == "content_filter",
               f"finish_reason is {response.finish_reason!r}; the server sent "
               f"{self.dialect.vendor_finish_reason('content_filter')!r}, which is 'content_filter'")
        expect(response.message.content == answer.text, f"the answer's text is {response.message.content!r}")
        vendor = self.dialect.vendor_finish_reason("content_filter")
        expect(response.raw_finish_reason in (None, vendor),
               f"raw_finish_reason is {response.raw_finish_reason!r}; the server sent {vendor!r}")

    @_scenario("malformed_tool_arguments", "Tool arguments that are not valid JSON give ToolCall.raw_arguments "
                                           "(the text as sent) and empty arguments, without an exception; a "
                                           "well-formed call beside it is unaffected.")
    async def test_malformed_tool_arguments(self, conformance: Conformance) -> None:
        """Malformed arguments are kept as raw text, in every form the wire format can carry them."""
        h = conformance
        bad = ScriptedCall(id="call_m_1", name="add", arguments='{"a": 1 "b": 2}', pieces=('{"a": 1', ' "b": 2}'))
        good = ScriptedCall(id="call_m_2", name="add", arguments='{"a": 3, "b": 4}')
        answer = ScriptedAnswer(tool_calls=(bad, good), finish_reason="tool_calls")
        forms = [f for f in ("json", "stream") if f in self.dialect.raw_arguments_on]
        streaming_off = self.declared("streaming", "unsupported")
        if streaming_off is not None and "stream" in forms:
            forms.remove("stream")
        if not forms:
            pytest.skip(f"{self.dialect.name} carries malformed arguments only in streams, and "
                        f"{self.provider_kind} does not stream: {streaming_off}")
        user = Message(role="user", content="Add 1 and 2, and 3 and 4.")
        for form in forms:
            h.answer(answer)
            if form == "json":
                response = await h.complete(h.request(user, tools=(ADD,)))
                where = "complete()"
            else:
                deltas = await h.stream(h.request(user, tools=(ADD,), stream=True))
                done = deltas[-1].response
                assert done is not None  # noqa: S101 - checked by Conformance.stream; narrows the type
                response = done
                where = "stream()'s done delta"
                joined = "".join(d.text for d in deltas if d.kind == "arguments" and d.tool_call_id == bad.id)
                expect(not joined or joined == bad.arguments,
                       f"the arguments deltas of {bad.id} join into {joined!r}, not {bad.arguments!r}")
            _check_calls(response.message.tool_calls, answer.tool_calls, where)
            expect(response.finish_reason == "tool_calls",
                   f"{where}: finish_reason is {response.finish_reason!r}, not 'tool_calls'")

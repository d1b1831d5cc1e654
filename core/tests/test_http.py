"""Tests of loopwright.http: the HTTP scaffolding provider plugins share."""

from __future__ import annotations

import itertools
import json
import socket
import ssl
import subprocess
import sys
from typing import ClassVar

import anyio
import attrs
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopwright.abc import ProviderSettings
from loopwright.errors import ConfigError, ProviderError
from loopwright.http import (
    AiohttpTransport,
    Endpoint,
    HTTPOptions,
    OptionReader,
    ShardedTransport,
    SSEDecoder,
    check_base_url,
    is_transient_status,
    make_client,
    override_headers,
    parse_duration,
    resolve_api_key,
    status_error,
    transport_error,
)


def settings(name: str = "p", **options) -> ProviderSettings:
    return ProviderSettings(name=name, kind="k", options=options)


def test_importing_loopwright_does_not_import_the_module_or_httpx():
    """`import loopwright` stays free of httpx: only providers import loopwright.http."""
    code = "import sys, loopwright; assert 'httpx' not in sys.modules and 'loopwright.http' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_aiohttp_is_imported_only_to_build_its_transport():
    """Importing loopwright.http (or a provider on it) leaves aiohttp unimported until a transport needs it."""
    code = ("import sys, loopwright.http, loopwright_openai, loopwright_anthropic\n"
            "assert 'aiohttp' not in sys.modules\n"
            "loopwright.http.AiohttpTransport()\n"
            "assert 'aiohttp' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- options -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), [
    (3, 3.0), (0.5, 0.5), ("500ms", 0.5), ("30s", 30.0), ("2m", 120.0), ("1.5h", 5400.0), (" 7 ", 7.0), (".5s", 0.5),
    (-1, None), (True, None), ("soon", None), ("5 days", None), (None, None),
])
def test_parse_duration(value, seconds):
    """Durations are seconds or a number with ms/s/m/h; anything else is None."""
    assert parse_duration(value) == seconds


def test_http_options_defaults():
    """Without options: 1000 connections all kept alive, 64 shards, 600 s / 5 s timeouts, 2 retries."""
    reader = OptionReader(settings())
    options = HTTPOptions.read(reader)
    reader.check()
    assert options == HTTPOptions(max_keepalive_connections=1000)
    assert (options.max_connections, options.pool_shards, options.timeout, options.connect_timeout) == (
        1000, 64, 600.0, 5.0)
    assert options.transport == "auto"
    assert options.timeout_set is False


def test_http_options_read_every_shared_key():
    """Every shared key is read, durations in any unit; keep-alive follows maxConnections."""
    reader = OptionReader(settings(
        maxRetries=0, retryBaseDelay="10ms", retryMaxDelay="1m", timeout=None, connectTimeout="250ms",
        headers={"X-A": "1"}, maxConnections=10, keepaliveExpiry="1h", poolShards=1, transport="httpcore",
        proxy="http://proxy:3128"))
    options = HTTPOptions.read(reader)
    reader.check()
    assert attrs.asdict(options) == {
        "max_retries": 0, "retry_base_delay": 0.01, "retry_max_delay": 60.0, "timeout": None,
        "connect_timeout": 0.25, "headers": {"X-A": "1"}, "max_connections": 10, "max_keepalive_connections": 10,
        "keepalive_expiry": 3600.0, "pool_shards": 1, "transport": "httpcore", "proxy": "http://proxy:3128",
        "timeout_set": True,
    }


def test_every_bad_option_is_reported_at_its_path():
    """One ConfigError names the provider and lists each bad option with its JSON path."""
    reader = OptionReader(settings(
        "oa", maxRetries=-1, timeout="soon", headers={"X": 1}, poolShards=0, proxy=3, maxConnections=True,
        api="nope", transport="curl"))
    reader.choice("api", ("chat", "responses"), "chat")
    HTTPOptions.read(reader)
    with pytest.raises(ConfigError, match="invalid options for provider 'oa'") as info:
        reader.check()
    assert sorted(p.path for p in info.value.problems) == [f"$.providers.oa.{k}" for k in sorted(
        ["maxRetries", "timeout", "headers", "poolShards", "proxy", "maxConnections", "api", "transport"])]
    messages = {p.path.rsplit(".", 1)[1]: p.message for p in info.value.problems}
    assert messages["maxConnections"] == "must be an integer >= 1 or null, not True"
    assert messages["api"] == "must be one of chat, responses, not 'nope'"
    assert messages["transport"] == "must be one of auto, aiohttp, httpcore, not 'curl'"
    assert messages["timeout"].startswith("must be a duration")


def test_a_subclass_adds_its_own_options():
    """A provider's options class extends HTTPOptions and passes its fields to read()."""

    @attrs.frozen(kw_only=True)
    class Options(HTTPOptions):
        flavour: str = "plain"

    reader = OptionReader(settings(flavour="mint", maxConnections=None))
    options = Options.read(reader, flavour=reader.text("flavour") or "plain")
    reader.check()
    assert (options.flavour, options.max_connections, options.max_keepalive_connections) == ("mint", None, None)


@pytest.mark.parametrize("base_url", ["ftp://example.com/v1", "not a url", "http://"])
def test_check_base_url_refuses_what_is_not_http(base_url):
    """A baseUrl that is not an http(s) URL with a host is a ConfigError at $.providers.NAME.baseUrl."""
    with pytest.raises(ConfigError) as info:
        check_base_url(ProviderSettings(name="x", kind="k", base_url=base_url), default="https://a.example")
    assert info.value.problems[0].path == "$.providers.x.baseUrl"


def test_check_base_url_default_and_trailing_slash():
    """The default applies without a baseUrl; a trailing slash is dropped."""
    assert check_base_url(ProviderSettings(name="x", kind="k"), default="https://a.example/v1/") == "https://a.example/v1"
    assert check_base_url(ProviderSettings(name="x", kind="k", base_url="http://h:1/"), default="") == "http://h:1"


def test_resolve_api_key_reads_the_environment_only_for_the_vendor(monkeypatch):
    """The environment's key is used only when neither apiKey nor baseUrl is set."""
    monkeypatch.setenv("LW_TEST_KEY", "from-env")
    assert resolve_api_key(ProviderSettings(name="x", kind="k"), "LW_TEST_KEY") == "from-env"
    assert resolve_api_key(ProviderSettings(name="x", kind="k", api_key="given"), "LW_TEST_KEY") == "given"
    assert resolve_api_key(ProviderSettings(name="x", kind="k", base_url="http://h"), "LW_TEST_KEY") is None
    monkeypatch.setenv("LW_TEST_KEY", "")
    assert resolve_api_key(ProviderSettings(name="x", kind="k"), "LW_TEST_KEY") is None


def test_override_headers_is_case_insensitive():
    """An extra header replaces a default one of the same name in any case."""
    headers = override_headers({"Authorization": "Bearer a", "Accept": "x"}, {"authorization": "Token t"})
    assert headers == {"Accept": "x", "authorization": "Token t"}


# -- the sharded transport -----------------------------------------------------------------------


class OkBody(httpx.AsyncByteStream):
    """A network-like body: read through the transport's stream, so closing it counts."""

    async def __aiter__(self):
        yield b"ok"


class FakePool(httpx.AsyncBaseTransport):
    """Stands in for one httpx pool: answers once its gate opens, and records its limits."""

    built: ClassVar[list[FakePool]] = []
    gate: ClassVar[anyio.Event | None] = None

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.closed = False
        FakePool.built.append(self)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if FakePool.gate is not None:
            await FakePool.gate.wait()
        return httpx.Response(200, stream=OkBody(), request=request)

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def fake_pools(monkeypatch):
    FakePool.built = []
    FakePool.gate = None
    monkeypatch.setattr(httpx, "AsyncHTTPTransport", FakePool)
    return FakePool


@pytest.mark.anyio
async def test_sequential_requests_use_one_pool(fake_pools):
    """One request at a time stays on the first pool, and nothing is in flight afterwards."""
    transport = ShardedTransport(shards=4, limits=httpx.Limits(max_connections=100, max_keepalive_connections=100))
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(3):
            assert (await client.get("http://h/")).text == "ok"
        assert (len(fake_pools.built), transport._in_flight) == (1, [0])
    assert fake_pools.built[0].closed


@pytest.mark.anyio
async def test_concurrent_requests_spread_over_pools_built_on_demand(fake_pools):
    """Requests that find every pool busy open another, up to `shards`; then the least busy is used."""
    fake_pools.gate = anyio.Event()
    transport = ShardedTransport(shards=2, limits=httpx.Limits(max_connections=10, max_keepalive_connections=10))
    async with httpx.AsyncClient(transport=transport) as client, anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(client.get, "http://h/")
        await anyio.wait_all_tasks_blocked()
        assert len(fake_pools.built) == 2
        assert sorted(transport._in_flight) == [2, 3]
        fake_pools.gate.set()
    assert transport._in_flight == []  # closed with the client
    limits = fake_pools.built[0].kwargs["limits"]
    assert (limits.max_connections, limits.max_keepalive_connections) == (5, 5)


def test_sharded_transport_needs_a_shard():
    """shards below 1 is a ValueError."""
    with pytest.raises(ValueError, match="shards must be >= 1"):
        ShardedTransport(shards=0, limits=httpx.Limits())


def test_make_client_builds_a_sharded_client():
    """make_client splits the limits over the shards and sets headers and timeouts."""
    options = HTTPOptions(max_connections=1000, max_keepalive_connections=1000, pool_shards=64, timeout=9.0,
                          connect_timeout=1.0)
    client = make_client(options, url="http://127.0.0.1:1/v1", headers={"X-A": "1"})
    transport = client._transport
    assert isinstance(transport, ShardedTransport)
    assert (transport.shards, transport._limits.max_connections, transport._limits.max_keepalive_connections) == (
        64, 16, 16)
    assert isinstance(transport._verify, ssl.SSLContext)
    assert client.headers["x-a"] == "1"
    assert (client.timeout.read, client.timeout.connect) == (9.0, 1.0)


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "transient"), [
    (400, False), (401, False), (404, False), (422, False), (408, True), (409, True), (429, True), (500, True),
    (503, True), (529, True),
])
def test_transient_statuses(status, transient):
    """408, 409, 429 and every 5xx (Anthropic's 529 included) may be retried."""
    assert is_transient_status(status) is transient


def _response(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, content=body, headers=headers, request=httpx.Request("POST", "http://h/v1"))


def test_status_error_uses_the_vendor_message_and_the_headers():
    """describe finds the message; request id, Retry-After and the body travel with the error."""
    body = json.dumps({"error": {"message": "slow down"}}).encode()
    response = _response(429, body, {"retry-after": "2", "request-id": "req_1"})
    err = status_error(response, provider="p", model="m", describe=lambda d: d["error"]["message"],
                       request_id_header="request-id")
    assert str(err) == "p:m (HTTP 429): slow down (request req_1)"
    assert (err.status, err.transient, err.retry_after, err.body) == (429, True, 2.0, body.decode())
    assert err.request is response.request


def test_status_error_falls_back_to_the_body_or_the_reason():
    """Without a vendor message: the body's first 300 characters, else the reason phrase."""
    err = status_error(_response(400, b"x" * 5000), provider="p", model="m", describe=lambda _: None)
    assert str(err).endswith(": " + "x" * 300)
    assert len(err.body) == 2000
    assert str(status_error(_response(404), provider="p", model=None)) == "p (HTTP 404): Not Found"


def test_x_should_retry_overrides_the_status():
    """x-should-retry: false makes a 5xx final; true makes a 400 transient."""
    assert not status_error(_response(503, headers={"x-should-retry": "false"}), provider="p", model="m").transient
    assert status_error(_response(400, headers={"x-should-retry": "true"}), provider="p", model="m").transient


@pytest.mark.parametrize(("exc", "stream", "text", "transient"), [
    (httpx.ConnectError("refused"), False, "the connection failed (ConnectError: refused)", True),
    (httpx.ReadTimeout(""), False, "the request timed out (ReadTimeout)", True),
    (httpx.ReadTimeout(""), True, "the stream timed out (ReadTimeout)", True),
    (httpx.RemoteProtocolError("peer closed"), True, "the stream broke off (RemoteProtocolError: peer closed)", True),
    (httpx.UnsupportedProtocol("ftp"), False, "the request could not be sent (UnsupportedProtocol: ftp)", False),
    (httpx.InvalidURL("bad"), False, "the request could not be sent (InvalidURL: bad)", False),
    (httpx.DecodingError("gzip"), False, "the request failed (DecodingError: gzip)", False),
])
def test_transport_error_classification(exc, stream, text, transient):
    """Timeouts and connection failures are transient; requests that cannot be sent are final."""
    err = transport_error(exc, provider="p", model="m", stream=stream)
    assert (str(err), err.transient, err.status, err.request) == (f"p:m: {text}", transient, None, None)


# -- server-sent events --------------------------------------------------------------------------

STREAM = (
    b"\xef\xbb\xbf: keep-alive\r\n\r\n"
    b"event: a\r\ndata:one\r\ndata: two\r\nid: 7\r\nretry: 5\r\n\r\n"
    b'data: {"t": "h\xc3\xa9llo \xe2\x82\xac"}\n\n'
    b"event: only-a-name\n\n"
    b"data\rdata: x\r\r"
    b"data: cut"
)
EVENTS = [("a", "one\ntwo"), (None, '{"t": "héllo €"}'), (None, "\nx")]


def decode_all(chunks: list[bytes], decoder: SSEDecoder | None = None) -> list[tuple[str | None, str]]:
    decoder = decoder or SSEDecoder()
    events = [e for chunk in chunks for e in decoder.feed(chunk)]
    return events + decoder.finish()


def test_sse_decoder_reads_a_whole_body():
    """CR, LF and CRLF end lines; comments, id, retry and name-only events give nothing; a cut event is dropped."""
    assert decode_all([STREAM]) == EVENTS


def test_sse_decoder_reads_a_body_split_anywhere():
    """Split at any byte (mid-CRLF, mid-UTF-8 character), the body gives the same events."""
    for i in range(len(STREAM) + 1):
        assert decode_all([STREAM[:i], STREAM[i:]]) == EVENTS, i
        assert decode_all([STREAM[:i], b"", STREAM[i:]]) == EVENTS, i  # an empty read between \r and \n
    assert decode_all([bytes([b]) for b in STREAM]) == EVENTS


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_sse_decoder_any_chunking(cuts):
    """Any chunking of the body gives the same events."""
    points = [0, *sorted(cuts), len(STREAM)]
    assert decode_all([STREAM[a:b] for a, b in itertools.pairwise(points)]) == EVENTS


def test_sse_decoder_lines():
    """decode() takes lines already split: the space after the colon is dropped, blank lines dispatch."""
    decoder = SSEDecoder()
    lines = [": c", "event: e", "data:  two spaces", "", "data", ""]
    assert [e for e in map(decoder.decode, lines) if e is not None] == [("e", " two spaces"), (None, "")]


def test_sse_decoder_is_whole_tolerates_missing_blank_lines():
    """With is_whole, whole data followed by another data line is an event, and a whole last one is kept."""

    def is_json(data: str) -> bool:
        try:
            json.loads(data)
        except ValueError:
            return False
        return True

    body = b'data: {"a":1}\ndata: {"b":2}\ndata: {\ndata: "c": 3}\ndata: {"d":4}'
    assert decode_all([body], SSEDecoder(is_whole=is_json)) == [
        (None, '{"a":1}'), (None, '{"b":2}'), (None, '{\n"c": 3}'), (None, '{"d":4}')]
    assert decode_all([b'data: {"a":1}\n\ndata: {"b":'], SSEDecoder(is_whole=is_json)) == [(None, '{"a":1}')]
    assert decode_all([body]) == []  # the spec: no blank line, no event


# -- the endpoint --------------------------------------------------------------------------------


def _options(**kw) -> HTTPOptions:
    return HTTPOptions(retry_base_delay=0.001, **kw)


@pytest.mark.anyio
async def test_endpoint_with_an_injected_client_sends_headers_and_leaves_it_open():
    """An injected client gets the endpoint's headers per request and is not closed by aclose."""
    seen: list[httpx.Request] = []

    def app(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    async with httpx.AsyncClient(transport=httpx.MockTransport(app)) as client:
        endpoint = Endpoint("http://h/v1/x", provider="p", options=_options(timeout=3.0, timeout_set=True),
                            headers={"X-Key": "k"}, client=client)
        response = await endpoint.send(b"{}", model="m")
        assert response.json() == {"ok": True}
        await endpoint.aclose()
        assert endpoint.client is client
        assert not client.is_closed
    assert (seen[0].method, str(seen[0].url), seen[0].headers["x-key"], seen[0].content) == (
        "POST", "http://h/v1/x", "k", b"{}")
    assert seen[0].extensions["timeout"]["read"] == 3.0


@pytest.mark.anyio
async def test_endpoint_post_retries_transient_statuses():
    """post() retries a 503 and returns the success; a final status raises at once with the vendor message."""
    replies = [httpx.Response(503, json={}), httpx.Response(200, json={"n": 2}),
               httpx.Response(400, json={"error": "bad"}), httpx.Response(200, json={})]
    calls = 0

    def app(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return replies.pop(0)

    async with httpx.AsyncClient(transport=httpx.MockTransport(app)) as client:
        endpoint = Endpoint("http://h/", provider="p", options=_options(), headers={}, client=client,
                            describe_error=lambda data: data.get("error"))
        assert (await endpoint.post(b"{}", model="m")).json() == {"n": 2}
        with pytest.raises(ProviderError, match=r"\(HTTP 400\): bad$") as info:
            await endpoint.post(b"{}", model="m")
    assert (calls, info.value.transient) == (3, False)


@pytest.mark.anyio
async def test_endpoint_send_unchecked_returns_a_read_error_response():
    """With check=False an error status comes back, its streamed body read and closed."""
    app = httpx.MockTransport(lambda _: httpx.Response(422, content=b"no stream_options"))
    async with httpx.AsyncClient(transport=app) as client:
        endpoint = Endpoint("http://h/", provider="p", options=_options(), headers={}, client=client)
        response = await endpoint.send(b"{}", model="m", stream=True, check=False)
    assert (response.status_code, response.text, response.is_closed) == (422, "no stream_options", True)


@pytest.mark.anyio
async def test_endpoint_events_and_errors_about_a_response():
    """events() decodes a streamed body; error() carries the status and, when read, the body."""
    body = httpx.ByteStream(b"event: e\ndata: 1\n\ndata: 2\n\n")
    app = httpx.MockTransport(lambda _: httpx.Response(200, stream=body))
    async with httpx.AsyncClient(transport=app) as client:
        endpoint = Endpoint("http://h/", provider="p", options=_options(), headers={}, client=client)
        response = await endpoint.send(b"{}", model="m", stream=True)
        events = [e async for e in endpoint.events(response, model="m")]
        err = endpoint.error("cut", model="m", response=response, transient=True)
        await response.aclose()
    assert events == [("e", "1"), (None, "2")]
    assert (str(err), err.status, err.body, err.transient) == ("p:m (HTTP 200): cut", 200, None, True)
    assert endpoint.error("x", model=None, response=response, body="data").body == "data"


@pytest.mark.anyio
async def test_endpoint_builds_its_own_client_and_closes_it(anyio_backend):
    """Without an injected client one is built on first use, failures become ProviderErrors, aclose closes it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = Endpoint(f"http://127.0.0.1:{port}/v1", provider="p", options=_options(max_retries=1),
                        headers={})
    with pytest.raises(ProviderError, match="the connection failed") as info:
        await endpoint.post(b"{}", model="m")
    client = endpoint.client
    assert info.value.transient
    assert isinstance(client, httpx.AsyncClient)
    assert isinstance(client._transport, AiohttpTransport if anyio_backend == "asyncio" else ShardedTransport)
    await endpoint.aclose()
    assert client.is_closed
    assert endpoint.client is None

"""The otel sink's options, its own TracerProvider, and what importing loopwright costs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import loopwright
import loopwright_otel
import loopwright_testing
from loopwright import Assembly, Definition
from loopwright._definition import PluginSpec, StoreConfig
from loopwright._types import Record
from loopwright.errors import ConfigError
from loopwright_otel import OtelSink
from loopwright_testing import FakeProvider, reply, tool_call


@pytest.mark.parametrize(("options", "message"), [
    ({"servicename": "x"}, "unknown option 'servicename'"),
    ({"console": "yes"}, "console must be true"),
    ({"endpoint": 4318}, "endpoint must be a string"),
    ({"headers": {"a": 1}}, "headers must map names to strings"),
])
def test_bad_options_are_config_errors(options: dict[str, Any], message: str) -> None:
    """An unknown or wrongly typed option is a ConfigError that names it."""
    with pytest.raises(ConfigError, match=message):
        OtelSink(options)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_without_a_host_provider_it_builds_one_with_the_service_name(
        capsys: pytest.CaptureFixture[str], anyio_backend: str) -> None:
    """useGlobal: false (as when no host configured a provider) builds an SDK provider named serviceName;
    console: true prints each span, on standard error (never mixed into an answer on stdout);
    aclose shuts the provider down.
    """
    sink = OtelSink({"useGlobal": False, "console": True, "serviceName": "triage"})
    await sink.write(Record(kind="state", instance_id="i1", at="2026-01-01T00:00:00.000Z",
                            data={"from": None, "to": "running"}))
    await sink.write(Record(kind="turn", instance_id="i1", at="2026-01-01T00:00:01.500Z",
                            data={"turn": 1, "model": "openai:gpt-x", "latency": 0.5,
                                  "usage": {"inputTokens": 3, "outputTokens": 4}}))
    await sink.write(Record(kind="state", instance_id="i1", at="2026-01-01T00:00:02.000Z",
                            data={"from": "running", "to": "waiting", "stopReason": "waiting"}))
    await sink.aclose()
    captured = capsys.readouterr()
    assert captured.out == ""  # issue 31, point 4: `run > answer.txt` gets the answer only
    out = captured.err
    decoder = json.JSONDecoder()
    printed, i = [], 0
    while True:
        i = out.find("{", i)
        if i < 0:
            break
        obj, i = decoder.raw_decode(out, i)
        printed.append(obj)
    names = {p["name"]: p for p in printed}
    assert set(names) == {"chat gpt-x", "invoke_agent"}
    chat = names["chat gpt-x"]
    assert chat["resource"]["attributes"]["service.name"] == "triage"
    assert chat["attributes"]["gen_ai.provider.name"] == "openai"
    assert chat["start_time"].startswith("2026-01-01T00:00:01.000")
    assert chat["end_time"].startswith("2026-01-01T00:00:01.500")
    assert chat["parent_id"] == names["invoke_agent"]["context"]["span_id"]
    assert names["invoke_agent"]["end_time"].startswith("2026-01-01T00:00:02.000")


def test_an_endpoint_needs_the_otlp_exporter() -> None:
    """endpoint: with the exporter installed, spans go to BASE/v1/traces; without it, a ConfigError names the extra."""
    try:
        installed = importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
    except ModuleNotFoundError:
        installed = False
    if not installed:
        with pytest.raises(ConfigError, match=r"loopwright-otel\[otlp\]"):
            OtelSink({"useGlobal": False, "endpoint": "http://localhost:4318"})
        return
    sink = OtelSink({"useGlobal": False, "endpoint": "http://localhost:4318/", "headers": {"a": "b"}})
    provider = sink._owned[0]
    (processor,) = provider._active_span_processor._span_processors
    assert processor.span_exporter._endpoint == "http://localhost:4318/v1/traces"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_failing_tracer_does_not_stop_the_run(tmp_path: Path, anyio_backend: str) -> None:
    """Sinks fail open: a tracer that raises is an observer_error record and the run completes."""

    class Broken(TracerProvider):
        def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
            tracer = super().get_tracer(*args, **kwargs)

            def boom(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("collector on fire")

            tracer.start_span = boom  # type: ignore[method-assign]
            return tracer

    class BrokenSinkPlugin:
        @loopwright.hookimpl
        def loopwright_register_record_sinks(self, register: Any) -> None:
            register("brokenotel", lambda options: OtelSink(options, tracer_provider=Broken()))

    asm = Assembly(store=StoreConfig(kind="file", options={"path": str(tmp_path / "store")}),
                   records=(PluginSpec(kind="brokenotel"),))
    fake = FakeProvider(reply(None, tool_call("task_complete", result="hello", summary="done")))
    async with loopwright.Runtime(asm, plugins=[loopwright_testing, loopwright_otel, BrokenSinkPlugin(),
                                                fake.as_plugin("fake")], autoload=False) as rt:
        run = await rt.start_agent(Definition(name="x", model="fake:any", tools=("task_complete",)), prompt="hi")
        result = await run.result()
        records = await rt.records(run.instance_id)
    assert result.text == "hello"
    errors = [r for r in records if r["kind"] == "observer_error"]
    assert errors
    assert "collector on fire" in errors[0]["data"]["error"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_explicit_provider_is_used_and_records_between_segments_are_dropped(anyio_backend: str) -> None:
    """A host building sinks in Python can pass its own TracerProvider; a record of an instance with no
    open segment (other than a model or tool call) opens no span, and a resumed instance's tool call does.
    """
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = OtelSink({}, tracer_provider=provider)
    await sink.write(Record(kind="message", instance_id="i1", at="2026-01-01T00:00:00.000Z", data={"source": "api"}))
    assert exporter.get_finished_spans() == ()
    await sink.write(Record(kind="tool_call", instance_id="i1", at="2026-01-01T00:00:01.000Z",
                            data={"tool": "t", "status": "timeout", "duration": 0.25, "error": "took too long"}))
    await sink.aclose()
    tool, segment = exporter.get_finished_spans()
    assert tool.name == "execute_tool t"
    assert tool.instrumentation_scope is not None
    assert tool.instrumentation_scope.name == "loopwright-otel"
    assert (tool.end_time or 0) - (tool.start_time or 0) == 250_000_000
    assert tool.status.description == "took too long"
    assert segment.name == "invoke_agent"
    assert dict(segment.attributes or {})["loopwright.incomplete"] is True


def test_importing_loopwright_or_the_plugin_does_not_import_opentelemetry() -> None:
    """import loopwright, and loading the plugin module through its entry point, leave OpenTelemetry unloaded."""
    code = ("import sys, loopwright, loopwright_otel; "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

"""The ``otel`` record sink: records in, OpenTelemetry spans and metrics out.

Why records and not the observer hooks: a record says when a step ended (``at``) and the
``turn`` and ``tool_call`` records say how long it took (``latency``, ``duration``), so each span
gets its real start and end even though records reach the sink after the fact, in batches. The
observer hooks fire at the right moments but know nothing of tool calls' timing, hook decisions,
approvals or errors. The one thing records lack, the agent's name, model and spawner, comes from
``loopwright_on_state_change`` (see :mod:`loopwright_otel`), which runs before the state record
that opens a segment reaches the sink.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections import OrderedDict
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from loopwright.abc import RecordSink
from loopwright.errors import ConfigError
from loopwright_otel import LIVE_SINKS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, SpanContext, TracerProvider

    from loopwright import InstanceInfo, Record

__all__ = ["OtelSink"]

log = logging.getLogger("loopwright.otel")

_SCOPE = "loopwright-otel"
_VERSION = "0.1.0"
_OPTIONS = frozenset({"serviceName", "endpoint", "headers", "console", "metrics", "useGlobal"})
#: What ``console`` may name besides true and false.
_CONSOLE_STREAMS = ("stderr", "stdout")
#: Resting states: the state record that names one ends the segment's span.
_RESTING = frozenset({"waiting", "waiting_for_approval", "stopped", "error"})
#: Tool-result statuses that mean the call failed (span status ERROR). ``denied``, ``blocked`` and
#: ``skipped`` are decisions of a person, a hook or a limit, not failures of the tool.
_FAILED = frozenset({"invalid_arguments", "unknown_tool", "tool_error", "tool_failed", "timeout",
                     "unknown_outcome"})
#: How many instances' facts and last segment spans a sink remembers.
_REMEMBER = 4096
#: How many records of children a sink holds back for one spawner whose segment it has not seen yet.
_HOLD = 10_000
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
#: Record data keys with a GenAI semantic-convention name.
_SEMCONV_KEYS: Mapping[str, str] = {"toolCallId": "gen_ai.tool.call.id", "tool": "gen_ai.tool.name"}


def _ns(at: str) -> int:
    """Return an ISO 8601 timestamp (``2026-11-30T02:17:55.307Z``) as nanoseconds since the epoch."""
    return int(datetime.fromisoformat(at).timestamp() * 1_000_000) * 1000


def _split(ref: str | None) -> tuple[str | None, str | None]:
    if not ref:
        return None, None
    provider, sep, model = ref.partition(":")
    return (provider, model) if sep else (None, ref)


def _attr_value(value: Any) -> Any:
    """Return a value OpenTelemetry accepts as an attribute: scalars as they are, the rest as JSON."""
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    return json.dumps(value, default=str, ensure_ascii=False)


def _event_attributes(data: Mapping[str, Any]) -> dict[str, Any]:
    """Turn a record's data into event attributes: ``loopwright.snake_key`` (or a GenAI name)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if value is None:
            continue
        name = _SEMCONV_KEYS.get(key) or "loopwright." + _CAMEL.sub("_", key).lower()
        out[name] = _attr_value(value)
    return out


def _usage_attributes(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    if not usage:
        return {}
    out: dict[str, Any] = {}
    for key, name in (("inputTokens", "gen_ai.usage.input_tokens"), ("outputTokens", "gen_ai.usage.output_tokens"),
                      ("cacheReadTokens", "gen_ai.usage.cache_read.input_tokens"),
                      ("cacheWriteTokens", "gen_ai.usage.cache_creation.input_tokens"),
                      ("reasoningTokens", "loopwright.usage.reasoning_tokens")):
        value = usage.get(key)
        if isinstance(value, int):
            out[name] = value
    return out


class _Segment:
    """The open span of one instance's run segment, and what it has added up so far."""

    __slots__ = ("cost", "end", "error", "input_tokens", "output_tokens", "span", "start", "tool_calls", "turns")

    def __init__(self, span: Span, start: int) -> None:
        self.span = span
        #: When the segment started, and the latest end of a span inside it (nanoseconds). Records
        #: carry ``at`` to the millisecond (cut, not rounded), so a child span computed from a later
        #: record's ``at`` minus its duration can start up to 1 ms before its segment: it is moved
        #: to the segment's start, and the segment ends no earlier than its last child.
        self.start = start
        self.end = start
        self.turns = 0
        self.tool_calls = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost: float | None = 0.0
        self.error: str | None = None


class OtelSink(RecordSink):
    """Turns records into OpenTelemetry spans (and metrics).

    :param options: The sink's YAML mapping without ``kind``: ``serviceName``, ``endpoint``,
        ``headers``, ``console``, ``metrics``, ``useGlobal`` (see ``docs/otel.md``).
    :param tracer_provider: A provider to use instead of the global or a built one (for hosts
        that build sinks in Python).
    :param meter_provider: Likewise for metrics.
    :raises ConfigError: On an unknown option, a wrongly typed one, or ``endpoint`` without the
        OTLP exporter installed.
    """

    def __init__(self, options: Mapping[str, Any], *, tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None) -> None:
        self._check(options)
        self._owned: list[Any] = []  # providers this sink built, shut down by aclose()
        self._flush: Any = None
        tracer_provider, meter_provider = self._providers(options, tracer_provider, meter_provider)
        self._tracer = tracer_provider.get_tracer(_SCOPE, _VERSION)
        self._segments: dict[str, _Segment] = {}
        self._last: OrderedDict[str, SpanContext] = OrderedDict()
        self._facts: OrderedDict[str, InstanceInfo] = OrderedDict()
        self._held: dict[str, str] = {}  # child instance -> the spawner whose segment it waits for
        self._waiting: dict[str, list[Record]] = {}  # spawner -> its children's records, in order
        self._metrics = meter_provider is not None and options.get("metrics", True)
        if self._metrics and meter_provider is not None:
            meter = meter_provider.get_meter(_SCOPE, _VERSION)
            self._tokens = meter.create_histogram(
                "gen_ai.client.token.usage", unit="{token}", description="Tokens used per model call.")
            self._duration = meter.create_histogram(
                "gen_ai.client.operation.duration", unit="s", description="Duration of model calls.")
            self._cost = meter.create_counter(
                "loopwright.cost", unit="USD", description="Cost of model calls whose price is known.")
            self._tool_duration = meter.create_histogram(
                "loopwright.tool.duration", unit="s", description="Duration of tool calls.")
        LIVE_SINKS.add(self)

    # ------------------------------------------------------------------ configuration

    @staticmethod
    def _check(options: Mapping[str, Any]) -> None:
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise ConfigError(f"record sink otel: unknown option {unknown[0]!r}; "
                              f"known: {', '.join(sorted(_OPTIONS))}")
        for key in ("serviceName", "endpoint"):
            if key in options and not isinstance(options[key], str):
                raise ConfigError(f"record sink otel: {key} must be a string")
        for key in ("metrics", "useGlobal"):
            if key in options and not isinstance(options[key], bool):
                raise ConfigError(f"record sink otel: {key} must be true or false")
        if "console" in options and not (isinstance(options["console"], bool)
                                         or options["console"] in _CONSOLE_STREAMS):
            raise ConfigError("record sink otel: console must be true (standard error), false, "
                              "'stderr' or 'stdout'")
        headers = options.get("headers")
        if headers is not None and not (isinstance(headers, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
            raise ConfigError("record sink otel: headers must map names to strings")

    def _providers(self, options: Mapping[str, Any], tracer_provider: TracerProvider | None,
                   meter_provider: MeterProvider | None) -> tuple[TracerProvider, MeterProvider | None]:
        """Return the providers: given ones, else the host's global ones, else built here."""
        if tracer_provider is not None:
            return tracer_provider, meter_provider
        host = trace.get_tracer_provider()
        if options.get("useGlobal", True) and not isinstance(host, trace.ProxyTracerProvider):
            if "endpoint" in options or options.get("console"):
                log.warning("record sink otel: the host configured a TracerProvider; "
                            "endpoint and console are ignored (set useGlobal: false to build one)")
            self._flush = getattr(host, "force_flush", None)
            return host, meter_provider or metrics.get_meter_provider()
        return self._build(options)

    def _build(self, options: Mapping[str, Any]) -> tuple[TracerProvider, MeterProvider | None]:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415 - only when building
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )

        resource = Resource.create({"service.name": options.get("serviceName", "loopwright")})
        provider = SdkTracerProvider(resource=resource)
        self._owned.append(provider)
        meter_provider: MeterProvider | None = None
        endpoint = options.get("endpoint")
        if endpoint is not None:
            try:
                # The otlp extra: not installed by default (mypy may not find it either).
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
                    OTLPMetricExporter,
                )
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
                    OTLPSpanExporter,
                )
            except ImportError:
                raise ConfigError('record sink otel: endpoint needs the OTLP exporter: '
                                  'pip install "loopwright-otel[otlp]"') from None
            from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider  # noqa: PLC0415
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: PLC0415

            headers = options.get("headers")
            provider.add_span_processor(BatchSpanProcessor(
                OTLPSpanExporter(endpoint=_signal_url(endpoint, "traces"), headers=headers)))
            if options.get("metrics", True):
                reader = PeriodicExportingMetricReader(
                    OTLPMetricExporter(endpoint=_signal_url(endpoint, "metrics"), headers=headers))
                meter_provider = SdkMeterProvider(resource=resource, metric_readers=[reader])
                self._owned.append(meter_provider)
        if options.get("console"):
            # Standard error unless asked: spans never mix into an answer piped from stdout
            # (``run > answer.txt``). The stream as it is now: the exporter's default is the one at its import.
            out = sys.stdout if options["console"] == "stdout" else sys.stderr
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out)))
        if endpoint is None and not options.get("console"):
            log.warning("record sink otel: no TracerProvider configured by the host, and neither "
                        "endpoint nor console given: spans go nowhere")
        return provider, meter_provider

    # ------------------------------------------------------------------ the sink

    def note_instance(self, info: InstanceInfo) -> None:
        """Remember an instance's name, model and spawner, for the span of its next segment."""
        self._facts[info.instance_id] = info
        self._facts.move_to_end(info.instance_id)
        if len(self._facts) > _REMEMBER:
            self._facts.popitem(last=False)

    async def write(self, record: Record) -> None:
        """Turn one record into a span, an event or an attribute of the segment's span."""
        if not self._hold(record):
            self._dispatch(record)

    def _hold(self, record: Record) -> bool:
        """Hold back a child's records until its spawner's segment span is open; say whether it did.

        A child runs while its spawner's tool call is in progress, so the child's records can reach
        the sink before the spawner's first records (each instance's records are flushed with its
        own saves). The spawner is running in this process when the sink knows its facts and has
        not opened its span yet; its ``running`` state record is then on its way.
        """
        iid = record.instance_id
        spawner = self._held.get(iid)
        if spawner is None:
            if record.kind != "state" or record.data.get("to") != "running" or iid in self._segments:
                return False
            info = self._facts.get(iid)
            spawner = info.spawner_instance_id if info is not None else None
            if not spawner or spawner in self._segments or spawner not in self._facts:
                return False
            self._held[iid] = spawner
        waiting = self._waiting.setdefault(spawner, [])
        waiting.append(record)
        if len(waiting) >= _HOLD:
            self._facts.pop(spawner, None)  # waited long enough: its children become roots
            self._release(spawner)
        return True

    def _release(self, spawner: str) -> None:
        """Write the records held back for ``spawner``'s children, in the order they came."""
        held = self._waiting.pop(spawner, [])
        for record in held:
            self._held.pop(record.instance_id, None)
        for record in held:
            if not self._hold(record):
                self._dispatch(record)

    def _dispatch(self, record: Record) -> None:
        kind = record.kind
        if kind == "state":
            self._state(record)
        elif kind == "turn":
            self._turn(record)
        elif kind == "tool_call":
            self._tool_call(record)
        else:
            self._event(record)

    async def aclose(self) -> None:
        """End the spans still open (marked ``loopwright.incomplete``), then flush or shut down."""
        LIVE_SINKS.discard(self)
        for spawner in list(self._waiting):
            self._facts.pop(spawner, None)  # its span will not come now: children become roots
            self._release(spawner)
        for iid in list(self._segments):
            segment = self._segments.pop(iid)
            segment.span.set_attributes({"loopwright.incomplete": True})
            segment.span.end()
        if self._flush is not None:
            self._flush()
        for provider in self._owned:
            provider.shutdown()
        self._owned = []

    # ------------------------------------------------------------------ segments

    def _open(self, iid: str, start: int) -> _Segment:
        info = self._facts.pop(iid, None)
        name = info.name if info is not None else None
        provider, model = _split(info.model if info is not None else None)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": iid, "gen_ai.conversation.id": iid,
            "loopwright.instance_id": iid}
        if name:
            attributes["gen_ai.agent.name"] = name
        if model:
            attributes["gen_ai.request.model"] = model
        if provider:
            attributes["gen_ai.provider.name"] = provider
        links: list[Link] = []
        previous = self._last.get(iid)
        if previous is not None:
            links.append(Link(previous, {"loopwright.link": "previous_segment"}))
        context = None
        if info is not None:
            attributes["loopwright.depth"] = info.depth
            spawner = info.spawner_instance_id
            if spawner:
                attributes["loopwright.spawner_instance_id"] = spawner
                parent = self._segments.get(spawner)
                if parent is not None:
                    context = trace.set_span_in_context(parent.span)
                elif spawner in self._last:
                    links.append(Link(self._last[spawner], {"loopwright.link": "spawner"}))
        span = self._tracer.start_span(
            f"invoke_agent {name}" if name else "invoke_agent", context=context, kind=SpanKind.INTERNAL,
            attributes=attributes, links=links, start_time=start)
        segment = self._segments[iid] = _Segment(span, start)
        if iid in self._waiting:
            self._release(iid)
        return segment

    def _segment(self, iid: str, start: int) -> _Segment:
        """Return the instance's open segment, opening one (from ``start``) if none is open.

        Records without a ``running`` state record before them come from an instance resumed in
        this process after another one ran it.
        """
        return self._segments.get(iid) or self._open(iid, start)

    def _state(self, record: Record) -> None:
        data = record.data
        to = data.get("to")
        at = _ns(record.at)
        iid = record.instance_id
        if to == "running":
            if iid not in self._segments:
                self._open(iid, at)
            return
        if to not in _RESTING:
            return
        segment = self._segments.pop(iid, None)
        if segment is None:
            return
        span = segment.span
        span.set_attribute("loopwright.state", str(to))
        for key, name in (("stopReason", "loopwright.stop_reason"), ("limit", "loopwright.limit")):
            if data.get(key) is not None:
                span.set_attribute(name, str(data[key]))
        span.set_attribute("loopwright.turns", segment.turns)
        span.set_attribute("loopwright.tool_calls", segment.tool_calls)
        span.set_attribute("gen_ai.usage.input_tokens", segment.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", segment.output_tokens)
        if segment.cost is not None and segment.turns:
            span.set_attribute("loopwright.cost", segment.cost)
        if to == "error":
            message = str(data.get("error") or segment.error or "error")
            span.set_attribute("error.type", str(data.get("stopReason") or "error"))
            span.set_status(Status(StatusCode.ERROR, message))
        span.end(end_time=max(at, segment.end))
        self._last[iid] = span.get_span_context()
        self._last.move_to_end(iid)
        if len(self._last) > _REMEMBER:
            self._last.popitem(last=False)

    # ------------------------------------------------------------------ model and tool calls

    def _turn(self, record: Record) -> None:
        data = record.data
        end = _ns(record.at)
        latency = data.get("latency")
        start = end - int(float(latency) * 1e9) if isinstance(latency, int | float) else end
        segment = self._segment(record.instance_id, start)
        start = max(start, segment.start)
        segment.end = max(segment.end, end)
        provider, model = _split(data.get("model"))
        usage = data.get("usage") or {}
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat", "gen_ai.conversation.id": record.instance_id,
            **_usage_attributes(usage)}
        if model:
            attributes["gen_ai.request.model"] = model
            attributes["gen_ai.response.model"] = model
        if provider:
            attributes["gen_ai.provider.name"] = provider
        if data.get("finishReason"):
            attributes["gen_ai.response.finish_reasons"] = (str(data["finishReason"]),)
        for key, name in (("turn", "loopwright.turn"), ("toolCalls", "loopwright.tool_calls"),
                          ("cost", "loopwright.cost")):
            if data.get(key) is not None:
                attributes[name] = data[key]
        span = self._tracer.start_span(
            f"chat {model}" if model else "chat", context=trace.set_span_in_context(segment.span),
            kind=SpanKind.CLIENT, attributes=attributes, start_time=start)
        span.end(end_time=end)
        segment.turns += 1
        segment.input_tokens += int(usage.get("inputTokens") or 0)
        segment.output_tokens += int(usage.get("outputTokens") or 0)
        cost = data.get("cost")
        segment.cost = None if segment.cost is None or cost is None else segment.cost + float(cost)
        if self._metrics:
            self._measure_turn(attributes, usage, latency, cost)

    def _measure_turn(self, attributes: Mapping[str, Any], usage: Mapping[str, Any], latency: Any, cost: Any) -> None:
        common = {k: v for k, v in attributes.items() if k in (
            "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model")}
        for key, kind in (("inputTokens", "input"), ("outputTokens", "output")):
            if isinstance(usage.get(key), int):
                self._tokens.record(usage[key], {**common, "gen_ai.token.type": kind})
        if isinstance(latency, int | float):
            self._duration.record(float(latency), common)
        if cost is not None:
            self._cost.add(float(cost), common)

    def _tool_call(self, record: Record) -> None:
        data = record.data
        end = _ns(record.at)
        duration = data.get("duration")
        start = end - int(float(duration) * 1e9) if isinstance(duration, int | float) else end
        segment = self._segment(record.instance_id, start)
        start = max(start, segment.start)
        segment.end = max(segment.end, end)
        tool = str(data.get("tool") or "")
        status = str(data.get("status") or "")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "gen_ai.tool.type": "function",
            "gen_ai.conversation.id": record.instance_id, "loopwright.tool.status": status,
            **_usage_attributes(data.get("usage"))}
        if data.get("toolCallId"):
            attributes["gen_ai.tool.call.id"] = str(data["toolCallId"])
        for key, name in (("turn", "loopwright.turn"), ("cost", "loopwright.cost"),
                          ("injected", "loopwright.tool.injected"), ("answered", "loopwright.tool.answered")):
            if data.get(key) is not None:
                attributes[name] = data[key]
        if status in _FAILED:
            attributes["error.type"] = status
        span = self._tracer.start_span(
            f"execute_tool {tool}", context=trace.set_span_in_context(segment.span), kind=SpanKind.INTERNAL,
            attributes=attributes, start_time=start)
        if status in _FAILED:
            span.set_status(Status(StatusCode.ERROR, str(data.get("error") or status)[:1000]))
        span.end(end_time=end)
        segment.tool_calls += 1
        if self._metrics and isinstance(duration, int | float):
            self._tool_duration.record(float(duration), {"gen_ai.tool.name": tool, "loopwright.tool.status": status})

    # ------------------------------------------------------------------ everything else: events

    def _event(self, record: Record) -> None:
        """Add the record as an event ``loopwright.KIND`` of the open segment's span.

        Records of an instance with no open segment (written between segments) are dropped.
        """
        segment = self._segments.get(record.instance_id)
        if segment is None:
            return
        data = record.data
        if record.kind == "error" and data.get("message"):
            segment.error = str(data["message"])
        segment.span.add_event(f"loopwright.{record.kind}", _event_attributes(data), timestamp=_ns(record.at))


def _signal_url(endpoint: str, signal: str) -> str:
    """Return the URL of one signal: the base ``endpoint`` with ``/v1/SIGNAL`` appended.

    As ``OTEL_EXPORTER_OTLP_ENDPOINT`` is read: ``http://collector:4318`` gives
    ``http://collector:4318/v1/traces``, and a base path is kept (``.../otlp/v1/traces``).
    """
    return endpoint.rstrip("/") + f"/v1/{signal}"

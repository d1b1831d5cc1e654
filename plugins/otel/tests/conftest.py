"""Fixtures: every async test runs under asyncio and trio; spans and metrics go to memory.

The host's global TracerProvider and MeterProvider are set once for the session (OpenTelemetry
allows setting them only once), each with an in-memory reader; ``spans`` clears the exporter
before each test.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()
_READER = InMemoryMetricReader()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each ``@pytest.mark.anyio`` test once per anyio backend."""
    return str(request.param)


@pytest.fixture(scope="session")
def host_providers() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """Set the global providers once, as a host that configured OpenTelemetry would."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))
    return _EXPORTER, _READER


@pytest.fixture
def spans(host_providers: Any) -> InMemorySpanExporter:
    """Return the session's in-memory span exporter, emptied."""
    exporter: InMemorySpanExporter = host_providers[0]
    exporter.clear()
    return exporter


@pytest.fixture
def metric_reader(host_providers: Any) -> InMemoryMetricReader:
    """Return the session's in-memory metric reader (cumulative: compare before and after)."""
    reader: InMemoryMetricReader = host_providers[1]
    return reader

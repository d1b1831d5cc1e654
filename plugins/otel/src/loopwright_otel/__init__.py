"""OpenTelemetry traces and metrics of loopwright runs (record sink kind ``otel``).

Configure it in the assembly::

    records:
      - kind: otel
        serviceName: triage-agents          # used when the sink builds its own TracerProvider
        endpoint: http://collector:4318     # OTLP/HTTP; needs the ``otlp`` extra

Each run segment becomes an ``invoke_agent NAME`` span, with a ``chat MODEL`` child span per
model call and an ``execute_tool TOOL`` child span per tool call; approvals, messages,
compactions, hook decisions and errors are span events. Spans follow the OpenTelemetry GenAI
semantic conventions where they apply. See ``docs/otel.md``.

The spans are rebuilt from the records, which carry when each step ended and how long it took.
The records do not carry the agent's name, model or spawner, so this plugin also implements
:func:`loopwright_on_state_change`, which hands them to the live sinks before the state record
that opens a segment is written.

Importing this module does not import OpenTelemetry; the sink does, when an assembly asks for it.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from loopwright import hookimpl

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from loopwright import InstanceInfo
    from loopwright_otel._sink import OtelSink

__all__ = ["OtelSink", "loopwright_on_state_change", "loopwright_register_record_sinks"]

#: The open sinks of this process. ``loopwright_on_state_change`` tells each of them about an
#: instance that starts running, so the sink can name its span and find its spawner's span.
LIVE_SINKS: weakref.WeakSet[OtelSink] = weakref.WeakSet()


def _make_sink(options: Mapping[str, Any]) -> OtelSink:
    from loopwright_otel._sink import OtelSink  # noqa: PLC0415 - OpenTelemetry only when configured

    return OtelSink(options)


@hookimpl
def loopwright_register_record_sinks(register: Callable[..., None]) -> None:
    """Register the ``otel`` record sink."""
    register("otel", _make_sink)


@hookimpl
def loopwright_on_state_change(instance: InstanceInfo, new: str) -> None:
    """Tell the live sinks the name, model and spawner of an instance that starts running."""
    if LIVE_SINKS and new == "running":
        for sink in list(LIVE_SINKS):
            sink.note_instance(instance)


def __getattr__(name: str) -> Any:
    if name == "OtelSink":
        from loopwright_otel._sink import OtelSink  # noqa: PLC0415

        return OtelSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

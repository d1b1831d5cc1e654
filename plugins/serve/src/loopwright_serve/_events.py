"""Server-Sent Events of one instance, read from the store: resumable, whoever runs the instance.

An instance's entry log (its transcript) and its record log are append-only in every store,
so a position in the pair is a durable cursor: event ids are ``RECORDS-ENTRIES``, the number of
records and entries read when the event was sent. A client that reconnects with
``Last-Event-ID`` gets every event after that point, whether the instance ran in this server,
in a ``loopwright run`` or in a ``loopwright worker`` on another machine. The logs are read
again every :data:`POLL` seconds while the stream is open, and at once when the runtime says
they grew (:mod:`._notify`, for instances running in this server).

An instance running in this server also streams its provider's deltas live
(:mod:`._deltas`): ``text_delta`` (``{"turn", "delta"}``), ``tool_call_start`` (``{"turn",
"id", "name"}``), ``tool_call_delta`` (``{"turn", "id", "delta"}``: a piece of the call's JSON
arguments), ``stream_reset`` (``{"turn"}``: the turn's streamed answer starts over) and ``gap``
(``{"turn"}``: this slow client missed the rest of the turn's deltas). These carry no ``id:``
line: they are not durable, and a client that reconnects does not get them again; the durable
``transcript`` event that follows carries the whole message.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import attrs
from starlette.responses import StreamingResponse

from loopwright.errors import InstanceNotFoundError
from loopwright_serve._problems import ProblemError

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from loopwright_serve._context import ServeContext
    from loopwright_serve._deltas import LiveEvent, Subscription
    from loopwright_serve._notify import Waiter, Wakeups

__all__ = ["HEARTBEAT", "LIVE_EVENTS", "POLL", "Cursor", "event_stream", "parse_event_id"]

#: Seconds between two reads of the logs of an instance that runs elsewhere.
POLL = 0.2
#: Seconds between two reads of the logs of an instance that runs here (its writes wake the stream).
POLL_WOKEN = 2.0
#: Seconds between two keep-alive comments on an idle stream (so that proxies keep it open).
HEARTBEAT = 15.0

#: The live events the stream sends (without ``id:``), as the engine names them.
LIVE_EVENTS = frozenset({"text_delta", "tool_call_start", "tool_call_delta", "stream_reset", "gap"})

_EVENT_ID = re.compile(r"(\d{1,12})-(\d{1,12})")


@attrs.frozen
class Cursor:
    """A place in an instance's two logs: how many records and entries were sent."""

    records: int = 0
    entries: int = 0

    def __str__(self) -> str:
        return f"{self.records}-{self.entries}"


def parse_event_id(text: str | None) -> Cursor:
    """Read a ``Last-Event-ID`` (``RECORDS-ENTRIES``); ``None`` or empty is the start.

    :raises ProblemError: 400 for anything else.
    """
    if not text:
        return Cursor()
    match = _EVENT_ID.fullmatch(text.strip())
    if match is None:
        raise ProblemError(400, "Bad event id", f"Last-Event-ID must be RECORDS-ENTRIES (as sent), not {text[:80]!r}")
    return Cursor(int(match.group(1)), int(match.group(2)))


def _frame(event: str, cursor: Cursor, data: Any) -> bytes:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return f"id: {cursor}\nevent: {event}\ndata: {body}\n\n".encode()


def _live_frame(event: LiveEvent) -> bytes:
    body = json.dumps(event.json(), ensure_ascii=False, separators=(",", ":"), default=str)
    return f"event: {event.kind}\ndata: {body}\n\n".encode()


def event_stream(ctx: ServeContext, instance_id: str, cursor: Cursor, wakeups: Wakeups) -> StreamingResponse:
    """Return the SSE response following ``instance_id`` from ``cursor`` until the client leaves.

    Events: ``transcript`` (``{"index", "message", "turn"?}``, one per message of the entry log)
    and ``record`` (a record as ``loopwright records`` prints it), with ids; and, while the
    instance runs in this server, the live events of :data:`LIVE_EVENTS` (``text_delta`` is
    ``{"turn", "delta"}``), without ids (see the module's docstring). Counted against
    ``server.maxEventStreams``; ends when the server shuts down.

    :raises ProblemError: 503 when the most streams are open.
    """
    ctx.streams.enter()
    return _EventResponse(ctx, _follow(ctx, instance_id, cursor, wakeups), media_type="text/event-stream", headers={
        "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _EventResponse(StreamingResponse):
    """A streaming response that gives its place in the stream bound back however it ends."""

    def __init__(self, ctx: ServeContext, content: AsyncIterator[bytes], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.gate = ctx.streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.gate.leave()


async def _follow(ctx: ServeContext, instance_id: str, cursor: Cursor, wakeups: Wakeups) -> AsyncIterator[bytes]:
    waiter = wakeups.add(instance_id)
    try:
        with ctx.live.following(instance_id) as live:
            async for chunk in _read(ctx, instance_id, cursor, waiter, live):
                yield chunk
    finally:
        wakeups.remove(instance_id, waiter)


async def _read(ctx: ServeContext, instance_id: str, cursor: Cursor, waiter: Waiter,
                live: Subscription) -> AsyncIterator[bytes]:
    store = ctx.runtime.store
    closing = ctx.streams.closing
    yield b"retry: 1000\n\n"
    idle = 0.0
    entries: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    while not closing.is_set():
        # Deltas first: they come before the message that ends their turn is saved.
        sent = False
        for event in live.drain():
            if event.kind in LIVE_EVENTS:
                sent = True
                yield _live_frame(event)
        # Woken by this runtime: read only the log that grew; polled: both.
        read_entries, read_records = waiter.entries, waiter.records
        waiter.rearm()
        try:
            if read_entries:
                entries = await store.read_entries(instance_id)
            if read_records:
                records = await store.read_records(instance_id)
        except InstanceNotFoundError:
            return
        frames, cursor = _frames(entries, records, cursor)
        for frame in frames:
            yield frame
        waited = await _wait(waiter, live, closing)
        idle = 0.0 if frames or sent else idle + waited
        if idle >= HEARTBEAT:
            idle = 0.0
            yield b": keep-alive\n\n"


def _frames(entries: list[dict[str, Any]], records: list[dict[str, Any]], cursor: Cursor) -> tuple[list[bytes], Cursor]:
    """Return the events for what the logs hold past ``cursor``, and the cursor after them."""
    frames: list[bytes] = []
    for index in range(cursor.entries, len(entries)):
        entry = entries[index]
        cursor = attrs.evolve(cursor, entries=index + 1)
        if entry.get("t") == "msg":
            data: dict[str, Any] = {"index": index, "message": entry.get("m")}
            if "turn" in entry:
                data["turn"] = entry["turn"]
            frames.append(_frame("transcript", cursor, data))
    for index in range(cursor.records, len(records)):
        cursor = attrs.evolve(cursor, records=index + 1)
        frames.append(_frame("record", cursor, records[index]))
    return frames, cursor


async def _wait(waiter: Waiter, live: Subscription, closing: anyio.Event) -> float:
    """Wait until the logs grew here, a live event came, the poll interval passed, or the server closes.

    :return: The seconds waited.
    """
    if (live.ready and not live.closed) or waiter.event.is_set():  # came while the last were sent: no task group
        return 0.0
    started = anyio.current_time()
    with anyio.move_on_after(POLL_WOKEN if waiter.woken else POLL) as timer:
        async with anyio.create_task_group() as tg:
            async def until(wait: Any) -> None:
                await wait()
                tg.cancel_scope.cancel()

            tg.start_soon(until, closing.wait)
            tg.start_soon(until, live.wait)
            await waiter.event.wait()
            tg.cancel_scope.cancel()
    if timer.cancelled_caught:  # nobody said what grew: read both
        waiter.entries = waiter.records = True
    return anyio.current_time() - started

"""What the protocol surfaces (AG-UI, A2A) follow of a segment: bounded live deltas, and messages as they land.

A surface used to follow :meth:`loopwright.AgentRun.events`, whose queue per follower has no
bound: a client that reads slowly (or not at all) held every delta the model streamed until it
read them (issue 27). :func:`follow_segment` reads two bounded sources instead:

- the live channel (:mod:`._deltas`): the provider's deltas (``text_delta``, ``tool_call_start``,
  ``tool_call_delta``), ``stream_reset`` and ``gap``, within the subscription's bounds;
- the entry log, from a cursor: each message saved since the action that began the segment
  becomes the events the engine would have given: an assistant message is ``text`` (its
  content) and one ``tool_call`` per call (``id``, ``name``, ``arguments``, ``wireId``: the id the
  model gave it), a tool message is ``tool_result`` (``id``, ``name``, ``status``, ``content``).
  The log is read when the subscription says a message was saved (``landed``), every
  :data:`POLL` seconds, and once more after the segment ended.

A follower that reads nothing therefore holds the subscription's bounds and a cursor, however
long the run. The two sources are merged in the order they happened: the deltas of a turn come
before the messages of that turn, and after those of the turn before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from loopwright.errors import InstanceNotFoundError
from loopwright_serve._deltas import LiveEvent

if TYPE_CHECKING:
    from loopwright import AgentRun
    from loopwright_serve._deltas import Subscription

__all__ = ["POLL", "Cursor", "follow_segment", "landed_events", "turn_of"]

#: Seconds between two reads of the entry log while nothing says it grew (a guard: saves wake the feed).
POLL = 1.0


def turn_of(entry: Mapping[str, Any]) -> int | None:
    """Return the turn number an entry carries (a model answer's ``turn.n``), if any."""
    turn = entry.get("turn")
    number = turn.get("n") if isinstance(turn, Mapping) else None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def landed_events(message: Mapping[str, Any], turn: int | None) -> list[LiveEvent]:
    """Return the events a saved message stands for (see the module's docstring); none for other roles."""
    role = message.get("role")
    if role == "assistant":
        out = [LiveEvent(kind="text", turn=turn, data={"text": message["content"]})] if message.get("content") else []
        out.extend(LiveEvent(kind="tool_call", turn=turn, data={
            "id": call.get("id"), "name": call.get("name"), "arguments": call.get("arguments") or {},
            "wireId": call.get("wireId")}) for call in message.get("toolCalls") or () if isinstance(call, Mapping))
        return out
    if role == "tool":
        return [LiveEvent(kind="tool_result", turn=turn, data={
            "id": message.get("toolCallId"), "name": message.get("name"), "status": message.get("status"),
            "content": message.get("content")})]
    return []


class Cursor:
    """A place in an instance's entry log, and the turn of the last model answer before it.

    Attributes:
        index: How many entries were read.
        turn: The turn of the last model answer read (the messages after it belong to it).
    """

    def __init__(self, index: int = 0, turn: int = 0) -> None:
        self.index = index
        self.turn = turn

    @classmethod
    def at_end(cls, entries: list[dict[str, Any]]) -> Cursor:
        """Return the cursor after ``entries``."""
        cursor = cls()
        cursor.read(entries)
        return cursor

    def read(self, entries: list[dict[str, Any]]) -> list[LiveEvent]:
        """Return the events of the messages past the cursor, and move it to the end of ``entries``."""
        out: list[LiveEvent] = []
        for entry in entries[self.index:]:
            if entry.get("t") != "msg" or not isinstance(entry.get("m"), Mapping):
                continue
            number = turn_of(entry)
            if number is not None:
                self.turn = number
            out.extend(landed_events(entry["m"], self.turn))
        self.index = max(self.index, len(entries))
        return out


def _merge(live: list[LiveEvent], landed: list[LiveEvent]) -> list[LiveEvent]:
    """Order one batch: by turn, a turn's live events before its messages (both kept in their order)."""
    keyed = [((e.turn or 0, 0), n, e) for n, e in enumerate(live)] + \
            [((e.turn or 0, 1), n, e) for n, e in enumerate(landed)]
    return [e for _key, _n, e in sorted(keyed, key=lambda k: (k[0], k[1]))]


async def follow_segment(run: AgentRun, live: Subscription, cursor: Cursor,
                         closing: anyio.Event) -> AsyncIterator[list[LiveEvent]]:
    """Yield batches of the segment's events until it ended (or ``closing`` is set), each batch in order.

    ``live`` must watch for saved messages (``LiveChannel.subscribe(..., landed=True)``) and have
    been made, like ``cursor`` (:meth:`Cursor.at_end` of the log), before the action that began the
    segment, so that nothing of it is missed. A segment that ended before the first batch (a fast
    model) is read whole from the log; an action that began none yields nothing but what the log
    gained.

    The log is read only when a message was saved (or every :data:`POLL` seconds, and at the
    end), always before the deltas are drained: every message read then has its deltas drained
    in the same batch or an earlier one. Deltas drained while another message was being saved
    are held back to the next batch, which reads that message first.
    """
    store = run.runtime.store
    first, timed_out = True, False
    carried: list[LiveEvent] = []
    carried_landed: list[LiveEvent] = []
    while True:
        ended = not run.running  # before the read: once ended, this read sees every message
        landed, carried_landed = carried_landed, []
        if first or ended or timed_out or live.landed:
            live.landed = False
            try:
                landed += cursor.read(await store.read_entries(run.instance_id))
            except InstanceNotFoundError:
                return
        first = False
        drained = [*carried, *live.drain()]
        if live.landed and not ended and len(carried) < live.max_events:
            carried, carried_landed = drained, landed  # a message was saved meanwhile: read it first
            continue
        carried = []
        batch = _merge(drained, landed)
        if batch:
            yield batch
        if ended or closing.is_set():
            return
        timed_out = False
        if not live.ready:
            timed_out = await _wait(run, live, closing)


async def _wait(run: AgentRun, live: Subscription, closing: anyio.Event) -> bool:
    """Wait for a live event, a saved message, the segment's end or ``closing``; return whether :data:`POLL` passed."""
    with anyio.move_on_after(POLL) as timer:
        async with anyio.create_task_group() as tg:
            async def until(wait: Any) -> None:
                await wait()
                tg.cancel_scope.cancel()

            tg.start_soon(until, closing.wait)
            tg.start_soon(until, run.wait)
            await live.wait()
            tg.cancel_scope.cancel()
    return timer.cancelled_caught

"""The live channel: a provider's stream deltas, fanned out to the server's followers as they arrive (issue 27).

The durable events of an instance (its messages and records) are read from the store
(:mod:`._events`); what a streaming provider sends while it answers never reaches the store.
:class:`LiveChannel` is a runtime plugin: its ``loopwright_on_stream_event`` hook receives, in
the engine's task, every event of every instance that runs in this server, and hands those of
:data:`LIVE_KINDS` to the :class:`Subscription` of each follower of that instance.

Handing over never blocks the engine, and a follower that reads slowly never makes memory grow
without bound. Each subscription holds at most ``max_events`` events and ``max_chars``
characters of deltas:

- past ``max_events``, a delta is *coalesced* into the last one held when that one is a delta of
  the same kind, turn and call (nothing is lost: the follower reads the two as one piece);
- past either bound otherwise, the rest of that turn's deltas are *dropped* for this follower, and
  it is given one ``gap`` event (``{"turn"}``) instead, so it knows the turn's text it shows is
  incomplete (the durable ``transcript`` event, or the run's result, carries the whole message).
  Deltas of the next turn are delivered again.

Live events are never replayed: a follower sees those published after it subscribed. A surface
that starts an instance chooses its id (:func:`loopwright_serve._steer.new_id`) and subscribes
before it starts it, so it misses none.

A subscription made with ``landed=True`` (the protocol surfaces' :mod:`._feed`) is also woken
when a message of its instance is saved (the ``loopwright_on_message`` hook): it holds no copy of
the message, only the flag :attr:`Subscription.landed`, and its follower reads the new messages
from the store. So a stalled follower holds at most the bounds above and one flag, however long
the run.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from loopwright import hookimpl

if TYPE_CHECKING:
    from loopwright import Event, InstanceInfo, Message

__all__ = ["DELTA_KINDS", "LIVE_KINDS", "LiveChannel", "LiveEvent", "Subscription"]

#: The deltas: pieces of text (``delta``) or of a tool call's JSON arguments (``id``, ``delta``).
DELTA_KINDS = frozenset({"text_delta", "tool_call_delta"})
#: The engine's events a subscription receives: the deltas, a tool call starting (``id``,
#: ``name``), a streamed answer starting over (``stream_reset``) and state changes (``state``,
#: ``stopReason``), which tell a follower the segment ended.
LIVE_KINDS = frozenset({*DELTA_KINDS, "tool_call_start", "stream_reset", "state"})
#: The most events a subscription holds before it coalesces deltas.
MAX_EVENTS = 512
#: The most characters of deltas a subscription holds before it drops the rest of a turn's.
MAX_CHARS = 1 << 20


@attrs.frozen(kw_only=True)
class LiveEvent:
    """One live event, as a subscription hands it over.

    Attributes:
        kind: One of :data:`LIVE_KINDS`, or ``gap`` (deltas of ``turn`` were dropped from here on).
        turn: The turn it belongs to.
        data: The kind's fields: ``delta`` (deltas), ``id`` (tool-call ones), ``name``
            (``tool_call_start``), ``state`` and ``stopReason`` (``state``).
    """

    kind: str
    turn: int | None
    data: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def delta(self) -> str:
        """The piece of text a delta carries (empty for other kinds)."""
        return str(self.data.get("delta") or "")

    def json(self) -> dict[str, Any]:
        """Return the event as the serve SSE stream sends it: ``{"turn", ...data}``."""
        return {"turn": self.turn, **self.data}


class Subscription:
    """One follower of one instance's live events: a bounded queue that never blocks the publisher.

    Attributes:
        instance_id: The instance followed.
        dropped: How many deltas were dropped for this follower (read slowly), in all.
        coalesced: How many deltas were merged into the one before them.
        closed: Whether :meth:`close` was called (no more events will come).
        landed: Whether a message of the instance was saved since the flag was last cleared
            (kept only by a subscription made with ``watch_landed``).
    """

    def __init__(self, instance_id: str, *, max_events: int = MAX_EVENTS, max_chars: int = MAX_CHARS,
                 watch_landed: bool = False) -> None:
        """Follow ``instance_id`` (use :meth:`LiveChannel.subscribe`, which registers it).

        :param watch_landed: Also wake :meth:`get` when a message is saved (:meth:`mark_landed`).
        """
        self.instance_id = instance_id
        self.watch_landed = watch_landed
        self.landed = False
        self.max_events = max_events
        self.max_chars = max_chars
        self.dropped = 0
        self.coalesced = 0
        self.closed = False
        self._pending: collections.deque[LiveEvent] = collections.deque()
        self._chars = 0
        self._lost_turn: int | None = None
        self._ready = anyio.Event()

    def push(self, event: LiveEvent) -> None:
        """Hold ``event`` for the follower, within the bounds (see the module's docstring); never blocks."""
        if self.closed:
            return
        kind = event.kind
        lost = self._lost_turn is not None and event.turn == self._lost_turn
        if kind in DELTA_KINDS or kind == "tool_call_start":
            if lost:
                self.dropped += 1
                return
            size = len(event.delta)
            if self._chars + size > self.max_chars:
                self._lose(event)
                return
            if len(self._pending) < self.max_events:
                self._pending.append(event)
            elif kind == "tool_call_start" or not self._coalesce(event):
                self._lose(event)
                return
            self._chars += size
        else:  # a state change or a reset: always held (a few per turn at most)
            if kind == "stream_reset" and lost:
                self._lost_turn = None  # the turn starts over: its new pieces come again
            self._pending.append(event)
        self._ready.set()

    def mark_landed(self) -> None:
        """Note that a message of the instance was saved, and wake a follower that watches for that."""
        if self.watch_landed and not self.closed:
            self.landed = True
            self._ready.set()

    def _coalesce(self, event: LiveEvent) -> bool:
        """Merge ``event`` into the last event held if it continues it; return whether it did."""
        last = self._pending[-1] if self._pending else None
        if last is None or last.kind != event.kind or last.turn != event.turn or \
                last.data.get("id") != event.data.get("id"):
            return False
        self._pending[-1] = attrs.evolve(last, data={**last.data, "delta": last.delta + event.delta})
        self.coalesced += 1
        return True

    def _lose(self, event: LiveEvent) -> None:
        """Drop the rest of ``event``'s turn for this follower, and tell it so once."""
        self.dropped += 1
        self._lost_turn = event.turn
        self._pending.append(LiveEvent(kind="gap", turn=event.turn))
        self._ready.set()

    def drain(self) -> list[LiveEvent]:
        """Return (and forget) every event held, oldest first."""
        out = list(self._pending)
        self._pending.clear()
        self._chars = 0
        if self._ready.is_set():
            self._ready = anyio.Event()
        return out

    async def get(self, at_most: float = float("inf")) -> list[LiveEvent]:
        """Wait until events are held, the subscription is closed, or ``at_most`` seconds pass; drain them.

        :return: The events held (empty after a timeout, or once closed and drained).
        """
        if not self.ready:  # else no cancel scope: the hot path when pieces come fast
            with anyio.move_on_after(at_most):
                await self._ready.wait()
        return self.drain()

    @property
    def ready(self) -> bool:
        """Whether :meth:`get` would return at once: events are held, a message landed (if watched), or closed."""
        return bool(self._pending) or self.closed or self.landed

    async def wait(self) -> None:
        """Return once :attr:`ready` (at once if so already)."""
        if not self.ready:
            await self._ready.wait()

    def close(self) -> None:
        """End the subscription: :meth:`get` returns at once from now on (what is held is still drained)."""
        self.closed = True
        self._ready.set()


class LiveChannel:
    """A runtime plugin: fans the live events of instances running here out to their subscriptions.

    Register it on the runtime (:meth:`loopwright.Runtime.register_plugin`) while the server runs;
    surfaces subscribe with :meth:`following`.
    """

    def __init__(self, *, max_events: int = MAX_EVENTS, max_chars: int = MAX_CHARS) -> None:
        """Make subscriptions bounded by ``max_events`` events and ``max_chars`` characters."""
        self.max_events = max_events
        self.max_chars = max_chars
        self._subscriptions: dict[str, set[Subscription]] = {}

    def subscribe(self, instance_id: str, *, landed: bool = False) -> Subscription:
        """Return a new subscription to ``instance_id``'s live events; end it with :meth:`unsubscribe`.

        :param landed: Also note (and wake the follower) when a message is saved (:attr:`Subscription.landed`).
        """
        sub = Subscription(instance_id, max_events=self.max_events, max_chars=self.max_chars, watch_landed=landed)
        self._subscriptions.setdefault(instance_id, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Forget a subscription (and close it)."""
        sub.close()
        subs = self._subscriptions.get(sub.instance_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subscriptions[sub.instance_id]

    @contextmanager
    def following(self, instance_id: str, *, landed: bool = False) -> Iterator[Subscription]:
        """Subscribe to ``instance_id`` for the block's length (``landed`` as :meth:`subscribe`)."""
        sub = self.subscribe(instance_id, landed=landed)
        try:
            yield sub
        finally:
            self.unsubscribe(sub)

    def followers(self, instance_id: str) -> int:
        """Return how many subscriptions follow ``instance_id``."""
        return len(self._subscriptions.get(instance_id, ()))

    def publish(self, instance_id: str, event: LiveEvent) -> None:
        """Hand ``event`` to every subscription of ``instance_id``."""
        for sub in self._subscriptions.get(instance_id, ()):
            sub.push(event)

    @hookimpl
    def loopwright_on_stream_event(self, event: Event) -> None:
        """Publish the engine's live events (:data:`LIVE_KINDS`) of followed instances."""
        if event.kind in LIVE_KINDS and event.instance_id in self._subscriptions:
            self.publish(event.instance_id, LiveEvent(kind=event.kind, turn=event.turn, data=dict(event.data)))

    @hookimpl
    def loopwright_on_message(self, message: Message, instance: InstanceInfo) -> None:  # noqa: ARG002 - the hook's shape
        """Tell the subscriptions that watch for it that a message of their instance was saved."""
        for sub in self._subscriptions.get(instance.instance_id, ()):
            sub.mark_landed()


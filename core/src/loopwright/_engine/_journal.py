"""Records, events, saving and observers: how the engine tells the store and the world what happened.

Hooks cost nothing when none is registered: each hook point first looks at the cached tuple of
implementations and skips all hook work, the :class:`InstanceInfo` included, when it is empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from loopwright._hooks import notify
from loopwright._instance import message_to_json, now_iso
from loopwright._types import Event, InstanceInfo, Message, State, StopReason

if TYPE_CHECKING:
    from loopwright._decisions import Decision
    from loopwright._engine._deps import EngineDeps, SegmentRun
    from loopwright._instance import Instance

__all__ = ["Journal"]


class Journal:
    """Writes an instance's entries, records and header, and gives events to followers and observers."""

    def __init__(self, deps: EngineDeps) -> None:
        """Write through ``deps`` (its store, record queue, header writer and hooks)."""
        self.deps = deps
        self.store = deps.store

    # ------------------------------------------------------------------ hook helpers

    def info(self, inst: Instance) -> InstanceInfo:
        """Return what hooks are told of ``inst`` (built once, at its first hook call)."""
        info = inst.info
        if info is None:
            info = inst.info = InstanceInfo(
                instance_id=inst.id, name=inst.definition.name, model=self.deps.model_ref(inst.definition),
                depth=int(inst.header.depth),
                spawner_instance_id=inst.header.spawner_instance_id)
        return info

    def _observer_error(self, inst: Instance) -> Any:
        def on_error(plugin: str, exc: BaseException) -> None:
            self.record(inst, "observer_error", {"plugin": plugin, "error": f"{type(exc).__name__}: {exc}"})
        return on_error

    async def observe(self, inst: Instance, hook: str, **values: Any) -> None:
        """Call the observer ``hook`` with ``values`` (and the instance); a failing observer is recorded."""
        impls = self.deps.hook_impls(inst.definition, hook)
        if impls:
            values.setdefault("instance", self.info(inst))
            await notify(impls, values, on_error=self._observer_error(inst))

    def hook_records(self, inst: Instance, hook: str, decisions: Sequence[tuple[str, Decision, str | None]],
                     turn: int) -> None:
        """Record each decision an interceptor hook made."""
        for plugin, decision, error in decisions:
            data: dict[str, Any] = {"hook": hook, "plugin": plugin, "decision": decision.kind, "turn": turn}
            reason = getattr(decision, "reason", None)
            if reason is not None:
                data["reason"] = reason
            if error is not None:
                data["error"] = error
            self.record(inst, "hook", data)

    # ------------------------------------------------------------------ records, events, saving

    def record(self, inst: Instance, kind: str, data: Mapping[str, Any]) -> None:
        """Queue a record for the instance's record log (written with the next save)."""
        self.deps.queue_record(inst.id, kind, data)

    async def emit(self, run: SegmentRun, kind: str, turn: int | None, **data: Any) -> None:
        """Give an event to the run's subscribers and the ``on_stream_event`` hook."""
        event = Event(kind=kind, instance_id=run.instance_id, turn=turn, data=data)
        run.publish(event)
        impls = self.deps.hook_impls(run.inst.definition, "loopwright_on_stream_event")
        if impls:
            await notify(impls, {"event": event, "instance": self.info(run.inst)},
                         on_error=self._observer_error(run.inst))

    async def save(self, inst: Instance, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append entries to the instance's log (records are flushed once a turn, and at state changes)."""
        if entries:
            await self.store.append_entries(inst.id, entries)

    async def add_message(self, run: SegmentRun, message: Message, *, save: bool = True,
                          marks: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Append a message to the transcript; return its entry (saved unless ``save=False``).

        :param marks: Extra keys of the entry (``task`` for the task prompt).
        """
        inst = run.inst
        inst.transcript.append(message)
        entry = {"t": "msg", "m": message_to_json(message), **(marks or {})}
        if save:
            await self.save(inst, [entry])
        await self.observe(inst, "loopwright_on_message", message=message)
        return entry

    async def set_state(self, run: SegmentRun, state: State, reason: StopReason | None = None, **extra: Any,
                        ) -> None:
        """Change the instance's state, save the header and tell observers.

        ``extra`` sets more header fields by name (``error=``, ``limit=``, ``cancelled=``, ``runner=``).
        """
        inst = run.inst
        h = inst.header
        old, stop = str(h.state), reason.value if reason else None  # observers are told the strings
        if old == state.value and h.stop_reason == reason and all(getattr(h, k) == v for k, v in extra.items()):
            # Nothing to save (a new instance is created "running"); followers still hear of it.
            await self.emit(run, "state", inst.turn, state=state.value, stopReason=stop)
            return
        h.state = state
        h.stop_reason = reason
        for k, v in extra.items():
            setattr(h, k, v)
        h.updated_at = now_iso()
        inst.totals_to_header()
        if state is not State.RUNNING:
            # What happened before the instance rests is on disk before the header says it rests: a
            # crash in between leaves it running, and the runner that resumes it repairs the rest.
            await self.deps.flush_records(inst.id)
        await self.deps.write_header(inst)
        self.record(inst, "state", {"from": old, "to": state.value, "stopReason": stop,
                                    **{k: v for k, v in extra.items() if v is not None}})
        await self.observe(inst, "loopwright_on_state_change", old=old, new=state.value,
                           stop_reason=stop)
        await self.deps.flush_records(inst.id)
        await self.emit(run, "state", inst.turn, state=state.value, stopReason=stop)

"""Monitors on agents: :class:`Monitors` (armed by ``monitor_agent``) and the ``contextAt`` grammar.

A monitor belongs to the instance that armed it and is saved in its header, so a runtime
that runs or loads the watcher watches it again after a restart. :class:`Monitors` reaches
the runtime only through :class:`~loopwright._hosts.AgentHost`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from loopwright._duration import is_finite_number
from loopwright._header import InstanceHeader
from loopwright._header_fields import HeaderFields
from loopwright._lease import held_lease
from loopwright._types import Event, State
from loopwright.errors import InstanceNotFoundError, ToolError

if TYPE_CHECKING:
    from loopwright._hosts import AgentHost
    from loopwright._instance import Instance
    from loopwright._run import AgentRun

__all__ = ["RESTING", "Monitors", "parse_context_at"]

#: The states in which an instance rests (no segment runs it).
RESTING = frozenset({State.WAITING.value, State.WAITING_FOR_APPROVAL.value, State.STOPPED.value,
                     State.ERROR.value})
#: How often the runtime checks the armed monitors, in seconds.
_CHECK_EVERY = 0.25


_TOKEN_UNITS = {"": 1, "k": 1_000, "m": 1_000_000}


def parse_context_at(value: Any, window: int | None) -> int:
    """Return the token count ``contextAt`` means: ``12000``, ``"400k"``, ``"1.5m"`` or ``"80%"`` of ``window``.

    :raises ToolError: For anything else, or a percentage when the window is not known.
    """
    if isinstance(value, bool):
        raise ToolError(f"contextAt must be a token count such as 400k, or a percentage, not {value!r}")
    if is_finite_number(value) and value > 0:
        return int(value)
    text = str(value).strip().lower()[:64]  # a model may send a megabyte here
    try:
        if text.endswith("%"):
            fraction = float(text[:-1]) / 100
            if not window:
                raise ToolError("contextAt as a percentage needs the agent's context window, which is not known "
                                "(set contextWindow in its contextStrategy); give a token count such as 400k")
            if not 0 < fraction <= 1:
                raise ValueError(text)  # noqa: TRY301 - reported below like any other bad value
            return int(fraction * window)
        unit = text[-1] if text and text[-1] in "km" else ""
        number = float(text[: len(text) - len(unit)])
    except ValueError:
        raise ToolError(f"contextAt must be a token count such as 400k, or a percentage, not {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ToolError(f"contextAt must be a positive, finite token count, not {text!r}")
    return int(number * _TOKEN_UNITS[unit])


class Monitors:
    """The runtime's monitors: armed by ``monitor_agent``, checked every quarter second, fired once.

    A monitor belongs to the instance that armed it (the watcher) and is saved in its header
    (``monitors``), so it survives a restart: a runtime watches the monitors of the watchers it
    runs or loads. When one of its conditions holds, the monitor is removed from the header and
    the watcher gets an alert: returned by its ``await_monitor`` if it is blocked there, else as
    a message from the ``runtime`` (which wakes a resting watcher). The watcher's run also
    publishes a ``monitor`` event, and a ``monitor`` record is written.
    """

    def __init__(self, runtime: AgentHost) -> None:
        """Watch nothing yet, for ``runtime``."""
        self._rt = runtime
        self._armed: dict[str, dict[str, dict[str, Any]]] = {}
        self._waiting: dict[str, tuple[anyio.Event, list[dict[str, Any]]]] = {}
        self._changed = anyio.Event()

    def armed(self, watcher_id: str) -> list[dict[str, Any]]:
        """Return the monitors ``watcher_id`` has armed, as saved."""
        return list(self._armed.get(watcher_id, {}).values())

    def load(self, header: Mapping[str, Any]) -> None:
        """Watch the monitors saved in a watcher's header (a run loaded or started here)."""
        saved = InstanceHeader.from_json(header, lenient=True)
        specs, watcher = saved.monitors, str(saved.instance_id)
        if specs:
            self._armed[watcher] = {str(s["target"]): dict(s) for s in specs if isinstance(s, Mapping)}
            self._changed.set()

    async def arm(self, watcher: Instance, spec: dict[str, Any]) -> None:
        """Arm (or replace) the watcher's monitor on ``spec["target"]`` and save it in its header."""
        saved = [s for s in watcher.header.monitors if s.get("target") != spec["target"]]
        watcher.header.monitors = [*saved, spec]
        await self._rt.write_header(watcher)
        self._armed.setdefault(watcher.id, {})[spec["target"]] = spec
        self._changed.set()

    async def wait(self, watcher_id: str, timeout: float) -> list[dict[str, Any]]:  # noqa: ASYNC109
        """Block until a monitor of ``watcher_id`` fires (return its alerts) or ``timeout`` passes (``[]``)."""
        event, alerts = self._waiting.setdefault(watcher_id, (anyio.Event(), []))
        try:
            with anyio.move_on_after(timeout):
                await event.wait()
            return list(alerts)
        finally:
            self._waiting.pop(watcher_id, None)

    async def watch(self) -> None:
        """Check the armed monitors until the runtime closes (the runtime runs this as a task)."""
        while True:
            if not self._armed:
                self._changed = anyio.Event()
                await self._changed.wait()
            await anyio.sleep(_CHECK_EVERY)
            for watcher, specs in list(self._armed.items()):
                for target, spec in list(specs.items()):
                    try:
                        reason = await self._holds(spec)
                    except InstanceNotFoundError:
                        reason = "the agent no longer exists"
                    if reason is not None:
                        await self._fire(watcher, target, spec, reason)

    async def _holds(self, spec: Mapping[str, Any]) -> str | None:
        rt = self._rt
        target = str(spec["target"])
        run = rt.known_run(target)
        state: str | None
        stop: str | None = None
        if run is not None and run.running:
            inst = run.inst
            state, turns, context = State.RUNNING.value, inst.turn, inst.context_tokens
        else:
            saved = InstanceHeader.from_json(await rt.store.read_header(target), lenient=True)
            state, stop = saved.state, saved.stop_reason  # a State is the str it saves
            turns, context = int(saved.turns or 0), saved.context_tokens
        if spec.get("onFinish") and state in RESTING:
            return f"it finished: {state}" + (f" ({stop})" if stop and stop != state else "")
        turns_at = spec.get("turnsAt")
        if turns_at is not None and turns >= turns_at:
            return f"it reached turn {turns}"
        context_at = spec.get("contextAt")
        if context_at is not None and context is not None and context >= context_at:
            return f"its context reached {context} tokens"
        elapsed_at = spec.get("elapsedAt")
        if elapsed_at is not None and time.time() >= elapsed_at:
            return "the time you gave it has passed (it keeps running)"
        return None

    async def _fire(self, watcher_id: str, target: str, spec: Mapping[str, Any], reason: str) -> None:
        rt = self._rt
        run = rt.known_run(watcher_id)
        if run is None:
            run = await rt.get_agent(watcher_id)
        if not await self._disarm(run, target):
            return  # running in another process, which watches it
        specs = self._armed.get(watcher_id, {})
        specs.pop(target, None)
        if not specs:
            self._armed.pop(watcher_id, None)
        alert = {"instanceId": target, "reason": reason, "monitor": dict(spec)}
        rt.queue_record(watcher_id, "monitor", {"instanceId": target, "reason": reason})

        run.publish(Event(kind="monitor", instance_id=watcher_id, turn=run.inst.turn, data=alert))
        waiting = self._waiting.get(watcher_id)
        if waiting is not None:
            waiting[1].append(alert)
            waiting[0].set()
            return
        await run.message(f"[monitor] agent {target}: {reason}", source="runtime")

    async def _disarm(self, run: AgentRun, target: str) -> bool:
        """Remove the monitor from the watcher's saved header; False if another process runs it."""
        rt = self._rt
        inst = run.inst
        if run.running:
            inst.header.monitors = [s for s in inst.header.monitors if s.get("target") != target]
            await rt.write_header(inst)
            return True
        async with held_lease(rt.store, run.instance_id, rt.owner, if_free=True) as held:
            if held is None:
                return False
            header = HeaderFields(await rt.store.read_header(run.instance_id))
            header.monitors = [s for s in header.monitors if s.get("target") != target]
            await rt.store.write_header(run.instance_id, header.json)
            inst.header = header
        return True

"""The hook engine: walks hook implementations in registration order and awaits async ones.

pluggy calls implementations LIFO and cannot await, so the core walks them itself (see
:meth:`PluginHost.impls`). Interceptors chain Modify decisions and stop at the first Block,
Respond or RequireApproval; they fail closed. Observers fail open.

Which decisions each interceptor accepts is :data:`loopwright.hookspecs.HOOKS`; nothing here
keeps a list of its own.

Nothing here runs when a hook has no implementation: callers check the cached implementation
tuple first, so a run without hooks builds no hook context at all.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loopwright._decisions import Block, Decision
from loopwright.hookspecs import HOOKS, PROJECT, HookKind

__all__ = ["HookOutcome", "intercept", "notify"]

#: ``(plugin_name, function, argnames)`` as returned by ``PluginHost.impls``.
Impl = tuple[str, Callable[..., Any], tuple[str, ...]]


class HookOutcome:
    """What an interceptor walk decided.

    Attributes:
        stop: The Block, Respond or RequireApproval that stopped the walk, or ``None``.
        stopped_by: The plugin that returned ``stop``.
        values: The keyword arguments after every Modify decision was applied.
        decisions: ``(plugin_name, decision)`` for every non-None decision, in order, for records.
    """

    __slots__ = ("decisions", "stop", "stopped_by", "values")

    def __init__(self, values: dict[str, Any]) -> None:
        self.stop: Decision | None = None
        self.stopped_by: str | None = None
        self.values = values
        self.decisions: list[tuple[str, Decision, str | None]] = []


async def intercept(
    impls: Sequence[Impl], values: dict[str, Any], *, hook: str,
    modify: Mapping[type[Decision], Callable[[dict[str, Any], Any], None]],
) -> HookOutcome:
    """Walk interceptor implementations.

    :param impls: The implementations, in registration order.
    :param values: The hook's keyword arguments; Modify decisions update it in place.
    :param hook: The hook's short name (``before_inference``), for error reasons; it names the
        rule in :data:`loopwright.hookspecs.HOOKS` that says which decisions the point accepts.
    :param modify: For each Modify class, a function ``(values, decision)`` applying it.
    :return: The outcome. A raising hook or a decision the point does not accept becomes a
        :class:`Block` (fail closed), recorded like any other decision.
    :raises ValueError: If ``hook`` is no interceptor.
    """
    rule = HOOKS.get(f"{PROJECT}_{hook}")
    if rule is None or rule.kind is not HookKind.INTERCEPTOR:
        raise ValueError(f"{hook!r} is not an interceptor hook")
    allowed = rule.decisions
    outcome = HookOutcome(values)
    for plugin, function, argnames in impls:
        try:
            result = function(*[values[a] for a in argnames])
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # noqa: BLE001 - interceptors fail closed, whatever they raise
            block = Block(f"hook {plugin!r} failed in {hook}: {type(exc).__name__}: {exc}")
            outcome.decisions.append((plugin, block, f"{type(exc).__name__}: {exc}"))
            outcome.stop, outcome.stopped_by = block, plugin
            return outcome
        if result is None:
            continue
        if not isinstance(result, allowed):
            block = Block(f"hook {plugin!r} returned {result!r}, which {hook} does not accept")
            outcome.decisions.append((plugin, block, "invalid decision"))
            outcome.stop, outcome.stopped_by = block, plugin
            return outcome
        outcome.decisions.append((plugin, result, None))
        apply = modify.get(type(result))
        if apply is not None:
            apply(values, result)
            continue
        outcome.stop, outcome.stopped_by = result, plugin
        return outcome
    return outcome


async def notify(
    impls: Sequence[Impl], values: Mapping[str, Any], *, on_error: Callable[[str, BaseException], None],
) -> None:
    """Call observer implementations in order; an exception is reported to ``on_error`` and skipped."""
    for plugin, function, argnames in impls:
        try:
            result = function(*[values[a] for a in argnames])
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # noqa: BLE001 - observers fail open
            on_error(plugin, exc)

"""Hook sets and the views that place them among a host's plugins (a definition's ``hooks:`` and guardrails).

A :class:`HookSet` is a checked object whose per-definition hooks apply to some agents only
(:func:`hook_set` checks it as pluggy checks a host plugin: a bad signature is a load error naming
the plugin and the hook). A :class:`HookView` is a pluggy manager of its own that holds the host's
plugins and some sets, each set's hooks on the side of the host's that
:data:`loopwright.hookspecs.HOOKS` gives, so that pluggy orders them and the engine walks them.
:func:`refuse_wrappers`, :func:`checked_guardrail` and :func:`checked_verifier` are the checks the
plugin host and the plans share. :class:`~loopwright._plugins.PluginHost` makes the views
(:meth:`~loopwright._plugins.PluginHost.view`); this module imports nothing of it at run time.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import pluggy

from loopwright import hookspecs
from loopwright.errors import PluginError

if TYPE_CHECKING:
    from loopwright._plugins import PluginHost

__all__ = [
    "GUARDRAIL_ARGS", "HookSet", "HookView", "Manager", "argnames", "checked_guardrail", "checked_verifier", "hook_set",
    "refuse_wrappers",
]

#: The arguments a guardrail may declare (those of ``loopwright_before_tool_call``).
GUARDRAIL_ARGS: tuple[str, ...] = ("call", "tool", "instance", "turn")
#: The hooks a definition's hook set may implement (``per_definition`` in :data:`loopwright.hookspecs.HOOKS`).
_DEFINITION_HOOKS: tuple[str, ...] = tuple(name for name, rule in hookspecs.HOOKS.items() if rule.per_definition)


class Manager(pluggy.PluginManager):
    """A PluginManager that counts changes so that cached hook lists know when to refresh."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.generation = 0
        self.add_hookspecs(hookspecs)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        name = super().register(plugin, name)
        self.generation += 1
        return name

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        out = super().unregister(plugin, name)
        self.generation += 1
        return out


@attrs.frozen
class HookSet:
    """A checked hook set: an object whose hooks apply to some agents only (a definition's ``hooks:``).

    Made by :func:`hook_set`; placed among the host's plugins by :meth:`PluginHost.view`.

    Attributes:
        label: How its implementations are named (``plugin`` of a ``hook`` record).
        plugin: The object or module, as given.
        hooks: ``(hook_name, function)`` for each per-definition hook it implements, in
            :data:`loopwright.hookspecs.HOOKS` order (the function as pluggy found it, with its mark).
    """

    label: str
    plugin: object = attrs.field(eq=False)
    hooks: tuple[tuple[str, Callable[..., Any]], ...] = attrs.field(eq=False)


class _Placed:
    """One side of a hook set, as a view registers it: its hooks that run before the host's, or after.

    Its attributes are the set's own functions (bound methods keep their ``hookimpl`` marks), so
    pluggy checks exactly what will be called; one object per side lets one set appear on both
    sides, and twice in a definition, and be a host plugin as well.
    """

    def __init__(self, hook_set: HookSet, *, first: bool) -> None:
        self.first = first
        for name, function in hook_set.hooks:
            if hookspecs.HOOKS[name].definition_first is first:
                setattr(self, name, function)


class _ViewManager(pluggy.PluginManager):
    """A PluginManager that places the hooks of a :class:`_Placed` side with ``tryfirst`` or ``trylast``."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)

    def parse_hookimpl_opts(self, plugin: object, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is not None and isinstance(plugin, _Placed):
            opts = {**opts, "tryfirst": plugin.first, "trylast": not plugin.first}
        return opts


class HookView:
    """The host's hook implementations with hook sets placed among them, registered in a pluggy manager of their own.

    The manager has the project name and hookspecs of the host's and holds, in this order, the
    sets' ``definition_first`` hooks (:data:`loopwright.hookspecs.HOOKS`) marked ``tryfirst``, the
    host's plugins in loading order (the same objects: pluggy lets one plugin sit in several
    managers), and the sets' other hooks marked ``trylast``. pluggy checks every implementation
    against its spec as it registers it and orders them; the walk calls
    each of pluggy's groups (``tryfirst``, plain, ``trylast``) in registration order, where
    pluggy's own calls are last registered, first called. So the host's hooks wrap the sets':
    they run first before a step and for observers, last after a step (``after_*``).

    Built on first use and again after the host registers or unregisters a plugin; each hook's
    tuple is then cached.
    """

    def __init__(self, host: PluginHost, sets: tuple[HookSet, ...]) -> None:
        self._host = host
        self._sets = sets
        self._pm: pluggy.PluginManager | None = None
        self._labels: dict[str, str] = {}
        self._generation = -1
        self._cache: dict[str, tuple[Any, ...]] = {}

    def impls(self, hook_name: str) -> tuple[Any, ...]:
        """Return ``(plugin_name, function, argnames)`` for each implementation of ``hook_name``, in call order.

        Every pending entry point of the host is loaded first (their hooks take part in every
        call), except for ``loopwright_on_runtime_close``: a plugin never loaded has nothing to close.
        """
        if self._generation == self._host.pm.generation:
            hit = self._cache.get(hook_name)
            if hit is not None:
                return hit
        self._host.before_hook(hook_name)
        if self._pm is None or self._generation != self._host.pm.generation:
            self.refresh()
        assert self._pm is not None  # noqa: S101 - just built
        first: list[Any] = []
        plain: list[Any] = []
        last: list[Any] = []
        for h in getattr(self._pm.hook, hook_name).get_hookimpls():
            (first if h.tryfirst else last if h.trylast else plain).append(h)
        last.reverse()  # pluggy inserts each trylast one in front of those registered before it
        out = tuple((self._labels.get(h.plugin_name, h.plugin_name), h.function, (*h.argnames, *h.kwargnames))
                    for h in (*first, *plain, *last))
        self._cache[hook_name] = out
        return out

    def refresh(self) -> None:
        """Register the host's plugins and the sets anew in a new manager, and forget every cached tuple.

        :raises PluginError: pluggy refuses a set (it names the set).
        """
        host = self._host
        pm = _ViewManager()
        labels: dict[str, str] = {}

        def place(first: bool) -> None:
            for n, s in enumerate(self._sets):
                side = _Placed(s, first=first)
                if len(vars(side)) > 1:
                    name = f"{n}:{'first' if first else 'last'}:{s.label}"
                    labels[name] = s.label
                    try:
                        pm.register(side, name)
                    except (ValueError, pluggy.PluginValidationError) as exc:
                        raise PluginError(f"hook set {s.label!r}: {exc}", plugin_name=s.label) from exc

        place(first=True)
        for name, plugin in host.loaded():
            pm.register(plugin, name)
        place(first=False)
        # No check_pending: the sets hold only hooks with specs (hook_set ran it), and the host
        # ran it on its own plugins when each registered.
        self._pm, self._labels = pm, labels
        self._generation = host.pm.generation
        self._cache = {}


def argnames(fn: Callable[..., Any]) -> tuple[str, ...]:
    """Return the names of ``fn``'s parameters, in order."""
    return tuple(inspect.signature(fn).parameters)


def hook_set(plugin: object, label: str, *, plugin_name: str | None = None) -> HookSet:
    """Check a definition's hook set as host plugins are checked, and return it.

    :param plugin: An object or module with ``loopwright_*`` interceptor and observer hooks.
    :param label: How its implementations are named in records (``plugin`` of a ``hook`` record).
    :param plugin_name: The plugin that offers the set, for errors (default: ``label``).
    :return: The set, with the hooks it implements. Its registration hooks and
        ``loopwright_on_runtime_close`` are left out: they are never called for a definition.

    :raises PluginError: A hook matches no spec, takes an argument its spec does not offer, or
        the object cannot be registered; the error names the plugin and the hook.
    """
    manager = Manager()
    refuse_wrappers(manager, plugin, plugin_name or label)
    try:
        manager.register(plugin, label)
        manager.check_pending()
    except (ValueError, pluggy.PluginValidationError) as exc:
        raise PluginError(f"hook set {label!r}: {exc}", plugin_name=plugin_name or label) from exc
    hooks = tuple((name, h.function) for name in _DEFINITION_HOOKS for h in getattr(manager.hook, name).get_hookimpls())
    return HookSet(label, plugin, hooks)


def refuse_wrappers(manager: pluggy.PluginManager, plugin: object, name: str) -> None:
    """Refuse ``plugin`` if any of its ``loopwright_*`` implementations is a pluggy wrapper.

    The core walks implementations itself, in registration order (:meth:`PluginHost.impls`), and
    awaits async ones; a ``wrapper=True`` or ``hookwrapper=True`` generator has no place in that walk.
    Refused at registration, before the plugin is registered, so it never runs (it is never turned
    into a Block at call time).

    :raises PluginError: Naming the plugin and the hook.
    """
    for attr in dir(plugin):
        if not attr.startswith(f"{hookspecs.PROJECT}_"):
            continue
        opts = manager.parse_hookimpl_opts(plugin, attr)
        if not opts:
            continue
        for option in ("wrapper", "hookwrapper"):
            if opts.get(option):
                raise PluginError(
                    f"hook {attr}: {option}=True implementations are not supported; loopwright calls hooks "
                    f"in registration order and awaits async ones (write a plain interceptor or observer)",
                    plugin_name=name)


def checked_guardrail(name: str, policy: Callable[..., Any], plugin: str | None) -> Callable[..., Any]:
    """Return ``policy`` if it declares only guardrail arguments; raise PluginError naming both if not."""
    if not callable(policy):
        raise PluginError(f"guardrail {name!r} is not callable: {policy!r}", plugin_name=plugin)
    try:
        params = inspect.signature(policy).parameters
    except (TypeError, ValueError) as exc:
        raise PluginError(f"guardrail {name!r}: cannot read its signature: {exc}", plugin_name=plugin) from exc
    unknown = [p for p in params if p not in GUARDRAIL_ARGS]
    if unknown:
        raise PluginError(f"guardrail {name!r} takes {', '.join(unknown)}, not among the arguments it is "
                          f"called with ({', '.join(GUARDRAIL_ARGS)})", plugin_name=plugin)
    return policy


def checked_verifier(name: str, verify: Callable[..., Any], plugin: str | None) -> Callable[..., Any]:
    """Return ``verify`` if it can be called with one argument (the messages); raise PluginError if not."""
    try:
        inspect.signature(verify).bind(())
    except (TypeError, ValueError) as exc:
        raise PluginError(f"verifier {name!r} must take one argument, the messages ({exc})",
                          plugin_name=plugin) from exc
    return verify

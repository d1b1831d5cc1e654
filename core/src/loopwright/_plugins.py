"""The plugin manager: one per :class:`~loopwright.Runtime`, never a global one.

Loading order (so that hooks run in this order too):

1. the built-in plugin modules of :data:`BUILTIN_PLUGINS`;
2. the entry points of group ``loopwright``, except blocked names (the assembly's
   ``disablePlugins`` and the comma-separated ``LOOPWRIGHT_DISABLE_PLUGINS``; set
   ``LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD=1`` to load none);
3. the assembly's ``plugins:``, each an entry-point name, a dotted module path or a ``.py`` file
   relative to the assembly file;
4. plugins a host registers later with :meth:`PluginHost.register`.

Then ``check_pending()`` rejects hook implementations that match no spec (a misspelled hook), and
the registration hooks fill the component registries. Each is called with the arguments it takes
of ``register``, ``settings`` (the assembly's ``pluginSettings``) and ``runtime``.

Entry points are imported lazily, only when something names what they provide: a lookup in a
registry (``kind in host.stores``, ``host.providers.get(kind)`` ...) that the plugins loaded so
far do not answer loads pending entry points, the one whose name is most like the name looked
up first, until one registers it; listing (``Registry.names()``, ``items()``,
:meth:`PluginHost.plugin_names`, ``registered_by``), :meth:`PluginHost.load_entry_points`
(the runtime calls it before an instance is created or continued) and the first hook call
(:meth:`PluginHost.impls`) load them all: every installed plugin's hooks take part in every
run. So a runtime that only reads the store (``loopwright ls``, ``show``, ``records`` on a
built-in store) imports no plugin. An entry point loaded late still takes its
place in the order above (step 2), for hooks and for :meth:`PluginHost.plugin_names`.

A definition's hook sets (``hooks:``) and guardrails join the host's hooks through a
:class:`HookView`: another pluggy manager, one per distinct list of sets, that holds the host's
plugins and the sets, each side of the host's where :data:`loopwright.hookspecs.HOOKS` says.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from loopwright import hookspecs
from loopwright._hook_sets import (
    GUARDRAIL_ARGS,
    HookSet,
    HookView,
    Manager,
    argnames,
    checked_guardrail,
    checked_verifier,
    hook_set,
    refuse_wrappers,
)
from loopwright.errors import PluginError, RegistrationError, shown_path

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = [
    "BUILTIN_PLUGINS", "ENTRY_POINT_GROUP", "GUARDRAIL_ARGS", "HookSet", "HookView", "PluginHost", "Registry",
    "checked_guardrail", "checked_verifier", "hook_set", "hookimpl", "refuse_wrappers",
]

ENTRY_POINT_GROUP = "loopwright"

#: Plugin modules that ship inside loopwright-core. They register exactly as a third party would.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "loopwright.builtins.tools",
    "loopwright.builtins.file_store",
    "loopwright.builtins.sqlite_store",
    "loopwright.builtins.local_engine",
    "loopwright.builtins.context",
    "loopwright.builtins.records",
    "loopwright.builtins.sqlite_memory",
    "loopwright.builtins.memory_tools",
)

#: Mark a function as an implementation of a ``loopwright_*`` hook (defined in :mod:`loopwright.hookspecs`).
hookimpl = hookspecs.hookimpl

#: The hooks that must not be ``async def`` (registration hooks, per :data:`loopwright.hookspecs.HOOKS`).
_SYNC_ONLY = frozenset(hookspecs.REGISTRATIONS)

class Registry:
    """Components registered under names, each remembering the plugin that registered it.

    Attributes:
        kind: What is registered (``provider``, ``tool`` ...), for error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, tuple[Any, str]] = {}
        self._options: dict[str, Mapping[str, Any]] = {}
        #: Loads pending entry points (see the module's docstring): called as ``load(name, found)``
        #: with the name looked up (``None``: every one) and a test that tells when to stop.
        self.load_pending: Callable[[str | None, Callable[[], bool]], None] | None = None

    def _look_for(self, name: str) -> bool:
        """Whether ``name`` is registered, once pending entry points were loaded until one registered it."""
        if name not in self._items and self.load_pending is not None:
            self.load_pending(name, lambda: name in self._items)
        return name in self._items

    def _load_all(self) -> None:
        if self.load_pending is not None:
            self.load_pending(None, lambda: False)

    def add(self, name: str, item: Any, plugin: str, *, options: Mapping[str, Any] | None = None) -> None:
        """Register ``item`` as ``name``; a name taken by another plugin raises RegistrationError.

        :param options: A JSON Schema of the options ``item`` takes (see :meth:`options_of`).
        :raises PluginError: ``options`` is not a mapping.
        """
        if name in self._items:
            raise RegistrationError(kind=self.kind, name=name, first=self._items[name][1], second=plugin)
        if options is not None and not isinstance(options, Mapping):
            raise PluginError(f"the options of {self.kind} {name!r} must be a JSON Schema (a mapping), "
                              f"not {type(options).__name__}", plugin_name=plugin)
        self._items[name] = (item, plugin)
        if options is not None:
            self._options[name] = options

    def options_of(self, name: str) -> Mapping[str, Any] | None:
        """Return the JSON Schema of the options ``name`` takes, or ``None`` if its plugin declared none.

        The runtime checks a component's options against it, at their place in the assembly,
        before it calls the factory.
        """
        self._look_for(name)
        return self._options.get(name)

    def remove(self, name: str) -> None:
        """Forget ``name`` (its plugin is being unregistered)."""
        del self._items[name]
        self._options.pop(name, None)

    def get(self, name: str) -> Any:
        """Return the item registered as ``name``. Raise KeyError if there is none."""
        self._look_for(name)
        return self._items[name][0]

    def plugin_of(self, name: str) -> str:
        """Return the name of the plugin that registered ``name``."""
        self._look_for(name)
        return self._items[name][1]

    def __contains__(self, name: object) -> bool:
        return self._look_for(name) if isinstance(name, str) else False

    def names(self) -> list[str]:
        """Return the registered names, sorted (every pending entry point loaded first)."""
        self._load_all()
        return sorted(self._items)

    def remove_plugin(self, plugin: str) -> None:
        """Remove every entry that ``plugin`` registered."""
        for name in [n for n, (_item, p) in self._items.items() if p == plugin]:
            del self._items[name]

    def items(self) -> list[tuple[str, Any, str]]:
        """Return ``(name, item, plugin)`` for every entry, sorted by name (every pending entry point loaded first)."""
        self._load_all()
        return [(n, i, p) for n, (i, p) in sorted(self._items.items())]


class PluginHost:
    """Owns the plugin manager of one runtime and the registries its plugins fill.

    Attributes:
        pm: The pluggy manager.
        providers: Provider kinds → factories.
        tools: Tool names → :class:`~loopwright.Tool`.
        stores: Store kinds → factories.
        engines: Engine kinds → factories (``factory(options, runtime)``).
        context_strategies: Strategy kinds → factories.
        record_sinks: Sink kinds → factories.
        memories: Long-term memory kinds → factories (``factory(settings)``, a ``MemorySettings``).
        commands: CLI command names → click commands.
        guardrails: Guardrail names → policy functions (see ``loopwright_register_guardrails``).
        verifiers: Completion verifier names → ``verify(messages)`` functions.
        hook_sets: Hook set names → :class:`HookSet`, checked against the hookspecs when
            registered (see :func:`hook_set`).
        hooks: The host's own :class:`HookView` (no hook set placed in it): what :meth:`impls` reads.
        settings: The assembly's ``pluginSettings``, passed to registration hooks as ``settings``.
        runtime: The runtime that owns this host, passed to registration hooks as ``runtime``.

    :param settings: See ``settings`` above (default: none).
    :param runtime: See ``runtime`` above (default: ``None``, a host used on its own).
    """

    def __init__(self, *, settings: Mapping[str, Any] | None = None, runtime: Any = None) -> None:
        self.settings: Mapping[str, Any] = settings if settings is not None else {}
        self.runtime = runtime
        self.pm = Manager()
        self.providers = Registry("provider")
        self.tools = Registry("tool")
        self.stores = Registry("store")
        self.engines = Registry("engine")
        self.context_strategies = Registry("context strategy")
        self.record_sinks = Registry("record sink")
        self.memories = Registry("memory")
        self.commands = Registry("command")
        self.guardrails = Registry("guardrail")
        self.verifiers = Registry("verifier")
        self.hook_sets = Registry("hook set")
        self._registered_order: list[str] = []
        self.hooks = HookView(self, ())
        #: The hook views by the hook sets placed in them (:meth:`view`), made since the host's
        #: plugins last changed (the generation below).
        self._views: dict[tuple[Any, ...], HookView] = {}
        self._views_generation = 0
        #: Entry points not loaded yet, by name; ``None`` until the installed ones are read.
        self._pending: dict[str, EntryPoint] | None = {}
        self._installed: dict[str, EntryPoint] | None = None
        #: Where the next entry point loaded takes its place in ``_registered_order``.
        self._entry_point_slot = 0
        self._loading_pending = False
        for reg in self._registries():
            reg.load_pending = self._load_pending

    # -- loading ----------------------------------------------------------------------------

    def load(
        self, *, extra: Sequence[str] = (), base_dir: Path | None = None,
        blocked: Iterable[str] = (), autoload: bool | None = None,
    ) -> None:
        """Load built-ins, entry points and ``extra`` plugin references, then fill registries.

        :param extra: The assembly's ``plugins:`` entries.
        :param base_dir: The folder ``.py`` references are relative to.
        :param blocked: Entry-point names not to load.
        :param autoload: Whether to load entry points; default: unless
            ``LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD`` is set.
        """
        for modname in BUILTIN_PLUGINS:
            self._register_checked(importlib.import_module(modname), modname)
        self._entry_point_slot = len(self._registered_order)
        blocked_names = set(blocked)
        env_blocked = os.environ.get("LOOPWRIGHT_DISABLE_PLUGINS", "")
        blocked_names.update(n.strip() for n in env_blocked.split(",") if n.strip())
        if autoload is None:
            autoload = os.environ.get("LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD", "") in ("", "0")
        for name in sorted(blocked_names):
            self.pm.set_blocked(name)
        # The installed entry points are read, and each imported, only when something asks for
        # them (see the module's docstring): reading them costs importlib.metadata and a scan of
        # every installed distribution, importing them their whole dependency trees.
        self._pending = None if autoload else {}
        for ref in extra:
            plugin, name = _resolve_reference(ref, base_dir)
            if name in blocked_names:
                raise PluginError("is listed in plugins: but also blocked", plugin_name=name)
            if not self.pm.has_plugin(name) and not self.pm.is_registered(plugin):
                # A module named by its path that an entry point already loaded is loaded once.
                self._register_checked(plugin, name)
            if self._pending is not None:
                self._pending.pop(name, None)
        self._check_pending()
        for name in list(self._registered_order):
            self._call_registrations(name)

    def load_entry_points(self) -> None:
        """Load every entry point not loaded yet, so that each installed plugin's hooks take part from now on.

        The runtime calls this before it creates or continues an instance, so that a plugin that
        cannot load fails there, with nothing created, rather than at the run's first hook.

        :raises PluginError: An entry point cannot be imported or registered (it names the entry point).
        """
        self._load_pending(None, lambda: False)

    def _pending_entry_points(self) -> dict[str, EntryPoint]:
        """Return the entry points not loaded yet (reading the installed ones the first time)."""
        if self._pending is None:
            self._pending = {name: ep for name, ep in self._entry_points().items()
                             if not self.pm.is_blocked(name) and not self.pm.has_plugin(name)}
        return self._pending

    def _load_pending(self, wanted: str | None, found: Callable[[], bool]) -> None:
        """Load pending entry points, ``wanted``'s namesakes first, until ``found()`` holds (``None``: all).

        A plugin's registration hooks may look things up while it loads: those lookups load nothing more.

        :raises PluginError: An entry point cannot be imported or registered (it names the entry point).
        """
        if self._loading_pending or (self._pending is not None and not self._pending):
            return
        self._loading_pending = True
        try:
            pending = self._pending_entry_points()
            for name in sorted(pending, key=lambda n: _likeness(n, wanted)):
                ep = pending.pop(name)
                try:
                    plugin = ep.load()
                except Exception as exc:
                    raise PluginError(f"could not load entry point {ep.value!r}: {exc}", plugin_name=name) from exc
                if self.pm.is_registered(plugin):
                    continue  # the assembly's plugins: named its module already
                self._register_checked(plugin, name)
                self._registered_order.remove(name)
                self._registered_order.insert(self._entry_point_slot, name)
                self._entry_point_slot += 1
                self._check_pending()
                self._call_registrations(name)
                if found():
                    return
        finally:
            self._loading_pending = False

    def register(self, plugin: object, name: str | None = None) -> str:
        """Register one more plugin now (a host's hooks, a test's plugin) and its components."""
        name = name or _default_name(plugin)
        self._register_checked(plugin, name)
        self._check_pending()
        self._call_registrations(name)
        return name

    def unregister(self, name: str) -> None:
        """Remove a plugin's hooks and every component it registered."""
        self.pm.unregister(name=name)
        self._registered_order.remove(name)
        for reg in self._registries():
            reg.remove_plugin(name)

    def _check_pending(self) -> None:
        """Reject hook implementations that match no hookspec (a misspelled hook name)."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            plugin = exc.plugin
            name = self.pm.get_name(plugin) if plugin is not None else None
            raise PluginError(str(exc), plugin_name=name) from exc

    def installed(self, name: str) -> EntryPoint | None:
        """Return the installed entry point ``name`` of group ``loopwright``, if there is one (not loaded)."""
        return self._entry_points().get(name)

    def _entry_points(self) -> dict[str, EntryPoint]:
        """Return the installed entry points of group ``loopwright``, read once."""
        if self._installed is None:
            self._installed = _entry_points()
        return self._installed

    def plugin_names(self) -> list[str]:
        """Return the plugins' names in loading order (every pending entry point loaded first)."""
        self.load_entry_points()
        return list(self._registered_order)

    def registered_by(self, name: str) -> dict[str, list[str]]:
        """Return what plugin ``name`` registered, as ``{kind: [names]}`` (every pending entry point loaded first)."""
        self.load_entry_points()
        out: dict[str, list[str]] = {}
        for reg in self._registries():
            names = [n for n, _i, p in reg.items() if p == name]
            if names:
                out[reg.kind] = names
        return out

    def _registries(self) -> tuple[Registry, ...]:
        return (self.providers, self.tools, self.stores, self.engines, self.context_strategies,
                self.record_sinks, self.memories, self.commands, self.guardrails, self.verifiers, self.hook_sets)

    def _register_checked(self, plugin: object, name: str) -> None:
        for hook_name in _SYNC_ONLY:
            fn = getattr(plugin, hook_name, None)
            if fn is not None and inspect.iscoroutinefunction(fn):
                raise PluginError(f"{hook_name} must not be async def", plugin_name=name)
        refuse_wrappers(self.pm, plugin, name)
        try:
            self.pm.register(plugin, name)
        except ValueError as exc:
            raise PluginError(str(exc), plugin_name=name) from exc
        except pluggy.PluginValidationError as exc:
            raise PluginError(str(exc), plugin_name=name) from exc
        self._registered_order.append(name)

    def _call_registrations(self, name: str) -> None:  # noqa: C901 - one registrar per kind
        plugin = self.pm.get_plugin(name)

        def keyed(reg: Registry) -> Callable[..., None]:
            def register(kind: str, factory: Any, *, options: Mapping[str, Any] | None = None) -> None:
                reg.add(kind, factory, name, options=options)
            return register

        def register_tools(*tools: Any) -> None:
            # The tool machinery (anyio, the tool types) only when a plugin registers tools:
            # keeps importing the plugin host cheap.
            from loopwright._tools import as_tool  # noqa: PLC0415

            for t in tools:
                made = as_tool(t)
                self.tools.add(made.name, made.replace(plugin=name), name)

        def register_commands(*commands: Any) -> None:
            for c in commands:
                self.commands.add(c.name, c, name)

        def register_guardrail(guardrail: str, policy: Callable[..., Any]) -> None:
            self.guardrails.add(guardrail, checked_guardrail(guardrail, policy, name), name)

        def register_verifier(verifier: str, verify: Callable[..., Any]) -> None:
            self.verifiers.add(verifier, checked_verifier(verifier, verify, name), name)

        def register_hooks(set_name: str, hooks: object) -> None:
            self.hook_sets.add(set_name, hook_set(hooks, f"{set_name} (hook set of {name})", plugin_name=name),
                               name)

        calls: Mapping[str, Callable[..., None]] = {
            "loopwright_register_guardrails": register_guardrail,
            "loopwright_register_verifiers": register_verifier,
            "loopwright_register_hooks": register_hooks,
            "loopwright_register_providers": keyed(self.providers),
            "loopwright_register_tools": register_tools,
            "loopwright_register_stores": keyed(self.stores),
            "loopwright_register_engines": keyed(self.engines),
            "loopwright_register_context_strategies": keyed(self.context_strategies),
            "loopwright_register_record_sinks": keyed(self.record_sinks),
            "loopwright_register_memories": keyed(self.memories),
            "loopwright_register_commands": register_commands,
        }
        for hook_name, registrar in calls.items():
            fn = getattr(plugin, hook_name, None)
            if fn is None:
                continue
            values = {"register": registrar, "settings": self.settings, "runtime": self.runtime}
            fn(**{a: values[a] for a in argnames(fn) if a in values})

    # -- calling ----------------------------------------------------------------------------

    def impls(self, hook_name: str) -> tuple[Any, ...]:
        """Return ``(plugin_name, function, argnames)`` for each host implementation, in call order.

        The order is :class:`HookView`'s (registration order, ``tryfirst`` ones first,
        ``trylast`` ones last); the tuple is cached and refreshed when a plugin is registered or
        unregistered. A definition's hook sets join these in :meth:`view`.
        """
        return self.hooks.impls(hook_name)

    def view(self, sets: Sequence[HookSet]) -> HookView:
        """Return the hook view of the host's plugins with ``sets`` placed among them, made once per distinct ``sets``.

        One view serves every definition naming the same sets while the host's plugins stay the same.

        :param sets: A definition's hook sets (its ``hooks:``, then its guardrails), in its order.
        :raises PluginError: pluggy refuses one of them (naming the set).
        """
        if not sets:
            return self.hooks
        if self._views_generation != self.pm.generation:
            # Views made before keep working (they refresh themselves); new plans get new ones.
            self._views, self._views_generation = {}, self.pm.generation
        key = tuple((s.label, id(s.plugin), tuple((n, id(f)) for n, f in s.hooks)) for s in sets)
        view = self._views.get(key)
        if view is None:
            view = HookView(self, tuple(sets))
            view.refresh()  # a set pluggy refuses fails here, while planning, not at a hook point
            self._views[key] = view
        return view

    def before_hook(self, hook_name: str) -> None:
        """Load every pending entry point before ``hook_name`` is first called: their hooks take part in every call.

        Except for ``loopwright_on_runtime_close``: a plugin never loaded has nothing to close.
        """
        if (self._pending is None or self._pending) and hook_name != "loopwright_on_runtime_close":
            self.load_entry_points()

    def loaded(self) -> list[tuple[str, object]]:
        """Return ``(name, plugin)`` for each registered plugin, in loading order (loading nothing)."""
        return [(name, self.pm.get_plugin(name)) for name in self._registered_order]


def _default_name(plugin: object) -> str:
    if inspect.ismodule(plugin):
        return plugin.__name__
    return f"{type(plugin).__module__}.{type(plugin).__qualname__}@{id(plugin):x}"


def _entry_points() -> dict[str, EntryPoint]:
    # Read from the metadata folders without importlib.metadata (~25 ms less: issue 30).
    from loopwright._entry_points import entry_points  # noqa: PLC0415 - only when entry points are read

    return entry_points(ENTRY_POINT_GROUP)


def _likeness(entry_point: str, wanted: str | None) -> tuple[int, str]:
    """Sort pending entry points for a lookup of ``wanted``: its namesake, names that start alike, the rest."""
    if wanted is None:
        return 2, entry_point
    a, b = entry_point.lower(), wanted.lower()
    if a == b:
        return 0, entry_point
    return (1 if a.startswith(b) or b.startswith(a) else 2), entry_point


def _import_failure(path: Path, exc: BaseException) -> str:
    """Say where and why importing the plugin file ``path`` failed, never as a repr.

    ``FILE:LINE:COLUMN: SyntaxError: message`` and the line, for a syntax error; else
    ``FILE:LINE: Type: message`` at the plugin file's last line the exception passed.
    """
    if isinstance(exc, SyntaxError):
        where = ":".join(str(part) for part in (shown_path(exc.filename or path), exc.lineno, exc.offset) if part)
        text = f"\n    {exc.text.rstrip()}" if exc.text else ""
        return f"{where}: {type(exc).__name__}: {exc.msg}{text}"
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == str(path)]
    where = f"{shown_path(path)}:{lines[-1]}" if lines else shown_path(path)
    return f"{where}: {type(exc).__name__}: {exc}"


def _resolve_reference(
    ref: str, base_dir: Path | None,
) -> tuple[object, str]:
    """Load a ``plugins:`` entry: a ``.py`` file, an entry-point name, or a dotted module path."""
    if ref.endswith(".py"):
        path = Path(ref)
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        if not path.is_file():
            raise PluginError(f"no such plugin file: {shown_path(path)}", plugin_name=ref)
        modname = f"loopwright_plugin_file_{abs(hash(str(path.resolve()))):x}"
        spec = importlib.util.spec_from_file_location(modname, path)
        if spec is None or spec.loader is None:
            raise PluginError(f"cannot import {shown_path(path)}", plugin_name=ref)
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[modname]
            raise PluginError(f"cannot import {_import_failure(path, exc)}", plugin_name=ref) from exc
        return module, ref
    ep = _entry_points().get(ref)
    if ep is not None:
        try:
            return ep.load(), ref
        except Exception as exc:
            raise PluginError(f"could not load entry point {ep.value!r}: {exc}", plugin_name=ref) from exc
    try:
        return importlib.import_module(ref), ref
    except ImportError as exc:
        raise PluginError(
            f"is neither an entry point of group {ENTRY_POINT_GROUP!r}, an importable module, "
            f"nor a .py file: {exc}", plugin_name=ref) from exc

"""Reading a store's instances: summaries, trees and held calls, with or without a runtime.

Every query here is a function of a :class:`~loopwright.abc.Store` and what it saved (headers,
entry logs), so that the runtime (:class:`~loopwright._tree.Trees`,
:meth:`Runtime.list_instances <loopwright.Runtime.list_instances>`,
:meth:`Runtime.summary <loopwright.Runtime.summary>`) and ``loopwright ls`` and ``show``, which
read the store without one, give the same answers from one piece of code.

:func:`bare_store` builds an assembly's store on its own, with no plugin host, engine, provider
or tool modules imported, when opening a runtime on that assembly would do nothing more that
reading can observe; :meth:`BareStore.run` runs a query on it, without an event loop when the
store's reads never wait (the file store's).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs

from loopwright._states import State
from loopwright._views import (
    HeaderLike,
    approval_to_json,
    children_in,
    header_of,
    own_cost,
    subtree_in,
    summary,
    tree_node,
)
from loopwright.errors import InstanceNotFoundError, LoopwrightError

if TYPE_CHECKING:
    from loopwright._definition import Assembly
    from loopwright._header import InstanceHeader
    from loopwright._types import PendingApproval
    from loopwright.abc import Store

__all__ = [
    "BareStore",
    "bare_store",
    "children_cost",
    "descendant_headers",
    "instance_summary",
    "list_instances",
    "subtree_cost",
    "tree",
    "tree_approvals",
    "trees",
]

_T = TypeVar("_T")

#: The store kinds :func:`bare_store` builds: the built-in ones, as ``(module, class, inline)``;
#: ``inline``: every read is an ``async def`` that does its I/O directly and never waits.
_BUILTIN_STORES: Final[Mapping[str, tuple[str, str, bool]]] = {
    "file": ("loopwright.builtins.file_store", "FileStore", True),
    "sqlite": ("loopwright.builtins.sqlite_store", "SqliteStore", False),
}
#: The engine an assembly names by default (``engine: {kind: local}``, a built-in with no options).
_DEFAULT_ENGINE: Final = "local"
#: The prefix of the built-in plugins' names (:data:`loopwright._plugins.BUILTIN_PLUGINS`).
_BUILTIN_PREFIX: Final = "loopwright.builtins."


# ---------------------------------------------------------------------------------------------
# Queries over saved headers
# ---------------------------------------------------------------------------------------------


async def list_instances(store: Store, state: str | None = None) -> list[dict[str, Any]]:
    """Return every instance's summary (:func:`~loopwright._views.summary`), optionally only those in ``state``."""
    headers = [header_of(h) for h in await store.list_headers()]  # each converted once
    by_id = {h.instance_id: h for h in headers}
    return [summary(h, subtree_cost=subtree_in(h, by_id, set()))
            for h in headers if state is None or h.state == state]


async def instance_summary(store: Store, instance_id: str, *, live: bool = False) -> dict[str, Any]:
    """Return one instance's summary (``show``), its ``subtreeCost`` read through its children.

    Also ``treePendingApprovals`` (every undecided call in its subtree, each with its holder's
    ``instanceId`` and ``path``) and ``tree`` (see :func:`tree`). The totals of an instance saved
    as ``running`` and not run by the caller (``live`` false) come from its entry log: its header
    has them only as of its last state change (a killed process saved turns since).

    :raises InstanceNotFoundError: No such instance.
    """
    saved = await store.read_header(instance_id)
    header = header_of(saved)
    if header.state == State.RUNNING and not live:
        # The instance model only for a saved running instance: keeps ls and show cheap.
        from loopwright._replay import entry_totals  # noqa: PLC0415

        header = header_of({**saved, **entry_totals(await store.read_entries(instance_id))})
    data = summary(header, subtree_cost=await subtree_cost(store, instance_id, header))
    data["tree"] = await tree(store, instance_id)
    data["treePendingApprovals"] = [approval_to_json(p) for p in await tree_approvals(store, instance_id)]
    return data


async def subtree_cost(store: Store, instance_id: str, header: HeaderLike | None = None) -> float | None:
    """Return the instance's cost plus that of every agent it started, directly or not.

    ``None`` when any part is unknown. Each instance's own cost is what its header holds
    (brought up to date at every state change).
    """
    h = header_of(await store.read_header(instance_id) if header is None else header)
    own = own_cost(h)
    children = await children_cost(store, h)
    return None if own is None or children is None else own + children


async def children_cost(store: Store, header: HeaderLike) -> float | None:
    """Return the summed subtree cost of the agents ``header``'s instance started (``None`` if unknown)."""
    h = header_of(header)
    by_id = await descendant_headers(store, h)
    return children_in(h, by_id, {h.instance_id})


async def descendant_headers(store: Store, header: HeaderLike) -> dict[Any, InstanceHeader]:
    """Return the saved headers of the agents ``header``'s instance started, directly or not, by id.

    Each is read from the store once and converted once (:func:`~loopwright._views.header_of`).
    """
    h = header_of(header)
    by_id: dict[Any, InstanceHeader] = {}
    pending = list(h.children)
    while pending:  # read the descendants' headers once each, then sum as list_instances does
        child = pending.pop()
        if child in by_id or child == h.instance_id:
            continue
        try:
            by_id[child] = header_of(await store.read_header(child))
        except InstanceNotFoundError:
            continue
        pending.extend(by_id[child].children)
    return by_id


async def tree_approvals(store: Store, instance_id: str) -> list[PendingApproval]:
    """Return every undecided call in the subtree of ``instance_id``, read from the store.

    Depth first, in the order the agents were started, an instance's own calls before its
    children's. Each entry carries ``instance_id`` (its holder) and ``path`` (from
    ``instance_id`` down to the holder, each ``{"instanceId", "name"}``).
    """
    out: list[PendingApproval] = []

    def walk(node: Mapping[str, Any], path: tuple[Mapping[str, Any], ...]) -> None:
        here = (*path, {"instanceId": node["instanceId"], "name": node["name"]})
        for raw in node["pendingApprovals"]:
            # The value objects only when a call waits: keeps ls and show cheap.
            from loopwright._convert import converter  # noqa: PLC0415
            from loopwright._types import PendingApproval  # noqa: PLC0415

            entry = converter.structure(raw, PendingApproval)
            out.append(attrs.evolve(entry, instance_id=node["instanceId"], path=here))
        for child in node["children"]:
            walk(child, here)

    walk(await tree(store, instance_id), ())
    return out


async def tree(store: Store, instance_id: str) -> dict[str, Any]:
    """Return the instance tree below ``instance_id`` as nested objects (``show --json``'s ``tree``).

    Each node: ``instanceId``, ``name``, ``state``, ``stopReason``, ``turns``, ``depth``,
    ``pendingApprovals`` (its own undecided calls), ``waitingOn`` (undecided calls in its
    subtree), ``cost``, ``subtreeCost``, ``forkedFrom`` and ``children`` (nodes).
    """
    header = header_of(await store.read_header(instance_id))
    by_id = {**await descendant_headers(store, header), header.instance_id: header}
    return tree_node(header, by_id, set())


async def trees(store: Store) -> list[dict[str, Any]]:
    """Return every tree in the store (``ls --tree``): one node per root, oldest first.

    A root is an instance no listed instance started (its spawner is gone or it has none).
    """
    headers = [header_of(h) for h in await store.list_headers()]
    by_id = {h.instance_id: h for h in headers}
    return [tree_node(h, by_id, set()) for h in headers if h.spawner_instance_id not in by_id]


# ---------------------------------------------------------------------------------------------
# A store without a runtime
# ---------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class BareStore:
    """An assembly's store built without a runtime (see :func:`bare_store`), for reading.

    Attributes:
        store: The store, not used yet.
        inline: Whether its reads never wait, so that they run without an event loop (the file
            store's ``async def`` methods do their file I/O directly).
    """

    store: Store
    inline: bool

    def run(self, query: Callable[[Store], Awaitable[_T]]) -> _T:
        """Return what ``query(store)`` returns, then close the store (also when it raises).

        Inline stores run it and the close without an event loop, others under ``anyio.run``.

        :raises RuntimeError: An inline store's read waited for something (a bug of the store).
        """
        if self.inline:
            try:
                return _now(query(self.store))  # type: ignore[arg-type]
            finally:
                _now(self.store.aclose())
        # The event loop only for stores whose reads wait: keeps the file store's reads cheap.
        import anyio  # noqa: PLC0415

        async def main() -> _T:
            try:
                return await query(self.store)
            finally:
                await self.store.aclose()

        return anyio.run(main)


def _now(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine that never waits to its end, without an event loop; return its value."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    msg = "a store read that needs no event loop waited for one"
    raise RuntimeError(msg)


def bare_store(assembly: Assembly) -> BareStore | None:
    """Return the assembly's store built on its own, or ``None`` when reading needs a runtime.

    Opening a :class:`~loopwright.Runtime` loads the plugins, builds the store, the record
    sinks and the engine, and checks that no granted file root holds the store or a sink. For an
    assembly that lists no ``plugins:`` and no ``records:``, keeps the default engine (``local``,
    no options), blocks no built-in plugin (``disablePlugins``, ``LOOPWRIGHT_DISABLE_PLUGINS``)
    and names a built-in store kind (``file``, ``sqlite``), all of that but the store is fixed
    and cannot fail, and no entry point is imported either; this builds that store and makes the
    same check. Anything else, and any problem found (invalid store options, a store inside a
    granted root), returns ``None``: opening a runtime then does it all, and words the problem
    as it always does.
    """
    found = _BUILTIN_STORES.get(assembly.store.kind)
    if (found is None or assembly.plugins or assembly.records or assembly.engine.kind != _DEFAULT_ENGINE
            or assembly.engine.options or any(name.startswith(_BUILTIN_PREFIX) for name in _blocked(assembly))):
        return None
    module, cls, inline = found
    from loopwright._capabilities import check_store_outside, resolve_roots  # noqa: PLC0415 - keeps ls and show cheap
    from loopwright.abc import StoreSettings  # noqa: PLC0415 - with the store's module

    base = assembly.base_dir
    try:
        factory = getattr(importlib.import_module(module), cls)
        store = factory(StoreSettings(kind=assembly.store.kind, base_dir=base, options=assembly.store.options))
    except LoopwrightError:
        return None
    try:
        check_store_outside(store.locations(), resolve_roots(assembly.capabilities, base), base=base)
    except LoopwrightError:
        _now(store.aclose())  # a built-in store's close never waits
        return None
    return BareStore(store=store, inline=inline)


def _blocked(assembly: Assembly) -> set[str]:
    """Return the plugin names blocked as :meth:`loopwright._plugins.PluginHost.load` blocks them."""
    names = set(assembly.disable_plugins)
    env = os.environ.get("LOOPWRIGHT_DISABLE_PLUGINS", "")
    names.update(n.strip() for n in env.split(",") if n.strip())
    return names

"""The commands that read the store: ``show``, ``ls`` and ``records``.

``show`` and ``ls`` read the store without a runtime when a bare store can serve the assembly
(:func:`loopwright._reading.bare_store`: a built-in store and nothing else to open), and without
an event loop for the file store; on any other assembly they open a runtime as every command
does. ``records`` opens a runtime and prints the record log as JSON lines. Each returns 0, or
exits 2 for an unknown instance.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import click

from loopwright import _reading
from loopwright._views import header_of
from loopwright.cli._exits import EXIT_OK
from loopwright.cli._opening import assembly, read_header, runtime, sync
from loopwright.cli._output import echo_json, print_instance, print_instances, print_tree
from loopwright.display import safe_json, safe_text
from loopwright.errors import shown_path

if TYPE_CHECKING:
    from loopwright._definition import Assembly
    from loopwright.abc import Store
    from loopwright.cli._settings import CliSettings

__all__ = ["ls", "records", "show"]


def show(settings: CliSettings, instance_id: str) -> int:
    """``loopwright show``: one instance's summary, and the tree of the agents it started."""
    async def query(store: Store) -> int:
        header = await read_header(store, instance_id)
        data = await _reading.instance_summary(store, instance_id)
        if settings.json:
            echo_json(data)
        else:
            print_instance(data, header_of(header))
        return EXIT_OK

    return _read(settings, query)


def ls(settings: CliSettings, state: str | None, tree: bool = False) -> int:
    """``loopwright ls``: every instance's summary, optionally only those in ``state``; or every tree.

    With none to list, the text output says so on stderr and names the store it looked in
    (``no instances in the file store at .loopwright/instances``: :func:`~loopwright.errors.shown_path`), so that
    a mistyped store path shows;
    ``--json`` prints ``[]``.
    """
    loaded = assembly(settings)

    async def query(store: Store) -> int:
        if tree:
            trees = await _reading.trees(store)
            if settings.json:
                echo_json(trees)
            elif not trees:
                click.echo(_none_in(store, loaded.store.kind, None), err=True)
            else:
                for node in trees:
                    print_tree(node)
            return EXIT_OK
        summaries = await _reading.list_instances(store, state)
        if settings.json:
            echo_json(summaries)
        elif not summaries:
            click.echo(_none_in(store, loaded.store.kind, state), err=True)
        else:
            print_instances(summaries)
        return EXIT_OK

    return _read(settings, query, loaded)


def _none_in(store: Store, kind: str, state: str | None) -> str:
    """Return the line ``ls`` prints when it finds nothing: which instances, and the store it looked in.

    The store is named by its kind and its first location (:meth:`Store.locations
    <loopwright.abc.Store.locations>`: the file store's folder, the sqlite database), with a note
    when nothing exists there yet; a store without locations (``postgres``) by its kind alone.
    """
    which = f"no instances in state {state!r}" if state else "no instances"
    where = next(iter(store.locations()), None)
    if where is None:
        return safe_text(f"{which} in the {kind} store")
    note = "" if os.path.exists(where) else " (nothing is there yet)"  # noqa: PTH110 - never raises
    return safe_text(f"{which} in the {kind} store at {shown_path(where)}{note}")


def _read(settings: CliSettings, query: Callable[[Store], Awaitable[int]], loaded: Assembly | None = None) -> int:
    """Run ``query`` on the assembly's store: a bare store when one serves it, else an opened runtime's.

    ``loaded`` is the assembly the options name, when the caller has loaded it already.
    """
    if loaded is None:
        loaded = assembly(settings)
    bare = _reading.bare_store(loaded)
    if bare is not None:
        return bare.run(query)

    @sync
    async def in_runtime() -> int:
        async with runtime(settings, loaded) as rt:
            return await query(rt.store)

    return in_runtime()


@sync
async def records(settings: CliSettings, instance_id: str, kinds: Sequence[str]) -> int:
    """``loopwright records``: the record log as JSON lines (``--json`` changes nothing), safe to show."""
    async with runtime(settings) as rt:
        await read_header(rt.store, instance_id)
        wanted = set(kinds)
        for record in await rt.records(instance_id):
            if not wanted or record.get("kind") in wanted:
                click.echo(safe_json(record, separators=(",", ":")))
        return EXIT_OK

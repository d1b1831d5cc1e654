"""Retention (seed 002): instance trees at rest longer than the assembly keeps them are deleted.

An assembly's ``retention: {instances: DURATION}`` (:class:`~loopwright._definition.Retention`)
says how long a tree of instances is kept after it last changed. :func:`expired_trees` lists
the trees past it; :func:`collect` deletes them (or, given ``dry_run``, only says which would
go). ``loopwright gc`` runs it, and so does every ``loopwright worker`` while it has nothing
else to do (:data:`WORKER_INTERVAL`).

What is never removed, however old: a tree any instance of which is running, queued for a
worker, held for an approval, asking the user a question (``ask_user``), or has unread
messages in its inbox. A tree goes whole (its root and every instance below it,
:func:`loopwright._threads.delete_tree`) or not at all: a child never goes alone, and a tree
one of whose instances another process holds is left for the next pass.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import attrs

from loopwright._threads import delete_tree
from loopwright.errors import InstanceLockedError, InstanceNotFoundError, LoopwrightError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from loopwright._run import LiveRuns
    from loopwright.abc import Store

__all__ = ["WORKER_INTERVAL", "Collected", "Expired", "collect", "expired_trees"]

#: How often (seconds) an idle worker applies the retention, at most.
WORKER_INTERVAL = 300.0

#: The states a tree may be removed in: every instance of it must rest in one of them.
_AT_REST = frozenset({"waiting", "stopped", "error"})


@attrs.frozen
class Expired:
    """A tree past its retention.

    Attributes:
        root: The root's id.
        ids: Every instance of the tree, the root first.
        name: The root's definition name.
        updated_at: When the tree last changed (its newest ``updatedAt``), ISO 8601.
    """

    root: str
    ids: tuple[str, ...]
    name: str
    updated_at: str


@attrs.frozen
class Collected:
    """What one pass of :func:`collect` did.

    Attributes:
        expired: The trees past their retention, in the order they were handled.
        deleted: The ids deleted (empty on a dry run), children before their spawner.
        skipped: ``(root, reason)`` of the trees left for the next pass (held by another process,
            changed since they were listed).
        dry_run: Whether nothing was deleted on purpose.
    """

    expired: tuple[Expired, ...]
    deleted: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    dry_run: bool


def _when(text: Any) -> dt.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def _held(header: Mapping[str, Any]) -> bool:
    """Whether an instance must stay whatever its age: running, queued, held, asking, or with unread mail."""
    return (header.get("state") not in _AT_REST or bool(header.get("queued"))
            or bool(header.get("pendingApprovals")) or bool(header.get("awaitingAnswer"))
            or bool(header.get("inbox")))


def expired_trees(headers: Sequence[Mapping[str, Any]], keep: float, *, now: dt.datetime) -> list[Expired]:
    """Return the trees of ``headers`` (as :meth:`Store.list_headers` gives them) unchanged for longer than ``keep`` s.

    A tree is a root (no ``spawnerInstanceId``) and the instances its ``children`` lead to. It
    is expired when no instance of it is held (see the module docstring) and its newest
    ``updatedAt`` is more than ``keep`` seconds before ``now``. A header without a readable
    ``updatedAt`` keeps its tree. Oldest trees first.
    """
    by_id: dict[str, Mapping[str, Any]] = {str(h["instanceId"]): h for h in headers
                                           if isinstance(h.get("instanceId"), str)}
    cutoff = now - dt.timedelta(seconds=keep)
    out: list[tuple[dt.datetime, Expired]] = []
    for root_id, root in by_id.items():
        if root.get("spawnerInstanceId"):
            continue
        ids: list[str] = []
        pending: list[str] = [root_id]
        newest: dt.datetime | None = None
        keep_it = False
        while pending and not keep_it:
            current = pending.pop()
            if current in ids:
                continue
            header = by_id.get(current)
            if header is None:  # a child listed but not (or no longer) there: nothing of it to hold
                continue
            ids.append(current)
            when = _when(header.get("updatedAt"))
            keep_it = _held(header) or when is None
            if when is not None and (newest is None or when > newest):
                newest = when
            children = header.get("children")
            pending.extend(c for c in (children if isinstance(children, list) else []) if isinstance(c, str))
        if keep_it or newest is None or newest > cutoff:
            continue
        out.append((newest, Expired(root=str(root_id), ids=tuple(ids), name=str(root.get("name") or ""),
                                    updated_at=newest.isoformat())))
    out.sort(key=lambda pair: pair[0])
    return [expired for _when_, expired in out]


async def collect(store: Store, live: LiveRuns, owner: str, keep: float, *, dry_run: bool = False,
                  now: dt.datetime | None = None, limit: int | None = None) -> Collected:
    """Delete the trees of ``store`` past ``keep`` seconds (at most ``limit`` trees); see the module docstring.

    Each tree is checked again just before it goes (its headers read anew): one that changed
    since the listing, or that another process holds, is skipped, never forced.

    :raises StoreError: The store cannot delete (its plugin does not implement ``delete``).
    """
    now = now or dt.datetime.now(dt.UTC)
    expired = expired_trees(await store.list_headers(), keep, now=now)
    if limit is not None:
        expired = expired[:limit]
    deleted: list[str] = []
    skipped: list[tuple[str, str]] = []
    if dry_run:
        return Collected(tuple(expired), (), (), dry_run=True)
    for tree in expired:
        try:
            fresh = [await store.read_header(i) for i in tree.ids]
        except InstanceNotFoundError:
            skipped.append((tree.root, "changed since it was listed"))
            continue
        if not expired_trees(fresh, keep, now=now):
            skipped.append((tree.root, "changed since it was listed"))
            continue
        try:
            deleted.extend(await delete_tree(store, live, owner, tree.root))
        except InstanceLockedError as exc:
            skipped.append((tree.root, str(exc)))
        except InstanceNotFoundError:
            skipped.append((tree.root, "deleted by someone else"))
        except LoopwrightError as exc:
            if type(exc) is not LoopwrightError:  # a StoreError: the store cannot delete at all
                raise
            skipped.append((tree.root, str(exc)))
    return Collected(tuple(expired), tuple(deleted), tuple(skipped), dry_run=False)

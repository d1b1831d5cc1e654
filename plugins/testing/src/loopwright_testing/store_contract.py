"""A contract test class that store plugins subclass to check what :class:`~loopwright.abc.Store` promises.

Usage, in a store plugin's tests::

    from loopwright.abc import StoreSettings
    from loopwright_testing.store_contract import StoreContract

    class TestMyStore(StoreContract):
        def make_store(self, tmp_path):
            return MyStore(StoreSettings(kind="mine", base_dir=tmp_path, options={...}))

Each test gets a fresh, empty store from :meth:`~StoreContract.make_store` (which may be
``async def``) and closes it afterwards. Some checks need *a second store over the same data*,
standing for another process (another runtime) looking at the same instances:
:meth:`~StoreContract.make_second_store` gives it. Its default calls ``make_store(tmp_path)``
again, which is right for stores whose data is a path under ``tmp_path``; a store keyed
otherwise (a database schema made per test, say) overrides it, and a store that cannot be shared
returns ``None`` from it, which skips those checks. A store that cannot lock (the
:class:`~loopwright.abc.Store` default grants every lease) sets :attr:`~StoreContract.locks` to
``False``, which skips the lease checks.

The checks are generic, drawn from the :class:`~loopwright.abc.Store` docstrings:

* create, a duplicate id (:class:`~loopwright.errors.StoreError` naming the instance, the first
  header kept), and every per-instance method on an unknown id
  (:class:`~loopwright.errors.InstanceNotFoundError`, creating nothing);
* headers round-trip (unicode, nested mappings, a ``MappingProxyType``) and are replaced whole;
* entries and records come back in order, across many appends, from a second store too;
* ``list_headers`` sorts by ``createdAt`` (a header without one first) and then by id;
* leases: a second acquire fails with :class:`~loopwright.errors.InstanceLockedError` (in the
  same store and in a second one), release frees, a second release is harmless, ``aclose``
  frees what is still held; ``create_leased`` creates with the creator's lease held;
* the mailbox: cursor semantics, several posts, posts from a second store while the first holds
  the lease, a post with an ``id`` landing once (retried here or by a second store);
* invalid ids (``..``, ``/``, empty, too long, not a string, ...) raise StoreError and write
  nothing; ids of letters, digits and ``_ . -`` work;
* an item that is not a JSON-ready mapping raises StoreError and none of its batch is written;
* delete under the lease removes the header, the logs and the mailbox (seen by a second store
  too), leaves the others, frees the id for a new instance and its lease; a store that cannot
  delete sets ``deletes = False`` and must refuse with StoreError, deleting nothing.

Cross-process checks that need a real second process (a lease holder that is SIGKILLed) depend
on how the store is opened, so they belong in the store's own tests; so does any timing.

The tests are marked ``anyio``: they run under every backend the subclass's ``anyio_backend``
fixture gives (anyio's default is asyncio).
"""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from loopwright.abc import Lease, Store, new_post_id
from loopwright.errors import InstanceLockedError, InstanceNotFoundError, StoreError

__all__ = ["StoreContract"]

#: Ids every store must refuse (:data:`loopwright.INSTANCE_ID_RULE`): they could name a path
#: outside a store folder, or confuse one, or read as an option on a command line (``-rf``).
INVALID_IDS: tuple[object, ...] = (
    "../x", "..", ".", "", "a/b", "/etc/passwd", "a\\b", "a\x00b", ".hidden", "a..b",
    "x" * 129, "tab\t", "new\nline", "é", " lead", "-x", "-rf", "--help", None, 7,
)

#: Ids every store must accept (the runtime makes ids like the last one).
VALID_IDS: tuple[str, ...] = ("a", "A-1_b.c", "x-", "_", "_-x", "9" * 128, "20261130-003036-ffc119ad")


async def _made(value: Store | Awaitable[Store | None] | None) -> Store | None:
    if inspect.isawaitable(value):
        value = await value
    assert value is None or isinstance(value, Store), f"expected a Store, got {type(value).__name__}"
    return value


class StoreContract:
    """Subclass as ``Test<Something>`` and implement :meth:`make_store`.

    Attributes:
        locks: Whether :meth:`~loopwright.abc.Store.acquire` excludes a second runner
            (``False`` skips the lease checks).
        invalid_ids: Ids every method must refuse with StoreError.
        valid_ids: Ids that must work end to end.
        deletes: Whether the store implements :meth:`~loopwright.abc.Store.delete` (``False``
            checks instead that it refuses with StoreError and deletes nothing).
    """

    locks: ClassVar[bool] = True
    deletes: ClassVar[bool] = True
    invalid_ids: ClassVar[tuple[object, ...]] = INVALID_IDS
    valid_ids: ClassVar[tuple[str, ...]] = VALID_IDS

    # -- hooks for the store author ---------------------------------------------------------------

    def make_store(self, tmp_path: Path) -> Store | Awaitable[Store]:
        """Return a fresh, empty store to check; may be ``async def``. Each test gets its own."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_store()")

    def make_second_store(self, tmp_path: Path, first: Store) -> Store | Awaitable[Store | None] | None:
        """Return another store over the same data as ``first`` (another process's view), or ``None``.

        The default calls ``make_store(tmp_path)`` again. ``None`` skips the checks that need it.
        May be ``async def``.
        """
        del first
        return self.make_store(tmp_path)

    # -- fixtures -------------------------------------------------------------------------------

    @pytest.fixture
    async def store(self, tmp_path: Path, anyio_backend: Any) -> AsyncIterator[Store]:
        """Yield the store from :meth:`make_store` and close it after the test."""
        del anyio_backend  # requested so that anyio's plugin runs this fixture
        made = await _made(self.make_store(tmp_path))
        assert made is not None, "make_store() returned None"
        try:
            yield made
        finally:
            await made.aclose()

    @pytest.fixture
    async def second_store(self, store: Store, tmp_path: Path) -> AsyncIterator[Store]:
        """Yield a second store over the same data (skip when there is none), closed after the test."""
        made = await _made(self.make_second_store(tmp_path, store))
        if made is None:
            pytest.skip(f"{type(self).__name__} has no second store over the same data")
        assert made is not store, "make_second_store() returned the first store itself"
        try:
            yield made
        finally:
            await made.aclose()

    def _needs_locks(self) -> None:
        if not self.locks:
            pytest.skip(f"{type(self).__name__} does not lock (locks = False)")

    def _per_instance_calls(
        self, store: Store, instance_id: Any, *, create: bool = False,
    ) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
        """Return a call of every per-instance method on ``instance_id`` (``create`` too if asked)."""
        calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("write_header", lambda: store.write_header(instance_id, {"v": 1})),
            ("read_header", lambda: store.read_header(instance_id)),
            ("append_entries", lambda: store.append_entries(instance_id, [{"a": 1}])),
            ("read_entries", lambda: store.read_entries(instance_id)),
            ("append_records", lambda: store.append_records(instance_id, [{"a": 1}])),
            ("read_records", lambda: store.read_records(instance_id)),
            ("post", lambda: store.post(instance_id, {"type": "message", "text": "hi"})),
            ("read_posts", lambda: store.read_posts(instance_id, 0)),
        ]
        if create:
            calls.insert(0, ("create", lambda: store.create(instance_id, {"id": "bad"})))
        if self.locks:
            calls.append(("acquire", lambda: store.acquire(instance_id, "tester")))
        if self.deletes:
            calls.append(("delete", lambda: store.delete(instance_id)))
        return calls

    # -- create and headers ------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_create_then_read_header(self, store: Store) -> None:
        """create() stores the header and read_header() returns it as a new dict."""
        await store.create("inst-1", {"state": "running", "n": 1})
        header = await store.read_header("inst-1")
        assert type(header) is dict
        assert header == {"state": "running", "n": 1}
        header["state"] = "changed here"
        assert await store.read_header("inst-1") == {"state": "running", "n": 1}

    @pytest.mark.anyio
    async def test_duplicate_id_raises_and_keeps_the_first(self, store: Store) -> None:
        """create() with an id that exists raises StoreError naming the instance; the first header stays."""
        await store.create("dup", {"v": 1})
        with pytest.raises(StoreError) as info:
            await store.create("dup", {"v": 2})
        assert not isinstance(info.value, InstanceNotFoundError)
        assert info.value.instance_id == "dup"
        assert await store.read_header("dup") == {"v": 1}

    @pytest.mark.anyio
    async def test_unknown_instance_raises_not_found_and_creates_nothing(self, store: Store) -> None:
        """Every per-instance method raises InstanceNotFoundError naming an unknown id, and creates nothing."""
        await store.create("other", {"id": "other"})
        for name, call in self._per_instance_calls(store, "nope"):
            with pytest.raises(InstanceNotFoundError) as info:
                await call()
            assert info.value.instance_id == "nope", f"{name}() named {info.value.instance_id!r}"
        with pytest.raises(InstanceNotFoundError):
            await store.read_header("nope")  # write_header and the appends did not create it
        assert [h["id"] for h in await store.list_headers()] == ["other"]

    @pytest.mark.anyio
    async def test_header_round_trip(self, store: Store) -> None:
        """Headers round-trip unicode, nested lists and mappings, and a MappingProxyType as a plain object."""
        header = {
            "state": "running",
            "capabilities": {"files": {"read": ["/srv/data"], "write": []}, "shell": "none"},
            "delegationPrompt": 'héllo ✓ 漢字 \u2028 "quoted" \n newline',
            "nested": types.MappingProxyType({"a": 1, "b": types.MappingProxyType({"c": [1, 2.5, None]})}),
            "flags": [True, False, None, 0, -1, 1.5],
            "empty": {},
        }
        await store.create("rt", header)
        expected = {**header, "nested": {"a": 1, "b": {"c": [1, 2.5, None]}}}
        assert await store.read_header("rt") == expected
        await store.write_header("rt", types.MappingProxyType({**expected, "state": "stopped"}))
        assert await store.read_header("rt") == {**expected, "state": "stopped"}

    @pytest.mark.anyio
    async def test_write_header_replaces_the_whole_header(self, store: Store, second_store: Store) -> None:
        """write_header() replaces the header whole (no key of the old one is kept), as another store sees it."""
        await store.create("wh", {"state": "running", "old": "gone soon", "createdAt": "2026-01-01T00:00:00Z"})
        await store.write_header("wh", {"state": "stopped", "createdAt": "2026-01-01T00:00:00Z"})
        assert await store.read_header("wh") == {"state": "stopped", "createdAt": "2026-01-01T00:00:00Z"}
        assert await second_store.read_header("wh") == {"state": "stopped", "createdAt": "2026-01-01T00:00:00Z"}
        await second_store.write_header("wh", {"state": "waiting"})
        assert await store.read_header("wh") == {"state": "waiting"}

    @pytest.mark.anyio
    async def test_headers_that_are_not_json_ready_are_refused(self, store: Store) -> None:
        """A header that is not JSON-ready raises StoreError; create() makes nothing, write_header() keeps the old."""
        for bad in ({"x": {1, 2}}, {"x": math.nan}, {"x": object()}):
            with pytest.raises(StoreError) as info:
                await store.create("bad", bad)
            assert not isinstance(info.value, InstanceNotFoundError)
        with pytest.raises(InstanceNotFoundError):
            await store.read_header("bad")
        assert await store.list_headers() == []
        await store.create("good", {"v": 1})
        with pytest.raises(StoreError):
            await store.write_header("good", {"x": math.inf})
        assert await store.read_header("good") == {"v": 1}

    @pytest.mark.anyio
    async def test_list_headers_sorted_by_created_at_then_id(self, store: Store, second_store: Store) -> None:
        """list_headers() returns every header, sorted by createdAt (none first) and then by id, in any store."""
        assert await store.list_headers() == []
        await store.create("b", {"id": "b", "createdAt": "2026-01-02T00:00:00Z"})
        await store.create("a", {"id": "a", "createdAt": "2026-01-02T00:00:00Z"})
        await store.create("c", {"id": "c", "createdAt": "2026-01-01T00:00:00Z"})
        await store.create("z", {"id": "z"})
        await second_store.create("d", {"id": "d", "createdAt": "2026-01-03T00:00:00Z"})
        for s in (store, second_store):
            assert [h["id"] for h in await s.list_headers()] == ["z", "c", "a", "b", "d"]
        await store.write_header("z", {"id": "z", "createdAt": "2026-01-04T00:00:00Z"})
        assert [h["id"] for h in await store.list_headers()] == ["c", "a", "b", "d", "z"]
        assert (await store.list_headers())[0] == {"id": "c", "createdAt": "2026-01-01T00:00:00Z"}

    # -- logs -------------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_entries_and_records_round_trip_in_order(self, store: Store, second_store: Store) -> None:
        """Entries and records are separate logs that come back in append order, from another store too."""
        await store.create("log", {})
        assert await store.read_entries("log") == []
        assert await store.read_records("log") == []
        await store.append_entries("log", [{"n": 0}, {"n": 1, "text": "é\n\u2028 ✓"}])
        await store.append_entries("log", [])
        await store.append_entries("log", [types.MappingProxyType({"n": 2, "m": types.MappingProxyType({"k": []})})])
        await store.append_records("log", [{"kind": "turn", "n": 0}])
        await store.append_records("log", [{"kind": "tool", "n": 1}, {"kind": "turn", "n": 2}])
        entries = [{"n": 0}, {"n": 1, "text": "é\n\u2028 ✓"}, {"n": 2, "m": {"k": []}}]
        records = [{"kind": "turn", "n": 0}, {"kind": "tool", "n": 1}, {"kind": "turn", "n": 2}]
        for s in (store, second_store):
            assert await s.read_entries("log") == entries
            assert await s.read_records("log") == records

    @pytest.mark.anyio
    async def test_many_appends_keep_their_order(self, store: Store) -> None:
        """Hundreds of appends, single and batched, interleaved over two instances, read back in order."""
        await store.create("one", {})
        await store.create("two", {})
        for n in range(300):
            await store.append_entries("one", [{"n": n}])
            await store.append_entries("two", [{"n": -n}])
        await store.append_entries("one", [{"n": n} for n in range(300, 600)])
        assert [e["n"] for e in await store.read_entries("one")] == list(range(600))
        assert [e["n"] for e in await store.read_entries("two")] == [-n for n in range(300)]
        assert await store.read_records("one") == []

    @pytest.mark.anyio
    async def test_appends_of_one_store_are_read_by_a_new_one(self, store: Store, tmp_path: Path) -> None:
        """What append_entries() wrote before the store closed is read by a store opened afterwards."""
        await store.create("dur", {"v": 1})
        await store.append_entries("dur", [{"n": 0}, {"n": 1}])
        await store.append_records("dur", [{"kind": "x"}])
        await store.aclose()
        later = await _made(self.make_second_store(tmp_path, store))
        if later is None:
            pytest.skip(f"{type(self).__name__} has no second store over the same data")
        try:
            assert await later.read_header("dur") == {"v": 1}
            assert await later.read_entries("dur") == [{"n": 0}, {"n": 1}]
            assert await later.read_records("dur") == [{"kind": "x"}]
        finally:
            await later.aclose()

    @pytest.mark.anyio
    async def test_items_that_are_not_json_ready_are_refused_writing_nothing(self, store: Store) -> None:
        """A batch holding an item that is not a JSON-ready mapping raises StoreError, and none of it is written."""
        await store.create("rej", {})
        bad_batches: list[list[Any]] = [
            [{"ok": 1}, {"s": {1}}],
            [{"ok": 1}, ["not", "a", "mapping"]],
            [{"ok": 1}, "text"],
            [{"x": math.inf}],
            [{"ok": 1}, {"f": object()}],
        ]
        for batch in bad_batches:
            for append in (store.append_entries, store.append_records):
                with pytest.raises(StoreError) as info:
                    await append("rej", batch)
                assert not isinstance(info.value, InstanceNotFoundError)
                assert info.value.instance_id == "rej"
        for item in ({"s": {1}}, {"x": math.nan}, ["a list"]):
            with pytest.raises(StoreError):
                await store.post("rej", item)  # type: ignore[arg-type]
        assert await store.read_entries("rej") == []
        assert await store.read_records("rej") == []
        assert (await store.read_posts("rej", 0))[0] == []
        await store.append_entries("rej", [{"after": True}])
        assert await store.read_entries("rej") == [{"after": True}]

    # -- leases -----------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_a_second_acquire_fails_until_release(self, store: Store) -> None:
        """A held lease makes a second acquire() raise InstanceLockedError at once; after release() it works."""
        self._needs_locks()
        await store.create("lk", {"runner": "runner-a"})
        lease = await store.acquire("lk", "runner-a")
        assert isinstance(lease, Lease)
        with pytest.raises(InstanceLockedError) as info:
            await store.acquire("lk", "runner-b")
        assert info.value.instance_id == "lk"
        lease.release()
        again = await store.acquire("lk", "runner-b")
        with pytest.raises(InstanceLockedError):
            await store.acquire("lk", "runner-a")
        again.release()

    @pytest.mark.anyio
    async def test_a_lease_excludes_a_second_store(self, store: Store, second_store: Store) -> None:
        """A lease held through one store makes acquire() through another raise InstanceLockedError, both ways."""
        self._needs_locks()
        await store.create("shared", {})
        lease = await store.acquire("shared", "first")
        with pytest.raises(InstanceLockedError) as info:
            await second_store.acquire("shared", "second")
        assert info.value.instance_id == "shared"
        lease.release()
        other = await second_store.acquire("shared", "second")
        with pytest.raises(InstanceLockedError):
            await store.acquire("shared", "first")
        other.release()
        (await store.acquire("shared", "first")).release()

    @pytest.mark.anyio
    async def test_create_leased_creates_with_the_lease_held(self, store: Store, second_store: Store) -> None:
        """create_leased() creates the instance with its lease held by the creator, for every other runner."""
        self._needs_locks()
        lease = await store.create_leased("cl", {"runner": "creator"}, "creator")
        assert isinstance(lease, Lease)
        assert (await second_store.read_header("cl"))["runner"] == "creator"
        with pytest.raises(InstanceLockedError):
            await second_store.acquire("cl", "worker")
        with pytest.raises(InstanceLockedError):
            await store.acquire("cl", "worker")
        lease.release()
        (await second_store.acquire("cl", "worker")).release()
        with pytest.raises(StoreError):
            await store.create_leased("cl", {}, "again")

    @pytest.mark.anyio
    async def test_release_twice_is_harmless(self, store: Store, second_store: Store) -> None:
        """Calling release() again does nothing: it does not free a lease someone else took meanwhile."""
        self._needs_locks()
        await store.create("twice", {})
        lease = await store.acquire("twice", "first")
        lease.release()
        lease.release()
        taken = await second_store.acquire("twice", "second")
        lease.release()
        with pytest.raises(InstanceLockedError):
            await store.acquire("twice", "third")
        taken.release()

    @pytest.mark.anyio
    async def test_leases_of_instances_are_independent(self, store: Store) -> None:
        """Holding one instance's lease does not block another instance's."""
        self._needs_locks()
        await store.create("i1", {})
        await store.create("i2", {})
        first = await store.acquire("i1", "me")
        second = await store.acquire("i2", "me")
        first.release()
        second.release()

    @pytest.mark.anyio
    async def test_aclose_releases_the_leases_it_holds(self, store: Store, tmp_path: Path) -> None:
        """aclose() gives back every lease still held, so another store can take it."""
        self._needs_locks()
        await store.create("rel", {})
        await store.acquire("rel", "forgetful")
        await store.aclose()
        other = await _made(self.make_second_store(tmp_path, store))
        if other is None:
            pytest.skip(f"{type(self).__name__} has no second store over the same data")
        try:
            (await other.acquire("rel", "next")).release()
        finally:
            await other.aclose()

    # -- mailbox ----------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_read_posts_cursor_semantics(self, store: Store) -> None:
        """read_posts() returns the items after the cursor in order, and the same cursor when nothing is new."""
        await store.create("mb", {})
        items, cursor = await store.read_posts("mb", 0)
        assert (items, cursor) == ([], 0)
        assert await store.read_posts("mb", cursor) == ([], cursor)
        await store.post("mb", {"type": "message", "text": "one ✓"})
        await store.post("mb", types.MappingProxyType({"type": "message", "text": "two", "meta": {"n": 2}}))
        items, after_two = await store.read_posts("mb", cursor)
        assert items == [{"type": "message", "text": "one ✓"}, {"type": "message", "text": "two", "meta": {"n": 2}}]
        assert isinstance(after_two, int)
        assert after_two != cursor
        assert await store.read_posts("mb", after_two) == ([], after_two)
        await store.post("mb", {"type": "cancel"})
        items, after_three = await store.read_posts("mb", after_two)
        assert items == [{"type": "cancel"}]
        assert await store.read_posts("mb", after_three) == ([], after_three)
        everything, end = await store.read_posts("mb", 0)
        assert [i["type"] for i in everything] == ["message", "message", "cancel"]
        assert end == after_three

    @pytest.mark.anyio
    async def test_posts_are_per_instance(self, store: Store) -> None:
        """A post reaches only its own instance's mailbox."""
        await store.create("m1", {})
        await store.create("m2", {})
        await store.post("m1", {"to": "m1"})
        assert (await store.read_posts("m2", 0))[0] == []
        assert (await store.read_posts("m1", 0))[0] == [{"to": "m1"}]

    @pytest.mark.anyio
    async def test_posts_from_a_second_store_reach_the_lease_holder(self, store: Store, second_store: Store) -> None:
        """While one store holds the lease, another store posts, and the holder reads the posts in order."""
        await store.create("steer", {})
        lease = await store.acquire("steer", "runner")
        try:
            items, cursor = await store.read_posts("steer", 0)
            assert items == []
            await second_store.post("steer", {"type": "message", "text": "from elsewhere"})
            await second_store.post("steer", {"type": "cancel"})
            items, cursor = await store.read_posts("steer", cursor)
            assert items == [{"type": "message", "text": "from elsewhere"}, {"type": "cancel"}]
            assert await store.read_posts("steer", cursor) == ([], cursor)
            await store.post("steer", {"type": "message", "text": "from here"})
            assert (await second_store.read_posts("steer", cursor))[0] == [{"type": "message", "text": "from here"}]
        finally:
            lease.release()

    @pytest.mark.anyio
    async def test_a_post_with_an_id_lands_once(self, store: Store) -> None:
        """post() is idempotent by the item's ``id``: the same id again adds nothing; other ids and no id do."""
        await store.create("once", {})
        await store.create("other", {})
        first = {"id": new_post_id(), "type": "message", "text": "hi ✓"}
        await store.post("once", first)
        _items, cursor = await store.read_posts("once", 0)
        await store.post("once", first)  # a retry whose first attempt landed
        await store.post("once", {**first, "text": "a retry that differs is still the same post"})
        assert await store.read_posts("once", cursor) == ([], cursor)
        second = {"id": new_post_id(), "type": "cancel"}
        await store.post("once", second)
        await store.post("once", {"type": "message", "text": "no id"})
        await store.post("once", {"type": "message", "text": "no id"})
        await store.post("other", first)  # ids are per instance
        items, _end = await store.read_posts("once", 0)
        assert items == [first, second, {"type": "message", "text": "no id"}, {"type": "message", "text": "no id"}]
        assert (await store.read_posts("other", 0))[0] == [first]

    @pytest.mark.anyio
    async def test_a_post_id_is_recognised_by_a_second_store(self, store: Store, second_store: Store) -> None:
        """A post retried by another store (another process) over the same data lands once too."""
        await store.create("twice", {})
        item = {"id": new_post_id(), "type": "message", "text": "from two places"}
        await store.post("twice", item)
        await second_store.post("twice", item)
        assert (await store.read_posts("twice", 0))[0] == [item]

    # -- ids --------------------------------------------------------------------------------------

    # -- deleting --------------------------------------------------------------------------------

    async def _filled(self, store: Store, instance_id: str) -> None:
        await store.create(instance_id, {"id": instance_id, "createdAt": "2026-01-01T00:00:00Z"})
        await store.append_entries(instance_id, [{"t": "msg", "n": 1}, {"t": "msg", "n": 2}])
        await store.append_records(instance_id, [{"kind": "r"}])
        await store.post(instance_id, {"id": "p1", "type": "message", "text": "hi"})

    @pytest.mark.anyio
    async def test_delete_removes_everything_and_the_id_can_be_used_again(
            self, store: Store, second_store: Store) -> None:
        """After delete() under the lease, nothing of the instance is read by this store or another; others stay."""
        await self._filled(store, "gone")
        await self._filled(store, "kept")
        lease = await store.acquire("gone", "deleter")
        if not self.deletes:
            with pytest.raises(StoreError):
                await store.delete("gone")
            lease.release()
            assert (await store.read_header("gone"))["id"] == "gone"
            return
        await store.delete("gone")
        lease.release()  # after a delete: must not fail
        for reader in (store, second_store):
            with pytest.raises(InstanceNotFoundError):
                await reader.read_header("gone")
            with pytest.raises(InstanceNotFoundError):
                await reader.read_entries("gone")
            assert [h["id"] for h in await reader.list_headers()] == ["kept"]
            assert [e["n"] for e in await reader.read_entries("kept")] == [1, 2]
        await store.create("gone", {"id": "gone", "again": True})
        assert await store.read_entries("gone") == []
        assert await store.read_records("gone") == []
        assert (await store.read_posts("gone", 0))[0] == []
        assert (await second_store.read_header("gone"))["again"] is True
        again = await second_store.acquire("gone", "next")  # the id's lease is free for its new instance
        again.release()

    @pytest.mark.anyio
    async def test_delete_of_an_unknown_instance_raises_not_found(self, store: Store) -> None:
        """delete() of an id no instance has raises InstanceNotFoundError."""
        if not self.deletes:
            pytest.skip(f"{type(self).__name__} does not delete (deletes = False)")
        with pytest.raises(InstanceNotFoundError):
            await store.delete("never-was")

    @pytest.mark.anyio
    async def test_invalid_ids_are_refused_everywhere(self, store: Store) -> None:
        """Ids that could escape or confuse a store raise StoreError in every method, and nothing is written."""
        await store.create("victim", {"id": "victim"})
        for bad in self.invalid_ids:
            for name, call in self._per_instance_calls(store, bad, create=True):
                try:
                    await call()
                except StoreError:
                    continue
                pytest.fail(f"{name}({bad!r}) did not raise StoreError")
        assert await store.list_headers() == [{"id": "victim"}]
        assert await store.read_entries("victim") == []

    @pytest.mark.anyio
    async def test_valid_ids_work_end_to_end(self, store: Store) -> None:
        """Ids of letters, digits and ``_ . -`` (up to 128 characters) work in every method."""
        for good in self.valid_ids:
            await store.create(good, {"id": good})
            await store.append_entries(good, [{"n": 1}])
            await store.append_records(good, [{"r": 1}])
            await store.post(good, {"p": 1})
            assert await store.read_entries(good) == [{"n": 1}]
            assert await store.read_records(good) == [{"r": 1}]
            assert (await store.read_posts(good, 0))[0] == [{"p": 1}]
            if self.locks:
                (await store.acquire(good, "tester")).release()
        assert sorted(h["id"] for h in await store.list_headers()) == sorted(self.valid_ids)

    # -- lifetime ---------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_appends_after_aclose_raise_store_error(self, store: Store) -> None:
        """After aclose(), appends raise StoreError rather than writing or failing some other way."""
        await store.create("closed", {})
        await store.append_entries("closed", [{"n": 0}])
        await store.aclose()
        with pytest.raises(StoreError):
            await store.append_entries("closed", [{"n": 1}])
        with pytest.raises(StoreError):
            await store.append_records("closed", [{"n": 1}])

    @pytest.mark.anyio
    async def test_locations_are_paths(self, store: Store) -> None:
        """locations() returns absolute paths (or nothing), so the runtime can keep granted roots off them."""
        locations = store.locations()
        assert all(isinstance(p, Path) and p.is_absolute() for p in locations), locations
        assert isinstance(locations, (list, tuple))

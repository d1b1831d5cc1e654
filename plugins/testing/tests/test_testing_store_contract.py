"""The store contract kit: it passes the file store, and each of its checks fails a store broken its way."""

from __future__ import annotations

import re

from lwtesting_tools import run_pytest

from loopwright.abc import StoreSettings
from loopwright.builtins.file_store import FileStore
from loopwright_testing.store_contract import StoreContract


class TestFileStoreKeepsTheContract(StoreContract):
    """The reference store passes every check of the kit."""

    def make_store(self, tmp_path):
        return FileStore(StoreSettings(kind="file", base_dir=tmp_path))


# Each broken store breaks one promise of the Store ABC; the checks listed with it must fail.
BROKEN_STORES = """
import json, types
from loopwright.abc import Lease, StoreSettings
from loopwright.builtins.file_store import FileStore
from loopwright.errors import InstanceLockedError, StoreError
from loopwright_testing.store_contract import StoreContract

class Base(StoreContract):
    store_class = FileStore
    def make_store(self, tmp_path):
        return self.store_class(StoreSettings(kind="file", base_dir=tmp_path))

class SharedHeader(FileStore):
    _cache = None
    async def read_header(self, iid):
        if self._cache is None:
            self._cache = await super().read_header(iid)
        return self._cache

class OverwritesDuplicates(FileStore):
    async def create(self, iid, header):
        try:
            await super().create(iid, header)
        except StoreError:
            await self.write_header(iid, header)

class EmptyForUnknown(FileStore):
    async def read_entries(self, iid):
        try:
            return await super().read_entries(iid)
        except StoreError:
            return []

class NaiveJson(FileStore):
    async def create(self, iid, header):
        json.dumps(header)  # a MappingProxyType is not a dict to the plain encoder
        await super().create(iid, header)

class MergesHeaders(FileStore):
    async def write_header(self, iid, header):
        await super().write_header(iid, {**await self.read_header(iid), **header})

class LaxJson(FileStore):
    async def create(self, iid, header):
        await super().create(iid, json.loads(json.dumps(dict(header), default=str)))

class SortedById(FileStore):
    async def list_headers(self):
        return sorted(await super().list_headers(), key=lambda h: h["id"])

class Reversed(FileStore):
    async def read_entries(self, iid):
        return list(reversed(await super().read_entries(iid)))

class Buffered(FileStore):
    def __init__(self, settings):
        super().__init__(settings)
        self.buffer = {}
    async def append_entries(self, iid, entries):
        await self.read_header(iid)
        self.buffer.setdefault(iid, []).extend(dict(e) for e in entries)
    async def read_entries(self, iid):
        return await super().read_entries(iid) + self.buffer.get(iid, [])

class OneByOne(FileStore):
    async def append_entries(self, iid, entries):
        for e in entries:
            await super().append_entries(iid, [e])

class NoLock(FileStore):
    async def acquire(self, iid, owner):
        await self.read_header(iid)
        return Lease()

HELD = set()

class ProcessLock(Lease):
    def __init__(self, key):
        self.key = key
    def release(self):
        HELD.discard(self.key)  # not idempotent: frees whoever holds it now

class ProcessLocked(FileStore):
    async def acquire(self, iid, owner):
        await self.read_header(iid)
        key = (str(self.root), iid)
        if key in HELD:
            raise InstanceLockedError(iid)
        HELD.add(key)
        return ProcessLock(key)

class OneLockForAll(FileStore):
    async def acquire(self, iid, owner):
        return await super().acquire("all", owner)
    async def create(self, iid, header):
        await super().create(iid, header)
        if iid != "all":
            try:
                await super().create("all", {"hidden": True})
            except StoreError:
                pass
    async def list_headers(self):
        return [h for h in await super().list_headers() if not h.get("hidden")]

class PerStoreLock(FileStore):
    def __init__(self, settings):
        super().__init__(settings)
        self.held = set()
    async def acquire(self, iid, owner):
        await self.read_header(iid)
        if iid in self.held:
            raise InstanceLockedError(iid)
        self.held.add(iid)
        store = self
        class L(Lease):
            def release(self):
                store.held.discard(iid)
        return L()

class IgnoresCursor(FileStore):
    async def read_posts(self, iid, cursor):
        return await super().read_posts(iid, 0)

class OneMailbox(FileStore):
    async def post(self, iid, item):
        await super().post("box", item)
    async def read_posts(self, iid, cursor):
        await self.read_header(iid)
        try:
            return await super().read_posts("box", cursor)
        except StoreError:
            return [], cursor
    async def create(self, iid, header):
        await super().create(iid, header)
        try:
            await super().create("box", {"hidden": True})
        except StoreError:
            pass
    async def list_headers(self):
        return [h for h in await super().list_headers() if not h.get("hidden")]

class MemoryMailbox(FileStore):
    def __init__(self, settings):
        super().__init__(settings)
        self.mail = {}
    async def post(self, iid, item):
        await self.read_header(iid)
        json.dumps(item, allow_nan=False, default=dict)
        self.mail.setdefault(iid, []).append(dict(item))
    async def read_posts(self, iid, cursor):
        await self.read_header(iid)
        items = self.mail.get(iid, [])
        return items[cursor:], len(items)

class IgnoresPostIds(FileStore):
    # The id is kept under another key, out of the file store's sight: every post lands.
    async def post(self, iid, item):
        await super().post(iid, {k: v for k, v in item.items() if k != "id"} | {"_id": item.get("id")})
    async def read_posts(self, iid, cursor):
        items, end = await super().read_posts(iid, cursor)
        return [{k: v for k, v in i.items() if k != "_id"} | ({"id": i["_id"]} if i.get("_id") else {})
                for i in items], end

class PostIdsInMemory(IgnoresPostIds):
    # Remembers the ids this store posted, so a second store (another process) posts again.
    def __init__(self, settings):
        super().__init__(settings)
        self.seen = set()
    async def post(self, iid, item):
        key = (iid, item.get("id"))
        if item.get("id") and key in self.seen:
            return
        self.seen.add(key)
        await super().post(iid, item)

class LaxIds(FileStore):
    async def create(self, iid, header):
        if iid == "\\u00e9":
            iid = "e-acute"
        await super().create(iid, header)

class StrictIds(FileStore):  # stricter than the rule: refuses a valid id ending in a dash ("x-")
    async def create(self, iid, header):
        if iid.endswith("-"):
            raise StoreError("no trailing dash", instance_id=iid)
        await super().create(iid, header)

class NeverCloses(FileStore):
    async def aclose(self):
        pass

class UnleasedCreate(FileStore):
    async def create_leased(self, iid, header, owner):
        await super().create(iid, header)
        return Lease()  # holds nothing: any runner may take the new instance

class RelativeLocations(FileStore):
    def locations(self):
        return ("store",)

class HeaderOnlyDelete(FileStore):
    async def delete(self, iid):
        (self.root / iid / "instance.json").unlink()  # the logs and the mailbox stay behind

class QuietDelete(FileStore):
    async def delete(self, iid):
        if (self.root / iid / "instance.json").exists():
            await super().delete(iid)  # an unknown id is not an error here
"""

#: broken store -> the checks it must fail.
EXPECTED_FAILURES = {
    "SharedHeader": ["create_then_read_header"],
    "OverwritesDuplicates": ["duplicate_id_raises_and_keeps_the_first"],
    "EmptyForUnknown": ["unknown_instance_raises_not_found_and_creates_nothing"],
    "NaiveJson": ["header_round_trip"],
    "MergesHeaders": ["write_header_replaces_the_whole_header"],
    "LaxJson": ["headers_that_are_not_json_ready_are_refused"],
    "SortedById": ["list_headers_sorted_by_created_at_then_id"],
    "Reversed": ["entries_and_records_round_trip_in_order", "many_appends_keep_their_order"],
    "Buffered": ["appends_of_one_store_are_read_by_a_new_one"],
    "OneByOne": ["items_that_are_not_json_ready_are_refused_writing_nothing"],
    "NoLock": ["a_second_acquire_fails_until_release", "a_lease_excludes_a_second_store"],
    "ProcessLocked": ["release_twice_is_harmless", "aclose_releases_the_leases_it_holds"],
    "OneLockForAll": ["leases_of_instances_are_independent"],
    "PerStoreLock": ["a_lease_excludes_a_second_store"],
    "IgnoresCursor": ["read_posts_cursor_semantics"],
    "OneMailbox": ["posts_are_per_instance"],
    "MemoryMailbox": ["posts_from_a_second_store_reach_the_lease_holder"],
    "IgnoresPostIds": ["a_post_with_an_id_lands_once"],
    "PostIdsInMemory": ["a_post_id_is_recognised_by_a_second_store"],
    "LaxIds": ["invalid_ids_are_refused_everywhere"],
    "StrictIds": ["valid_ids_work_end_to_end"],
    "NeverCloses": ["appends_after_aclose_raise_store_error"],
    "UnleasedCreate": ["create_leased_creates_with_the_lease_held"],
    "RelativeLocations": ["locations_are_paths"],
    "HeaderOnlyDelete": ["delete_removes_everything_and_the_id_can_be_used_again"],
    "QuietDelete": ["delete_of_an_unknown_instance_raises_not_found"],
}


def test_every_check_fails_a_store_broken_its_way(tmp_path):
    """Each contract check fails for a store that breaks what it checks, so no check passes vacuously."""
    classes = "\n".join(
        f"class Test{name}(Base):\n    store_class = {name}\n" for name in EXPECTED_FAILURES
    )
    output = run_pytest(tmp_path, BROKEN_STORES + "\n" + classes)
    checks = {name[len("test_"):] for name in dir(StoreContract) if name.startswith("test_")}
    covered = {check for failing in EXPECTED_FAILURES.values() for check in failing}
    assert checks <= covered, f"checks no broken store fails: {sorted(checks - covered)}"
    for name, failing in EXPECTED_FAILURES.items():
        for check in failing:
            assert re.search(rf"Test{name}::test_{check}\[asyncio\] FAILED", output), (
                f"Test{name}::test_{check} did not fail:\n{output[-3000:]}")
    # A broken store is not a failing kit: the promises it keeps still pass.
    assert re.search(r"TestSortedById::test_header_round_trip\[asyncio\] PASSED", output), output[-3000:]
    assert re.search(r"TestMemoryMailbox::test_read_posts_cursor_semantics\[asyncio\] PASSED", output)
    assert re.search(r"TestPerStoreLock::test_a_second_acquire_fails_until_release\[asyncio\] PASSED", output)

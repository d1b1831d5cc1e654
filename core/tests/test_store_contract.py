"""The store contract kit (``loopwright_testing.store_contract``) run against the built-in stores."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from loopwright.abc import StoreSettings
from loopwright.builtins.file_store import FileStore
from loopwright.builtins.sqlite_store import SqliteStore

if TYPE_CHECKING:
    from pathlib import Path

# The core suite does not otherwise depend on other distributions: without the testing kit
# installed, this module is skipped.
StoreContract = pytest.importorskip("loopwright_testing.store_contract").StoreContract


class TestFileStoreContract(StoreContract):
    """The ``file`` store keeps the store contract."""

    def make_store(self, tmp_path: Path) -> FileStore:
        return FileStore(StoreSettings(kind="file", base_dir=tmp_path))


class TestFileStoreWithFsyncContract(StoreContract):
    """The ``file`` store with ``fsync: true`` keeps the store contract (with an async make_store)."""

    async def make_store(self, tmp_path: Path) -> FileStore:
        return FileStore(StoreSettings(kind="file", base_dir=tmp_path, options={"fsync": True, "path": "data"}))


class TestSqliteStoreContract(StoreContract):
    """The ``sqlite`` store keeps the store contract (inline on the event loop)."""

    def make_store(self, tmp_path: Path) -> SqliteStore:
        return SqliteStore(StoreSettings(kind="sqlite", base_dir=tmp_path))


class TestSqliteStoreFullContract(StoreContract):
    """The ``sqlite`` store with ``synchronous: full`` (in worker threads) keeps the store contract."""

    async def make_store(self, tmp_path: Path) -> SqliteStore:
        return SqliteStore(StoreSettings(kind="sqlite", base_dir=tmp_path,
                                         options={"synchronous": "full", "path": "db/store.sqlite",
                                                  "createParents": True}))

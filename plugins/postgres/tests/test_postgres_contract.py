"""The generic Store contract (loopwright_testing.store_contract) run against the postgres store.

Each test gets a fresh schema; a "second store" is another PostgresStore over the same schema
(its own connections, as another process would have).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loopwright.abc import StoreSettings
from loopwright_postgres import PostgresStore
from loopwright_testing.store_contract import StoreContract


class TestPostgresStoreContract(StoreContract):
    @pytest.fixture(params=["asyncio", "trio"])
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        return request.param

    @pytest.fixture(autouse=True)
    def _database(self, pg_dsn: str, pg_schema: str) -> None:
        self.dsn = pg_dsn
        self.schema = pg_schema

    def make_store(self, tmp_path: Path) -> PostgresStore:
        return PostgresStore(StoreSettings(kind="postgres", base_dir=tmp_path,
                                           options={"dsn": self.dsn, "schema": self.schema}))

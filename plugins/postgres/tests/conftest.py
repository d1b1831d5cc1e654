"""Fixtures for the postgres store's tests: the server's DSN, a fresh schema per test, stores over it.

The server comes from ``LOOPWRIGHT_TEST_POSTGRES_DSN`` (``bash scripts/test.sh`` starts a
throwaway one with ``scripts/postgres.sh``). Without it the tests that need it skip, unless
``LOOPWRIGHT_REQUIRE_POSTGRES=1`` (set by ``.ci/run``), where they fail: CI cannot skip them.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

DSN_VAR = "LOOPWRIGHT_TEST_POSTGRES_DSN"


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The test server's DSN; skips (or fails under LOOPWRIGHT_REQUIRE_POSTGRES=1) without one."""
    dsn = os.environ.get(DSN_VAR, "")
    if not dsn:
        reason = (f"{DSN_VAR} is not set: no PostgreSQL server for the postgres store's tests "
                  "(bash scripts/test.sh starts one when the PostgreSQL binaries are installed)")
        if os.environ.get("LOOPWRIGHT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"LOOPWRIGHT_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return dsn


def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg  # noqa: PLC0415
    from psycopg import sql  # noqa: PLC0415

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A schema name no other test uses; dropped (with its tables) after the test."""
    schema = f"lw_test_{secrets.token_hex(6)}"
    yield schema
    _drop_schema(pg_dsn, schema)


@pytest.fixture
def pg_other_schema(pg_dsn: str, pg_schema: str) -> Iterator[str]:
    """A second schema name for the test (``<pg_schema>_b``), dropped after the test."""
    schema = f"{pg_schema}_b"
    yield schema
    _drop_schema(pg_dsn, schema)


@pytest.fixture
def store_factory(pg_dsn: str, pg_schema: str, tmp_path: Path):
    """Build PostgresStore objects over the test's schema (each a separate pool, like another process)."""
    from loopwright.abc import StoreSettings  # noqa: PLC0415
    from loopwright_postgres import PostgresStore  # noqa: PLC0415

    def make(**options: object) -> PostgresStore:
        opts = {"dsn": pg_dsn, "schema": pg_schema, **options}
        return PostgresStore(StoreSettings(kind="postgres", base_dir=tmp_path, options=opts))

    return make


@pytest.fixture
def own_cluster() -> Iterator[object]:
    """A PostgreSQL server of the test's own (see pg_cluster.py), for tests that stop or restart it."""
    from pg_cluster import Cluster  # noqa: PLC0415

    cluster = Cluster()
    yield cluster
    cluster.remove()

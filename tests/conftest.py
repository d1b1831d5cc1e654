"""Fixtures shared by the cross-cutting tests."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """A new, empty database on the test server, dropped afterwards; its DSN (a skip without a server).

    ``bash scripts/test.sh`` starts a throwaway server and sets ``LOOPWRIGHT_TEST_POSTGRES_DSN``;
    with ``LOOPWRIGHT_REQUIRE_POSTGRES=1`` (CI) a missing server fails instead of skipping.
    """
    dsn = os.environ.get("LOOPWRIGHT_TEST_POSTGRES_DSN", "")
    if not dsn:
        reason = "LOOPWRIGHT_TEST_POSTGRES_DSN is not set (bash scripts/test.sh starts a throwaway server)"
        if os.environ.get("LOOPWRIGHT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"LOOPWRIGHT_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    import psycopg  # noqa: PLC0415 - only the tests that use a server need it
    from psycopg import sql  # noqa: PLC0415

    name = f"lw_test_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

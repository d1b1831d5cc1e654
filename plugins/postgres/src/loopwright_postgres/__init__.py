"""loopwright's PostgreSQL store plugin: the ``postgres`` store kind.

Many worker processes on many machines share instances through one database: each instance runs
in one place at a time (a lease is a row of the ``leases`` table with an epoch that fences every
write of its holder; it is free at once when its holder dies), and messages, cancels and
approvals can be posted from anywhere. Found through the entry point
``postgres = "loopwright_postgres"`` of group ``loopwright``. An assembly uses it as::

    store:
      kind: postgres
      dsnEnv: LOOPWRIGHT_DSN        # or dsn: "postgresql://user@db.internal/agents"
      schema: loopwright            # default
      poolSize: 4                   # default: connections for statements (plus one keeper)
      connectTimeout: 10            # default, seconds
      leaseTtl: 30                  # default, seconds a lease lasts after its last heartbeat
      outageTolerance: 300          # default, seconds a call retries while the server is unreachable

The tables (``instances``, ``entries``, ``records``, ``posts``, ``leases``) are created in the
schema on first use. ``docs/stores/postgres.md`` describes the options, the tables, the leases and how to run many
processes against one database.

Importing this module is cheap: it imports neither psycopg nor the store, which load when a
runtime first builds a ``postgres`` store. See :class:`~loopwright_postgres._store.PostgresStore`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopwright import hookimpl

if TYPE_CHECKING:
    from collections.abc import Callable

    from loopwright.abc import StoreSettings
    from loopwright_postgres._store import Lease, PostgresStore

__all__ = ["Lease", "PostgresStore", "loopwright_register_stores", "make_store"]


def make_store(settings: StoreSettings) -> PostgresStore:
    """Build a :class:`PostgresStore` from ``settings`` (the factory registered as ``postgres``).

    :raises loopwright.errors.ConfigError: If an option is invalid.
    """
    from loopwright_postgres._store import PostgresStore  # noqa: PLC0415 - keeps import cheap

    return PostgresStore(settings)


@hookimpl
def loopwright_register_stores(register: Callable[..., None]) -> None:
    """Register the store kind ``postgres``."""
    register("postgres", make_store)


def __getattr__(name: str) -> Any:
    # ``loopwright_postgres.PostgresStore`` works, but imports psycopg only when asked for.
    if name in ("Lease", "PostgresStore"):
        from loopwright_postgres import _store  # noqa: PLC0415

        return getattr(_store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

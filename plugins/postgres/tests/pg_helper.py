"""Helper process for test_postgres_store.py: act on a PostgresStore from another process.

Usage::

    python pg_helper.py lock DSN SCHEMA INSTANCE_ID    # say who runs it in the header, take the lease, hold it
    python pg_helper.py post DSN SCHEMA INSTANCE_ID N  # post N messages {"type": "message", "text": "post K"}

``lock`` prints ``locked`` and then sleeps until killed; ``post`` prints ``posted`` and exits.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio

from loopwright.abc import StoreSettings
from loopwright_postgres import PostgresStore


async def main(mode: str, dsn: str, schema: str, instance_id: str, *rest: str) -> None:
    store = PostgresStore(StoreSettings(kind="postgres", base_dir=Path.cwd(),
                                        options={"dsn": dsn, "schema": schema}))
    if mode == "lock":
        header = await store.read_header(instance_id)
        await store.write_header(instance_id, {**header, "state": "running",
                                               "runner": f"pg-helper (pid {os.getpid()})"})
        await store.acquire(instance_id, owner="pg-helper")
        sys.stdout.write("locked\n")
        sys.stdout.flush()
        while True:
            time.sleep(60)
    elif mode == "post":
        for k in range(int(rest[0])):
            await store.post(instance_id, {"type": "message", "text": f"post {k}"})
        await store.aclose()
        sys.stdout.write("posted\n")
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:])

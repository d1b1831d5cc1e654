"""Helper process for test_file_store.py: work on a FileStore until the test SIGKILLs it.

Usage::

    python crash_writer.py append STORE_DIR INSTANCE_ID   # append entries {"n": 0}, {"n": 1}, ...
    python crash_writer.py lock STORE_DIR INSTANCE_ID     # take the runner lock and hold it

``append`` prints each ``n`` after its append returned; ``lock`` prints ``locked``. Both then
go on (appending, or sleeping) until killed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio

from loopwright.abc import StoreSettings
from loopwright.builtins.file_store import FileStore


async def main(mode: str, root: str, instance_id: str) -> None:
    store = FileStore(StoreSettings(kind="file", base_dir=Path(root), options={"path": root}))
    if mode == "append":
        # Big enough entries that a kill often lands in the middle of a write.
        pad = "x" * 2000
        n = 0
        while True:
            await store.append_entries(instance_id, [{"n": n, "pad": pad}])
            sys.stdout.write(f"{n}\n")
            sys.stdout.flush()
            n += 1
    elif mode == "lock":
        # As a runtime does: say who runs it in the header, then hold the lease.
        header = await store.read_header(instance_id)
        await store.write_header(instance_id, {**header, "state": "running",
                                               "runner": f"crash-writer (pid {os.getpid()})"})
        await store.acquire(instance_id, owner="crash-writer")
        sys.stdout.write("locked\n")
        sys.stdout.flush()
        while True:
            time.sleep(60)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:4])

"""A throwaway PostgreSQL cluster of a test's own, for tests that stop and restart the server.

Never the shared server of ``LOOPWRIGHT_TEST_POSTGRES_DSN`` (other tests use it at the same time):
``initdb`` into a new folder under ``/tmp``, a server listening only on a unix socket in that
folder (no TCP port, so no clash), trust auth, fsync off. As root, the binaries run as the
``postgres`` user (initdb refuses root), as ``scripts/postgres.sh`` does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


def _bindir() -> Path | None:
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl and shutil.which("initdb"):
        return Path(os.path.realpath(pg_ctl)).parent
    dirs = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                  key=lambda d: [int(p) for p in d.parent.name.split(".") if p.isdigit()])
    for d in reversed(dirs):
        if (d / "initdb").exists() and (d / "pg_ctl").exists():
            return d
    return None


class Cluster:
    """A server of the test's own: :meth:`start`, :meth:`stop`, :meth:`restart`, :meth:`remove`.

    Attributes:
        dsn: Its connection string (database ``postgres``).
    """

    def __init__(self, *, max_connections: int = 100) -> None:
        """initdb a new cluster and start it; skips (or fails under LOOPWRIGHT_REQUIRE_POSTGRES=1) without binaries."""
        bindir = _bindir()
        as_root = os.geteuid() == 0
        if bindir is None or (as_root and shutil.which("runuser") is None):
            reason = "no PostgreSQL server binaries (initdb, pg_ctl) for a cluster of the test's own"
            if os.environ.get("LOOPWRIGHT_REQUIRE_POSTGRES") == "1":
                pytest.fail(reason, pytrace=False)
            pytest.skip(reason)
        self._bin = bindir
        self._prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
        self.root = Path(tempfile.mkdtemp(prefix="lwpgown."))
        if as_root:
            shutil.chown(self.root, "postgres")
        self._data = self.root / "data"
        self._options = (f"-k {self.root} -c listen_addresses='' -p 5432 -c fsync=off -c synchronous_commit=off "
                         f"-c full_page_writes=off -c max_connections={max_connections}")
        self._pg("initdb", "-D", str(self._data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8",
                 "--locale=C")
        self.dsn = f"host={self.root} port=5432 user=postgres dbname=postgres"
        self.start()

    def _pg(self, tool: str, *args: str) -> None:
        done = subprocess.run([*self._prefix, str(self._bin / tool), *args], cwd=self.root, capture_output=True,
                              text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._pg("pg_ctl", "-D", str(self._data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                 "-o", self._options, "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: every session is ended at once)."""
        self._pg("pg_ctl", "-D", str(self._data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m MODE``."""
        self._pg("pg_ctl", "-D", str(self._data), "-m", mode, "-w", "-t", "60", "-o", self._options,
                 "-l", str(self.root / "server.log"), "restart")

    def remove(self) -> None:
        """Stop the server if it runs and delete its folder."""
        if (self._data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

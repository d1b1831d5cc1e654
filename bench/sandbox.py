#!/usr/bin/env python3
"""What ``shell: sandbox`` adds per command: the shell tool under ``allow`` and under ``sandbox``, in turn.

    python bench/sandbox.py [--repeat 60] [--command true]

Each figure is the median wall time (and the children's CPU time: user + system) of ``--repeat``
calls of the real tool (``execute_terminal_command``'s function with a :class:`loopwright.ToolContext`,
as the loop calls it), after five warm-up calls, the modes taking turns call by call so that a
change in the machine's load falls on all of them alike:

* ``allow``: ``/bin/sh -c COMMAND`` in a new session, output read, the group stopped;
* ``sandbox``: the same in a bubblewrap sandbox with every namespace new (no network), a write
  root bound, the limits set by ``prlimit``, the watchdog counting its processes;
* ``sandbox + network``: the same with ``network: true`` (no new network namespace to make).

The issue's aim: the sandbox adds under 20 ms per command.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from loopwright import Capabilities, FileGrants, ToolContext
from loopwright.capabilities import sandbox_problem
from loopwright_os import execute_terminal_command


async def _call(command: str, context: ToolContext) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = await execute_terminal_command.function(command=command, context=context)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.startswith("exit code: 0"), out
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


async def _main(repeat: int, command: str) -> None:
    problem = sandbox_problem()
    if problem is not None:
        raise SystemExit(f"the sandbox cannot start here: {problem}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        files = FileGrants(read=(str(work),), write=(str(work),))
        modes = {
            "allow": Capabilities(shell="allow", files=files),
            "sandbox": Capabilities(shell="sandbox", files=files),
            "sandbox + network": Capabilities(shell="sandbox", files=files, network=True),
        }
        contexts = {name: ToolContext(instance_id="bench", tool_call_id="c", grants=caps, base_dir=Path(tmp),
                                      store_locations=(Path(tmp) / "store",), timeout=60.0)
                    for name, caps in modes.items()}
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
        for i in range(repeat + 5):
            for name, context in contexts.items():
                sample = await _call(command, context)
                if i >= 5:
                    samples[name].append(sample)
    base = statistics.median(w for w, _ in samples["allow"])
    print(f"command: {command!r}, {repeat} calls per mode, medians")
    for name, runs in samples.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        extra = "" if name == "allow" else f"  (+{(wall - base) * 1000:.1f} ms over allow)"
        print(f"{name:18} wall {wall * 1000:6.1f} ms  cpu {cpu * 1000:5.1f} ms{extra}")


def main() -> None:
    """Parse the arguments and print one line per mode."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--repeat", type=int, default=60, help="calls per mode (default 60)")
    ap.add_argument("--command", default="true", help="the command each call runs (default: true)")
    args = ap.parse_args()
    anyio.run(_main, args.repeat, args.command)


if __name__ == "__main__":
    main()

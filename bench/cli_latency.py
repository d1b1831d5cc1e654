#!/usr/bin/env python3
"""How fast the CLI answers: wall time of a few commands beside a bare ``python -c pass``.

    python bench/cli_latency.py [--repeat 7]

Each figure is the median wall time of ``--repeat`` fresh processes (after one warm-up run),
all run in the same process of this script, against a throw-away assembly in a temporary
folder (a file store, the ``test`` provider).

Bytecode: the processes measured read and write ``.pyc`` files under a throw-away
``PYTHONPYCACHEPREFIX`` (and ``PYTHONDONTWRITEBYTECODE`` is dropped for them), as an installed
package does (``pip install`` compiles them). Without bytecode every process compiles each module
it imports from source, which costs more than everything else together (``--no-bytecode``
measures that way). The figures:

* ``python -c pass``: the interpreter alone, the floor every command stands on;
* ``loopwright ls`` and ``loopwright show ID``: reading the store;
* ``loopwright plugins``: listing every plugin (imports them all, by its nature);
* ``loopwright run`` on ``test:any``: a whole run, start to result;
* ``open a Runtime``: ``async with Runtime.from_file(...)`` in a process that has already
  imported loopwright, timed inside the process.

Targets (issue 10): ``ls`` and ``show`` under 150 ms, ``run`` under 300 ms, opening a runtime
under 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ASSEMBLY = "store: {kind: file, path: ./store}\ndefaultModel: test:any\n"
DEFINITION = "name: bench\nsystemPrompt: You answer.\n"
OPEN_RUNTIME = """
import time, anyio, loopwright
async def main():
    t = time.perf_counter()
    async with loopwright.Runtime.from_file("loopwright.yaml"):
        pass
    print(time.perf_counter() - t)
anyio.run(main)
"""


def _env(cwd: Path, *, bytecode: bool) -> dict[str, str]:
    """The environment of the processes measured: see the module's docstring on bytecode."""
    env = {**os.environ, "NO_COLOR": "1"}
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cwd / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def _time(cmd: list[str], cwd: Path, repeat: int, env: dict[str, str]) -> float:
    """Return the median wall seconds of ``cmd`` run ``repeat`` times (one warm-up first)."""
    runs = []
    for i in range(repeat + 1):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
        if i:
            runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def main() -> None:
    """Print one line per figure: its name, its median in ms, and its margin over bare Python."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--repeat", type=int, default=7, help="processes per figure (default 7)")
    ap.add_argument("--no-bytecode", action="store_true",
                    help="compile every module from source in every process (no .pyc files)")
    args = ap.parse_args()
    py = sys.executable
    lw = [py, "-m", "loopwright.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        env = _env(cwd, bytecode=not args.no_bytecode)
        (cwd / "loopwright.yaml").write_text(ASSEMBLY)
        (cwd / "bench.yaml").write_text(DEFINITION)
        out = subprocess.run([*lw, "--json", "run", "bench.yaml", "-p", "hello"], cwd=cwd, env=env,
                             check=True, capture_output=True, text=True).stdout
        instance = json.loads(out)["instanceId"]
        figures = {
            "python -c pass": _time([py, "-c", "pass"], cwd, args.repeat, env),
            "loopwright ls": _time([*lw, "ls"], cwd, args.repeat, env),
            "loopwright show": _time([*lw, "show", instance], cwd, args.repeat, env),
            "loopwright plugins": _time([*lw, "plugins"], cwd, args.repeat, env),
            "loopwright run test:any": _time([*lw, "run", "bench.yaml", "-p", "hello"], cwd, args.repeat, env),
        }
        opens = [float(subprocess.run([py, "-c", OPEN_RUNTIME], cwd=cwd, env=env, check=True,
                                      capture_output=True, text=True).stdout) for _ in range(args.repeat + 1)][1:]
    base = figures["python -c pass"]
    print(f"bytecode: {'none, every module compiled in every process' if args.no_bytecode else 'cached (.pyc)'}; "
          f"median of {args.repeat} processes; load average {os.getloadavg()[0]:.1f}")
    for name, seconds in figures.items():
        extra = "" if name.startswith("python") else f"  (+{(seconds - base) * 1000:.0f} ms over bare Python)"
        print(f"{name:<26} {seconds * 1000:7.0f} ms{extra}")
    print(f"{'open a Runtime (in-process)':<26} {statistics.median(opens) * 1000:7.0f} ms")


if __name__ == "__main__":
    main()

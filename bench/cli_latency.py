#!/usr/bin/env python3
"""How fast the CLI answers: wall time of a few commands beside a bare ``python -c pass``.

    python bench/cli_latency.py [--repeat 7]

Each figure is the median wall time (and CPU time: user + system, which a busy machine moves
much less) of ``--repeat`` fresh processes (after one warm-up run),
all run in the same process of this script, against a throw-away assembly in a temporary
folder (a file store, the ``test`` provider).

Bytecode: the processes measured read and write ``.pyc`` files under a throw-away
``PYTHONPYCACHEPREFIX`` (and ``PYTHONDONTWRITEBYTECODE`` is dropped for them), as an installed
package does (``pip install`` compiles them). Without bytecode every process compiles each module
it imports from source, which costs more than everything else together (``--no-bytecode``
measures that way). The figures:

* ``python -c pass``: the interpreter alone, the floor every command stands on;
* ``loopwright --help``: the group's help, importing no command's work;
* ``loopwright ls`` and ``loopwright show ID``: reading the store;
* ``loopwright plugins``: listing every plugin (imports them all, by its nature);
* ``loopwright run`` on ``test:any``: a whole run, start to result;
* ``import + open a Runtime``: ``async with Runtime.from_file(...)`` timed inside a process
  that imported ``loopwright`` (the package, which imports the runtime's modules on first use
  of ``loopwright.Runtime``, so inside the timer); ``open a Runtime``: the same after
  ``loopwright.Runtime`` was imported, the opening alone. Their CPU figures are the whole process's.

``--against OLD/core/src`` measures another checkout's loopwright (the plugins stay this
environment's, unless their ``src`` folders are added: ``OLD/core/src:OLD/plugins/serve/src``)
in turn with this one, for before and after figures taken under the same load.

Targets (issue 30, as issue 10's): ``--help``, ``ls`` and ``show`` within 150 ms and ``run`` within
300 ms of process start; opening a runtime under 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ASSEMBLY = "store: {kind: file, path: ./store}\ndefaultModel: test:any\n"
DEFINITION = "name: bench\nsystemPrompt: You answer.\n"
#: Prints the seconds ``async with Runtime.from_file(...)`` took; with ``imported``, after the
#: runtime's modules were imported (``loopwright.Runtime`` imports them on first access).
OPEN_RUNTIME = """
import sys, time, anyio, loopwright
if sys.argv[1] == "imported":
    loopwright.Runtime
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


def _sample(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Run ``cmd`` once; return its wall seconds and its CPU seconds (user + system).

    On a machine shared with other work the CPU time moves much less than the wall time, which
    includes the waits for a core.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if OPEN_RUNTIME in cmd:
        wall = float(done.stdout)  # timed inside the process
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def _measure(cmd: list[str], cwd: Path, repeat: int, envs: list[dict[str, str]]) -> list[tuple[float, float]]:
    """Return, per environment, the median wall and CPU seconds of ``repeat`` runs of ``cmd``.

    The environments take turns run by run (after one warm-up run each), so that a change in
    the machine's load falls on all of them alike.
    """
    samples: list[list[tuple[float, float]]] = [[] for _ in envs]
    for i in range(repeat + 1):
        for n, env in enumerate(envs):
            sample = _sample(cmd, cwd, env)
            if i:
                samples[n].append(sample)
    return [(statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)) for runs in samples]


def main() -> None:
    """Print one line per figure: its name, its medians in ms, and its margin over bare Python."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--repeat", type=int, default=7, help="processes per figure (default 7)")
    ap.add_argument("--no-bytecode", action="store_true",
                    help="compile every module from source in every process (no .pyc files)")
    ap.add_argument("--against", metavar="SRC",
                    help="also measure the loopwright package under SRC (a checkout's core/src, put first on "
                         "PYTHONPATH; several folders joined with os.pathsep, e.g. OLD/core/src:OLD/plugins/serve/src "
                         "for old plugins too), run by run in turn with this one: before and after figures of a change")
    args = ap.parse_args()
    py = sys.executable
    lw = [py, "-m", "loopwright.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        env = _env(cwd, bytecode=not args.no_bytecode)
        envs = {"this": env}
        if args.against is not None:
            envs = {"against": {**_env(cwd / "against", bytecode=not args.no_bytecode),
                                "PYTHONPATH": os.pathsep.join(str(Path(each).resolve())
                                                              for each in args.against.split(os.pathsep))}, **envs}
        (cwd / "loopwright.yaml").write_text(ASSEMBLY)
        (cwd / "bench.yaml").write_text(DEFINITION)
        out = subprocess.run([*lw, "--json", "run", "bench.yaml", "-p", "hello"], cwd=cwd, env=env,
                             check=True, capture_output=True, text=True).stdout
        instance = json.loads(out)["instanceId"]
        commands = {
            "python -c pass": [py, "-c", "pass"],
            "loopwright --help": [*lw, "--help"],
            "loopwright ls": [*lw, "ls"],
            "loopwright show": [*lw, "show", instance],
            "loopwright plugins": [*lw, "plugins"],
            "loopwright run test:any": [*lw, "run", "bench.yaml", "-p", "hello"],
            "import + open a Runtime": [py, "-c", OPEN_RUNTIME, "cold"],
            "open a Runtime": [py, "-c", OPEN_RUNTIME, "imported"],
        }
        figures = {name: dict(zip(envs, _measure(cmd, cwd, args.repeat, list(envs.values())), strict=True))
                   for name, cmd in commands.items()}
    print(f"bytecode: {'none, every module compiled in every process' if args.no_bytecode else 'cached (.pyc)'}; "
          f"median of {args.repeat} processes; load average {os.getloadavg()[0]:.1f}")
    print(f"{'':<28} {'':<8} {'wall':>8} {'cpu':>8}")
    for name, by_env in figures.items():
        for which, (seconds, cpu) in by_env.items():
            base, base_cpu = figures["python -c pass"][which]
            label = "" if len(envs) == 1 else f"{which:<8}"
            extra = "" if name.startswith("python") else (
                f"  +{(seconds - base) * 1000:.0f} ms wall, +{(cpu - base_cpu) * 1000:.0f} ms cpu over bare Python")
            if "open" in name:
                extra = "  (wall: timed inside the process; cpu: the whole process)"
            print(f"{name:<28} {label:<8} {seconds * 1000:5.0f} ms {cpu * 1000:5.0f} ms{extra}")


if __name__ == "__main__":
    main()

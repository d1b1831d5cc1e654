#!/usr/bin/env python3
"""``loopwright worker`` processes on the postgres store: throughput, CPU, time to notice work, take-over.

    python bench/workers.py                     # a throwaway PostgreSQL cluster, every configuration
    python bench/workers.py --n 300 --dsn "host=... dbname=..."   # a server of your own (a new schema each)

For each configuration (1, 2 and 4 workers with 8 slots each, and 1 worker with 32 slots) the
workers are started and warmed up (one instance each way), then:

- **time to notice**: an instance is submitted (:meth:`loopwright.Runtime.submit`, the submit
  path) while every worker is idle, with ``--poll 30s``, so only the ``NOTIFY`` can wake them
  early; the time from ``submit`` returning to the first worker's ``pickedUp`` line, median of 5;
- **burst**: ``--n`` instances are submitted at once; instances per second is ``n`` over the time
  from the first submit to the last ``finished`` line. Each instance makes 3 model calls (two
  ``noop`` tool calls, then an answer) to an in-process provider that answers after
  ``--latency-ms`` (50 ms); CPU per instance is the CPU time of the worker processes, and of the
  PostgreSQL server (the postmaster and its backends, from ``/proc``), over the burst, divided by
  ``n``;
- **take-over** (configurations with 2 or more workers): instances whose tool sleeps 60 s are
  submitted, one worker is SIGKILLed once it runs some, and the time from the kill to another
  worker's ``pickedUp`` (``resume``) of each of its instances is measured (first and last).

The table goes to stdout (markdown); ``--json PATH`` writes the figures too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
LOOPWRIGHT = str(Path(sys.executable).with_name("loopwright"))
TICK = os.sysconf("SC_CLK_TCK")

PLUGIN = '''
import anyio
import loopwright
from loopwright.abc import Provider

LATENCY = {latency}


class Latency(Provider):
    free = True

    def __init__(self, settings):
        self.settings = settings

    async def complete(self, request):
        await anyio.sleep(LATENCY)
        index = sum(1 for m in request.messages if m.role == "assistant")
        calls = ()
        text = "done"
        if request.model == "burst" and index < 2:
            calls, text = (loopwright.ToolCall(id=f"c{{index}}", name="noop", arguments={{}}),), None
        if request.model == "slow" and index < 1:
            calls, text = (loopwright.ToolCall(id="c0", name="nap", arguments={{}}),), None
        return loopwright.ModelResponse(
            message=loopwright.Message(role="assistant", content=text, tool_calls=calls),
            usage=loopwright.Usage(input_tokens=10, output_tokens=5, total_tokens=15, requests=1),
            finish_reason="tool_calls" if calls else "stop")


@loopwright.tool
async def noop() -> str:
    """Do nothing."""
    return "ok"


@loopwright.tool
async def nap() -> str:
    """Sleep a minute."""
    await anyio.sleep(60)
    return "napped"


@loopwright.hookimpl
def loopwright_register_providers(register):
    register("lat", Latency)


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(noop, nap)
'''


def cpu_of(pid: int) -> float:
    """Seconds of CPU a process used (user + system), its reaped children included."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / TICK


def server_cpu(postmaster: int | None) -> float:
    """CPU seconds of the postmaster and its live children (exited backends are in its reaped share)."""
    if postmaster is None:
        return 0.0
    total = cpu_of(postmaster)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            rest = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(rest[1]) == postmaster:
            total += sum(int(f) for f in rest[11:13]) / TICK
    return total


class Worker:
    """A ``loopwright worker --json`` subprocess whose event lines are collected with their arrival time."""

    def __init__(self, project: Path, dsn: str, slots: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
        env.update(LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD="1", LW_BENCH_DSN=dsn)
        self.proc = subprocess.Popen([LOOPWRIGHT, "worker", "--json", "--poll", "30s", "--grace", "1s",
                                      "--max-concurrent", str(slots)],
                                     cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.append((time.time(), json.loads(line)))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.005)


def events(workers: list[Worker], kind: str, ids: set[str]) -> list[tuple[float, dict[str, Any], Worker]]:
    return [(t, e, w) for w in workers for t, e in list(w.events)
            if e.get("event") == kind and e.get("instanceId") in ids]


async def submit(rt: Any, project: Path, definition: str, n: int) -> tuple[float, list[str]]:
    t0 = time.time()
    ids = [await rt.submit(project / definition, prompt="go") for _ in range(n)]
    return t0, ids


def run_config(project: Path, dsn: str, postmaster: int | None, *, n_workers: int, slots: int, n: int,
               ) -> dict[str, Any]:
    from loopwright import Runtime  # noqa: PLC0415

    schema = f"bench_{n_workers}x{slots}"
    (project / "loopwright.yaml").write_text(
        f"store:\n  kind: postgres\n  dsnEnv: LW_BENCH_DSN\n  schema: {schema}\n"
        "plugins: [loopwright_postgres, bench_plugin.py]\n")
    os.environ["LW_BENCH_DSN"] = dsn
    workers = [Worker(project, dsn, slots) for _ in range(n_workers)]
    out: dict[str, Any] = {"workers": n_workers, "slots": slots, "n": n}

    async def main() -> None:
        async with Runtime.from_file(project / "loopwright.yaml") as rt:
            # Warm up: every worker runs an instance (each submitted while all are idle).
            for _ in range(2 * n_workers):
                _t, ids = await submit(rt, project, "burst.yaml", 1)
                await anyio.to_thread.run_sync(lambda i=set(ids): wait_for(
                    lambda: events(workers, "finished", i), 120, "the warm-up"))
            notice = []
            for _ in range(5):
                await anyio.sleep(0.5)  # every worker is idle and waiting
                _t, ids = await submit(rt, project, "burst.yaml", 1)
                submitted = time.time()
                await anyio.to_thread.run_sync(lambda i=set(ids): wait_for(
                    lambda: events(workers, "pickedUp", i), 120, "a pick-up"))
                picked = min(t for t, _e, _w in events(workers, "pickedUp", set(ids)))
                notice.append(picked - submitted)
                await anyio.to_thread.run_sync(lambda i=set(ids): wait_for(
                    lambda: events(workers, "finished", i), 120, "it to finish"))
            out["notice_ms"] = statistics.median(notice) * 1000
            cpu_w0 = sum(cpu_of(w.proc.pid) for w in workers)
            cpu_s0 = server_cpu(postmaster)
            t0, ids = await submit(rt, project, "burst.yaml", n)
            want = set(ids)
            await anyio.to_thread.run_sync(lambda: wait_for(
                lambda: len(events(workers, "finished", want)) >= n, 600, "the burst"))
            t1 = max(t for t, _e, _w in events(workers, "finished", want))
            cpu_w = sum(cpu_of(w.proc.pid) for w in workers) - cpu_w0
            cpu_s = server_cpu(postmaster) - cpu_s0
            out.update(per_s=n / (t1 - t0), worker_cpu_ms=cpu_w / n * 1000, server_cpu_ms=cpu_s / n * 1000,
                       wall_s=t1 - t0)
            if n_workers > 1:
                _t, ids = await submit(rt, project, "slow.yaml", 2 * n_workers)
                slow = set(ids)
                await anyio.to_thread.run_sync(lambda: wait_for(
                    lambda: len(events(workers, "pickedUp", slow)) >= len(slow), 120, "the slow ones to start"))
                picked = events(workers, "pickedUp", slow)
                victim = max(workers, key=lambda w: sum(1 for _t, _e, by in picked if by is w))
                theirs = {e["instanceId"] for _t, e, w in picked if w is victim}
                victim.proc.kill()
                killed = time.time()
                rest = [w for w in workers if w is not victim]
                await anyio.to_thread.run_sync(lambda: wait_for(
                    lambda: {e["instanceId"] for _t, e, _w in events(rest, "pickedUp", theirs)} >= theirs, 120,
                    "the take-over"))
                times = sorted(t - killed for t, e, _w in events(rest, "pickedUp", theirs))
                out.update(takeover_first_ms=times[0] * 1000, takeover_last_ms=times[-1] * 1000,
                           taken_over=len(theirs))

    try:
        anyio.run(main)
    finally:
        for w in workers:
            w.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="instances per burst")
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--dsn", help="a server of your own (default: a throwaway cluster)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cluster = None
    postmaster = None
    dsn = args.dsn
    if dsn is None:
        sys.path.insert(0, str(ROOT / "plugins" / "postgres" / "tests"))
        from pg_cluster import Cluster  # noqa: PLC0415 - the tests' throwaway cluster

        cluster = Cluster(max_connections=100)
        dsn = cluster.dsn
        postmaster = int((cluster.root / "data" / "postmaster.pid").read_text().split()[0])
    project = Path(tempfile.mkdtemp(prefix="lwbench-workers."))
    try:
        (project / "bench_plugin.py").write_text(PLUGIN.format(latency=args.latency_ms / 1000))
        (project / "burst.yaml").write_text("name: burst\nmodel: lat:burst\ntools: [noop]\n")
        (project / "slow.yaml").write_text("name: slow\nmodel: lat:slow\ntools: [nap]\n")
        rows = []
        for n_workers, slots in ((1, 8), (2, 8), (4, 8), (1, 32)):
            row = run_config(project, dsn, postmaster, n_workers=n_workers, slots=slots, n=args.n)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        shutil.rmtree(project, ignore_errors=True)
        if cluster is not None:
            cluster.remove()
    print(f"burst of {args.n} instances (3 model calls each, {args.latency_ms:g} ms latency), submitted with "
          "Runtime.submit; workers polling every 30 s (woken by NOTIFY)\n")
    print("| workers x slots | instances/s | worker CPU ms/instance | PostgreSQL CPU ms/instance "
          "| time to notice (median of 5) | take-over after SIGKILL (first / last) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        take = (f"{r['takeover_first_ms']:.0f} / {r['takeover_last_ms']:.0f} ms ({r['taken_over']} instances)"
                if "takeover_first_ms" in r else "—")
        print(f"| {r['workers']} x {r['slots']} | {r['per_s']:.1f} | {r['worker_cpu_ms']:.1f} | "
              f"{r['server_cpu_ms']:.1f} | {r['notice_ms']:.0f} ms | {take} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

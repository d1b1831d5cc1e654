#!/usr/bin/env python3
"""loopwright serve under load: N instances started over HTTP at once, each followed by its own SSE client.

    python bench/serve_load.py                    # 200 instances, 3 tool turns each, 50 ms model latency
    python bench/serve_load.py --n 500 --k 1      # other sizes

Two runs of the same burst, one after the other, each over a fresh file store:

* **in-process**: ``bench/scale.py``'s burst, ``start_agent`` + ``result`` for ``--n`` instances
  at once in one runtime (the in-process ``inproc`` provider answers after ``--latency-ms``,
  with ``--k`` calls of the ``add`` tool and then a final text);
* **over HTTP**: ``loopwright serve`` in a subprocess, over an assembly that registers the same
  provider and tool (a plugin file importing ``scale.py``), and ``--n`` clients at once (one
  httpx client, as many connections), each ``POST /v1/instances`` then
  ``GET /v1/instances/ID/events`` until the final answer comes as a ``transcript`` event.

It reports both walls from the first start to the last final answer, their ratio, and the
server's peak resident memory (``VmHWM`` of the server process, read just before it is stopped),
beside the in-process run's. Every request goes to 127.0.0.1 only, and the run stops by itself.
Not a test: the figures go to bench/RESULTS.md. ``--json PATH`` writes them too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import scale  # noqa: E402 - beside this file

PLUGIN = """
import sys
sys.path.insert(0, {here!r})
import loopwright
import scale

_PLUGIN = scale.BenchPlugin({k}, {latency})


@loopwright.hookimpl
def loopwright_register_providers(register):
    register("inproc", lambda settings: scale.InProcProvider(settings, _PLUGIN))


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(loopwright.tool(scale.add))
"""

#: Seconds before the whole HTTP burst counts as hung.
GUARD = 600.0


def write_project(root: Path, k: int, latency: float) -> Path:
    """An assembly with a file store, the bench plugin and the adder agent registered as ``adder``."""
    (root / "agents").mkdir(parents=True)
    (root / "bench_plugin.py").write_text(PLUGIN.format(here=str(HERE), k=k, latency=latency))
    (root / "agents" / "adder.yaml").write_text(
        "name: adder\nmodel: inproc:m\nsystemPrompt: You add.\ntools: [add]\n"
        f"limits: {{maxIterations: {k + 10}, toolCalls: {k + 10}}}\n")
    assembly = root / "loopwright.yaml"
    assembly.write_text("store: {kind: file, path: ./store}\nplugins: [bench_plugin.py]\n"
                        "agentDefinitions: {adder: agents/adder.yaml}\nserver: {maxEventStreams: 4096}\n")
    return assembly


async def in_process(n: int, k: int, latency_ms: float, base: Path) -> dict[str, Any]:
    """The in-process burst of ``scale.py``: wall and peak RSS of this process."""
    plugin = scale.BenchPlugin(k, latency_ms / 1000)
    defn = scale.definition(k)
    async with scale.runtime(scale.new_store(base, f"serve-inproc{n}"), plugin) as rt:
        await scale._burst(rt, defn, 1)  # warm-up  # noqa: SLF001 - the same burst as scale.py
        w0 = time.perf_counter()
        results = await scale._burst(rt, defn, n)  # noqa: SLF001
        wall = time.perf_counter() - w0
    return {"wall_s": round(wall, 3), "valid": all(r.text == "FAKE_FINAL" for r in results),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


async def _follow(client: httpx.AsyncClient, started: list[float] | None = None) -> float:
    """Start one instance and follow its events until the final answer; return when it came.

    :param started: Gets the time the start was answered.
    """
    created = await client.post("/v1/instances", json={"definition": "adder", "prompt": "add [[k]]"})
    created.raise_for_status()
    if started is not None:
        started.append(time.perf_counter())
    iid = created.json()["instanceId"]
    last_id = ""
    for _attempt in range(5):  # as EventSource does: reconnect with Last-Event-ID when the connection drops
        try:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            async with client.stream("GET", f"/v1/instances/{iid}/events", headers=headers) as response:
                response.raise_for_status()
                event = ""
                async for line in response.aiter_lines():
                    if line.startswith("id: "):
                        last_id = line[4:]
                    elif line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "transcript":
                        message = json.loads(line[6:])["message"]
                        if message.get("role") == "assistant" and message.get("content") == "FAKE_FINAL":
                            return time.perf_counter()
        except httpx.RemoteProtocolError:  # a kept-alive connection the server had just closed
            continue
    raise RuntimeError(f"the stream of {iid} ended before its final answer")


def _url(line: str) -> str:
    match = re.search(r"listening on (http://\S+)", line)
    if match is None:
        raise RuntimeError(f"the server printed no URL: {line!r}")
    return match.group(1)


def _peak_rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", text)
    return round(int(match.group(1)) / 1024, 1) if match else float("nan")


async def over_http(n: int, k: int, latency_ms: float, base: Path) -> dict[str, Any]:
    """The same burst through ``loopwright serve``: wall to the last final answer, the server's peak RSS."""
    root = Path(tempfile.mkdtemp(prefix=f"serve-load{n}-", dir=base))
    assembly = write_project(root, k, latency_ms / 1000)
    env = {key: value for key, value in os.environ.items() if not key.startswith("LOOPWRIGHT_")}
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before the burst is timed
        [sys.executable, "-m", "loopwright.cli", "serve", "-c", str(assembly), "--port", "0"],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=(root / "server.log").open("w"), text=True)
    try:
        url = _url(proc.stdout.readline())
        limits = httpx.Limits(max_connections=2 * n + 10, max_keepalive_connections=2 * n + 10)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(GUARD)) as client:
            for _ in range(600):
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            await _follow(client)  # warm-up, as in-process
            rss_idle = _peak_rss_mb(proc.pid)
            started: list[float] = []
            w0 = time.perf_counter()
            done = await asyncio.wait_for(asyncio.gather(*(_follow(client, started) for _ in range(n))), GUARD)
            wall = max(done) - w0
            rss = _peak_rss_mb(proc.pid)
        return {"wall_s": round(wall, 3), "valid": len(done) == n, "last_start_answered_s": round(max(started) - w0, 3),
                "server_peak_rss_mb": rss, "server_rss_after_warmup_mb": rss_idle}
    except BaseException:
        print(f"the server's log: {root / 'server.log'}", file=sys.stderr)
        raise
    finally:
        proc.terminate()
        proc.wait(timeout=60)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    base = args.store_dir
    base.mkdir(parents=True, exist_ok=True)
    inproc = await in_process(args.n, args.k, args.latency_ms, base)
    http = await over_http(args.n, args.k, args.latency_ms, base)
    return {"n": args.n, "k": args.k, "latency_ms": args.latency_ms,
            "bound_s": round((args.k + 1) * args.latency_ms / 1000, 3), "in_process": inproc, "http": http,
            "http_vs_in_process": round(http["wall_s"] / inproc["wall_s"], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="instances (and SSE clients) at once")
    ap.add_argument("--k", type=int, default=3, help="tool turns per instance")
    ap.add_argument("--latency-ms", type=float, default=50.0, help="model latency")
    ap.add_argument("--store-dir", type=Path, default=HERE / "out" / "stores")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    out = asyncio.run(main_async(args))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()

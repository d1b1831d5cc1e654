#!/usr/bin/env python3
"""loopwright at scale: many instances in one process, and resuming a long instance.

    python bench/scale.py                      # both parts: 1,000 instances at once, then resume
    python bench/scale.py many --n 10000       # 10,000 instances at once
    python bench/scale.py resume --turns 10000 # get_agent in a fresh process: 10,000 turns vs 10
    python bench/scale.py resume --against /tmp/before/core/src  # and an old checkout's, in turn
    python bench/scale.py turn                 # CPU per turn alone, and where it goes (cProfile)

No HTTP: the model is an in-process provider (kind ``inproc``) that answers after
``--latency-ms`` of ``asyncio.sleep``, with a tool call of the async ``add`` tool for the first
``--k`` turns and then a final text, so what is measured is loopwright itself with the **file
store on** (default options: every step saved before the next begins).

**many** starts ``--n`` instances at once (``asyncio.gather`` of ``start_agent`` + ``result``)
in one runtime, after one warm-up instance, and reports: wall time against the latency bound
(``(k + 1) * latency``: each instance makes k + 1 model calls one after the other), process CPU
per turn (model call) and how much of the burst's CPU was the kernel's, the peak resident memory
of the process (``ru_maxrss``) and the memory per running instance (the traced Python memory
allocated while all of them are running, from ``tracemalloc``'s peak in a second, traced burst,
divided by ``--n``; tracing slows it down, so its times are not reported; ``--no-memory`` skips
it). The load average (1 minute) at the start is printed too: the machine may be shared.

**resume** builds two instances (``--turns`` tool turns, and 10) in a store under
``--store-dir``, lets them rest, then for each one starts a **fresh Python process** that opens
a runtime on that store, loads a third, 2-turn instance (so that first-use costs such as the
converters' generated code are not counted) and times ``get_agent`` (header, log, rebuild) of the
instance, ``--repeat`` times, each in its own process, alternating the two; it reports the
median and the ratio of the two, plus the CPU time of one more tool turn (a message, one tool
turn, a final answer) at both sizes. ``--against SRC`` also loads the long instance with the
loopwright under ``SRC`` (another checkout's ``core/src``), process by process in turn with this
one, from the same files: before and after figures under the same load. Since issue 30 the long
instance's messages stay JSON until first read (a lazy transcript), so "one more turn" at 10,000
turns includes building them all for the model request.

The stores go to ``--store-dir`` (default ``bench/out/stores``, kept: see bench/README.md,
"Where the stores go"). ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import loopwright
from loopwright import Definition, Limits, Message, ModelResponse, ToolCall, Usage, hookimpl
from loopwright._definition import Assembly, StoreConfig
from loopwright.abc import Provider

HERE = Path(__file__).resolve().parent


class InProcProvider(Provider):
    """Answers after ``latency`` seconds: ``k`` calls of ``add``, then a final text.

    The turn is counted from the request (its ``role: tool`` messages since the last user
    message), so one provider serves any number of instances at once.
    """

    free = True

    def __init__(self, settings: Any, plugin: BenchPlugin) -> None:
        self.settings = settings
        self.plugin = plugin

    async def complete(self, request: Any) -> ModelResponse:
        """Return the next answer of the conversation in ``request``."""
        p = self.plugin
        if p.latency:
            await asyncio.sleep(p.latency)
        done = 0
        for m in reversed(request.messages):
            if m.role == "user":
                break
            if m.role == "tool":
                done += 1
        usage = Usage(input_tokens=10, output_tokens=5, total_tokens=15, requests=1)
        if done < p.k:
            call = ToolCall(id=f"c{done}", name="add", arguments={"a": done, "b": 1})
            return ModelResponse(message=Message(role="assistant", content=None, tool_calls=(call,)),
                                 usage=usage, finish_reason="tool_calls")
        return ModelResponse(message=Message(role="assistant", content="FAKE_FINAL"), usage=usage,
                             finish_reason="stop")


async def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


class BenchPlugin:
    """Registers the ``inproc`` provider and the ``add`` tool."""

    def __init__(self, k: int, latency: float) -> None:
        self.k = k
        self.latency = latency

    @hookimpl
    def loopwright_register_providers(self, register: Any) -> None:
        register("inproc", lambda settings: InProcProvider(settings, self))

    @hookimpl
    def loopwright_register_tools(self, register: Any) -> None:
        register(loopwright.tool(add))


def definition(k: int) -> Definition:
    """The benchmark agent: model ``inproc:m``, one tool, limits that let ``k`` turns run."""
    return Definition(name="adder", model="inproc:m", system_prompt="You add.", tools=("add",),
                      limits=Limits(max_iterations=k + 10, tool_calls=k + 10))


def runtime(store: Path, plugin: BenchPlugin) -> loopwright.Runtime:
    """A runtime over a file store (default options) in ``store``."""
    asm = Assembly(store=StoreConfig(kind="file", options={"path": str(store)}))
    return loopwright.Runtime(asm, plugins=[plugin], autoload=False)


def new_store(base: Path, tag: str) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"scale-{tag}-", dir=base))


# -- many instances ----------------------------------------------------------------------------


async def _burst(rt: loopwright.Runtime, defn: Definition, n: int) -> list[Any]:
    async def one() -> Any:
        run = await rt.start_agent(defn, None, "add [[k]]")
        return await run.result()

    return await asyncio.gather(*(one() for _ in range(n)))


class _GcTimer:
    """A ``gc.callbacks`` entry adding up the CPU time spent in the garbage collector."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0
        self._start = 0.0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.process_time()
        else:
            self.total += time.process_time() - self._start
            self.count += 1


async def many(n: int, k: int, latency_ms: float, store_dir: Path, *, memory: bool = True) -> dict[str, Any]:
    """Run ``n`` instances at once; return wall, CPU per turn (and the kernel's share), memory."""
    plugin = BenchPlugin(k, latency_ms / 1000)
    defn = definition(k)
    out: dict[str, Any] = {"n": n, "k": k, "latency_ms": latency_ms,
                           "bound_s": (k + 1) * latency_ms / 1000}
    async with runtime(new_store(store_dir, f"many{n}"), plugin) as rt:
        await _burst(rt, defn, 1)  # warm-up
        gc.collect()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        in_gc = _GcTimer()
        gc.callbacks.append(in_gc)
        c0, w0, t0 = time.process_time(), time.perf_counter(), os.times()
        try:
            results = await _burst(rt, defn, n)
        finally:
            wall, cpu, t1 = time.perf_counter() - w0, time.process_time() - c0, os.times()
            gc.callbacks.remove(in_gc)
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    bad = [r for r in results if r.text != "FAKE_FINAL"]
    out.update(valid=not bad, wall_s=round(wall, 3), vs_bound=round(wall / out["bound_s"], 2),
               cpu_s=round(cpu, 3), cpu_ms_per_turn=round(cpu * 1000 / (n * (k + 1)), 3),
               peak_rss_mb=round(rss1 / 1024, 1), rss_growth_mb=round((rss1 - rss0) / 1024, 1),
               gc_s=round(in_gc.total, 3), gc_collections=in_gc.count,
               system_cpu_s=round(t1.system - t0.system, 2))
    if not memory:
        return out
    # A second, traced burst in a fresh runtime, for the memory per running instance.
    async with runtime(new_store(store_dir, f"many{n}t"), plugin) as rt:
        await _burst(rt, defn, 1)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        await _burst(rt, defn, n)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    out["kb_per_running_instance"] = round((peak - base) / 1024 / n, 1)
    return out


# -- one turn, profiled -------------------------------------------------------------------------


async def turn_profile(runs: int, k: int, store_dir: Path, top: int) -> dict[str, Any]:
    """Run ``runs`` instances one after the other (no latency); CPU per turn, then under cProfile."""
    import cProfile  # noqa: PLC0415 - only this part needs it
    import pstats  # noqa: PLC0415

    plugin = BenchPlugin(k, 0.0)
    defn = definition(k)
    async with runtime(new_store(store_dir, "turn"), plugin) as rt:
        for _ in range(20):
            await _burst(rt, defn, 1)
        gc.collect()
        c0 = time.process_time()
        for _ in range(runs):
            await _burst(rt, defn, 1)
        cpu = time.process_time() - c0
        prof = cProfile.Profile(time.process_time)
        prof.enable()
        for _ in range(runs):
            await _burst(rt, defn, 1)
        prof.disable()
    turns = runs * (k + 1)
    stats = pstats.Stats(prof)
    by_pkg: dict[str, float] = {}
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        pkg = _package(file)
        by_pkg[pkg] = by_pkg.get(pkg, 0.0) + tt
        rows.append((tt, ct, nc, f"{pkg}:{Path(file).name}:{line}({func})"))
    rows.sort(reverse=True)
    total = sum(by_pkg.values())
    scale_to = cpu / total if total else 1.0  # cProfile's overhead: scaled back to the plain run
    return {
        "runs": runs, "k": k, "cpu_us_per_turn": round(cpu * 1e6 / turns, 1),
        "profile_us_per_turn_by_package": {p: round(t * scale_to * 1e6 / turns, 1)
                                           for p, t in sorted(by_pkg.items(), key=lambda x: -x[1])},
        "top_self_us_per_turn": [(name, round(tt * scale_to * 1e6 / turns, 1), round(nc / turns, 2))
                                 for tt, _ct, nc, name in rows[:top]],
    }


def _package(file: str) -> str:
    if "loopwright" in file and "site-packages" not in file:
        return "loopwright." + Path(file).stem
    if "site-packages" in file:
        return file.split("site-packages/")[1].split("/", maxsplit=1)[0].split(".", maxsplit=1)[0]
    if file.startswith("<") or file == "~":
        return "builtins"
    return "stdlib:" + Path(file).stem


# -- resume ------------------------------------------------------------------------------------

_CHILD = """
import asyncio, json, sys, time
sys.path.insert(0, {here!r})
import scale
import loopwright._config  # start-up imports (the definition loader): not what resume costs
async def main():
    plugin = scale.BenchPlugin(0, 0.0)
    async with scale.runtime(__import__("pathlib").Path({store!r}), plugin) as rt:
        await rt.get_agent({warm!r})  # first-use costs (converters, the definition loader): not resume's
        t0 = time.perf_counter(); c0 = time.process_time()
        run = await rt.get_agent({iid!r})
        wall = time.perf_counter() - t0; cpu = time.process_time() - c0
        print(json.dumps({{"wall": wall, "cpu": cpu, "messages": len(run.inst.transcript)}}))
asyncio.run(main())
"""


def _load_in_child(store: Path, iid: str, warm: str, against: str | None = None) -> dict[str, Any]:
    """Time ``get_agent(iid)`` in a fresh process; with ``against``, the loopwright under that ``src`` folder."""
    code = _CHILD.format(here=str(HERE), store=str(store), iid=iid, warm=warm)
    env = None if against is None else {**os.environ, "PYTHONPATH": str(Path(against).resolve())}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


async def _build(store: Path, turns: int) -> tuple[str, float]:
    """Run an instance of ``turns`` tool turns to rest; return its id and one more turn's save cost."""
    plugin = BenchPlugin(turns, 0.0)
    async with runtime(store, plugin) as rt:
        run = await rt.start_agent(definition(turns + 2), None, "add")
        result = await run.result()
        assert result.text == "FAKE_FINAL", result
        iid = run.instance_id
    # One more tool turn on the rested instance, timed (turn, tool, answer: 2 model calls).
    plugin = BenchPlugin(1, 0.0)
    async with runtime(store, plugin) as rt:
        run = await rt.get_agent(iid)
        c0 = time.process_time()
        await run.message("one more")
        await run.result()
        cpu = time.process_time() - c0
    return iid, cpu


def resume(turns: int, repeat: int, store_dir: Path, against: str | None = None) -> dict[str, Any]:
    """Build a long and a short instance; time get_agent on each in fresh processes.

    With ``against`` (another checkout's ``core/src``), the long instance is also loaded by that
    loopwright, process by process in turn with this one, from the same files (``against``).
    """
    store = new_store(store_dir, "resume")
    long_id, long_more = asyncio.run(_build(store, turns))
    short_id, short_more = asyncio.run(_build(store, 10))
    warm_id, _ = asyncio.run(_build(store, 2))
    long_t: list[dict[str, Any]] = []
    short_t: list[dict[str, Any]] = []
    old_t: list[dict[str, Any]] = []
    for _ in range(repeat):
        if against is not None:
            old_t.append(_load_in_child(store, long_id, warm_id, against))
        long_t.append(_load_in_child(store, long_id, warm_id))
        short_t.append(_load_in_child(store, short_id, warm_id))
    lw = statistics.median(t["wall"] for t in long_t)
    sw = statistics.median(t["wall"] for t in short_t)
    return {
        "turns": turns, "repeat": repeat,
        "long": {"messages": long_t[0]["messages"], "get_agent_ms": round(lw * 1000, 2),
                 "cpu_ms": round(statistics.median(t["cpu"] for t in long_t) * 1000, 2),
                 "all_ms": [round(t["wall"] * 1000, 2) for t in long_t],
                 "one_more_turn_cpu_ms": round(long_more * 1000, 2),
                 "entries_bytes": (store / long_id / "entries.jsonl").stat().st_size},
        "short": {"messages": short_t[0]["messages"], "get_agent_ms": round(sw * 1000, 2),
                  "cpu_ms": round(statistics.median(t["cpu"] for t in short_t) * 1000, 2),
                  "all_ms": [round(t["wall"] * 1000, 2) for t in short_t],
                  "one_more_turn_cpu_ms": round(short_more * 1000, 2)},
        "ratio": round(lw / sw, 2),
        **({"against": {"src": against, "get_agent_ms": round(statistics.median(t["wall"] for t in old_t) * 1000, 2),
                        "cpu_ms": round(statistics.median(t["cpu"] for t in old_t) * 1000, 2),
                        "all_ms": [round(t["wall"] * 1000, 2) for t in old_t]}} if old_t else {}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", nargs="?", choices=["all", "many", "resume", "turn"], default="all")
    ap.add_argument("--runs", type=int, default=200, help="sequential instances (turn)")
    ap.add_argument("--top", type=int, default=25, help="functions listed (turn)")
    ap.add_argument("--n", type=int, default=1000, help="instances at once (many)")
    ap.add_argument("--k", type=int, default=3, help="tool turns per instance (many)")
    ap.add_argument("--latency-ms", type=float, default=50.0, help="model latency (many)")
    ap.add_argument("--no-memory", action="store_true",
                    help="skip the traced second burst (many): no KB per running instance, much faster at 10,000")
    ap.add_argument("--turns", type=int, default=10000, help="tool turns of the long instance (resume)")
    ap.add_argument("--repeat", type=int, default=5, help="fresh processes per instance (resume)")
    ap.add_argument("--against", metavar="SRC",
                    help="also load the long instance with the loopwright under SRC (another checkout's core/src), "
                         "process by process in turn with this one (resume): before and after figures")
    ap.add_argument("--store-dir", type=Path, default=HERE / "out" / "stores")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "scale.json")
    args = ap.parse_args()
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "machine": f"{platform.machine()} {os.cpu_count()} cpus",
                           "load": os.getloadavg()[0], "python": platform.python_version()}
    with contextlib.suppress(Exception):
        out["commit"] = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=HERE,
                                       capture_output=True, text=True, check=False).stdout.strip()
    if args.part in ("all", "many"):
        m = asyncio.run(many(args.n, args.k, args.latency_ms, args.store_dir, memory=not args.no_memory))
        out["many"] = m
        print(f"many: {m['n']} instances x {m['k'] + 1} turns, {m['latency_ms']:g} ms latency: "
              f"wall {m['wall_s']} s = {m['vs_bound']}x the bound ({m['bound_s']} s), "
              f"CPU {m['cpu_ms_per_turn']} ms/turn ({m['system_cpu_s']} s of it in the kernel), "
              f"peak RSS {m['peak_rss_mb']} MB (+{m['rss_growth_mb']} MB), "
              f"{m.get('kb_per_running_instance', '-')} KB per running instance, "
              f"GC {m['gc_s']} s CPU in {m['gc_collections']} collections, load {out['load']:.1f}"
              + ("" if m["valid"] else "  INVALID"))
    if args.part in ("all", "resume"):
        r = resume(args.turns, args.repeat, args.store_dir, args.against)
        out["resume"] = r
        print(f"resume: get_agent in a fresh process: {r['turns']} turns ({r['long']['messages']} messages) "
              f"{r['long']['get_agent_ms']} ms ({r['long']['cpu_ms']} ms CPU), "
              f"10 turns {r['short']['get_agent_ms']} ms: {r['ratio']}x; "
              f"one more turn: {r['long']['one_more_turn_cpu_ms']} ms CPU vs "
              f"{r['short']['one_more_turn_cpu_ms']} ms")
        if "against" in r:
            a = r["against"]
            print(f"resume, against {a['src']}: {r['turns']} turns {a['get_agent_ms']} ms ({a['cpu_ms']} ms CPU), "
                  f"all {a['all_ms']}; this one: all {r['long']['all_ms']}")
    if args.part == "turn":
        t = asyncio.run(turn_profile(args.runs, 10, args.store_dir, args.top))
        out["turn"] = t
        print(f"turn: in-process provider, file store, {t['runs']} runs of 11 turns: "
              f"{t['cpu_us_per_turn']} us CPU per turn")
        for p, us in t["profile_us_per_turn_by_package"].items():
            print(f"  {us:8.1f} us  {p}")
        for name, us, calls in t["top_self_us_per_turn"]:
            print(f"  {us:8.1f} us  {calls:6.2f}/turn  {name}")
    out["load_after"] = os.getloadavg()[0]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""loopwright's overhead benchmark: loopwright against a raw httpx loop, on a fake model server.

    python bench/run.py                 # sequential rounds + concurrent burst, ~30 s on 2 cores
    python bench/run.py --rounds 10 --runs 50 --burst-rounds 3     # more samples
    python bench/run.py --no-burst      # the sequential comparison only
    python bench/run.py --burst-only    # the burst only
    python bench/run.py --profile       # cProfile loopwright's sequential runs, print the top costs

What it measures (see bench/README.md):

* **Sequential**: one process runs both contenders in the same event loop, interleaved: a
  warm-up, then ``--rounds`` rounds, each running ``--runs`` complete agent runs of the raw loop
  and of loopwright (order alternating per round). Every run is ``--k`` tool turns plus one
  final answer, so ``k + 1`` model requests ("turns"). It reports wall time and process CPU time
  per turn, and loopwright / raw for both.
* **Burst**: ``--burst-n`` runs launched at once (``asyncio.gather``), ``--burst-k`` tool turns
  each, with ``--latency-ms`` of server latency per response, for raw httpx (OpenAI SDK pool
  limits), raw httpx2 (if installed) and loopwright. It reports the total wall time of each.

The fake server (bench/fake_server.py) runs as a separate process, so its CPU is not counted.
loopwright runs as a user would run it: an assembly file with a ``bench`` provider of kind
``openai`` and the default file store in a new folder under ``--store-dir`` (kept afterwards, see
below), the agent definition
bench/agents/adder.yaml, one async ``add`` tool registered by a plugin object, one runtime per
contender setup and a fresh instance per run.

**Where the stores go.** Each loopwright setup writes its instances to a new folder under
``--store-dir`` (default ``bench/out/stores/``, as a user's project folder holds
``.loopwright/instances``), and the folders are **kept**: on ext4 without a journal (this
machine's disk), the kernel skips recently deleted inodes when it allocates new ones, so deleting
thousands of files makes every file created in the same block group for the next few minutes
cost several times more system time (measured: 4 new files per instance cost 1.25 ms of system
time in /tmp, where test suites churn files, against 0.08 ms in a quiet folder). Deleting the
stores between rounds would charge that to the next contender. Delete ``bench/out/stores`` when you
like, just not right before measuring.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import importlib.metadata as md
import json
import os
import platform
import statistics
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx

import loopwright

HERE = Path(__file__).resolve().parent
SYSTEM_PROMPT = "You are a calculator. Use the add tool when asked to add numbers."
TOOL_DESCRIPTION = "Add two integers and return the sum."
FINAL_MARKER = "FAKE_FINAL"

CALLS = {"add": 0}  # how many times the tool ran: each run must make exactly k calls


async def add(a: int, b: int) -> int:
    """Add two integers and return the sum."""
    CALLS["add"] += 1
    return a + b


def make_prompt(k: int, latency_ms: float, run_id: int) -> str:
    return f"[[fake:k={k},latency_ms={latency_ms:g}]] Run {run_id}: what is 1+2? Use the add tool."


# -- the fake server ---------------------------------------------------------------------------


class Server:
    """bench/fake_server.py in a child process, on a free port."""

    def __init__(self, python: str = sys.executable) -> None:
        self.proc = subprocess.Popen(
            [python, str(HERE / "fake_server.py"), "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"the fake server did not start (said {line!r})")
        self.port = int(line.split()[1])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=10) as r:
            return json.loads(r.read())

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- the contenders ------------------------------------------------------------------------------

TOOLS = [{
    "type": "function",
    "function": {
        "name": "add",
        "description": TOOL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}]
DISPATCH = {"add": add}


class Raw:
    """The reference: a hand-written loop on one ``AsyncClient`` (OpenAI SDK pool limits:
    1000 connections, 100 kept alive), json.loads and a dict of tools. No validation, no store.
    """

    def __init__(self, module: Any, name: str) -> None:
        self.http = module
        self.name = name

    async def setup(self, base_url: str) -> None:
        self.url = base_url + "/chat/completions"
        self.client = self.http.AsyncClient(
            headers={"authorization": "Bearer x"},
            limits=self.http.Limits(max_connections=1000, max_keepalive_connections=100),
            timeout=self.http.Timeout(600.0, connect=5.0),
        )

    async def run(self, prompt: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                          {"role": "user", "content": prompt}]
        while True:
            r = await self.client.post(self.url, json={"model": "gpt-4o-mini", "messages": messages, "tools": TOOLS})
            r.raise_for_status()
            msg = r.json()["choices"][0]["message"]
            calls = msg.get("tool_calls")
            if not calls:
                return msg["content"]
            messages.append({"role": "assistant", "content": msg.get("content"), "tool_calls": calls})
            for c in calls:
                fn = c["function"]
                result = await DISPATCH[fn["name"]](**json.loads(fn["arguments"]))
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps(result)})

    async def close(self) -> None:
        await self.client.aclose()


class BenchTools:
    """The plugin object that gives loopwright the ``add`` tool."""

    @loopwright.hookimpl
    def loopwright_register_tools(self, register: Any) -> None:
        register(loopwright.tool(add))


class Loopwright:
    """loopwright as a user runs it: an assembly file, a definition file, one runtime, one
    instance per run, the default file store (in a temporary folder).
    """

    name = "loopwright"

    def __init__(self, provider_options: dict[str, Any] | None = None, label: str | None = None,
                 store_dir: Path | None = None) -> None:
        self.provider_options = provider_options or {}
        self.store_dir = store_dir or HERE / "out" / "stores"
        if label:
            self.name = label

    async def setup(self, base_url: str) -> None:
        self.stack = contextlib.AsyncExitStack()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix=dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S-"), dir=self.store_dir)
        port = base_url.rsplit(":", 1)[1].split("/", 1)[0]
        template = (HERE / "agents" / "loopwright.yaml").read_text()
        text = string.Template(template).substitute(port=port)
        if self.provider_options:
            text = text.replace("    apiKey: x\n", "    apiKey: x\n" + "".join(
                f"    {k}: {json.dumps(v)}\n" for k, v in self.provider_options.items()))
        assembly = Path(self.tmp) / "loopwright.yaml"
        assembly.write_text(text)
        self.rt = await self.stack.enter_async_context(
            loopwright.Runtime.from_file(assembly, plugins=[BenchTools()]))
        # Load (and check) the definition file once, as a host serving many tasks would.
        self.definition = self.rt.load_definition(HERE / "agents" / "adder.yaml")

    async def run(self, prompt: str) -> str:
        run = await self.rt.start_agent(self.definition, prompt=prompt)
        result = await run.result()
        return result.text or ""

    async def close(self) -> None:
        await self.stack.aclose()


def contender(name: str, provider_options: dict[str, Any] | None = None, store_dir: Path | None = None) -> Any:
    if name == "raw-httpx":
        return Raw(httpx, "raw-httpx")
    if name == "raw-httpx2":
        import httpx2  # noqa: PLC0415

        return Raw(httpx2, "raw-httpx2")
    if name == "loopwright":
        return Loopwright(provider_options, store_dir=store_dir)
    raise ValueError(name)


# -- measurement ---------------------------------------------------------------------------------


async def _block(server: Server, p: Any, *, k: int, runs: int, first_id: int, problems: list[str]) -> dict[str, Any]:
    """``runs`` complete runs of one contender, timed together, checked against the server's count."""
    gc.collect()
    s0 = server.stats()
    tools0 = CALLS["add"]
    c0 = time.process_time()
    t0 = time.perf_counter()
    for i in range(runs):
        out = await p.run(make_prompt(k, 0, first_id + i))
        if FINAL_MARKER not in out:
            problems.append(f"{p.name}: the final text lacks the marker: {out[:100]!r}")
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    s1 = server.stats()
    turns = runs * (k + 1)
    requests = s1["requests"] - s0["requests"]
    if requests != turns:
        problems.append(f"{p.name}: the server saw {requests} requests, expected {turns}")
    if CALLS["add"] - tools0 != runs * k:
        problems.append(f"{p.name}: the tool ran {CALLS['add'] - tools0} times, expected {runs * k}")
    return {
        "contender": p.name, "runs": runs, "turns": turns, "wall_s": wall, "cpu_s": cpu,
        "wall_ms_per_turn": wall / turns * 1e3, "cpu_ms_per_turn": cpu / turns * 1e3,
        "server_cpu_ms_per_turn": (s1["cpu_s"] - s0["cpu_s"]) / turns * 1e3,
        "server_connections_opened": s1["connections"] - s0["connections"],
    }


async def sequential(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved rounds of raw httpx and loopwright, one process, one event loop."""
    k = args.k
    players = [contender("raw-httpx"), contender("loopwright", args.provider_option, args.store_dir)]
    problems: list[str] = []
    blocks: list[dict[str, Any]] = []
    try:
        for p in players:
            await p.setup(server.base_url)
        for p in players:  # warm-up: imports, first connection, lazily built clients and caches
            await _block(server, p, k=k, runs=args.warmup, first_id=-1000, problems=problems)
        for r in range(args.rounds):
            for p in players if r % 2 == 0 else players[::-1]:
                block = await _block(server, p, k=k, runs=args.runs, first_id=r * args.runs, problems=problems)
                block["round"] = r + 1
                blocks.append(block)
                print(f"  round {r + 1:>2} {p.name:<11} {block['cpu_ms_per_turn']:7.3f} ms CPU/turn  "
                      f"{block['wall_ms_per_turn']:7.3f} ms wall/turn", file=sys.stderr)
    finally:
        for p in reversed(players):  # LIFO: an open Runtime holds a task group (a cancel scope)
            if hasattr(p, "client") or hasattr(p, "stack"):
                await p.close()
    summary: dict[str, Any] = {}
    for name in ("raw-httpx", "loopwright"):
        mine = [b for b in blocks if b["contender"] == name]
        summary[name] = {
            "cpu_ms_per_turn": statistics.median(b["cpu_ms_per_turn"] for b in mine),
            "wall_ms_per_turn": statistics.median(b["wall_ms_per_turn"] for b in mine),
            "cpu_ms_per_turn_min": min(b["cpu_ms_per_turn"] for b in mine),
            "wall_ms_per_turn_min": min(b["wall_ms_per_turn"] for b in mine),
            "server_cpu_ms_per_turn": statistics.median(b["server_cpu_ms_per_turn"] for b in mine),
        }
    by_round = {(b["round"], b["contender"]): b for b in blocks}

    def paired(key: str) -> float:  # loopwright / raw within each round, then the median
        return statistics.median(by_round[r, "loopwright"][key] / by_round[r, "raw-httpx"][key]
                                 for r in range(1, args.rounds + 1))

    raw, lw = summary["raw-httpx"], summary["loopwright"]
    return {
        "k": k, "rounds": args.rounds, "runs_per_round": args.runs, "warmup": args.warmup,
        "summary": summary,
        "ratio_cpu": lw["cpu_ms_per_turn"] / raw["cpu_ms_per_turn"],
        "ratio_wall": lw["wall_ms_per_turn"] / raw["wall_ms_per_turn"],
        "ratio_cpu_paired_median": paired("cpu_ms_per_turn"),
        "ratio_wall_paired_median": paired("wall_ms_per_turn"),
        "blocks": blocks, "valid": not problems, "problems": problems[:10],
    }


async def burst_one(server: Server, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--burst-n`` runs at once through one freshly built contender."""
    p = contender(name, args.provider_option, args.store_dir)
    k, n, lat = args.burst_k, args.burst_n, args.latency_ms
    problems: list[str] = []
    await p.setup(server.base_url)
    try:
        out = await p.run(make_prompt(k, 0, -1))  # warm-up: lazy initialisation out of the timed part
        if FINAL_MARKER not in out:
            problems.append(f"warm-up final text lacks the marker: {out[:100]!r}")
        gc.collect()
        s0 = server.stats()
        tc0 = CALLS["add"]
        c0 = time.process_time()
        t0 = time.perf_counter()
        results = await asyncio.gather(*(p.run(make_prompt(k, lat, i)) for i in range(n)), return_exceptions=True)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        s1 = server.stats()
    finally:
        await p.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        problems.append(f"{len(errors)} runs raised, the first: {errors[0]!r}"[:300])
    bad = [r for r in results if not isinstance(r, BaseException) and FINAL_MARKER not in r]
    if bad:
        problems.append(f"{len(bad)} runs lack the final marker")
    turns = n * (k + 1)
    if s1["requests"] - s0["requests"] != turns:
        problems.append(f"server saw {s1['requests'] - s0['requests']} requests, expected {turns}")
    if CALLS["add"] - tc0 != n * k:
        problems.append(f"tool ran {CALLS['add'] - tc0} times, expected {n * k}")
    return {
        "contender": name, "n": n, "k": k, "latency_ms": lat, "turns": turns,
        "wall_s": wall, "cpu_s": cpu, "ideal_wall_s": (k + 1) * lat / 1e3,
        "cpu_ms_per_turn": cpu / turns * 1e3,
        "server_connections_opened": s1["connections"] - s0["connections"],
        "valid": not problems, "problems": problems[:5],
    }


async def bursts(server: Server, args: argparse.Namespace) -> list[dict[str, Any]]:
    names = ["raw-httpx2", "loopwright", "raw-httpx"]
    try:
        import httpx2  # noqa: F401, PLC0415
    except ImportError:
        print("  httpx2 is not installed: its burst is skipped (uv pip install httpx2)", file=sys.stderr)
        names.remove("raw-httpx2")
    out = []
    for r in range(args.burst_rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            res = await burst_one(server, name, args)
            res["round"] = r + 1
            out.append(res)
            print(f"  burst {r + 1} {name:<11} {res['wall_s']:6.2f} s wall  "
                  f"({res['server_connections_opened']} connections opened)"
                  + ("" if res["valid"] else f"  INVALID: {res['problems']}"), file=sys.stderr)
    return out


async def profile(server: Server, args: argparse.Namespace) -> None:
    """cProfile the sequential runs of raw httpx and of loopwright; print self time per package
    side by side (per turn), then loopwright's top functions.
    """
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    timer = time.process_time if args.profile_clock == "cpu" else time.perf_counter
    runs = args.runs * args.rounds
    turns = runs * (args.k + 1)
    per_pkg: dict[str, dict[str, float]] = {}
    stats: dict[str, pstats.Stats] = {}
    for name in ("raw-httpx", "loopwright"):
        p = contender(name, args.provider_option, args.store_dir)
        await p.setup(server.base_url)
        try:
            for i in range(args.warmup):
                await p.run(make_prompt(args.k, 0, -1 - i))
            gc.collect()
            prof = cProfile.Profile(timer)
            c0 = time.process_time()
            prof.enable()
            for i in range(runs):
                await p.run(make_prompt(args.k, 0, i))
            prof.disable()
            cpu = time.process_time() - c0
        finally:
            await p.close()
        print(f"{name}: {runs} runs ({turns} turns), {cpu / turns * 1e3:.3f} ms CPU/turn under cProfile",
              file=sys.stderr)
        st = stats[name] = pstats.Stats(prof)
        pkgs: dict[str, float] = {}
        for (file, _line, _fn), (_cc, _nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
            key = _package(file)
            pkgs[key] = pkgs.get(key, 0.0) + tt
        pkgs["TOTAL"] = sum(pkgs.values())
        per_pkg[name] = pkgs
    out = Path(args.profile_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stats["loopwright"].dump_stats(out)
    stats["raw-httpx"].dump_stats(out.with_name(out.stem + ".raw-httpx" + out.suffix))
    clock = "CPU" if args.profile_clock == "cpu" else "wall"
    print(f"\nself time ({clock} clock) by package, us per turn (k={args.k}; profiler overhead included):")
    print(f"  {'package':<30} {'raw-httpx':>10} {'loopwright':>11} {'delta':>9}")
    raw, lw = per_pkg["raw-httpx"], per_pkg["loopwright"]
    keys = sorted(set(raw) | set(lw), key=lambda k: -(lw.get(k, 0.0) + raw.get(k, 0.0)))
    for key in keys[:25]:
        a, b = raw.get(key, 0.0) / turns * 1e6, lw.get(key, 0.0) / turns * 1e6
        print(f"  {key:<30} {a:10.1f} {b:11.1f} {b - a:+9.1f}")
    print(f"\nloopwright's profile saved to {out} (python -m pstats {out}), raw httpx's next to it\n")
    st = stats["loopwright"]
    st.sort_stats("tottime").print_stats(args.profile_top)
    st.sort_stats("cumulative").print_stats(args.profile_top)


def _package(file: str) -> str:
    if file.startswith(("~", "<")):
        return "builtins/C"
    parts = Path(file).parts
    for marker in ("site-packages", "src"):
        if marker in parts:
            i = parts.index(marker)
            if i + 1 < len(parts):
                return parts[i + 1].removesuffix(".py")
    if "python3" in "".join(parts) or "lib" in parts:
        return "stdlib:" + Path(file).stem
    return Path(file).name


# -- report --------------------------------------------------------------------------------------


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in ("loopwright-core", "loopwright-openai", "httpx", "httpcore", "httpx2", "httpcore2", "anyio"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _cpu_model() -> str:
    with contextlib.suppress(OSError), Path("/proc/cpuinfo").open() as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def report(result: dict[str, Any]) -> None:
    seq = result.get("sequential")
    if seq:
        s = seq["summary"]
        print(f"\nSequential: k={seq['k']} ({seq['k'] + 1} model requests per run), {seq['rounds']} rounds "
              f"x {seq['runs_per_round']} runs each, medians of the rounds")
        print(f"{'':<12} {'CPU ms/turn':>12} {'wall ms/turn':>13} {'best CPU':>9} {'best wall':>10}")
        for name in ("raw-httpx", "loopwright"):
            x = s[name]
            print(f"{name:<12} {x['cpu_ms_per_turn']:12.3f} {x['wall_ms_per_turn']:13.3f} "
                  f"{x['cpu_ms_per_turn_min']:9.3f} {x['wall_ms_per_turn_min']:10.3f}")
        print(f"loopwright / raw:  CPU {seq['ratio_cpu']:.2f}x   wall {seq['ratio_wall']:.2f}x   "
              f"(paired per round: CPU {seq['ratio_cpu_paired_median']:.2f}x, "
              f"wall {seq['ratio_wall_paired_median']:.2f}x; budget 1.5x, goal 1.2x)")
        if not seq["valid"]:
            print(f"INVALID: {seq['problems']}")
    if result.get("burst"):
        b0 = result["burst"][0]
        print(f"\nBurst: {b0['n']} runs at once, k={b0['k']}, {b0['latency_ms']:g} ms server latency "
              f"(ideal {b0['ideal_wall_s']:.2f} s)")
        print(f"{'':<12} {'wall s':>8} {'CPU ms/turn':>12} {'conns':>6}")
        for b in sorted(result["burst"], key=lambda b: (b["contender"], b["round"])):
            print(f"{b['contender']:<12} {b['wall_s']:8.2f} {b['cpu_ms_per_turn']:12.3f} "
                  f"{b['server_connections_opened']:6d}" + ("" if b["valid"] else f"  INVALID: {b['problems']}"))


def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def main() -> None:
    ap = argparse.ArgumentParser(description="loopwright vs a raw httpx loop, on a fake OpenAI server",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--k", type=int, default=10, help="sequential: tool turns per run (+1 final answer)")
    ap.add_argument("--runs", type=int, default=20, help="sequential: runs per contender per round")
    ap.add_argument("--rounds", type=int, default=5, help="sequential: interleaved rounds")
    ap.add_argument("--warmup", type=int, default=3, help="sequential: untimed runs per contender first")
    ap.add_argument("--burst-n", type=int, default=200, help="burst: runs launched at once")
    ap.add_argument("--burst-k", type=int, default=5, help="burst: tool turns per run")
    ap.add_argument("--latency-ms", type=float, default=50.0, help="burst: server latency per response")
    ap.add_argument("--burst-rounds", type=int, default=1, help="burst: rounds (contender order rotates)")
    ap.add_argument("--no-burst", action="store_true", help="skip the burst")
    ap.add_argument("--burst-only", action="store_true", help="skip the sequential rounds")
    ap.add_argument("--provider-option", type=_option, action="append", default=[], metavar="KEY=VALUE",
                    help="an extra option of loopwright's bench provider, e.g. poolShards=1 (repeatable)")
    ap.add_argument("--store-dir", type=Path, default=HERE / "out" / "stores",
                    help="where each loopwright setup makes its store folder (kept: see the module docstring)")
    ap.add_argument("--profile", action="store_true",
                    help="instead of measuring, cProfile raw httpx's and loopwright's sequential runs "
                         "(--rounds x --runs each) and compare them")
    ap.add_argument("--profile-out", default=str(HERE / "results" / "loopwright.prof"))
    ap.add_argument("--profile-top", type=int, default=30)
    ap.add_argument("--profile-clock", choices=["cpu", "wall"], default="cpu",
                    help="cProfile's timer: process CPU time or wall time")
    ap.add_argument("--json", default=str(HERE / "results" / "last.json"), help="where to write the result")
    args = ap.parse_args()
    args.provider_option = dict(args.provider_option)

    server = Server()
    try:
        if args.profile:
            asyncio.run(profile(server, args))
            return
        result: dict[str, Any] = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "host": f"{platform.system()} {platform.release()} {platform.machine()}",
            "cpus": os.cpu_count(), "cpu_model": _cpu_model(),
            "python": platform.python_version(),
            "commit": _commit(), "versions": _versions(),
            "argv": sys.argv[1:], "provider_options": args.provider_option,
        }

        async def go() -> None:
            if not args.burst_only:
                print("sequential rounds", file=sys.stderr)
                result["sequential"] = await sequential(server, args)
            if not args.no_burst:
                print("concurrent bursts", file=sys.stderr)
                result["burst"] = await bursts(server, args)

        asyncio.run(go())
    finally:
        server.close()
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    report(result)
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()

"""Long-term memory's cost: recall latency over 10,000 facts, and what recall adds to a turn.

Run: ``uv run --no-sync python bench/memory.py``. Prints, from one run:

* ``remember``: mean time to keep one fact while the database fills to 10,000 facts (100 subjects,
  4 namespaces, 100 facts each);
* ``recall``: median and 95th percentile of a ranked recall (5 facts, 2 namespaces, a
  four-word query) against those 10,000 facts, and of a recall without words (newest first);
* a turn: the median time of one model turn on a scripted provider (no network) for the same
  definition with and without ``memory:``, and their ratio: what recall adds to a turn.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "core" / "tests"))

from helpers import Harness, defn, make_runtime, reply

from loopwright._definition import Capabilities, MemoryConfig, MemoryGrants, MemorySpec
from loopwright.builtins.sqlite_memory import SqliteMemory
from loopwright.memory import MemorySettings

WORDS = [
    "printer",
    "invoice",
    "refund",
    "password",
    "delivery",
    "laptop",
    "screen",
    "battery",
    "account",
    "email",
    "phone",
    "address",
    "order",
    "ticket",
    "warranty",
    "monitor",
    "keyboard",
    "cable",
    "router",
    "network",
]
SUBJECTS, NAMESPACES, PER = 100, ("profile", "tickets", "orders", "notes"), 25
TURNS = 200


def _fact(i: int) -> str:
    return " ".join(WORDS[(i * k) % len(WORDS)] for k in (1, 3, 7, 11, 13)) + f" case {i}"


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[int(q * (len(values) - 1))]


async def bench_memory(folder: Path) -> None:
    mem = SqliteMemory(MemorySettings(kind="sqlite", base_dir=folder, options={"path": str(folder / "m.db")}))
    t0 = time.perf_counter()
    n = 0
    for s in range(SUBJECTS):
        for ns in NAMESPACES:
            for _ in range(PER):
                await mem.remember(f"customer-{s}", ns, _fact(n))
                n += 1
    per = (time.perf_counter() - t0) / n
    print(f"remember: {n} facts, {per * 1e6:.0f} us each (mean)")
    for label, query in (("ranked", "refund for the broken printer"), ("newest", "")):
        times = []
        for i in range(500):
            t = time.perf_counter()
            await mem.recall(f"customer-{i % SUBJECTS}", ["profile", "tickets"], query, limit=5)
            times.append(time.perf_counter() - t)
        print(
            f"recall ({label}) over {n} facts: median {statistics.median(times) * 1e6:.0f} us, "
            f"p95 {_pct(times, 0.95) * 1e6:.0f} us"
        )
    await mem.aclose()


async def turn_time(folder: Path, *, memory: bool) -> float:
    h = Harness(*[reply("ok") for _ in range(TURNS + 10)])
    rt = make_runtime(
        folder,
        h,
        memory=MemoryConfig(options={"path": str(folder / "m.db")}),
        capabilities=Capabilities(memory=MemoryGrants(read=NAMESPACES, write=NAMESPACES)),
    )
    spec = MemorySpec(subject="customer-7", read=("profile", "tickets")) if memory else None
    d = defn(system_prompt="You help.", memory=spec)
    times = []
    async with rt:
        run = await rt.start_agent(d, None, "hello")
        await run.wait()
        for i in range(TURNS):
            t = time.perf_counter()
            run = await rt.message(run.instance_id, f"my printer needs a refund, order {i}")
            await run.wait()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        await bench_memory(root)
        for name in ("off", "on"):
            (root / name / "store").mkdir(parents=True)
        # The memory file of the bench above, copied so both turns see 10,000 facts on disk.
        for name in ("off", "on"):
            (root / name / "m.db").write_bytes((root / "m.db").read_bytes())
        without = await turn_time(root / "off", memory=False)
        with_memory = await turn_time(root / "on", memory=True)
        print(f"turn without memory: {without * 1e3:.2f} ms (median of {TURNS})")
        print(f"turn with memory:    {with_memory * 1e3:.2f} ms (median of {TURNS})")
        print(f"recall adds {(with_memory - without) * 1e3:.2f} ms a turn: ratio {with_memory / without:.2f}")


if __name__ == "__main__":
    anyio.run(main)

#!/usr/bin/env python3
"""Summarise a shared-harness run (its ``OUT/results.jsonl``) as one Markdown table.

    python bench/peer_table.py /tmp/bench_out/peers [--ref baseline-httpx]

The harness's own report gives the wall-time ratio only; this adds the CPU ratio and the burst
(median over rounds for every figure), and writes ``summary.json`` next to the results.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("out", type=Path, help="the harness's OUT folder (holds results.jsonl)")
    ap.add_argument("--ref", default="baseline-httpx", help="the row the ratios are relative to")
    args = ap.parse_args()
    rows = [json.loads(line) for line in (args.out / "results.jsonl").read_text().splitlines() if line.strip()]
    by: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        if not r.get("valid"):
            continue
        by.setdefault(r["framework"], {}).setdefault(r["mode"], []).append(r)

    def med(rs: list[dict[str, Any]], key: str) -> float | None:
        values = [r[key] for r in rs if key in r]
        return statistics.median(values) if values else None

    summary: dict[str, dict[str, Any]] = {}
    for name, modes in by.items():
        seq, conc = modes.get("seq", []), modes.get("conc", [])
        versions = (seq or conc)[0].get("versions") or {}
        summary[name] = {
            "version": next((f"{k} {v}" for k, v in versions.items() if v), ""),
            "cpu_ms_per_turn": med(seq, "cpu_ms_per_turn"),
            "wall_ms_per_turn": med(seq, "wall_ms_per_turn"),
            "seq_rounds": len(seq),
            "conc_wall_s": med(conc, "wall_s"),
            "conc_wall_s_all": [round(r["wall_s"], 2) for r in conc],
            "conc_cpu_ms_per_turn": med(conc, "cpu_ms_per_turn"),
            "peak_rss_mb": med(conc, "peak_rss_mb"),
        }
    ref = summary.get(args.ref, {})
    for s in summary.values():
        for key in ("cpu_ms_per_turn", "wall_ms_per_turn"):
            s[f"{key}_ratio"] = s[key] / ref[key] if s.get(key) and ref.get(key) else None
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    def f(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    print(f"| framework | version | CPU ms/turn | CPU vs {args.ref} | wall ms/turn | wall vs {args.ref} "
          "| burst wall s (median; all rounds) | burst CPU ms/turn |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for name, s in sorted(summary.items(), key=lambda kv: kv[1]["cpu_ms_per_turn"] or 1e9):
        print(f"| {name} | {s['version']} | {f(s['cpu_ms_per_turn'], '.3f')} | {f(s['cpu_ms_per_turn_ratio'], '.2f')} "
              f"| {f(s['wall_ms_per_turn'], '.3f')} | {f(s['wall_ms_per_turn_ratio'], '.2f')} "
              f"| {f(s['conc_wall_s'], '.2f')} ({', '.join(map(str, s['conc_wall_s_all']))}) "
              f"| {f(s['conc_cpu_ms_per_turn'], '.2f')} |")
    invalid = [r for r in rows if not r.get("valid")]
    if invalid:
        print(f"\n{len(invalid)} invalid result(s): " + "; ".join(
            f"{r.get('framework')} {r.get('tag')}: {r.get('problems')}" for r in invalid)[:1000])


if __name__ == "__main__":
    main()

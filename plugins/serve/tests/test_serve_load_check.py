"""The serve load check (``bench/serve_load.py``) runs in CI at a small size, so it cannot rot.

The figures themselves (200 instances, 200 SSE clients) are measured on demand and kept in
``bench/RESULTS.md``; here the same script runs 12 instances, each followed by its own SSE client,
and must see every one of them reach its final answer, in-process and over HTTP.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_load_check_follows_every_instance_to_its_answer(tmp_path: Path) -> None:
    """12 instances started over HTTP at once, 12 SSE clients: every stream ends with its final answer."""
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "serve_load.py"), "--n", "12", "--k", "1", "--latency-ms", "5",
         "--store-dir", str(tmp_path / "stores"), "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["n"] == 12
    assert figures["http"]["valid"] is True
    assert figures["in_process"]["wall_s"] > 0
    assert figures["http"]["server_peak_rss_mb"] > 0

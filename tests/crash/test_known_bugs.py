"""Regression tests for the core bugs the kill matrix found, one deterministic kill each.

Each was a strict xfail until its fix landed; they now pass and guard against a return. The
matrix still tags a violation with its ``kill_matrix.KNOWN_BUGS`` name, so a regression says
which of these it is.
"""

from __future__ import annotations

from pathlib import Path

import kill_matrix
import pytest
from kill_matrix import Scenario, Stage

pytestmark = pytest.mark.slow


def _violations(tmp_path: Path, bug: str, script: str, *points: str) -> list[str]:
    """Play one scenario; return its violations, all of which must be the known ``bug``.

    Anything else raises RuntimeError, so a broken harness or a new bug fails these tests loudly.
    """
    outcome = kill_matrix.run_scenario(tmp_path, Scenario(0, script, tuple(Stage("point", p) for p in points)))
    if not outcome.kills or any(v.bug != bug for v in outcome.violations):
        raise RuntimeError(f"not (only) the known bug {bug!r}:\n{outcome.describe()}")
    return [str(v) for v in outcome.violations]


def test_a_kill_right_after_the_segment_starts_keeps_the_task_prompt(tmp_path: Path) -> None:
    """Killed after the first 'seg' entry, before the prompt is saved: the resumed transcript has the prompt."""
    assert _violations(tmp_path, "lost-prompt", "mixed", "entry:seg:1:after") == []


def test_a_kill_after_task_complete_is_saved_still_completes(tmp_path: Path) -> None:
    """Killed after task_complete's result is saved, before the header: resume ends completed, no model call."""
    assert _violations(tmp_path, "resume-reasks", "complete", "entry:result:5:after") == []


def test_a_task_complete_run_by_the_repair_completes(tmp_path: Path) -> None:
    """Killed in the call before task_complete in the same turn: the repair runs it and the instance completes."""
    assert _violations(tmp_path, "resume-reasks", "complete", "tool:charge:2:after") == []


def test_a_kill_while_the_resting_header_is_written_asks_the_model_no_more(tmp_path: Path) -> None:
    """Killed just before the resting header's rename: resume rests 'waiting' without another model call."""
    assert _violations(tmp_path, "resume-reasks", "mixed", "header:2:rename") == []


def test_a_torn_turn_entry_does_not_lose_the_model_calls_usage(tmp_path: Path) -> None:
    """A write torn inside the 'turn' line after a complete answer line: turns and usage still count the call."""
    assert _violations(tmp_path, "torn-turn", "mixed", "entry:answer:2:torn-last") == []


def test_a_kill_while_the_instance_is_created_leaves_no_corrupt_header(tmp_path: Path) -> None:
    """Killed halfway through the first header: the instance does not exist, and nothing warns about it."""
    assert _violations(tmp_path, "torn-create", "mixed", "header:1:torn") == []

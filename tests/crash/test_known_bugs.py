"""Core bugs the kill matrix found, one deterministic kill each (strict xfail until fixed).

The matrix reports these as known bugs (``kill_matrix.KNOWN_BUGS``) instead of failing. When a
fix lands, its test here passes, strict xfail turns that into a failure: remove the marker and
the ``KNOWN_BUGS`` entry (and the ``bug=`` tag in ``kill_matrix``) together.
"""

from __future__ import annotations

from pathlib import Path

import kill_matrix
import pytest
from kill_matrix import Scenario, Stage

pytestmark = pytest.mark.slow


def _violations(tmp_path: Path, bug: str, script: str, *points: str) -> list[str]:
    """Play one scenario; return its violations, all of which must be the known ``bug``.

    Anything else raises RuntimeError, which the ``raises=AssertionError`` xfail markers do not
    excuse: a broken harness or a new bug fails these tests instead of passing as expected.
    """
    outcome = kill_matrix.run_scenario(tmp_path, Scenario(0, script, tuple(Stage("point", p) for p in points)))
    if not outcome.kills or any(v.bug != bug for v in outcome.violations):
        raise RuntimeError(f"not (only) the known bug {bug!r}:\n{outcome.describe()}")
    return [str(v) for v in outcome.violations]


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "BUG: a kill between the instance's creation and the saving of its task prompt loses the prompt: "
    "_runtime.py start_agent creates the instance 'running', but the prompt is appended only later by "
    "_begin, after run_segment's 'seg' entry (_loop.py); Runtime.resume then repairs and calls the model on "
    "a transcript without the task."))
def test_a_kill_right_after_the_segment_starts_keeps_the_task_prompt(tmp_path: Path) -> None:
    """Killed after the first 'seg' entry, before the prompt is saved: the resumed transcript has the prompt."""
    assert _violations(tmp_path, "lost-prompt", "mixed", "entry:seg:1:after") == []


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "BUG: resume asks the model again when the last turn's work was saved but the resting header was not. "
    "_loop.py repair_interrupted never applies _end_of_turn to the interrupted turn, and _turns always "
    "calls _infer next: a saved successful task_complete is ignored (the instance ends 'waiting', not "
    "'completed')."))
def test_a_kill_after_task_complete_is_saved_still_completes(tmp_path: Path) -> None:
    """Killed after task_complete's result is saved, before the header: resume ends completed, no model call."""
    assert _violations(tmp_path, "resume-reasks", "complete", "entry:result:5:after") == []


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "BUG: a task_complete that repair_interrupted runs on resume does not end the loop: _loop.py "
    "repair_interrupted gives the remaining calls results but skips _end_of_turn, so the model is "
    "asked again and the instance rests 'waiting' instead of 'completed'."))
def test_a_task_complete_run_by_the_repair_completes(tmp_path: Path) -> None:
    """Killed in the call before task_complete in the same turn: the repair runs it and the instance completes."""
    assert _violations(tmp_path, "resume-reasks", "complete", "tool:charge:2:after") == []


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "BUG: a final answer saved just before a kill is asked for again: the kill lands while the resting "
    "header is written (_loop.py run_segment), the old header says 'running', and resume calls the "
    "model once more although the transcript already ends with an answer without tool calls."))
def test_a_kill_while_the_resting_header_is_written_asks_the_model_no_more(tmp_path: Path) -> None:
    """Killed just before the resting header's rename: resume rests 'waiting' without another model call."""
    assert _violations(tmp_path, "resume-reasks", "mixed", "header:2:rename") == []


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "BUG: _loop.py _infer appends the answer and its 'turn' entry as two lines of one write; a "
    "short write that keeps the first line and tears the second (SIGKILL mid-write at a page boundary, power "
    "loss) keeps the answer but loses the turn: rebuild (_instance.py) under-counts turns, usage, cost and "
    "the maxIterations counter."))
def test_a_torn_turn_entry_does_not_lose_the_model_calls_usage(tmp_path: Path) -> None:
    """A write torn inside the 'turn' line after a complete answer line: turns and usage still count the call."""
    assert _violations(tmp_path, "torn-turn", "mixed", "entry:answer:2:torn-last") == []


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "BUG: FileStore.create writes the first header in place (file_store.py, since commit 4320990): a kill "
    "during that write leaves an empty or torn instance.json, so 'show ID' and 'resume ID' fail with 'is not "
    "valid JSON' (exit 1) instead of 'no instance' (exit 2), and every 'ls' logs a warning about it "
    "(list_headers). Before, a kill there left no header and the folder was ignored."))
def test_a_kill_while_the_instance_is_created_leaves_no_corrupt_header(tmp_path: Path) -> None:
    """Killed halfway through the first header: the instance does not exist, and nothing warns about it."""
    assert _violations(tmp_path, "torn-create", "mixed", "header:1:torn") == []

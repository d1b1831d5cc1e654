"""Regression tests for the core bugs the kill matrix found, one deterministic kill each.

Each was a strict xfail until its fix landed; they now pass and guard against a return. A
regression fails here and in the matrix. An open bug gets a narrow tag in ``KNOWN_BUGS`` and an
xfail test here naming it; none is open.
"""

from __future__ import annotations

from pathlib import Path

import kill_matrix
import pytest
from kill_matrix import Scenario, Stage

pytestmark = pytest.mark.slow


def _stage(raw: str) -> Stage:
    if raw == "plain":
        return Stage("plain")
    if raw.startswith("deadmail:"):
        return Stage("deadmail", raw.removeprefix("deadmail:"))
    return Stage("point", raw)


def _violations(tmp_path: Path, script: str, *points: str) -> list[str]:
    """Play one scenario (``plain``, a kill point, or ``deadmail:POINT`` per process); return its violations.

    A kill point that was not reached raises RuntimeError, so a broken harness fails loudly.
    """
    stages = tuple(_stage(p) for p in points)
    outcome = kill_matrix.run_scenario(tmp_path, Scenario(0, script, stages))
    if not outcome.kills:
        raise RuntimeError(f"no kill landed:\n{outcome.describe()}")
    return [str(v) for v in outcome.violations]


def test_a_kill_right_after_the_segment_starts_keeps_the_task_prompt(tmp_path: Path) -> None:
    """Killed after the first 'seg' entry, before the prompt is saved: the resumed transcript has the prompt."""
    assert _violations(tmp_path, "mixed", "entry:seg:1:after") == []


def test_a_kill_after_task_complete_is_saved_still_completes(tmp_path: Path) -> None:
    """Killed after task_complete's result is saved, before the header: resume ends completed, no model call."""
    assert _violations(tmp_path, "complete", "entry:result:5:after") == []


def test_a_task_complete_run_by_the_repair_completes(tmp_path: Path) -> None:
    """Killed in the call before task_complete in the same turn: the repair runs it and the instance completes."""
    assert _violations(tmp_path, "complete", "tool:charge:2:after") == []


def test_a_kill_while_the_resting_header_is_written_asks_the_model_no_more(tmp_path: Path) -> None:
    """Killed just before the resting header's rename: resume rests 'waiting' without another model call."""
    assert _violations(tmp_path, "mixed", "header:2:rename") == []


def test_a_torn_turn_entry_does_not_lose_the_model_calls_usage(tmp_path: Path) -> None:
    """A write torn inside the 'turn' line after a complete answer line: turns and usage still count the call."""
    assert _violations(tmp_path, "mixed", "entry:answer:2:torn-last") == []


def test_a_kill_while_the_instance_is_created_leaves_no_corrupt_header(tmp_path: Path) -> None:
    """Killed halfway through the first header: the instance does not exist, and nothing warns about it."""
    assert _violations(tmp_path, "mixed", "header:1:torn") == []


def test_a_kill_during_an_approved_call_gives_it_one_result(tmp_path: Path) -> None:
    """Issue 15 item 1: ``approve`` killed while the approved (non-idempotent) call ran.

    The resumed instance gives the call ``unknown_outcome`` (exactly one result), asks the model
    no dangling call, and its header no longer lists the decided call. It used to have no result
    at all, because the repair skipped calls the header still listed as pending.
    """
    assert _violations(tmp_path, "approve", "plain", "tool:wire_slow:1:after") == []


def test_a_kill_during_an_approved_idempotent_call_runs_it_again(tmp_path: Path) -> None:
    """The second held call of the script (idempotent) killed in flight: resume runs it again, once."""
    assert _violations(tmp_path, "approve", "plain", "plain", "tool:probe_slow:1:after") == []


def test_a_kill_after_the_decision_is_saved_goes_on_with_it(tmp_path: Path) -> None:
    """Killed just after ``approve`` saved the decision, before the segment went on: resume runs the call."""
    assert _violations(tmp_path, "approve", "plain", "header:1:after") == []


def test_a_kill_before_a_denied_result_is_saved_denies_it_once(tmp_path: Path) -> None:
    """``deny`` killed after the instance runs again, before the denied result is saved: one denied result."""
    assert _violations(tmp_path, "deny", "plain", "header:2:after") == []


def test_a_kill_after_an_answer_is_saved_does_not_answer_the_question_twice(tmp_path: Path) -> None:
    """``message`` killed after the ask_user answer was saved, before the header forgot the question.

    The resumed instance has exactly one result for the ask_user call. It used to answer it
    again from the still-queued message (two results for one call).
    """
    assert _violations(tmp_path, "faults", "plain", "entry:result:1:after") == []


def test_a_kill_in_the_turn_after_an_answer_does_not_answer_the_question_again(tmp_path: Path) -> None:
    """Killed in a call of the turn after the answer: the answer is not appended again at the end."""
    assert _violations(tmp_path, "faults", "plain", "tool:priced:1:after") == []


def test_a_message_to_an_instance_killed_before_its_prompt_was_saved_keeps_the_prompt(tmp_path: Path) -> None:
    """Killed before the task prompt is saved, then messaged: the message's process resumes it, prompt first.

    The message's process used to start a plain new segment for the mail, so the task prompt was
    never given and the interrupted turn never finished (found by the matrix: seed 100859066).
    """
    assert _violations(tmp_path, "mixed", "deadmail:entry:prompt:1:before") == []


def test_a_message_to_an_instance_killed_in_a_call_gives_the_call_one_result(tmp_path: Path) -> None:
    """Killed in a non-idempotent call, then messaged: the call gets unknown_outcome once, then the mail is read."""
    assert _violations(tmp_path, "mixed", "deadmail:tool:charge:1:after") == []


def test_a_kill_after_an_answer_is_saved_keeps_its_turn_record(tmp_path: Path) -> None:
    """Killed after the answer's line, before its records are written: the turn records still add up (item 7)."""
    assert _violations(tmp_path, "mixed", "entry:answer:2:after") == []


def test_a_kill_after_a_tool_result_is_saved_keeps_its_tool_call_record(tmp_path: Path) -> None:
    """Killed after a tool result's line, before the turn's records are written: each result has its record."""
    assert _violations(tmp_path, "mixed", "entry:result:2:after") == []



@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> kill_matrix.Outcome:
    """A parent starts a child and awaits it; the child's held call is approved from the root (no kill)."""
    return kill_matrix.run_scenario(tmp_path_factory.mktemp("tree"),
                                    Scenario(0, kill_matrix.TREE_SCENARIO, (Stage("plain"),)))


def test_a_tree_keeps_every_invariant(tree: kill_matrix.Outcome) -> None:
    """The tree rests with every invariant (no violation of any kind)."""
    assert tree.instance_id is not None
    assert [str(v) for v in tree.violations] == []


def test_a_trees_records_are_valid_against_the_record_schema(tree: kill_matrix.Outcome) -> None:
    """Every record of the tree (the parent's 'agent' record of the child's start included) is valid."""
    assert [str(v) for v in tree.violations] == []


def test_a_child_created_before_its_caller_listed_it_is_in_the_callers_tree(tmp_path: Path) -> None:
    """Killed in run_agent_async after the child started, before the call's result is saved: the root lists it.

    Issue 17 (``orphan-child``): the caller listed the child only after creating it, so a kill in
    between left a child outside the root's tree (its cost out of the subtree cost, its held
    calls out of reach of ``approve ROOT --call``).
    """
    assert _violations(tmp_path, "tree", "spawn:1:started") == []


def test_a_child_id_listed_before_the_child_was_created_is_skipped(tmp_path: Path) -> None:
    """Killed in run_agent_async after the caller listed the child's id, before creating it: the tree rests clean."""
    assert _violations(tmp_path, "tree", "spawn:1:linked") == []

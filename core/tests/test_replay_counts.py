"""The instance log's replay and the live counters: what a segment, a tree and a history hold.

Found by mutation testing (docs/testing.md, "The instance log and the file store, session 7"):
each test here failed against a mutant of ``loopwright._instance`` that the rest of the suite let
through. They test documented behaviour, not the mutants: the tokens a segment counts (input and
output), the cost of a segment with its descendants', a segment's cost restarting at zero, an
unknown cost staying unknown on replay, turn 0 of a history, and malformed saved messages raising
the converter's error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import defn

from loopwright import HeaderFields, Message
from loopwright._instance import Instance, message_from_json
from loopwright._instance import _message_structure as converter_structure
from loopwright._replay import history_at, rebuild
from loopwright._types import Cost, Usage


def instance(iid: str = "i", spawner: Instance | None = None) -> Instance:
    return Instance(id=iid, definition=defn(), header=HeaderFields({}), spawner=spawner)


def answer(n: int, cost: float | None, *, inp: int = 10, out: int = 4) -> dict[str, Any]:
    """A logged answer of model call ``n`` with its turn data on the same line."""
    usage = {"inputTokens": inp, "outputTokens": out, "totalTokens": inp + out, "requests": 1}
    return {"t": "msg", "m": {"role": "assistant", "content": f"a{n}", "model": "s:m"},
            "turn": {"n": n, "model": "s:m", "usage": usage, "cost": cost}}


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"t": "msg", "m": {"role": "user", "content": text}, **extra}


# -- the live counters -----------------------------------------------------------------------------


def test_a_spending_counts_input_and_output_tokens_toward_the_segment_and_the_tree() -> None:
    """``spend`` adds input plus output tokens to the segment (what ``maxTokens`` limits) and to every
    ancestor's tree; ``spent`` reports the segment's tokens and cost with the descendants'."""
    top = instance("top")
    child = instance("child", spawner=top)
    child.spend(Usage(input_tokens=10, output_tokens=5, total_tokens=15, requests=1), Cost(amount=0.25))
    assert child.seg_tokens == 15
    assert child.spent() == (15, 0.25, 0)
    assert (top.tree_tokens, top.tree_cost) == (15, 0.25)
    top.spend(Usage(input_tokens=3, output_tokens=2, total_tokens=5, requests=1), Cost(amount=0.5))
    top.seg_tool_calls, top.tree_tool_calls = 1, 2
    assert top.spent() == (20, 0.75, 3)


def test_an_unknown_cost_makes_the_segment_cost_unknown() -> None:
    """Once a spending's cost is unknown, so is the segment's (and ``spent`` says so), and the ancestors'
    tree cost; a known cost after it does not bring it back."""
    top = instance("top")
    child = instance("child", spawner=top)
    child.spend(Usage(input_tokens=1, output_tokens=1, total_tokens=2), Cost(amount=None))
    child.spend(Usage(input_tokens=1, output_tokens=1, total_tokens=2), Cost(amount=0.5))
    assert child.seg_cost is None
    assert child.spent() == (4, None, 0)
    assert top.tree_cost is None
    assert top.spent()[1] is None
    assert instance().spent() == (0, 0.0, 0)  # nothing spent: known, and zero


# -- the replay ------------------------------------------------------------------------------------


def test_a_new_segment_restarts_the_replayed_segment_counters_at_zero() -> None:
    """A ``seg`` entry restarts the segment's model calls, tokens and cost at zero; the totals go on."""
    entries = [{"t": "seg"}, user("go", task=True), answer(1, 0.5), {"t": "seg"}, answer(2, 0.25, inp=7, out=1)]
    inst = instance()
    rebuild(inst, entries)
    assert (inst.seg_iterations, inst.seg_tokens, inst.seg_cost) == (1, 8, 0.25)
    assert (inst.turn, inst.usage.input_tokens, inst.cost.amount) == (2, 17, 0.75)


def test_a_replayed_turn_of_unknown_cost_leaves_the_cost_unknown() -> None:
    """A turn logged with ``cost: null`` (a model without a price) loads, and makes the segment's cost
    and the total cost unknown: a cost limit then cannot pass it as zero."""
    inst = instance()
    rebuild(inst, [{"t": "seg"}, user("go", task=True), answer(1, 0.5), answer(2, None)])
    assert inst.seg_cost is None
    assert inst.cost.amount is None
    assert (inst.turn, inst.seg_tokens) == (2, 28)


# -- history ---------------------------------------------------------------------------------------


def test_the_history_at_turn_zero_is_the_prompts_before_the_first_model_call() -> None:
    """Turn 0 is in every history (``history_at`` raises only below 0 or above the last turn): it ends
    before the first model call, with the task prompt, which is kept."""
    entries = [{"t": "seg"}, {"t": "msg", "m": {"role": "system", "content": "s"}}, user("go", task=True),
               answer(1, 0.5), user("more"), answer(2, 0.5)]
    messages, at = history_at(entries, 0)
    assert at == 0
    assert messages == [Message(role="system", content="s"), Message(role="user", content="go")]
    assert [m.content for m in history_at(entries, 1)[0]] == ["s", "go", "a1"]
    for bad in (-1, 3):
        with pytest.raises(ValueError, match=rf"turn {bad} is not in its history \(it has 2 turns\)"):
            history_at(entries, bad)
    with pytest.raises(ValueError, match=r"\(it has 1 turn\)"):
        history_at(entries[:4], 2)


# -- malformed saved messages ----------------------------------------------------------------------


RESULT = {"role": "tool", "content": "r", "toolCallId": "a", "name": "n", "status": "success"}
CALLS = {"role": "assistant", "toolCalls": [{"id": "a", "name": "n", "arguments": {}}], "model": "p:m"}


@pytest.mark.parametrize("bad", [
    pytest.param({**RESULT, "status": ["success"]}, id="result-status-a-list"),
    pytest.param({**RESULT, "status": {"v": 1}}, id="result-status-an-object"),
    pytest.param({**RESULT, "source": "runtime", "status": ["success"]}, id="general-status-a-list"),
    pytest.param({**CALLS, "toolCalls": [{"id": "a", "name": "n", "arguments": "kv"}]}, id="call-arguments-a-string"),
])
def test_a_malformed_saved_message_raises_the_converters_error(bad: dict[str, Any]) -> None:
    """A saved message the fast builders cannot take (here a value of the wrong JSON type) goes to the
    converter, which raises as it always did: the same error type, whichever path saw it first."""
    with pytest.raises(Exception) as converter_error:  # noqa: PT011 - the converter's error, whatever it is
        converter_structure(bad, Message)
    with pytest.raises(Exception) as fast_error:  # noqa: PT011
        message_from_json(bad)
    assert type(fast_error.value) is type(converter_error.value)


@pytest.mark.parametrize("data", [
    pytest.param({**CALLS, "toolCalls": [{"id": 5, "name": "n", "arguments": {}}]}, id="call-id-a-number"),
    pytest.param({**CALLS, "toolCalls": [{"id": "a", "name": 5, "arguments": {}}]}, id="call-name-a-number"),
])
def test_a_saved_message_of_another_json_type_is_what_the_converter_makes_of_it(data: dict[str, Any]) -> None:
    """A value the fast builders do not take as it is goes to the converter, which converts it (here a
    number to a string): the message is the converter's, not a call with a number for an id."""
    assert message_from_json(data) == converter_structure(data, Message)
    assert type(message_from_json(data).tool_calls[0].id) is str


@pytest.mark.parametrize("m", ["text", 5, ["role", "user"]])
def test_a_logged_message_that_is_not_an_object_raises_the_converters_error(m: object) -> None:
    """An entry log line whose message is not a JSON object fails the replay with the converter's error."""
    with pytest.raises(Exception) as converter_error:  # noqa: PT011 - the converter's error, whatever it is
        converter_structure(m, Message)
    with pytest.raises(type(converter_error.value)):
        rebuild(instance(), [{"t": "seg"}, {"t": "msg", "m": m}])


# -- found by the session-10 pass over ``_replay`` (docs/testing.md) --------------------------------


def test_the_task_prompt_stays_given_after_the_messages_that_follow_it() -> None:
    """The task prompt is in the transcript once a ``task``-marked message is: later messages do not
    undo it (a resume that thought otherwise would give the task again, ``Driver.still_beginning``)."""
    inst = instance()
    rebuild(inst, [{"t": "seg"}, user("do it", task=True), answer(1, 0.0), user("and then")])
    assert inst.task_given
    fresh = instance()
    rebuild(fresh, [{"t": "seg"}, user("hello")])
    assert not fresh.task_given


def test_an_instance_with_no_model_call_is_at_turn_zero() -> None:
    """Turns count model calls: a log of messages only replays to turn 0, one answered call to turn 1."""
    inst = instance()
    rebuild(inst, [{"t": "seg"}, user("hello")])
    assert inst.turn == 0
    rebuild(inst, [{"t": "seg"}, user("hello"), answer(1, 0.0)])
    assert inst.turn == 1


def test_results_read_back_from_disk_are_put_in_call_order() -> None:
    """Results are logged in finishing order; loading puts them back in call order (docs/concepts.md),
    for a log read from its JSON text as a store reads it, not only for objects built in memory."""
    calls = [{"id": f"c{k}", "name": "add", "arguments": {"a": k}} for k in (1, 2, 3)]
    logged = [{"t": "seg"}, user("go", task=True),
              {"t": "msg", "m": {"role": "assistant", "toolCalls": calls, "model": "s:m"},
               "turn": {"n": 1, "model": "s:m", "usage": {}, "cost": 0.0}}]
    logged += [{"t": "msg", "m": {"role": "tool", "content": str(k), "toolCallId": f"c{k}", "name": "add",
                                  "status": "success"}} for k in (3, 1, 2)]
    entries = [json.loads(line) for line in "\n".join(json.dumps(e) for e in logged).splitlines()]
    inst = instance()
    rebuild(inst, entries)
    assert [m.tool_call_id for m in inst.transcript if m.role == "tool"] == ["c1", "c2", "c3"]

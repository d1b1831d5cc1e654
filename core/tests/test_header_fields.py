"""HeaderFields: typed fields read and written in place over a header's JSON object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from loopwright import HeaderFields, InstanceHeader, State, StopReason
from loopwright._header import ALWAYS, KNOWN
from loopwright._header_fields import _KEYS


def _fields() -> dict[str, str]:
    """Each field of HeaderFields and its key."""
    return dict(_KEYS)


def test_it_knows_exactly_the_keys_instance_header_knows() -> None:
    """One header, two views: a key added to one and not the other fails here."""
    assert set(_fields().values()) == set(KNOWN)
    frozen = {a.name for a in attrs.fields(InstanceHeader)} - {"extra", "kept"}
    assert set(_fields()) == frozen


def test_every_field_is_on_the_class() -> None:
    """Each field the key table names is an attribute of the class, read through C (a property) or a descriptor."""
    for name in _fields():
        assert name in vars(HeaderFields), name
    assert isinstance(vars(HeaderFields)["inbox_cursor"], property)  # no Python frame per read


def test_fields_read_and_write_the_object_in_place() -> None:
    saved: dict[str, Any] = {"instanceId": "i1", "inboxCursor": 3, "futureKey": {"x": 1}}
    h = HeaderFields(saved)
    assert (h.instance_id, h.inbox_cursor, h.depth, h.queued) == ("i1", 3, 0, False)  # absent: its default
    h.inbox_cursor = 7
    h.segment_started_at = 12.5
    assert saved == {"instanceId": "i1", "inboxCursor": 7, "futureKey": {"x": 1}, "segmentStartedAt": 12.5}
    assert h.json is saved  # no copy: what a store saves is this object, unknown keys included
    del h.inbox_cursor
    del h.paused_at  # absent already: nothing to remove
    assert "inboxCursor" not in saved


def test_absent_and_saved_null_stay_apart() -> None:
    h = HeaderFields({"cost": None})
    assert h.cost is None
    assert h.has("cost")
    assert not h.has("turns")
    with pytest.raises(AttributeError):
        h.has("no_such_field")


def test_the_enumerations_read_as_members_and_keep_what_they_do_not_know() -> None:
    h = HeaderFields({"state": "waiting_for_approval", "stopReason": "waiting_for_approval"})
    assert h.state is State.WAITING_FOR_APPROVAL
    assert h.stop_reason is StopReason.WAITING_FOR_APPROVAL
    h.state, h.stop_reason = State.STOPPED, None
    assert h.json == {"state": "stopped", "stopReason": None}
    assert json.dumps(h.json) == '{"state": "stopped", "stopReason": null}'  # plain strings on disk
    newer = HeaderFields({"state": "hibernating"})  # a newer version's state: kept, never raised
    assert newer.state == "hibernating"
    assert not isinstance(newer.state, State)
    assert HeaderFields({}).state is State.WAITING
    tampered = HeaderFields({"state": ["running"], "stopReason": {"x": 1}})  # never raises on read
    assert (tampered.state, tampered.stop_reason) == (["running"], {"x": 1})
    assert tampered.dead_runner("me") is None


def test_a_list_field_is_the_saved_list_or_a_new_one_not_saved() -> None:
    saved: dict[str, Any] = {"inbox": [{"type": "message", "text": "a"}], "children": None}
    h = HeaderFields(saved)
    h.inbox.append({"type": "message", "text": "b"})  # the saved list itself
    assert [m["text"] for m in saved["inbox"]] == ["a", "b"]
    assert h.children == []
    h.children.append("c1")  # a new list: not saved until the field is set
    assert saved["children"] is None
    assert h.monitors == []
    assert h.monitors is not h.monitors  # never one shared default
    assert "monitors" not in saved


def test_held_calls_and_the_question() -> None:
    h = HeaderFields({"pendingApprovals": [{"toolCallId": "a", "decision": "approve"},
                                           {"toolCallId": "b", "decision": None}]})
    assert not h.held_calls_decided()
    assert h.undecided_calls() == {"b"}
    h.pending_approvals[1]["decision"] = "deny"
    assert h.held_calls_decided()
    assert not HeaderFields({"pendingApprovals": []}).held_calls_decided()  # none held: nothing decided
    assert not HeaderFields({"pendingApprovals": ["junk"]}).held_calls_decided()  # malformed: fails closed
    assert not HeaderFields({"pendingApprovals": 5}).held_calls_decided()
    assert HeaderFields({"pendingApprovals": 5}).undecided_calls() == set()
    assert HeaderFields({"pendingApprovals": ["junk", {"toolCallId": "c"}]}).undecided_calls() == {"c"}
    assert HeaderFields({"awaitingAnswer": {"toolCallId": "q1", "question": "?"}}).asked_call_id == "q1"
    assert HeaderFields({"awaitingAnswer": None}).asked_call_id is None


@pytest.mark.parametrize(("saved", "owner", "dead"), [
    ({"state": "running", "runner": "host:1:abc"}, "host:2", "host:1:abc"),
    ({"state": "running", "runner": "host:2:abc"}, "host:2", None),  # one of the owner's own runtimes
    ({"state": "waiting", "runner": "host:1:abc"}, "host:2", None),  # resting: no runner to take over from
    ({"state": "running", "runner": None}, "host:2", None),
    ({"state": "running"}, "host:2", None),
])
def test_dead_runner(saved: dict[str, Any], owner: str, dead: str | None) -> None:
    assert HeaderFields(saved).dead_runner(owner) == dead


def test_copy_without_leaves_the_original_alone() -> None:
    saved = {"instanceId": "i1", "text": "t", "servedBy": "m", "x": 1}
    copy = HeaderFields(saved).copy_without("text", "served_by")
    assert copy.json == {"instanceId": "i1", "x": 1}
    copy.instance_id = "i2"
    assert saved["instanceId"] == "i1"
    with pytest.raises(AttributeError):
        HeaderFields(saved).copy_without("servedBy")  # field names, not keys


def test_an_unknown_field_cannot_be_written() -> None:
    h = HeaderFields({})
    with pytest.raises(AttributeError):
        h.inboxCursor = 3  # type: ignore[attr-defined]  # a typo never becomes a key
    assert h.json == {}


def test_the_frozen_header_reads_what_the_fields_wrote() -> None:
    h = HeaderFields({"instanceId": "i1", "state": "running", "unknown": [1]})
    h.state, h.inbox_cursor, h.children = State.WAITING, 4, ["c"]
    frozen = InstanceHeader.from_json(h.json)
    assert (frozen.state, frozen.inbox_cursor, frozen.children) == (State.WAITING, 4, ("c",))
    assert h.json.items() <= frozen.to_json().items()  # it adds the keys every header has, nothing else changes


def test_the_concepts_page_example_runs() -> None:
    """docs/concepts.md's example of reading a header in code runs as written."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "concepts.md").read_text()
    section = page.split("**Reading a header in code.**", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/concepts.md", "exec"), {})  # noqa: S102 - the page's own example


def test_a_new_header_has_every_key_a_header_always_has() -> None:
    h = HeaderFields.new(instance_id="i1", name="n", definition_path=None, definition={"name": "n"}, inputs={},
                         capabilities={}, created_at="2026-12-03T00:00:00.000Z", model="test:any", runner="me",
                         task_prompt="hi", task_history=[])
    assert set(h.json) == set(ALWAYS)
    assert (h.state, h.stop_reason, h.created_at, h.updated_at) == (
        State.RUNNING, None, "2026-12-03T00:00:00.000Z", "2026-12-03T00:00:00.000Z")
    assert InstanceHeader.from_json(h.json).to_json() == h.json  # the codec writes it back unchanged
    history = [{"role": "user", "content": "before"}]
    with_history = HeaderFields.new(instance_id="i2", name="n", definition_path="a.yaml", definition={}, inputs={},
                                    capabilities={}, created_at="t", model=None, runner=None, task_prompt=None,
                                    task_history=history)
    assert with_history.task_history == history

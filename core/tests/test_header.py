"""The typed instance header (`loopwright._header.InstanceHeader`) and its one JSON codec."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import cattrs
import pytest

from loopwright import State, StopReason
from loopwright._header import ALWAYS, InstanceHeader

SCHEMA = Path(__file__).resolve().parents[2] / "specs" / "instance.schema.json"


def _saved() -> dict[str, object]:
    """A header as a new instance saves it, with the totals and a few optional keys."""
    return {
        "instanceId": "20261202-101612-d6091e5b", "name": "wordsmith", "version": 1, "definitionPath": None,
        "definition": {"name": "wordsmith", "model": "fake:m"}, "inputs": {"text": "a"}, "state": "waiting",
        "stopReason": "waiting", "cancelled": False, "error": None, "capabilities": {"files": {}},
        "capabilitiesRecorded": True, "pendingApprovals": [{"toolCallId": "c1", "tool": "t", "arguments": {},
                                                            "reason": "r", "requestedAt": "x", "decision": None}],
        "inbox": [], "spawnerInstanceId": "p", "callerInstanceId": None, "callerToolCallId": None,
        "delegationPrompt": None, "createdAt": "2026-12-02T10:16:12.000Z", "updatedAt": "2026-12-02T10:16:13.000Z",
        "model": "fake:m", "runner": "me", "taskPrompt": "count", "depth": 2, "children": ["c"],
        "usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}, "cost": 0.5, "turns": 2,
        "toolCallsStarted": 1, "contextTokens": 3, "servedBy": "fake:m", "text": "done",
    }


def test_every_documented_key_has_a_field() -> None:
    """Each top-level property of specs/instance.schema.json is a field, under its snake_case name."""
    documented = set(json.loads(SCHEMA.read_text())["properties"])
    known = {a.name for a in attrs.fields(InstanceHeader)} - {"extra", "kept"}
    assert {"".join(w if i == 0 else w.title() for i, w in enumerate(n.split("_"))) for n in known} == documented
    assert documented >= ALWAYS


def test_fields_are_typed_and_a_saved_header_round_trips() -> None:
    """Known keys become typed fields (enums, tuples), and ``to_json`` gives back the saved object."""
    saved = _saved()
    header = InstanceHeader.from_json(saved)
    assert header.state is State.WAITING
    assert header.stop_reason is StopReason.WAITING
    assert header.instance_id == "20261202-101612-d6091e5b"
    assert header.children == ("c",)
    assert header.depth == 2
    assert header.cost == 0.5
    assert header.extra == {}
    assert header.to_json() == saved


def test_unknown_keys_are_kept_and_written_back() -> None:
    """A header from a newer version keeps the keys this one does not know, values untouched."""
    saved = {**_saved(), "futureKey": {"nested": [1, 2]}, "alsoNew": None}
    header = InstanceHeader.from_json(saved)
    assert header.extra == {"futureKey": {"nested": [1, 2]}, "alsoNew": None}
    assert header.to_json() == saved
    changed = attrs.evolve(header, text="other").to_json()
    assert changed["futureKey"] == {"nested": [1, 2]}
    assert changed["text"] == "other"


def test_an_absent_key_and_one_saved_at_its_default_stay_apart() -> None:
    """``"cost": null`` (unknown) and ``[]`` survive a round trip; an absent ``cost`` stays absent."""
    saved = {**_saved(), "cost": None, "monitors": [], "queued": False}
    assert InstanceHeader.from_json(saved).to_json() == saved
    bare = {k: v for k, v in _saved().items() if k not in {"cost", "usage", "turns", "depth", "children"}}
    out = InstanceHeader.from_json(bare).to_json()
    assert out == bare
    assert "cost" not in out


def test_always_written_keys_and_keep() -> None:
    """The keys a new header always has are written at their defaults; ``keep`` writes another one."""
    out = InstanceHeader(instance_id="i", name="n").to_json()
    assert set(out) == ALWAYS
    assert out["stopReason"] is None
    assert out["pendingApprovals"] == []
    assert InstanceHeader(instance_id="i", name="n").keep("cost").to_json()["cost"] is None


def test_evolving_to_the_default_removes_an_optional_key() -> None:
    """Setting ``queued`` back to False drops the key, as ``pop("queued")`` did."""
    header = InstanceHeader.from_json({**_saved(), "queued": True})
    assert "queued" not in attrs.evolve(header, queued=False).to_json()


def test_a_bad_value_of_a_known_key_is_an_error() -> None:
    """A ``state`` that is no state is refused, naming the value."""
    with pytest.raises(cattrs.BaseValidationError) as info:
        InstanceHeader.from_json({**_saved(), "state": "sleeping"})
    assert "sleeping" in repr(info.value.exceptions)


def test_the_header_is_frozen() -> None:
    """The typed header crosses to views and stores: it cannot be changed in place."""
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        InstanceHeader().state = State.RUNNING  # type: ignore[misc]


def test_lenient_reading_keeps_every_value_as_saved() -> None:
    """``lenient=True`` never refuses: known states are typed, anything else stays as saved; strict reading refuses."""
    odd = {**_saved(), "state": "sleeping", "stopReason": "completed", "queued": 1, "depth": "deep",
           "children": None, "turns": 2.0}
    header = InstanceHeader.from_json(odd, lenient=True)
    assert (header.state, header.stop_reason) == ("sleeping", StopReason.COMPLETED)
    assert header.stop_reason is StopReason.COMPLETED
    assert (header.queued, header.depth, header.children, header.turns) == (1, "deep", (), 2.0)
    assert type(header.turns) is float
    assert InstanceHeader.from_json(_saved(), lenient=True) == InstanceHeader.from_json(_saved())
    with pytest.raises(cattrs.BaseValidationError):
        InstanceHeader.from_json(odd)


def test_a_saved_integer_cost_stays_an_integer() -> None:
    """``"cost": 1`` reads as ``1`` and is written back as ``1`` (not ``1.0``): the same bytes."""
    saved = {**_saved(), "cost": 1}
    for cost in (1, 0.5, 0):
        again = InstanceHeader.from_json({**saved, "cost": cost}).to_json()
        assert json.dumps(again, sort_keys=True) == json.dumps({**saved, "cost": cost}, sort_keys=True)

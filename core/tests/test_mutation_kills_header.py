"""``HeaderFields``' edges that mutation testing found untested (docs/testing.md, "Mutation score").

Each test failed against a mutant of ``_header_fields.py`` that ``test_header_fields.py``,
``test_loop.py`` and ``test_one_runner.py`` let through. They test what the module and class
docstrings promise: an absent key reads as its default (the same default the frozen
``InstanceHeader`` gives it), two headers are equal when their objects are, a new header's values,
and what ``ChildLinks`` writes into a child's header.
"""

from __future__ import annotations

from typing import Any

import pytest

from loopwright import HeaderFields, InstanceHeader, State
from loopwright._header_fields import _KEYS, ChildLinks


def _new(**overrides: Any) -> HeaderFields:
    args: dict[str, Any] = {
        "instance_id": "i1", "name": "n", "definition_path": None, "definition": {"name": "n"}, "inputs": {},
        "capabilities": {}, "created_at": "2026-12-03T00:00:00.000Z", "model": None, "runner": "me",
        "task_prompt": None, "task_history": []}
    return HeaderFields.new(**{**args, **overrides})


def test_an_absent_key_reads_as_the_frozen_headers_default() -> None:
    """An absent key reads as the field's default, the one ``InstanceHeader`` gives the same absent key.

    (``inputs`` aside: the frozen header fills it with ``{}``.) So a saved header without
    ``version`` is version 1, without ``capabilitiesRecorded`` has no recorded grants (fails
    closed), without ``cancelled`` or ``queued`` was not cancelled nor queued, without ``depth`` is
    a top-level agent.
    """
    fields, frozen = HeaderFields({}), InstanceHeader.from_json({}, lenient=True)
    for name in _KEYS:
        if name == "inputs":
            continue
        value, expected = getattr(fields, name), getattr(frozen, name)
        if isinstance(value, list):
            value = tuple(value)
        assert value == expected, name
    assert (fields.version, fields.capabilities_recorded, fields.cancelled, fields.queued, fields.depth) == (
        1, False, False, False, 0)


def test_headers_are_equal_when_their_objects_are() -> None:
    """Two ``HeaderFields`` are equal exactly when their JSON objects are; never equal to a bare dict; unhashable."""
    a = HeaderFields({"instanceId": "i1", "state": "running"})
    assert a == HeaderFields({"instanceId": "i1", "state": "running"})  # another object, same content
    assert a == HeaderFields(dict(a.json))
    assert a != HeaderFields({"instanceId": "i1", "state": "waiting"})
    assert a != HeaderFields({"instanceId": "i1"})
    assert a != {"instanceId": "i1", "state": "running"}  # a header is not a mapping
    with pytest.raises(TypeError):
        hash(a)  # mutable: never a dict key or a set member


def test_a_new_header_is_a_first_version_running_one_with_recorded_grants() -> None:
    """``HeaderFields.new``: ``running``, version 1, not cancelled, grants recorded, nothing held, no links."""
    h = _new(capabilities={"network": False})
    assert (h.state, h.version, h.cancelled, h.capabilities_recorded) == (State.RUNNING, 1, False, True)
    assert (h.pending_approvals, h.inbox, h.stop_reason, h.error) == ([], [], None, None)
    assert (h.spawner_instance_id, h.caller_instance_id, h.caller_tool_call_id) == (None, None, None)
    frozen = InstanceHeader.from_json(h.json)
    assert (frozen.version, frozen.cancelled, frozen.capabilities_recorded) == (1, False, True)
    assert not h.has("task_history")  # none given: the key is not written


def test_child_links_write_the_spawner_and_a_budget_only_when_limited() -> None:
    """``ChildLinks.write``: the spawner is also the caller; ``budget`` is written only when it limits something."""
    links = ChildLinks(spawner_instance_id="p1", caller_tool_call_id="call-1", delegation_prompt="do it", depth=2,
                       agent_swarm_uri="agents/helper.yaml", inherited_gates=[{"tool": "shell"}])
    child = _new()
    links.write(child)
    assert (child.spawner_instance_id, child.caller_instance_id, child.caller_tool_call_id) == ("p1", "p1", "call-1")
    assert (child.delegation_prompt, child.depth, child.agent_swarm_uri) == ("do it", 2, "agents/helper.yaml")
    assert child.inherited_gates == [{"tool": "shell"}]
    assert not child.has("budget")  # nothing limited: no budget key
    limited = ChildLinks(spawner_instance_id="p1", caller_tool_call_id=None, delegation_prompt=None, depth=1,
                         agent_swarm_uri=None, inherited_gates=None, budget={"tokens": 100})
    child = _new()
    limited.write(child)
    assert child.budget == {"tokens": 100}

"""The header a runtime holds while an instance lives: :class:`HeaderFields`, typed fields over its JSON.

A store saves an instance's header as one JSON object with camelCase keys
(``specs/instance.schema.json``; :class:`loopwright.abc.Store` takes and returns that object). The
runtime reads and changes it at every state change and turn boundary, so it does not convert it:
:class:`HeaderFields` wraps the object itself (:attr:`HeaderFields.json`) and each field reads or
writes its key in place. So:

- what a store saves is exactly the object, unknown keys included (a newer version's keys are
  written back as they were read, with no copy and no codec on the hot path);
- every key is named once, here, with its type; no other module of the core spells a key;
- an absent key reads as the field's default, and a field set to a value writes it, so the
  difference between an absent key and one saved at its default (``"cost": null``) is the
  object's, unchanged.

Values are the JSON values, except the two enumerations: ``state`` reads as a :class:`State` and
``stop_reason`` as a :class:`StopReason` (written as their strings); one this version does not
know (a newer version's) reads as the string it is, never raises. A list field reads as the saved
list (changes to it change the header) or, when the key is absent or ``null``, as a new empty list
that is not saved until the field is set.

:class:`loopwright.InstanceHeader` is the frozen, fully converted value of the same object, for
what crosses a boundary (the JSON views, ``ls``, ``show``); a test checks the two know the same
keys.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any, Generic, TypeVar, overload

import attrs

from loopwright._states import State, StopReason

__all__ = ["ChildLinks", "HeaderFields"]

T = TypeVar("T")
E = TypeVar("E", State, StopReason)

#: A JSON object held as it was saved (never converted field by field).
JSONObject = dict[str, Any]

#: Each field's name and its key (``inbox_cursor``: ``inboxCursor``), filled as the fields are made.
_KEYS: dict[str, str] = {}


def _camel(name: str) -> str:
    """``inbox_cursor`` -> ``inboxCursor`` (:func:`loopwright._convert.camel`, without importing cattrs)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class _Key(Generic[T]):
    """One key of the header's JSON object, read and written as a typed attribute.

    This class is what the type checker sees. On the class itself it gives way to a ``property``
    whose getter is ``operator.methodcaller("_get", key, default)``, all in C (``_get`` is the
    object's own ``dict.get``): reading a field costs what ``header.get(key, default)`` cost, with
    no Python frame, and the loop reads several a turn.
    """

    __slots__ = ("default", "key")

    def __init__(self, default: T) -> None:
        self.default = default
        self.key = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = _KEYS[name] = _camel(name)
        if type(self) is _Key:
            setattr(owner, name, property(operator.methodcaller("_get", self.key, self.default),
                                          self.__set__, self.__delete__, f"The header's ``{self.key}``."))

    @overload
    def __get__(self, obj: None, owner: type) -> _Key[T]: ...
    @overload
    def __get__(self, obj: HeaderFields, owner: type) -> T: ...
    def __get__(self, obj: HeaderFields | None, owner: type) -> T | _Key[T]:
        if obj is None:
            return self
        return obj.json.get(self.key, self.default)  # type: ignore[no-any-return]

    def __set__(self, obj: HeaderFields, value: T) -> None:
        obj.json[self.key] = value

    def __delete__(self, obj: HeaderFields) -> None:
        """Remove the key (absent, as opposed to saved at its default)."""
        obj.json.pop(self.key, None)


class _List(_Key[list[T]]):
    """A list key: the saved list itself, or a new empty one (not saved) when absent or ``null``."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__([])

    @overload
    def __get__(self, obj: None, owner: type) -> _List[T]: ...
    @overload
    def __get__(self, obj: HeaderFields, owner: type) -> list[T]: ...
    def __get__(self, obj: HeaderFields | None, owner: type) -> list[T] | _List[T]:
        if obj is None:
            return self
        value = obj.json.get(self.key)
        return [] if value is None else value


class _Enum(Generic[E]):
    """A key holding one of an enumeration's strings, read as the member.

    A string this version does not know (a newer version's) reads as the string itself, and any
    other saved value (a tampered header's) as it was saved: reading never raises. Written as the
    member's string.
    """

    __slots__ = ("default", "key", "members")

    def __init__(self, kind: type[E], default: E | None) -> None:
        self.members: dict[Any, E] = {m.value: m for m in kind}
        self.default: E | None = default
        self.key = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = _KEYS[name] = _camel(name)

    @overload
    def __get__(self, obj: None, owner: type) -> _Enum[E]: ...
    @overload
    def __get__(self, obj: HeaderFields, owner: type) -> E | str | None: ...
    def __get__(self, obj: HeaderFields | None, owner: type) -> E | str | _Enum[E] | None:
        if obj is None:
            return self
        raw = obj.json.get(self.key, self.default)
        try:
            return self.members.get(raw, raw)
        except TypeError:  # a list or an object saved where a string belongs: read as saved
            return raw

    def __set__(self, obj: HeaderFields, value: E | None) -> None:
        obj.json[self.key] = None if value is None else value.value


class HeaderFields:
    """Typed fields over an instance header's JSON object (see the module docstring).

    Each field is the snake_case of its camelCase key (``inbox_cursor`` is ``inboxCursor``); its
    meaning is the key's description in ``specs/instance.schema.json``; its default is what an
    absent key reads as. ``del header.field`` removes the key.

    Attributes:
        json: The object itself: what a store saved and saves (read and written in place). Set
            once: another object gets a header of its own (``HeaderFields(other)``).
    """

    __slots__ = ("_get", "json")

    def __init__(self, json: JSONObject) -> None:
        self.json = json
        self._get = json.get  # what each field's getter calls (see _Key)

    def __repr__(self) -> str:
        return f"HeaderFields({self.json!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HeaderFields) and other.json == self.json

    __hash__ = None  # type: ignore[assignment]  # mutable

    @classmethod
    def new(cls, *, instance_id: str, name: str, definition_path: str | None, definition: JSONObject,
            inputs: JSONObject, capabilities: JSONObject, created_at: str, model: str | None, runner: str | None,
            task_prompt: str | None, task_history: list[JSONObject]) -> HeaderFields:
        """Return a new instance's header: ``running``, run by ``runner``, nothing held, no links.

        Every key :data:`loopwright._header.ALWAYS` names is written (a test checks the two agree);
        ``taskHistory`` only when there is one. One literal: a header is made at every start.
        """
        json: JSONObject = {
            "instanceId": instance_id, "name": name, "version": 1, "definitionPath": definition_path,
            "definition": definition, "inputs": inputs, "state": State.RUNNING.value, "stopReason": None,
            "cancelled": False, "error": None, "capabilities": capabilities, "capabilitiesRecorded": True,
            "pendingApprovals": [], "inbox": [], "spawnerInstanceId": None, "callerInstanceId": None,
            "callerToolCallId": None, "delegationPrompt": None, "createdAt": created_at, "updatedAt": created_at,
            "model": model, "runner": runner, "taskPrompt": task_prompt,
        }
        if task_history:
            json["taskHistory"] = task_history
        return cls(json)

    @property
    def asked_call_id(self) -> str | None:
        """The id of the ``ask_user`` call whose answer the instance waits for (``awaitingAnswer``), or ``None``."""
        awaiting = self.awaiting_answer
        return awaiting.get("toolCallId") if awaiting else None

    def held_calls_decided(self) -> bool:
        """Whether it holds calls for approval (``pendingApprovals``) and every one is decided."""
        pending = self.pending_approvals
        return isinstance(pending, list) and bool(pending) and all(
            isinstance(p, Mapping) and p.get("decision") is not None for p in pending)

    def undecided_calls(self) -> set[Any]:
        """Return the ids of the calls it holds for approval that are not decided yet (a malformed entry is none)."""
        pending = self.pending_approvals
        if not isinstance(pending, list):
            return set()
        return {p.get("toolCallId") for p in pending if isinstance(p, Mapping) and p.get("decision") is None}

    def dead_runner(self, owner: str) -> str | None:
        """Return the runner of a header left ``running`` by someone other than ``owner`` (who must have died).

        ``None`` when it is not ``running``, names no runner, or names ``owner`` (or an id that
        starts with it: one of its runtimes).
        """
        runner = self.runner
        if self.state is not State.RUNNING or not runner or str(runner).startswith(owner):
            return None
        return str(runner)

    def has(self, name: str) -> bool:
        """Whether the field ``name``'s key is saved at all (absent, as opposed to saved ``null``).

        :raises AttributeError: The name is no field.
        """
        return _key_of(name) in self.json

    def copy_without(self, *names: str) -> HeaderFields:
        """Return a new header with this one's keys (a shallow copy) but those of the fields ``names``.

        :raises AttributeError: A name is no field.
        """
        drop = {_key_of(name) for name in names}
        return HeaderFields({k: v for k, v in self.json.items() if k not in drop})

    # -- who it is --------------------------------------------------------------------------
    instance_id = _Key[str]("")
    name = _Key[str]("")
    version = _Key[int](1)
    definition = _Key[JSONObject | None](None)
    definition_path = _Key[str | None](None)
    inputs = _Key[JSONObject | None](None)
    model = _Key[str | None](None)
    capabilities = _Key[JSONObject | None](None)
    capabilities_recorded = _Key[bool](default=False)
    forked_from = _Key[JSONObject | None](None)
    created_at = _Key[str]("")
    updated_at = _Key[str]("")
    runner = _Key[str | None](None)
    # -- where it stands --------------------------------------------------------------------
    state = _Enum(State, State.WAITING)
    stop_reason = _Enum(StopReason, None)
    cancelled = _Key[bool](default=False)
    error = _Key[str | None](None)
    limit = _Key[str | None](None)
    text = _Key[str | None](None)
    output = _Key[Any](None)
    served_by = _Key[str | None](None)
    pending_approvals = _List[JSONObject]()
    awaiting_answer = _Key[JSONObject | None](None)
    paused_at = _Key[float | None](None)
    segment_started_at = _Key[float | None](None)
    segment = _Key[JSONObject | None](None)
    queued = _Key[Any](default=False)
    submitted_by = _Key[str | None](None)
    # -- its mailbox and task -----------------------------------------------------------------
    inbox_cursor = _Key[int | None](None)
    inbox = _List[JSONObject]()
    task_prompt = _Key[str | None](None)
    task_history = _List[JSONObject]()
    # -- its tree ---------------------------------------------------------------------------
    spawner_instance_id = _Key[str | None](None)
    caller_instance_id = _Key[str | None](None)
    caller_tool_call_id = _Key[str | None](None)
    delegation_prompt = _Key[str | None](None)
    depth = _Key[int](0)
    children = _List[str]()
    monitors = _List[JSONObject]()
    budget = _Key[JSONObject | None](None)
    inherited_gates = _Key[Any](None)
    agent_swarm_uri = _Key[str | None](None)
    registered_definition = _Key[str | None](None)
    row_signature = _Key[str | None](None)
    # -- its totals (for listings that do not replay the log) --------------------------------
    usage = _Key[JSONObject | None](None)
    cost = _Key[float | None](None)
    turns = _Key[int | None](None)
    tool_calls_started = _Key[int | None](None)
    context_tokens = _Key[int | None](None)


def _key_of(name: str) -> str:
    """Return the key of the field ``name``.

    :raises AttributeError: No field has that name.
    """
    try:
        return _KEYS[name]
    except KeyError:
        raise AttributeError(f"the header has no field {name!r}") from None


@attrs.frozen(kw_only=True)
class ChildLinks:
    """What a child agent's header says of the agent that started it (``spawn_agent``).

    Attributes:
        spawner_instance_id: The agent that started it, which is also its caller.
        caller_tool_call_id: The ``spawn_agent`` call that started it.
        delegation_prompt: The task it was given.
        depth: Its depth in the tree (its spawner's plus one).
        agent_swarm_uri: The definition it was asked for, as named.
        inherited_gates: Its caller's gates, applied as well as its own (JSON).
        budget: What it may still spend of its ancestors' limits (JSON), if any is limited.
    """

    spawner_instance_id: str
    caller_tool_call_id: str | None
    delegation_prompt: str | None
    depth: int
    agent_swarm_uri: str | None
    inherited_gates: Any
    budget: JSONObject | None = None

    def write(self, header: HeaderFields) -> None:
        """Write the links into a new child's ``header``."""
        header.spawner_instance_id = header.caller_instance_id = self.spawner_instance_id
        header.caller_tool_call_id = self.caller_tool_call_id
        header.delegation_prompt = self.delegation_prompt
        header.depth = self.depth
        header.agent_swarm_uri = self.agent_swarm_uri
        header.inherited_gates = self.inherited_gates
        if self.budget:
            header.budget = self.budget

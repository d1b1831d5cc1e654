"""The instance header as a typed value: :class:`InstanceHeader`, and its one JSON codec.

The store keeps the header as a plain JSON object with camelCase keys
(``specs/instance.schema.json``); :class:`loopwright.abc.Store` takes and returns that object,
so third-party stores never see this class. The runtime converts at the boundary with
:meth:`InstanceHeader.from_json` and :meth:`InstanceHeader.to_json`.

What a round trip keeps (``from_json(d).to_json() == d``, for any header this or a newer
version wrote):

- every key this version does not know, in :attr:`InstanceHeader.extra`, written back as it was;
- the difference between an absent key and one saved at its default value (``"cost": null``
  means "unknown", an absent ``cost`` means "nothing spent yet"): a key the header had at its
  default is listed in :attr:`InstanceHeader.kept` and written again;
- nested values (the definition snapshot, grants, pending approvals, the inbox, monitors ...)
  as the plain JSON they are: the modules that own them parse them (and fail closed on a
  malformed one) where they are used, exactly as before.

The keys a new header always has (:data:`ALWAYS`) are always written; every other key is written
when its field differs from the default or is in :attr:`~InstanceHeader.kept`.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from typing import Any, Final

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from loopwright._convert import camel
from loopwright._states import State, StopReason

__all__ = ["ALWAYS", "InstanceHeader", "header_converter"]

#: A JSON object kept as it was read (never converted field by field).
JSONObject = Mapping[str, Any]


@attrs.frozen(kw_only=True)
class InstanceHeader:
    """One instance's saved header, typed (see the module docstring for the codec's promises).

    Field names are the snake_case of the on-disk camelCase keys (``instance_id`` is
    ``instanceId``); each field's meaning is the key's description in
    ``specs/instance.schema.json``. A field's default is what an absent key means.

    Read with ``from_json(..., lenient=True)`` (views and checks only), a field holds its value as
    saved, whatever its kind (see :meth:`from_json`).

    Attributes:
        extra: Keys this version does not know, kept and written back unchanged.
        kept: Known keys that are not always written but were read (or set) at their default
            value, so they are written again (``"cost": null``, ``"monitors": []``).
    """

    instance_id: str = ""
    name: str = ""
    version: int = 1
    definition: JSONObject | None = None
    definition_path: str | None = None
    inputs: JSONObject = attrs.field(factory=dict)
    state: State = State.WAITING
    stop_reason: StopReason | None = None
    cancelled: bool = False
    error: str | None = None
    limit: str | None = None
    capabilities: JSONObject | None = None
    capabilities_recorded: bool = False
    forked_from: JSONObject | None = None
    pending_approvals: tuple[JSONObject, ...] = ()
    spawner_instance_id: str | None = None
    caller_instance_id: str | None = None
    caller_tool_call_id: str | None = None
    delegation_prompt: str | None = None
    model: str | None = None
    depth: int = 0
    context_tokens: int | None = None
    monitors: tuple[JSONObject, ...] = ()
    budget: JSONObject | None = None
    children: tuple[str, ...] = ()
    inherited_gates: Any = None
    agent_swarm_uri: str | None = None
    registered_definition: str | None = None
    row_signature: str | None = None
    text: str | None = None
    output: Any = None
    usage: JSONObject | None = None
    cost: float | None = None
    turns: int | None = None
    tool_calls_started: int | None = None
    paused_at: float | None = None
    segment_started_at: float | None = None
    awaiting_answer: JSONObject | None = None
    created_at: str = ""
    updated_at: str = ""
    segment: JSONObject | None = None
    inbox_cursor: int | None = None
    task_prompt: str | None = None
    task_history: tuple[JSONObject, ...] = ()
    runner: str | None = None
    queued: bool = False
    submitted_by: str | None = None
    served_by: str | None = None
    inbox: tuple[JSONObject, ...] = ()
    extra: JSONObject = attrs.field(factory=dict)
    kept: frozenset[str] = frozenset()

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, lenient: bool = False) -> InstanceHeader:
        """Return the header a store's JSON object holds (unknown keys in :attr:`extra`).

        :param lenient: For reading only (the JSON views, ``ls``, ``show``, the loader's checks):
            never refuse, and read each value as it was saved, converting nothing but a
            ``state`` or ``stopReason`` this version knows (to :class:`State`, :class:`StopReason`)
            and a list (to a tuple; ``null`` reads as empty). A value that is not of its field's
            kind is kept as it is (an unknown state stays its ``str``, so ``ls`` shows it raw;
            ``"queued": 1`` stays ``1``), so a reader tests it exactly as it tested the saved
            JSON. The checks that refuse to run a malformed instance are the loader's and
            :class:`~loopwright._instance.Instance`'s, unchanged (they fail closed as before).
        :raises cattrs.BaseValidationError: A known key holds a value of the wrong kind (a
            ``state`` that is no state ...), unless ``lenient``.
        """
        return _structure(data, _structure_lenient() if lenient else _structure_fields())

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object a store saves (camelCase keys; see the module docstring)."""
        return _unstructure(self)

    def keep(self, *keys: str) -> InstanceHeader:
        """Return a copy that writes the camelCase ``keys`` even at their default (``"cost": null``)."""
        return attrs.evolve(self, kept=self.kept | frozenset(keys))


# -- the codec ---------------------------------------------------------------------------------

_FIELDS: Final = tuple(a for a in attrs.fields(InstanceHeader) if a.name not in {"extra", "kept"})
#: The on-disk key of each field.
_KEY: Final = {a.name: camel(a.name) for a in _FIELDS}
#: Every key this version knows.
KNOWN: Final = frozenset(_KEY.values())
#: The keys every new header has (:meth:`Driver.new_header <loopwright._driver.Driver.new_header>`): always written.
ALWAYS: Final = frozenset({
    "instanceId", "name", "version", "definitionPath", "definition", "inputs", "state", "stopReason",
    "cancelled", "error", "capabilities", "capabilitiesRecorded", "pendingApprovals", "inbox",
    "spawnerInstanceId", "callerInstanceId", "callerToolCallId", "delegationPrompt", "createdAt", "updatedAt",
    "model", "runner", "taskPrompt",
})
#: Each optional key and the JSON of its field's default, to tell which were read at their default.
_DEFAULTS: Final[dict[str, Any]] = {_KEY[a.name]: [] if a.default == () else a.default
                    for a in _FIELDS if _KEY[a.name] not in ALWAYS}


def _keep_unknown(kind: type[enum.Enum]) -> Any:
    """Return a hook that reads a value of ``kind``, keeping one this version does not know as it is."""
    def structure(value: Any, _t: Any) -> Any:
        try:
            return None if value is None else kind(value)
        except ValueError:
            return value
    return structure


def _as_saved(value: Any, _t: Any) -> Any:
    return value


def _as_tuple(value: Any, _t: Any) -> Any:
    """Read a saved list as a tuple (``null`` as empty); keep anything else as it is."""
    return () if value is None else tuple(value) if isinstance(value, (list, tuple)) else value


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter()
    # A number is kept as it was saved (``"cost": 1`` stays ``1``, never ``1.0``): a float
    # field accepts an int, and the views print the saved value unchanged.
    conv.register_structure_hook(float, lambda v, _t: v if type(v) is int else float(v))
    # Nested JSON stays the JSON it is: shared, never walked (the definition snapshot is large).
    conv.register_structure_hook_func(_is(JSONObject), _as_saved)
    conv.register_unstructure_hook_func(_is(JSONObject), _same)
    for listed in (tuple[JSONObject, ...], tuple[str, ...]):
        conv.register_structure_hook_func(_is(listed), lambda v, _t: tuple(v))
        conv.register_unstructure_hook_func(_is(listed), list)
    # The codec's functions are generated on first use, not at import (``ls`` needs only the lenient one).
    renamed: dict[str, Any] = {a.name: override(rename=_KEY[a.name]) for a in _FIELDS}
    written: dict[str, Any] = {a.name: override(rename=_KEY[a.name], omit_if_default=_KEY[a.name] not in ALWAYS)
                               for a in _FIELDS}
    conv.register_structure_hook_factory(lambda t: t is InstanceHeader, lambda _t: make_dict_structure_fn(
        InstanceHeader, conv, extra=_SKIP, kept=_SKIP, **renamed))
    conv.register_unstructure_hook_factory(lambda t: t is InstanceHeader, lambda _t: make_dict_unstructure_fn(
        InstanceHeader, conv, extra=_SKIP, kept=_SKIP, **written))
    return conv


def _is(kind: Any) -> Any:
    """Return a predicate for a hook registered for exactly the type ``kind``."""
    return lambda t: t == kind


def _same(value: Any) -> Any:
    return value


_SKIP: Final = override(omit=True)
#: The one converter between :class:`InstanceHeader` and the header's JSON.
header_converter: Final = _make_converter()


@functools.cache
def _structure_fields() -> Any:
    return header_converter.get_structure_hook(InstanceHeader)


@functools.cache
def _unstructure_fields() -> Any:
    return header_converter.get_unstructure_hook(InstanceHeader)


@functools.cache
def _structure_lenient() -> Any:
    """:meth:`InstanceHeader.from_json` with ``lenient=True``: values as saved, known states typed, lists as tuples."""
    as_saved: dict[str, Any] = {a.name: override(rename=_KEY[a.name], struct_hook=(
        _keep_unknown(State) if a.name == "state" else _keep_unknown(StopReason) if a.name == "stop_reason"
        else _as_tuple if str(a.type).startswith("tuple[") else _as_saved)) for a in _FIELDS}
    return make_dict_structure_fn(
        InstanceHeader, header_converter, _cattrs_detailed_validation=False, extra=_SKIP, kept=_SKIP, **as_saved)


def _structure(data: Mapping[str, Any], fields: Any) -> InstanceHeader:
    header: InstanceHeader = fields(data, InstanceHeader)
    extra = {k: v for k, v in data.items() if k not in KNOWN}
    kept = frozenset(k for k, default in _DEFAULTS.items() if k in data and data[k] == default
                     and type(data[k]) is type(default))
    if extra or kept:
        object.__setattr__(header, "extra", extra)  # built here, once: the header is not shared yet
        object.__setattr__(header, "kept", kept)
    return header


def _unstructure(header: InstanceHeader) -> dict[str, Any]:
    out: dict[str, Any] = _unstructure_fields()(header)
    for key in header.kept:
        if key not in out and key in _DEFAULTS:
            out[key] = [] if _DEFAULTS[key] == [] else _DEFAULTS[key]
    if header.extra:
        out.update({k: v for k, v in header.extra.items() if k not in out})
    return out


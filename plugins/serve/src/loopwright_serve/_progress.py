"""What the control plane shows of an instance beyond its summary: live counters, and a definition's inputs.

An instance's header holds its totals (turns, usage, cost) as of the last time it rested: while
it runs, the engine appends each model answer to the entry log at once, with its turn's number,
usage and cost (``"turn": {n, usage, cost}``), writes the turn's records after its tool calls
ran, and the header only when the segment ends. :func:`live_numbers` adds the turns the entry
log holds since the segment began (its last ``seg`` entry) to the header's totals, so a running
instance's numbers move as each model answer arrives, even while a long tool call runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loopwright.errors import InstanceNotFoundError

if TYPE_CHECKING:
    from loopwright import Definition, HeaderFields
    from loopwright.abc import Store

__all__ = ["inputs_schema", "live_numbers"]

_COUNTS = ("inputTokens", "outputTokens", "totalTokens")


def _state_of(header: HeaderFields) -> str:
    state = header.state
    return str(getattr(state, "value", state))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


async def live_numbers(store: Store, header: HeaderFields) -> dict[str, Any]:
    """Return ``{turns, usage, cost, runningSince}``: the instance's counters as they stand now.

    For an instance at rest they are the header's. For a running one, the turns of the model
    answers in the entry log after its last ``seg`` entry (the segment's start) are added to the
    header's totals (the header is written at rest only), and ``runningSince`` is that entry's
    time (ISO 8601), from which the elapsed time of the segment is counted. ``cost`` is ``None`` (unknown) when
    the header's cost or any added turn's cost is unknown, never shown as 0.
    """
    usage = {key: int(_number((header.usage or {}).get(key))) for key in _COUNTS}
    turns = int(header.turns or 0)
    cost: float | None = header.cost
    if cost is None and not turns:
        cost = 0.0  # nothing was spent yet: a first segment's header has no cost until it rests
    since: str | None = None
    if _state_of(header) == "running":
        try:
            entries = await store.read_entries(header.instance_id)
        except InstanceNotFoundError:
            entries = []
        since, turns, cost = _add_segment(entries, usage, turns, cost)
    if not usage["totalTokens"]:
        usage["totalTokens"] = usage["inputTokens"] + usage["outputTokens"]
    return {"turns": turns, "usage": usage, "cost": cost, "runningSince": since}


def _add_segment(entries: list[dict[str, Any]], usage: dict[str, int], turns: int,
                 cost: float | None) -> tuple[str | None, int, float | None]:
    """Add the turns of the running segment's model answers to ``usage`` (in place); return its start, turns, cost."""
    start, since = 0, None
    for index, entry in enumerate(entries):
        if entry.get("t") == "seg":
            start, since = index + 1, entry.get("at")
    for entry in entries[start:]:
        turn = entry.get("turn") if entry.get("t") == "msg" else None
        if not isinstance(turn, Mapping):
            continue
        spent = turn.get("usage") if isinstance(turn.get("usage"), Mapping) else {}
        for key in _COUNTS:
            usage[key] += int(_number(spent.get(key)))
        number = turn.get("n")
        if isinstance(number, int) and not isinstance(number, bool):
            turns = max(turns, number)
        price = turn.get("cost")
        cost = None if cost is None or not isinstance(price, (int, float)) else cost + float(price)
    return since, turns, cost


def inputs_schema(definition: Definition) -> dict[str, Any]:
    """Return the JSON Schema of ``definition``'s declared inputs: what ``inputs`` of a start may hold.

    Each input is a property with its JSON ``type``, ``description`` and ``default`` (and ``enum``
    when the declaration has one); the inputs without a default that must be given are
    ``required``; no other key is allowed (a start naming one is refused).
    """
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, spec in definition.inputs.items():
        prop: dict[str, Any] = {"type": spec.type}
        if spec.description:
            prop["description"] = spec.description
        if not spec.required or spec.default is not None:
            prop["default"] = spec.default
        choices = getattr(spec, "enum", None)
        if choices:
            prop["enum"] = list(choices)
        properties[name] = prop
        if spec.required:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}

"""What the parts of the engine share: how a segment ends, one call on its way, and the result helpers."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import cattrs

from loopwright._convert import converter
from loopwright._types import (
    Message,
    PendingApproval,
    State,
    StopReason,
    ToolCall,
    ToolOutput,
    ToolResult,
    ToolStatus,
    Usage,
)

if TYPE_CHECKING:
    from loopwright._instance import Instance
    from loopwright._tools import Tool

__all__ = [
    "MAX_CALLS_PER_REPLY", "MAX_CONCURRENT_CALLS", "MAX_INVALID_OUTPUTS", "MAX_RESULT_CHARS", "Call", "SegmentEnd",
    "cut", "dumps", "make_result", "make_success", "of_ancestor", "one_request", "restore_call_order", "take_decisions",
    "tool_message", "usage_json",
]

#: Tool calls taken from one model reply; the rest get ``skipped`` results.
MAX_CALLS_PER_REPLY = 32
#: Tool calls running at once.
MAX_CONCURRENT_CALLS = 8
#: Characters of one tool result; longer ones are cut, with a marker.
MAX_RESULT_CHARS = 100_000
#: Invalid structured answers re-prompted before the segment ends ``output_invalid`` (seed 002).
MAX_INVALID_OUTPUTS = 2

#: JSON for the model and the log: non-ASCII kept, anything else as its ``str``.
dumps = functools.partial(json.dumps, ensure_ascii=False, default=str)
#: A :class:`Usage` as the log and the records write it.
usage_json = converter.get_unstructure_hook(Usage)
#: Tool return values reach the model with their own field names, defaults included.
_plain = cattrs.Converter()


class SegmentEnd(Exception):  # noqa: N818 - control flow inside the loop only
    """Raised inside the loop to end the segment in a resting state."""

    def __init__(self, state: State, reason: StopReason, *, error: str | None = None,
                 limit: str | None = None, failure: BaseException | None = None) -> None:
        self.state = state
        self.reason = reason
        self.error = error
        self.limit = limit
        self.failure = failure
        super().__init__(reason.value)


@attrs.define
class Call:
    """One call of a turn on its way to a result."""

    index: int
    call: ToolCall
    tool: Tool | None = None
    result: ToolResult | None = None
    held: str | None = None          # approval reason when held
    original_digest: str | None = None  # call_digest of the model's call when a hook changed its arguments
    awaiting_user: bool = False
    over_limit: bool = False         # skipped at its start: the tree's toolCalls budget was used up
    raised: str | None = None        # the tool raised (not a ToolError): ``Type: message``, for onToolException


def of_ancestor(owner: Instance) -> str:
    """Name, in a limit's message, the ancestor whose limit it is."""
    return f" of agent {owner.id}, which started this one (directly or not),"


def one_request(usage: Usage) -> Usage:
    """Return the usage of a call whose provider did not count it (``requests`` 0): one request.

    Without token counts it is also one ``unreported_requests``, so its cost is unknown, not 0.
    """
    counted = bool(usage.input_tokens or usage.output_tokens)
    return attrs.evolve(usage, requests=1, unreported_requests=usage.unreported_requests or int(not counted))


def cut(content: str) -> str:
    """Cut a result to :data:`MAX_RESULT_CHARS`, with a marker saying so."""
    if len(content) <= MAX_RESULT_CHARS:
        return content
    return (content[:MAX_RESULT_CHARS]
            + f"\n[truncated: the result had {len(content):,} characters; only the first "
              f"{MAX_RESULT_CHARS:,} are shown]")


def make_result(call: ToolCall, status: ToolStatus, content: str, *, duration: float | None = None) -> ToolResult:
    """Return a result of ``call`` with ``status`` (what the loop says of a call, or a tool that failed)."""
    return ToolResult(tool_call_id=call.id, name=call.name, status=status, content=cut(content),
                      duration=duration)


def make_success(call: ToolCall, value: Any, duration: float | None) -> ToolResult:
    """Return the successful result of ``call`` whose tool returned ``value`` (text for the model, ``data`` kept)."""
    if isinstance(value, ToolOutput):
        inner = make_success(call, value.value, duration)
        return attrs.evolve(inner, usage=value.usage, cost=value.cost)
    if isinstance(value, str):
        text = value
    elif value is None:
        text = ""
    else:
        try:
            text = dumps(_plain.unstructure(value))
        except (TypeError, ValueError):
            text = str(value)
    return ToolResult(tool_call_id=call.id, name=call.name, status=ToolStatus.SUCCESS, content=cut(text),
                      data=value, duration=duration)


def tool_message(item: Call) -> Message:
    """Return the transcript's message for a call's result."""
    r = item.result
    assert r is not None  # noqa: S101
    return Message(role="tool", tool_call_id=r.tool_call_id, name=r.name, content=r.content, status=r.status,
                   injected=item.call.injected, tool_call_wire_id=item.call.wire_id)


def take_decisions(inst: Instance) -> list[PendingApproval]:
    """Take the held calls off ``inst``'s header and restart its elapsed clock; return them.

    The time the instance waited for a person is not its own: the segment's start moves on by
    the pause (``pausedAt``), whether the decision goes on now or a resume after a crash does.
    """
    h = inst.header
    paused = h.paused_at
    del h.paused_at
    if paused is not None and h.segment_started_at:
        h.segment_started_at = float(h.segment_started_at) + max(time.time() - paused, 0.0)
    pending = inst.pending_approvals
    inst.set_pending([])
    return pending


def restore_call_order(inst: Instance) -> None:
    """Put the results after the last assistant message back in its call order (after late results)."""
    messages = inst.transcript
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.role == "assistant":
            if not m.tool_calls:
                return
            tail = list(messages[i + 1:])
            ordered = sorted(tail, key=functools.partial(_position, {c.id: k for k, c in enumerate(m.tool_calls)}))
            if ordered != tail:
                messages.replace_tail(i + 1, ordered)
            return
        if m.role != "tool":
            return


def _position(order: Mapping[str, int], message: Message) -> int:
    """Sort key: tool results by their call's position, anything else after them."""
    if message.role == "tool":
        return order.get(message.tool_call_id or "", 1 << 30)
    return 1 << 31

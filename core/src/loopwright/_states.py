"""The states and reasons of instances and tool calls: :class:`State`, :class:`StopReason`, :class:`ToolStatus`.

String enums, kept apart from the value objects of :mod:`loopwright._types` (which re-exports
them) so that what only compares states (``loopwright ls`` and ``show``, the CLI's output)
imports no attrs class.
"""

from __future__ import annotations

import enum

__all__ = ["State", "StopReason", "ToolStatus"]


class State(enum.StrEnum):
    """The state of an instance (seed 000)."""

    RUNNING = "running"
    WAITING = "waiting"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    STOPPED = "stopped"
    ERROR = "error"


class StopReason(enum.StrEnum):
    """Why a run segment ended."""

    COMPLETED = "completed"
    WAITING = "waiting"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    MAX_ITERATIONS = "max_iterations"
    LIMIT_EXCEEDED = "limit_exceeded"
    CONTENT_FILTER = "content_filter"
    OUTPUT_INVALID = "output_invalid"
    CANCELLED = "cancelled"
    ERROR = "error"


class ToolStatus(enum.StrEnum):
    """How a tool call came back. Every call gets exactly one result with one of these."""

    SUCCESS = "success"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    TOOL_ERROR = "tool_error"
    TOOL_FAILED = "tool_failed"
    TIMEOUT = "timeout"
    DENIED = "denied"
    BLOCKED = "blocked"
    SKIPPED = "skipped"
    UNKNOWN_OUTCOME = "unknown_outcome"

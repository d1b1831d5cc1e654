"""The engine: the agent loop that runs segments, turns and tool calls (seed 000, "The loop").

It imports nothing above it: the runtime hands it an :class:`EngineDeps` bundle, and starts
each segment with one of the segment kinds (:class:`Start`, :class:`Resume`, :class:`Decided`,
:class:`Mail`, :class:`LateMail`).
"""

from __future__ import annotations

from loopwright._engine._common import SegmentEnd
from loopwright._engine._deps import EngineDeps, SegmentRun
from loopwright._engine._loop import (
    MAX_CALLS_PER_REPLY,
    MAX_CONCURRENT_CALLS,
    MAX_INVALID_OUTPUTS,
    MAX_RESULT_CHARS,
    Loop,
    parse_output,
)
from loopwright._engine._segments import Decided, LateMail, Mail, Resume, Segment, Start

__all__ = [
    "MAX_CALLS_PER_REPLY", "MAX_CONCURRENT_CALLS", "MAX_INVALID_OUTPUTS", "MAX_RESULT_CHARS", "Decided",
    "EngineDeps", "LateMail", "Loop", "Mail", "Resume", "Segment", "SegmentEnd", "SegmentRun", "Start",
    "parse_output",
]

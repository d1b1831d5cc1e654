"""The engine: the agent loop that runs segments, turns and tool calls (seed 000, "The loop").

It imports nothing above it: the runtime hands it an :class:`EngineDeps` bundle, and starts
each segment with one of the segment kinds (:class:`Start`, :class:`Resume`, :class:`Decided`,
:class:`Mail`, :class:`LateMail`). Its modules, one per concern (docs/architecture.md):

* ``_loop``: :class:`Loop`, the parts wired together; what the runtime calls.
* ``_segments``: the segment kinds and running a segment.
* ``_turn``: the turns of a segment and one model turn.
* ``_gateway``: model calls (provider, stream, retries, fallbacks, price), for turns and summaries.
* ``_calls``: tool calls (prepare, execute, finish) and approval decisions.
* ``_mailbox``: posts, the inbox, cancel requests, answers to ``ask_user``.
* ``_compaction``: the context strategy and its summary calls.
* ``_checks``: the output schema and the completion gate.
* ``_recovery``: repairs after a crash or a cancel.
* ``_limits``: limits, the tree's one budget, the elapsed deadline.
* ``_journal``: records, events, saves, state changes, observers.
* ``_common``: shared types and helpers; ``_deps``: the bundle and the run protocol.
"""

from __future__ import annotations

from loopwright._engine._checks import parse_output
from loopwright._engine._common import (
    MAX_CALLS_PER_REPLY,
    MAX_CONCURRENT_CALLS,
    MAX_INVALID_OUTPUTS,
    MAX_RESULT_CHARS,
    SegmentEnd,
)
from loopwright._engine._deps import EngineDeps, SegmentRun
from loopwright._engine._loop import Loop
from loopwright._engine._segments import Decided, LateMail, Mail, Resume, Segment, Start

__all__ = [
    "MAX_CALLS_PER_REPLY", "MAX_CONCURRENT_CALLS", "MAX_INVALID_OUTPUTS", "MAX_RESULT_CHARS", "Decided",
    "EngineDeps", "LateMail", "Loop", "Mail", "Resume", "Segment", "SegmentEnd", "SegmentRun", "Start",
    "parse_output",
]

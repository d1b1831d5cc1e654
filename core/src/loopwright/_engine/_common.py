"""What every part of the engine shares: how a segment ends (:class:`SegmentEnd`)."""

from __future__ import annotations

from loopwright._types import State, StopReason

__all__ = ["SegmentEnd"]


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

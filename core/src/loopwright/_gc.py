"""The garbage collector during bursts: fewer collections while many segments run in this process.

Each turn allocates many short-lived container objects (messages, events, parsed JSON); with
thousands of segments running at once, CPython's generation-0 threshold (700 allocations) starts
a collection every few turns of the whole process, and each collection of the older generations
walks every live instance. :class:`BurstPolicy` raises generation 0's threshold to
:data:`BURST_THRESHOLD` while at least :data:`BURST_SEGMENTS` segments run in the process (in any
number of runtimes), and puts back the thresholds it found once fewer than a quarter of that run.
Garbage is still collected, in fewer, larger passes: at most :data:`BURST_THRESHOLD` container
allocations apart.

It never lowers a threshold (a host that raised it further, or set its own while a burst ran,
keeps its setting: the policy restores only thresholds it set itself and finds unchanged), and
``LOOPWRIGHT_GC_BURST=0`` in the environment turns it off for the process.
"""

from __future__ import annotations

import gc
import os

__all__ = ["BURST", "BURST_SEGMENTS", "BURST_THRESHOLD", "BurstPolicy"]

#: Segments running at once in the process from which generation 0's threshold is raised.
BURST_SEGMENTS = 64
#: Generation 0's threshold during a burst (CPython's default is 700).
BURST_THRESHOLD = 50_000


class BurstPolicy:
    """Counts the segments running in the process and sets generation 0's threshold from the count.

    :meth:`segment_started` and :meth:`segment_ended` are called by the runtime around each
    segment; they are cheap (an integer compared) except when the count crosses a bound.
    """

    def __init__(self, *, segments: int = BURST_SEGMENTS, threshold: int = BURST_THRESHOLD,
                 enabled: bool | None = None) -> None:
        """Prepare the policy; ``enabled=None`` reads ``LOOPWRIGHT_GC_BURST`` (anything but ``0``: on)."""
        self.segments = segments
        self.threshold = threshold
        self.enabled = os.environ.get("LOOPWRIGHT_GC_BURST", "1") != "0" if enabled is None else enabled
        self.running = 0
        self._saved: tuple[int, int, int] | None = None
        self._set: tuple[int, int, int] | None = None

    @property
    def raised(self) -> bool:
        """Whether the policy's raised threshold is in force now."""
        return self._set is not None

    def segment_started(self) -> None:
        """Count a segment that starts; from :attr:`segments` running, raise the threshold."""
        self.running += 1
        if self.running >= self.segments and self._set is None and self.enabled:
            saved = gc.get_threshold()
            if saved[0] < self.threshold:
                gc.set_threshold(self.threshold, *saved[1:])
                self._saved, self._set = saved, gc.get_threshold()

    def segment_ended(self) -> None:
        """Count a segment that ended; below a quarter of :attr:`segments`, put the thresholds back."""
        self.running = max(0, self.running - 1)
        if self._set is not None and self.running < max(1, self.segments // 4):
            if gc.get_threshold() == self._set and self._saved is not None:
                gc.set_threshold(*self._saved)
            self._saved = self._set = None


#: The process's policy, shared by every runtime in it.
BURST = BurstPolicy()

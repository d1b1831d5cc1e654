"""The loop: the engine's parts wired together, and the one object the runtime drives.

:class:`Loop` builds its collaborators from an :class:`EngineDeps` bundle, each over the ones
below it (none holds the runtime, none reaches into another's attributes)::

    Segments ── Turns ──┬── Mailbox ─────────┐
        │               ├── Compactor ── Gateway ── Journal
        │               ├── Gateway          │
        └── Recovery ───┴── Calls ── Checks ─┘   (Budgets: the limits, under all of them)

and offers the runtime what it uses: run a segment, run the set-up's injected calls, settle a
cancel, repair records, read the mailbox, and the journal's state changes, records, saves and
observers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loopwright._engine._calls import Calls
from loopwright._engine._checks import Checks
from loopwright._engine._compaction import Compactor
from loopwright._engine._gateway import Gateway
from loopwright._engine._journal import Journal
from loopwright._engine._limits import Budgets
from loopwright._engine._mailbox import Mailbox
from loopwright._engine._recovery import Recovery
from loopwright._engine._segments import Segments
from loopwright._engine._turn import Turns

if TYPE_CHECKING:
    from loopwright._engine._deps import EngineDeps

__all__ = ["Loop"]


class Loop:
    """Drives instances of one runtime. Stateless apart from what it was given.

    Attributes:
        deps: What it uses (see :class:`EngineDeps`).
        journal: Records, events, saves, state changes and observers.
        mailbox: The instances' mailboxes.
        recovery: The repair of instances a dead process or a cancel left mid-turn.
        segments: Runs segments.

    """

    def __init__(self, deps: EngineDeps) -> None:
        """Build the engine's parts over ``deps``."""
        self.deps = deps
        journal = self.journal = Journal(deps)
        budgets = Budgets(deps.limits_of)
        checks = Checks(deps, journal)
        gateway = Gateway(deps, journal)
        calls = Calls(deps, journal, budgets, checks)
        mailbox = self.mailbox = Mailbox(deps, journal)
        compactor = Compactor(deps, journal, gateway, budgets)
        turns = Turns(deps=deps, journal=journal, budgets=budgets, gateway=gateway, mailbox=mailbox,
                      compactor=compactor, checks=checks, calls=calls)
        recovery = self.recovery = Recovery(deps, journal, calls, checks)
        self.segments = Segments(deps=deps, journal=journal, turns=turns, recovery=recovery, calls=calls)
        # What the runtime calls, bound once.
        self.run_segment = self.segments.run
        self.run_calls = calls.run
        self.record = journal.record
        self.save = journal.save
        self.observe = journal.observe
        self.set_state = journal.set_state
        self.absorb_mail = mailbox.absorb_mail
        self.has_mail = mailbox.has_mail
        self.cancel_posted = mailbox.cancel_posted
        self.repair_records = recovery.repair_records
        self.settle_cancelled = recovery.settle_cancelled

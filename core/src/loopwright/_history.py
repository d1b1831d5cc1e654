"""Forks and rewinds: new histories from a resting instance's past, :class:`History`.

Both go back to the end of a turn of the entry log (never into a held turn). A fork is a new
instance with that history and the original's grants, gates and budget; a rewind moves the
instance itself back, writing a ``rewind`` entry (the log stays append-only). Agents started
after the point are named to the model in a note at the end of the history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loopwright._capabilities import capabilities_to_dict
from loopwright._header_fields import HeaderFields
from loopwright._instance import message_to_json, new_id, now_iso, unanswered_calls
from loopwright._lease import held_lease
from loopwright._replay import history_at, rebuild
from loopwright._types import Message, State, StopReason
from loopwright.errors import InstanceNotFoundError, LoopwrightError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from loopwright._run import AgentRun
    from loopwright._runtime import Runtime

__all__ = ["History"]

#: Header fields a fork does not take from its original (it has its own, set by :meth:`History.fork`).
_NOT_FORKED = ("awaiting_answer", "children", "inbox_cursor", "monitors", "paused_at", "segment",
               "segment_started_at", "served_by", "text", "output", "limit", "context_tokens",
               "delegation_prompt", "agent_swarm_uri")


def _fork_note(original: str, turn: int, children: Sequence[str], later: Sequence[str]) -> str:
    """Return what a fork's model is told about the agents of the instance it was forked from."""
    text = (f"[loopwright] This conversation is a fork of instance {original} at the end of turn {turn}. "
            f"The agents that instance started belong to it, not to you: {', '.join(children)}.")
    if later:
        text += f" These were started after turn {turn} and are not in this history: {', '.join(later)}."
    return text


class History:
    """Forks and rewinds of one runtime's instances."""

    def __init__(self, runtime: Runtime) -> None:
        """Fork and rewind the instances of ``runtime``."""
        self._rt = runtime

    async def _history_point(self, run: AgentRun, turn: int | None, what: str,
                             ) -> tuple[list[Message], int, list[str]]:
        """Return the history at the end of ``turn``, that turn, and the agents started after it.

        :raises LoopwrightError: The instance is running, ``turn`` is not in its history, or the
            point is inside a held turn (a call without its result: held for approval, or an
            ``ask_user`` question not yet answered).
        """
        inst = run.inst
        if run.running or inst.state is State.RUNNING:
            raise LoopwrightError(f"cannot {what} instance {inst.id}: it is running; let it rest first")
        entries = await self._rt.store.read_entries(inst.id)
        try:
            messages, at = history_at(entries, turn)
        except ValueError as exc:
            raise LoopwrightError(f"cannot {what} instance {inst.id} at turn {turn}: {exc}") from None
        _assistant, unanswered = unanswered_calls(messages)
        if unanswered:
            ids = ", ".join(c.id for c in unanswered)
            raise LoopwrightError(
                f"cannot {what} instance {inst.id} at turn {at}: that turn is held (its calls {ids} wait for "
                "approval or an answer); decide them first, or choose an earlier turn")
        known = {c.id for m in messages for c in m.tool_calls}
        later: list[str] = []
        for child in inst.header.children:
            try:
                link = HeaderFields(await self._rt.store.read_header(child)).caller_tool_call_id
            except InstanceNotFoundError:
                continue
            if link not in known:
                later.append(str(child))
        return messages, at, later

    async def _exists(self, instance_id: str) -> bool:
        try:
            await self._rt.store.read_header(instance_id)
        except InstanceNotFoundError:
            return False
        return True

    async def fork(self, instance_id: str, at_turn: int | None = None) -> AgentRun:
        """Create a new instance whose history is ``instance_id``'s up to the end of ``at_turn``.

        By default the history as it stands (the instance rests). The new instance records
        ``forkedFrom: {instanceId, turn}``, keeps the original's grants, gates and budget (never
        wider: its saved grants intersected with this runtime's), starts no agent and copies
        none, and rests ``waiting``, ready for a message. The original is not changed. Its
        history ends with a note that the agents the original started belong to the original.

        :raises LoopwrightError: The original is running, the turn is not in its history, or
            it is inside a held turn.
        """
        src = await self._rt.get_agent(instance_id)
        if not src.running:
            await self._rt.loader.refresh(src)  # what another process saved since wins
        messages, at, later = await self._history_point(src, at_turn, "fork")
        original = src.inst.header
        grants = self._rt.loader.saved_grants(instance_id, original.json)
        iid = new_id()
        header = original.copy_without(*_NOT_FORKED)
        header.instance_id, header.state, header.stop_reason = iid, State.WAITING, StopReason.WAITING
        header.cancelled, header.error = False, None
        header.capabilities, header.capabilities_recorded = capabilities_to_dict(grants), True
        header.pending_approvals, header.inbox, header.children = [], [], []
        header.spawner_instance_id = header.caller_instance_id = header.caller_tool_call_id = None
        header.forked_from = {"instanceId": instance_id, "turn": at}
        header.created_at = header.updated_at = now_iso()
        header.runner, header.turns, header.usage, header.cost, header.tool_calls_started = (
            self._rt.owner, at, {}, 0.0, 0)
        # A listed id may name no instance: its caller stopped after listing it, before creating it.
        children = [str(c) for c in original.children if await self._exists(str(c))]
        if children:
            messages.append(Message(role="user", source="runtime", content=_fork_note(instance_id, at, children,
                                                                                        later)))
        self._rt.driver.sign(header)  # the original's signature names its id: the fork gets its own
        await self._rt.store.create(iid, header.json)
        await self._rt.store.append_entries(iid, [
            {"t": "fork", "from": instance_id, "turn": at, "messages": [message_to_json(m) for m in messages]}])
        self._rt.recorder.queue(iid, "fork", {"from": instance_id, "turn": at, "agentsOfTheOriginal": children})
        self._rt.recorder.queue(instance_id, "fork", {"to": iid, "turn": at})
        await self._rt.recorder.flush(iid)
        await self._rt.recorder.flush(instance_id)
        return await self._rt.get_agent(iid)

    async def rewind(self, instance_id: str, to_turn: int) -> AgentRun:
        """Move a resting instance back to the end of ``to_turn``; it rests ``waiting``, ready for a message.

        The entry log stays append-only: a ``rewind`` entry holds the history at that point, and
        what came after stays in the log and the records (a ``rewind`` record marks it). Agents it
        started after the point keep running or resting as they were; the history ends with a
        note naming them.

        :raises LoopwrightError: It is running or waiting for approval, the turn is not in its
            history, or the point is inside a held turn.
        :raises InstanceLockedError: Another process runs it.
        """
        run = await self._rt.get_agent(instance_id)
        if run.running:
            raise LoopwrightError(f"cannot rewind instance {instance_id}: it is running; let it rest first")
        async with held_lease(self._rt.store, instance_id, self._rt.owner):
            await self._rt.loader.refresh(run)
            inst = run.inst
            if inst.state is State.WAITING_FOR_APPROVAL:
                raise LoopwrightError(
                    f"cannot rewind instance {instance_id}: calls wait for approval; decide them first")
            messages, at, later = await self._history_point(run, to_turn, "rewind")
            if later:
                messages.append(Message(role="user", source="runtime", content=(
                    f"[loopwright] This conversation was rewound to the end of turn {at}. Agents you started after "
                    f"that point still exist: {', '.join(later)}.")))
            entry = {"t": "rewind", "turn": at, "from": inst.turn, "at": now_iso(),
                     "messages": [message_to_json(m) for m in messages]}
            await self._rt.store.append_entries(instance_id, [entry])
            rebuild(inst, await self._rt.store.read_entries(instance_id))
            h = inst.header
            del h.awaiting_answer
            h.state, h.stop_reason, h.cancelled, h.error, h.turns, h.updated_at = (
                State.WAITING, StopReason.WAITING, False, None, at, now_iso())
            self._rt.recorder.queue(instance_id, "rewind",
                                    {"from": entry["from"], "to": at, "agentsStartedAfter": later})
            await self._rt.recorder.write_header(inst)
            await self._rt.recorder.flush(instance_id)
        return run

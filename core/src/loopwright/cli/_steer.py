"""The commands that steer an instance: decide its held calls, message it, cancel it, fork or rewind it.

``approve`` and ``deny`` decide calls held for approval (one call, every call an instance holds, or
a whole tree's with ``--subtree``) and ``message`` sends a message; each then follows the instance
until it rests (:mod:`loopwright.cli._following`), or with ``--detach`` only saves what was decided
or posted, for a worker. ``cancel`` stops an instance; ``fork`` and ``rewind`` make a new history
from a resting instance's past and run nothing. Each returns its command's exit code; a decision,
fork or rewind the instance's state refuses is bad input (exit 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import click

from loopwright._states import State
from loopwright._types import approval_digest
from loopwright._views import summary
from loopwright.cli._exits import EXIT_OK, EXIT_USAGE, CliError
from loopwright.cli._following import follow_agent, follow_elsewhere, report_submitted
from loopwright.cli._opening import lookup, runtime, sync
from loopwright.cli._output import echo_json, report
from loopwright.display import safe_json, safe_text
from loopwright.errors import ApprovalDigestMismatchError, InstanceLockedError, LoopwrightError

if TYPE_CHECKING:
    from loopwright.cli._settings import CliSettings

__all__ = ["approve", "cancel", "delete", "deny", "fork", "gc", "message", "rewind"]


async def _decide(settings: CliSettings, instance_id: str, call_id: str | None, *, subtree: bool,  # noqa: C901 - each way to go on
                  decision: Literal["approved", "denied"], reason: str | None, stream: bool = False,
                  detach: bool = False, digest: str | None = None) -> int:
    """Decide held calls of ``instance_id``'s tree, then follow it (see ``approve``; ``detach``: a worker goes on)."""
    async with runtime(settings) as rt:
        agent = await lookup(rt, instance_id)
        agent.stream = stream
        if call_id is None and not subtree and agent.state is not State.WAITING_FOR_APPROVAL:
            waiting = await rt.tree_approvals(instance_id)
            hint = (f"; {len(waiting)} call{'' if len(waiting) == 1 else 's'} wait{'s' if len(waiting) == 1 else ''} "
                    f"in its tree: decide one with --call CALL_ID, or all with --subtree") if waiting else ""
            raise CliError(f"instance {instance_id} is {agent.state.value}, not waiting for approval{hint}",
                           EXIT_USAGE)
        elsewhere = detach or not rt.engine.in_process
        try:
            if elsewhere:
                decided = await rt.submit_decision(instance_id, call_id, decision, reason, subtree=subtree,
                                                   digest=digest)
            elif subtree:
                decided = await rt.decide_subtree(agent, decision, reason)
            else:
                decided = await rt.decide(agent, call_id, decision, reason, digest=digest)
        except ApprovalDigestMismatchError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        except InstanceLockedError as exc:
            raise CliError(f"{exc}: its calls are being decided or run there, none waits here", EXIT_USAGE) from None
        except LoopwrightError as exc:
            if type(exc) is not LoopwrightError:
                raise
            raise CliError(str(exc), EXIT_USAGE) from None
        if not settings.json:
            for p in decided:
                where = " > ".join(f"{safe_text(step.get('name'))} {safe_text(step.get('instanceId'))}"
                                   for step in p.path) or safe_text(p.instance_id or instance_id)
                # What was decided, exactly: the call, its arguments and its digest (issue 25).
                shown = f"{safe_text(p.tool_call_id)} {safe_text(p.tool)} {safe_json(dict(p.arguments))}"
                click.echo(f"{decision}: {shown} (in {where}; digest {approval_digest(p)})", err=True)
        if detach:
            return report_submitted(settings, await rt.store.read_header(instance_id),
                                    f"{decision}, for a worker to go on")
        if elsewhere:
            return await follow_elsewhere(settings, rt, instance_id)
        return await follow_agent(settings, agent)


@sync
async def approve(settings: CliSettings, instance_id: str, call_id: str | None, subtree: bool = False,  # noqa: PLR0917 - click passes them in order
                  stream: bool = False, detach: bool = False, digest: str | None = None) -> int:
    """``loopwright approve``: approve held calls (anywhere in its tree with ``--call``, ``--subtree``), then follow.

    ``stream`` asks the provider to stream the answers that follow; ``detach`` only saves the
    decision; ``digest`` (with ``call_id``) approves only if the call is still the one shown.
    """
    return await _decide(settings, instance_id, call_id, subtree=subtree, decision="approved", reason=None,
                         stream=stream, detach=detach, digest=digest)


@sync
async def deny(settings: CliSettings, instance_id: str, call_id: str | None, reason: str | None,  # noqa: PLR0917 - click passes them in order
               subtree: bool = False, stream: bool = False, detach: bool = False, digest: str | None = None) -> int:
    """``loopwright deny``: deny held calls (the model sees ``denied: REASON``), then follow the instance."""
    return await _decide(settings, instance_id, call_id, subtree=subtree, decision="denied", reason=reason,
                         stream=stream, detach=detach, digest=digest)


@sync
async def message(settings: CliSettings, instance_id: str, text: str, stream: bool, detach: bool = False) -> int:
    """``loopwright message``: send a message, then follow the instance.

    ``stream`` asks the provider to stream; ``detach`` only posts the message, for a worker.
    """
    async with runtime(settings) as rt:
        agent = await lookup(rt, instance_id)
        agent.stream = stream
        if agent.state is State.WAITING_FOR_APPROVAL and not settings.json:
            click.echo("the message is queued: it is read once the calls waiting for approval are decided",
                       err=True)
        if detach or not rt.engine.in_process:
            await rt.submit_message(instance_id, text, source="user")
            if detach:
                return report_submitted(settings, await rt.store.read_header(instance_id), "the message is posted")
            return await follow_elsewhere(settings, rt, instance_id)
        agent = await rt.message(instance_id, text, source="user")
        if not agent.running and agent.state is State.RUNNING:
            # Another process runs it: the message is in its mailbox, read at its next turn boundary.
            if settings.json:
                echo_json({**summary(await rt.store.read_header(instance_id)), "delivered": True})
            else:
                click.echo(f"delivered: instance {instance_id} is running in another process, which reads the "
                           "message at its next turn boundary", err=True)
            return EXIT_OK
        return await follow_agent(settings, agent)


@sync
async def delete(settings: CliSettings, instance_id: str) -> int:
    """``loopwright delete``: delete a root instance and its tree; print each id deleted, exit 0."""
    async with runtime(settings) as rt:
        await lookup(rt, instance_id)
        deleted = await rt.delete(instance_id)
        if settings.json:
            echo_json({"deleted": deleted})
        else:
            for gone in deleted:
                click.echo(f"deleted {gone}")
        return EXIT_OK


@sync
async def gc(settings: CliSettings, dry_run: bool, keep: float | None, limit: int | None) -> int:
    """``loopwright gc``: apply the retention; print each tree deleted (or that would be), and each left, exit 0."""
    async with runtime(settings) as rt:
        try:
            done = await rt.collect_garbage(dry_run=dry_run, keep=keep, limit=limit)
        except LoopwrightError as exc:
            if type(exc) is not LoopwrightError:  # a store that cannot delete: a failure, not bad input
                raise
            raise CliError(str(exc), EXIT_USAGE) from None
        if settings.json:
            echo_json({"dryRun": done.dry_run, "deleted": list(done.deleted),
                       "expired": [{"root": t.root, "ids": list(t.ids), "name": t.name, "updatedAt": t.updated_at}
                                   for t in done.expired],
                       "skipped": [{"root": root, "reason": reason} for root, reason in done.skipped]})
            return EXIT_OK
        verb = "would delete" if done.dry_run else "deleted"
        left = {root for root, _reason in done.skipped}
        for tree in done.expired:
            if tree.root in left:
                continue
            extra = f" and {len(tree.ids) - 1} below it" if len(tree.ids) > 1 else ""
            click.echo(f"{verb} {tree.root} ({safe_text(tree.name)}{extra}), unchanged since {tree.updated_at}")
        for root, reason in done.skipped:
            click.echo(f"left {root}: {safe_text(reason)}")
        if not done.expired:
            click.echo("nothing is past its retention")
        return EXIT_OK


@sync
async def cancel(settings: CliSettings, instance_id: str) -> int:
    """``loopwright cancel``: mark the instance stopped and cancelled, print its result, exit 0."""
    async with runtime(settings) as rt:
        agent = await lookup(rt, instance_id)
        agent = await rt.cancel(instance_id)
        result = await agent.wait()
        return report(result, settings, turns=agent.inst.turn, cancel_command=True)


@sync
async def fork(settings: CliSettings, instance_id: str, at_turn: int | None) -> int:
    """``loopwright fork``: a new instance with ID's history up to the end of a turn; prints its summary."""
    async with runtime(settings) as rt:
        await lookup(rt, instance_id)
        try:
            agent = await rt.fork(instance_id, at_turn)
        except LoopwrightError as exc:
            if type(exc) is not LoopwrightError:
                raise
            raise CliError(str(exc), EXIT_USAGE) from None
        data = await rt.summary(agent.instance_id)
        if settings.json:
            echo_json(data)
        else:
            forked = data["tree"].get("forkedFrom") or {}
            click.echo(agent.instance_id)
            click.echo(f"forked from {instance_id} at turn {forked.get('turn')}; it rests, ready for a message: "
                       f"loopwright message {agent.instance_id} TEXT", err=True)
        return EXIT_OK


@sync
async def rewind(settings: CliSettings, instance_id: str, to_turn: int) -> int:
    """``loopwright rewind``: move ID back to the end of a turn (the log keeps what came after)."""
    async with runtime(settings) as rt:
        await lookup(rt, instance_id)
        try:
            await rt.rewind(instance_id, to_turn)
        except InstanceLockedError as exc:
            raise CliError(f"cannot rewind: {exc}", EXIT_USAGE) from None
        except LoopwrightError as exc:
            if type(exc) is not LoopwrightError:
                raise
            raise CliError(str(exc), EXIT_USAGE) from None
        data = await rt.summary(instance_id)
        if settings.json:
            echo_json(data)
        else:
            click.echo(f"instance {instance_id} is back at the end of turn {to_turn}; it rests, ready for a "
                       f"message: loopwright message {instance_id} TEXT", err=True)
        return EXIT_OK

"""Following an instance until it rests, and reporting it: the end of every command that runs one.

A command that starts or continues an instance ends in one of three ways, each here:

* :func:`follow_agent`: the instance runs in this process; the live (or plain) progress of
  :mod:`loopwright.cli._progress` shows it, Ctrl-C cancels it, and the agents it started are
  waited for before the command exits;
* :func:`follow_elsewhere`: the assembly's engine runs its segments in other processes (its
  workers); this process waits for the instance to rest and reports it the same way;
* :func:`report_submitted`: ``--detach`` only handed the work to the engine; the instance's id
  is printed at once, for a ``loopwright worker`` to run it.

Each returns the command's exit code (:func:`loopwright.cli._output.report`). The live display
is imported only by :func:`follow_agent`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import click

from loopwright._states import State
from loopwright._views import header_of, summary
from loopwright.cli._exits import EXIT_OK
from loopwright.cli._output import echo_json, report
from loopwright.display import safe_text

if TYPE_CHECKING:
    from loopwright._runtime import AgentRun, Runtime
    from loopwright.cli._settings import CliSettings

__all__ = ["follow_agent", "follow_elsewhere", "report_submitted"]


async def follow_agent(settings: CliSettings, agent: AgentRun) -> int:
    """Follow ``agent`` until it rests, then print its result as ``run`` does.

    Agents it started that still run are then waited for, so that leaving the command does not
    interrupt them (Ctrl-C leaves them ``running``, to be resumed); the exit code is ``agent``'s.
    """
    from loopwright.cli._progress import follow, make_progress  # noqa: PLC0415 - only for commands that follow a run

    settings.instance_id = agent.instance_id
    progress = make_progress(settings)
    progress.start_from(agent.inst.turn, agent.inst.usage.total_tokens or
                        agent.inst.usage.input_tokens + agent.inst.usage.output_tokens, agent.inst.cost.amount)
    rt = agent.runtime
    result, interrupted = await follow(agent, progress, stalled=lambda: rt.stalled(agent.instance_id))
    settings.streamed_text = progress.streamed_answer()
    if result.state is State.RUNNING and not interrupted:
        # It waits only for calls held in its tree (here, or by another process that left it).
        waiting = await rt.tree_approvals(agent.instance_id)
        if waiting:
            result = attrs.evolve(result, pending_approvals=tuple(waiting))
            return report(result, settings, turns=agent.inst.turn)
    code = report(result, settings, turns=agent.inst.turn)
    others = rt.running()
    if others and not interrupted:
        if not settings.json:
            click.echo(f"waiting for {len(others)} agent(s) it started to rest "
                       "(Ctrl-C leaves them running, to resume later)", err=True)
        await agent.runtime.wait_idle()
    return code


async def follow_elsewhere(settings: CliSettings, rt: Runtime, instance_id: str) -> int:
    """Follow an instance the engine's runners advance until it rests, then report it as ``run`` does."""
    settings.instance_id = instance_id
    if not settings.json:
        click.echo(f"following instance {safe_text(instance_id)}, run by the {safe_text(rt.assembly.engine.kind)} "
                   "engine's workers", err=True)
    agent = await rt.follow_submitted(instance_id)
    result = await agent.wait()
    if result.state is State.RUNNING:
        waiting = await rt.tree_approvals(instance_id)
        result = attrs.evolve(result, pending_approvals=tuple(waiting))
    return report(result, settings, turns=agent.inst.turn)


def report_submitted(settings: CliSettings, header: Mapping[str, Any], what: str) -> int:
    """Report work handed to the engine (``--detach``): the id on stdout, or the summary with ``submitted: true``.

    ``what`` says on stderr what was handed over (``queued``, ``approved, for a worker to go on``
    ...). Returns 0.
    """
    saved = header_of(header)
    instance_id = str(saved.instance_id)
    if settings.json:
        echo_json({**summary(saved), "submitted": True})
    else:
        click.echo(safe_text(instance_id))
        click.echo(f"submitted: {what}; a worker runs it (loopwright worker). Follow it with: "
                   f"loopwright show {safe_text(instance_id)}", err=True)
    return EXIT_OK

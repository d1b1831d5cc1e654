"""``loopwright run`` and ``loopwright resume``: start an instance, or continue one a crash left running.

Each follows the instance until it rests (:mod:`loopwright.cli._following`) and returns the exit
code of its result. With ``--detach`` (``run --detach``, ``submit``, ``resume --detach``), or on an
engine whose runners live in other processes, the work is handed to the engine instead: with
``--detach`` the id is printed at once, otherwise the instance is followed as those runners
advance it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click

from loopwright._states import State
from loopwright.cli._exits import EXIT_USAGE, CliError
from loopwright.cli._following import follow_agent, follow_elsewhere, report_submitted
from loopwright.cli._opening import lookup, runtime, sync
from loopwright.cli._output import report

if TYPE_CHECKING:
    from loopwright.cli._settings import CliSettings

__all__ = ["resume", "run"]


@sync
async def run(settings: CliSettings, definition: str, prompt: str | None, inputs: Mapping[str, str],  # noqa: PLR0917 - click passes them in order
              stream: bool, detach: bool = False) -> int:
    """``loopwright run``: start an instance and follow it until it rests (``detach``: queue it for a worker)."""
    from loopwright._template import resolve_inputs  # noqa: PLC0415 - only for run, for a cheap start

    async with runtime(settings) as rt:
        if definition not in rt.assembly.agent_definitions and not Path(definition).exists():  # noqa: ASYNC240
            names = ", ".join(sorted(rt.assembly.agent_definitions))
            known = f"; the assembly's agentDefinitions are: {names}" if names else ""
            raise CliError(f"no definition file {definition!r}{known}", EXIT_USAGE)
        defn = rt.load_definition(definition)
        values = resolve_inputs(defn, inputs, from_strings=True)
        # A registered name is passed as the name: the instance is then read from the assembly whenever it loads.
        target = definition if rt.registered_name(definition) else defn
        if detach or not rt.engine.in_process:
            instance_id = await rt.submit(target, values, prompt)
            if detach:
                return report_submitted(settings, await rt.store.read_header(instance_id), "queued")
            return await follow_elsewhere(settings, rt, instance_id)
        agent = await rt.start_agent(target, values, prompt, stream=stream)
        return await follow_agent(settings, agent)


@sync
async def resume(settings: CliSettings, instance_id: str, stream: bool, detach: bool = False) -> int:
    """``loopwright resume``: continue an instance a crash left running, then follow it (``detach``: a worker does)."""
    async with runtime(settings) as rt:
        agent = await lookup(rt, instance_id)
        agent.stream = stream
        if agent.state is not State.RUNNING and not settings.json:
            hint = "" if agent.state is State.WAITING_FOR_APPROVAL else (
                f" (send it a message to go on: loopwright message {instance_id} TEXT)")
            click.echo(f"instance {instance_id} is {agent.state.value}, not running: nothing to resume{hint}",
                       err=True)
        if detach or not rt.engine.in_process:
            handed = await rt.submit_resume(instance_id)
            if detach:
                header = await rt.store.read_header(instance_id)
                return report_submitted(settings, header, "to be continued") if handed else report(
                    agent.inst.result(), settings, turns=agent.inst.turn)
            if handed:
                return await follow_elsewhere(settings, rt, instance_id)
            return report(agent.inst.result(), settings, turns=agent.inst.turn)
        agent = await rt.resume(instance_id)
        return await follow_agent(settings, agent)

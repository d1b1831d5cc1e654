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
from typing import TYPE_CHECKING, Any

import click

from loopwright._states import State
from loopwright.cli._exits import EXIT_OK, EXIT_USAGE, CliError
from loopwright.cli._following import follow_agent, follow_elsewhere, report_submitted
from loopwright.cli._opening import lookup, runtime, sync
from loopwright.cli._output import report
from loopwright.errors import InstanceNotFoundError

if TYPE_CHECKING:
    from loopwright._runtime import Runtime
    from loopwright.cli._settings import CliSettings

__all__ = ["resume", "run"]


@sync
async def run(settings: CliSettings, definition: str, prompt: str | None, inputs: Mapping[str, str],  # noqa: PLR0917 - click passes them in order
              stream: bool, detach: bool = False, thread_id: str | None = None) -> int:
    """``loopwright run``: start an instance and follow it until it rests (``detach``: queue it for a worker).

    With ``thread_id``, the instance is the conversation ``thread_id``: started with the prompt
    if it does not exist, else sent the prompt as a message (:meth:`loopwright.Thread.send`).
    """
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
        if thread_id is not None:
            return await _thread_turn(settings, rt, target, thread_id, prompt or "", values=values, stream=stream,
                                      detach=detach)
        if detach or not rt.engine.in_process:
            instance_id = await rt.submit(target, values, prompt)
            if detach:
                return report_submitted(settings, await rt.store.read_header(instance_id), "queued")
            return await follow_elsewhere(settings, rt, instance_id)
        agent = await rt.start_agent(target, values, prompt, stream=stream)
        return await follow_agent(settings, agent)


async def _thread_turn(settings: CliSettings, rt: Runtime, target: Any, thread_id: str, text: str, *,
                       values: Mapping[str, Any], stream: bool, detach: bool) -> int:
    """``run --thread``: one turn of the conversation ``thread_id`` (see :func:`run`), then follow it."""
    thread = rt.thread(thread_id, target)
    exists = True
    try:
        await rt.store.read_header(thread_id)  # the header alone: send loads the run once
    except InstanceNotFoundError:
        exists = False
    if detach or not rt.engine.in_process:
        if exists:
            await rt.submit_message(thread_id, text, source="user")
        else:
            await rt.submit(target, values, text, instance_id=thread_id)
        if detach:
            return report_submitted(settings, await rt.store.read_header(thread_id),
                                    "the message is posted" if exists else "queued")
        return await follow_elsewhere(settings, rt, thread_id)
    agent = await thread.send(text, inputs=values, stream=stream)
    if exists and not agent.running and agent.state is State.RUNNING:
        # Another process runs the thread: the message is in its mailbox, read at its next turn boundary.
        if not settings.json:
            click.echo(f"delivered: thread {thread_id} is running in another process, which reads the message "
                       "at its next turn boundary", err=True)
        return EXIT_OK
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

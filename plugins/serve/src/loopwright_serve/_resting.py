"""Runs at rest, as the protocol surfaces answer them: waiting (not past the server's shutdown), questions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from loopwright import HeaderFields, State

if TYPE_CHECKING:
    from loopwright import AgentResult, AgentRun, Message, Runtime

__all__ = ["POLL", "Started", "question_of", "rest_elsewhere", "rest_or_close", "start"]

#: Seconds between two reads of the header of an instance a worker runs (``server.run: false``).
POLL = 0.2


async def rest_or_close(run: AgentRun, closing: anyio.Event | None, at_most: float = math.inf) -> AgentResult | None:
    """Return the run's result once it rests; ``None`` if ``closing`` is set or ``at_most`` seconds pass first.

    A surface answering a long request (a chat completion, an MCP tool call) waits through this,
    so that a server shutting down ends the request (the instance stays in the store, resumable)
    instead of holding the shutdown until the agent is done.
    """
    result: AgentResult | None = None
    with anyio.move_on_after(at_most):
        async with anyio.create_task_group() as tg:

            async def rest() -> None:
                nonlocal result
                result = await run.wait()
                tg.cancel_scope.cancel()

            async def close() -> None:
                if closing is not None:
                    await closing.wait()
                    tg.cancel_scope.cancel()

            tg.start_soon(rest)
            tg.start_soon(close)
    return result


async def rest_elsewhere(runtime: Runtime, instance_id: str, closing: anyio.Event | None,
                         ) -> tuple[AgentRun, AgentResult] | None:
    """Wait until the submitted instance ``instance_id``, run by a worker, rests; ``None`` if ``closing`` comes first.

    For ``server.run: false``: the instance was created with :meth:`loopwright.Runtime.submit`
    (``running`` and ``queued``), so it rests only after a worker took it and ran its segment.
    Its header is read every :data:`POLL` seconds.
    """
    while closing is None or not closing.is_set():
        header = HeaderFields(await runtime.store.read_header(instance_id))
        if header.state != State.RUNNING and not header.queued:
            run = await runtime.get_agent(instance_id)
            return run, await run.wait()
        with anyio.move_on_after(POLL):
            if closing is not None:
                await closing.wait()
            else:
                await anyio.sleep_forever()
    return None


@attrs.frozen
class Started:
    """An instance a surface started: run here (``run``), or submitted for a worker (``server.run: false``).

    Attributes:
        instance_id: The instance's id.
        run: Its run in this server, or ``None`` when a worker runs it.
    """

    instance_id: str
    run: AgentRun | None = None

    async def rest(self, runtime: Runtime, closing: anyio.Event | None,
                   at_most: float = math.inf) -> tuple[AgentRun, AgentResult] | None:
        """Return the run and its result once the instance rests; ``None`` on ``closing`` or after ``at_most`` s."""
        if self.run is not None:
            result = await rest_or_close(self.run, closing, at_most)
            return None if result is None else (self.run, result)
        with anyio.move_on_after(at_most):
            return await rest_elsewhere(runtime, self.instance_id, closing)
        return None


async def start(runtime: Runtime, name: str, inputs: Mapping[str, Any] | None, prompt: str, *,
                runs: bool, history: Sequence[Message] = (), stream: bool = False,
                instance_id: str | None = None) -> Started:
    """Start the registered definition ``name`` here, or (``runs`` false: ``server.run: false``) submit it.

    :param stream: Ask providers to stream (an instance run here).
    :param instance_id: The id of an instance run here (default: a new one).
    :raises ConfigError: As :meth:`loopwright.Runtime.start_agent`.
    """
    if runs:
        run = await runtime.start_agent(name, inputs, prompt, history=history, stream=stream, instance_id=instance_id)
        return Started(run.instance_id, run)
    return Started(await runtime.submit(name, inputs, prompt, history=history))


def question_of(run: AgentRun) -> str | None:
    """Return the question of the ``ask_user`` call the resting instance waits on, if it waits on one."""
    awaiting = run.inst.header.awaiting_answer or {}
    question = awaiting.get("question")
    return str(question) if question else None

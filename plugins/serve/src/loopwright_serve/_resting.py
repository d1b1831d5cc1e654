"""Runs at rest, as the protocol surfaces answer them: waiting (not past the server's shutdown), questions."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from loopwright import AgentResult, AgentRun

__all__ = ["question_of", "rest_or_close"]


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


def question_of(run: AgentRun) -> str | None:
    """Return the question of the ``ask_user`` call the resting instance waits on, if it waits on one."""
    awaiting = run.inst.header.get("awaitingAnswer") or {}
    question = awaiting.get("question")
    return str(question) if question else None

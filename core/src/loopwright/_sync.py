"""The synchronous entry point, for scripts: :func:`run_agent`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import anyio

from loopwright._runtime import Runtime
from loopwright._types import AgentResult

__all__ = ["run_agent"]


def run_agent(
    definition: str | os.PathLike[str] | Mapping[str, Any], inputs: Mapping[str, Any] | None = None,
    prompt: str | None = None, *, config: str | os.PathLike[str] | None = None, backend: str = "asyncio",
) -> AgentResult:
    """Run an agent to rest and return its result, blocking.

    :param definition: A definition file, a registered name or a mapping.
    :param inputs: Values for the definition's inputs.
    :param prompt: The task prompt.
    :param config: The assembly file; ``None`` reads ``./loopwright.yaml`` if it exists.
    :param backend: The anyio backend, ``asyncio`` or ``trio``.
    :raises RunError: The model failed for good.
    """

    async def main() -> AgentResult:
        async with Runtime.from_file(config) as rt:
            run = await rt.start_agent(definition, inputs, prompt)
            return await run.result()

    return anyio.run(main, backend=backend)

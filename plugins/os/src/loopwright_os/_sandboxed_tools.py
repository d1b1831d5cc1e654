"""Tools that run sandboxed: a program started per call in the caller's sandbox, its arguments as JSON on stdin.

A plugin makes one with :func:`sandboxed_tool` and registers it like any tool::

    from loopwright_os import sandboxed_tool

    @hookimpl
    def loopwright_register_tools(register, settings):
        register(sandboxed_tool(
            name="word_count", description="Count the words of a file.",
            parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            argv=["/usr/bin/python3", "/opt/wc-tool/wc.py"], binds=["/opt/wc-tool"],
            settings=settings.get("os")))

Each call builds the same sandbox ``shell: sandbox`` builds (:mod:`loopwright_os._sandbox`) from
the *calling instance's* grants, whatever its shell mode: only its file roots, no network unless
it holds ``network``, a cleared environment, the limits of ``pluginSettings.os.sandbox``, plus the
read-only ``binds`` the tool's program needs. The program reads the call's arguments as one JSON
document on stdin; what it prints on stdout is the result. A non-zero exit, a timeout or a limit
gives ``tool_error`` with its stderr. Where the sandbox cannot start, the tool cannot be made (the
plugin fails to load, naming why), and a call made after it stopped working fails: nothing runs
unsandboxed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loopwright import Tool, ToolContext
from loopwright.capabilities import sandbox_problem
from loopwright.errors import ToolError
from loopwright_os._sandbox import plan_sandbox, sandbox_settings
from loopwright_os._shell import DEFAULT_TIMEOUT, KILL_GRACE, collect

__all__ = ["sandboxed_tool"]

#: The name under which the loop passes the call's :class:`~loopwright.ToolContext` (not an argument the model sees).
_CONTEXT = "_loopwright_context"
_RESERVE = 3 * KILL_GRACE


def sandboxed_tool(
    *, name: str, description: str, parameters: Mapping[str, Any], argv: Sequence[str],
    binds: Sequence[str | Path] = (), settings: Mapping[str, Any] | None = None, timeout: float | None = None,
    parallel_safe: bool = False, requires_approval: bool = False,
) -> Tool:
    """Return a tool whose every call runs ``argv`` in a sandbox built from the caller's grants.

    :param name: The tool's name, as for any tool.
    :param description: What it does, for the model.
    :param parameters: The JSON Schema of its arguments (checked by the loop before a call).
    :param argv: The program and its arguments, inside the sandbox: under ``/usr`` or in ``binds``.
    :param binds: Folders or files the program needs, bound read-only (absolute, or relative to
        the assembly's folder). They must not reach the store or a record sink.
    :param settings: The ``os`` entry of ``pluginSettings`` (its ``sandbox`` limits), or ``None``.
    :param timeout: Seconds a call may run (default 60, and always short of the loop's tool timeout).
    :raises ValueError: ``argv`` is empty or ``settings`` malformed.
    :raises RuntimeError: The sandbox cannot start on this machine (fail closed, at load).
    """
    if not argv or not all(isinstance(a, str) and a for a in argv):
        raise ValueError(f"sandboxed tool {name!r}: argv must be a non-empty list of strings")
    limits = sandbox_settings(settings)
    problem = sandbox_problem()
    if problem is not None:
        raise RuntimeError(f"sandboxed tool {name!r} cannot be registered: the sandbox cannot start on this "
                           f"machine: {problem}")
    program, extra = tuple(argv), tuple(binds)

    async def run(**arguments: Any) -> str:
        context: ToolContext = arguments.pop(_CONTEXT)
        budget = context.timeout - _RESERVE if context.timeout > 2 * _RESERVE else context.timeout / 2
        limit = min(timeout or DEFAULT_TIMEOUT, budget)
        private = [*(("the store", p) for p in context.store_locations),
                   *(("a record sink", p) for p in context.sink_locations)]
        plan = plan_sandbox(program, context.grants, base=context.base_dir, private=private, settings=limits,
                            binds=extra)
        payload = json.dumps(arguments, ensure_ascii=False).encode()
        done = await collect("", Path("/"), limit, plan=plan, stdin=payload)
        stdout, stderr = done.out.text("stdout"), done.err.text("stderr")
        if done.timed_out:
            raise ToolError(f"{name} timed out after {limit:g} s and was stopped\n{stderr}".rstrip())
        if done.tripped is not None:
            raise ToolError(f"{name} was stopped: {done.tripped}\n{stderr}".rstrip())
        if done.returncode != 0:
            raise ToolError(f"{name} failed (exit code {done.returncode})\n{stderr}".rstrip())
        return stdout

    return Tool(name=name, description=description, parameters=dict(parameters), function=run,
                context_param=_CONTEXT, parallel_safe=parallel_safe, requires_approval=requires_approval)

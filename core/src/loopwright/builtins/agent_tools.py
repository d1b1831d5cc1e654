"""Built-in plugin: the agent tools, with the names and input properties of seed 000.

* ``run_agent_async {definition, prompt} | {agentId, prompt}`` starts an agent (a name from
  the assembly's ``agentDefinitions``, or a definition file under the caller's file roots) or
  messages one it started, and returns its instance id at once. ``agentSwarmUri``, seed 000's
  name for ``definition``, is still accepted. ``grants`` (optional, a new agent only) asks for
  narrower grants than the caller's: ``files``, ``shell``, ``network`` as in the assembly (absolute
  roots), narrowed to the caller's, so a child is never wider and a sandboxed caller's child is
  always sandboxed.
* ``await_agent {ids, all?}`` waits for one (or all) of them to rest and reports on each: state,
  stop reason, text, output, cost, subtree cost and context use. A message for the caller ends
  the wait early.
* ``message_agent {agentId, prompt}`` delivers a message; with no arguments it points at
  ``run_agent_async``.
* ``list_agent_instances {name?, state?, swarm?}`` lists the instances the caller may reach.
* ``query_agent {agentId, query}`` searches an instance's messages.
* ``monitor_agent {agentId, contextAt?, turns?, onFinish?, elapsed?}`` arms a monitor on an agent
  (or just reports its status); ``await_monitor {timeout?}`` waits for one to fire. See
  :class:`loopwright._agents.Monitors`.

A definition gets them only by listing them in ``tools:``, and starting agents also needs the
``agents.spawn`` grant. The rules they enforce (grants, tools, files, reach, depth) are in
:mod:`loopwright._agents`. :mod:`loopwright.builtins.tools` registers them with the other built-in
tools, through ``loopwright_register_tools`` as a third party's would.
"""

from __future__ import annotations

from typing import Any

from loopwright._capabilities import capabilities_from_dict, capabilities_to_dict
from loopwright._tools import Tool, ToolContext, tool
from loopwright.errors import ToolError

__all__ = [
    "AGENT_TOOLS",
    "await_agent",
    "await_monitor",
    "list_agent_instances",
    "message_agent",
    "monitor_agent",
    "query_agent",
    "run_agent_async",
]

#: How long ``await_agent`` may wait in one call (it reports and returns a second before).
AWAIT_TIMEOUT = 1800.0


def _agents(ctx: ToolContext) -> Any:
    if ctx.agents is None:
        raise ToolError("agent tools work only inside a run")
    return ctx.agents


async def _run_agent_async(  # noqa: D417 - ctx is filled in by the loop, not by the model
    ctx: ToolContext, prompt: str, definition: str | None = None, agentId: str | None = None,  # noqa: N803
    agentSwarmUri: str | None = None, *, grants: dict[str, Any] | None = None,  # noqa: N803
) -> dict[str, Any]:
    """Start an agent on a task, or send a message to one you started; returns its instance id at once.

    Give either definition (to start a new agent) or agentId (to message one you started).
    Use await_agent to wait for its result.

    Args:
        prompt: The task for a new agent, or the message for an existing one.
        definition: The agent to start: a registered agent name, or the path of a definition file.
        agentId: The instance id of an agent you started, to message instead of starting one.
        agentSwarmUri: The older name of definition (seed 000's), still accepted.
        grants: For a new agent, narrower grants than yours: any of files ({read, write}: absolute
            folders within yours), shell and network; what you leave out stays as yours.
    """
    agents = _agents(ctx)
    if definition is not None and agentSwarmUri is not None and definition != agentSwarmUri:
        raise ToolError("definition and agentSwarmUri name the same thing: give one of them")
    definition = definition if definition is not None else agentSwarmUri
    if (definition is None) == (agentId is None):
        raise ToolError("give exactly one of definition (to start an agent) and agentId (to message one)")
    if agentId is not None:
        if grants is not None:
            raise ToolError("grants are for a new agent: an agent you message keeps the grants it has")
        return await agents.message(agentId, prompt)  # type: ignore[no-any-return]
    return await agents.start(definition, prompt, _requested(ctx, grants))  # type: ignore[no-any-return]


def _requested(ctx: ToolContext, grants: dict[str, Any] | None) -> Any:
    """Return the grants asked for (the caller's, with what ``grants`` names replaced), or None; raise ToolError."""
    if grants is None:
        return None
    unknown = set(grants) - {"files", "shell", "network"}
    if unknown:
        raise ToolError(f"grants may name files, shell and network, not {min(unknown)!r}")
    try:
        return capabilities_from_dict({**capabilities_to_dict(ctx.grants), **grants})
    except ValueError as exc:
        raise ToolError(f"grants: {exc}") from exc


run_agent_async: Tool = tool(name="run_agent_async")(_run_agent_async)


async def _await_agent(ctx: ToolContext, ids: list[str], all: bool = False) -> dict[str, Any]:  # noqa: A002, D417
    """Wait for agents you started: until one of them rests, or all of them with all=true.

    Reports each agent's state, stop reason, final text or output, cost and context use. The
    wait ends early when a message for you arrives.

    Args:
        ids: Instance ids of agents you started.
        all: Wait for every one of them instead of the first to finish.
    """
    return await _agents(ctx).wait(ids, all_=all)  # type: ignore[no-any-return]


await_agent: Tool = tool(name="await_agent", idempotent=True, timeout=AWAIT_TIMEOUT)(_await_agent)


async def _message_agent(ctx: ToolContext, agentId: str | None = None, prompt: str | None = None,  # noqa: D417, N803
                         ) -> dict[str, Any]:
    """Send a message to an agent you started. It reads it at its next turn, or wakes up with it.

    Args:
        agentId: The instance id of the agent.
        prompt: The message.
    """
    if agentId is None and prompt is None:
        raise ToolError("message_agent needs agentId and prompt; to start an agent, use run_agent_async "
                        "with definition and prompt")
    if agentId is None or not prompt:
        raise ToolError("message_agent needs both agentId and prompt")
    return await _agents(ctx).message(agentId, prompt)  # type: ignore[no-any-return]


message_agent: Tool = tool(name="message_agent")(_message_agent)


async def _list_agent_instances(  # noqa: D417
    ctx: ToolContext, name: str | None = None, state: str | None = None, swarm: str | None = None,
) -> list[dict[str, Any]]:
    """List the agents you started (and the ones they started), optionally filtered.

    Args:
        name: Only agents of this definition name.
        state: Only agents in this state (running, waiting, waiting_for_approval, stopped, error).
        swarm: Only agents started from this definition (as run_agent_async named it).
    """
    return await _agents(ctx).list(name=name, state=state, swarm=swarm)  # type: ignore[no-any-return]


list_agent_instances: Tool = tool(name="list_agent_instances", idempotent=True)(_list_agent_instances)


async def _query_agent(ctx: ToolContext, agentId: str, query: str) -> dict[str, Any]:  # noqa: D417, N803
    """Search the messages of an agent you started for some text; returns the matching excerpts.

    Args:
        agentId: The instance id of the agent.
        query: The text to look for (case-insensitive).
    """
    return await _agents(ctx).query(agentId, query)  # type: ignore[no-any-return]


query_agent: Tool = tool(name="query_agent", idempotent=True)(_query_agent)

async def _monitor_agent(  # noqa: D417, PLR0917 - the seed's input properties
    ctx: ToolContext, agentId: str, contextAt: int | str | None = None, turns: int | None = None,  # noqa: N803
    onFinish: bool = False, elapsed: str | float | None = None,  # noqa: N803
) -> dict[str, Any]:
    """Watch an agent you started: be told once when any of the conditions holds. With no condition, report its status.

    The first condition to hold fires the monitor once and disarms it; arming again on the same
    agent replaces it. The alert arrives as a message, or as the result of await_monitor if you
    are waiting there. elapsed only reports; it never stops the agent.

    Args:
        agentId: The instance id of the agent to watch.
        contextAt: Fire when its context reaches this many tokens (such as 400k) or this share of its window (80%).
        turns: Fire after this many more model turns of it.
        onFinish: Fire when it rests (finishes, waits or fails).
        elapsed: Fire after this long (such as 30m or 2h).
    """
    return await _agents(ctx).monitor(  # type: ignore[no-any-return]
        agentId, context_at=contextAt, turns=turns, on_finish=onFinish, elapsed=elapsed)


monitor_agent: Tool = tool(name="monitor_agent")(_monitor_agent)


async def _await_monitor(ctx: ToolContext, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109, D417
    """Wait until one of the monitors you armed fires, and get its alert instead of a message.

    Args:
        timeout: The longest to wait, in seconds.
    """
    return await _agents(ctx).await_monitor(timeout)  # type: ignore[no-any-return]


await_monitor: Tool = tool(name="await_monitor", idempotent=True, timeout=AWAIT_TIMEOUT)(_await_monitor)

#: Every agent tool, in the order they are registered.
AGENT_TOOLS: tuple[Tool, ...] = (run_agent_async, await_agent, message_agent, list_agent_instances, query_agent,
                                 monitor_agent, await_monitor)


"""Sub-agents: what the agent tools do for the instance that calls them.

An :class:`Agents` object is handed to the agent tools (``run_agent_async``, ``await_agent``,
``message_agent``, ``list_agent_instances``, ``query_agent``) through
:attr:`loopwright.ToolContext.agents`. It enforces the rules of seed 000's "Sub-agents":

* **Grants never widen.** A child runs with its caller's grants (already narrowed to the
  runtime's), and starting one needs ``agents.spawn``. Its ``depth`` is its caller's plus one,
  at most ``agents.maxDepth`` (and the definition's ``limits.maxDepth``).
* **Tools.** A child started from a definition *file* may use only tools its caller holds (plus
  ``task_complete``); the start fails naming the first other tool. A definition the host
  registered in the assembly's ``agentDefinitions`` chooses its own tools.
* **Files.** A definition file is read only from under the caller's file roots, compared after
  symlinks are resolved.
* **No code.** A definition file names hooks, guardrails and its completion verifier only by
  registered name (:meth:`loopwright.Runtime.check_untrusted`): nothing in it is imported.
* **Gates.** A child runs under its caller's gates as well as its own: the held tools
  (``requiresApproval``), the stricter ``approvalPolicy``, the guardrails and the hooks, all the
  way down. They are saved in the child's header (``inheritedGates``) and applied again by
  every process that loads it; a malformed entry refuses to run it.
* **Reach.** The tools reach the caller's descendants (found by following
  ``spawnerInstanceId``, live or saved), unless the assembly sets ``agentsMayReachAnyInstance``.
* **Budgets.** A tree has one budget: what a child spends (tokens, cost, tool calls) is charged
  to its caller and every ancestor as it spends, and it stops when its own limits or any
  ancestor's are used up (:meth:`loopwright._engine._limits.Budgets.of`). What remained when it started
  is saved as its ``budget``, a ceiling that also holds after a restart. ``agents.maxAgents``
  bounds the agents started in a tree (each ancestor's count, finished ones included).
* **Cost.** A child's id is kept in its caller's header (``children``), so the caller's subtree
  cost includes it (:meth:`loopwright.Runtime.subtree_cost`). The id is saved there before the
  child is created, so a crash never leaves a child outside its caller's tree; an id listed for a
  child that was never created (a crash in between) names no instance and is skipped.

Every refusal is a :class:`~loopwright.errors.ToolError`: the model sees why, and the run goes on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from loopwright._capabilities import intersect, is_within
from loopwright._definition import gates_of, with_gates
from loopwright._duration import parse_duration
from loopwright._header_fields import ChildLinks, HeaderFields
from loopwright._instance import new_id, now_iso
from loopwright._monitors import RESTING, Monitors, parse_context_at
from loopwright._types import State
from loopwright._views import agent_report
from loopwright.errors import ConfigError, InstanceLockedError, InstanceNotFoundError, ToolError

if TYPE_CHECKING:
    from loopwright._definition import Capabilities
    from loopwright._hosts import AgentHost
    from loopwright._instance import Instance
    from loopwright._run import AgentRun

__all__ = ["Agents", "Monitors", "parse_context_at"]

#: The states that end an ``await_agent`` wait: an agent waiting for approval is waited for, since
#: the operator decides its calls from the root (the caller stays ``running`` meanwhile).
_DONE = RESTING - {State.WAITING_FOR_APPROVAL.value}
_POLL = 0.05
_MAX_POLL = 0.5
_MAX_MATCHES = 20
_EXCERPT = 120
#: Seconds ``await_agent`` keeps in hand before its call's timeout, to report instead of timing out.
_MARGIN = 1.0


class Agents:
    """The agent tools' access to the runtime, on behalf of one calling instance and call.

    Attributes:
        caller: The calling instance.
        tool_call_id: The call being served.
        timeout: Seconds the loop gives the call; :meth:`wait` returns before they run out.

    """

    def __init__(self, runtime: AgentHost, caller: Instance, tool_call_id: str, timeout: float) -> None:
        """Bind the tools to ``caller``'s call ``tool_call_id`` in ``runtime``."""
        self._rt = runtime
        self.caller = caller
        self.tool_call_id = tool_call_id
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"Agents(caller={self.caller.id!r})"

    # -- starting -------------------------------------------------------------------------------

    async def start(self, swarm_uri: str, prompt: str, requested: Capabilities | None = None) -> dict[str, Any]:
        """Start a child instance of ``swarm_uri`` (a registered name or a definition file) on ``prompt``.

        :param requested: Grants the caller asks for its child, narrowed to its own
            (:func:`~loopwright._capabilities.intersect`: never wider; a ``sandbox`` caller's
            child is sandboxed whatever it asks). ``None``: the caller's grants.
        :return: ``{instanceId, name, state}`` of the child, which runs in the background.
        :raises ToolError: The caller may not spawn, is too deep, the definition cannot be read
            from here, or a file definition names a tool the caller does not hold.
        """
        rt, caller = self._rt, self.caller
        if not caller.grants.agents_spawn:
            raise ToolError("this agent may not start agents: its grants do not include agents.spawn")
        grants = intersect(caller.grants, requested)
        depth = int(caller.header.depth or 0)
        limit = grants.agents_max_depth
        defined = rt.limits_for(caller.definition).max_depth
        if defined is not None:
            limit = min(limit, defined)
        if depth + 1 > limit:
            raise ToolError(f"agent depth limit ({limit}) reached: this agent is at depth {depth}")
        # The child runs under its caller's gates as well as its own; saved so every process applies them.
        inherited = gates_of(caller.definition)
        defn = with_gates(self._definition(swarm_uri), inherited)
        lineage = [caller, *caller.ancestors()]
        _check_agent_room(lineage)
        links = ChildLinks(spawner_instance_id=caller.id, caller_tool_call_id=self.tool_call_id,
                           delegation_prompt=prompt, depth=depth + 1, agent_swarm_uri=swarm_uri,
                           inherited_gates=inherited, budget=self._budget(lineage) or None)
        _count_agent(lineage, 1)  # before the first await: agents started in parallel cannot all pass the check
        # The child's id is listed in the caller's header, saved, before the child exists: a process
        # stopped anywhere from here on leaves it in the caller's tree (issue 17). So a listed id may
        # name no instance (stopped before it was created); the tree views skip such an id.
        child = new_id()
        listed = caller.header.children
        listed.append(child)
        caller.header.children = listed  # saved with the header (a new list when it had none)
        try:
            await rt.write_header(caller)
            run = await rt.create_run(defn, None, prompt, grants=grants, instance_id=child, links=links,
                                      spawner=caller, registered=rt.registered_name(swarm_uri))
        except ConfigError as exc:  # raised before the child is created: it leaves the list again
            _count_agent(lineage, -1)
            listed.remove(child)
            await rt.write_header(caller)
            raise ToolError(f"cannot start {swarm_uri!r}: {exc}") from exc
        except BaseException:
            _count_agent(lineage, -1)
            raise
        rt.queue_record(caller.id, "agent", {"action": "start", "instanceId": child, "definition": defn.name,
                                             "toolCallId": self.tool_call_id})
        return {"instanceId": child, "name": defn.name, "state": run.inst.state.value}

    def _budget(self, lineage: Sequence[Instance]) -> dict[str, Any]:
        """Return what remains of the tree's budget (the caller's limits and each ancestor's): the child's ceiling.

        :raises ToolError: If nothing remains of one of them.
        """
        budget: dict[str, Any] = {}

        def cap(key: str, left: float) -> None:
            budget[key] = left if key not in budget else min(budget[key], left)

        for owner in lineage:
            limits = self._rt.limits_of(owner)
            tokens, cost, calls = owner.spent()
            if limits.tokens is not None:
                cap("tokens", limits.tokens - tokens)
            if limits.cost is not None:
                if cost is None:
                    raise ToolError("cannot give an agent a cost budget: the price of a model used here is unknown")
                cap("cost", limits.cost - cost)
            if limits.tool_calls is not None:
                cap("toolCalls", limits.tool_calls - calls)
            if limits.elapsed is not None:
                started = float(owner.header.segment_started_at or time.time())
                cap("elapsed", limits.elapsed - (time.time() - started))
        spent = [key for key, left in budget.items() if left <= 0]
        if spent:
            raise ToolError(f"no budget left to give an agent: this agent's {', '.join(spent)} limit is used up")
        return budget

    def _definition(self, swarm_uri: str) -> Any:
        rt, caller = self._rt, self.caller
        registered = rt.assembly.agent_definitions
        if swarm_uri in registered:
            try:
                return rt.load_definition(swarm_uri)
            except ConfigError as exc:
                raise ToolError(f"the registered definition {swarm_uri!r} is invalid: {exc}") from exc
        path = Path(swarm_uri).expanduser()
        if not path.is_absolute():
            path = rt.assembly.base_dir / path
        path = path.resolve()
        roots = (*caller.grants.files.read, *caller.grants.files.write)
        if not any(is_within(path, root) for root in roots):
            names = ", ".join(sorted(registered)) or "none"
            raise ToolError(
                f"{swarm_uri!r} is neither a registered definition (registered: {names}) nor a file "
                "under this agent's file roots")
        from loopwright._config import load_definition  # noqa: PLC0415 - the loader (YAML, JSON Schema) only for a definition file

        try:
            defn = load_definition(path)
        except (ConfigError, OSError) as exc:
            raise ToolError(f"cannot read the definition {swarm_uri!r}: {exc}") from exc
        try:
            rt.check_untrusted(defn)
        except ConfigError as exc:
            raise ToolError(f"the definition {swarm_uri!r} cannot be started: {exc}") from exc
        held = set(rt.tool_names(caller.definition, caller.grants)) | {"task_complete"}
        for name in defn.tool_names:
            if name not in held:
                raise ToolError(
                    f"the definition {swarm_uri!r} names the tool {name!r}, which this agent does not hold; "
                    "a definition file may use only the caller's tools (and task_complete)")
        return defn

    # -- reaching -------------------------------------------------------------------------------

    def _unreachable(self, instance_id: str) -> ToolError:
        """Return the one refusal for an id the caller may not reach, whether or not such an instance exists.

        A made-up id and a stranger's real id get the same words, so that an agent cannot learn
        from the agent tools which ids exist.
        """
        return ToolError(f"instance {instance_id!r} is not one this agent can reach: agent tools reach the "
                         "agents this agent started and theirs")

    async def _header(self, instance_id: str) -> dict[str, Any]:
        try:
            return await self._rt.store.read_header(instance_id)
        except InstanceNotFoundError:
            if self._rt.assembly.agents_may_reach_any_instance:
                # Every instance is reachable (and listed): there is nothing to hide.
                raise ToolError(f"there is no instance {instance_id!r}") from None
            raise self._unreachable(instance_id) from None

    async def reachable(self, instance_id: str) -> dict[str, Any]:
        """Return the header of ``instance_id`` if the caller may reach it; raise ToolError if not.

        An id of no instance is refused exactly as an instance the caller may not reach is
        (unless the assembly sets ``agentsMayReachAnyInstance``).
        """
        if not isinstance(instance_id, str) or not instance_id:
            raise ToolError("an agent id is required")
        header = await self._header(instance_id)
        if self._rt.assembly.agents_may_reach_any_instance:
            return header
        seen = {instance_id}
        current = header
        while True:
            spawner = HeaderFields(current).spawner_instance_id
            if spawner == self.caller.id:
                return header
            if not spawner or spawner in seen:
                raise self._unreachable(instance_id)
            seen.add(spawner)
            try:
                current = await self._rt.store.read_header(spawner)
            except InstanceNotFoundError:
                raise self._unreachable(instance_id) from None

    async def message(self, agent_id: str, prompt: str) -> dict[str, Any]:
        """Deliver ``prompt`` to a reachable instance, as a message from an agent (source ``agent``)."""
        if agent_id == self.caller.id:
            raise ToolError("an agent cannot message itself")
        if not prompt:
            raise ToolError("the message is empty")
        await self.reachable(agent_id)
        run = await self._rt.get_agent(agent_id)
        await run.message(prompt, source="agent")
        self._rt.queue_record(self.caller.id, "agent", {"action": "message", "instanceId": agent_id,
                                                        "toolCallId": self.tool_call_id})
        return {"instanceId": agent_id, "delivered": True, "state": run.inst.header.state}

    # -- waiting --------------------------------------------------------------------------------

    async def wait(self, ids: Sequence[str], *, all_: bool = False) -> dict[str, Any]:
        """Wait until one (or, with ``all_``, every one) of ``ids`` rests, then report on each.

        Returns early, with ``done: false``, when a message for the caller arrives (it is read
        at the caller's next turn boundary) or before the call's timeout runs out. A child left
        ``running`` by a crashed process is resumed here. A child waiting for approval has not
        finished: the wait goes on until someone decides its calls (from this tree's root, in
        any process), and meanwhile :attr:`Runtime.awaiting` names the agents waited for.
        """
        if not ids:
            raise ToolError("ids must name at least one agent")
        unique = list(dict.fromkeys(ids))
        if self.caller.id in unique:
            raise ToolError("an agent cannot wait for itself")
        for agent_id in unique:
            await self.reachable(agent_id)
        rt = self._rt
        runs = {agent_id: await rt.get_agent(agent_id) for agent_id in unique}
        for agent_id, run in runs.items():
            if not run.running and run.inst.header.state is State.RUNNING:
                with contextlib.suppress(InstanceLockedError):  # running in another process: watched below
                    runs[agent_id] = await rt.resume(agent_id)
        deadline = time.monotonic() + max(self.timeout - _MARGIN, 0.0)
        cursor = int(self.caller.header.inbox_cursor or 0)
        pause = _POLL
        interrupted = None
        rt.awaiting[self.caller.id] = tuple(unique)
        try:
            while True:
                states = {agent_id: await self._state(run) for agent_id, run in runs.items()}
                rested = [agent_id for agent_id, state in states.items() if state in _DONE]
                if (len(rested) == len(runs)) if all_ else rested:
                    break
                posts, _ = await rt.store.read_posts(self.caller.id, cursor)
                if any(p.get("type") == "message" for p in posts):
                    interrupted = "a message for you arrived; it is read after this turn"
                    break
                if time.monotonic() + pause > deadline:
                    interrupted = "the wait reached this call's time limit; call await_agent again to keep waiting"
                    break
                await anyio.sleep(pause)
                pause = min(pause * 2, _MAX_POLL)
        finally:
            rt.awaiting.pop(self.caller.id, None)
        reports = [await self._report(agent_id, runs[agent_id]) for agent_id in unique]
        done = all(r["state"] in _DONE for r in reports) if all_ else any(
            r["state"] in _DONE for r in reports)
        return {"done": done and interrupted is None, "interrupted": interrupted, "agents": reports}

    async def _header_of(self, run: AgentRun) -> HeaderFields:
        """Return the instance's header: the live copy while it runs here, else the store's (the truth)."""
        if run.running:
            return run.inst.header
        return HeaderFields(await self._rt.store.read_header(run.instance_id))

    async def _state(self, run: AgentRun) -> str | None:
        return State.RUNNING if run.running else (await self._header_of(run)).state

    async def _report(self, agent_id: str, run: AgentRun) -> dict[str, Any]:
        """Return what the agent tools report of ``agent_id`` (:func:`loopwright._views.agent_report`)."""
        header = await self._header_of(run)
        return agent_report(header.json, instance_id=agent_id, subtree_cost=await self._rt.subtree_cost(agent_id))

    # -- monitors -------------------------------------------------------------------------------

    async def monitor(self, agent_id: str, *, context_at: Any = None, turns: int | None = None,
                      on_finish: bool = False, elapsed: Any = None) -> dict[str, Any]:
        """Arm a monitor on a reachable instance, replacing the caller's previous one on it.

        With no condition, only report the instance's status and the monitor armed on it.
        """
        if agent_id == self.caller.id:
            raise ToolError("an agent cannot monitor itself")
        header = HeaderFields(await self.reachable(agent_id))
        run = await self._rt.get_agent(agent_id)
        status = await self._report(agent_id, run)
        monitors = self._rt.monitors
        if context_at is None and turns is None and not on_finish and elapsed is None:
            armed = next((s for s in monitors.armed(self.caller.id) if s.get("target") == agent_id), None)
            return {"status": status, "monitor": armed}
        if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
            raise ToolError(f"turns must be a whole number of turns from now (1 or more), not {turns!r}")
        seconds = None
        if elapsed is not None:
            try:
                seconds = parse_duration(elapsed)
            except ValueError as exc:
                raise ToolError(f"elapsed must be a duration such as 30m or 2h: {exc}") from None
            if not seconds:
                raise ToolError("elapsed must be a duration such as 30m or 2h, not 0")
        window = _context_window(run)
        # Count from the turn the target is in, as the checks read it: a running target's own count
        # (its saved header lags behind until the segment ends).
        turn_now = run.inst.turn if run.running else int(header.turns or 0)
        spec = {
            "target": agent_id,
            "contextAt": parse_context_at(context_at, window) if context_at is not None else None,
            "turnsAt": turn_now + turns if turns is not None else None,
            "onFinish": bool(on_finish),
            "elapsedAt": time.time() + seconds if seconds else None,
            "armedAt": now_iso(),
        }
        await monitors.arm(self.caller, spec)
        self._rt.queue_record(self.caller.id, "agent", {"action": "monitor", "instanceId": agent_id,
                                                        "toolCallId": self.tool_call_id})
        return {"status": status, "monitor": spec}

    async def await_monitor(self, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        """Wait until a monitor the caller armed fires; return the alerts (or ``fired: []`` on timeout)."""
        monitors = self._rt.monitors
        armed = monitors.armed(self.caller.id)
        if not armed:
            raise ToolError("no monitor is armed: arm one with monitor_agent first")
        limit = max(self.timeout - _MARGIN, 0.0)
        if timeout is not None:
            try:
                limit = min(limit, parse_duration(timeout))
            except ValueError as exc:
                raise ToolError(f"timeout must be a number of seconds or a duration such as 30s: {exc}") from None
        fired = await monitors.wait(self.caller.id, limit)
        return {"fired": fired, "timedOut": not fired, "armed": [s["target"] for s in monitors.armed(self.caller.id)]}

    # -- looking --------------------------------------------------------------------------------

    async def list(self, *, name: str | None = None, state: str | None = None,
                   swarm: str | None = None) -> list[dict[str, Any]]:
        """Return the instances the caller may reach (not itself), filtered by name, state or swarm."""
        headers = await self._rt.store.list_headers()
        fields = [HeaderFields(h) for h in headers]
        by_id = {h.instance_id: h for h in fields}
        out = []
        for h in fields:
            iid = h.instance_id
            if iid == self.caller.id:
                continue
            if not self._rt.assembly.agents_may_reach_any_instance and not _descends(h, self.caller.id, by_id):
                continue
            if name is not None and h.name != name:
                continue
            if state is not None and h.state != state:
                continue
            if swarm is not None and swarm not in (h.agent_swarm_uri, h.definition_path, h.name):
                continue
            out.append({"instanceId": iid, "name": h.name, "state": h.state, "stopReason": h.stop_reason,
                        "spawnerInstanceId": h.spawner_instance_id, "createdAt": h.created_at, "cost": h.cost})
        return out

    async def query(self, agent_id: str, query: str) -> dict[str, Any]:
        """Search the messages of a reachable instance for ``query`` (case-insensitive).

        :return: ``{instanceId, matches: [{index, role, excerpt}]}``, at most 20 matches.
        """
        if not query or not query.strip():
            raise ToolError("the query is empty")
        await self.reachable(agent_id)
        run = await self._rt.get_agent(agent_id)
        needle = query.strip().lower()
        matches = []
        for index, message in enumerate(run.inst.transcript):
            texts = [message.content or ""]
            texts += [f"{c.name}({c.arguments})" for c in message.tool_calls]
            for text in texts:
                at = text.lower().find(needle)
                if at < 0:
                    continue
                start = max(at - _EXCERPT // 2, 0)
                matches.append({"index": index, "role": message.role,
                                "excerpt": text[start:start + _EXCERPT + len(needle)]})
                break
            if len(matches) >= _MAX_MATCHES:
                break
        return {"instanceId": agent_id, "matches": matches, "messages": len(run.inst.transcript)}


def _check_agent_room(lineage: Sequence[Instance]) -> None:
    """Raise ToolError if the tree of the caller (``lineage[0]``) or of an ancestor has no room for another agent."""
    for owner in lineage:
        cap = owner.grants.agents_max_agents
        if owner.descendants >= cap:
            whose = "this agent's tree" if owner is lineage[0] else f"the tree of agent {owner.id}, which started it,"
            raise ToolError(f"agent limit (agents.maxAgents {cap}) reached: {whose} has started "
                            f"{owner.descendants} agents")


def _count_agent(lineage: Sequence[Instance], n: int) -> None:
    for owner in lineage:
        owner.descendants += n


def _context_window(run: AgentRun) -> int | None:
    """Return the context window an instance's definition states (``contextStrategy.contextWindow``), if any."""
    strategy = run.inst.definition.context_strategy
    window = strategy.options.get("contextWindow") if strategy is not None else None
    return int(window) if isinstance(window, (int, float)) and not isinstance(window, bool) else None


def _descends(header: HeaderFields, ancestor: str, by_id: Mapping[Any, HeaderFields]) -> bool:
    """Whether ``header``'s instance was started, directly or not, by ``ancestor``."""
    seen: set[Any] = set()
    current: HeaderFields | None = header
    while current is not None:
        spawner = current.spawner_instance_id
        if spawner == ancestor:
            return True
        if not spawner or spawner in seen:
            return False
        seen.add(spawner)
        current = by_id.get(spawner)
    return False

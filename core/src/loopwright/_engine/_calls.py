"""Tool calls: prepare (validate, ``before_tool_call``, hold), execute, finish (``after_tool_call``, save), decisions.

The calls of one reply are validated and run (concurrently when every one is ``parallelSafe``,
at most :data:`MAX_CONCURRENT_CALLS` at once, each with a timeout); their results join the
transcript in call order, and the turn's end follows from them: a held call waits for approval,
an ``ask_user`` for its answer, a loop-ending tool completes the instance.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from loopwright._arguments import MAX_ARGUMENT_DEPTH
from loopwright._decisions import Block, ModifyInputs, ModifyResult, RequireApproval, Respond
from loopwright._engine._common import (
    MAX_CALLS_PER_REPLY,
    MAX_CONCURRENT_CALLS,
    Call,
    SegmentEnd,
    cut,
    make_result,
    make_success,
    restore_call_order,
    take_decisions,
    tool_message,
    usage_json,
)
from loopwright._hooks import intercept
from loopwright._instance import message_to_json, now_iso, shown_call, unanswered_calls
from loopwright._tools import ToolContext, run_in_daemon_thread
from loopwright._types import (
    Cost,
    PendingApproval,
    State,
    StopReason,
    ToolCall,
    ToolStatus,
    Usage,
    approval_digest,
    call_digest,
)
from loopwright.builtins.tools import AwaitUser
from loopwright.errors import ToolCallDenied, ToolError

if TYPE_CHECKING:
    from loopwright._definition import Limits
    from loopwright._engine._checks import Checks
    from loopwright._engine._deps import EngineDeps, SegmentRun
    from loopwright._engine._journal import Journal
    from loopwright._engine._limits import Budgets
    from loopwright._instance import Instance
    from loopwright._tools import Tool

__all__ = ["Calls"]


class Calls:
    """Runs the tool calls of a turn, and the held calls once they are decided."""

    def __init__(self, deps: EngineDeps, journal: Journal, budgets: Budgets, checks: Checks) -> None:
        """Find tools through ``deps``, write through ``journal``, count in ``budgets``; ``checks`` gate the end."""
        self.deps = deps
        self.journal = journal
        self.budgets = budgets
        self.checks = checks

    async def run(self, run: SegmentRun, calls: Sequence[ToolCall], limits: Limits) -> None:  # noqa: C901, PLR0912
        """Run the calls of one assistant message and end the segment if the turn says so."""
        inst = run.inst
        defn = inst.definition
        turn = inst.turn
        items = [Call(i, c) for i, c in enumerate(calls)]
        for item in items[MAX_CALLS_PER_REPLY:]:
            item.result = make_result(item.call, ToolStatus.SKIPPED,
                                      f"skipped: only {MAX_CALLS_PER_REPLY} tool calls are taken from one reply")
        active = items[:MAX_CALLS_PER_REPLY]
        for item in active:
            await self.prepare(run, item, turn)
        if defn.approval_policy == "holdTurn" and any(i.held for i in active):
            for item in active:
                if item.result is None and not item.held:
                    item.held = "held with its turn (approvalPolicy: holdTurn)"
        runnable = [i for i in active if i.result is None and not i.held]
        exceeded = False
        room, which = self.budgets.tool_room(inst, limits)
        if room is not None:
            for item in runnable[room:]:
                item.result = make_result(item.call, ToolStatus.SKIPPED, f"skipped: {which} was reached")
                exceeded = True
            runnable = runnable[:room]
        for item in items:
            if item.result is not None:
                await self.finish(run, item, turn, save=True)
        if len(runnable) > 1 and all(i.tool.parallel_safe for i in runnable if i.tool):
            limiter = anyio.CapacityLimiter(MAX_CONCURRENT_CALLS)

            async def worker(item: Call) -> None:
                async with limiter:
                    await self.execute(run, item, turn)

            async with anyio.create_task_group() as tg:
                for item in runnable:
                    tg.start_soon(worker, item)
        else:
            for item in runnable:
                await self.execute(run, item, turn)
        failed = self.failed_call(inst, items)
        if failed is not None:
            # The run ends with this turn: a call of it that waits (held, or asking the user) gets a
            # result now, so the transcript the error leaves answers every call.
            for item in items:
                if item.result is None and (item.held or item.awaiting_user):
                    item.held, item.awaiting_user = None, False
                    item.result = make_result(item.call, ToolStatus.SKIPPED,
                                              f"skipped: the run ended because {failed.call.name!r} raised")
                    await self.finish(run, item, turn, save=True)
        # The transcript gets the results in call order, whatever order they finished in.
        for item in items:
            if item.result is not None:
                inst.transcript.append(tool_message(item))
        await self.deps.flush_records(inst.id)
        await self.end_of_turn(run, items, exceeded or any(i.over_limit for i in items), limits)

    async def end_of_turn(self, run: SegmentRun, items: Sequence[Call], exceeded: bool, limits: Limits) -> None:  # noqa: C901 - one exit per ending
        """End the segment as the turn's calls say: held, waiting for an answer, completed, or over a limit."""
        inst = run.inst
        failed = self.failed_call(inst, items)
        if failed is not None:
            raise SegmentEnd(State.ERROR, StopReason.ERROR,
                             error=f"tool {failed.call.name!r} raised {failed.raised} (onToolException: fail)")
        held = [i for i in items if i.held]
        awaiting = next((i for i in items if i.awaiting_user), None)
        if awaiting is not None:
            inst.header.awaiting_answer = {"toolCallId": awaiting.call.id,
                                           "question": awaiting.call.arguments.get("question")}
        if held:
            at = now_iso()
            entries = [PendingApproval(
                tool_call_id=i.call.id, tool=i.call.name, arguments=dict(i.call.arguments), reason=i.held or "",
                requested_at=at, original_digest=i.original_digest) for i in held]
            inst.set_pending([*inst.pending_approvals, *entries])
            for i, entry in zip(held, entries, strict=True):
                # The digest a decision on this entry must carry (issue 25), as every surface shows it.
                digest = approval_digest(entry)
                self.journal.record(inst, "approval", {"toolCallId": i.call.id, "tool": i.call.name,
                                                       "reason": i.held, "decision": None, "digest": digest})
                await self.journal.emit(run, "approval", inst.turn, toolCallId=i.call.id, tool=i.call.name,
                                        reason=i.held, arguments=dict(i.call.arguments), digest=digest)
            # The wait for a person is not the agent's time: the elapsed limit skips it.
            inst.header.paused_at = time.time()
            raise SegmentEnd(State.WAITING_FOR_APPROVAL, StopReason.WAITING_FOR_APPROVAL)
        ender = next((i for i in items if i.result is not None and i.result.status is ToolStatus.SUCCESS
                      and i.tool is not None and i.tool.ends_loop), None)
        if ender is not None:
            if inst.definition.completion is not None and await self.checks.completion_gate(run):
                return
            data = ender.result.data if ender.result else None
            if isinstance(data, Mapping) and "result" in data:
                inst.header.text = str(data["result"])
                inst.header.output = dict(data)
            elif ender.result is not None:
                inst.header.text = ender.result.content
            raise SegmentEnd(State.STOPPED, StopReason.COMPLETED)
        if awaiting is not None or inst.header.awaiting_answer:
            raise SegmentEnd(State.WAITING, StopReason.WAITING)
        if exceeded:
            _room, which = self.budgets.tool_room(inst, limits)
            raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="toolCalls",
                             error=f"{which or 'the tool-call limit'} reached")

    @staticmethod
    def failed_call(inst: Instance, items: Sequence[Call]) -> Call | None:
        """Return the first call whose tool raised, when the definition says ``onToolException: fail``."""
        if inst.definition.on_tool_exception != "fail":
            return None
        return next((i for i in items if i.raised is not None), None)

    async def prepare(self, run: SegmentRun, item: Call, turn: int) -> None:  # noqa: C901, PLR0911, PLR0912 - one exit per status
        """Validate a call and run before_tool_call; fill ``result`` or ``held`` when decided."""
        inst = run.inst
        call = item.call
        tool = self.deps.tool_for(inst.definition, call.name, inst.grants)
        item.tool = tool
        if tool is None:
            names = ", ".join(self.deps.tool_names(inst.definition, inst.grants)) or "(none)"
            item.result = make_result(call, ToolStatus.UNKNOWN_TOOL,
                                      f"unknown tool {call.name!r}. The tools you have: {names}")
            return
        if call.raw_arguments is not None:
            item.result = make_result(call, ToolStatus.INVALID_ARGUMENTS,
                                      f"the arguments are not a valid JSON object: {call.raw_arguments[:500]}\n"
                                      f"(plain JSON only: NaN, Infinity and nesting deeper than "
                                      f"{MAX_ARGUMENT_DEPTH} levels are refused)")
            return
        problems = tool.validation_errors(call.arguments)
        if problems:
            item.result = make_result(call, ToolStatus.INVALID_ARGUMENTS, "invalid arguments: " + "; ".join(problems))
            return
        impls = self.deps.hook_impls(inst.definition, "loopwright_before_tool_call")
        if impls:
            outcome = await intercept(
                impls, {"call": call, "tool": tool, "instance": self.journal.info(inst), "turn": turn},
                hook="before_tool_call",
                modify={ModifyInputs: lambda v, d: v.__setitem__(
                    "call", attrs.evolve(v["call"], arguments=dict(d.arguments)))})
            self.journal.hook_records(inst, "before_tool_call", outcome.decisions, turn)
            if outcome.values["call"] is not call:
                item.original_digest = call_digest(call.name, call.arguments)
                call = item.call = outcome.values["call"]
                problems = tool.validation_errors(call.arguments)
                if problems:
                    item.result = make_result(call, ToolStatus.INVALID_ARGUMENTS,
                                              "invalid arguments (after a hook changed them): " + "; ".join(problems))
                    return
            stop = outcome.stop
            if isinstance(stop, Block):
                item.result = make_result(call, ToolStatus.BLOCKED, f"blocked: {stop.reason}")
                return
            if isinstance(stop, Respond):
                item.result = make_success(call, stop.content, None)
                return
            if isinstance(stop, RequireApproval):
                item.held = stop.reason
                return
        if tool.requires_approval:
            item.held = f"tool {tool.name!r} requires approval"
        elif tool.name in inst.definition.requires_approval:
            item.held = f"the definition requires approval for {tool.name!r}"
        elif tool.hold is not None:
            try:
                item.held = tool.hold(call.arguments, self.tool_context(inst, tool, call))
            except Exception as exc:  # noqa: BLE001 - a failing check holds the call (fails closed)
                item.held = f"tool {tool.name!r} could not check the call ({type(exc).__name__}: {exc})"

    def tool_context(self, inst: Instance, tool: Tool, call: ToolCall, timeout: float | None = None) -> ToolContext:
        """Return the :class:`ToolContext` of a call: what ``hold`` and a tool's context parameter get."""
        deps = self.deps
        timeout = timeout or tool.timeout or deps.limits_for(inst.definition).tool_timeout or 60.0
        return ToolContext(
            instance_id=inst.id, tool_call_id=call.id, grants=inst.grants, base_dir=deps.base_dir(),
            store_locations=tuple(deps.store.locations()), sink_locations=deps.sink_locations(),
            shell_approver=deps.shell_approver,
            timeout=timeout, agents=deps.agents(inst, call.id, timeout), memory=deps.memory_for(inst))

    async def execute(self, run: SegmentRun, item: Call, turn: int) -> None:  # noqa: C901 - one exit per outcome
        """Run the tool of a prepared call, count it, and finish it (hooks, save, record)."""
        inst = run.inst
        tool = item.tool
        call = item.call
        assert tool is not None  # noqa: S101 - prepared calls have their tool
        over = self.budgets.draw_tool_call(inst)
        if over is not None:
            item.result = make_result(call, ToolStatus.SKIPPED, f"skipped: {over} was reached")
            item.over_limit = True
            await self.finish(run, item, turn, save=True)
            return
        inst.started_calls.add(call.id)
        # Saved before the tool runs: after a crash, a call with this marker and no result may
        # have had its effect; a call without it never started and can simply run.
        await self.deps.store.append_entries(inst.id, [{"t": "start", "id": call.id}])
        await self.journal.emit(run, "tool_call", turn, id=call.id, name=call.name, arguments=dict(call.arguments))
        timeout = tool.timeout or self.deps.limits_for(inst.definition).tool_timeout or 60.0
        arguments = call.arguments
        if tool.context_param is not None:
            arguments = {**arguments, tool.context_param: self.tool_context(inst, tool, call, timeout)}
        t0 = time.perf_counter()
        try:
            # A bare scope with a deadline: what anyio.fail_after does, without its two context-manager layers.
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                if tool.is_async:
                    value = await tool.function(**arguments)
                else:
                    # A daemon thread, abandoned when the call times out or the run is cancelled.
                    value = await run_in_daemon_thread(functools.partial(tool.function, **arguments))
            if scope.cancelled_caught:  # only the deadline cancels this scope
                raise TimeoutError  # noqa: TRY301 - handled with the tool's own TimeoutError below
        except TimeoutError:
            item.result = make_result(call, ToolStatus.TIMEOUT, f"timeout: the tool took longer than {timeout:g} s",
                                      duration=time.perf_counter() - t0)
        except ToolCallDenied as exc:
            item.result = make_result(call, ToolStatus.DENIED, f"denied: {exc}", duration=time.perf_counter() - t0)
        except ToolError as exc:
            item.result = make_result(call, ToolStatus.TOOL_ERROR, str(exc), duration=time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - a failing tool ends the run only with onToolException: fail
            item.raised = f"{type(exc).__name__}: {exc}"
            item.result = make_result(call, ToolStatus.TOOL_FAILED, item.raised, duration=time.perf_counter() - t0)
        else:
            if isinstance(value, AwaitUser):
                item.awaiting_user = True
                return
            item.result = make_success(call, value, time.perf_counter() - t0)
        await self.finish(run, item, turn, save=True)

    async def finish(self, run: SegmentRun, item: Call, turn: int, *, save: bool) -> None:
        """Run after_tool_call on a result, then save it and write its record."""
        inst = run.inst
        result = item.result
        assert result is not None  # noqa: S101
        impls = self.deps.hook_impls(inst.definition, "loopwright_after_tool_call")
        if impls:
            outcome = await intercept(
                impls, {"call": item.call, "result": result, "instance": self.journal.info(inst), "turn": turn},
                hook="after_tool_call",
                modify={ModifyResult: lambda v, d: v.__setitem__(
                    "result", attrs.evolve(v["result"], content=cut(d.content)))})
            self.journal.hook_records(inst, "after_tool_call", outcome.decisions, turn)
            result = outcome.values["result"]
            if isinstance(outcome.stop, Block):
                result = attrs.evolve(result, status=ToolStatus.BLOCKED, content=f"blocked: {outcome.stop.reason}",
                                      data=None)
            item.result = result
        entries: list[dict[str, Any]] = [{"t": "msg", "m": message_to_json(tool_message(item))}]
        data: dict[str, Any] = {"turn": turn, "toolCallId": result.tool_call_id, "tool": result.name,
                                "status": result.status.value}
        if result.duration is not None:
            data["duration"] = round(result.duration, 6)
        if result.usage is not None or result.cost is not None:
            usage = result.usage or Usage()
            cost = result.cost or Cost(amount=0.0)
            inst.spend(usage, cost)
            data["usage"] = usage_json(usage)
            data["cost"] = cost.amount
            entries[0]["spend"] = {"usage": data["usage"], "cost": cost.amount}
        if save:
            await self.journal.save(inst, entries)
        if item.call.injected:
            data["injected"] = True
        if result.status is not ToolStatus.SUCCESS:
            data["error"] = result.content[:1000]
        self.journal.record(inst, "tool_call", data)
        await self.journal.emit(run, "tool_result", turn, id=result.tool_call_id, name=result.name,
                                status=result.status.value, content=result.content)

    # ------------------------------------------------------------------ approval decisions

    async def continue_after_decisions(self, run: SegmentRun) -> None:
        """Give every decided held call its result (approved ones run), then go on with the turn."""
        inst = run.inst
        pending = take_decisions(inst)
        _assistant, unanswered = unanswered_calls(inst.transcript)
        by_id = {p.tool_call_id: p for p in pending}
        items: list[Call] = []
        limits = self.deps.limits_of(inst)
        exceeded = False
        for index, call in enumerate(unanswered):
            p = by_id.get(call.id)
            if p is None:
                continue
            call = shown_call(call, p)  # noqa: PLW2901 - what was approved is what runs (a hook's arguments)
            item = Call(index, call, tool=self.deps.tool_for(inst.definition, call.name, inst.grants))
            self.journal.record(inst, "approval", {"toolCallId": call.id, "tool": call.name, "decision": p.decision,
                                                   "reason": p.decision_reason,
                                                   **({"by": p.decided_by} if p.decided_by is not None else {})})
            exceeded = await self.decided(run, item, p, limits) or exceeded
            if item.result is not None:
                inst.transcript.append(tool_message(item))
            items.append(item)
        restore_call_order(inst)
        await self.deps.write_header(inst)
        await self.deps.flush_records(inst.id)
        await self.end_of_turn(run, items, exceeded=exceeded or any(i.over_limit for i in items), limits=limits)

    async def decided(self, run: SegmentRun, item: Call, decision: PendingApproval, limits: Limits) -> bool:
        """Give a decided held call that has not started its result: run it if approved, else ``denied``.

        :return: Whether a tool-call limit left no room for an approved call (it is ``skipped``).
        """
        inst = run.inst
        call = item.call
        approved = decision.decision == "approved" and item.tool is not None
        room, which = self.budgets.tool_room(inst, limits) if approved else (None, "")
        if room is not None and room <= 0:
            item.result = make_result(call, ToolStatus.SKIPPED, f"skipped: {which} was reached")
            await self.finish(run, item, inst.turn, save=True)
            return True
        if approved:
            await self.execute(run, item, inst.turn)
        else:
            why = decision.decision_reason or "no reason given"
            item.result = make_result(call, ToolStatus.DENIED, f"denied: {why}")
            await self.finish(run, item, inst.turn, save=True)
        return False

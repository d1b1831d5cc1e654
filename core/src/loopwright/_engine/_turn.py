"""Turns: the loop of one segment, and one model turn from request to saved answer.

One turn: deliver the mail, check the limits, apply the context strategy if its trigger holds,
recall long-term memory into the request (seed 002's first step, only for a definition with
``memory:``; then ``loopwright_recall``), redact it (the assembly's ``redaction:``), run
``before_inference``, call the model through the gateway (the provider's own retries, then
``agentRetry``, then the fallback models), run ``after_inference``, save the answer and what it
cost, then run its tool calls (:mod:`loopwright._engine._calls`). Every step is appended to the
store before the next begins.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import attrs

from loopwright._arguments import argument_problem, dumps_for_raw
from loopwright._decisions import Block, ModifyMessage, ModifyRequest, Respond
from loopwright._engine._common import SegmentEnd, dumps, usage_json
from loopwright._engine._limits import elapsed_reached, elapsed_scope
from loopwright._hooks import intercept
from loopwright._instance import message_to_json
from loopwright._memory import recall_message, recall_query, with_recalled
from loopwright._types import Message, ModelRequest, ModelResponse, State, StopReason, ToolCall
from loopwright.errors import HookBlockedError, ProviderError, RunError

if TYPE_CHECKING:
    from loopwright._engine._calls import Calls
    from loopwright._engine._checks import Checks
    from loopwright._engine._compaction import Compactor
    from loopwright._engine._deps import EngineDeps, SegmentRun
    from loopwright._engine._gateway import Gateway
    from loopwright._engine._journal import Journal
    from loopwright._engine._limits import Budgets
    from loopwright._engine._mailbox import Mailbox

__all__ = ["Turns"]


@attrs.frozen
class Turns:
    """Runs an instance's turns until its segment ends (by :class:`SegmentEnd`)."""

    deps: EngineDeps
    journal: Journal
    budgets: Budgets
    gateway: Gateway
    mailbox: Mailbox
    compactor: Compactor
    checks: Checks
    calls: Calls

    async def run(self, run: SegmentRun) -> None:
        """Run turns until the segment ends: mail, limits, compaction, the model, then its calls or checks."""
        inst = run.inst
        defn = inst.definition
        deps = self.deps
        budgets = self.budgets
        limits = deps.limits_of(inst)
        while True:
            await self.mailbox.drain_inbox(run)
            budgets.check(inst, limits)
            strategy = deps.context_strategy(defn)
            if strategy is not None and await self.compactor.compact(run, strategy):
                budgets.check(inst, limits)  # what the summary cost may have used a limit up
            response, message = await self.infer(run)
            calls = message.tool_calls
            if response.finish_reason == "content_filter" and not calls:
                raise SegmentEnd(State.STOPPED, StopReason.CONTENT_FILTER)
            if not calls:
                if defn.output is not None and await self.checks.output_rejected(run, message):
                    continue
                if await self.checks.completion_gate(run):
                    continue
                raise SegmentEnd(State.WAITING, StopReason.WAITING)
            await self.calls.run(run, calls, limits)

    async def infer(  # noqa: C901, PLR0912, PLR0915 - one model turn, top to bottom
        self, run: SegmentRun,
    ) -> tuple[ModelResponse, Message]:
        """Make one model call; return the response and the assistant message as the transcript keeps it."""
        deps = self.deps
        journal = self.journal
        inst = run.inst
        defn = inst.definition
        turn = inst.turn + 1
        ref = deps.model_ref(defn)
        pname, model_id = deps.split_model(ref)
        managed = None
        if defn.context_strategy is not None:  # providerNative: the provider manages the context
            strategy = deps.context_strategy(defn)
            managed = strategy.context_management if strategy is not None else None
        request = ModelRequest(
            model=model_id, provider=pname, messages=inst.transcript, tools=deps.tool_specs(defn, inst.grants),
            settings=defn.model_settings, output_schema=defn.output,
            stream=run.stream or deps.provider_streams(pname), context_management=managed)
        if defn.memory is not None:
            request = await self.recalled(run, request, turn)
        if deps.redact_request is not None:  # seed 002's order: recall, redaction, then before_inference
            request = deps.redact_request(request)
        response: ModelResponse | None = None
        impls = deps.hook_impls(inst.definition, "loopwright_before_inference")
        if impls:
            outcome = await intercept(
                impls, {"request": request, "instance": journal.info(inst), "turn": turn},
                hook="before_inference",
                modify={ModifyRequest: lambda v, d: v.__setitem__("request", d.request)})
            journal.hook_records(inst, "before_inference", outcome.decisions, turn)
            request = outcome.values["request"]
            if isinstance(outcome.stop, Block):
                raise _blocked(outcome.stop, outcome.stopped_by)
            if isinstance(outcome.stop, Respond):
                content = outcome.stop.content
                text = content if isinstance(content, str) or content is None else dumps(content)
                response = ModelResponse(message=Message(role="assistant", content=text), model="hook")
        served = ref
        t0 = time.perf_counter()
        if response is None:
            budgets = self.budgets.of(inst, deps.limits_of(inst))
            # The call, its stream, retries and fallbacks included, ends when an elapsed limit does.
            called: tuple[ModelResponse, str] | None = None
            with elapsed_scope(budgets):
                called = await self._call_model(run, request, ref)
            if called is None:  # the deadline cut the call off
                raise elapsed_reached(budgets)
            response, served = called
        latency = time.perf_counter() - t0
        impls = deps.hook_impls(inst.definition, "loopwright_after_inference")
        if impls:
            outcome = await intercept(
                impls, {"response": response, "request": request, "instance": journal.info(inst), "turn": turn},
                hook="after_inference",
                modify={ModifyMessage: lambda v, d: v.__setitem__(
                    "response", attrs.evolve(v["response"], message=d.message))})
            journal.hook_records(inst, "after_inference", outcome.decisions, turn)
            response = outcome.values["response"]
            if isinstance(outcome.stop, Block):
                raise _blocked(outcome.stop, outcome.stopped_by)
        message = response.message
        calls = message.tool_calls
        if calls:
            calls = _runtime_ids(calls, turn)
        if calls and any(c.raw_arguments is None and argument_problem(c.arguments) for c in calls):
            calls = _strict_arguments(calls)
        if message.role != "assistant" or message.model != served or calls is not message.tool_calls:
            # Built directly: attrs.evolve costs several microseconds a turn.
            message = Message(role="assistant", content=message.content, tool_calls=calls, source=message.source,
                              injected=message.injected, model=served, provider_data=message.provider_data)
        usage = response.usage
        cost = self.gateway.price(usage, served)
        inst.turn = turn
        if not usage.unreported_requests:
            inst.context_tokens = usage.input_tokens
        inst.spend(usage, cost)
        inst.seg_iterations += 1
        inst.transcript.append(message)
        inst.started_calls = set()
        spent = usage_json(usage)
        # One line: a write torn by a crash keeps the answer and its turn data together or neither.
        await journal.save(inst, [{"t": "msg", "m": message_to_json(message),
                                   "turn": {"n": turn, "model": served, "usage": spent, "cost": cost.amount}}])
        journal.record(inst, "turn", {
            "turn": turn, "model": served, "usage": spent, "cost": cost.amount,
            "finishReason": response.finish_reason, "toolCalls": len(calls), "latency": round(latency, 6)})
        inst.header.served_by = served
        if message.content:
            inst.header.text = message.content
        await journal.observe(inst, "loopwright_on_message", message=message)
        await journal.observe(inst, "loopwright_on_cost", turn=turn, usage=usage, cost=cost, model=served)
        if message.content:
            await journal.emit(run, "text", turn, text=message.content)
        await journal.emit(run, "usage", turn, usage=spent, cost=cost.amount, model=served)
        return response, message

    async def recalled(self, run: SegmentRun, request: ModelRequest, turn: int) -> ModelRequest:
        """Return ``request`` with the facts recalled for it, then ``loopwright_recall``'s decisions.

        The facts about the grant's subject that best match the latest user message, from its
        read namespaces (at most the definition's ``memory.recall``), become one system message
        placed after the system prompt, in this request only: the transcript never holds it.

        :raises SegmentEnd: A ``loopwright_recall`` hook blocked the call.
        """
        inst = run.inst
        spec = inst.definition.memory
        access = self.deps.memory_for(inst)
        if spec is None or spec.recall <= 0 or access is None or not access.grants.read:
            return request
        facts = tuple(await access.recall(recall_query(inst.transcript), limit=spec.recall))
        if facts:
            message = recall_message(access.subject, facts)
            request = attrs.evolve(request, messages=with_recalled(request.messages, message))
        impls = self.deps.hook_impls(inst.definition, "loopwright_recall")
        if impls:
            outcome = await intercept(
                impls, {"facts": facts, "request": request, "instance": self.journal.info(inst), "turn": turn},
                hook="recall", modify={ModifyRequest: lambda v, d: v.__setitem__("request", d.request)})
            self.journal.hook_records(inst, "recall", outcome.decisions, turn)
            if isinstance(outcome.stop, Block):
                raise _blocked(outcome.stop, outcome.stopped_by)
            request = outcome.values["request"]
        return request

    async def _call_model(self, run: SegmentRun, request: ModelRequest, ref: str) -> tuple[ModelResponse, str]:
        """Call the instance's model, then its fallback models, through the gateway; end the segment if all fail."""
        def request_for(index: int, _candidate: str, pname: str, model_id: str) -> ModelRequest:
            return request if index == 0 else attrs.evolve(request, model=model_id, provider=pname)

        try:
            return await self.gateway.call(run, (ref, *run.inst.definition.fallback_models), request_for)
        except ProviderError as failure:
            raise SegmentEnd(State.ERROR, StopReason.ERROR, error=_failure_text(failure),
                             failure=RunError(f"model call failed: {failure}", cause=failure)) from None


def _failure_text(failure: ProviderError) -> str:
    """Return the ``error`` an instance is left with when its model call failed for good.

    The failure's message, followed by the request it made (``(request: POST URL)``) when it
    has one, so that a wrong ``baseUrl`` or model shows where it was sent. The URL is shown
    without its query, fragment or user info (a key may travel there).
    """
    text = str(failure)
    request = failure.request
    url = getattr(request, "url", None)
    if url is None:
        return text
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # a port out of range: the URL is not worth showing
        return text
    if not parts.scheme or not host:
        return text
    host = f"[{host}]" if ":" in host else host
    method = getattr(request, "method", None)
    shown = f"{parts.scheme}://{host}{port}{parts.path}"
    return f"{text} (request: {method + ' ' if isinstance(method, str) and method else ''}{shown})"


def _blocked(block: Block, plugin: str | None) -> SegmentEnd:
    """Return the end of a segment whose model turn an inference hook blocked."""
    return SegmentEnd(State.ERROR, StopReason.ERROR, error=f"blocked by hook: {block.reason}",
                      failure=HookBlockedError(hook=plugin or "?", reason=block.reason))


def _runtime_ids(calls: Sequence[ToolCall], turn: int) -> tuple[ToolCall, ...]:
    """Give each call the runtime's own id, ``lw-TURN-INDEX-RANDOM``, and keep the provider's as its ``wire_id``.

    A model may repeat a call id, within a reply or across turns (issue 25): the runtime's id is
    unique in the instance (the random part keeps it so after a rewind reuses turn numbers) and
    URL-safe, so every surface can name the call, and a decision names one call only. The
    provider's id goes back on the wire, where providers pair calls and results; a call without
    one, or with one used before in the reply, has none (the runtime's id goes on the wire).
    """
    tag = secrets.token_hex(3)
    seen: set[str] = set()
    out = []
    for k, c in enumerate(calls):
        wire = c.wire_id if c.wire_id is not None else c.id
        fresh = bool(wire) and wire not in seen
        seen.add(wire)
        out.append(ToolCall(id=f"lw-{turn}-{k}-{tag}", name=c.name, arguments=c.arguments,
                            raw_arguments=c.raw_arguments, injected=c.injected, wire_id=wire if fresh else None))
    return tuple(out)


def _strict_arguments(calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    """Move arguments that are not plain JSON (NaN, infinity, too deep) to ``raw_arguments``.

    Whatever the provider decoded, the transcript then holds only JSON it can write and read back
    without recursing, and the call gets ``invalid_arguments``.
    """
    return tuple(
        ToolCall(id=c.id, name=c.name, arguments={}, raw_arguments=dumps_for_raw(c.arguments), injected=c.injected,
                 wire_id=c.wire_id)
        if c.raw_arguments is None and argument_problem(c.arguments) else c
        for c in calls)

"""The agent loop: run segments, turns and tool calls (seed 000, "The loop").

One turn: apply the context strategy if its trigger holds, run ``before_inference``, call the
provider (its own retries, then ``agentRetry``, then the fallback models), run
``after_inference``, validate and run the tool calls (concurrently when every one is
``parallelSafe``, at most 8 at once, each with a timeout), return the results in call order
and save the turn. Every step is appended to the store before the next begins.

Hooks cost nothing when none is registered: each hook point first looks at the cached tuple of
implementations and skips all hook work, the :class:`InstanceInfo` included, when it is empty.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import cattrs

from loopwright._agents import Agents
from loopwright._arguments import MAX_ARGUMENT_DEPTH, argument_problem, dumps_for_raw
from loopwright._convert import converter
from loopwright._decisions import (
    Block,
    Decision,
    ModifyInputs,
    ModifyMessage,
    ModifyRequest,
    ModifyResult,
    RequireApproval,
    Respond,
)
from loopwright._hooks import intercept, notify
from loopwright._instance import Instance, message_to_json, now_iso, rebuild, unanswered_calls
from loopwright._retry import retry_transient
from loopwright._tools import ToolContext, run_in_daemon_thread
from loopwright._types import (
    Cost,
    Event,
    InstanceInfo,
    Message,
    ModelRequest,
    ModelResponse,
    PendingApproval,
    State,
    StopReason,
    ToolCall,
    ToolOutput,
    ToolResult,
    ToolStatus,
    Usage,
)
from loopwright.abc import CompactionContext
from loopwright.builtins.context import render_transcript
from loopwright.builtins.tools import AwaitUser
from loopwright.errors import HookBlockedError, ProviderError, RunError, ToolCallDenied, ToolError

if TYPE_CHECKING:
    from loopwright._definition import Limits
    from loopwright._runtime import AgentRun, Runtime
    from loopwright._tools import Tool
    from loopwright.abc import ContextStrategy

__all__ = [
    "MAX_CALLS_PER_REPLY", "MAX_CONCURRENT_CALLS", "MAX_INVALID_OUTPUTS", "MAX_RESULT_CHARS", "Loop", "SegmentEnd",
    "parse_output",
]

#: Tool calls taken from one model reply; the rest get ``skipped`` results.
MAX_CALLS_PER_REPLY = 32
#: Tool calls running at once.
MAX_CONCURRENT_CALLS = 8
#: Characters of one tool result; longer ones are cut, with a marker.
MAX_RESULT_CHARS = 100_000
#: Invalid structured answers re-prompted before the segment ends ``output_invalid`` (seed 002).
MAX_INVALID_OUTPUTS = 2


class _Parsed:
    """A structured answer that passed its schema."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

_dumps = functools.partial(json.dumps, ensure_ascii=False, default=str)
_usage_unstructure = converter.get_unstructure_hook(Usage)
#: Tool return values reach the model with their own field names, defaults included.
_plain = cattrs.Converter()


class SegmentEnd(Exception):  # noqa: N818 - control flow inside the loop only
    """Raised inside the loop to end the segment in a resting state."""

    def __init__(self, state: State, reason: StopReason, *, error: str | None = None,
                 limit: str | None = None, failure: BaseException | None = None) -> None:
        self.state = state
        self.reason = reason
        self.error = error
        self.limit = limit
        self.failure = failure
        super().__init__(reason.value)


@attrs.define
class _Call:
    """One call of a turn on its way to a result."""

    index: int
    call: ToolCall
    tool: Tool | None = None
    result: ToolResult | None = None
    held: str | None = None          # approval reason when held
    awaiting_user: bool = False
    over_limit: bool = False         # skipped at its start: the tree's toolCalls budget was used up


class _Spent:
    """What the model calls of one context-strategy run used."""

    __slots__ = ("cost", "models", "usage")

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.cost = Cost(amount=0.0)
        self.models: list[str] = []

    def add(self, usage: Usage, cost: Cost, model: str) -> None:
        self.usage = usage if self.usage is None else self.usage + usage
        self.cost += cost
        if model not in self.models:
            self.models.append(model)

    def charge(self, inst: Instance) -> dict[str, Any] | None:
        """Count it toward the instance's usage, cost and limits; return its ``spend`` data (``None``: nothing)."""
        usage = self.usage
        if usage is None:
            return None
        inst.spend(usage, self.cost)
        return {"usage": _usage_unstructure(usage), "cost": self.cost.amount, "model": ", ".join(self.models)}


class Loop:
    """Drives instances of one runtime. Stateless apart from the runtime it serves."""

    def __init__(self, runtime: Runtime) -> None:
        """Bind the loop to ``runtime`` (its plugins, store, providers and prices)."""
        self.rt = runtime
        self.host = runtime.plugins
        self.store = runtime.store

    # ------------------------------------------------------------------ hook helpers

    def _info(self, inst: Instance) -> InstanceInfo:
        info = inst.info
        if info is None:
            info = inst.info = InstanceInfo(
                instance_id=inst.id, name=inst.definition.name, model=self.rt.model_ref(inst.definition),
                depth=int(inst.header.get("depth", 0)),
                spawner_instance_id=inst.header.get("spawnerInstanceId"))
        return info

    def _observer_error(self, inst: Instance) -> Any:
        def on_error(plugin: str, exc: BaseException) -> None:
            self.record(inst, "observer_error", {"plugin": plugin, "error": f"{type(exc).__name__}: {exc}"})
        return on_error

    async def observe(self, inst: Instance, hook: str, **values: Any) -> None:
        impls = self.rt.hook_impls(inst.definition, hook)
        if impls:
            values.setdefault("instance", self._info(inst))
            await notify(impls, values, on_error=self._observer_error(inst))

    def _hook_records(self, inst: Instance, hook: str, decisions: Sequence[tuple[str, Decision, str | None]],
                      turn: int) -> None:
        for plugin, decision, error in decisions:
            data: dict[str, Any] = {"hook": hook, "plugin": plugin, "decision": decision.kind, "turn": turn}
            reason = getattr(decision, "reason", None)
            if reason is not None:
                data["reason"] = reason
            if error is not None:
                data["error"] = error
            self.record(inst, "hook", data)

    # ------------------------------------------------------------------ records, events, saving

    def record(self, inst: Instance, kind: str, data: Mapping[str, Any]) -> None:
        """Queue a record for the instance's record log (written with the next save)."""
        self.rt.queue_record(inst.id, kind, data)

    async def emit(self, run: AgentRun, kind: str, turn: int | None, **data: Any) -> None:
        """Give an event to the run's subscribers and the ``on_stream_event`` hook."""
        event = Event(kind=kind, instance_id=run.instance_id, turn=turn, data=data)
        run.publish(event)
        impls = self.rt.hook_impls(run.inst.definition, "loopwright_on_stream_event")
        if impls:
            await notify(impls, {"event": event, "instance": self._info(run.inst)},
                         on_error=self._observer_error(run.inst))

    async def save(self, inst: Instance, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append entries to the instance's log (records are flushed once a turn, and at state changes)."""
        if entries:
            await self.store.append_entries(inst.id, entries)

    async def add_message(self, run: AgentRun, message: Message, *, save: bool = True,
                          marks: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Append a message to the transcript; return its entry (saved unless ``save=False``).

        :param marks: Extra keys of the entry (``task`` for the task prompt).
        """
        inst = run.inst
        inst.transcript.append(message)
        entry = {"t": "msg", "m": message_to_json(message), **(marks or {})}
        if save:
            await self.save(inst, [entry])
        await self.observe(inst, "loopwright_on_message", message=message)
        return entry

    async def set_state(self, run: AgentRun, state: State, reason: StopReason | None = None, **extra: Any,
                        ) -> None:
        """Change the instance's state, save the header and tell observers."""
        inst = run.inst
        old = inst.header.get("state")
        h = inst.header
        if old == state.value and h.get("stopReason") == (reason.value if reason else None) and all(
                h.get(k) == v for k, v in extra.items()):
            # Nothing to save (a new instance is created "running"); followers still hear of it.
            await self.emit(run, "state", inst.turn, state=state.value, stopReason=h.get("stopReason"))
            return
        h["state"] = state.value
        h["stopReason"] = reason.value if reason else None
        for k, v in extra.items():
            h[k] = v
        h["updatedAt"] = now_iso()
        inst.totals_to_header()
        if state is not State.RUNNING:
            # What happened before the instance rests is on disk before the header says it rests: a
            # crash in between leaves it running, and the runner that resumes it repairs the rest.
            await self.rt.flush_records(inst.id)
        await self.rt.write_header(inst)
        self.record(inst, "state", {"from": old, "to": state.value, "stopReason": h["stopReason"],
                                    **{k: v for k, v in extra.items() if v is not None}})
        await self.observe(inst, "loopwright_on_state_change", old=old, new=state.value,
                           stop_reason=h["stopReason"])
        await self.rt.flush_records(inst.id)
        await self.emit(run, "state", inst.turn, state=state.value, stopReason=h["stopReason"])

    # ------------------------------------------------------------------ segments

    async def run_segment(self, run: AgentRun, *, new_segment: bool, prelude: Any = None) -> None:
        """Run the instance until it rests. ``prelude`` runs first, inside the segment.

        :param new_segment: Whether the limits' counters restart (a start or a message) or
            continue (an approval decision, a resume after a crash).
        :param prelude: An async function of no arguments run after the state is ``running``.
        """
        inst = run.inst
        if new_segment:
            inst.seg_iterations = inst.seg_tool_calls = inst.seg_tokens = inst.tree_tokens = inst.tree_tool_calls = 0
            inst.seg_cost = inst.tree_cost = 0.0
            inst.completion_attempts = inst.output_attempts = 0
            inst.header["segmentStartedAt"] = time.time()
            await self.store.append_entries(inst.id, [{"t": "seg", "at": now_iso()}])
        await self.set_state(run, State.RUNNING, None, error=None, limit=None, cancelled=False, runner=self.rt.owner)
        try:
            if prelude is not None:
                await prelude()
            await self._turns(run)
        except SegmentEnd as end:
            run.failure = end.failure
            extra: dict[str, Any] = {"error": end.error, "limit": end.limit}
            if end.error:
                self.record(inst, "error", {"message": end.error, "stopReason": end.reason.value})
            await self.set_state(run, end.state, end.reason, **extra)

    async def _turns(self, run: AgentRun) -> None:
        inst = run.inst
        defn = inst.definition
        limits = self.rt.limits_of(inst)
        while True:
            await self._drain_inbox(run)
            self._check_limits(inst, limits)
            strategy = self.rt.context_strategy(defn)
            if strategy is not None and await self._compact(run, strategy):
                self._check_limits(inst, limits)  # what the summary cost may have used a limit up
            response, message = await self._infer(run)
            calls = message.tool_calls
            if response.finish_reason == "content_filter" and not calls:
                raise SegmentEnd(State.STOPPED, StopReason.CONTENT_FILTER)
            if not calls:
                if defn.output is not None and await self._output_rejected(run, message):
                    continue
                if await self._completion_gate(run, limits):
                    continue
                raise SegmentEnd(State.WAITING, StopReason.WAITING)
            await self.run_calls(run, calls, limits)

    def _check_limits(self, inst: Instance, limits: Limits) -> None:
        """Raise SegmentEnd for a limit reached: its own, or one of a live ancestor's (the tree's one budget).

        Tokens and cost count what its descendants spent too (see :meth:`Instance.spend`).
        """
        if limits.max_iterations is not None and inst.seg_iterations >= limits.max_iterations:
            raise SegmentEnd(State.ERROR, StopReason.MAX_ITERATIONS,
                             error=f"max iterations ({limits.max_iterations}) reached", limit="maxIterations")
        _check_budget(inst, limits, "")
        if inst.spawner is not None:
            for above in inst.ancestors():
                _check_budget(above, self.rt.limits_of(above), _of_ancestor(above))

    def budgets(self, inst: Instance, limits: Limits) -> list[tuple[Instance, Limits]]:
        """Return the budgets ``inst`` draws from: its own limits, then each live ancestor's."""
        if inst.spawner is None:
            return [(inst, limits)]
        return [(inst, limits), *((above, self.rt.limits_of(above)) for above in inst.ancestors())]

    def tool_room(self, inst: Instance, limits: Limits) -> tuple[int | None, str]:
        """Return how many more tool calls ``inst`` may start (``None``: no limit) and the limit that says so."""
        room: int | None = None
        which = ""
        for owner, owned in self.budgets(inst, limits):
            if owned.tool_calls is None:
                continue
            left = max(owned.tool_calls - owner.seg_tool_calls - owner.tree_tool_calls, 0)
            if room is None or left < room:
                room = left
                which = f"the tool-call limit ({owned.tool_calls}){_of_ancestor(owner) if owner is not inst else ''}"
        return room, which

    async def absorb_mail(self, run: AgentRun, *, running: bool) -> bool:
        """Move new mailbox posts into the header's queue (``inbox``); return whether a cancel came.

        Called when a segment starts (``running=False``: cancel requests are stale and dropped)
        and at every turn boundary (``running=True``). Nothing is written here; the header is
        saved with the next state change or by :meth:`_drain_inbox`.
        """
        h = run.inst.header
        cursor = int(h.get("inboxCursor") or 0)
        posts, new_cursor = await self.store.read_posts(run.inst.id, cursor)
        run.mail_read_at = time.monotonic()
        if not posts:
            return False
        h["inboxCursor"] = new_cursor
        queue = h.setdefault("inbox", [])
        cancel = False
        for post in posts:
            if post.get("type") == "message":
                queue.append(post)
            elif post.get("type") == "cancel":
                cancel = cancel or running
        return cancel

    async def _drain_inbox(self, run: AgentRun) -> None:
        """Deliver queued messages at a turn boundary; act on a cancel request.

        Messages come from the instance's mailbox (any process may post) and wait in the
        header's ``inbox`` queue. A message from ``api`` or ``user`` answers a pending
        ``ask_user`` (the task prompt that waits behind a held turn never does); the others wait
        behind the question. While a question is unanswered the segment rests ``waiting``
        without calling the model.

        Reading an empty mailbox is one failed ``open`` for the file store (a few microseconds).
        """
        inst = run.inst
        h = inst.header
        before = h.get("inboxCursor")
        if await self.absorb_mail(run, running=True):
            await self.rt.write_header(inst)
            run.request_cancel()
            await anyio.lowlevel.checkpoint()
        queue: list[dict[str, Any]] = h.get("inbox") or []
        if h.get("awaitingAnswer"):
            answer = next((m for m in queue if m.get("source") in ("api", "user") and not m.get("behindTurn")), None)
            if answer is not None:
                queue.remove(answer)
                await self.answer_question(run, str(answer.get("text", "")))
        if queue and not h.get("awaitingAnswer"):
            h["inbox"] = []
            for item in queue:
                await self.add_message(run, Message(role="user", content=item.get("text"), source=item.get("source")),
                                       marks={"task": True} if item.get("behindTurn") else None)
                self.record(inst, "message", {"source": item.get("source"), "at": item.get("at")})
            await self.rt.write_header(inst)
        elif h.get("inboxCursor") != before:
            await self.rt.write_header(inst)
        if h.get("awaitingAnswer"):
            raise SegmentEnd(State.WAITING, StopReason.WAITING)

    async def has_mail(self, run: AgentRun) -> bool:
        """Return whether messages wait in the mailbox of a resting instance (cancel requests are dropped)."""
        inst = run.inst
        cursor = int(inst.header.get("inboxCursor") or 0)
        posts, new_cursor = await self.store.read_posts(inst.id, cursor)
        if not posts:
            return False
        if any(p.get("type") == "message" for p in posts):
            return True
        inst.header["inboxCursor"] = new_cursor  # a cancel request for a segment that has ended
        await self.rt.write_header(inst)
        return False

    async def cancel_posted(self, run: AgentRun) -> bool:
        """Return whether the unread posts hold a cancel request (nothing is consumed)."""
        posts, _ = await self.store.read_posts(run.inst.id, int(run.inst.header.get("inboxCursor") or 0))
        return any(p.get("type") == "cancel" for p in posts)

    # ------------------------------------------------------------------ inference

    async def _infer(  # noqa: C901, PLR0912, PLR0915 - one model turn, top to bottom
        self, run: AgentRun,
    ) -> tuple[ModelResponse, Message]:
        """Make one model call; return the response and the assistant message as the transcript keeps it."""
        inst = run.inst
        defn = inst.definition
        turn = inst.turn + 1
        ref = self.rt.model_ref(defn)
        pname, model_id = self.rt.split_model(ref)
        managed = None
        if defn.context_strategy is not None:  # providerNative: the provider manages the context
            strategy = self.rt.context_strategy(defn)
            managed = strategy.context_management if strategy is not None else None
        request = ModelRequest(
            model=model_id, provider=pname, messages=inst.transcript, tools=self.rt.tool_specs(defn, inst.grants),
            settings=defn.model_settings, output_schema=defn.output,
            stream=run.stream or self.rt.provider_streams(pname), context_management=managed)
        response: ModelResponse | None = None
        impls = self.rt.hook_impls(inst.definition, "loopwright_before_inference")
        if impls:
            outcome = await intercept(
                impls, {"request": request, "instance": self._info(inst), "turn": turn},
                hook="before_inference", allowed=(ModifyRequest, Block, Respond),
                modify={ModifyRequest: lambda v, d: v.__setitem__("request", d.request)})
            self._hook_records(inst, "before_inference", outcome.decisions, turn)
            request = outcome.values["request"]
            if isinstance(outcome.stop, Block):
                raise SegmentEnd(State.ERROR, StopReason.ERROR, error=f"blocked by hook: {outcome.stop.reason}",
                                 failure=HookBlockedError(hook=outcome.stopped_by or "?",
                                                          reason=outcome.stop.reason))
            if isinstance(outcome.stop, Respond):
                content = outcome.stop.content
                text = content if isinstance(content, str) or content is None else _dumps(content)
                response = ModelResponse(message=Message(role="assistant", content=text), model="hook")
        served = ref
        t0 = time.perf_counter()
        if response is None:
            budgets = self.budgets(inst, self.rt.limits_of(inst))
            # The call, its stream, retries and fallbacks included, ends when an elapsed limit does.
            called: tuple[ModelResponse, str] | None = None
            with _elapsed_scope(budgets):
                called = await self._call_model(run, request, ref)
            if called is None:  # the deadline cut the call off
                raise _elapsed_reached(budgets)
            response, served = called
            if not response.usage.requests:  # the provider left Usage() as it was
                response = attrs.evolve(response, usage=_one_request(response.usage))
        latency = time.perf_counter() - t0
        impls = self.rt.hook_impls(inst.definition, "loopwright_after_inference")
        if impls:
            outcome = await intercept(
                impls, {"response": response, "request": request, "instance": self._info(inst), "turn": turn},
                hook="after_inference", allowed=(ModifyMessage, Block),
                modify={ModifyMessage: lambda v, d: v.__setitem__(
                    "response", attrs.evolve(v["response"], message=d.message))})
            self._hook_records(inst, "after_inference", outcome.decisions, turn)
            response = outcome.values["response"]
            if isinstance(outcome.stop, Block):
                raise SegmentEnd(State.ERROR, StopReason.ERROR, error=f"blocked by hook: {outcome.stop.reason}",
                                 failure=HookBlockedError(hook=outcome.stopped_by or "?",
                                                          reason=outcome.stop.reason))
        message = response.message
        calls = message.tool_calls
        if calls and (len(calls) != len({c.id for c in calls}) or not all(c.id for c in calls)):
            calls = _unique_ids(calls, turn)
        if calls and any(c.raw_arguments is None and argument_problem(c.arguments) for c in calls):
            calls = _strict_arguments(calls)
        if message.role != "assistant" or message.model != served or calls is not message.tool_calls:
            # Built directly: attrs.evolve costs several microseconds a turn.
            message = Message(role="assistant", content=message.content, tool_calls=calls, source=message.source,
                              injected=message.injected, model=served, provider_data=message.provider_data)
        usage = response.usage
        spname, smodel = self.rt.split_model(served)
        cost = self.rt.price(usage, spname, smodel)
        inst.turn = turn
        if not usage.unreported_requests:
            inst.context_tokens = usage.input_tokens
        inst.spend(usage, cost)
        inst.seg_iterations += 1
        inst.transcript.append(message)
        inst.started_calls = set()
        usage_json = _usage_unstructure(usage)
        # One line: a write torn by a crash keeps the answer and its turn data together or neither.
        await self.save(inst, [{"t": "msg", "m": message_to_json(message),
                                "turn": {"n": turn, "model": served, "usage": usage_json, "cost": cost.amount}}])
        self.record(inst, "turn", {
            "turn": turn, "model": served, "usage": usage_json, "cost": cost.amount,
            "finishReason": response.finish_reason, "toolCalls": len(calls), "latency": round(latency, 6)})
        inst.header["servedBy"] = served
        if message.content:
            inst.header["text"] = message.content
        await self.observe(inst, "loopwright_on_message", message=message)
        await self.observe(inst, "loopwright_on_cost", turn=turn, usage=usage, cost=cost, model=served)
        if message.content:
            await self.emit(run, "text", turn, text=message.content)
        await self.emit(run, "usage", turn, usage=usage_json, cost=cost.amount, model=served)
        return response, message

    async def _call_model(self, run: AgentRun, request: ModelRequest, ref: str) -> tuple[ModelResponse, str]:
        inst = run.inst
        refs = (ref, *inst.definition.fallback_models)
        retries = self.rt.assembly.agent_retry.max_retries
        failure: ProviderError | None = None
        for i, candidate in enumerate(refs):
            pname, model_id = self.rt.split_model(candidate)
            try:
                provider = self.rt.provider(pname)
            except Exception as exc:  # noqa: BLE001 - a misconfigured fallback is one more failure
                failure = ProviderError(str(exc), provider=pname, model=model_id)
                self.record(inst, "error", {"model": candidate, "message": str(failure)})
                continue
            req = request if i == 0 else attrs.evolve(request, model=model_id, provider=pname)
            call = (functools.partial(self._stream, run, provider, req) if req.stream
                    else functools.partial(provider.complete, req))
            try:
                response = await (retry_transient(call, max_retries=retries) if retries else call())
            except ProviderError as exc:
                failure = exc
                self.record(inst, "error", {"model": candidate, "message": str(exc), "status": exc.status,
                                            "transient": exc.transient})
                continue
            return response, candidate
        assert failure is not None  # noqa: S101 - refs is never empty
        raise SegmentEnd(State.ERROR, StopReason.ERROR, error=str(failure),
                         failure=RunError(f"model call failed: {failure}", cause=failure))

    async def _stream(self, run: AgentRun, provider: Any, request: ModelRequest) -> ModelResponse:
        """Consume a provider's stream: text and tool-call starts become events; return the answer."""
        turn = run.inst.turn + 1
        response: ModelResponse | None = None
        if run.streamed_turn == turn:
            # A retry or a fallback after text was already shown: followers start the answer over.
            await self.emit(run, "stream_reset", turn)
        run.streamed_turn = turn
        deltas = provider.stream(request)
        try:
            async for delta in deltas:
                kind = delta.kind
                if kind == "text":
                    if delta.text:
                        await self.emit(run, "text_delta", turn, delta=delta.text)
                elif kind == "tool_call":
                    await self.emit(run, "tool_call_start", turn, id=delta.tool_call_id, name=delta.name)
                elif kind == "done":
                    response = delta.response
        finally:
            # Closed here, also when a deadline or a cancel ends the stream early (not later by the GC).
            aclose = getattr(deltas, "aclose", None)
            if aclose is not None:
                await aclose()
        if response is None:
            raise ProviderError("the stream ended without its final answer", provider=request.provider,
                                model=request.model, transient=True)
        return response

    # ------------------------------------------------------------------ structured output

    async def _output_rejected(self, run: AgentRun, message: Message) -> bool:
        """Check a final answer against the definition's ``output`` schema.

        Return True when it was rejected and the model was asked again. A valid answer is parsed
        into ``AgentResult.output``; after :data:`MAX_INVALID_OUTPUTS` re-prompts the segment
        ends ``output_invalid``.
        """
        inst = run.inst
        problems = self.rt.output_problems(inst.definition, message.content)
        if isinstance(problems, _Parsed):
            inst.header["output"] = problems.value
            return False
        inst.output_attempts += 1
        self.record(inst, "output", {"attempt": inst.output_attempts, "problems": problems})
        if inst.output_attempts > MAX_INVALID_OUTPUTS:
            raise SegmentEnd(State.ERROR, StopReason.OUTPUT_INVALID,
                             error=f"the answer did not match the output schema {inst.output_attempts} times: "
                                   + "; ".join(problems))
        await self.add_message(run, Message(
            role="user", source="runtime",
            content="Your answer does not match the required output schema: " + "; ".join(problems)
                    + ". Answer again with only a JSON value that matches the schema."))
        return True

    # ------------------------------------------------------------------ completion gate

    async def _completion_gate(self, run: AgentRun, limits: Limits) -> bool:
        """Return True to keep looping (the gate failed and re-prompted)."""
        inst = run.inst
        completion = inst.definition.completion
        if completion is None:
            return False
        inst.completion_attempts += 1
        check: dict[str, Any] = {"attempt": inst.completion_attempts}
        try:  # a verifier that raises, or answers anything but (ok, reason), fails the check (fails closed)
            ok, reason = self.rt.verifier(completion.verify)(inst.transcript)
            if not isinstance(ok, bool):
                raise TypeError(f"it returned {ok!r} for ok, not True or False")  # noqa: TRY301
            reason = str(reason)
        except Exception as exc:  # noqa: BLE001
            ok, reason = False, f"the verifier {completion.verify!r} failed: {type(exc).__name__}: {exc}"
            check["error"] = f"{type(exc).__name__}: {exc}"
        self.record(inst, "completion", {**check, "ok": ok, "reason": reason})
        if ok:
            return False
        if inst.completion_attempts >= completion.max_attempts:
            raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="completion",
                             error=f"completion check failed after {inst.completion_attempts} attempts: {reason}")
        await self.add_message(run, Message(
            role="user", source="runtime",
            content=f"The task is not complete: {reason}. Continue until it is, then finish."))
        del limits
        return True

    # ------------------------------------------------------------------ context strategy

    async def _compact(self, run: AgentRun, strategy: ContextStrategy) -> bool:
        """Run the context strategy if its trigger holds; return whether it spent anything.

        The trigger sees the input tokens of the latest model call (``None`` before any, and
        after a compaction until the next call). A ``before_compaction`` Block skips the run. The
        new transcript is saved as one ``reset`` entry that carries what the strategy's model
        calls spent (``spend``): a crash before it is written loses those calls and leaves the
        transcript as it was, and a rebuild counts the spending with the transcript it bought.
        A summary call that fails (after its retries and fallbacks) is recorded and the
        transcript stays as it was; the run goes on.
        """
        inst = run.inst
        last = None if inst.context_tokens is None else Usage(input_tokens=inst.context_tokens)
        if not strategy.should_apply(inst.transcript, last_usage=last, context_window=None):
            return False
        impls = self.rt.hook_impls(inst.definition, "loopwright_before_compaction")
        if impls:
            outcome = await intercept(
                impls, {"instance": self._info(inst), "strategy": strategy.kind, "messages": inst.transcript},
                hook="before_compaction", allowed=(Block,), modify={})
            self._hook_records(inst, "before_compaction", outcome.decisions, inst.turn)
            if outcome.stop is not None:
                return False
        spent = _Spent()
        context = CompactionContext(model=self.rt.model_ref(inst.definition), turn=inst.turn,
                                    summarize=functools.partial(self._summarize, run, spent))
        before = len(inst.transcript)
        data: dict[str, Any] = {"strategy": strategy.kind, "turn": inst.turn, "before": before}
        failure: ProviderError | None = None
        kept: list[Message] = []
        budgets = self.budgets(inst, self.rt.limits_of(inst))
        with _elapsed_scope(budgets) as scope:  # its summary calls end when an elapsed limit does
            try:
                kept = list(await strategy.run(inst.transcript, context))
            except ProviderError as exc:
                failure = exc
        spend = spent.charge(inst)
        data.update(context.details)
        if spend is not None:
            data.update(spend)
        if failure is not None or scope.cancelled_caught:
            if spend is not None:  # a strategy that made more than one call spent before failing
                await self.save(inst, [{"t": "spend", **spend}])
            data.update(after=before, error=str(failure) if failure is not None else "elapsed-time limit reached")
            self.record(inst, "compaction", data)
            if scope.cancelled_caught:
                raise _elapsed_reached(budgets)
            return spend is not None
        inst.transcript.replace(kept)
        inst.context_tokens = None  # the latest call's count measured the old transcript
        entry: dict[str, Any] = {"t": "reset", "messages": [message_to_json(m) for m in kept]}
        if spend is not None:
            entry["spend"] = spend
        await self.save(inst, [entry])
        data["after"] = len(kept)
        self.record(inst, "compaction", data)
        return spend is not None

    async def _summarize(self, run: AgentRun, spent: _Spent, messages: Sequence[Message], instruction: str,
                         model: str | None) -> str:
        """One summary call for a context strategy (``CompactionContext.summarize``)."""
        inst = run.inst
        defn = inst.definition
        own = self.rt.model_ref(defn)
        refs = (model,) if model else (own, *defn.fallback_models)
        sent = (Message(role="system", content=instruction),
                Message(role="user", content=render_transcript(messages)))
        retries = self.rt.assembly.agent_retry.max_retries
        failure: ProviderError | None = None
        for candidate in refs:
            pname, model_id = self.rt.split_model(candidate)
            try:
                provider = self.rt.provider(pname)
            except Exception as exc:  # noqa: BLE001 - a misconfigured model is one more failure
                failure = ProviderError(str(exc), provider=pname, model=model_id)
                self.record(inst, "error", {"model": candidate, "message": str(failure), "compaction": True})
                continue
            # The agent's own model keeps its settings, but no tool is offered to it here.
            settings = {k: v for k, v in defn.model_settings.items() if k != "toolChoice"} if candidate == own else {}
            request = ModelRequest(model=model_id, provider=pname, messages=sent, settings=settings)
            call = functools.partial(provider.complete, request)
            try:
                response = await (retry_transient(call, max_retries=retries) if retries else call())
            except ProviderError as exc:
                failure = exc
                self.record(inst, "error", {"model": candidate, "message": str(exc), "status": exc.status,
                                            "transient": exc.transient, "compaction": True})
                continue
            usage = response.usage if response.usage.requests else _one_request(response.usage)
            cost = self.rt.price(usage, pname, model_id)
            spent.add(usage, cost, candidate)
            await self.observe(inst, "loopwright_on_cost", turn=inst.turn, usage=usage, cost=cost, model=candidate)
            text = (response.message.content or "").strip()
            if not text:
                raise ProviderError("the summary call answered with no text", provider=pname, model=model_id)
            return text
        assert failure is not None  # noqa: S101 - refs is never empty
        raise failure

    # ------------------------------------------------------------------ tool calls

    async def run_calls(self, run: AgentRun, calls: Sequence[ToolCall], limits: Limits) -> None:  # noqa: C901, PLR0912
        """Run the calls of one assistant message and end the segment if the turn says so."""
        inst = run.inst
        defn = inst.definition
        turn = inst.turn
        items = [_Call(i, c) for i, c in enumerate(calls)]
        for item in items[MAX_CALLS_PER_REPLY:]:
            item.result = _result(item.call, ToolStatus.SKIPPED,
                                  f"skipped: only {MAX_CALLS_PER_REPLY} tool calls are taken from one reply")
        active = items[:MAX_CALLS_PER_REPLY]
        for item in active:
            await self._prepare(run, item, turn)
        if defn.approval_policy == "holdTurn" and any(i.held for i in active):
            for item in active:
                if item.result is None and not item.held:
                    item.held = "held with its turn (approvalPolicy: holdTurn)"
        runnable = [i for i in active if i.result is None and not i.held]
        exceeded = False
        room, which = self.tool_room(inst, limits)
        if room is not None:
            for item in runnable[room:]:
                item.result = _result(item.call, ToolStatus.SKIPPED, f"skipped: {which} was reached")
                exceeded = True
            runnable = runnable[:room]
        for item in items:
            if item.result is not None:
                await self._finish(run, item, turn, save=True)
        if len(runnable) > 1 and all(i.tool.parallel_safe for i in runnable if i.tool):
            limiter = anyio.CapacityLimiter(MAX_CONCURRENT_CALLS)

            async def worker(item: _Call) -> None:
                async with limiter:
                    await self._execute(run, item, turn)

            async with anyio.create_task_group() as tg:
                for item in runnable:
                    tg.start_soon(worker, item)
        else:
            for item in runnable:
                await self._execute(run, item, turn)
        # The transcript gets the results in call order, whatever order they finished in.
        for item in items:
            if item.result is not None:
                inst.transcript.append(_tool_message(item))
        await self.rt.flush_records(inst.id)
        await self._end_of_turn(run, items, exceeded or any(i.over_limit for i in items), limits)

    async def _end_of_turn(self, run: AgentRun, items: Sequence[_Call], exceeded: bool, limits: Limits) -> None:
        inst = run.inst
        held = [i for i in items if i.held]
        awaiting = next((i for i in items if i.awaiting_user), None)
        if awaiting is not None:
            inst.header["awaitingAnswer"] = {"toolCallId": awaiting.call.id,
                                             "question": awaiting.call.arguments.get("question")}
        if held:
            at = now_iso()
            inst.set_pending([*inst.pending_approvals, *(PendingApproval(
                tool_call_id=i.call.id, tool=i.call.name, arguments=dict(i.call.arguments), reason=i.held or "",
                requested_at=at) for i in held)])
            for i in held:
                self.record(inst, "approval", {"toolCallId": i.call.id, "tool": i.call.name,
                                               "reason": i.held, "decision": None})
                await self.emit(run, "approval", inst.turn, toolCallId=i.call.id, tool=i.call.name, reason=i.held)
            # The wait for a person is not the agent's time: the elapsed limit skips it.
            inst.header["pausedAt"] = time.time()
            raise SegmentEnd(State.WAITING_FOR_APPROVAL, StopReason.WAITING_FOR_APPROVAL)
        ender = next((i for i in items if i.result is not None and i.result.status is ToolStatus.SUCCESS
                      and i.tool is not None and i.tool.ends_loop), None)
        if ender is not None:
            if inst.definition.completion is not None and await self._completion_gate(run, limits):
                return
            data = ender.result.data if ender.result else None
            if isinstance(data, Mapping) and "result" in data:
                inst.header["text"] = str(data["result"])
                inst.header["output"] = dict(data)
            elif ender.result is not None:
                inst.header["text"] = ender.result.content
            raise SegmentEnd(State.STOPPED, StopReason.COMPLETED)
        if awaiting is not None or inst.header.get("awaitingAnswer"):
            raise SegmentEnd(State.WAITING, StopReason.WAITING)
        if exceeded:
            _room, which = self.tool_room(inst, limits)
            raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="toolCalls",
                             error=f"{which or 'the tool-call limit'} reached")

    async def _prepare(self, run: AgentRun, item: _Call, turn: int) -> None:  # noqa: C901, PLR0911, PLR0912 - one exit per status
        """Validate a call and run before_tool_call; fill ``result`` or ``held`` when decided."""
        inst = run.inst
        call = item.call
        tool = self.rt.tool_for(inst.definition, call.name, inst.grants)
        item.tool = tool
        if tool is None:
            names = ", ".join(self.rt.tool_names(inst.definition, inst.grants)) or "(none)"
            item.result = _result(call, ToolStatus.UNKNOWN_TOOL,
                                  f"unknown tool {call.name!r}. The tools you have: {names}")
            return
        if call.raw_arguments is not None:
            item.result = _result(call, ToolStatus.INVALID_ARGUMENTS,
                                  f"the arguments are not a valid JSON object: {call.raw_arguments[:500]}\n"
                                  f"(plain JSON only: NaN, Infinity and nesting deeper than {MAX_ARGUMENT_DEPTH} "
                                  "levels are refused)")
            return
        problems = tool.validation_errors(call.arguments)
        if problems:
            item.result = _result(call, ToolStatus.INVALID_ARGUMENTS, "invalid arguments: " + "; ".join(problems))
            return
        impls = self.rt.hook_impls(inst.definition, "loopwright_before_tool_call")
        if impls:
            outcome = await intercept(
                impls, {"call": call, "tool": tool, "instance": self._info(inst), "turn": turn},
                hook="before_tool_call", allowed=(ModifyInputs, Block, RequireApproval, Respond),
                modify={ModifyInputs: lambda v, d: v.__setitem__(
                    "call", attrs.evolve(v["call"], arguments=dict(d.arguments)))})
            self._hook_records(inst, "before_tool_call", outcome.decisions, turn)
            if outcome.values["call"] is not call:
                call = item.call = outcome.values["call"]
                problems = tool.validation_errors(call.arguments)
                if problems:
                    item.result = _result(call, ToolStatus.INVALID_ARGUMENTS,
                                          "invalid arguments (after a hook changed them): " + "; ".join(problems))
                    return
            stop = outcome.stop
            if isinstance(stop, Block):
                item.result = _result(call, ToolStatus.BLOCKED, f"blocked: {stop.reason}")
                return
            if isinstance(stop, Respond):
                item.result = _success(call, stop.content, None)
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
        timeout = timeout or tool.timeout or self.rt.limits_for(inst.definition).tool_timeout or 60.0
        return ToolContext(
            instance_id=inst.id, tool_call_id=call.id, grants=inst.grants, base_dir=self.rt.assembly.base_dir,
            store_locations=tuple(self.store.locations()), shell_approver=self.rt.shell_approver,
            timeout=timeout, agents=Agents(self.rt, inst, call.id, timeout))

    def _draw_tool_call(self, inst: Instance) -> str | None:
        """Count one tool call toward ``inst`` and its tree, or return the limit that has no room for it.

        Checked and charged in one step (no await between): the calls of agents running in
        parallel cannot all pass the check before any of them is counted.
        """
        room, which = self.tool_room(inst, self.rt.limits_of(inst))
        if room is not None and room <= 0:
            return which
        inst.seg_tool_calls += 1
        inst.tool_calls += 1
        if inst.spawner is not None:
            for above in inst.ancestors():
                above.tree_tool_calls += 1
        return None

    async def _execute(self, run: AgentRun, item: _Call, turn: int) -> None:  # noqa: C901 - one exit per outcome
        """Run the tool of a prepared call, count it, and finish it (hooks, save, record)."""
        inst = run.inst
        tool = item.tool
        call = item.call
        assert tool is not None  # noqa: S101 - prepared calls have their tool
        over = self._draw_tool_call(inst)
        if over is not None:
            item.result = _result(call, ToolStatus.SKIPPED, f"skipped: {over} was reached")
            item.over_limit = True
            await self._finish(run, item, turn, save=True)
            return
        inst.started_calls.add(call.id)
        # Saved before the tool runs: after a crash, a call with this marker and no result may
        # have had its effect; a call without it never started and can simply run.
        await self.store.append_entries(inst.id, [{"t": "start", "id": call.id}])
        await self.emit(run, "tool_call", turn, id=call.id, name=call.name, arguments=dict(call.arguments))
        timeout = tool.timeout or self.rt.limits_for(inst.definition).tool_timeout or 60.0
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
            item.result = _result(call, ToolStatus.TIMEOUT, f"timeout: the tool took longer than {timeout:g} s",
                                  duration=time.perf_counter() - t0)
        except ToolCallDenied as exc:
            item.result = _result(call, ToolStatus.DENIED, f"denied: {exc}", duration=time.perf_counter() - t0)
        except ToolError as exc:
            item.result = _result(call, ToolStatus.TOOL_ERROR, str(exc), duration=time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - a failing tool never ends the run
            item.result = _result(call, ToolStatus.TOOL_FAILED, f"{type(exc).__name__}: {exc}",
                                  duration=time.perf_counter() - t0)
        else:
            if isinstance(value, AwaitUser):
                item.awaiting_user = True
                return
            item.result = _success(call, value, time.perf_counter() - t0)
        await self._finish(run, item, turn, save=True)

    async def _finish(self, run: AgentRun, item: _Call, turn: int, *, save: bool) -> None:
        """Run after_tool_call on a result, then save it and write its record."""
        inst = run.inst
        result = item.result
        assert result is not None  # noqa: S101
        impls = self.rt.hook_impls(inst.definition, "loopwright_after_tool_call")
        if impls:
            outcome = await intercept(
                impls, {"call": item.call, "result": result, "instance": self._info(inst), "turn": turn},
                hook="after_tool_call", allowed=(ModifyResult, Block),
                modify={ModifyResult: lambda v, d: v.__setitem__(
                    "result", attrs.evolve(v["result"], content=_cut(d.content)))})
            self._hook_records(inst, "after_tool_call", outcome.decisions, turn)
            result = outcome.values["result"]
            if isinstance(outcome.stop, Block):
                result = attrs.evolve(result, status=ToolStatus.BLOCKED, content=f"blocked: {outcome.stop.reason}",
                                      data=None)
            item.result = result
        entries: list[dict[str, Any]] = [{"t": "msg", "m": message_to_json(_tool_message(item))}]
        data: dict[str, Any] = {"turn": turn, "toolCallId": result.tool_call_id, "tool": result.name,
                                "status": result.status.value}
        if result.duration is not None:
            data["duration"] = round(result.duration, 6)
        if result.usage is not None or result.cost is not None:
            usage = result.usage or Usage()
            cost = result.cost or Cost(amount=0.0)
            inst.spend(usage, cost)
            data["usage"] = _usage_unstructure(usage)
            data["cost"] = cost.amount
            entries[0]["spend"] = {"usage": data["usage"], "cost": cost.amount}
        if save:
            await self.save(inst, entries)
        if item.call.injected:
            data["injected"] = True
        if result.status is not ToolStatus.SUCCESS:
            data["error"] = result.content[:1000]
        self.record(inst, "tool_call", data)
        await self.emit(run, "tool_result", turn, id=result.tool_call_id, name=result.name,
                        status=result.status.value, content=result.content)

    # ------------------------------------------------------------------ approvals and answers

    async def continue_after_decisions(self, run: AgentRun) -> None:
        """Give every decided held call its result (approved ones run), then go on with the turn."""
        inst = run.inst
        pending = _take_decisions(inst)
        _assistant, unanswered = unanswered_calls(inst.transcript)
        by_id = {p.tool_call_id: p for p in pending}
        items: list[_Call] = []
        limits = self.rt.limits_of(inst)
        exceeded = False
        for index, call in enumerate(unanswered):
            p = by_id.get(call.id)
            if p is None:
                continue
            item = _Call(index, call, tool=self.rt.tool_for(inst.definition, call.name, inst.grants))
            self.record(inst, "approval", {"toolCallId": call.id, "tool": call.name, "decision": p.decision,
                                           "reason": p.decision_reason,
                                           **({"by": p.decided_by} if p.decided_by is not None else {})})
            exceeded = await self._decided(run, item, p, limits) or exceeded
            if item.result is not None:
                inst.transcript.append(_tool_message(item))
            items.append(item)
        _restore_call_order(inst)
        await self.rt.write_header(inst)
        await self.rt.flush_records(inst.id)
        await self._end_of_turn(run, items, exceeded=exceeded or any(i.over_limit for i in items), limits=limits)

    async def _decided(self, run: AgentRun, item: _Call, decision: PendingApproval, limits: Limits) -> bool:
        """Give a decided held call that has not started its result: run it if approved, else ``denied``.

        :return: Whether a tool-call limit left no room for an approved call (it is ``skipped``).
        """
        inst = run.inst
        call = item.call
        approved = decision.decision == "approved" and item.tool is not None
        room, which = self.tool_room(inst, limits) if approved else (None, "")
        if room is not None and room <= 0:
            item.result = _result(call, ToolStatus.SKIPPED, f"skipped: {which} was reached")
            await self._finish(run, item, inst.turn, save=True)
            return True
        if approved:
            await self._execute(run, item, inst.turn)
        else:
            why = decision.decision_reason or "no reason given"
            item.result = _result(call, ToolStatus.DENIED, f"denied: {why}")
            await self._finish(run, item, inst.turn, save=True)
        return False

    async def answer_question(self, run: AgentRun, text: str) -> None:
        """Make ``text`` the result of the pending ``ask_user`` call."""
        inst = run.inst
        awaiting = inst.header.pop("awaitingAnswer", None) or {}
        call_id = awaiting.get("toolCallId")
        message = Message(role="tool", tool_call_id=call_id, name="ask_user", content=text,
                          status=ToolStatus.SUCCESS)
        await self.add_message(run, message)
        self.record(inst, "tool_call", {"turn": inst.turn, "toolCallId": call_id, "tool": "ask_user",
                                        "status": ToolStatus.SUCCESS.value, "answered": True})

    async def repair_records(self, run: AgentRun) -> None:
        """Write the ``turn`` and ``tool_call`` records a dead runner saved the entries of but not the records.

        Records are queued in memory and written once a turn, and before the header says the
        instance rests, after the entries they describe: a process killed in between loses the
        records of its last turn while the entries stay. So a runner that takes over a dead
        runner's instance (:meth:`loopwright.Runtime.resume`, a worker's ``resume``, a message
        or a cancel that finds its runner dead) calls this first: each answer of the current
        segment whose turn has no ``turn`` record, and each tool result without a ``tool_call``
        record, gets one built from the entry log (marked ``repaired: true``), so that the
        records always add up to the instance's turns, tokens and tool calls. It reads the whole
        record log, once per take-over.
        """
        inst = run.inst
        entries = await self.store.read_entries(inst.id)
        start = max((n for n, e in enumerate(entries) if e.get("t") == "seg"), default=-1) + 1
        records = await self.store.read_records(inst.id)
        turns = {r["data"].get("turn") for r in records if r.get("kind") == "turn" and isinstance(r.get("data"), dict)}
        calls = {r["data"].get("toolCallId") for r in records
                 if r.get("kind") == "tool_call" and isinstance(r.get("data"), dict)}
        turn = next((int(e["turn"].get("n", 0)) for e in reversed(entries[:start])
                     if e.get("t") == "msg" and isinstance(e.get("turn"), dict)), 0)
        repaired = 0
        for entry in entries[start:]:
            m = entry.get("m")
            if entry.get("t") != "msg" or not isinstance(m, dict):
                continue
            spent = entry.get("turn")
            if isinstance(spent, dict):
                turn = int(spent.get("n", turn + 1))
                if turn not in turns:
                    turns.add(turn)
                    repaired += 1
                    self.record(inst, "turn", {
                        "turn": turn, "model": spent.get("model"), "usage": spent.get("usage") or {},
                        "cost": spent.get("cost"), "toolCalls": len(m.get("toolCalls") or []), "repaired": True})
            elif m.get("role") == "tool" and m.get("toolCallId") not in calls:
                calls.add(m.get("toolCallId"))
                repaired += 1
                data: dict[str, Any] = {"turn": turn, "toolCallId": m.get("toolCallId"), "tool": m.get("name"),
                                        "status": m.get("status") or ToolStatus.SUCCESS.value, "repaired": True}
                extra = entry.get("spend")
                if isinstance(extra, dict):
                    data["usage"], data["cost"] = extra.get("usage") or {}, extra.get("cost")
                if data["status"] != ToolStatus.SUCCESS.value:
                    data["error"] = str(m.get("content") or "")[:1000]
                self.record(inst, "tool_call", data)
        if repaired:
            await self.rt.flush_records(inst.id)

    async def repair_interrupted(self, run: AgentRun) -> None:  # noqa: C901, PLR0912 - one case per way a call was left
        """Give each call a dead process left without a result one, in call order.

        A call that never started runs now. A call that started may have had its effect:
        idempotent tools run again, for the others the model is told the outcome is unknown.

        A held call that a person decided is one of them: the decision was saved before the
        segment went on, so a dead runner may have left it unstarted (it runs if approved, gets
        its ``denied`` result if not), in flight (interrupted like any call: approval was given),
        or answered. Every decision is taken off the header's pending approvals here; only
        undecided held calls stay there, without a result. Likewise a question whose answer is
        saved is answered (see :func:`_settle_answered_question`): it is never answered twice.
        """
        inst = run.inst
        _settle_answered_question(inst)
        decided = {p.tool_call_id: p for p in inst.pending_approvals if p.decision is not None}
        if decided:
            undecided = [p for p in _take_decisions(inst) if p.decision is None]
            inst.set_pending(undecided)
        _assistant, unanswered = unanswered_calls(inst.transcript)
        if not unanswered:
            return
        skip = {p.tool_call_id for p in inst.pending_approvals}
        awaiting = (inst.header.get("awaitingAnswer") or {}).get("toolCallId")
        limits = self.rt.limits_of(inst)
        for index, call in enumerate(unanswered):
            if call.id in skip or call.id == awaiting:
                continue
            item = _Call(index, call)
            decision = decided.get(call.id)
            if decision is not None and (call.id not in inst.started_calls or decision.decision != "approved"):
                item.tool = self.rt.tool_for(inst.definition, call.name, inst.grants)
                await self._decided(run, item, decision, limits)
            elif call.id not in inst.started_calls:
                await self._prepare(run, item, inst.turn)
                if item.result is None and item.held is None:
                    await self._execute(run, item, inst.turn)
                elif item.result is not None:
                    await self._finish(run, item, inst.turn, save=True)
                else:
                    self.record(inst, "error", {"message": f"call {call.id} needs approval after a restart"})
                    item.result = _result(call, ToolStatus.DENIED, "denied: the call needs approval and the "
                                          "process that held it stopped; ask again if it is still needed")
                    await self._finish(run, item, inst.turn, save=True)
            elif item.tool is None and (tool := self.rt.tool_for(inst.definition, call.name, inst.grants)) is not None \
                    and tool.idempotent:
                item.tool = tool
                await self._execute(run, item, inst.turn)
            else:
                item.result = _result(call, ToolStatus.UNKNOWN_OUTCOME,
                                      "the call was interrupted (the process stopped while it ran); "
                                      "its outcome is unknown. Check before calling it again.")
                await self._finish(run, item, inst.turn, save=True)
            if item.result is not None:
                inst.transcript.append(_tool_message(item))
            elif item.awaiting_user:
                run.awaiting_after_repair.add(call.id)
        _restore_call_order(inst)

    async def settle_cancelled(self, run: AgentRun) -> None:
        """Give each call still without a result one, as the instance stops cancelled; run nothing.

        A cancel ends the calls of the last turn where they stand: one that started (its start
        marker is saved) may have had its effect, so the model is told its outcome is unknown;
        one that never started, one held for approval and a question still waiting for its
        answer are skipped. Held calls leave the header's pending approvals, and the question
        leaves ``awaitingAnswer``. So a cancelled instance rests with every call answered once,
        and a message that continues it later starts from a whole transcript.
        """
        inst = run.inst
        # The log is the truth: calls cut off mid-batch saved their results there, not yet in
        # the transcript in memory (a batch's results join it together, in call order).
        rebuild(inst, await self.store.read_entries(inst.id))
        _settle_answered_question(inst)
        asked = (inst.header.get("awaitingAnswer") or {}).get("toolCallId")
        _assistant, unanswered = unanswered_calls(inst.transcript)
        for index, call in enumerate(unanswered):
            item = _Call(index, call)
            if call.id == asked or call.name == "ask_user":  # asked, or about to be: no answer came
                item.result = _result(call, ToolStatus.SKIPPED,
                                      "skipped: the instance was cancelled before the question was answered")
            elif call.id in inst.started_calls:
                item.result = _result(call, ToolStatus.UNKNOWN_OUTCOME,
                                      "the call was interrupted (the instance was cancelled while it ran); "
                                      "its outcome is unknown. Check before calling it again.")
            else:
                item.result = _result(call, ToolStatus.SKIPPED, "skipped: the instance was cancelled")
            await self._finish(run, item, inst.turn, save=True)
            inst.transcript.append(_tool_message(item))
        if inst.pending_approvals:
            inst.set_pending([])
        inst.header.pop("awaitingAnswer", None)
        _restore_call_order(inst)

    async def finish_interrupted_turn(self, run: AgentRun) -> None:  # noqa: C901 - one case per way a turn ends
        """After a crash, end the last turn the way the dead process would have.

        Called on resume, after :meth:`repair_interrupted`. If the transcript ends with an answer
        without tool calls, the segment rests as it would have (``waiting``, after the output
        check and the completion gate) instead of asking the model again; unless the header's
        queue holds mail to give, which means the dead segment began for that mail and never
        reached its first turn: the loop goes on, and gives it. If it ends with the
        results of a turn's calls, the turn's end is applied: a successful ``task_complete`` (or
        other loop-ending tool) completes the instance, an unanswered ``ask_user`` waits. Otherwise
        the loop goes on with the next model call.
        """
        inst = run.inst
        messages = inst.transcript
        if not messages:
            return
        last = messages[-1]
        limits = self.rt.limits_of(inst)
        if last.role == "assistant" and not last.tool_calls and _mail_to_give(inst):
            # The dead runner's segment began for mail it had read into the header's queue but not
            # yet given to the model (its first turn boundary gives it): this answer is the segment
            # before's, which rested. The turns go on, and the first one gives the mail.
            return
        if last.role == "assistant" and not last.tool_calls:
            if inst.definition.output is not None and await self._output_rejected(run, last):
                return
            if await self._completion_gate(run, limits):
                return
            raise SegmentEnd(State.WAITING, StopReason.WAITING)
        assistant, unanswered = unanswered_calls(messages)
        if assistant is None or (unanswered and not run.awaiting_after_repair):
            return
        results = {m.tool_call_id: m for m in messages[messages.index(assistant) + 1:] if m.role == "tool"}
        items: list[_Call] = []
        for index, call in enumerate(assistant.tool_calls):
            item = _Call(index, call, tool=self.rt.tool_for(inst.definition, call.name, inst.grants))
            m = results.get(call.id)
            if m is not None:
                data = None
                if m.status is ToolStatus.SUCCESS and item.tool is not None and item.tool.ends_loop:
                    try:
                        data = json.loads(m.content or "null")
                    except ValueError:
                        data = m.content
                item.result = ToolResult(tool_call_id=call.id, name=call.name, status=m.status or ToolStatus.SUCCESS,
                                         content=m.content or "", data=data)
            elif call.id in run.awaiting_after_repair:
                item.awaiting_user = True
            items.append(item)
        run.awaiting_after_repair = set()
        await self._end_of_turn(run, items, exceeded=False, limits=limits)


def _elapsed_scope(budgets: Sequence[tuple[Instance, Limits]]) -> anyio.CancelScope:
    """Return a cancel scope whose deadline is the first end of an ``elapsed`` limit in ``budgets``.

    ``budgets`` are the instance's own limits and its ancestors' (:meth:`Loop.budgets`), so a
    call in a child also ends when an ancestor's tree runs out of time. Each clock starts at its
    owner's ``segmentStartedAt``; the waits for approval are left out of it
    (:meth:`Loop.continue_after_decisions` moves that start on by them). No limit, no deadline.
    """
    ends = [float(owner.header.get("segmentStartedAt") or time.time()) + owned.elapsed
            for owner, owned in budgets if owned.elapsed is not None]
    if not ends:
        return anyio.CancelScope()
    return anyio.CancelScope(deadline=anyio.current_time() + min(ends) - time.time())


def _elapsed_reached(budgets: Sequence[tuple[Instance, Limits]]) -> SegmentEnd:
    """Return the end of a segment whose call the elapsed deadline cut off, naming whose limit it was."""
    inst = budgets[0][0]
    ends = [(float(owner.header.get("segmentStartedAt") or time.time()) + owned.elapsed, owner, owned)
            for owner, owned in budgets if owned.elapsed is not None]
    _end, owner, owned = min(ends, key=lambda e: e[0])
    whose = _of_ancestor(owner) if owner is not inst else ""
    return SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="elapsed",
                      error=f"elapsed-time limit ({owned.elapsed:g} s){whose} reached")


def _mail_to_give(inst: Instance) -> bool:
    """Whether the header's queue (``inbox``) holds messages the next turn boundary gives the model.

    The rule of :meth:`Loop._drain_inbox`: every queued message, unless a question waits for its
    answer, when only a message from ``api`` or ``user`` (not the task prompt behind a held turn) is.
    """
    queue = inst.header.get("inbox") or []
    if inst.header.get("awaitingAnswer"):
        return any(m.get("source") in ("api", "user") and not m.get("behindTurn") for m in queue)
    return bool(queue)


def _settle_answered_question(inst: Instance) -> None:
    """Make the header agree with a saved answer to its ``ask_user``.

    The answer (the call's result) is appended before the header forgets the question and the
    message that answered it, so a dead runner may leave a header still ``awaitingAnswer``, the
    message still queued in ``inbox`` or unread in the mailbox (read into ``inbox`` when the next
    segment starts). The log is the truth: the question is answered, and the first message that
    may answer it (the one :meth:`Loop._drain_inbox` took) leaves the queue if it is that answer.
    """
    call_id = (inst.header.get("awaitingAnswer") or {}).get("toolCallId")
    answer = next((m for m in inst.transcript if m.role == "tool" and m.tool_call_id == call_id), None)
    if call_id is None or answer is None:
        return
    inst.header.pop("awaitingAnswer")
    queue: list[dict[str, Any]] = inst.header.get("inbox") or []
    first = next((m for m in queue if m.get("source") in ("api", "user") and not m.get("behindTurn")), None)
    if first is not None and str(first.get("text", "")) == (answer.content or ""):
        queue.remove(first)


def _take_decisions(inst: Instance) -> list[PendingApproval]:
    """Take the held calls off ``inst``'s header and restart its elapsed clock; return them.

    The time the instance waited for a person is not its own: the segment's start moves on by
    the pause (``pausedAt``), whether the decision goes on now or a resume after a crash does.
    """
    paused = inst.header.pop("pausedAt", None)
    if paused is not None and inst.header.get("segmentStartedAt"):
        inst.header["segmentStartedAt"] = float(inst.header["segmentStartedAt"]) + max(time.time() - paused, 0.0)
    pending = inst.pending_approvals
    inst.set_pending([])
    return pending


def _restore_call_order(inst: Instance) -> None:
    """Put the results after the last assistant message back in its call order (after late results)."""
    messages = inst.transcript
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.role == "assistant":
            if not m.tool_calls:
                return
            tail = list(messages[i + 1:])
            ordered = sorted(tail, key=functools.partial(_position, {c.id: k for k, c in enumerate(m.tool_calls)}))
            if ordered != tail:
                messages.replace_tail(i + 1, ordered)
            return
        if m.role != "tool":
            return


def parse_output(text: str | None, validator: Any) -> Any:
    """Parse a structured answer and validate it; return the value or a list of problems (strings).

    A Markdown code fence around the JSON is tolerated. Problems read like ``n: 'three' is not of
    type 'integer'``.
    """
    if not text or not text.strip():
        return ["the answer is empty; a JSON value is required"]
    raw = text.strip()
    if raw.startswith("```"):
        raw = raw.split("\n", 1)[1] if "\n" in raw else raw[3:]
        raw = raw.rsplit("```", 1)[0]
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return [f"the answer is not valid JSON ({exc})"]
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    if not errors:
        return _Parsed(value)
    return [f"{'.'.join(str(p) for p in e.path) or '(answer)'}: {e.message}" for e in errors]


def _position(order: Mapping[str, int], message: Message) -> int:
    """Sort key: tool results by their call's position, anything else after them."""
    if message.role == "tool":
        return order.get(message.tool_call_id or "", 1 << 30)
    return 1 << 31


def _of_ancestor(owner: Instance) -> str:
    return f" of agent {owner.id}, which started this one (directly or not),"


def _check_budget(owner: Instance, limits: Limits, whose: str) -> None:
    """Raise SegmentEnd if ``owner``'s tree has used up its ``tokens``, ``cost`` or ``elapsed`` limit."""
    if limits.tokens is not None or limits.cost is not None:
        tokens, cost, _calls = owner.spent()
        if limits.tokens is not None and tokens >= limits.tokens:
            raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="tokens",
                             error=f"token limit ({limits.tokens}){whose} reached: {tokens} tokens used")
        if limits.cost is not None:
            if cost is None:
                raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="cost",
                                 error=f"cost limit{whose} set but the price of a model used is unknown")
            if cost >= limits.cost:
                raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="cost",
                                 error=f"cost limit ({limits.cost}){whose} reached: {cost:.6f} spent")
    if limits.elapsed is not None:
        started = float(owner.header.get("segmentStartedAt") or time.time())
        if time.time() - started >= limits.elapsed:
            raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="elapsed",
                             error=f"elapsed-time limit ({limits.elapsed:g} s){whose} reached")


def _one_request(usage: Usage) -> Usage:
    """Return the usage of a call whose provider did not count it (``requests`` 0): one request.

    Without token counts it is also one ``unreported_requests``, so its cost is unknown, not 0.
    """
    counted = bool(usage.input_tokens or usage.output_tokens)
    return attrs.evolve(usage, requests=1, unreported_requests=usage.unreported_requests or int(not counted))


def _unique_ids(calls: Sequence[ToolCall], turn: int) -> tuple[ToolCall, ...]:
    seen: set[str] = set()
    out = []
    for k, c in enumerate(calls):
        if not c.id or c.id in seen:
            c = attrs.evolve(c, id=f"call_{turn}_{k}")  # noqa: PLW2901
        seen.add(c.id)
        out.append(c)
    return tuple(out)


def _strict_arguments(calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    """Move arguments that are not plain JSON (NaN, infinity, too deep) to ``raw_arguments``.

    Whatever the provider decoded, the transcript then holds only JSON it can write and read back
    without recursing, and the call gets ``invalid_arguments``.
    """
    return tuple(
        ToolCall(id=c.id, name=c.name, arguments={}, raw_arguments=dumps_for_raw(c.arguments), injected=c.injected)
        if c.raw_arguments is None and argument_problem(c.arguments) else c
        for c in calls)


def _cut(content: str) -> str:
    if len(content) <= MAX_RESULT_CHARS:
        return content
    return (content[:MAX_RESULT_CHARS]
            + f"\n[truncated: the result had {len(content):,} characters; only the first "
              f"{MAX_RESULT_CHARS:,} are shown]")


def _result(call: ToolCall, status: ToolStatus, content: str, *, duration: float | None = None) -> ToolResult:
    return ToolResult(tool_call_id=call.id, name=call.name, status=status, content=_cut(content),
                      duration=duration)


def _success(call: ToolCall, value: Any, duration: float | None) -> ToolResult:
    if isinstance(value, ToolOutput):
        inner = _success(call, value.value, duration)
        return attrs.evolve(inner, usage=value.usage, cost=value.cost)
    if isinstance(value, str):
        text = value
    elif value is None:
        text = ""
    else:
        try:
            text = _dumps(_plain.unstructure(value))
        except (TypeError, ValueError):
            text = str(value)
    return ToolResult(tool_call_id=call.id, name=call.name, status=ToolStatus.SUCCESS, content=_cut(text),
                      data=value, duration=duration)


def _tool_message(item: _Call) -> Message:
    r = item.result
    assert r is not None  # noqa: S101
    return Message(role="tool", tool_call_id=r.tool_call_id, name=r.name, content=r.content, status=r.status,
                   injected=item.call.injected)


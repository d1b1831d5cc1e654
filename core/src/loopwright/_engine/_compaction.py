"""Compaction: run the definition's context strategy when its trigger holds, and its summary calls.

A summary call goes through the same model gateway as a turn (:class:`loopwright._engine._gateway.Gateway`):
the same retries, fallbacks and prices.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from loopwright._engine._common import usage_json
from loopwright._engine._limits import elapsed_reached, elapsed_scope
from loopwright._hooks import intercept
from loopwright._instance import message_to_json
from loopwright._types import Cost, Message, ModelRequest, Usage
from loopwright.abc import CompactionContext
from loopwright.builtins.context import render_transcript
from loopwright.errors import ProviderError

if TYPE_CHECKING:
    from loopwright._engine._deps import EngineDeps, SegmentRun
    from loopwright._engine._gateway import Gateway
    from loopwright._engine._journal import Journal
    from loopwright._engine._limits import Budgets
    from loopwright._instance import Instance
    from loopwright.abc import ContextStrategy

__all__ = ["Compactor"]


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
        return {"usage": usage_json(usage), "cost": self.cost.amount, "model": ", ".join(self.models)}


class Compactor:
    """Applies an instance's context strategy to its transcript."""

    def __init__(self, deps: EngineDeps, journal: Journal, gateway: Gateway, budgets: Budgets) -> None:
        """Call summary models through ``gateway``, under the elapsed limits of ``budgets``."""
        self.deps = deps
        self.journal = journal
        self.gateway = gateway
        self.budgets = budgets

    async def compact(self, run: SegmentRun, strategy: ContextStrategy) -> bool:
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
        journal = self.journal
        last = None if inst.context_tokens is None else Usage(input_tokens=inst.context_tokens)
        if not strategy.should_apply(inst.transcript, last_usage=last, context_window=None):
            return False
        impls = self.deps.hook_impls(inst.definition, "loopwright_before_compaction")
        if impls:
            outcome = await intercept(
                impls, {"instance": journal.info(inst), "strategy": strategy.kind, "messages": inst.transcript},
                hook="before_compaction", modify={})
            journal.hook_records(inst, "before_compaction", outcome.decisions, inst.turn)
            if outcome.stop is not None:
                return False
        spent = _Spent()
        context = CompactionContext(model=self.deps.model_ref(inst.definition), turn=inst.turn,
                                    summarize=functools.partial(self.summarize, run, spent))
        before = len(inst.transcript)
        data: dict[str, Any] = {"strategy": strategy.kind, "turn": inst.turn, "before": before}
        failure: ProviderError | None = None
        kept: list[Message] = []
        budgets = self.budgets.of(inst, self.deps.limits_of(inst))
        with elapsed_scope(budgets) as scope:  # its summary calls end when an elapsed limit does
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
                await journal.save(inst, [{"t": "spend", **spend}])
            data.update(after=before, error=str(failure) if failure is not None else "elapsed-time limit reached")
            journal.record(inst, "compaction", data)
            if scope.cancelled_caught:
                raise elapsed_reached(budgets)
            return spend is not None
        inst.transcript.replace(kept)
        inst.context_tokens = None  # the latest call's count measured the old transcript
        entry: dict[str, Any] = {"t": "reset", "messages": [message_to_json(m) for m in kept]}
        if spend is not None:
            entry["spend"] = spend
        await journal.save(inst, [entry])
        data["after"] = len(kept)
        journal.record(inst, "compaction", data)
        return spend is not None

    async def summarize(self, run: SegmentRun, spent: _Spent, messages: Sequence[Message], instruction: str,
                        model: str | None) -> str:
        """One summary call for a context strategy (``CompactionContext.summarize``).

        :raises ProviderError: Every model failed, or the one that answered gave no text.
        """
        inst = run.inst
        defn = inst.definition
        own = self.deps.model_ref(defn)
        refs = (model,) if model else (own, *defn.fallback_models)
        sent = (Message(role="system", content=instruction),
                Message(role="user", content=render_transcript(messages)))

        def request_for(_index: int, candidate: str, pname: str, model_id: str) -> ModelRequest:
            # The agent's own model keeps its settings, but no tool is offered to it here.
            settings = {k: v for k, v in defn.model_settings.items() if k != "toolChoice"} if candidate == own else {}
            return ModelRequest(model=model_id, provider=pname, messages=sent, settings=settings)

        response, candidate = await self.gateway.call(run, refs, request_for, marks={"compaction": True})
        usage = response.usage
        cost = self.gateway.price(usage, candidate)
        spent.add(usage, cost, candidate)
        await self.journal.observe(inst, "loopwright_on_cost", turn=inst.turn, usage=usage, cost=cost,
                                   model=candidate)
        text = (response.message.content or "").strip()
        if not text:
            pname, model_id = self.deps.split_model(candidate)
            raise ProviderError("the summary call answered with no text", provider=pname, model=model_id)
        return text

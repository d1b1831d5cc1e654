"""The model gateway: provider -> its stream -> retries -> fallback models -> price.

One path for every model call the engine makes: a turn's (:mod:`loopwright._engine._turn`) and a
context strategy's summary (:mod:`loopwright._engine._compaction`). Each model of the list is
tried in order: its provider is built (a provider that cannot be built is one more failure),
the call is retried ``agentRetry`` times on transient errors, and each failure is recorded
before the next model is tried.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from loopwright._engine._common import one_request
from loopwright._retry import retry_transient
from loopwright.errors import ProviderError

if TYPE_CHECKING:
    from loopwright._engine._deps import EngineDeps, SegmentRun
    from loopwright._engine._journal import Journal
    from loopwright._types import Cost, ModelRequest, ModelResponse, Usage

__all__ = ["Gateway"]

#: ``(index, ref, provider name, model id)``: the request for one model of the list.
RequestFor = Callable[[int, str, str, str], "ModelRequest"]


class Gateway:
    """Calls models for one runtime's instances, and prices what they used."""

    def __init__(self, deps: EngineDeps, journal: Journal) -> None:
        """Reach providers and prices through ``deps``; record failures and stream events through ``journal``."""
        self.deps = deps
        self.journal = journal

    def price(self, usage: Usage, ref: str) -> Cost:
        """Return what ``usage`` of the model ``ref`` (``provider:model``) cost."""
        pname, model_id = self.deps.split_model(ref)
        return self.deps.price(usage, pname, model_id)

    async def call(self, run: SegmentRun, refs: Sequence[str], request_for: RequestFor, *,
                   marks: Mapping[str, Any] | None = None) -> tuple[ModelResponse, str]:
        """Call the first model of ``refs`` that answers; return its answer and its ref.

        A streamed request (``stream``) is consumed by :meth:`stream`. An answer whose provider
        did not count the call gets one request (see :func:`one_request`).

        :param request_for: Builds each model's request (from the one before it, or anew).
        :param marks: Extra keys of each failure's ``error`` record (``compaction`` for a summary).
        :raises ProviderError: The last model's failure, when every one failed.
        """
        inst = run.inst
        retries = self.deps.agent_retries
        extra = marks or {}
        failure: ProviderError | None = None
        for i, candidate in enumerate(refs):
            pname, model_id = self.deps.split_model(candidate)
            try:
                provider = self.deps.provider(pname)
            except Exception as exc:  # noqa: BLE001 - a misconfigured model is one more failure
                failure = ProviderError(str(exc), provider=pname, model=model_id)
                self.journal.record(inst, "error", {"model": candidate, "message": str(failure), **extra})
                continue
            req = request_for(i, candidate, pname, model_id)
            call = (functools.partial(self.stream, run, provider, req) if req.stream
                    else functools.partial(provider.complete, req))
            try:
                response = await (retry_transient(call, max_retries=retries) if retries else call())
            except ProviderError as exc:
                failure = exc
                self.journal.record(inst, "error", {"model": candidate, "message": str(exc), "status": exc.status,
                                                    "transient": exc.transient, **extra})
                continue
            if not response.usage.requests:  # the provider left Usage() as it was
                response = attrs.evolve(response, usage=one_request(response.usage))
            return response, candidate
        assert failure is not None  # noqa: S101 - refs is never empty
        raise failure

    async def stream(self, run: SegmentRun, provider: Any, request: ModelRequest) -> ModelResponse:
        """Consume a provider's stream: text, tool-call starts and argument pieces become events; return the answer."""
        turn = run.inst.turn + 1
        emit = self.journal.emit
        response: ModelResponse | None = None
        if run.streamed_turn == turn:
            # A retry or a fallback after text was already shown: followers start the answer over.
            await emit(run, "stream_reset", turn)
        run.streamed_turn = turn
        deltas = provider.stream(request)
        try:
            async for delta in deltas:
                kind = delta.kind
                if kind == "text" and delta.text:
                    await emit(run, "text_delta", turn, delta=delta.text)
                elif kind == "tool_call":
                    await emit(run, "tool_call_start", turn, id=delta.tool_call_id, name=delta.name)
                elif kind == "arguments" and delta.text:
                    await emit(run, "tool_call_delta", turn, id=delta.tool_call_id, delta=delta.text)
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

"""The checks on a final answer: the definition's ``output`` schema and its completion gate."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from loopwright._engine._common import MAX_INVALID_OUTPUTS, SegmentEnd
from loopwright._types import Message, State, StopReason

if TYPE_CHECKING:
    from loopwright._engine._deps import EngineDeps, SegmentRun
    from loopwright._engine._journal import Journal

__all__ = ["Checks", "parse_output"]


class _Parsed:
    """A structured answer that passed its schema."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Checks:
    """Holds a final answer to its schema and the task to its completion check, re-prompting when they fail."""

    def __init__(self, deps: EngineDeps, journal: Journal) -> None:
        """Find schemas and verifiers through ``deps``; record and re-prompt through ``journal``."""
        self.deps = deps
        self.journal = journal

    async def output_rejected(self, run: SegmentRun, message: Message) -> bool:
        """Check a final answer against the definition's ``output`` schema.

        Return True when it was rejected and the model was asked again. A valid answer is parsed
        into ``AgentResult.output``; after :data:`MAX_INVALID_OUTPUTS` re-prompts the segment
        ends ``output_invalid``.
        """
        inst = run.inst
        problems = self.deps.output_problems(inst.definition, message.content)
        if isinstance(problems, _Parsed):
            inst.header.output = problems.value
            return False
        inst.output_attempts += 1
        self.journal.record(inst, "output", {"attempt": inst.output_attempts, "problems": problems})
        if inst.output_attempts > MAX_INVALID_OUTPUTS:
            raise SegmentEnd(State.ERROR, StopReason.OUTPUT_INVALID,
                             error=f"the answer did not match the output schema {inst.output_attempts} times: "
                                   + "; ".join(problems))
        await self.journal.add_message(run, Message(
            role="user", source="runtime",
            content="Your answer does not match the required output schema: " + "; ".join(problems)
                    + ". Answer again with only a JSON value that matches the schema."))
        return True

    async def completion_gate(self, run: SegmentRun) -> bool:
        """Return True to keep looping (the gate failed and re-prompted)."""
        inst = run.inst
        completion = inst.definition.completion
        if completion is None:
            return False
        inst.completion_attempts += 1
        check: dict[str, Any] = {"attempt": inst.completion_attempts}
        try:  # a verifier that raises, or answers anything but (ok, reason), fails the check (fails closed)
            ok, reason = self.deps.verifier(completion.verify)(inst.transcript)
            if not isinstance(ok, bool):
                raise TypeError(f"it returned {ok!r} for ok, not True or False")  # noqa: TRY301
            reason = str(reason)
        except Exception as exc:  # noqa: BLE001
            ok, reason = False, f"the verifier {completion.verify!r} failed: {type(exc).__name__}: {exc}"
            check["error"] = f"{type(exc).__name__}: {exc}"
        self.journal.record(inst, "completion", {**check, "ok": ok, "reason": reason})
        if ok:
            return False
        if inst.completion_attempts >= completion.max_attempts:
            raise SegmentEnd(State.ERROR, StopReason.LIMIT_EXCEEDED, limit="completion",
                             error=f"completion check failed after {inst.completion_attempts} attempts: {reason}")
        await self.journal.add_message(run, Message(
            role="user", source="runtime",
            content=f"The task is not complete: {reason}. Continue until it is, then finish."))
        return True


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

"""``loopwright memory remember|recall|forget``: long-term memory, for a host or an operator.

Each opens the assembly's runtime and calls its memory (:class:`loopwright.memory.Memory`)
directly: an operator is trusted, so no grant is checked (agents reach memory only through
theirs). ``forget --subject S`` is the "forget me" request: every fact about S, in every
namespace, is removed; what else may still hold S (transcripts, records) is in docs/memory.md.
A bad subject, namespace or fact text is bad input (exit 2).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import click

from loopwright.cli._exits import EXIT_OK, EXIT_USAGE, CliError
from loopwright.cli._opening import runtime, sync
from loopwright.cli._output import echo_json
from loopwright.display import safe_text

if TYPE_CHECKING:
    from collections.abc import Sequence

    from loopwright._runtime import Runtime
    from loopwright.cli._settings import CliSettings
    from loopwright.memory import Memory

__all__ = ["memory_forget", "memory_recall", "memory_remember"]


def _memory(rt: Runtime) -> Memory:
    if rt.memory is None:  # pragma: no cover - an open runtime always has one
        raise CliError("this runtime has no memory")
    return rt.memory


@sync
async def memory_remember(
    settings: CliSettings, subject: str, namespace: str, text: str, expires_in: float | None
) -> int:
    """Remember ``text`` about ``subject`` in ``namespace``; print the fact (its id first)."""
    expires = datetime.now(UTC) + timedelta(seconds=expires_in) if expires_in is not None else None
    async with runtime(settings) as rt:
        try:
            fact = await _memory(rt).remember(subject, namespace, text, expires=expires)
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from exc
        if settings.json:
            echo_json(fact.to_json())
        else:
            click.echo(f"remembered {fact.id} ({safe_text(fact.namespace)})")
        return EXIT_OK


@sync
async def memory_recall(settings: CliSettings, subject: str, namespaces: Sequence[str], query: str, limit: int) -> int:
    """Print the facts about ``subject`` in ``namespaces`` that best match ``query`` (newest first without one)."""
    if not namespaces:
        raise CliError("name at least one --namespace to recall from", EXIT_USAGE)
    async with runtime(settings) as rt:
        try:
            facts = await _memory(rt).recall(subject, namespaces, query, limit=limit)
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from exc
        if settings.json:
            echo_json({"facts": [f.to_json() for f in facts]})
        else:
            for fact in facts:
                click.echo(f"{fact.id}  [{safe_text(fact.namespace)}]  {safe_text(fact.text)}")
        return EXIT_OK


@sync
async def memory_forget(settings: CliSettings, subject: str | None, fact_id: str | None) -> int:
    """Forget every fact about ``subject`` (every namespace), or the one fact ``fact_id``; print how many."""
    if (subject is None) == (fact_id is None):
        raise CliError("give exactly one of --subject and --fact", EXIT_USAGE)
    async with runtime(settings) as rt:
        memory = _memory(rt)
        try:
            if subject is not None:
                removed = await memory.forget(subject)
            else:
                removed = int(await memory.forget_fact(fact_id or ""))
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from exc
        if settings.json:
            echo_json({"forgotten": removed})
        else:
            click.echo(f"forgot {removed} fact{'' if removed == 1 else 's'}")
        return EXIT_OK

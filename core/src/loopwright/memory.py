"""Long-term memory: facts about a subject, kept until they are forgotten or expire (docs/memory.md).

A *fact* is a short text about one *subject* (a person, a tenant) in one *namespace*
(``profile``, ``preferences``, ``tickets`` ...), with the time it was remembered and an optional
expiry. A :class:`Memory` keeps facts and recalls them by lexical ranking; a plugin provides a
kind of it through ``loopwright_register_memories`` (the built-in ``sqlite`` kind keeps them in
one SQLite database with FTS5, :mod:`loopwright.builtins.sqlite_memory`), and the assembly's
``memory:`` picks one.

What an instance may touch is a grant (``capabilities.memory``: one subject, namespaces to read
and to write), narrowed for its children like every grant: see
:func:`loopwright._capabilities.narrow_memory`.

.. versionadded:: 0.3
"""

from __future__ import annotations

import abc
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import attrs

from loopwright._capabilities import MAX_SUBJECT, check_namespace, check_subject

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import TracebackType

__all__ = [
    "MAX_FACT_CHARS",
    "MAX_RECALL",
    "MAX_SUBJECT",
    "Fact",
    "Memory",
    "MemorySettings",
    "check_fact_text",
    "check_namespace",
    "check_subject",
]

#: The longest fact, in characters.
MAX_FACT_CHARS = 4000
#: The most facts one recall returns.
MAX_RECALL = 100


def check_fact_text(text: Any) -> str:
    """Return ``text`` if it can be a fact (1-4000 characters, not only blanks); raise ValueError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a fact is a non-empty text")
    if len(text) > MAX_FACT_CHARS:
        raise ValueError(f"a fact is at most {MAX_FACT_CHARS} characters (this one has {len(text)})")
    return text


@attrs.frozen(kw_only=True)
class Fact:
    """One remembered fact.

    Attributes:
        id: Its id (unique in its memory), what :meth:`Memory.forget_fact` takes.
        subject: Whom it is about.
        namespace: Its namespace.
        text: What is known.
        created: When it was remembered (UTC, ISO 8601, ``...Z``).
        expires: When it expires (same form), or ``None``: it is kept until forgotten. An
            expired fact is never returned.
        score: Its rank in the recall that returned it (higher is better), ``None`` elsewhere.
    """

    id: str
    subject: str
    namespace: str
    text: str
    created: str
    expires: str | None = None
    score: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the fact as JSON-ready data (camelCase keys, as the CLI prints it)."""
        return {
            "id": self.id,
            "subject": self.subject,
            "namespace": self.namespace,
            "text": self.text,
            "created": self.created,
            "expires": self.expires,
            "score": self.score,
        }


@attrs.frozen(kw_only=True)
class MemorySettings:
    """How the assembly configures long-term memory (its ``memory:``).

    Attributes:
        kind: The registered memory kind.
        base_dir: The folder relative paths are resolved against (the assembly's folder).
        options: Every other key of ``memory:``, camelCase as written.
    """

    kind: str
    base_dir: Path
    options: Mapping[str, Any] = attrs.field(factory=dict)


class Memory(abc.ABC):
    """Where facts live: remember, recall (ranked by words), forget.

    Every method checks its arguments (:func:`check_subject`, :func:`check_namespace`,
    :func:`check_fact_text`) and raises ValueError naming the rule broken; grants are the
    caller's business (the runtime checks them before it calls). Building a memory opens
    nothing: the first call does, so a runtime that never uses memory pays nothing for it.

    Use it as an async context manager or call :meth:`aclose`.

    .. versionadded:: 0.3
    """

    @abc.abstractmethod
    async def remember(self, subject: str, namespace: str, text: str, *, expires: datetime | None = None) -> Fact:
        """Keep ``text`` as a fact about ``subject`` in ``namespace`` and return it.

        :param expires: When it expires (an aware datetime); ``None`` keeps it until forgotten.
        :raises ValueError: An argument breaks its rule, or ``expires`` is naive.
        """
        raise NotImplementedError

    @abc.abstractmethod
    async def recall(self, subject: str, namespaces: Sequence[str], query: str = "", *, limit: int = 10) -> list[Fact]:
        """Return up to ``limit`` unexpired facts about ``subject`` in ``namespaces``, best first.

        Facts sharing words with ``query`` rank by lexical relevance (BM25 or the backend's
        like), each with its ``score``; a query without words returns the newest facts. No
        namespace returns nothing.

        :param limit: 1 to :data:`MAX_RECALL`.
        :raises ValueError: An argument breaks its rule.
        """
        raise NotImplementedError

    @abc.abstractmethod
    async def forget(self, subject: str) -> int:
        """Remove every fact about ``subject``, in every namespace, expired or not; return how many.

        This is the "forget me" request: once it returns, no recall finds any of them.
        """
        raise NotImplementedError

    @abc.abstractmethod
    async def forget_fact(self, fact_id: str) -> bool:
        """Remove one fact by id; return whether there was one."""
        raise NotImplementedError

    def locations(self) -> Sequence[Path]:
        """Return the files and folders this memory keeps data in (none by default).

        The runtime refuses grants whose file roots reach any of them, as it does for the
        store: an agent that could write there could forge or read every subject's facts.
        """
        return ()

    async def aclose(self) -> None:  # noqa: B027 - optional to override
        """Release what the memory holds (connections). Idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

"""Built-in plugin: the ``remember`` and ``recall`` tools, the model's hands on long-term memory.

* ``remember {text, namespace?, expiresInDays?}`` keeps a fact about the instance's subject in a
  namespace its grant lets it write (default: the first one).
* ``recall {query, namespaces?, limit?}`` returns the facts about the subject that best match
  the query, from namespaces its grant lets it read (default: all of them).

A definition gets them by listing them in ``tools:``; each is offered only to instances whose
grant holds a subject and a namespace to write (``remember``) or read (``recall``), and each call
is checked against that grant again (:class:`loopwright._memory.MemoryAccess`): a namespace
outside it is a ``tool_error``, never a read or a write. The subject is the grant's: the model
cannot name another.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from loopwright._tools import Tool, ToolContext, tool
from loopwright.errors import CapabilityError, ToolError
from loopwright.hookspecs import hookimpl

if TYPE_CHECKING:
    from loopwright._definition import Capabilities
    from loopwright._memory import MemoryAccess

__all__ = ["MEMORY_TOOLS", "loopwright_register_tools", "recall", "remember"]

#: The longest expiry the ``remember`` tool accepts, in days.
_MAX_DAYS = 3650


def _access(ctx: ToolContext) -> MemoryAccess:
    if ctx.memory is None:
        raise ToolError(
            "long-term memory is not available to this agent (its definition asks for none, "
            "or its grants hold no memory)"
        )
    access: MemoryAccess = ctx.memory
    return access


def _can_write(grants: Capabilities) -> bool:
    return grants.memory.subject is not None and bool(grants.memory.write)


def _can_read(grants: Capabilities) -> bool:
    return grants.memory.subject is not None and bool(grants.memory.read)


async def _remember(  # noqa: D417 - ctx is filled in by the loop, not by the model
    ctx: ToolContext,
    text: str,
    namespace: str | None = None,
    expiresInDays: float | None = None,  # noqa: N803 - the model's name
) -> dict[str, Any]:
    """Remember a fact about the person or tenant you serve, for later conversations.

    Keep each fact short and self-contained ("prefers e-mail to phone calls").

    Args:
        text: The fact.
        namespace: Where to keep it; one of the namespaces you may write (default: the first).
        expiresInDays: Forget it after this many days (default: keep it until it is forgotten).
    """
    access = _access(ctx)
    expires = None
    if expiresInDays is not None:
        if not 0 < expiresInDays <= _MAX_DAYS:
            raise ToolError(f"expiresInDays must be more than 0 and at most {_MAX_DAYS}")
        expires = datetime.now(UTC) + timedelta(days=expiresInDays)
    try:
        fact = await access.remember(text, namespace, expires=expires)
    except (CapabilityError, ValueError) as exc:
        raise ToolError(str(exc)) from exc
    return {"id": fact.id, "namespace": fact.namespace, "expires": fact.expires}


async def _recall(  # noqa: D417 - as above
    ctx: ToolContext,
    query: str,
    namespaces: list[str] | None = None,
    limit: int = 5,
) -> list[dict[str, Any]]:
    """Recall facts remembered about the person or tenant you serve, best matches first.

    Args:
        query: Words to look for.
        namespaces: Where to look; namespaces you may read (default: all of them).
        limit: How many facts at most (1 to 20).
    """
    access = _access(ctx)
    if not 1 <= limit <= 20:  # noqa: PLR2004 - the schema's documented range
        raise ToolError("limit must be from 1 to 20")
    try:
        facts = await access.recall(query, namespaces, limit=limit)
    except (CapabilityError, ValueError) as exc:
        raise ToolError(str(exc)) from exc
    return [{"namespace": f.namespace, "text": f.text, "created": f.created} for f in facts]


remember: Tool = tool(name="remember", available=_can_write)(_remember)
recall: Tool = tool(name="recall", idempotent=True, available=_can_read)(_recall)

#: The memory tools, in the order they are registered.
MEMORY_TOOLS: tuple[Tool, ...] = (remember, recall)


@hookimpl
def loopwright_register_tools(register: Any) -> None:
    """Register ``remember`` and ``recall``."""
    register(*MEMORY_TOOLS)

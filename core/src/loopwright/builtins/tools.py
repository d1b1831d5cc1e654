"""Built-in plugin: the tools every runtime has.

* ``task_complete {result, summary, title?}`` ends the loop as ``completed``.
* ``ask_user {question}`` leaves the instance ``waiting``; the next message from the person or
  host (source ``api`` or ``user``) becomes the call's result.
* ``todowrite {todos: [{id, text, completed}]}`` records the agent's plan; the ``allTodosDone``
  completion verifier reads the latest one.
* the agent tools of :mod:`loopwright.builtins.agent_tools` (``run_agent_async``,
  ``await_agent``, ``message_agent``, ``list_agent_instances``, ``query_agent``).

They register through ``loopwright_register_tools`` exactly as a third party's tools would.
"""

from __future__ import annotations

from typing import Any, TypedDict

from loopwright._tools import Tool, tool
from loopwright.builtins.agent_tools import AGENT_TOOLS
from loopwright.hookspecs import hookimpl

__all__ = ["AWAIT_USER", "ask_user", "task_complete", "todowrite"]


class AwaitUser:
    """Returned by ``ask_user``: the loop holds the call until a person answers."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "AWAIT_USER"


#: The marker ``ask_user`` returns; the loop turns it into a ``waiting`` stop.
AWAIT_USER = AwaitUser()


@tool(ends_loop=True, parallel_safe=True, idempotent=True)
def task_complete(result: str, summary: str, title: str | None = None) -> dict[str, Any]:
    """Finish the task. Call this once the task is done, with the result and a short summary.

    Args:
        result: The outcome of the task, complete enough to be used as is.
        summary: One or two sentences on what was done.
        title: An optional short title for the result.
    """
    out: dict[str, Any] = {"result": result, "summary": summary}
    if title is not None:
        out["title"] = title
    return out


async def _ask_user(question: str) -> AwaitUser:
    """Ask the person a question and wait for the answer. Use it when you cannot go on without them.

    Args:
        question: The question, self-contained.
    """
    del question
    return AWAIT_USER


ask_user: Tool = tool(name="ask_user", idempotent=True)(_ask_user)


class TodoItem(TypedDict):
    """One item of a plan."""

    id: str
    text: str
    completed: bool


@tool(idempotent=True)
def todowrite(todos: list[TodoItem]) -> str:
    """Write down your plan as a checklist, replacing the previous one. Mark items completed as you go.

    Args:
        todos: Every item of the plan, each with an id, its text and whether it is completed.
    """
    done = sum(1 for t in todos if t["completed"])
    return f"plan saved: {done} of {len(todos)} items completed"


@hookimpl
def loopwright_register_tools(register: Any) -> None:
    """Register ``task_complete``, ``ask_user``, ``todowrite`` and the agent tools."""
    register(task_complete, ask_user, todowrite, *AGENT_TOOLS)

"""The decisions an interceptor hook may return (seed 000, "Hooks").

Returning ``None`` means Continue. Which decision each hook may return:

================== ==========================================================
before_inference   :class:`ModifyRequest`, :class:`Block`, :class:`Respond`
after_inference    :class:`ModifyMessage`, :class:`Block`
before_tool_call   :class:`ModifyInputs`, :class:`Block`, :class:`RequireApproval`, :class:`Respond`
after_tool_call    :class:`ModifyResult`, :class:`Block`
before_compaction  :class:`Block`
================== ==========================================================

A Modify decision passes its change to the next hook; the first Block, Respond or
RequireApproval stops the walk. A hook returning a decision its hook point does not allow is
treated as a failure of that hook, and interceptors fail closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from loopwright._types import Message, ModelRequest

__all__ = [
    "Block",
    "Decision",
    "ModifyInputs",
    "ModifyMessage",
    "ModifyRequest",
    "ModifyResult",
    "RequireApproval",
    "Respond",
]


@attrs.frozen(kw_only=True)
class Decision:
    """Base of every decision. ``kind`` names it in ``hook`` records."""

    @property
    def kind(self) -> str:
        """The decision's class name, as written in ``hook`` records."""
        return type(self).__name__


@attrs.frozen
class ModifyRequest(Decision):
    """Replace the model request (before_inference). Applies to this call only.

    Attributes:
        request: The request to send instead.
    """

    request: ModelRequest


@attrs.frozen
class ModifyMessage(Decision):
    """Replace the model's answer before the loop acts on it (after_inference).

    Attributes:
        message: The assistant message to use instead. It is what the transcript keeps.
    """

    message: Message


@attrs.frozen
class ModifyInputs(Decision):
    """Replace a tool call's arguments (before_tool_call). They are validated again.

    Attributes:
        arguments: The arguments to call the tool with.
    """

    arguments: Mapping[str, Any]


@attrs.frozen
class ModifyResult(Decision):
    """Replace what the model sees as a tool's result (after_tool_call).

    Attributes:
        content: The new result text.
    """

    content: str


@attrs.frozen
class Block(Decision):
    """Stop this step.

    before_inference: the run fails with :class:`~loopwright.errors.HookBlockedError`.
    after_inference: the answer is dropped and the run fails the same way.
    before_tool_call: the tool does not run; the model sees an error result (``blocked``) with the reason.
    after_tool_call: the model sees an error result (``blocked``) with the reason instead of the output.
    before_compaction: this compaction is skipped.

    Attributes:
        reason: Why, in words the model or the operator can read.
    """

    reason: str = "blocked by a hook"


@attrs.frozen
class Respond(Decision):
    """Answer without doing the work.

    before_inference: ``content`` becomes the assistant's text and the model is not called.
    before_tool_call: ``content`` becomes the tool's result (status ``success``) and the tool does not run.

    Attributes:
        content: The answer text, or any JSON-ready value for a tool result.
    """

    content: Any = None


@attrs.frozen
class RequireApproval(Decision):
    """Hold this tool call until someone approves or denies it (before_tool_call).

    Attributes:
        reason: Shown with the pending approval.
    """

    reason: str = "a hook requires approval"

"""What the engine needs from the layers above it: :class:`EngineDeps` and the :class:`SegmentRun` protocol.

The loop never sees the :class:`loopwright.Runtime`. The runtime builds one :class:`EngineDeps`
when it opens (``Runtime._engine_deps``) and hands it to :class:`loopwright._engine.Loop`; each
field is exactly one thing the loop uses, as an object or a callable, so a test or another
driver (a Temporal engine) can build the loop from parts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from loopwright._definition import Capabilities, Definition, Limits
    from loopwright._instance import Instance
    from loopwright._tools import Tool
    from loopwright._types import Cost, Event, Message, ModelRequest, ToolSpec, Usage
    from loopwright.abc import ContextStrategy, Provider, Store

__all__ = ["EngineDeps", "SegmentRun"]


class SegmentRun(Protocol):
    """The run of one instance as the engine drives it (the runtime's ``AgentRun``).

    Attributes:
        inst: The live instance.
        instance_id: Its id.
        stream: Whether the caller asked for streamed model calls.
        streamed_turn: The last turn whose answer was streamed (a retry after it starts over).
        awaiting_after_repair: Calls a repair left waiting for the user's answer.
        failure: What ended the last segment, if it failed.
        mail_read_at: ``time.monotonic()`` of the last mailbox read.

    """

    inst: Instance
    stream: bool
    streamed_turn: int
    awaiting_after_repair: set[str]
    failure: BaseException | None
    mail_read_at: float

    @property
    def instance_id(self) -> str: ...

    def publish(self, event: Event) -> None:
        """Give ``event`` to the run's followers."""

    def request_cancel(self) -> None:
        """Cancel the running segment (a cancel request read from the mailbox)."""


@attrs.frozen
class EngineDeps:
    """Everything the loop uses, and nothing else (built by the runtime when it opens).

    Records, headers and the store:

    Attributes:
        store: The instance store (entries, posts, records).
        owner: Who runs instances here, saved as the header's ``runner``.
        queue_record: ``(instance_id, kind, data)``: queue a record (written with the next flush).
        flush_records: ``(instance_id)``: write the queued records of an instance.
        write_header: ``(inst)``: save an instance's header.
        hook_impls: ``(definition, hook)``: the implementations of ``hook`` for that definition
            (an empty tuple when none: the loop then skips all hook work).

    Models:
        model_ref: ``(definition)``: the ``provider:model`` an instance of it calls.
        split_model: ``(ref)``: ``(provider name, model id)``.
        provider: ``(name)``: the provider (raises when it cannot be built).
        provider_streams: ``(name)``: whether the provider's calls stream by default.
        price: ``(usage, provider name, model id)``: what a call cost.
        agent_retries: Transient failures retried per model (the assembly's ``agentRetry``).
        context_strategy: ``(definition)``: its context strategy, if any.
        output_problems: ``(definition, text)``: parse a structured answer (a parsed value, or the
            list of problems).
        verifier: ``(name)``: a completion verifier.

    Tools:
        tool_for: ``(definition, name, grants)``: the tool, or ``None`` when the instance has none by that name.
        tool_names: ``(definition, grants)``: the names of its tools.
        tool_specs: ``(definition, grants)``: what the model is told of its tools.
        limits_of: ``(inst)``: the instance's limits (its definition's, capped by its saved budget).
        limits_for: ``(definition)``: a definition's limits.
        base_dir: ``()``: the assembly's base directory now (``ToolContext.base_dir``; the working
            directory of an assembly without a file).
        shell_approver: The host's approver for ``shell: approval``.
        sink_locations: ``()``: where the record sinks write (``ToolContext.sink_locations``).
        agents: ``(caller, tool_call_id, timeout)``: what the agent tools of a call use (``ToolContext.agents``).
        memory_for: ``(inst)``: the instance's long-term memory (a ``MemoryAccess``), or ``None``
            when its definition asks for none or its grant holds no subject (``ToolContext.memory``,
            and the recall before each model call).
        redact_request: ``(request)``: the request with the assembly's ``redaction:`` applied (after the
            recall, before ``before_inference``), or ``None`` when the assembly redacts nothing before the model.

    The runtime's parts of the segment kinds (see :mod:`loopwright._engine._segments`):
        begin: ``(run, *, resume)``: a new instance's set-up: system prompt, initial prompts, task prompt.
        still_beginning: ``(inst)``: whether a resumed instance has yet to finish its set-up.
        defer_task: ``(inst)``: queue the task prompt behind a turn the set-up left waiting.
        hold_changed: ``(inst)``: undo the decisions whose call changed since; return whether any did.

    """

    store: Store
    owner: str
    queue_record: Callable[[str, str, Mapping[str, Any]], None]
    flush_records: Callable[[str], Awaitable[None]]
    write_header: Callable[[Instance], Awaitable[None]]
    hook_impls: Callable[[Definition, str], tuple[Any, ...]]
    model_ref: Callable[[Definition], str]
    split_model: Callable[[str], tuple[str, str]]
    provider: Callable[[str], Provider]
    provider_streams: Callable[[str], bool]
    price: Callable[[Usage, str, str], Cost]
    agent_retries: int
    context_strategy: Callable[[Definition], ContextStrategy | None]
    output_problems: Callable[[Definition, str | None], Any]
    verifier: Callable[[str], Callable[[Sequence[Message]], tuple[bool, str]]]
    tool_for: Callable[[Definition, str, Capabilities | None], Tool | None]
    tool_names: Callable[[Definition, Capabilities | None], list[str]]
    tool_specs: Callable[[Definition, Capabilities | None], tuple[ToolSpec, ...]]
    limits_of: Callable[[Instance], Limits]
    limits_for: Callable[[Definition], Limits]
    base_dir: Callable[[], Path]
    shell_approver: Callable[..., Any] | None
    agents: Callable[[Instance, str, float], Any]
    begin: Callable[..., Awaitable[None]]
    still_beginning: Callable[[Instance], bool]
    defer_task: Callable[[Instance], None]
    hold_changed: Callable[[Instance], bool]
    sink_locations: Callable[[], tuple[Path, ...]] = tuple
    memory_for: Callable[[Instance], Any] = lambda _inst: None
    redact_request: Callable[[ModelRequest], ModelRequest] | None = None

"""Every hook loopwright calls. Implement them with :data:`loopwright.hookimpl`.

Rules that hold for every hook here:

* Names carry the ``loopwright_`` prefix. An implementation takes any subset of the spec's
  keyword arguments (none included), so arguments added later break nobody.
* Implementations run in **registration order**: built-in plugins, then entry points, then the
  assembly's ``plugins:``, then plugins a host registers. (pluggy itself calls LIFO; the core
  walks the implementations in order instead.)
* ``async def`` implementations are awaited, one at a time, in that order.
* Interceptors (``before_*`` / ``after_*``) return a decision from :mod:`loopwright` or ``None``
  (Continue). They **fail closed**: one that raises blocks the step. Every decision other than
  Continue is written as a ``hook`` record.
* Observers (``on_*``) return nothing. They **fail open**: an exception is recorded and the run
  goes on.
* Registration hooks receive a ``register`` callable. Registering a name that another plugin
  registered already raises :class:`~loopwright.errors.RegistrationError` naming both. They
  also receive ``settings`` (the assembly's ``pluginSettings``) and ``runtime`` (the runtime
  loading them), for plugins configured from ``loopwright.yaml``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import attrs
import pluggy

from loopwright._decisions import (
    Block,
    ModifyInputs,
    ModifyMessage,
    ModifyRequest,
    ModifyResult,
    RequireApproval,
    Respond,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from loopwright._decisions import Decision
    from loopwright._runtime import Runtime
    from loopwright._tools import Tool
    from loopwright._types import (
        Cost,
        Event,
        InstanceInfo,
        Message,
        ModelRequest,
        ModelResponse,
        Record,
        ToolCall,
        ToolResult,
        Usage,
    )
    from loopwright.memory import Fact

__all__ = [  # noqa: RUF022 - plainly sorted, as the project's __all__ test checks
    "HOOKS",
    "HookKind",
    "HookRule",
    "INTERCEPTORS",
    "OBSERVERS",
    "PROJECT",
    "REGISTRATIONS",
    "hookimpl",
    "hookspec",
    "loopwright_after_inference",
    "loopwright_after_tool_call",
    "loopwright_before_compaction",
    "loopwright_before_inference",
    "loopwright_before_tool_call",
    "loopwright_on_cost",
    "loopwright_on_message",
    "loopwright_on_record",
    "loopwright_on_runtime_close",
    "loopwright_on_state_change",
    "loopwright_on_stream_event",
    "loopwright_recall",
    "loopwright_register_commands",
    "loopwright_register_context_strategies",
    "loopwright_register_engines",
    "loopwright_register_guardrails",
    "loopwright_register_hooks",
    "loopwright_register_memories",
    "loopwright_register_providers",
    "loopwright_register_record_sinks",
    "loopwright_register_stores",
    "loopwright_register_tools",
    "loopwright_register_verifiers",
]

PROJECT = "loopwright"
hookspec = pluggy.HookspecMarker(PROJECT)
#: Mark a function as an implementation of a ``loopwright_*`` hook (also :data:`loopwright.hookimpl`).
hookimpl = pluggy.HookimplMarker(PROJECT)

# ---------------------------------------------------------------------------------------------
# Registration hooks: called once, when a Runtime (or the CLI) is built.
# ---------------------------------------------------------------------------------------------


@hookspec
def loopwright_register_providers(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register provider kinds.

    Call ``register(kind, factory)``, where ``factory(settings)`` takes a
    :class:`~loopwright.ProviderSettings` and returns a :class:`~loopwright.abc.Provider`.

    :param register: The registrar.
    :param settings: The assembly's ``pluginSettings`` (plugin name → its settings mapping).
    :param runtime: The runtime loading the plugins (not open yet), or ``None`` for a plugin host
        used on its own.

    Return value ignored. ``async def`` is not allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_register_tools(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register tools.

    Call ``register(tool)`` with a function decorated by :func:`loopwright.tool` (or a plain
    function, which is wrapped with the defaults) or a :class:`~loopwright.Tool`.

    :param register: The registrar.
    :param settings: The assembly's ``pluginSettings`` (plugin name → its settings mapping).
    :param runtime: The runtime loading the plugins (not open yet), or ``None`` for a plugin host
        used on its own.

    Return value ignored. ``async def`` is not allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_register_stores(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register store kinds.

    Call ``register(kind, factory)``, where ``factory(settings)`` takes a
    :class:`~loopwright.StoreSettings` and returns a :class:`~loopwright.abc.Store`.

    :param register: The registrar.
    :param settings: The assembly's ``pluginSettings`` (plugin name → its settings mapping).
    :param runtime: The runtime loading the plugins (not open yet), or ``None`` for a plugin host
        used on its own.

    Return value ignored. ``async def`` is not allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_register_engines(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register engine kinds (who advances submitted work; the assembly's ``engine:``).

    Call ``register(kind, factory)``, where ``factory(options, runtime)`` takes the engine's
    YAML mapping (without ``kind``) and the open :class:`~loopwright.Runtime`, and returns a
    :class:`~loopwright.abc.Engine`. Pass ``options=SCHEMA`` (see :mod:`loopwright.options`) to
    have the options checked, at their place in the assembly, before the factory is called.
    The built-in kind is ``local``.

    :param register: The registrar.
    :param settings: The assembly's ``pluginSettings`` (plugin name → its settings mapping).
    :param runtime: The runtime loading the plugins (not open yet), or ``None`` for a plugin host
        used on its own.

    Return value ignored. ``async def`` is not allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_register_context_strategies(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register context strategy kinds.

    Call ``register(kind, factory)``, where ``factory(options)`` takes the strategy's YAML
    mapping (without ``kind``) and returns a :class:`~loopwright.abc.ContextStrategy`.

    :param register: The registrar.
    :param settings: The assembly's ``pluginSettings`` (plugin name → its settings mapping).
    :param runtime: The runtime loading the plugins (not open yet), or ``None`` for a plugin host
        used on its own.

    Return value ignored. ``async def`` is not allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_register_record_sinks(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register record sink kinds.

    Call ``register(kind, factory)``, where ``factory(options)`` takes the sink's YAML mapping
    (without ``kind``) and returns a :class:`~loopwright.abc.RecordSink`.

    :param register: The registrar.
    :param settings: The assembly's ``pluginSettings`` (plugin name → its settings mapping).
    :param runtime: The runtime loading the plugins (not open yet), or ``None`` for a plugin host
        used on its own.

    Return value ignored. ``async def`` is not allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_register_memories(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register long-term memory kinds (the assembly's ``memory:``).

    Call ``register(kind, factory)``, where ``factory(settings)`` takes a
    :class:`~loopwright.memory.MemorySettings` and returns a :class:`~loopwright.memory.Memory`.
    Pass ``options=SCHEMA`` (see :mod:`loopwright.options`) to have the options checked, at their
    place in the assembly, before the factory is called. The built-in kind is ``sqlite``.

    :param register: The registrar.
    :param settings: The assembly's ``pluginSettings`` (plugin name → its settings mapping).
    :param runtime: The runtime loading the plugins (not open yet), or ``None`` for a plugin host
        used on its own.

    Return value ignored. ``async def`` is not allowed.

    .. versionadded:: 0.3
    """


@hookspec
def loopwright_register_commands(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register CLI subcommands.

    Call ``register(command)`` with a :class:`click.Command`. It is added to the ``loopwright``
    group; a name that is taken is an error naming both plugins.

    :param register: The registrar.
    :param settings: The assembly's ``pluginSettings`` (plugin name → its settings mapping).
    :param runtime: The runtime loading the plugins (not open yet), or ``None`` for a plugin host
        used on its own.

    Return value ignored. ``async def`` is not allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_register_guardrails(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register guardrails by name, for definitions to name in ``guardrails:``.

    Call ``register(name, policy)``. ``policy`` is called before each tool call of an agent
    whose definition names it (or whose caller's does), with any of ``call``, ``tool``,
    ``instance`` and ``turn`` it declares; it may be ``async def``. It returns ``None`` or
    ``"allow"`` to let the call run, any other string to block it with that reason, or a
    decision. A parameter outside those four is an error at registration. A policy that raises
    blocks the call (fail closed), with a ``hook`` record.

    A definition file an agent wrote may name only guardrails registered this way: nothing in
    it is ever imported.

    :param register: The registrar.
    :param settings: The assembly's ``pluginSettings`` (plugin name → its settings mapping).
    :param runtime: The runtime loading the plugins (not open yet), or ``None``.

    Return value ignored. ``async def`` is not allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_register_verifiers(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register completion verifiers by name, for definitions to name in ``completion.verify``.

    Call ``register(name, verify)``, where ``verify(messages)`` takes the transcript and returns
    ``(ok, reason)``. A function that cannot be called with one argument is an error at
    registration. A verifier that raises, or returns something else, fails the check (fail
    closed), with the error in the ``completion`` record. ``allTodosDone`` is built in;
    :meth:`Runtime.add_verifier <loopwright.Runtime.add_verifier>` adds one from a host.

    :param register: The registrar.
    :param settings: The assembly's ``pluginSettings`` (plugin name → its settings mapping).
    :param runtime: The runtime loading the plugins (not open yet), or ``None``.

    Return value ignored. ``async def`` is not allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_register_hooks(
    register: Callable[..., None], settings: Mapping[str, Any], runtime: Runtime | None,
) -> None:
    """Register hook sets by name, for definitions to name in ``hooks:``.

    Call ``register(name, plugin)``, where ``plugin`` is an object or module with interceptor and
    observer implementations (``loopwright_before_tool_call`` ...). They apply only to agents
    whose definition names the set (or whose caller's does), wrapped by the host's hooks. They
    are checked as host plugins are: a hook that matches no spec, or takes an argument its spec
    does not offer, is an error at registration naming the plugin and the hook. The set's
    registration hooks are not called.

    :param register: The registrar.
    :param settings: The assembly's ``pluginSettings`` (plugin name → its settings mapping).
    :param runtime: The runtime loading the plugins (not open yet), or ``None``.

    Return value ignored. ``async def`` is not allowed.

    .. versionadded:: 0.1
    """


# ---------------------------------------------------------------------------------------------
# Interceptors: return a decision or None (Continue). They fail closed.
# ---------------------------------------------------------------------------------------------


@hookspec
def loopwright_recall(
    facts: Sequence[Fact], request: ModelRequest, instance: InstanceInfo, turn: int,
) -> Decision | None:
    """Called before each model call of an instance whose definition has ``memory:``, first of all.

    Seed 002's order: long-term memory is recalled (this hook), then redaction, then
    ``loopwright_before_inference``. The runtime has recalled ``facts`` (the best matches of the
    latest user message, from the instance's granted read namespaces) and placed them in
    ``request`` as one system message whose ``source`` is ``"memory"``, after the system prompt.
    That message is in this request only: the transcript never holds it. Not called for
    instances without ``memory:`` (nor with ``recall: 0``, nor without a read grant), so other
    agents pay nothing for it.

    :param facts: What was recalled, best first (possibly empty).
    :param request: The request with the recalled message. Frozen; return
        :class:`~loopwright.ModifyRequest` to send another (to reword, filter or add facts).
    :param instance: The instance being run.
    :param turn: The turn number within the instance (1-based).
    :return: ``None``, :class:`~loopwright.ModifyRequest` or :class:`~loopwright.Block` (the run
        fails with :class:`~loopwright.errors.HookBlockedError`).

    Walk stops at the first Block; Modify decisions chain. ``async def`` is allowed.

    .. versionadded:: 0.3
    """


@hookspec
def loopwright_before_inference(
    request: ModelRequest, instance: InstanceInfo, turn: int,
) -> Decision | None:
    """Called before each model call, after the context strategy ran.

    :param request: The request about to be sent. Frozen; return :class:`~loopwright.ModifyRequest`
        to send another (for this call only; the transcript is unchanged).
    :param instance: The instance being run.
    :param turn: The turn number within the instance (1-based).
    :return: ``None``, :class:`~loopwright.ModifyRequest`, :class:`~loopwright.Block` (the run
        fails with :class:`~loopwright.errors.HookBlockedError`) or :class:`~loopwright.Respond`
        (its content is the answer and the model is not called).

    Walk stops at the first Block or Respond; Modify decisions chain. ``async def`` is allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_after_inference(
    response: ModelResponse, request: ModelRequest, instance: InstanceInfo, turn: int,
) -> Decision | None:
    """Called after each model answer, before the loop acts on it.

    :param response: What the model answered.
    :param request: The request that was sent.
    :param instance: The instance being run.
    :param turn: The turn number within the instance.
    :return: ``None``, :class:`~loopwright.ModifyMessage` (the transcript keeps the new message)
        or :class:`~loopwright.Block` (the answer is dropped and the run fails).

    Walk stops at the first Block; Modify decisions chain. ``async def`` is allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_before_tool_call(
    call: ToolCall, tool: Tool | None, instance: InstanceInfo, turn: int,
) -> Decision | None:
    """Called before each tool call runs, after its arguments were validated.

    Not called for unknown tools or invalid arguments: those already have their result.

    :param call: The call, with its (possibly modified) arguments.
    :param tool: The tool that would run.
    :param instance: The instance being run.
    :param turn: The turn number within the instance.
    :return: ``None``, :class:`~loopwright.ModifyInputs`, :class:`~loopwright.Block` (the model
        sees a ``blocked`` result with the reason), :class:`~loopwright.RequireApproval` or
        :class:`~loopwright.Respond` (a ``success`` result without running the tool).

    Walk stops at the first Block, RequireApproval or Respond; Modify decisions chain.
    ``async def`` is allowed. Guardrails are implementations of this hook.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_after_tool_call(
    call: ToolCall, result: ToolResult, instance: InstanceInfo, turn: int,
) -> Decision | None:
    """Called after each tool call has its result, before the model sees it.

    Called for every result, errors included.

    :param call: The call.
    :param result: Its result.
    :param instance: The instance being run.
    :param turn: The turn number within the instance.
    :return: ``None``, :class:`~loopwright.ModifyResult` or :class:`~loopwright.Block` (the model
        sees a ``blocked`` result with the reason instead).

    Walk stops at the first Block; Modify decisions chain. ``async def`` is allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_before_compaction(
    instance: InstanceInfo, strategy: str, messages: Sequence[Message],
) -> Decision | None:
    """Called before a context strategy replaces the transcript.

    :param instance: The instance being run.
    :param strategy: The strategy's kind, for example ``clearToolResults``.
    :param messages: The transcript as it is now.
    :return: ``None`` or :class:`~loopwright.Block` (skip this compaction).

    Walk stops at the first Block. ``async def`` is allowed.

    .. versionadded:: 0.1
    """


# ---------------------------------------------------------------------------------------------
# Observers: return value ignored. They fail open.
# ---------------------------------------------------------------------------------------------


@hookspec
def loopwright_on_message(message: Message, instance: InstanceInfo) -> None:
    """Called for every message added to a transcript (prompts, answers, tool results, messages).

    :param message: The message.
    :param instance: The instance it was added to.

    Return value ignored. ``async def`` is allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_on_state_change(
    instance: InstanceInfo, old: str | None, new: str, stop_reason: str | None,
) -> None:
    """Called when an instance changes state (``running``, ``waiting`` ...).

    :param instance: The instance.
    :param old: The previous state, ``None`` for a new instance.
    :param new: The new state.
    :param stop_reason: Why the segment ended, when the new state is a resting one.

    Return value ignored. ``async def`` is allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_on_cost(
    instance: InstanceInfo, turn: int, usage: Usage, cost: Cost, model: str,
) -> None:
    """Called after each model call with what it used and cost.

    :param instance: The instance.
    :param turn: The turn number.
    :param usage: Tokens of this call.
    :param cost: Its cost; ``cost.amount`` is ``None`` when the price is unknown.
    :param model: The ``PROVIDER:MODEL`` that served the call.

    Return value ignored. ``async def`` is allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_on_stream_event(event: Event, instance: InstanceInfo) -> None:
    """Called for each event :meth:`AgentRun.events` yields (text deltas, tool calls, results ...).

    :param event: The event.
    :param instance: The instance.

    Return value ignored. ``async def`` is allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_on_record(record: Record) -> None:
    """Called for every record written to an instance's record log. Record sinks build on it.

    :param record: The record.

    Return value ignored. ``async def`` is allowed.

    .. versionadded:: 0.1
    """


@hookspec
def loopwright_on_runtime_close(runtime: Runtime) -> None:
    """Called once when a runtime closes (``async with`` ends).

    It runs after the runtime's runs were stopped and before its providers, record sinks and
    store are closed. Release what a plugin opened for this runtime (connections, server processes). Called for
    the runtime's plugins only, never for a definition's ``hooks:``.

    :param runtime: The runtime being closed.

    Return value ignored. ``async def`` is allowed. An exception is logged (logger
    ``loopwright``) and the close goes on.

    .. versionadded:: 0.1
    """


class HookKind(enum.Enum):
    """How the core calls a hook (see the module docstring)."""

    #: Called once per plugin when it is loaded, with ``register``; never ``async def``.
    REGISTRATION = "registration"
    #: Walked in order; returns a decision or ``None``; fails closed.
    INTERCEPTOR = "interceptor"
    #: Called in order; returns nothing; fails open.
    OBSERVER = "observer"


@attrs.frozen
class HookRule:
    """What the core does with one hook: the one place these rules live.

    The plugin host (:mod:`loopwright._plugins`), the hook engine (:mod:`loopwright._hooks`) and
    the docs check (``tests/test_docs.py``) read :data:`HOOKS`; none keeps a list of its own.

    Attributes:
        kind: Registration, interceptor or observer.
        decisions: The decision classes an interceptor may return (``None`` is Continue and always
            allowed); empty for the other kinds. Any other return value blocks the step.
        per_definition: Whether a definition's ``hooks:`` (a hook set) may implement it: every
            interceptor and observer but ``loopwright_on_runtime_close``; no registration hook.
        definition_first: Whether a definition's implementations run before the host's. The
            host's hooks wrap a definition's: they run first before a step (``before_*``, and
            observers) and last after it (``after_*``, where this is ``True``), so the host both
            sees what is asked first and has the last word on what comes back.
    """

    kind: HookKind
    decisions: tuple[type[Decision], ...] = ()
    per_definition: bool = True
    definition_first: bool = False


_REGISTRATION = HookRule(HookKind.REGISTRATION, per_definition=False)
_OBSERVER = HookRule(HookKind.OBSERVER)

#: Every hookspec of this module, in the order the docs list them, with its :class:`HookRule`.
HOOKS: Mapping[str, HookRule] = MappingProxyType({
    "loopwright_register_providers": _REGISTRATION,
    "loopwright_register_tools": _REGISTRATION,
    "loopwright_register_stores": _REGISTRATION,
    "loopwright_register_engines": _REGISTRATION,
    "loopwright_register_context_strategies": _REGISTRATION,
    "loopwright_register_record_sinks": _REGISTRATION,
    "loopwright_register_commands": _REGISTRATION,
    "loopwright_register_guardrails": _REGISTRATION,
    "loopwright_register_verifiers": _REGISTRATION,
    "loopwright_register_hooks": _REGISTRATION,
    "loopwright_register_memories": _REGISTRATION,
    "loopwright_recall": HookRule(HookKind.INTERCEPTOR, (ModifyRequest, Block)),
    "loopwright_before_inference": HookRule(HookKind.INTERCEPTOR, (ModifyRequest, Block, Respond)),
    "loopwright_after_inference": HookRule(HookKind.INTERCEPTOR, (ModifyMessage, Block), definition_first=True),
    "loopwright_before_tool_call": HookRule(HookKind.INTERCEPTOR, (ModifyInputs, Block, RequireApproval, Respond)),
    "loopwright_after_tool_call": HookRule(HookKind.INTERCEPTOR, (ModifyResult, Block), definition_first=True),
    "loopwright_before_compaction": HookRule(HookKind.INTERCEPTOR, (Block,)),
    "loopwright_on_message": _OBSERVER,
    "loopwright_on_state_change": _OBSERVER,
    "loopwright_on_cost": _OBSERVER,
    "loopwright_on_stream_event": _OBSERVER,
    "loopwright_on_record": _OBSERVER,
    "loopwright_on_runtime_close": HookRule(HookKind.OBSERVER, per_definition=False),
})


def _of_kind(kind: HookKind) -> tuple[str, ...]:
    return tuple(name for name, rule in HOOKS.items() if rule.kind is kind)


#: The interceptor hooks, in :data:`HOOKS` order (derived from it).
INTERCEPTORS: tuple[str, ...] = _of_kind(HookKind.INTERCEPTOR)
#: The observer hooks, in :data:`HOOKS` order (derived from it).
OBSERVERS: tuple[str, ...] = _of_kind(HookKind.OBSERVER)
#: The registration hooks, in :data:`HOOKS` order (derived from it).
REGISTRATIONS: tuple[str, ...] = _of_kind(HookKind.REGISTRATION)

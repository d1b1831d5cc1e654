"""The runtime (one per assembly) and agent runs (one per instance being followed).

Two lifetimes, kept apart: a :class:`Runtime` owns the plugin manager, the store, the providers
and the record sinks, and lives as long as its ``async with`` block; an :class:`AgentRun` is a
handle on one instance, from which a caller follows, steers, approves and cancels it. Run
segments execute as tasks in the runtime's task group, so leaving the ``async with`` block
stops them (an interrupted instance stays ``running`` in the store and ``resume`` continues it).
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import logging
import math
import os
import secrets
import socket
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

import anyio
import attrs

from loopwright._agents import Agents, Monitors
from loopwright._capabilities import (
    capabilities_from_dict,
    capabilities_to_dict,
    check_store_outside,
    intersect,
    resolve_roots,
)
from loopwright._decisions import Block, Decision
from loopwright._definition import (
    DEFAULT_LIMITS,
    Assembly,
    Capabilities,
    Definition,
    Limits,
    gates_from_json,
    with_gates,
)
from loopwright._engine import (
    Decided,
    EngineDeps,
    LateMail,
    Loop,
    Mail,
    Resume,
    Segment,
    SegmentEnd,
    Start,
    parse_output,
)
from loopwright._hooks import notify
from loopwright._instance import (
    Instance,
    entry_totals,
    fold_checkpoint,
    history_at,
    log_totals,
    message_to_json,
    now_iso,
    rebuild,
    restore,
    unanswered_calls,
)
from loopwright._patterns import schema_validator
from loopwright._plugins import PluginHost, checked_guardrail, checked_verifier, hook_set
from loopwright._pricing import PriceTable
from loopwright._template import render, render_value, resolve_inputs
from loopwright._types import (
    AgentResult,
    Cost,
    Event,
    Message,
    PendingApproval,
    Record,
    State,
    StopReason,
    ToolCall,
    Usage,
    call_digest,
)
from loopwright.abc import ProviderSettings, StoreSettings
from loopwright.errors import (
    ConfigError,
    ConfigProblem,
    GrantsError,
    InstanceLockedError,
    InstanceNotFoundError,
    LeaseLostError,
    LoopwrightError,
    RunCancelledError,
    RunError,
    StoreError,
    StoreUnavailableError,
)

if TYPE_CHECKING:
    from types import TracebackType

    from anyio.abc import TaskGroup

    from loopwright._tools import Tool
    from loopwright._types import ToolSpec
    from loopwright.abc import ContextStrategy, Engine, Lease, Provider, RecordSink, Store

__all__ = [
    "AgentRun",
    "Runtime",
    "all_todos_done",
    "approval_to_json",
    "result_to_json",
    "summary",
    "usage_to_json",
]

_log = logging.getLogger("loopwright")

_EVENT_HISTORY = 10_000
#: Seconds between looks at the mailbox for a cancel request while a segment runs.
_CANCEL_POLL = 0.25


@attrs.define
class _DefinitionPlan:
    """What the runtime precomputes once per definition, so that turns do none of it."""

    definition: Definition
    tools: dict[str, Tool]
    specs: tuple[ToolSpec, ...]
    limits: Limits
    model_ref: str
    strategy: ContextStrategy | None
    #: Hook implementations the definition names (``hooks:`` and ``guardrails:``), per hook.
    hooks: dict[str, tuple[Any, ...]] = attrs.Factory(dict)
    #: Combined (host + definition) implementation tuples, per hook, with the host's generation.
    combined: dict[str, tuple[int, tuple[Any, ...]]] = attrs.Factory(dict)
    #: The validator of the definition's ``output`` schema, built on first use.
    output_validator: Any = None
    #: Whether a tool of the definition is offered only under some grants (``Tool.available``).
    gated: bool = False
    #: The specs offered under each set of grants, for gated definitions.
    offered: dict[Capabilities, tuple[ToolSpec, ...]] = attrs.Factory(dict)
    #: The header's ``definition`` snapshot, built on first use and shared by every instance
    #: of the definition (never mutated: headers are only read and encoded).
    snapshot: dict[str, Any] | None = None


class AgentRun:
    """A handle on one instance: follow it, steer it, approve its calls, cancel it.

    Get one from :meth:`Runtime.start_agent` or :meth:`Runtime.get_agent`. Every method works
    whether the instance is running in this runtime or resting in the store.
    """

    def __init__(self, runtime: Runtime, inst: Instance) -> None:
        """Wrap ``inst``; only the runtime makes these."""
        self._rt = runtime
        self.inst = inst
        self.stream = False
        #: The last turn whose answer was streamed, so a retried stream can announce a reset.
        self.streamed_turn = 0
        #: ``ask_user`` calls the crash repair ran again and that now wait for an answer.
        self.awaiting_after_repair: set[str] = set()
        self.failure: BaseException | None = None
        self._subscribers: list[Any] = []
        self._history: collections.deque[Event] = collections.deque(maxlen=_EVENT_HISTORY)
        self._done = anyio.Event()
        self._done.set()
        self._scope: anyio.CancelScope | None = None
        self._cancelled = False
        #: The copy in memory may be ahead of the store (a segment ended on a refused or failed write).
        self._stale = False
        #: When (``time.monotonic()``) the loop last read the mailbox at a turn boundary.
        self.mail_read_at = 0.0

    @property
    def runtime(self) -> Runtime:
        """The runtime this run belongs to."""
        return self._rt

    def __repr__(self) -> str:
        return f"AgentRun({self.instance_id!r}, state={self.inst.state.value!r})"

    @property
    def instance_id(self) -> str:
        """The instance's id."""
        return self.inst.id

    @property
    def state(self) -> State:
        """The instance's state now."""
        return self.inst.state

    @property
    def running(self) -> bool:
        """Whether a run segment is executing in this runtime."""
        return not self._done.is_set()

    # -- events ---------------------------------------------------------------------------

    def publish(self, event: Event) -> None:
        """Deliver an event to every follower and keep it for followers who come later."""
        self._history.append(event)
        for send in self._subscribers:
            send.send_nowait(event)

    async def events(self, *, subtree: bool = False) -> AsyncIterator[Event]:
        """Yield the events of the current run segment, from its start, until the instance rests.

        Events: ``state``, ``text``, ``usage``, ``tool_call``, ``tool_result`` and ``approval``.
        If no segment is running, yields what the last segment produced and returns.

        :param subtree: Also yield the events of every agent it starts (and theirs) that runs
            in this runtime, as they happen, until this instance rests. Each event's ``data``
            then carries ``depth`` (0 for this instance) and ``agent`` (its definition's name),
            and ``instance_id`` names its instance, so that a host can draw a live tree.
        """
        if subtree:
            async for event in self._rt.tree_events(self):
                yield event
            return
        backlog = list(self._history)
        if not self.running:
            for event in backlog:
                yield event
            return
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        self._subscribers.append(send)  # closed by the runtime when the segment ends
        try:
            for event in backlog:
                yield event
            async for event in receive:
                yield event
        finally:
            if send in self._subscribers:
                self._subscribers.remove(send)
            send.close()
            receive.close()

    def close_followers(self) -> None:
        """End every :meth:`events` iteration once it has drained (the segment ended)."""
        for send in self._subscribers:
            send.close()
        self._subscribers.clear()

    # -- waiting ----------------------------------------------------------------------------

    async def wait(self) -> AgentResult:
        """Wait until the instance rests and return its result, raising nothing.

        ``subtree_cost`` includes the agents it started, read from the store now.
        """
        await self._done.wait()
        inst = self.inst
        if not inst.header.get("children"):
            return inst.result()
        inst.children_cost = Cost(amount=await self._rt.children_cost(inst.header))
        return attrs.evolve(inst.result(), pending_approvals=tuple(await self._rt.tree_approvals(self.instance_id)))

    async def pending_approvals(self) -> tuple[PendingApproval, ...]:
        """Return every undecided call in this instance's subtree (its own first), read from the store.

        Each entry names the instance that holds it (``instance_id``) and the ``path`` from
        this instance down to that one; decide any of them with :meth:`approve` or
        :meth:`deny` and its ``tool_call_id``.
        """
        return tuple(await self._rt.tree_approvals(self.instance_id))

    async def result(self) -> AgentResult:
        """Wait until the instance rests and return its :class:`~loopwright.AgentResult`.

        :raises RunError: The model failed for good (``.cause`` holds the provider error) or a
            hook blocked the model call (:class:`~loopwright.errors.HookBlockedError`).
        :raises RunCancelledError: The run was cancelled; ``.result`` holds the saved result.

        Ending on ``max_iterations`` or another limit raises nothing: the result says so.
        """
        result = await self.wait()
        if result.cancelled and result.state is State.STOPPED:
            raise RunCancelledError(f"run of instance {self.instance_id} was cancelled", result=result)
        if result.state is State.ERROR and result.stop_reason is StopReason.ERROR:
            failure = self.failure
            if isinstance(failure, RunError):
                failure.result = result
                raise failure
            raise RunError(f"instance {self.instance_id} failed: {result.error}", result=result, cause=failure)
        return result

    # -- steering ---------------------------------------------------------------------------

    async def approve(self, tool_call_id: str | None = None, *, by: str | None = None) -> None:
        """Approve a held call (all of this instance's when ``tool_call_id`` is None).

        ``tool_call_id`` may name a call held anywhere in this instance's subtree: it is
        decided on the instance that holds it, which goes on once all its calls are decided,
        and so do the callers above it that wait for it. ``by`` names who decided (saved as
        ``decidedBy``).

        :raises LoopwrightError: No such call is waiting for approval (any more).
        """
        await self._rt.decide(self, tool_call_id, "approved", None, by=by)

    async def deny(self, tool_call_id: str | None = None, reason: str | None = None, *, by: str | None = None) -> None:
        """Deny a held call (as :meth:`approve` finds it); the model sees a ``denied`` result with ``reason``."""
        await self._rt.decide(self, tool_call_id, "denied", reason, by=by)

    async def message(self, text: str, *, source: str = "api") -> None:
        """Send a message: read at the next turn boundary if running, else it starts a new segment.

        From ``api`` or ``user`` to an instance waiting on ``ask_user``, it is the answer.
        While approvals are pending it waits until they are decided.
        """
        await self._rt.deliver(self, text, source)

    def request_cancel(self) -> None:
        """Cancel the running segment from inside it (a cancel request reached its runner)."""
        self._cancelled = True
        if self._scope is not None:
            self._scope.cancel()

    async def cancel(self) -> None:
        """Stop the run: the instance becomes ``stopped`` with ``cancelled: true``; the partial turn is kept."""
        await self._rt.cancel_run(self)


class Runtime:
    """A loopwright runtime: plugins, a store, providers and record sinks, built from an assembly.

    Use it as an async context manager::
        async with Runtime.from_file("loopwright.yaml") as rt:
            run = await rt.start_agent("agents/x.yaml", prompt="...")
            result = await run.result()

    :param assembly: The assembly; ``None`` means every default (file store under
        ``.loopwright/instances``).
    :param plugins: Extra plugin objects (modules or instances with ``loopwright_*`` hooks),
        registered after the assembly's.
    :param autoload: Whether to load ``loopwright`` entry points (default: unless
        ``LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD`` is set).
    :param store: A store to use instead of the assembly's.
    :param http_client: An ``httpx.AsyncClient`` handed to every provider built here.
    :param shell_approver: Decides shell commands of instances whose grant is ``shell: approval``,
        called as ``approver(command, context)`` (see :class:`~loopwright.ToolContext`). Without
        one, such commands are held for approval like ``loopApproval`` ones.
    """

    def __init__(
        self, assembly: Assembly | None = None, *, plugins: Sequence[object] = (), autoload: bool | None = None,
        store: Store | None = None, http_client: Any = None, shell_approver: Callable[..., Any] | None = None,
    ) -> None:
        """Describe a runtime; nothing is loaded until ``async with``.

        Relative file roots in the assembly's grants are resolved here, once, against the
        assembly's folder (:func:`~loopwright._capabilities.resolve_roots`), so every instance's
        saved grants name absolute folders.
        """
        assembly = assembly or Assembly()
        self.assembly = attrs.evolve(assembly, capabilities=resolve_roots(assembly.capabilities, assembly.base_dir))
        self._extra_plugins = tuple(plugins)
        self._autoload = autoload
        self._given_store = store
        self._http_client = http_client
        self.shell_approver = shell_approver
        self.plugins = PluginHost(settings=self.assembly.plugin_settings, runtime=self)
        self.store: Store = store  # type: ignore[assignment]
        #: Who advances submitted work (the assembly's ``engine:``), built when the runtime opens.
        self.engine: Engine = None  # type: ignore[assignment]
        self.prices = PriceTable(self.assembly.pricing)
        self._providers: dict[str, Provider] = {}
        self._plans: dict[int, _DefinitionPlan] = {}
        # Runs are kept only while something holds them: a running segment's task, or a caller.
        self._runs: weakref.WeakValueDictionary[str, AgentRun] = weakref.WeakValueDictionary()
        #: The monitors armed by instances run here (built when the runtime is entered).
        self.monitors: Any = None
        self._records: dict[str, list[dict[str, Any]]] = {}
        self._sinks: list[RecordSink] = []
        self._tg: TaskGroup | None = None
        self._tg_cm: Any = None
        self._loop: Loop | None = None
        self._verifiers: dict[str, Callable[[Sequence[Message]], tuple[bool, str]]] = {"allTodosDone": all_todos_done}
        self._loaded = False
        #: Live instances, by id, while anything holds them (a run, or a child whose spawner they are):
        #: one object per instance, so the whole tree charges the same ledger.
        self._instances: weakref.WeakValueDictionary[str, Instance] = weakref.WeakValueDictionary()
        #: Who runs instances here, as saved in their headers' ``runner`` key.
        self.owner = f"loopwright (host {socket.gethostname()}, pid {os.getpid()})"
        #: The agents each instance running here waits for in ``await_agent`` now, by instance id
        #: (kept by :class:`loopwright._agents.Agents`; :meth:`stalled` reads it).
        self.awaiting: dict[str, tuple[str, ...]] = {}
        self._header_locks: dict[str, anyio.Lock] = {}
        #: Called with each run whose segment starts here (the followers of :meth:`tree_events`).
        self._segment_watchers: list[Callable[[AgentRun], None]] = []

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | None = None, **kwargs: Any) -> Self:
        """Build a runtime from an assembly file.

        :param path: The file; ``None`` reads ``./loopwright.yaml`` when it exists, else uses defaults.
        :raises ConfigError: The file is invalid (every problem with file, line and column).
        """
        from loopwright._config import load_assembly  # noqa: PLC0415 - YAML machinery only when needed

        if path is None:
            default = Path("loopwright.yaml")
            return cls(load_assembly(default) if default.is_file() else None, **kwargs)
        if not Path(path).is_file():
            raise ConfigError(f"no assembly file at {path}", path=str(path))
        return cls(load_assembly(Path(path)), **kwargs)

    # -- lifetime ---------------------------------------------------------------------------

    def load_plugins(self) -> None:
        """Load the plugins (idempotent). ``async with`` does this; the CLI calls it for ``plugins``."""
        if self._loaded:
            return
        self.plugins.load(extra=self.assembly.plugins, base_dir=self.assembly.base_dir,
                          blocked=self.assembly.disable_plugins, autoload=self._autoload)
        for plugin in self._extra_plugins:
            self.plugins.register(plugin)
        self._loaded = True

    async def __aenter__(self) -> Self:
        try:
            return await self._open()
        except BaseException as exc:
            # Whatever was opened so far (plugins' resources, a store, sinks) is closed again.
            with anyio.CancelScope(shield=True):
                await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise

    async def _open(self) -> Self:
        self.load_plugins()
        if self.store is None:
            cfg = self.assembly.store
            settings = StoreSettings(kind=cfg.kind, base_dir=self.assembly.base_dir, options=cfg.options)
            self.store = self._build(self.plugins.stores, cfg.kind, cfg.options, ("store",), what="the store",
                                     make=lambda factory: factory(settings))
        for n, spec in enumerate(self.assembly.records):
            self._sinks.append(self._build(
                self.plugins.record_sinks, spec.kind, spec.options, ("records", n),
                what=f"the record sink {spec.kind!r}", make=lambda factory, spec=spec: factory(dict(spec.options))))
        self._check_out_of_reach(self.assembly.capabilities)
        self._open_engine()
        self._loop = Loop(self._engine_deps())
        self._tg_cm = anyio.create_task_group()
        self._tg = await self._tg_cm.__aenter__()
        self._tg.start_soon(self._watch_for_cancel)

        self.monitors = Monitors(self)
        self._tg.start_soon(self.monitors.watch)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        try:
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
                await self._tg_cm.__aexit__(None, None, None)
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                await self._notify_close()
                if self.engine is not None:
                    await self.engine.aclose()
                for provider in self._providers.values():
                    await provider.aclose()
                for sink in self._sinks:
                    await sink.aclose()
                if self._given_store is None and self.store is not None:
                    await self.store.aclose()

    async def _notify_close(self) -> None:
        """Call ``loopwright_on_runtime_close``; an exception is logged and the close goes on."""
        impls = self.plugins.impls("loopwright_on_runtime_close")
        if not impls:
            return

        def on_error(plugin: str, exc: BaseException) -> None:
            _log.warning("plugin %r failed in loopwright_on_runtime_close: %s: %s",
                         plugin, type(exc).__name__, exc, exc_info=exc)

        await notify(impls, {"runtime": self}, on_error=on_error)

    def _engine_deps(self) -> EngineDeps:
        """Return what the loop uses of this runtime (see :class:`loopwright._engine.EngineDeps`)."""
        return EngineDeps(
            store=self.store, owner=self.owner, queue_record=self.queue_record, flush_records=self.flush_records,
            write_header=self.write_header, hook_impls=self.hook_impls, model_ref=self.model_ref,
            split_model=self.split_model, provider=self.provider, provider_streams=self.provider_streams,
            price=self.price, agent_retries=self.assembly.agent_retry.max_retries,
            context_strategy=self.context_strategy, output_problems=self.output_problems, verifier=self.verifier,
            tool_for=self.tool_for, tool_names=self.tool_names, tool_specs=self.tool_specs,
            limits_of=self.limits_of, limits_for=self.limits_for, base_dir=lambda: self.assembly.base_dir,
            shell_approver=self.shell_approver,
            agents=lambda caller, call_id, timeout: Agents(self, caller, call_id, timeout),
            begin=self._begin, still_beginning=self._still_beginning,
            defer_task=self._defer_task, hold_changed=self._hold_changed)

    @property
    def loop(self) -> Loop:
        """The loop driving this runtime's instances."""
        if self._loop is None:
            raise LoopwrightError("the runtime is not open: use 'async with runtime:'")
        return self._loop

    # -- components -------------------------------------------------------------------------

    def register_plugin(self, plugin: object, name: str | None = None) -> str:
        """Register a plugin object now (hooks take effect at the next hook point)."""
        self.load_plugins()
        name = self.plugins.register(plugin, name)
        self._plans.clear()
        return name

    def unregister_plugin(self, name: str) -> None:
        """Remove a plugin registered earlier."""
        self.plugins.unregister(name)
        self._plans.clear()

    def add_verifier(self, name: str, verify: Callable[[Sequence[Message]], tuple[bool, str]]) -> None:
        """Add a completion verifier by name: ``verify(messages) -> (ok, reason)``.

        :raises PluginError: ``verify`` cannot be called with one argument.
        """
        self._verifiers[name] = checked_verifier(name, verify, None)

    def _verifier_names(self) -> list[str]:
        return sorted({*self._verifiers, *self.plugins.verifiers.names()})

    def verifier(self, name: str) -> Callable[[Sequence[Message]], tuple[bool, str]]:
        """Return the completion verifier registered as ``name`` (by :meth:`add_verifier` or a plugin)."""
        found = self._verifiers.get(name)
        if found is not None:
            return found
        if name in self.plugins.verifiers:
            return self.plugins.verifiers.get(name)
        raise ConfigError(f"unknown completion verifier {name!r}; registered: {', '.join(self._verifier_names())}")

    def check_untrusted(self, definition: Definition) -> None:
        """Check that a definition an agent may have written names code only by registered name.

        Its ``hooks`` must be registered hook sets, its ``guardrails`` registered guardrails and
        its ``completion.verify`` a registered verifier: nothing it names is ever imported.

        :raises ConfigError: Naming the first entry that is not registered.
        """
        rule = "a definition an agent may have written names code only by registered name, never a module or file"
        for key, refs, registry in (("hooks", definition.hooks, self.plugins.hook_sets),
                                    ("guardrails", definition.guardrails, self.plugins.guardrails)):
            for ref in refs:
                if ref not in registry:
                    raise ConfigError(f"{key}: {ref!r} is not a registered {registry.kind} (registered: "
                                      f"{', '.join(registry.names()) or 'none'}); {rule}")
        if definition.completion is not None:
            try:
                self.verifier(definition.completion.verify)
            except ConfigError as exc:
                raise ConfigError(f"completion.verify: {exc}; {rule}") from None

    def split_model(self, ref: str) -> tuple[str, str]:
        """Split ``PROVIDER:MODEL`` into its two parts."""
        provider, sep, model = ref.partition(":")
        if not sep or not provider:
            raise ConfigError(f"model reference {ref!r} is not of the form PROVIDER:MODEL")
        return provider, model

    def model_ref(self, definition: Definition) -> str:
        """Return the definition's model, or the assembly's default."""
        ref = definition.model or self.assembly.default_model
        if not ref:
            raise ConfigError(f"definition {definition.name!r} names no model and the assembly has no defaultModel")
        return ref

    def provider(self, name: str) -> Provider:
        """Return the provider ``name``: an assembly entry, else a registered kind with defaults."""
        found = self._providers.get(name)
        if found is not None:
            return found
        cfg = self.assembly.providers.get(name)
        if cfg is None and name not in self.plugins.providers:
            entries = ", ".join(sorted(self.assembly.providers)) or "none"
            raise ConfigError(f"unknown provider {name!r}: the assembly's providers are {entries}, and no "
                              f"provider kind {name!r} is registered (kinds: "
                              f"{', '.join(self.plugins.providers.names()) or 'none'})")
        at = ("providers", name)
        api_key = None
        if cfg is not None:
            api_key = cfg.api_key
            if cfg.api_key_env:
                api_key = os.environ.get(cfg.api_key_env)
                if api_key is None:
                    raise self._assembly_error(
                        f"provider {name!r}: the environment variable {cfg.api_key_env} (its apiKeyEnv) is not set",
                        (*at, "apiKeyEnv"))
        kind = cfg.kind if cfg else name
        options = {k: v for k, v in cfg.options.items() if k != "stream"} if cfg else {}
        settings = ProviderSettings(name=name, kind=kind, base_url=cfg.base_url if cfg else None, api_key=api_key,
                                    options=options, http_client=self._http_client,
                                    base_dir=self.assembly.base_dir)
        made: Provider = self._build(self.plugins.providers, kind, options, at, what=f"provider {name!r}",
                                     make=lambda factory: factory(settings))
        self._providers[name] = made
        return made

    def assembly_error(self, message: str, at: tuple[str | int, ...], *, key: bool = False) -> ConfigError:
        """Return a ConfigError for a problem a host found in the assembly, placed at its line and column.

        :param at: The key path of what is wrong (``("server", "tokens", 0, "tokenEnv")``).
        :param key: Point at the key rather than its value.
        """
        return self._assembly_error(message, at, key=key)

    def _assembly_error(self, message: str, at: tuple[str | int, ...], *, key: bool = False) -> ConfigError:
        """Return a ConfigError for a problem at ``at`` in the assembly, placed at its line and column."""
        from loopwright._config import locate  # noqa: PLC0415 - only when something is wrong

        return ConfigError(message, path=str(self.assembly.path) if self.assembly.path else None,
                           problems=[locate(message, at, self.assembly.path, key=key)])

    def _build(
        self, registry: Any, kind: str, options: Mapping[str, Any], at: tuple[str | int, ...], *,
        what: str, make: Callable[[Any], Any],
    ) -> Any:
        """Build a component of a registered ``kind`` (a store, a sink, a provider) from its options.

        The options are checked first against the JSON Schema its plugin registered, if any; a
        problem the factory finds is placed at its key in the assembly as well.

        :param at: Where the component's mapping sits in the assembly (``("providers", "local")``).
        :param what: The component, for messages (``provider 'local'``).
        :param make: Calls the factory with the component's settings.
        :raises ConfigError: The kind is not registered (naming the registered kinds), or the
            options are unknown or ill-typed; each problem with file, line and column.
        """
        from loopwright._config import option_problems, placed  # noqa: PLC0415 - YAML machinery only when needed

        if kind not in registry:
            raise self._assembly_error(
                f"{what}: unknown {registry.kind} kind {kind!r}; registered {registry.kind} kinds: "
                f"{', '.join(registry.names()) or 'none'}", (*at, "kind"))
        declared = registry.options_of(kind)
        file = self.assembly.path
        if declared is not None:
            problems = option_problems(declared, options, at=at, file=file)
            if problems:
                raise ConfigError(f"invalid options for {what}", path=str(file) if file else None, problems=problems)
        try:
            return make(registry.get(kind))
        except ConfigError as exc:
            if file is None or (exc.problems and all(p.file is not None for p in exc.problems)):
                raise
            if not exc.problems:
                raise self._assembly_error(str(exc), at) from None
            raise ConfigError(str(exc.args[0]).split("\n", 1)[0], path=str(file),
                              problems=placed(exc.problems, file)) from None

    def provider_streams(self, name: str) -> bool:
        """Return whether the assembly asks provider ``name`` to stream (``stream: true``)."""
        cfg = self.assembly.providers.get(name)
        return bool(cfg is not None and cfg.options.get("stream"))

    def price(self, usage: Usage, provider_name: str, model: str) -> Cost:
        """Return what ``usage`` cost on ``provider_name:model`` (unknown prices stay unknown)."""
        provider = self._providers.get(provider_name)
        free = bool(getattr(provider, "free", False))
        price_id = getattr(provider, "price_provider_id", None)
        if price_id is None and not free:
            cfg = self.assembly.providers.get(provider_name)
            price_id = None if cfg else provider_name
        if f"{provider_name}:{model}" in self.assembly.pricing:
            price_id = provider_name
        return self.prices.cost(usage, model=model, price_provider=price_id, free=free)

    def _plan(self, definition: Definition) -> _DefinitionPlan:  # noqa: C901, PLR0912 - each check collects its problem
        plan = self._plans.get(id(definition))
        if plan is not None and plan.definition is definition:
            return plan
        problems: list[ConfigProblem] = []
        source = definition.source

        def problem(exc: ConfigError, at: tuple[str | int, ...], file: Path | None = source) -> None:
            from loopwright._config import locate  # noqa: PLC0415 - only to place a problem

            if exc.problems:
                problems.extend(exc.problems)
            else:
                problems.append(locate(str(exc), at, file))

        tools: dict[str, Tool] = {}
        for n, name in enumerate(definition.tool_names):
            if name not in self.plugins.tools:
                problem(ConfigError(
                    f"definition {definition.name!r} names the tool {name!r}, which no plugin registers; "
                    f"registered tools: {', '.join(self.plugins.tools.names())}"), ("tools", n))
            else:
                tools[name] = self.plugins.tools.get(name)
        limits = DEFAULT_LIMITS.merged(self.assembly.limits).merged(definition.limits)
        if definition.max_iterations is not None:
            limits = attrs.evolve(limits, max_iterations=definition.max_iterations)
        strategy = None
        if definition.context_strategy is not None:
            spec = definition.context_strategy
            if spec.kind not in self.plugins.context_strategies:
                problem(ConfigError(f"unknown context strategy {spec.kind!r}; registered: "
                                    f"{', '.join(self.plugins.context_strategies.names())}"),
                        ("contextStrategy", "kind"))
            else:
                try:
                    strategy = self.plugins.context_strategies.get(spec.kind)(dict(spec.options))
                except ConfigError as exc:
                    problem(exc, ("contextStrategy",))
        if definition.completion is not None:
            try:  # an unknown verifier fails the start, not the run
                self.verifier(definition.completion.verify)
            except ConfigError as exc:
                problem(exc, ("completion", "verify"))
        model_ref = None
        try:
            model_ref = self.model_ref(definition)
        except ConfigError as exc:
            problem(exc, ())
        problems.extend(self._model_problems(definition, model_ref, strategy))
        hooks: dict[str, tuple[Any, ...]] = {}
        if definition.hooks or definition.guardrails:
            try:
                hooks = self._definition_hooks(definition)
            except ConfigError as exc:
                problem(exc, ("hooks",) if definition.hooks else ("guardrails",))
        if problems:
            raise ConfigError(f"definition {definition.name!r} cannot run",
                              path=str(source) if source else None, problems=problems)
        assert model_ref is not None  # noqa: S101 - a missing model is a problem above
        plan = _DefinitionPlan(definition=definition, tools=tools, specs=tuple(t.spec for t in tools.values()),
                               limits=limits, model_ref=model_ref, strategy=strategy, hooks=hooks,
                               gated=any(t.available is not None for t in tools.values()))
        self._plans[id(definition)] = plan
        return plan

    def _model_problems(self, definition: Definition, model_ref: str | None, strategy: Any) -> list[ConfigProblem]:
        """Resolve every model an instance may call to a provider (built, never called).

        Its model (or the assembly's ``defaultModel``), its ``fallbackModels`` and its context
        strategy's ``model``: a mistake in any is refused before the instance exists.
        """
        source = definition.source
        models: list[tuple[str, tuple[str | int, ...], Path | None]] = []
        if model_ref is not None:
            models.append((model_ref, ("model",), source) if definition.model
                          else (model_ref, ("defaultModel",), self.assembly.path))
        models.extend((ref, ("fallbackModels", n), source) for n, ref in enumerate(definition.fallback_models))
        compaction = getattr(strategy, "model", None)
        if isinstance(compaction, str):
            models.append((compaction, ("contextStrategy", "model"), source))
        problems: list[ConfigProblem] = []
        for ref, at, file in models:
            try:
                self.provider(self.split_model(ref)[0])
            except ConfigError as exc:
                from loopwright._config import locate  # noqa: PLC0415 - only to place a problem

                problems.extend(exc.problems or [locate(f"{ref}: {exc}", at, file)])
        return problems

    def check_definition(self, definition: Definition, inputs: Mapping[str, Any] | None = None) -> None:
        """Check everything an instance of ``definition`` needs to start, calling no model.

        Its tools resolve; each model it may call (``model`` or the assembly's ``defaultModel``,
        ``fallbackModels``, a context strategy's ``model``) resolves to a provider whose key
        variable is set and whose options are valid; its context strategy, completion verifier,
        hooks and guardrails resolve; with ``inputs``, they are valid and every template renders.
        :meth:`start_agent` runs these checks before it creates the instance, and
        ``loopwright validate -c`` runs them on a definition file.

        :raises ConfigError: listing every problem found, each with file, line and column where
            there is one.
        """
        plan = self._plan(definition)
        if inputs is not None:
            from loopwright._template import resolve_inputs  # noqa: PLC0415

            self._check_templates(plan.definition, resolve_inputs(definition, inputs))

    @staticmethod
    def _check_templates(definition: Definition, values: Mapping[str, Any]) -> None:
        """Render the definition's templates with ``values`` (a dotted path that is not there fails here)."""
        from loopwright._config import locate  # noqa: PLC0415 - only when something is wrong
        from loopwright._template import TemplateError, render, render_value  # noqa: PLC0415

        texts: list[tuple[tuple[str | int, ...], Any]] = []
        if definition.system_prompt:
            texts.append((("systemPrompt",), definition.system_prompt))
        for n, ip in enumerate(definition.initial_prompts):
            if ip.content:
                texts.append((("initialPrompts", n, "content"), ip.content))
            texts.extend((("initialPrompts", n, "toolCalls", k, "arguments"), dict(tc.arguments))
                         for k, tc in enumerate(ip.tool_calls))
        problems: list[ConfigProblem] = []
        for at, text in texts:
            try:
                render(text, values) if isinstance(text, str) else render_value(text, values)
            except TemplateError as exc:
                problems.append(locate(str(exc), at, definition.source))
        if problems:
            raise ConfigError(f"definition {definition.name!r}: the inputs do not fit its templates",
                              path=str(definition.source) if definition.source else None, problems=problems)

    @staticmethod
    def _snapshot(plan: _DefinitionPlan) -> dict[str, Any]:
        """Return the definition's header snapshot, made once per definition."""
        if plan.snapshot is None:
            plan.snapshot = _definition_snapshot(plan.definition)
        return plan.snapshot

    def hook_impls(self, definition: Definition, hook: str) -> tuple[Any, ...]:
        """Return the implementations of ``hook`` for an instance of ``definition``, in call order.

        Host hooks wrap the hooks a definition names: for ``before_*`` hooks and observers the
        host's run first, for ``after_*`` hooks the definition's run first.
        """
        host = self.plugins.impls(hook)
        if not definition.hooks and not definition.guardrails:
            return host
        plan = self._plan(definition)
        own = plan.hooks.get(hook)
        if not own:
            return host
        gen = self.plugins.pm.generation
        hit = plan.combined.get(hook)
        if hit is None or hit[0] != gen:
            hit = plan.combined[hook] = (gen, self.plugins.impls(hook, extra=own))
        return hit[1]

    def _definition_hooks(self, definition: Definition) -> dict[str, tuple[Any, ...]]:
        """Return the hook implementations a definition names (``hooks:`` and ``guardrails:``), per hook.

        Nothing is imported from a name a definition gives. A ``hooks:`` entry is a hook set
        registered by name; else the name of a plugin this runtime loaded (the assembly's
        ``plugins:``, entry points, a host's), whose hooks already apply to every agent, so the
        entry adds nothing; else an installed entry point of group ``loopwright``, checked as a
        hook set. A ``guardrails:`` entry is a registered guardrail, else ``PLUGIN:FUNCTION``, a
        function of a loaded plugin. (A definition an agent wrote was limited to registered names
        by :meth:`check_untrusted` before it started.)

        :raises ConfigError: An entry names none of these.
        :raises PluginError: An entry point's hooks do not match their specs.
        """
        host = self.plugins
        loaded = set(host.plugin_names())
        found: dict[str, list[Any]] = {}
        for ref in definition.hooks:
            if ref in host.hook_sets:
                impls = host.hook_sets.get(ref)
            elif ref in loaded:
                continue
            elif (entry_point := host.installed(ref)) is not None:
                try:
                    plugin = entry_point.load()
                except Exception as exc:
                    raise ConfigError(f"definition {definition.name!r}: cannot load the entry point {ref!r}: "
                                      f"{exc}") from exc
                impls = hook_set(plugin, f"{ref} (definition)")
            else:
                raise ConfigError(
                    f"definition {definition.name!r}: hooks: {ref!r} is neither a registered hook set "
                    f"(registered: {', '.join(host.hook_sets.names()) or 'none'}) nor a plugin of the assembly "
                    "or an installed entry point; a definition's hooks are never imported from a path")
            for name, impl in impls.items():
                found.setdefault(name, []).extend(impl)
        for ref in definition.guardrails:
            if ref in host.guardrails:
                policy = host.guardrails.get(ref)
            else:
                plugin_name, sep, attr = ref.rpartition(":")
                plugin = host.pm.get_plugin(plugin_name) if sep and plugin_name in loaded else None
                if plugin is None or not callable(getattr(plugin, attr, None)):
                    raise ConfigError(
                        f"definition {definition.name!r}: guardrails: {ref!r} is neither a registered guardrail "
                        f"(registered: {', '.join(host.guardrails.names()) or 'none'}) nor PLUGIN:FUNCTION of a "
                        "plugin the assembly loads; a guardrail is never imported from a path")
                policy = checked_guardrail(ref, getattr(plugin, attr), plugin_name)
            found.setdefault("loopwright_before_tool_call", []).append(_guardrail_impl(ref, policy))
        return {k: tuple(v) for k, v in found.items()}

    def output_problems(self, definition: Definition, text: str | None) -> Any:
        """Check a final answer against the definition's ``output`` schema (see ``_loop.parse_output``)."""
        plan = self._plan(definition)
        if plan.output_validator is None:
            # RE2 for patterns: a model-written ``pattern`` must not be able to hang the loop. The
            # loader refused patterns RE2 cannot compile; lenient covers a definition built otherwise.
            plan.output_validator = schema_validator(definition.output or {}, lenient=True)
        return parse_output(text, plan.output_validator)

    def tool_for(self, definition: Definition, name: str, grants: Capabilities | None = None) -> Tool | None:
        """Return the tool ``name`` if the definition has it (and ``grants`` make it available)."""
        tool = self._plan(definition).tools.get(name)
        if tool is not None and grants is not None and tool.available is not None and not tool.available(grants):
            return None
        return tool

    def tool_names(self, definition: Definition, grants: Capabilities | None = None) -> list[str]:
        """Return the names of the definition's tools (those ``grants`` make available)."""
        tools = self._plan(definition).tools
        return [n for n, t in tools.items() if grants is None or t.available is None or t.available(grants)]

    def tool_specs(self, definition: Definition, grants: Capabilities | None = None) -> tuple[ToolSpec, ...]:
        """Return what the model is told about the definition's tools (the same tuple every turn).

        With ``grants``, tools whose ``available`` check refuses them are left out.
        """
        plan = self._plan(definition)
        if grants is None or not plan.gated:
            return plan.specs
        specs = plan.offered.get(grants)
        if specs is None:
            specs = plan.offered[grants] = tuple(
                t.spec for t in plan.tools.values() if t.available is None or t.available(grants))
        return specs

    def limits_for(self, definition: Definition) -> Limits:
        """Return the effective limits: defaults, then the assembly's, then the definition's."""
        return self._plan(definition).limits

    def limits_of(self, inst: Instance) -> Limits:
        """Return an instance's own limits: its definition's, capped by the ``budget`` its caller gave it.

        A budget (``tokens``, ``cost``, ``toolCalls``, ``elapsed`` seconds) is what remained of the
        tree's budget when the instance started; each applies to every segment. While it runs, the
        loop also holds it to each live ancestor's limits (:meth:`loopwright._loop.Loop.budgets`).
        """
        limits = self._plan(inst.definition).limits
        budget = inst.header.get("budget")
        if not budget:
            return limits
        return attrs.evolve(
            limits, tokens=_smaller(limits.tokens, budget.get("tokens")),
            cost=_smaller(limits.cost, budget.get("cost")),
            tool_calls=_smaller(limits.tool_calls, budget.get("toolCalls")),
            elapsed=_smaller(limits.elapsed, budget.get("elapsed")))

    def context_strategy(self, definition: Definition) -> ContextStrategy | None:
        """Return the definition's context strategy, built once."""
        return self._plan(definition).strategy

    # -- records ----------------------------------------------------------------------------

    def queue_record(self, instance_id: str, kind: str, data: Mapping[str, Any]) -> None:
        """Queue a record; :meth:`flush_records` writes it with the next save."""
        self._records.setdefault(instance_id, []).append(
            {"kind": kind, "instanceId": instance_id, "at": now_iso(), "data": data})

    async def flush_records(self, instance_id: str) -> None:
        """Write queued records to the store, the record sinks and the ``on_record`` hook."""
        queued = self._records.pop(instance_id, None)
        if not queued:
            return
        await self.store.append_records(instance_id, queued)
        impls = self.plugins.impls("loopwright_on_record")
        if not impls and not self._sinks:
            return

        for raw in queued:
            record = Record(kind=raw["kind"], instance_id=instance_id, at=raw["at"], data=raw["data"])
            for sink in self._sinks:
                try:
                    await sink.write(record)
                except Exception as exc:  # noqa: BLE001 - sinks fail open
                    self.queue_record(instance_id, "observer_error",
                                      {"plugin": type(sink).__name__, "error": f"{type(exc).__name__}: {exc}"})
            if impls:
                await notify(impls, {"record": record}, on_error=lambda plugin, exc: self.queue_record(
                    instance_id, "observer_error", {"plugin": plugin, "error": f"{type(exc).__name__}: {exc}"}))

    async def write_header(self, inst: Instance) -> None:
        """Save the instance's header atomically, one write at a time per instance.

        Writes of one instance's header are applied in the order they were asked for, each
        with the header as it is when its turn comes: two writes in flight at once (two agents
        started in parallel by the same caller, a store that writes in a worker thread) can
        never leave the older copy on disk.
        """
        lock = self._header_locks.get(inst.id)
        if lock is None:
            lock = self._header_locks[inst.id] = anyio.Lock()
        try:
            async with lock:
                await self.store.write_header(inst.id, inst.header)
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting and self._header_locks.get(inst.id) is lock:
                del self._header_locks[inst.id]

    # -- starting and finding instances -----------------------------------------------------

    def load_definition(self, definition: str | os.PathLike[str] | Definition | Mapping[str, Any]) -> Definition:
        """Return a :class:`Definition` from a path, a registered name, a mapping or a Definition."""
        if isinstance(definition, Definition):
            return definition
        from loopwright._config import load_definition  # noqa: PLC0415 - the loader (YAML, JSON Schema) only for a file

        if isinstance(definition, Mapping):
            return load_definition(definition)
        registered = self.assembly.agent_definitions.get(str(definition))
        if registered is not None:
            path = Path(registered)
            return load_definition(path if path.is_absolute() else self.assembly.base_dir / path)
        return load_definition(Path(definition))

    async def start_agent(
        self, definition: str | os.PathLike[str] | Definition | Mapping[str, Any],
        inputs: Mapping[str, Any] | None = None, prompt: str | None = None, *,
        capabilities: Capabilities | None = None, stream: bool = False, instance_id: str | None = None,
        history: Sequence[Message] = (),
    ) -> AgentRun:
        """Create an instance of ``definition`` and start running it in the background.

        :param definition: A definition file, a name from the assembly's ``agentDefinitions``, a
            mapping or a :class:`Definition`.
        :param inputs: Values for the definition's ``inputs`` (templated into its prompts).
        :param prompt: The task prompt, added after the initial prompts.
        :param history: Earlier messages of a conversation (``system``, ``user`` or ``assistant``,
            text only), added after the initial prompts and before ``prompt``, as they are (never
            templated). Protocol surfaces use it to carry a client's chat history.
        :param capabilities: Grants to ask for; narrowed to the runtime's (never widened). Relative
            roots are resolved against the assembly's folder, never the working folder.
        :param stream: Ask providers to stream.
        :param instance_id: An id to use instead of a generated one.
        :return: The run; ``await run.result()`` waits for it to rest.
        :raises ConfigError: The definition or inputs are invalid, or it names unknown tools, or
            ``history`` holds a message that is not plain text of those roles, or is given to a
            definition whose ``initialPrompts`` inject tool calls (which could defer the prompt).
        :raises CapabilityError: A granted root would reach the store or a record sink.
        """
        defn = self.load_definition(definition)
        grants = self._requested_grants(capabilities)
        return await self.create_run(defn, inputs, prompt, grants=grants, stream=stream, instance_id=instance_id,
                                     history=history)

    def _requested_grants(self, capabilities: Capabilities | None) -> Capabilities:
        """Return the grants of a new top-level instance: ``capabilities`` narrowed to the runtime's.

        Relative roots are resolved against the assembly's folder.

        :raises CapabilityError: A granted root would reach the store or a record sink.
        """
        if capabilities is not None:
            capabilities = resolve_roots(capabilities, self.assembly.base_dir)
        grants = intersect(self.assembly.capabilities, capabilities)
        self._check_out_of_reach(grants)
        return grants

    def _check_out_of_reach(self, grants: Capabilities) -> None:
        """Raise CapabilityError if a granted root overlaps the store or a record sink's locations."""
        base = self.assembly.base_dir
        check_store_outside(self.store.locations(), grants, base=base)
        for sink, spec in zip(self._sinks, self.assembly.records, strict=False):
            check_store_outside(sink.locations(), grants, base=base, what=f"the record sink {spec.kind!r}")

    async def create_run(
        self, defn: Definition, inputs: Mapping[str, Any] | None, prompt: str | None, *, grants: Capabilities,
        stream: bool = False, instance_id: str | None = None, links: Mapping[str, Any] | None = None,
        spawner: Instance | None = None, history: Sequence[Message] = (),
    ) -> AgentRun:
        """Create an instance of ``defn`` with exactly ``grants`` and start it (see :meth:`start_agent`).

        :param grants: The instance's grants, already narrowed by the caller (never widened here).
        :param links: Header keys linking a child to its spawner (``spawnerInstanceId``,
            ``callerInstanceId``, ``callerToolCallId``, ``delegationPrompt``, ``depth``).
        :param spawner: The live instance that started it: it draws from that instance's tree budget.
        """
        self.loop  # noqa: B018 - raises if the runtime is not open
        header = self._new_header(defn, inputs, prompt, grants=grants, instance_id=instance_id, history=history)
        iid = header["instanceId"]
        if links:
            header.update(links)
        # Created with its lease held: a worker polling the store never takes it for a dead runner's.
        lease = await self.store.create_leased(iid, header, self.owner)
        try:
            inst = Instance(id=iid, definition=defn, header=header, grants=grants, task_given=not prompt,
                            spawner=spawner, tree_counted=True)
            self._instances[iid] = inst
            run = AgentRun(self, inst)
            run.stream = stream
            self._runs[iid] = run
            await self._announce_running(inst)
        except BaseException:
            lease.release()
            raise
        await self._start_first_segment(run, lease)
        return run

    async def _announce_running(self, inst: Instance) -> None:
        """Record, and tell observers, a new instance's first state: ``running``."""
        self.queue_record(inst.id, "state", {"from": None, "to": State.RUNNING.value, "stopReason": None})
        if self.plugins.impls("loopwright_on_state_change"):
            await self.loop.observe(inst, "loopwright_on_state_change", old=None, new=State.RUNNING.value,
                                    stop_reason=None)

    async def _start_first_segment(self, run: AgentRun, lease: Lease) -> None:
        """Start a new instance's first segment (its set-up, :meth:`_begin`, first); the lease is handed over."""
        await self._start_segment(run, Start(), lease=lease, fresh=True)

    def _new_header(self, defn: Definition, inputs: Mapping[str, Any] | None, prompt: str | None, *,
                    grants: Capabilities, instance_id: str | None,
                    history: Sequence[Message] = ()) -> dict[str, Any]:
        """Check ``defn`` and ``inputs`` and return a new instance's header (``running``, run by this runtime).

        Every configuration error is raised here, before anything is created.

        :raises ConfigError: The definition or inputs are invalid, or it names unknown tools.
        """
        plan = self._plan(defn)
        values = resolve_inputs(defn, inputs or {})
        self._check_templates(defn, values)
        task_history = _history_json(defn, history)
        iid = instance_id or _new_id()
        header = {
            "instanceId": iid, "name": defn.name, "version": 1,
            "definitionPath": str(defn.source) if defn.source else None,
            "definition": self._snapshot(plan), "inputs": dict(values),
            "state": State.RUNNING.value, "stopReason": None, "cancelled": False, "error": None,
            "capabilities": capabilities_to_dict(grants), "capabilitiesRecorded": True,
            "pendingApprovals": [], "inbox": [],
            "spawnerInstanceId": None, "callerInstanceId": None, "callerToolCallId": None,
            "delegationPrompt": None, "createdAt": now_iso(), "updatedAt": now_iso(), "model": plan.model_ref,
            "runner": self.owner, "taskPrompt": prompt,
        }
        if task_history:
            header["taskHistory"] = task_history
        return header

    async def _begin(self, run: AgentRun, *, resume: bool = False) -> None:  # noqa: C901 - the set-up, in order
        """First segment of a new instance: system prompt, initial prompts and injected calls, task prompt.

        What has no tool call is saved in as few writes as possible (everything, for a definition
        without injected calls: one write), each initial prompt marked with its index (``ip``)
        and the task prompt marked ``task``. So after a crash, ``resume=True`` carries on from the
        first part that was not saved.
        """
        loop = self.loop
        inst = run.inst
        defn = inst.definition
        values = inst.header.get("inputs") or {}
        prompt = inst.header.get("taskPrompt")
        pending: list[tuple[Message, dict[str, Any]]] = []

        async def flush() -> None:
            if pending:
                await loop.save(inst, [entry for _m, entry in pending])
                for message, _entry in pending:
                    await loop.observe(inst, "loopwright_on_message", message=message)
                pending.clear()

        def queue(message: Message, **marks: Any) -> None:
            inst.transcript.append(message)
            pending.append((message, {"t": "msg", "m": message_to_json(message), **marks}))

        has_system = bool(inst.transcript) and inst.transcript[0].role == "system"
        if defn.system_prompt and not (resume and has_system):
            queue(Message(role="system", content=render(defn.system_prompt, values)))
        for n, ip in enumerate(defn.initial_prompts):
            if resume and n <= inst.last_initial:
                continue
            content = render(ip.content, values) if ip.content else None
            if not ip.tool_calls:
                queue(Message(role=ip.role, content=content, source="definition", injected=True), ip=n)
                continue
            calls = tuple(
                ToolCall(id=tc.id or f"injected_{n}_{k}", name=tc.name,
                         arguments=render_value(dict(tc.arguments), values), injected=True)
                for k, tc in enumerate(ip.tool_calls))
            queue(Message(role="assistant", content=content, tool_calls=calls, injected=True), ip=n)
            await flush()
            try:
                await loop.run_calls(run, calls, self.limits_of(inst))
            except SegmentEnd as end:
                if end.reason in (StopReason.WAITING_FOR_APPROVAL, StopReason.WAITING):
                    self._defer_task(inst)
                raise
        for entry in inst.header.get("taskHistory") or ():
            role = entry["role"]
            queue(Message(role=role, content=entry["content"], source="api" if role == "user" else None))
        if prompt:
            queue(Message(role="user", content=prompt, source="api"), task=True)
        await flush()

    def _defer_task(self, inst: Instance) -> None:
        """Seed 000: the task prompt goes behind a held injected turn; the remaining initial prompts do not run."""
        prompt = inst.header.get("taskPrompt")
        if prompt and not any(i.get("behindTurn") for i in inst.header.get("inbox") or []):
            inst.header.setdefault("inbox", []).append(
                {"type": "message", "text": prompt, "source": "api", "at": now_iso(), "behindTurn": True})

    def _still_beginning(self, inst: Instance) -> bool:
        """Whether a crash stopped the first segment before its task prompt was given or deferred."""
        return bool(inst.header.get("taskPrompt")) and not inst.task_given and not any(
            i.get("behindTurn") for i in inst.header.get("inbox") or [])

    async def _start_segment(
        self, run: AgentRun, segment: Segment, *, lease: Lease | None = None, fresh: bool = False,
    ) -> None:
        """Take the instance's runner lease and start a segment of kind ``segment`` in the background.

        :param lease: A lease the caller already holds (it is handed over).
        :param fresh: The instance was just created here, so the copy in memory is current.
        :raises InstanceLockedError: Another runner (in any process) holds the instance.
        """
        if self._tg is None:
            raise LoopwrightError("the runtime is not open: use 'async with runtime:'")
        if run.running:
            raise LoopwrightError(f"instance {run.instance_id} is already running here")
        if lease is None:
            lease = await self.store.acquire(run.instance_id, self.owner)
        try:
            if not fresh:
                await self._refresh(run)
                # A cancel posted to a segment that has ended came too late and is dropped; one
                # posted to an instance its dead runner left running still stands: it stops the
                # instance before anything more runs (see _drive).
                if await self.loop.absorb_mail(run, running=run.inst.state is State.RUNNING):
                    run._cancelled = True  # noqa: SLF001 - the runtime drives its runs
                await self._join_tree(run.inst)
        except BaseException:
            lease.release()
            raise
        run._done = anyio.Event()  # noqa: SLF001 - the runtime drives its runs
        run._history.clear()  # noqa: SLF001
        run.failure = None
        for watch in list(self._segment_watchers):
            watch(run)
        self._tg.start_soon(self._drive, run, segment, lease)

    async def _refresh(self, run: AgentRun) -> None:
        """Reload the instance if another process changed it since this copy was read."""
        header = await self.store.read_header(run.instance_id)
        if header.get("updatedAt") == run.inst.header.get("updatedAt") and not run._stale:  # noqa: SLF001
            return
        inst = run.inst
        await restore(inst, self.store)  # replaces nothing if the log cannot be read
        inst.header = header
        inst.grants = self._saved_grants(run.instance_id, header)
        run._stale = False  # noqa: SLF001 - the runtime drives its runs

    async def _join_tree(self, inst: Instance) -> None:
        """Make an instance loaded from the store draw from its tree's one budget.

        Each instance on the way up is counted once per runtime (:meth:`_count_tree`), and linked
        to its spawner's live instance, loading the spawner if it is not live here. A spawner
        that cannot be loaded ends the chain (the saved ``budget`` still caps the instance); a
        tampered link that would make a loop is not followed.
        """
        current = inst
        while True:
            await self._count_tree(current)
            spawner_id = current.header.get("spawnerInstanceId")
            if current.spawner is not None or not isinstance(spawner_id, str) or not spawner_id:
                return
            try:
                parent = (await self.get_agent(spawner_id)).inst
            except LoopwrightError:
                return
            if any(above is current for above in (parent, *parent.ancestors())):
                return
            current.spawner = parent
            current = parent

    async def _count_tree(self, inst: Instance) -> None:
        """Set a loaded instance's tree counters from its descendants' saved headers (once per runtime).

        ``descendants`` counts them all; the tokens, cost and tool calls are those of the descendants
        created since its current segment started (their whole spending: more than their share,
        never less), from the totals in their headers, or from the entry log of one a crash left
        ``running`` (its header's totals are those of its last state change).
        """
        if inst.tree_counted:
            return
        inst.tree_counted = True
        headers = await self._descendant_headers(inst.header)
        started = inst.header.get("segmentStartedAt")
        since = _iso(float(started)) if isinstance(started, (int, float)) else ""
        tokens, calls, cost = 0, 0, 0.0
        for iid, h in headers.items():
            if str(h.get("createdAt") or "") < since:
                continue
            if h.get("state") == State.RUNNING.value:  # its totals were saved at its last state change: replay its log
                usage, spent, ran = log_totals(await self.store.read_entries(iid))
                tokens += usage.input_tokens + usage.output_tokens
                calls += ran
                cost = None if cost is None or spent.amount is None else cost + spent.amount
                continue
            ran = h.get("toolCallsStarted")
            calls += ran if isinstance(ran, int) and not isinstance(ran, bool) and ran > 0 else 0
            saved = h.get("usage")
            if isinstance(saved, Mapping):
                tokens += sum(n for n in (saved.get("inputTokens"), saved.get("outputTokens"))
                              if isinstance(n, int) and not isinstance(n, bool) and n > 0)
            amount = h.get("cost", 0.0)
            cost = None if cost is None or not isinstance(amount, (int, float)) else cost + max(amount, 0.0)
        inst.descendants = max(inst.descendants, len(headers))
        inst.tree_tokens += tokens
        inst.tree_tool_calls += calls
        inst.tree_cost = None if inst.tree_cost is None or cost is None else inst.tree_cost + cost

    async def _drive(self, run: AgentRun, segment: Segment, lease: Lease) -> None:
        loop = self.loop
        inst = run.inst
        try:
            while True:
                with anyio.CancelScope() as scope:
                    run._scope = scope  # noqa: SLF001
                    if run._cancelled:  # noqa: SLF001
                        scope.cancel()
                    await loop.run_segment(run, segment)
                if scope.cancelled_caught and run._cancelled:  # noqa: SLF001
                    with anyio.CancelScope(shield=True):
                        await loop.settle_cancelled(run)
                        await loop.set_state(run, State.STOPPED, StopReason.CANCELLED, cancelled=True)
                    break
                # A message that arrived after the last turn boundary starts the next segment
                # now, so nothing posted while the instance was running is left unread.
                if inst.state is State.WAITING_FOR_APPROVAL or not await loop.has_mail(run):
                    break
                segment = LateMail()
        except (LeaseLostError, StoreUnavailableError) as exc:
            # Not the instance's failure: another runner took it over (this one's write was
            # refused), or the store stayed out of reach. Its state stays as last saved, for its
            # new runner or the next worker; the copy here may be ahead of the store.
            run.failure = exc
            run._stale = True  # noqa: SLF001
            self._records.pop(inst.id, None)  # the segment's unsaved records go with it
            _log.warning("instance %s: segment ended without a state change: %s", inst.id, exc)
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the instance "running"
            run.failure = exc
            with anyio.CancelScope(shield=True):
                loop.record(inst, "error", {"message": f"{type(exc).__name__}: {exc}", "internal": True})
                try:
                    await loop.set_state(run, State.ERROR, StopReason.ERROR, error=f"{type(exc).__name__}: {exc}")
                except StoreError as saving:
                    # Saving the error failed too: the instance stays as last saved (a worker
                    # resumes it); this must not take down the other segments of the runtime.
                    run._stale = True  # noqa: SLF001
                    _log.warning("instance %s: cannot save the error state: %s", inst.id, saving)
        finally:
            try:
                # At rest, still holding the lease: a store may fold its log into a checkpoint
                # (only when it grew enough since the last one), so loading it later costs O(1).
                if not run._stale:  # noqa: SLF001 - no checkpoint of a copy that may be ahead of the store
                    with anyio.CancelScope(shield=True):
                        await self.store.checkpoint(inst.id, fold_checkpoint)
            except StoreError as exc:
                _log.warning("instance %s: no checkpoint: %s", inst.id, exc)
            finally:
                lease.release()
                run._scope = None  # noqa: SLF001
                run._cancelled = False  # noqa: SLF001
                run._done.set()  # noqa: SLF001
                run.close_followers()

    async def _watch_for_cancel(self) -> None:
        """While the runtime is open, look for posts other processes made to the instances running here.

        One task for the whole runtime: every :data:`_CANCEL_POLL` seconds it looks at the
        mailbox of each segment running here (an ``fstat`` per instance for the file store), so
        that a cancel request stops even a long tool call. Messages are read at turn boundaries;
        a run that crossed one within the last poll interval read its mailbox then and is skipped.
        """
        while True:
            await anyio.sleep(_CANCEL_POLL)
            fresh = time.monotonic() - _CANCEL_POLL
            for run in list(self._runs.values()):
                if not run.running or run._scope is None or run.mail_read_at > fresh:  # noqa: SLF001
                    continue
                try:
                    posted = await self.loop.cancel_posted(run)
                except StoreError as exc:  # the store is out of reach: look again at the next poll
                    _log.warning("instance %s: cannot look for a cancel request: %s", run.instance_id, exc)
                    continue
                if posted:
                    run.request_cancel()

    def running(self) -> list[AgentRun]:
        """Return the runs with a segment running in this runtime now."""
        return [run for run in list(self._runs.values()) if run.running]

    async def wait_idle(self) -> None:
        """Wait until no segment runs in this runtime, those of agents started by agents included."""
        while True:
            running = self.running()
            if not running:
                return
            await running[0].wait()

    async def get_agent(self, instance_id: str) -> AgentRun:
        """Return the run of an instance, loading it from the store if it is not live here.

        :raises InstanceNotFoundError: No such instance.
        :raises GrantsError: Its saved grants are marked recorded but malformed (fails closed).
        """
        run = self._runs.get(instance_id)
        if run is not None:
            return run
        inst = self._instances.get(instance_id)  # a spawner whose run was let go: the same ledger
        if inst is not None:
            run = AgentRun(self, inst)
            await self._refresh(run)  # as loading would: what another process saved since wins
            self._runs[instance_id] = run
            return run
        header = await self.store.read_header(instance_id)
        defn = self._definition_from_header(instance_id, header)
        grants = self._saved_grants(instance_id, header)
        inst = Instance(id=instance_id, definition=defn, header=header, grants=grants)
        await restore(inst, self.store)
        self._instances[instance_id] = inst
        run = AgentRun(self, inst)
        self._runs[instance_id] = run
        if header.get("monitors") and self.monitors is not None:
            self.monitors.load(header)
        return run

    def _definition_from_header(self, instance_id: str, header: Mapping[str, Any]) -> Definition:
        snapshot = header.get("definition")
        if isinstance(snapshot, Mapping):
            from loopwright._config import definition_from_dict  # noqa: PLC0415 - the loader only to resume a saved definition

            try:
                defn = definition_from_dict(snapshot)
            except ConfigError as exc:
                raise StoreError(f"saved definition is invalid: {exc}", instance_id=instance_id) from exc
        elif header.get("definitionPath"):
            defn = self.load_definition(header["definitionPath"])
        else:
            raise StoreError("the header holds no definition", instance_id=instance_id)
        if "inheritedGates" not in header:
            if header.get("spawnerInstanceId"):
                raise GrantsError("it was started by an agent but its header has no inheritedGates (its caller's "
                                  "gates); refusing to run it", instance_id=instance_id)
            return defn
        # The caller's gates, saved at spawn: applied again, so the child never runs without them.
        try:
            return with_gates(defn, gates_from_json(header["inheritedGates"]))
        except ValueError as exc:
            raise GrantsError(f"saved inheritedGates are malformed ({exc}); refusing to run it",
                              instance_id=instance_id) from exc

    def _saved_grants(self, instance_id: str, header: Mapping[str, Any]) -> Capabilities:
        """Return the saved grants intersected with this runtime's; fail closed on a bad marker."""
        if header.get("capabilitiesRecorded"):
            try:
                saved = capabilities_from_dict(header.get("capabilities"))
            except ValueError as exc:
                raise GrantsError(f"saved grants are marked recorded but are not valid ({exc}); "
                                  "refusing to run it", instance_id=instance_id) from exc
            return intersect(self.assembly.capabilities, saved)
        if "capabilities" in header:
            raise GrantsError("saved grants have no capabilitiesRecorded marker; refusing to run it",
                              instance_id=instance_id)
        return self.assembly.capabilities

    async def list_instances(self, state: str | None = None) -> list[dict[str, Any]]:
        """Return every instance's summary (see :func:`summary`), optionally only those in ``state``."""
        headers = await self.store.list_headers()
        by_id = {h.get("instanceId"): h for h in headers}
        return [summary(h, subtree_cost=_subtree_in(h, by_id, set()))
                for h in headers if state is None or h.get("state") == state]

    async def summary(self, instance_id: str) -> dict[str, Any]:
        """Return one instance's summary (``show``), its ``subtreeCost`` read through its children.

        Also ``treePendingApprovals`` (every undecided call in its subtree, each with its holder's
        ``instanceId`` and ``path``) and ``tree`` (see :meth:`tree`). The totals of an instance
        saved as ``running`` and not run here come from its entry log: its header has them only as
        of its last state change (a killed process saved turns since).
        """
        header = await self.store.read_header(instance_id)
        if header.get("state") == State.RUNNING.value and instance_id not in self._runs:
            header = {**header, **entry_totals(await self.store.read_entries(instance_id))}
        data = summary(header, subtree_cost=await self.subtree_cost(instance_id, header))
        data["tree"] = await self.tree(instance_id)
        data["treePendingApprovals"] = [approval_to_json(p) for p in await self.tree_approvals(instance_id)]
        return data

    async def subtree_cost(self, instance_id: str, header: Mapping[str, Any] | None = None) -> float | None:
        """Return the instance's cost plus that of every agent it started, directly or not.

        ``None`` when any part is unknown. Each instance's own cost is what its header holds
        (brought up to date at every state change).
        """
        if header is None:
            header = await self.store.read_header(instance_id)
        own = header.get("cost", 0.0)
        children = await self.children_cost(header)
        return None if own is None or children is None else own + children

    async def children_cost(self, header: Mapping[str, Any]) -> float | None:
        """Return the summed subtree cost of the agents ``header``'s instance started (``None`` if unknown)."""
        by_id = await self._descendant_headers(header)
        return _children_in(header, by_id, {header.get("instanceId")})

    async def _descendant_headers(self, header: Mapping[str, Any]) -> dict[Any, Mapping[str, Any]]:
        """Return the saved headers of the agents ``header``'s instance started, directly or not, by id."""
        by_id: dict[Any, Mapping[str, Any]] = {}
        pending = list(header.get("children") or [])
        while pending:  # read the descendants' headers once each, then sum as list_instances does
            child = pending.pop()
            if child in by_id or child == header.get("instanceId"):
                continue
            try:
                by_id[child] = await self.store.read_header(child)
            except InstanceNotFoundError:
                continue
            pending.extend(by_id[child].get("children") or [])
        return by_id

    async def records(self, instance_id: str) -> list[dict[str, Any]]:
        """Return the instance's record log."""
        await self.store.read_header(instance_id)
        return await self.store.read_records(instance_id)

    # -- steering ---------------------------------------------------------------------------

    async def approve(self, instance_id: str, tool_call_id: str | None = None) -> AgentRun:
        """Approve held calls of an instance (live or saved); return its run."""
        run = await self.get_agent(instance_id)
        await run.approve(tool_call_id)
        return run

    async def deny(self, instance_id: str, tool_call_id: str | None = None, reason: str | None = None) -> AgentRun:
        """Deny held calls of an instance (live or saved); return its run."""
        run = await self.get_agent(instance_id)
        await run.deny(tool_call_id, reason)
        return run

    async def message(self, instance_id: str, text: str, *, source: str = "api") -> AgentRun:
        """Send a message to an instance (live or saved); return its run."""
        run = await self.get_agent(instance_id)
        await run.message(text, source=source)
        return run

    async def cancel(self, instance_id: str, *, timeout: float = 30.0) -> AgentRun:  # noqa: ASYNC109
        """Cancel an instance, live here, resting, or running in another process.

        Another process's run is asked through the instance's mailbox; this waits (up to
        ``timeout`` seconds) until that runner has stopped it, then returns the reloaded run.
        """
        run = await self.get_agent(instance_id)
        await self.cancel_run(run, timeout=timeout)
        return run

    async def resume(self, instance_id: str) -> AgentRun:
        """Continue an instance a crash left ``running``; a resting instance is left as it is.

        One waiting for approval whose held calls are all decided (the process that saved the
        last decision died before it went on) goes on as that decision would have.

        :raises InstanceLockedError: It is running in another process.
        """
        run = await self.get_agent(instance_id)
        if run.running:
            return run
        lease = await self.store.acquire(instance_id, self.owner)
        try:
            await self._refresh(run)
        except BaseException:
            lease.release()
            raise
        pending = run.inst.pending_approvals
        if run.inst.state is State.WAITING_FOR_APPROVAL and pending and all(p.decision for p in pending):
            await self._continue_decided(run, lease)
            return run
        if run.inst.state is not State.RUNNING:
            lease.release()
            return run
        if run.inst.header.get("queued") is True:  # submitted, never started: start it here
            await self._start_queued(run, lease)
            return run
        await self._start_resumed(run, lease)
        return run

    # -- fork and rewind ---------------------------------------------------------------------

    async def _history_point(self, run: AgentRun, turn: int | None, what: str,
                             ) -> tuple[list[Message], int, list[str]]:
        """Return the history at the end of ``turn``, that turn, and the agents started after it.

        :raises LoopwrightError: The instance is running, ``turn`` is not in its history, or the
            point is inside a held turn (a call without its result: held for approval, or an
            ``ask_user`` question not yet answered).
        """
        inst = run.inst
        if run.running or inst.state is State.RUNNING:
            raise LoopwrightError(f"cannot {what} instance {inst.id}: it is running; let it rest first")
        entries = await self.store.read_entries(inst.id)
        try:
            messages, at = history_at(entries, turn)
        except ValueError as exc:
            raise LoopwrightError(f"cannot {what} instance {inst.id} at turn {turn}: {exc}") from None
        _assistant, unanswered = unanswered_calls(messages)
        if unanswered:
            ids = ", ".join(c.id for c in unanswered)
            raise LoopwrightError(
                f"cannot {what} instance {inst.id} at turn {at}: that turn is held (its calls {ids} wait for "
                "approval or an answer); decide them first, or choose an earlier turn")
        known = {c.id for m in messages for c in m.tool_calls}
        later: list[str] = []
        for child in inst.header.get("children") or []:
            try:
                link = (await self.store.read_header(child)).get("callerToolCallId")
            except InstanceNotFoundError:
                continue
            if link not in known:
                later.append(str(child))
        return messages, at, later

    async def fork(self, instance_id: str, at_turn: int | None = None) -> AgentRun:
        """Create a new instance whose history is ``instance_id``'s up to the end of ``at_turn``.

        By default the history as it stands (the instance rests). The new instance records
        ``forkedFrom: {instanceId, turn}``, keeps the original's grants, gates and budget (never
        wider: its saved grants intersected with this runtime's), starts no agent and copies
        none, and rests ``waiting``, ready for a message. The original is not changed. Its
        history ends with a note that the agents the original started belong to the original.

        :raises LoopwrightError: The original is running, the turn is not in its history, or
            it is inside a held turn.
        """
        src = await self.get_agent(instance_id)
        if not src.running:
            await self._refresh(src)  # what another process saved since wins
        messages, at, later = await self._history_point(src, at_turn, "fork")
        original = src.inst.header
        grants = self._saved_grants(instance_id, original)
        iid = _new_id()
        header = {key: value for key, value in original.items() if key not in _NOT_FORKED}
        header.update({
            "instanceId": iid, "state": State.WAITING.value, "stopReason": StopReason.WAITING.value,
            "cancelled": False, "error": None, "capabilities": capabilities_to_dict(grants),
            "capabilitiesRecorded": True, "pendingApprovals": [], "inbox": [], "children": [],
            "spawnerInstanceId": None, "callerInstanceId": None, "callerToolCallId": None,
            "forkedFrom": {"instanceId": instance_id, "turn": at}, "createdAt": now_iso(), "updatedAt": now_iso(),
            "runner": self.owner, "turns": at, "usage": {}, "cost": 0.0, "toolCallsStarted": 0,
        })
        children = [str(c) for c in original.get("children") or []]
        if children:
            messages.append(Message(role="user", source="runtime", content=_fork_note(instance_id, at, children,
                                                                                        later)))
        await self.store.create(iid, header)
        await self.store.append_entries(iid, [
            {"t": "fork", "from": instance_id, "turn": at, "messages": [message_to_json(m) for m in messages]}])
        self.queue_record(iid, "fork", {"from": instance_id, "turn": at, "agentsOfTheOriginal": children})
        self.queue_record(instance_id, "fork", {"to": iid, "turn": at})
        await self.flush_records(iid)
        await self.flush_records(instance_id)
        return await self.get_agent(iid)

    async def rewind(self, instance_id: str, to_turn: int) -> AgentRun:
        """Move a resting instance back to the end of ``to_turn``; it rests ``waiting``, ready for a message.

        The entry log stays append-only: a ``rewind`` entry holds the history at that point, and
        what came after stays in the log and the records (a ``rewind`` record marks it). Agents it
        started after the point keep running or resting as they were; the history ends with a
        note naming them.

        :raises LoopwrightError: It is running or waiting for approval, the turn is not in its
            history, or the point is inside a held turn.
        :raises InstanceLockedError: Another process runs it.
        """
        run = await self.get_agent(instance_id)
        if run.running:
            raise LoopwrightError(f"cannot rewind instance {instance_id}: it is running; let it rest first")
        lease = await self.store.acquire(instance_id, self.owner)
        try:
            await self._refresh(run)
            inst = run.inst
            if inst.state is State.WAITING_FOR_APPROVAL:
                raise LoopwrightError(
                    f"cannot rewind instance {instance_id}: calls wait for approval; decide them first")
            messages, at, later = await self._history_point(run, to_turn, "rewind")
            if later:
                messages.append(Message(role="user", source="runtime", content=(
                    f"[loopwright] This conversation was rewound to the end of turn {at}. Agents you started after "
                    f"that point still exist: {', '.join(later)}.")))
            entry = {"t": "rewind", "turn": at, "from": inst.turn, "at": now_iso(),
                     "messages": [message_to_json(m) for m in messages]}
            await self.store.append_entries(instance_id, [entry])
            rebuild(inst, await self.store.read_entries(instance_id))
            inst.header.pop("awaitingAnswer", None)
            inst.header.update({"state": State.WAITING.value, "stopReason": StopReason.WAITING.value,
                                "cancelled": False, "error": None, "turns": at, "updatedAt": now_iso()})
            self.queue_record(instance_id, "rewind", {"from": entry["from"], "to": at, "agentsStartedAfter": later})
            await self.write_header(inst)
            await self.flush_records(instance_id)
        finally:
            lease.release()
        return run

    async def _start_resumed(self, run: AgentRun, lease: Lease) -> None:
        """Start the segment that continues an instance a dead runner left ``running`` (lease held)."""
        # A crash before the first segment saved anything: that segment starts over.
        await self._start_segment(run, Resume(new_segment=not run.inst.begun), lease=lease)

    async def pick_up(  # noqa: PLR0911 - one return per kind of work, or none
        self, instance_id: str,
    ) -> tuple[AgentRun, Literal["start", "resume", "approval", "message"]] | None:
        """Start the work another process left for an instance, if it has any.

        The one way a runner advances submitted work (``loopwright worker``, an engine's
        worker). Under the instance's lease, on a fresh copy of it: a submitted instance that no
        runner started yet (``queued``, see :meth:`submit`) starts its first segment; an
        instance left ``running`` (its runner died) is resumed as by :meth:`resume`; one waiting
        for approval whose held calls are all decided goes on as after the last
        :meth:`AgentRun.approve`; a resting one with a message in its mailbox starts a segment
        as :meth:`AgentRun.message` does. A cancel request needs no runner: :meth:`cancel`
        stops a resting or queued instance itself, and the runner of a running one reads it.

        :return: The run (its segment started in the background) and which of the four it
            was, or ``None``: nothing to do, or another runner holds the instance.
        """
        run = await self.get_agent(instance_id)
        if run.running:
            return None
        try:
            lease = await self.store.acquire(instance_id, self.owner)
        except InstanceLockedError:
            return None
        try:
            await self._refresh(run)
            inst = run.inst
            pending = inst.pending_approvals
            if inst.state is State.RUNNING and inst.header.get("queued") is True:
                await self._start_queued(run, lease)
                return run, "start"
            if inst.state is State.RUNNING:
                await self._start_resumed(run, lease)
                return run, "resume"
            if inst.state is State.WAITING_FOR_APPROVAL:
                if not pending or any(p.decision is None for p in pending):
                    lease.release()
                    return None
                await self._continue_decided(run, lease)
                return run, "approval"
            if not await self.loop.has_mail(run):
                lease.release()
                return None
        except BaseException:
            lease.release()
            raise
        await self._start_for_mail(run, lease)
        return run, "message"

    # -- submitting work (engines and workers) ------------------------------------------

    def _open_engine(self) -> None:
        """Build the assembly's engine (``engine: {kind: ...}``, default ``local``) for the open runtime."""
        cfg = self.assembly.engine
        self.engine = self._build(self.plugins.engines, cfg.kind, cfg.options, ("engine",), what="the engine",
                                  make=lambda factory: factory(dict(cfg.options), self))

    async def submit(
        self, definition: str | os.PathLike[str] | Definition | Mapping[str, Any],
        inputs: Mapping[str, Any] | None = None, prompt: str | None = None, *,
        capabilities: Capabilities | None = None, instance_id: str | None = None, history: Sequence[Message] = (),
    ) -> str:
        """Create an instance of ``definition`` for a runner to start, hand it to the engine, and return its id.

        Nothing runs here. The checks are those of :meth:`start_agent` (registered names, grants
        narrowed to the runtime's, roots out of the store's reach, every configuration error
        before anything is created). The instance is saved ``running`` and ``queued``, with no
        runner: a worker (``loopwright worker``, or the engine's) starts it through
        :meth:`pick_up`, which never takes it for a dead runner's. Then
        :meth:`loopwright.abc.Engine.submit` is told; with the ``local`` engine the instance
        waits in the store for a worker. :meth:`get_agent` follows it from any process.

        :param definition: As for :meth:`start_agent`.
        :param inputs: As for :meth:`start_agent`.
        :param prompt: As for :meth:`start_agent`.
        :param capabilities: As for :meth:`start_agent`.
        :param instance_id: An id to use instead of a generated one.
        :param history: As for :meth:`start_agent`.
        :return: The new instance's id.
        :raises ConfigError: The definition or inputs are invalid, or it names unknown tools.
        :raises CapabilityError: A granted root would reach the store or a record sink.
        :raises LoopwrightError: The runtime is not open, or the engine could not take the work
            (the instance stays queued in the store, where a worker's poll finds it).
        """
        self.loop  # noqa: B018 - raises if the runtime is not open
        defn = self.load_definition(definition)
        grants = self._requested_grants(capabilities)
        header = self._new_header(defn, inputs, prompt, grants=grants, instance_id=instance_id, history=history)
        header.update(runner=None, queued=True, submittedBy=self.owner)
        iid = header["instanceId"]
        await self.store.create(iid, header)
        await self.engine.submit(iid)
        return iid

    async def _start_queued(self, run: AgentRun, lease: Lease) -> None:
        """Start the first segment of a submitted instance no runner started yet (the lease is handed over).

        The header stops being ``queued`` before anything else is saved, so a crash from here on
        leaves an instance that a worker resumes as a dead runner's.
        """
        inst = run.inst
        try:
            inst.header.pop("queued", None)
            inst.header["runner"] = self.owner
            inst.header["updatedAt"] = now_iso()
            inst.tree_counted = True  # a top-level instance that never ran: nothing below it yet
            await self.write_header(inst)
            await self._announce_running(inst)
        except BaseException:
            lease.release()
            raise
        await self._start_first_segment(run, lease)

    async def submit_message(self, instance_id: str, text: str, *, source: str = "api") -> None:
        """Post a message to an instance's mailbox for its runner, and tell the engine; nothing runs here.

        A running instance reads it at its next turn boundary; a resting one is picked up by a
        worker (:meth:`pick_up`, ``message``); one waiting for approval reads it once its calls
        are decided.

        :raises InstanceNotFoundError: No such instance.
        """
        self.loop  # noqa: B018 - raises if the runtime is not open
        await self.store.read_header(instance_id)
        await self.store.post(instance_id, {"type": "message", "text": text, "source": source, "at": now_iso()})
        await self.engine.submit(instance_id)

    async def submit_decision(
        self, instance_id: str, tool_call_id: str | None, decision: Literal["approved", "denied"],
        reason: str | None = None, *, subtree: bool = False, by: str | None = None,
    ) -> list[PendingApproval]:
        """Save decisions on held calls (as :meth:`decide`, or :meth:`decide_subtree`), and tell the engine.

        ``by`` names who decided, as in :meth:`decide`.

        Nothing continues here: each holder whose calls are now all decided is handed to the
        engine, and so are the callers above it, for runners to continue (:meth:`pick_up`,
        ``approval``; a caller a dead runner left ``running``, ``resume``).

        :return: What was decided, each entry naming its holder.
        :raises LoopwrightError: As :meth:`decide`.
        """
        run = await self.get_agent(instance_id)
        if subtree:
            decided = await self.decide_subtree(run, decision, reason, by=by, detach=True)
        else:
            decided = await self.decide(run, tool_call_id, decision, reason, by=by, detach=True)
        told: list[str] = []
        for holder in dict.fromkeys(str(p.instance_id or instance_id) for p in decided):
            for iid in (holder, *await self._callers(holder)):
                if iid not in told:
                    told.append(iid)
                    await self.engine.submit(iid)
        return decided

    async def submit_resume(self, instance_id: str) -> bool:
        """Hand an instance with work left to the engine, for a runner to continue; nothing runs here.

        Work left: a dead runner's instance (``running``, lease free), a queued one, or one
        waiting for approval whose held calls are all decided.

        :return: Whether it had such work (a resting instance has none; send it a message).
        :raises InstanceNotFoundError: No such instance.
        """
        self.loop  # noqa: B018 - raises if the runtime is not open
        header = await self.store.read_header(instance_id)
        pending = header.get("pendingApprovals") or []
        decided = header.get("state") == State.WAITING_FOR_APPROVAL.value and bool(pending) and all(
            isinstance(p, Mapping) and p.get("decision") is not None for p in pending)
        if header.get("state") != State.RUNNING.value and not decided:
            return False
        await self.engine.submit(instance_id)
        return True

    async def follow_submitted(self, instance_id: str, *, poll: float = 0.2) -> AgentRun:
        """Wait until an instance other runners advance rests with no work left; return its run, reloaded.

        For work handed to an engine (:meth:`submit`, :meth:`submit_message` ...). It rests when
        it is not ``running`` and has nothing a runner would pick up: no held calls that are all
        decided, and no unread message in its mailbox. An instance ``running`` only because
        calls held in its tree wait for approval counts as resting too (it waits for its
        operator).

        :param poll: Seconds between looks at the store.
        """
        stalled = 0
        while True:
            header = await self.store.read_header(instance_id)
            if header.get("state") == State.RUNNING.value:
                stalled = stalled + 1 if await self.tree_approvals(instance_id) else 0
                if stalled >= 2:  # noqa: PLR2004 - twice: a decision taken in between resets it
                    break
            elif not await self._work_left(instance_id, header):
                break
            await anyio.sleep(poll)
        run = await self.get_agent(instance_id)
        if not run.running:
            await self._refresh(run)
        return run

    async def _work_left(self, instance_id: str, header: Mapping[str, Any]) -> bool:
        """Whether a resting instance has work for a runner: its held calls all decided, or unread mail."""
        pending = header.get("pendingApprovals") or []
        if header.get("state") == State.WAITING_FOR_APPROVAL.value:
            return bool(pending) and all(isinstance(p, Mapping) and p.get("decision") is not None for p in pending)
        cursor = header.get("inboxCursor")
        posts, _ = await self.store.read_posts(instance_id, cursor if isinstance(cursor, int) else 0)
        return any(p.get("type") == "message" for p in posts)

    async def _callers(self, instance_id: str) -> list[str]:
        """Return the ids above ``instance_id`` (its spawner, theirs ...) up to the root, from the saved headers."""
        out: list[str] = []
        seen = {instance_id}
        current = await self.store.read_header(instance_id)
        while True:
            spawner = current.get("spawnerInstanceId")
            if not isinstance(spawner, str) or not spawner or spawner in seen:
                return out
            seen.add(spawner)
            out.append(spawner)
            try:
                current = await self.store.read_header(spawner)
            except InstanceNotFoundError:
                return out

    async def decide(
        self, run: AgentRun, tool_call_id: str | None, decision: Literal["approved", "denied"], reason: str | None,
        *, by: str | None = None, detach: bool = False,
    ) -> list[PendingApproval]:
        """Record a decision on held calls; continue the segment once every one is decided.

        With ``tool_call_id``, the call may be held anywhere in ``run``'s subtree: it is decided
        on the instance that holds it (:meth:`decide_held`), whose callers then go on too. Without,
        every undecided call held by ``run``'s own instance is decided. ``by`` names who decided
        (saved with each decision as ``decidedBy``, and in its ``approval`` record). With ``detach``,
        only the decisions are saved: nothing continues here (see :meth:`submit_decision`).

        :return: What was decided, each entry naming its holder and path.
        :raises LoopwrightError: No such call is waiting for approval (any more), or it is held
            by more than one instance of the tree (name the holder instead).
        """
        if tool_call_id is None:
            return await self.decide_held(run, None, decision, reason, by=by, detach=detach)
        header = await self.store.read_header(run.instance_id)
        own = {p.get("toolCallId") for p in header.get("pendingApprovals") or [] if p.get("decision") is None}
        if tool_call_id in own and header.get("state") == State.WAITING_FOR_APPROVAL.value:
            return await self.decide_held(run, tool_call_id, decision, reason, by=by, detach=detach)
        found = [p for p in await self.tree_approvals(run.instance_id) if p.tool_call_id == tool_call_id]
        if not found:
            raise LoopwrightError(f"no call {tool_call_id!r} is waiting for approval in the tree of instance "
                                  f"{run.instance_id} (it was decided already, or never held)")
        if len({p.instance_id for p in found}) > 1:
            holders = ", ".join(str(p.instance_id) for p in found)
            raise LoopwrightError(f"call {tool_call_id!r} is held by more than one instance ({holders}); "
                                  "decide it on its holder: approve HOLDER --call CALL_ID")
        holder = await self.get_agent(str(found[0].instance_id))
        decided = await self.decide_held(holder, tool_call_id, decision, reason, by=by, detach=detach)
        if not detach:
            await self.wake_callers(holder.instance_id)
        path = found[0].path
        return [attrs.evolve(p, instance_id=holder.instance_id, path=path) for p in decided]

    async def decide_subtree(
        self, run: AgentRun, decision: Literal["approved", "denied"], reason: str | None, *,
        by: str | None = None, detach: bool = False,
    ) -> list[PendingApproval]:
        """Decide every undecided call in ``run``'s subtree, holder by holder (deepest first).

        ``by`` names who decided, as in :meth:`decide`. With ``detach``, only the decisions are
        saved (see :meth:`decide`).

        :return: What was decided, each entry naming its holder and path.
        :raises LoopwrightError: Nothing in the tree waits for approval.
        """
        entries = await self.tree_approvals(run.instance_id)
        if not entries:
            raise LoopwrightError(f"no call is waiting for approval in the tree of instance {run.instance_id}")
        holders: dict[str, list[PendingApproval]] = {}
        for p in entries:
            holders.setdefault(str(p.instance_id), []).append(p)
        decided: list[PendingApproval] = []
        for holder_id in sorted(holders, key=lambda h: -len(holders[h][0].path)):
            holder = await self.get_agent(holder_id)
            path = holders[holder_id][0].path
            done = await self.decide_held(holder, None, decision, reason, by=by, detach=detach)
            decided += [attrs.evolve(p, instance_id=holder_id, path=path) for p in done]
            if holder_id != run.instance_id and not detach:
                await self.wake_callers(holder_id)
        return decided

    async def decide_held(
        self, run: AgentRun, tool_call_id: str | None, decision: Literal["approved", "denied"], reason: str | None,
        *, by: str | None = None, detach: bool = False,
    ) -> list[PendingApproval]:
        """Record a decision on calls ``run``'s own instance holds; continue once every one is decided.

        With ``detach``, the lease is given back once the decisions are saved, even when every
        call is decided: a runner continues it through :meth:`pick_up`.

        The decision is written under the instance's lease, on a fresh copy of its header, so a
        decision from another process is never lost, and two processes deciding the same call
        at once decide (and run) it once: the other one is refused. Each decision records the
        :func:`~loopwright._types.call_digest` of the call as shown; a held entry whose call in
        the log is not the one shown is refused and stays held.

        :return: The entries decided.
        :raises LoopwrightError: Nothing (or not that call) is waiting for approval, or the
            instance runs in another process (which is deciding or running its calls).
        """
        if run.running:
            raise LoopwrightError(f"instance {run.instance_id} is running; it has no call waiting for approval")
        try:
            lease = await self.store.acquire(run.instance_id, self.owner)
        except InstanceLockedError:
            raise LoopwrightError(f"instance {run.instance_id} is running in another process, which is deciding "
                                  "or running its calls: none of them waits for approval here") from None
        try:
            await self._refresh(run)
            inst = run.inst
            pending = inst.pending_approvals
            undecided = [p for p in pending if p.decision is None]
            if not undecided or inst.state is not State.WAITING_FOR_APPROVAL:
                raise LoopwrightError(f"instance {inst.id} has no call waiting for approval")  # noqa: TRY301
            if tool_call_id is not None and tool_call_id not in {p.tool_call_id for p in undecided}:
                raise LoopwrightError(  # noqa: TRY301 - the lease is released by the handler below
                    f"instance {inst.id} has no undecided call {tool_call_id!r}; waiting: "
                    f"{', '.join(p.tool_call_id for p in undecided)}")
            chosen = [p for p in undecided if tool_call_id is None or p.tool_call_id == tool_call_id]
            calls = {c.id: c for c in unanswered_calls(inst.transcript)[1]}
            for p in chosen:
                held = calls.get(p.tool_call_id)
                if held is None or call_digest(held.name, held.arguments) != call_digest(p.tool, p.arguments):
                    raise LoopwrightError(  # noqa: TRY301
                        f"instance {inst.id}: the held call {p.tool_call_id!r} in its log is not the call shown "
                        f"for approval ({p.tool} {_short_json(p.arguments)}); it stays held, undecided")
            ids = {p.tool_call_id for p in chosen}
            decided = [
                attrs.evolve(p, decision=decision, decision_reason=reason,
                             decision_digest=call_digest(p.tool, p.arguments), decided_by=by)
                if p.tool_call_id in ids else p
                for p in pending]
            inst.set_pending(decided)
            inst.header["updatedAt"] = now_iso()
            await self.write_header(inst)
        except BaseException:
            lease.release()
            raise
        if detach or not all(p.decision is not None for p in decided):
            lease.release()
        else:
            await self._continue_decided(run, lease)
        return [p for p in decided if p.tool_call_id in ids]

    async def wake_callers(self, instance_id: str) -> list[str]:
        """Continue, in order up to the root, the callers of ``instance_id`` a stopped process left ``running``.

        A caller that waited in ``await_agent`` when its process stopped is resumed here (its
        wait runs again); one running here or in another process is left to its runner.

        :return: The ids of the callers resumed.
        """
        woken: list[str] = []
        seen = {instance_id}
        current = await self.store.read_header(instance_id)
        while True:
            spawner = current.get("spawnerInstanceId")
            if not isinstance(spawner, str) or not spawner or spawner in seen:
                return woken
            seen.add(spawner)
            try:
                current = await self.store.read_header(spawner)
            except InstanceNotFoundError:
                return woken
            live = self._runs.get(spawner)
            if current.get("state") != State.RUNNING.value or (live is not None and live.running):
                continue
            try:
                await self.resume(spawner)
            except InstanceLockedError:
                continue
            woken.append(spawner)

    async def tree_approvals(self, instance_id: str) -> list[PendingApproval]:
        """Return every undecided call in the subtree of ``instance_id``, read from the store.

        Depth first, in the order the agents were started, an instance's own calls before its
        children's. Each entry carries ``instance_id`` (its holder) and ``path`` (from
        ``instance_id`` down to the holder, each ``{"instanceId", "name"}``).
        """
        from loopwright._convert import converter  # noqa: PLC0415

        out: list[PendingApproval] = []

        def walk(node: Mapping[str, Any], path: tuple[Mapping[str, Any], ...]) -> None:
            here = (*path, {"instanceId": node["instanceId"], "name": node["name"]})
            for raw in node["pendingApprovals"]:
                entry = converter.structure(raw, PendingApproval)
                out.append(attrs.evolve(entry, instance_id=node["instanceId"], path=here))
            for child in node["children"]:
                walk(child, here)

        walk(await self.tree(instance_id), ())
        return out

    async def tree(self, instance_id: str) -> dict[str, Any]:
        """Return the instance tree below ``instance_id`` as nested objects (``show --json``'s ``tree``).

        Each node: ``instanceId``, ``name``, ``state``, ``stopReason``, ``turns``, ``depth``,
        ``pendingApprovals`` (its own undecided calls), ``waitingOn`` (undecided calls in its
        subtree), ``cost``, ``subtreeCost``, ``forkedFrom`` and ``children`` (nodes).
        """
        header = await self.store.read_header(instance_id)
        by_id = {**await self._descendant_headers(header), header.get("instanceId"): header}
        return _tree_node(header, by_id, set())

    async def trees(self) -> list[dict[str, Any]]:
        """Return every tree in the store (``ls --tree``): one node per root, oldest first.

        A root is an instance no listed instance started (its spawner is gone or it has none).
        """
        headers = await self.store.list_headers()
        by_id = {h.get("instanceId"): h for h in headers}
        return [_tree_node(h, by_id, set()) for h in headers if h.get("spawnerInstanceId") not in by_id]

    def stalled(self, instance_id: str) -> bool:
        """Whether the instance can go on only after a person decides calls held in its tree.

        True for an instance resting in ``waiting_for_approval``, and for one running here that
        waits in ``await_agent`` for agents of which some are stalled and the others finished
        (a wait for all of them cannot end before the stalled ones go on). Read from what this
        runtime holds in memory (no store access): for the CLI, to stop following a tree that
        waits for its operator.
        """
        return self._stalled(instance_id, set())

    def _stalled(self, instance_id: str, seen: set[str]) -> bool:
        if instance_id in seen:
            return False
        seen.add(instance_id)
        run = self._runs.get(instance_id)
        if run is None:
            inst = self._instances.get(instance_id)
            return inst is not None and inst.state is State.WAITING_FOR_APPROVAL
        if not run.running:
            return run.inst.state is State.WAITING_FOR_APPROVAL
        ids = self.awaiting.get(instance_id)
        if not ids:
            return False
        stalled = [i for i in ids if self._stalled(i, seen)]
        return bool(stalled) and all(i in stalled or self._finished(i) for i in ids)

    def _finished(self, instance_id: str) -> bool:
        """Whether an instance known here rests in a state that ends a wait for it (not for approval)."""
        run = self._runs.get(instance_id)
        inst = run.inst if run is not None else self._instances.get(instance_id)
        if inst is None or (run is not None and run.running):
            return False
        return inst.state not in {State.RUNNING, State.WAITING_FOR_APPROVAL}

    async def tree_events(self, run: AgentRun) -> AsyncIterator[Event]:  # noqa: C901 - one follower per instance
        """Yield the events of ``run`` and of every agent below it that runs here (see :meth:`AgentRun.events`).

        Each event keeps its ``instance_id``; its ``data`` gets ``depth`` (0 for ``run``) and
        ``agent`` (the instance's definition name).
        """
        if self._tg is None:
            raise LoopwrightError("the runtime is not open: use 'async with runtime:'")
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        root = run.instance_id
        scope = anyio.CancelScope()
        group: list[TaskGroup] = []

        def depth_of(inst: Instance) -> int | None:
            depth = 0
            current: Instance | None = inst
            while current is not None and current.id != root:
                current = current.spawner
                depth += 1
            return depth if current is not None else None

        async def pump(target: AgentRun, depth: int) -> None:
            async for event in target.events():
                send.send_nowait(attrs.evolve(event, data={**event.data, "depth": depth,
                                                            "agent": target.inst.definition.name}))

        def started(other: AgentRun) -> None:
            """Follow a segment starting here if it belongs to the tree (its events are kept from its start)."""
            depth = depth_of(other.inst) if other is not run else None
            if depth is not None and group:
                group[0].start_soon(pump, other, depth)

        async def drive() -> None:
            try:
                with scope:
                    async with anyio.create_task_group() as tg:
                        group.append(tg)
                        for other in self.running():
                            started(other)
                        await pump(run, 0)  # until this instance rests
                        tg.cancel_scope.cancel()
            finally:
                self._segment_watchers.remove(started)
                send.close()

        self._segment_watchers.append(started)
        self._tg.start_soon(drive)
        try:
            async with receive:
                async for event in receive:
                    yield event
        finally:
            scope.cancel()

    async def _continue_decided(self, run: AgentRun, lease: Lease) -> None:
        """Go on with a segment whose held calls are all decided (the lease is handed over).

        A decision applies only to the call it was made on (its ``decisionDigest``): a held call
        whose name or arguments in the log differ from it now is held again, undecided, and
        the segment rests waiting for approval without running anything.
        """
        await self._start_segment(run, Decided(), lease=lease)

    def _hold_changed(self, inst: Instance) -> bool:
        """Undo the decisions whose call changed since (see :meth:`_continue_decided`); return whether any did."""
        calls = {c.id: c for c in unanswered_calls(inst.transcript)[1]}
        changed = False
        kept: list[PendingApproval] = []
        for p in inst.pending_approvals:
            held = calls.get(p.tool_call_id)
            now = call_digest(held.name, held.arguments) if held is not None else None
            if p.decision is not None and now != p.decision_digest:
                changed = True
                self.queue_record(inst.id, "approval", {
                    "toolCallId": p.tool_call_id, "tool": p.tool, "decision": None,
                    "reason": "held again: the call is not the one that was decided"})
                p = attrs.evolve(p, decision=None, decision_reason=None, decision_digest=None, decided_by=None,  # noqa: PLW2901
                                 tool=held.name if held is not None else p.tool,
                                 arguments=dict(held.arguments) if held is not None else p.arguments)
            kept.append(p)
        if changed:
            inst.set_pending(kept)
        return changed

    async def _start_for_mail(self, run: AgentRun, lease: Lease) -> None:
        """Start a new segment of a resting instance to read its mail (the lease is handed over).

        An instance a dead runner left ``running`` is taken over here too (by :meth:`deliver`):
        the records of its interrupted turn are written again first, as :meth:`resume` does.
        """
        loop = self.loop
        if run.inst.state is State.RUNNING:  # before the new segment's entry: the records of the one cut short
            try:
                await loop.repair_records(run)
            except BaseException:
                lease.release()
                raise
        await self._start_segment(run, Mail(), lease=lease)

    async def deliver(self, run: AgentRun, text: str, source: str) -> None:
        """Deliver a message (see :meth:`AgentRun.message`) through the instance's mailbox.

        A running instance (here or in another process) reads it at its next turn boundary; one
        waiting for approval reads it once the calls are decided; one left ``running`` by a dead
        runner is resumed here (as by :meth:`resume`) and reads it then; any other resting
        instance starts a new segment here at once.
        """
        await self.store.post(run.instance_id, {"type": "message", "text": text, "source": source, "at": now_iso()})
        if run.running or run.inst.state is State.WAITING_FOR_APPROVAL:
            return
        try:
            lease = await self.store.acquire(run.instance_id, self.owner)
        except InstanceLockedError:
            return  # running in another process: its runner reads the mailbox
        try:
            await self._refresh(run)
        except BaseException:
            lease.release()
            raise
        if run.inst.header.get("state") == State.WAITING_FOR_APPROVAL.value:  # refreshed just now
            lease.release()  # another process held a call meanwhile: read once it is decided
            return
        if run.inst.header.get("queued") is True:  # submitted, never started: it starts here, and reads it
            await self._start_queued(run, lease)
            return
        if run.inst.state is State.RUNNING:
            # Its runner died (we hold the lease): carry on as a resume does, which finishes the
            # interrupted turn (and a beginning cut short) before it reads the mail.
            await self._start_resumed(run, lease)
            return
        await self._start_for_mail(run, lease)

    async def cancel_run(self, run: AgentRun, *, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Cancel a run (see :meth:`AgentRun.cancel` and :meth:`cancel`)."""
        if run.running:
            run._cancelled = True  # noqa: SLF001
            if run._scope is not None:  # noqa: SLF001
                run._scope.cancel()  # noqa: SLF001
            await run.wait()
            return
        lease: Lease | None = None
        try:
            lease = await self.store.acquire(run.instance_id, self.owner)
        except InstanceLockedError:
            await self.store.post(run.instance_id, {"type": "cancel", "at": now_iso()})
            await self.engine.submit(run.instance_id)  # its runner may be the engine's, far away
            with anyio.move_on_after(timeout):
                # Another process owns the run: there is nothing local to wait on but its header,
                # and its lease: if that comes free while the header still says running, the
                # runner died before it read the request, and the instance is stopped here.
                while (await self.store.read_header(run.instance_id)).get("state") == State.RUNNING.value:
                    await anyio.sleep(0.05)
                    with contextlib.suppress(InstanceLockedError):
                        lease = await self.store.acquire(run.instance_id, self.owner)
                        break
            if lease is None:
                await self._refresh(run)
                return
        try:
            await self._refresh(run)
            inst = run.inst
            if inst.state is State.STOPPED and inst.header.get("cancelled"):
                return
            run._done = anyio.Event()  # noqa: SLF001
            try:
                if inst.state is State.RUNNING and inst.header.get("queued") is not True:
                    await self.loop.repair_records(run)  # a dead runner's: the records of its last turn
                inst.header.pop("queued", None)  # a queued instance is stopped before any runner started it
                # A dead runner's calls, held calls and an open question each get their result.
                await self.loop.settle_cancelled(run)
                await self.loop.set_state(run, State.STOPPED, StopReason.CANCELLED, cancelled=True)
            finally:
                run._done.set()  # noqa: SLF001
        finally:
            lease.release()
        await self.engine.submit(run.instance_id)  # an engine that tracks the instance learns it is done


def _subtree_in(header: Mapping[str, Any], by_id: Mapping[Any, Mapping[str, Any]], seen: set[Any]) -> float | None:
    """Return the subtree cost of ``header``'s instance from headers already read (``by_id``)."""
    own, below = header.get("cost", 0.0), _children_in(header, by_id, seen)
    return None if own is None or below is None else own + below


def _children_in(header: Mapping[str, Any], by_id: Mapping[Any, Mapping[str, Any]], seen: set[Any]) -> float | None:
    """Return the summed subtree costs of ``header``'s children found in ``by_id`` (``None`` if unknown)."""
    total: float | None = 0.0
    for child in header.get("children") or []:
        if child in seen or child not in by_id:
            continue
        seen.add(child)
        below = _subtree_in(by_id[child], by_id, seen)
        total = None if total is None or below is None else total + below
    return total


#: Header keys a fork does not take from its original (it has its own, set by :meth:`Runtime.fork`).
_NOT_FORKED = frozenset({"awaitingAnswer", "children", "inboxCursor", "monitors", "pausedAt", "segment",
                         "segmentStartedAt", "servedBy", "text", "output", "limit", "contextTokens",
                         "delegationPrompt", "agentSwarmUri"})


def _fork_note(original: str, turn: int, children: Sequence[str], later: Sequence[str]) -> str:
    """Return what a fork's model is told about the agents of the instance it was forked from."""
    text = (f"[loopwright] This conversation is a fork of instance {original} at the end of turn {turn}. "
            f"The agents that instance started belong to it, not to you: {', '.join(children)}.")
    if later:
        text += f" These were started after turn {turn} and are not in this history: {', '.join(later)}."
    return text


def _tree_node(header: Mapping[str, Any], by_id: Mapping[Any, Mapping[str, Any]], seen: set[Any]) -> dict[str, Any]:
    """Return the ``tree`` node of ``header``'s instance, its children's nodes from ``by_id`` (a loop is cut)."""
    seen.add(header.get("instanceId"))
    children = [_tree_node(by_id[c], by_id, seen) for c in header.get("children") or []
                if c in by_id and c not in seen]
    own = [_approval_json(p) for p in header.get("pendingApprovals") or [] if p.get("decision") is None]
    cost = header.get("cost", 0.0)
    below = [c["subtreeCost"] for c in children]
    subtree = None if cost is None or None in below else cost + sum(below)
    return {
        "instanceId": header.get("instanceId"), "name": header.get("name"), "state": header.get("state"),
        "stopReason": header.get("stopReason"), "turns": int(header.get("turns") or 0),
        "depth": int(header.get("depth") or 0), "pendingApprovals": own,
        "waitingOn": len(own) + sum(c["waitingOn"] for c in children),
        "cost": cost, "subtreeCost": subtree, "forkedFrom": header.get("forkedFrom"), "children": children,
    }


def _approval_json(p: Mapping[str, Any]) -> dict[str, Any]:
    return {"toolCallId": p.get("toolCallId"), "tool": p.get("tool"), "arguments": p.get("arguments"),
            "reason": p.get("reason"), "requestedAt": p.get("requestedAt"), "decision": p.get("decision")}


def approval_to_json(p: PendingApproval) -> dict[str, Any]:
    """Return the ``--json`` form of a pending approval: with its holder and path when it has them."""
    out: dict[str, Any] = {"toolCallId": p.tool_call_id, "tool": p.tool, "arguments": dict(p.arguments),
                           "reason": p.reason}
    if p.instance_id is not None:
        out["instanceId"] = p.instance_id
        out["path"] = [dict(step) for step in p.path]
    if p.decision is not None:
        out["decision"] = p.decision
    return out


def _short_json(value: Any, limit: int = 200) -> str:
    import json  # noqa: PLC0415

    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


def summary(header: Mapping[str, Any], *, subtree_cost: float | object | None = ...) -> dict[str, Any]:
    """Return the JSON summary of an instance (``show`` and ``ls``), camelCase keys.

    :param subtree_cost: Its ``subtreeCost`` when the caller read its children (see
        :meth:`Runtime.subtree_cost`); by default its own cost.
    """
    usage = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0, **(header.get("usage") or {})}
    return {
        "instanceId": header.get("instanceId"),
        "name": header.get("name"),
        "state": header.get("state"),
        "queued": header.get("queued") is True,
        "stopReason": header.get("stopReason"),
        "cancelled": bool(header.get("cancelled", False)),
        "error": header.get("error"),
        "model": header.get("model"),
        "pendingApprovals": [
            {"toolCallId": p.get("toolCallId"), "tool": p.get("tool"), "arguments": p.get("arguments"),
             "reason": p.get("reason"), "requestedAt": p.get("requestedAt"), "decision": p.get("decision")}
            for p in header.get("pendingApprovals") or []],
        "usage": usage,
        "cost": header.get("cost"),
        "subtreeCost": header.get("cost") if subtree_cost is ... else subtree_cost,
        "spawnerInstanceId": header.get("spawnerInstanceId"),
        "callerInstanceId": header.get("callerInstanceId"),
        "callerToolCallId": header.get("callerToolCallId"),
        "delegationPrompt": header.get("delegationPrompt"),
        "createdAt": header.get("createdAt"),
        "updatedAt": header.get("updatedAt"),
        "children": list(header.get("children") or []),
        "depth": int(header.get("depth") or 0),
    }


def result_to_json(result: AgentResult) -> dict[str, Any]:
    """Return the ``--json`` form of a result: camelCase keys, every key present."""
    return {
        "instanceId": result.instance_id,
        "state": result.state.value,
        "stopReason": result.stop_reason.value if result.stop_reason else None,
        "text": result.text,
        "output": result.output,
        "usage": usage_to_json(result.usage),
        "cost": result.cost.amount,
        "subtreeCost": result.subtree_cost.amount,
        "pendingApprovals": [approval_to_json(p) for p in result.pending_approvals if p.decision is None],
        "error": result.error,
        "cancelled": result.cancelled,
        "limit": result.limit,
        "model": result.model,
    }


def usage_to_json(usage: Usage) -> dict[str, Any]:
    """Return ``{inputTokens, outputTokens, totalTokens}`` (always) plus the counts that are known.

    ``unreportedRequests`` appears when some model calls came back without token counts.
    """
    out: dict[str, Any] = {"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens,
                           "totalTokens": usage.total_tokens}
    known = (("cacheReadTokens", usage.cache_read_tokens), ("cacheWriteTokens", usage.cache_write_tokens),
             ("reasoningTokens", usage.reasoning_tokens))
    out.update({key: value for key, value in known if value is not None})
    if usage.requests:
        out["requests"] = usage.requests
    if usage.unreported_requests:
        out["unreportedRequests"] = usage.unreported_requests
    return out


def all_todos_done(messages: Sequence[Message]) -> tuple[bool, str]:
    """Check that every item of the latest ``todowrite`` plan is completed (``allTodosDone``).

    No plan at all passes: an agent that never uses ``todowrite`` is not punished by the gate.
    """
    for m in reversed(messages):
        if m.role != "assistant":
            continue
        for call in reversed(m.tool_calls):
            if call.name == "todowrite":
                todos = call.arguments.get("todos") or []
                open_items = [str(t.get("text", t.get("id"))) for t in todos
                              if isinstance(t, Mapping) and not t.get("completed")]
                if open_items:
                    return False, "these plan items are not completed: " + ", ".join(open_items)
                return True, ""
    return True, ""


def _guardrail_impl(ref: str, fn: Callable[..., Any]) -> tuple[str, Callable[..., Any], tuple[str, ...]]:
    """Return a guardrail as a before_tool_call implementation (it raises: the walk blocks the call)."""
    argnames = tuple(inspect.signature(fn).parameters)

    async def impl(call: Any, tool: Any, instance: Any, turn: int) -> Any:
        values = {"call": call, "tool": tool, "instance": instance, "turn": turn}
        verdict = fn(**{a: values[a] for a in argnames})
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is None or verdict == "allow":
            return None
        if isinstance(verdict, Decision):
            return verdict
        return Block(str(verdict))

    return (f"guardrail {ref}", impl, ("call", "tool", "instance", "turn"))


def _history_json(defn: Definition, history: Sequence[Message]) -> list[dict[str, str]]:
    """Return the header's ``taskHistory`` for ``history``, or raise ConfigError naming the bad message."""
    if not history:
        return []
    if any(ip.tool_calls for ip in defn.initial_prompts):
        raise ConfigError(f"definition {defn.name!r} injects tool calls in its initialPrompts, which can hold "
                          "the task prompt back; it cannot take a conversation history")
    out = []
    for n, message in enumerate(history):
        if message.role not in ("system", "user", "assistant") or message.tool_calls or message.content is None:
            raise ConfigError(f"history message {n} must be a system, user or assistant message with text "
                              f"and no tool calls (got role {message.role!r})")
        out.append({"role": message.role, "content": message.content})
    return out


def _smaller(a: Any, b: Any) -> Any:
    """Return the smaller of two optional limits (``None`` is no limit)."""
    if a is None:
        return b
    return a if b is None else min(a, b)


def _iso(seconds: float) -> str:
    """Return ``seconds`` since the epoch in the form of ``now_iso`` (so the two compare as text)."""
    whole = int(seconds)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(whole))}.{int((seconds - whole) * 1000):03d}Z"


def _new_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


def _definition_snapshot(defn: Definition) -> dict[str, Any]:
    from loopwright._config import definition_to_dict  # noqa: PLC0415 - the loader only to save a definition

    return definition_to_dict(defn)


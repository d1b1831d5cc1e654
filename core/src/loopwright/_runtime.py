"""The runtime: one per assembly, :class:`Runtime` (and :class:`AgentRun`, one per followed instance).

Two lifetimes, kept apart: a :class:`Runtime` owns the plugin manager, the store, the providers
and the record sinks, and lives as long as its ``async with`` block; an :class:`AgentRun` is a
handle on one instance, from which a caller follows, steers, approves and cancels it. Run
segments execute as tasks in the runtime's task group, so leaving the ``async with`` block
stops them (an interrupted instance stays ``running`` in the store and ``resume`` continues it).

The runtime is its lifecycle, its components and the documented API; each step lives in the
component that owns its state: :class:`~loopwright._plans.Plans` (definitions),
:class:`~loopwright._providers.Providers`, :class:`~loopwright._records.Recorder`,
:class:`~loopwright._run.LiveRuns`, :class:`~loopwright._loading.Loader`,
:class:`~loopwright._driver.Driver` (segments),
:class:`~loopwright._steering.Steering`, :class:`~loopwright._work.Work` (submitted work),
:class:`~loopwright._tree.Trees` and :class:`~loopwright._history.History` (fork, rewind).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import anyio
import attrs

from loopwright import _reading
from loopwright._agents import Agents, Monitors
from loopwright._capabilities import SANDBOX_MODES, resolve_roots, sandbox_problem
from loopwright._definition import Assembly, Capabilities, Definition
from loopwright._driver import Driver
from loopwright._engine import EngineDeps, Loop
from loopwright._history import History
from loopwright._hooks import notify
from loopwright._integrity import RowSigner, row_signer_from_env
from loopwright._loading import Loader
from loopwright._memory import MemoryAccess
from loopwright._plans import Plans, all_todos_done
from loopwright._plugins import PluginHost
from loopwright._providers import Providers, assembly_error, build_component
from loopwright._records import Recorder
from loopwright._redaction import redactor_of
from loopwright._retention import Collected, collect
from loopwright._run import AgentRun, LiveRuns
from loopwright._steering import Steering
from loopwright._threads import Thread, delete_tree
from loopwright._tree import Trees
from loopwright._types import Message
from loopwright._views import approval_to_json, result_to_json, summary, usage_to_json
from loopwright._work import Work
from loopwright.abc import StoreSettings
from loopwright.errors import ConfigError, LoopwrightError
from loopwright.memory import MemorySettings

if TYPE_CHECKING:
    from types import TracebackType

    from anyio.abc import TaskGroup

    from loopwright._instance import Instance
    from loopwright.abc import Engine, RecordSink, Store
    from loopwright.memory import Memory

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


class _Forward:
    """A :class:`Runtime` method that is one of its components' (``tool_names = _Forward("plans")``).

    Read on a runtime, it is the component's bound method (``rt.tool_names is`` the bound
    ``rt.plans.tool_names``), so its signature and docstring are the component's, written once;
    read on the class, it is this descriptor, whose docstring names the component.
    """

    def __init__(self, component: str, method: str | None = None) -> None:
        """Forward to the attribute ``method`` (default: the same name) of the component ``component``."""
        self.component = component
        self.method = method
        self.__doc__ = f"The runtime's {component}: see its method of this name."

    def __set_name__(self, owner: type, name: str) -> None:
        self.method = self.method or name

    def __get__(self, runtime: Runtime | None, owner: type | None = None) -> Any:
        if runtime is None:
            return self
        return getattr(getattr(runtime, self.component), self.method)  # type: ignore[arg-type]


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
        self._loaded = False
        self.shell_approver = shell_approver
        self.plugins = PluginHost(settings=self.assembly.plugin_settings, runtime=self)
        self.store: Store = store  # type: ignore[assignment]
        #: Who advances submitted work (the assembly's ``engine:``), built when the runtime opens.
        self.engine: Engine = None  # type: ignore[assignment]
        #: The providers of model references, built on first use.
        self.providers = Providers(self.assembly, self.plugins, http_client)
        self.prices = self.providers.prices
        #: What each definition resolves to (tools, hooks, limits ...), worked out once.
        self.plans = Plans(self.assembly, self.plugins, self.providers)
        self._sinks: list[RecordSink] = []
        #: Queued records, the record sinks and the order of header writes.
        self.recorder = Recorder(self.plugins, self._sinks)
        #: The assembly's ``redaction:`` compiled, or ``None``: cut from model requests and outgoing records.
        self.redactor = redactor_of(self.assembly.redaction)
        if self.redactor is not None and self.redactor.records:
            self.recorder.redact = self.redactor.data
        #: The runs and instances held here (weakly), and the followers of segments that start.
        self.live = LiveRuns()
        #: The monitors armed by instances run here (built when the runtime is entered).
        self.monitors: Any = None
        #: Who runs instances here, as saved in their headers' ``runner`` key.
        self.owner = f"loopwright (host {socket.gethostname()}, pid {os.getpid()})"
        #: The agents each instance running here waits for in ``await_agent`` now, by instance id
        #: (kept by :class:`loopwright._agents.Agents`; :meth:`stalled` reads it).
        self.awaiting: dict[str, tuple[str, ...]] = {}
        self.loader = Loader(self)
        self.driver = Driver(self)
        self.steering = Steering(self)
        self.work = Work(self)
        #: The instance trees: costs, held calls, nested views, live followers.
        self.forest = Trees(self)
        self.history = History(self)
        self._tg: TaskGroup | None = None
        self._tg_cm: Any = None
        self._loop: Loop | None = None
        #: Signs new rows and checks saved ones (the assembly's ``integrity:``), set when the runtime opens.
        self.signer: RowSigner | None = None
        #: Long-term memory (the assembly's ``memory:``, ``sqlite`` by default), built when the
        #: runtime opens; it opens nothing until it is first used. For hosts: ``remember``,
        #: ``recall``, ``forget`` and ``forget_fact`` of :class:`loopwright.memory.Memory`,
        #: with no grant checked (the host is trusted; agents go through their grants).
        self.memory: Memory | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | None = None, **kwargs: Any) -> Self:
        """Build a runtime from an assembly file.

        :param path: The file; ``None`` reads ``./loopwright.yaml`` when it exists, else uses defaults.
        :raises ConfigError: The file is invalid (every problem with file, line and column).
        """
        from loopwright._config import assembly_from_file  # noqa: PLC0415 - YAML machinery only when needed

        return cls(assembly_from_file(path), **kwargs)

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
        integrity = self.assembly.integrity
        if integrity is not None:
            try:
                self.signer = row_signer_from_env(integrity.key_env, os.environ)
            except ValueError as exc:
                raise self.assembly_error(str(exc), ("integrity", "keyEnv")) from exc
        self.load_plugins()
        if self.store is None:
            cfg = self.assembly.store
            settings = StoreSettings(kind=cfg.kind, base_dir=self.assembly.base_dir, options=cfg.options)
            self.store = build_component(self.assembly, self.plugins.stores, cfg.kind, cfg.options, ("store",),
                                         what="the store", make=lambda factory: factory(settings))
        self.recorder.store = self.store
        memory = self.assembly.memory
        memory_settings = MemorySettings(kind=memory.kind, base_dir=self.assembly.base_dir, options=memory.options)
        self.memory = build_component(self.assembly, self.plugins.memories, memory.kind, memory.options, ("memory",),
                                      what="the memory", make=lambda factory: factory(memory_settings))
        for n, spec in enumerate(self.assembly.records):
            self._sinks.append(build_component(
                self.assembly, self.plugins.record_sinks, spec.kind, spec.options, ("records", n),
                what=f"the record sink {spec.kind!r}", make=_called_with(dict(spec.options))))
        self.driver.check_out_of_reach(self.assembly.capabilities)
        self._check_sandbox()
        engine = self.assembly.engine
        self.engine = build_component(self.assembly, self.plugins.engines, engine.kind, engine.options, ("engine",),
                                      what="the engine", make=lambda factory: factory(dict(engine.options), self))
        self._loop = Loop(self._engine_deps())
        self._tg_cm = anyio.create_task_group()
        self._tg = await self._tg_cm.__aenter__()
        self._tg.start_soon(self.driver.watch_for_cancel)

        self.monitors = Monitors(self)
        self._tg.start_soon(self.monitors.watch)
        return self

    def _check_sandbox(self) -> None:
        """Refuse a sandboxed shell mode where the sandbox cannot start (fail closed, never unsandboxed)."""
        mode = self.assembly.capabilities.shell
        if mode in SANDBOX_MODES:
            problem = sandbox_problem()
            if problem is not None:
                raise self.assembly_error(f"capabilities.shell is {mode!r}, but the sandbox cannot start on this "
                                          f"machine: {problem}", ("capabilities", "shell"))

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
                await self.providers.aclose()
                for sink in self._sinks:
                    await sink.aclose()
                if self.memory is not None:
                    await self.memory.aclose()
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
        plans, providers, recorder, driver = self.plans, self.providers, self.recorder, self.driver
        return EngineDeps(
            store=self.store, owner=self.owner, queue_record=recorder.queue, flush_records=recorder.flush,
            write_header=recorder.write_header, hook_impls=plans.hook_impls, model_ref=providers.model_ref,
            split_model=providers.split_model, provider=providers.provider, provider_streams=providers.provider_streams,
            price=providers.price, agent_retries=self.assembly.agent_retry.max_retries,
            context_strategy=plans.context_strategy, output_problems=plans.output_problems, verifier=plans.verifier,
            tool_for=plans.tool_for, tool_names=plans.tool_names, tool_specs=plans.tool_specs,
            limits_of=plans.limits_of, limits_for=plans.limits_for, base_dir=lambda: self.assembly.base_dir,
            shell_approver=self.shell_approver,
            sink_locations=lambda: tuple(Path(loc) for sink in self._sinks for loc in sink.locations()),
            agents=lambda caller, call_id, timeout: Agents(self, caller, call_id, timeout),
            begin=driver.begin, still_beginning=driver.still_beginning,
            defer_task=driver.defer_task, hold_changed=driver.hold_changed, memory_for=self._memory_for,
            redact_request=self.redactor.request if self.redactor is not None and self.redactor.model else None)

    def _memory_for(self, inst: Instance) -> MemoryAccess | None:
        """Return ``inst``'s memory through its grant, or ``None`` (no ``memory:``, no subject, no memory)."""
        grants = inst.grants.memory
        if inst.definition.memory is None or grants.subject is None or self.memory is None:
            return None
        return MemoryAccess(memory=self.memory, grants=grants)

    @property
    def loop(self) -> Loop:
        """The loop driving this runtime's instances."""
        if self._loop is None:
            raise LoopwrightError("the runtime is not open: use 'async with runtime:'")
        return self._loop

    def start_soon(self, func: Callable[..., Any], *args: Any) -> None:
        """Run ``func(*args)`` as a task of the runtime's task group (it stops when the runtime closes).

        :raises LoopwrightError: The runtime is not open.
        """
        if self._tg is None:
            raise LoopwrightError("the runtime is not open: use 'async with runtime:'")
        self._tg.start_soon(func, *args)

    # -- components -------------------------------------------------------------------------

    def register_plugin(self, plugin: object, name: str | None = None) -> str:
        """Register a plugin object now (hooks take effect at the next hook point)."""
        self.load_plugins()
        name = self.plugins.register(plugin, name)
        self.plans.clear()
        return name

    def unregister_plugin(self, name: str) -> None:
        """Remove a plugin registered earlier."""
        self.plugins.unregister(name)
        self.plans.clear()

    def add_verifier(self, name: str, verify: Callable[[Sequence[Message]], tuple[bool, str]]) -> None:
        """Add a completion verifier by name: ``verify(messages) -> (ok, reason)``.

        :raises PluginError: ``verify`` cannot be called with one argument.
        """
        self.plans.add_verifier(name, verify)

    def assembly_error(self, message: str, at: tuple[str | int, ...], *, key: bool = False) -> ConfigError:
        """Return a ConfigError for a problem a host found in the assembly, placed at its line and column.

        :param at: The key path of what is wrong (``("server", "tokens", 0, "tokenEnv")``).
        :param key: Point at the key rather than its value.
        """
        return assembly_error(self.assembly, message, at, key=key)

    # -- records ----------------------------------------------------------------------------

    async def records(self, instance_id: str) -> list[dict[str, Any]]:
        """Return the instance's record log."""
        await self.store.read_header(instance_id)
        return await self.store.read_records(instance_id)

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
        grants = self.driver.requested_grants(capabilities)
        return await self.driver.create_run(defn, inputs, prompt, grants=grants, stream=stream,
                                            instance_id=instance_id, history=history,
                                            registered=self.registered_name(definition))

    def registered_name(self, definition: object) -> str | None:
        """Return ``definition`` if it names one of the assembly's ``agentDefinitions`` (:meth:`load_definition`)."""
        if isinstance(definition, str) and definition in self.assembly.agent_definitions:
            return definition
        return None

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
        return await self.loader.load_run(instance_id)

    async def list_instances(self, state: str | None = None) -> list[dict[str, Any]]:
        """Return every instance's summary (see :func:`summary`), optionally only those in ``state``."""
        return await _reading.list_instances(self.store, state)

    async def summary(self, instance_id: str) -> dict[str, Any]:
        """Return one instance's summary (``show``), its ``subtreeCost`` read through its children.

        Also ``treePendingApprovals`` (every undecided call in its subtree, each with its holder's
        ``instanceId`` and ``path``) and ``tree`` (see :meth:`tree`). The totals of an instance
        saved as ``running`` and not run here come from its entry log: its header has them only as
        of its last state change (a killed process saved turns since).
        (:func:`loopwright._reading.instance_summary`, which ``loopwright show`` calls without a runtime.)
        """
        return await _reading.instance_summary(self.store, instance_id, live=self.live.run(instance_id) is not None)

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

    def thread(self, thread_id: str,
               definition: str | os.PathLike[str] | Definition | Mapping[str, Any]) -> Thread:
        """Return the conversation ``thread_id`` with ``definition``: ``await rt.thread(ID, DEF).send(text)``.

        Nothing is read or created until :meth:`Thread.send <loopwright.Thread.send>`: the first
        send starts an instance whose id is ``thread_id``; later ones send it messages.

        :raises ConfigError: ``thread_id`` breaks the instance id rule.
        """
        return Thread(self, thread_id, definition)

    async def delete(self, instance_id: str) -> list[str]:
        """Delete a root instance, the instances below it and everything the store keeps of them.

        Refused while any of them runs (here or in another process); a child is deleted with
        its root, never alone. Records already sent to other record sinks stay there (see
        docs/security.md, "Deleting data").

        :return: The ids deleted, children before their spawner.
        :raises InstanceNotFoundError: No such instance.
        :raises InstanceLockedError: One of them runs in another process; nothing is deleted.
        :raises StoreError: The store cannot delete.
        :raises LoopwrightError: It is not a root, or one of them runs here.
        """
        self.loop  # noqa: B018 - raises if the runtime is not open
        return await delete_tree(self.store, self.live, self.owner, instance_id)

    async def collect_garbage(self, *, dry_run: bool = False, keep: float | None = None,
                              limit: int | None = None) -> Collected:
        """Apply the assembly's ``retention:``: delete every instance tree at rest for longer than it keeps them.

        A tree goes whole, and only when none of its instances runs, is queued, is held for an
        approval, asks the user a question or has unread messages (see :mod:`loopwright._retention`).
        ``loopwright gc`` calls this; so does an idle ``loopwright worker``.

        :param dry_run: List what would go and delete nothing.
        :param keep: Seconds to keep instead of ``retention.instances``.
        :param limit: Handle at most this many trees (oldest first).
        :return: What expired, what was deleted, and what was left for the next pass and why.
        :raises LoopwrightError: Neither ``keep`` nor ``retention.instances`` says how long to keep.
        :raises StoreError: The store cannot delete.
        """
        self.loop  # noqa: B018 - raises if the runtime is not open
        keep = keep if keep is not None else self.assembly.retention.instances
        if keep is None:
            raise LoopwrightError("the assembly sets no retention (retention: {instances: 30d}, say): "
                                  "nothing says how long to keep instances")
        return await collect(self.store, self.live, self.owner, keep, dry_run=dry_run, limit=limit)

    async def cancel(self, instance_id: str, *, timeout: float = 30.0) -> AgentRun:  # noqa: ASYNC109
        """Cancel an instance, live here, resting, or running in another process.

        Another process's run is asked through the instance's mailbox; this waits (up to
        ``timeout`` seconds) until that runner has stopped it, then returns the reloaded run.
        """
        run = await self.get_agent(instance_id)
        await self.cancel_run(run, timeout=timeout)
        return run

    # -- the API that is a component's method -------------------------------------------------
    # Each is that method itself, with its signature and its docstring (see _Forward): submitted
    # work and resume (Work), fork and rewind (History), then the seams that AgentRun, Agents, the
    # CLI and hosts call.

    resume = _Forward("work")
    pick_up = _Forward("work")
    submit = _Forward("work")
    submit_message = _Forward("work")
    submit_decision = _Forward("work")
    submit_resume = _Forward("work")
    follow_submitted = _Forward("work")
    fork = _Forward("history")
    rewind = _Forward("history")
    check_definition = _Forward("plans")
    verifier = _Forward("plans")
    check_untrusted = _Forward("plans")
    tool_names = _Forward("plans")
    tool_specs = _Forward("plans")
    limits_for = _Forward("plans")
    limits_of = _Forward("plans")
    provider = _Forward("providers")
    create_run = _Forward("driver")
    running = _Forward("live")
    known_run = _Forward("live", "run")
    subtree_cost = _Forward("forest")
    children_cost = _Forward("forest")
    tree_approvals = _Forward("forest")
    tree = _Forward("forest")
    trees = _Forward("forest")
    stalled = _Forward("forest")
    tree_events = _Forward("forest")
    decide = _Forward("steering")
    decide_subtree = _Forward("steering")
    deliver = _Forward("steering")
    cancel_run = _Forward("steering")
    queue_record = _Forward("recorder", "queue")
    write_header = _Forward("recorder")


def _called_with(*args: Any) -> Callable[[Callable[..., Any]], Any]:
    """Return what calls a component's factory with ``args`` (one per component: no late binding)."""
    return lambda factory: factory(*args)

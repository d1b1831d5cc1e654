"""What YAML describes: agent definitions and the runtime assembly, as frozen attrs classes.

The YAML keys are the camelCase forms of these field names (``max_iterations`` ↔
``maxIterations``). :mod:`loopwright._config` loads and validates files into these classes
against the JSON Schemas in ``specs/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

__all__ = [
    "AgentRetry",
    "Assembly",
    "Capabilities",
    "Completion",
    "Definition",
    "FileGrants",
    "InitialPrompt",
    "InitialToolCall",
    "InputSpec",
    "Integrity",
    "Limits",
    "MemoryConfig",
    "MemoryGrants",
    "MemorySpec",
    "PluginSpec",
    "ProviderConfig",
    "StoreConfig",
    "gates_from_json",
    "gates_of",
    "with_gates",
]


@attrs.frozen(kw_only=True)
class PluginSpec:
    """A plugin-backed setting: ``{kind: NAME, ...options}``.

    Attributes:
        kind: The registered kind.
        options: The other keys, as written.
    """

    kind: str
    options: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class InputSpec:
    """One declared input of a definition.

    Attributes:
        type: A JSON type name (``string``, ``integer``, ``number``, ``boolean``, ``object``, ``array``).
        description: What it is for.
        default: Used when the caller gives none; without a default the input is required.
        required: Whether the caller must give it (``True`` when there is no default).
    """

    type: str = "string"
    description: str | None = None
    default: Any = None
    required: bool = True


@attrs.frozen(kw_only=True)
class InitialToolCall:
    """A tool call a definition makes before the model speaks.

    Attributes:
        name: The tool.
        arguments: Its arguments; string values are templated from ``inputs``.
        id: The call id; generated when absent.
    """

    name: str
    arguments: Mapping[str, Any] = attrs.field(factory=dict)
    id: str | None = None


@attrs.frozen(kw_only=True)
class InitialPrompt:
    """One entry of ``initialPrompts``.

    Attributes:
        role: ``user`` or ``assistant``.
        content: Its text, templated from ``inputs``.
        tool_calls: Calls an ``assistant`` entry makes; they run first, marked ``injected``.
    """

    role: Literal["user", "assistant", "system"] = "user"
    content: str | None = None
    tool_calls: tuple[InitialToolCall, ...] = ()


@attrs.frozen(kw_only=True)
class Limits:
    """Budgets of one run segment. ``None`` means no limit.

    Attributes:
        max_iterations: Model turns (the definition's ``maxIterations`` overrides it).
        tool_calls: Tool calls.
        tokens: Input plus output tokens, checked before each model call.
        cost: Cost in the pricing currency, checked before each model call.
        elapsed: Seconds of wall time.
        tool_timeout: Seconds one tool call may take.
        max_depth: How deep agents may start agents.
    """

    max_iterations: int | None = None
    tool_calls: int | None = None
    tokens: int | None = None
    cost: float | None = None
    elapsed: float | None = None
    tool_timeout: float | None = None
    max_depth: int | None = None

    def merged(self, other: Limits) -> Limits:
        """Return these limits with every field ``other`` sets taken from ``other``."""
        changes = {f.name: getattr(other, f.name) for f in attrs.fields(Limits)
                   if getattr(other, f.name) is not None}
        return attrs.evolve(self, **changes)


DEFAULT_LIMITS = Limits(max_iterations=200, tool_calls=200, tool_timeout=60.0, max_depth=8)


@attrs.frozen(kw_only=True)
class Completion:
    """A completion gate (seed 003).

    Attributes:
        verify: The verifier's name (``allTodosDone`` is built in).
        max_attempts: How many times the model may claim it is done; required, at least 1.
    """

    verify: str
    max_attempts: int


@attrs.frozen(kw_only=True)
class Definition:
    """An agent, as a YAML definition describes it.

    Attributes:
        name: The agent's name.
        model: ``PROVIDER:MODEL``; ``None`` uses the assembly's ``defaultModel``.
        description: What it does.
        model_settings: ``temperature``, ``maxTokens``, ``topP``, ``stop``, ``seed``,
            ``toolChoice`` and provider extras, passed to the provider as written.
        system_prompt: The system prompt, templated from ``inputs``.
        inputs: Declared inputs.
        initial_prompts: Prompts (and injected tool calls) before the task prompt.
        tools: Tool names or paths (``/agent-tools/os/read-file`` → ``read-file``).
        max_iterations: Model turns per run segment.
        limits: Other budgets.
        context_strategy: How to shrink the transcript.
        requires_approval: Tool names whose every call is held for approval.
        approval_policy: ``perCall`` (only held calls wait) or ``holdTurn`` (seed 002).
        on_tool_exception: ``continue`` (a raising tool's error is the call's result and the run
            goes on) or ``fail`` (seed 002: the result is saved, then the run ends in ``error``).
        completion: A completion gate.
        output: A JSON Schema for structured output.
        hooks: Names of hook sets (registered by name) whose hooks apply to this agent only; a
            host's definition may also name a module of the assembly's plugins or an entry point.
        guardrails: Names of registered guardrails, called before each tool call of this agent;
            a host's definition may also name ``module:function`` of the assembly's plugins.
        fallback_models: Models to try, in order, when the model fails for good.
        memory: The long-term memory it asks for (a subject, namespaces to read and write), or
            ``None``: no memory (no recall, no memory tools), whatever its grants hold.
        source: The file it was read from, if any.
    """

    name: str
    model: str | None = None
    description: str | None = None
    model_settings: Mapping[str, Any] = attrs.field(factory=dict)
    system_prompt: str | None = None
    inputs: Mapping[str, InputSpec] = attrs.field(factory=dict)
    initial_prompts: tuple[InitialPrompt, ...] = ()
    tools: tuple[str, ...] = ()
    max_iterations: int | None = None
    limits: Limits = attrs.field(factory=Limits)
    context_strategy: PluginSpec | None = None
    requires_approval: tuple[str, ...] = ()
    approval_policy: Literal["perCall", "holdTurn"] = "perCall"
    on_tool_exception: Literal["continue", "fail"] = "continue"
    completion: Completion | None = None
    output: Mapping[str, Any] | None = None
    hooks: tuple[str, ...] = ()
    guardrails: tuple[str, ...] = ()
    fallback_models: tuple[str, ...] = ()
    memory: MemorySpec | None = None
    source: Path | None = None

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The tool names, each path reduced to its last segment."""
        return tuple(t.rstrip("/").rsplit("/", 1)[-1] for t in self.tools)


#: The keys of a saved ``inheritedGates`` entry (see :func:`gates_of`).
_GATE_LISTS = ("requiresApproval", "guardrails", "hooks")


def gates_of(defn: Definition) -> dict[str, Any]:
    """Return the gates an instance of ``defn`` runs under, as saved in a child's ``inheritedGates``.

    ``{requiresApproval, approvalPolicy, guardrails, hooks}``: what a child started by such an
    instance runs under as well as its own gates.
    """
    return {"requiresApproval": list(defn.requires_approval), "approvalPolicy": defn.approval_policy,
            "guardrails": list(defn.guardrails), "hooks": list(defn.hooks)}


def gates_from_json(raw: Any) -> dict[str, Any]:
    """Check a saved ``inheritedGates`` entry and return it.

    :raises ValueError: It is not a mapping of exactly the keys of :func:`gates_of`, each
        list holding only non-empty strings and ``approvalPolicy`` one of the two policies.
    """
    if not isinstance(raw, Mapping) or set(raw) != {*_GATE_LISTS, "approvalPolicy"}:
        raise ValueError(f"inheritedGates must be a mapping of {', '.join(sorted((*_GATE_LISTS, 'approvalPolicy')))}")
    for key in _GATE_LISTS:
        value = raw[key]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ValueError(f"inheritedGates.{key} must be a list of names")
    if raw["approvalPolicy"] not in ("perCall", "holdTurn"):
        raise ValueError("inheritedGates.approvalPolicy must be perCall or holdTurn")
    return {key: list(raw[key]) if key in _GATE_LISTS else raw[key] for key in raw}


def with_gates(defn: Definition, gates: Mapping[str, Any]) -> Definition:
    """Return ``defn`` running under ``gates`` (from :func:`gates_of`) as well as its own gates.

    The held tools, guardrails and hooks are the union (the inherited ones first, so a caller's
    hooks run before the child's own); the approval policy is the stricter, ``holdTurn`` over
    ``perCall``. ``defn`` itself is returned when the gates add nothing.
    """

    def union(own: tuple[str, ...], key: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*gates.get(key, ()), *own]))

    held_turn = "holdTurn" in (defn.approval_policy, gates.get("approvalPolicy"))
    policy: Literal["perCall", "holdTurn"] = "holdTurn" if held_turn else "perCall"
    merged = attrs.evolve(defn, requires_approval=union(defn.requires_approval, "requiresApproval"),
                          approval_policy=policy, guardrails=union(defn.guardrails, "guardrails"),
                          hooks=union(defn.hooks, "hooks"))
    return defn if merged == defn else merged


@attrs.frozen(kw_only=True)
class MemorySpec:
    """A definition's ``memory:``: the long-term memory its instances use (docs/memory.md).

    Attributes:
        subject: Whom the facts are about (a person, a tenant), templated from ``inputs``
            (``"{{customer}}"``); ``None`` takes the subject its grant is bound to (a child's:
            its caller's). A grant bound to another subject grants no namespace (see
            :func:`loopwright._capabilities.narrow_memory`).
        read: Namespaces recalled before each model call and readable by the ``recall`` tool.
        write: Namespaces the ``remember`` tool may write.
        recall: How many facts are recalled before each model call (0: none; the tools still work).
    """

    subject: str | None = None
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    recall: int = 5


@attrs.frozen(kw_only=True)
class MemoryGrants:
    """The long-term memory an instance may touch: one subject, namespaces to read and to write.

    Attributes:
        subject: The subject every fact it reads or writes is about; ``None`` (the assembly's
            grant) leaves it to the definition. Saved bound: a child keeps its caller's.
        read: Namespaces it may recall from.
        write: Namespaces it may remember into (writing does not grant reading).
    """

    subject: str | None = None
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class FileGrants:
    """File roots an instance may read and write.

    Attributes:
        read: Folders (or files) it may read.
        write: Folders (or files) it may write (and read).
    """

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class Capabilities:
    """What an instance may touch. :func:`loopwright.intersect` never widens these.

    Attributes:
        files: File roots.
        shell: ``none``, ``allow``, ``approval``, ``loopApproval``, ``sandbox`` (commands run
            under bubblewrap, confined by the kernel to these grants) or ``sandboxLoopApproval``
            (held for approval, then sandboxed).
        network: Whether tools may reach the network.
        agents_spawn: Whether it may start agents.
        agents_max_depth: How deep agents it starts may nest.
        agents_max_agents: How many agents its whole tree may start (descendants, finished ones included).
        memory: The long-term memory it may read and write (none by default).
    """

    files: FileGrants = attrs.field(factory=FileGrants)
    shell: Literal["none", "allow", "approval", "loopApproval", "sandbox", "sandboxLoopApproval"] = "none"
    network: bool = False
    agents_spawn: bool = False
    agents_max_depth: int = 8
    agents_max_agents: int = 64
    memory: MemoryGrants = attrs.field(factory=MemoryGrants)


@attrs.frozen(kw_only=True)
class ProviderConfig:
    """One entry of the assembly's ``providers:``.

    Attributes:
        kind: The registered provider kind.
        base_url: The API base URL.
        api_key: The key, written in the file (prefer ``api_key_env``).
        api_key_env: The environment variable holding the key.
        options: Every other key, passed to the provider.
    """

    kind: str
    base_url: str | None = None
    api_key: str | None = None
    api_key_env: str | None = None
    options: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class StoreConfig:
    """The assembly's ``store:``.

    Attributes:
        kind: The registered store kind (``file`` by default).
        options: Every other key (``path`` for the file store).
    """

    kind: str = "file"
    options: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class MemoryConfig:
    """The assembly's ``memory:``: where long-term memory lives (:class:`loopwright.memory.Memory`).

    Attributes:
        kind: The registered memory kind (``sqlite`` by default).
        options: Every other key (``path`` for the sqlite memory).
    """

    kind: str = "sqlite"
    options: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class EngineConfig:
    """The assembly's ``engine:``: who advances submitted work (:class:`loopwright.abc.Engine`).

    Attributes:
        kind: The registered engine kind (``local`` by default).
        options: Every other key, checked by the engine kind.
    """

    kind: str = "local"
    options: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class AgentRetry:
    """Runtime-level retries of transient provider failures (seed 000: default none).

    Attributes:
        max_retries: Retries after the provider's own.
    """

    max_retries: int = 0


@attrs.frozen(kw_only=True)
class Integrity:
    """Row integrity (``integrity:``): the runtime signs what it saves of grants, gates and definitions.

    Attributes:
        key_env: The environment variable holding the key (at least 32 characters), read when the
            runtime opens; the key is never saved. Every process sharing the store must have it.
    """

    key_env: str


@attrs.frozen(kw_only=True)
class Retention:
    """The assembly's ``retention:`` (seed 002): how long what is at rest is kept (``loopwright._retention``).

    Attributes:
        instances: Seconds a tree of instances is kept after it last changed, once every instance of
            it rests (never one running, queued, held or asking); ``None``: kept until deleted.
    """

    instances: float | None = None


@attrs.frozen(kw_only=True)
class RedactionPattern:
    """One of the assembly's own redaction patterns (``redaction.patterns``).

    Attributes:
        name: What a match is replaced with names it: ``[REDACTED:NAME]``.
        pattern: An RE2 pattern (linear time: no backreferences, no lookarounds; checked on load).
        replacement: The text a match becomes instead of ``[REDACTED:NAME]``.
    """

    name: str
    pattern: str
    replacement: str | None = None


@attrs.frozen(kw_only=True)
class Redaction:
    """The assembly's ``redaction:`` (seed 002): what is cut from model requests and records (``_redaction``).

    Attributes:
        builtins: The built-in sets to apply: ``apiKeys``, ``tokens``, ``emails``, ``cards`` (all four by default).
        patterns: The assembly's own patterns, applied after the built-in ones.
        model: Redact each model request (after recall, before ``before_inference``).
        records: Redact what record sinks (OpenTelemetry's too) and ``on_record`` observers receive.
    """

    builtins: tuple[str, ...] = ("apiKeys", "tokens", "emails", "cards")
    patterns: tuple[RedactionPattern, ...] = ()
    model: bool = True
    records: bool = True


@attrs.frozen(kw_only=True)
class Assembly:
    """A runtime, as ``loopwright.yaml`` describes it.

    Attributes:
        store: Where instances live.
        engine: Who advances submitted work.
        providers: Named provider configurations.
        default_model: The model for definitions that name none.
        plugins: Plugin references to load after the entry points.
        disable_plugins: Entry-point names not to load.
        capabilities: The grants of agents started here.
        agent_definitions: Definitions registered by name → path.
        agents_may_reach_any_instance: Let agent tools reach instances outside the caller's subtree.
        limits: Default limits for every definition.
        records: Record sinks.
        pricing: Price overrides per ``PROVIDER:MODEL`` (USD per million tokens:
            ``input``, ``output``, ``cacheRead``, ``cacheWrite``).
        agent_retry: Runtime-level retries.
        plugin_settings: Settings for plugins, by plugin name (``mcp`` ...); registration hooks
            receive the whole mapping as ``settings``.
        server: The settings of ``loopwright serve`` (``tokens``, ``run``, ``cors`` ...), as
            data: the ``loopwright-serve`` package reads them (docs/serve.md).
        integrity: Whether rows are signed, and with which key (``None``: rows are trusted as saved).
        redaction: What is cut from model requests and records (``None``: nothing).
        retention: How long instance trees at rest are kept (``loopwright gc``, idle workers).
        memory: Where long-term memory lives.
        path: The file it was read from, if any.
    """

    store: StoreConfig = attrs.field(factory=StoreConfig)
    engine: EngineConfig = attrs.field(factory=EngineConfig)
    providers: Mapping[str, ProviderConfig] = attrs.field(factory=dict)
    default_model: str | None = None
    plugins: tuple[str, ...] = ()
    disable_plugins: tuple[str, ...] = ()
    capabilities: Capabilities = attrs.field(factory=Capabilities)
    agent_definitions: Mapping[str, str] = attrs.field(factory=dict)
    agents_may_reach_any_instance: bool = False
    limits: Limits = attrs.field(factory=Limits)
    records: tuple[PluginSpec, ...] = ()
    pricing: Mapping[str, Mapping[str, float]] = attrs.field(factory=dict)
    agent_retry: AgentRetry = attrs.field(factory=AgentRetry)
    plugin_settings: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    server: Mapping[str, Any] = attrs.field(factory=dict)
    integrity: Integrity | None = None
    redaction: Redaction | None = None
    retention: Retention = attrs.field(factory=Retention)
    memory: MemoryConfig = attrs.field(factory=MemoryConfig)
    path: Path | None = None

    @property
    def base_dir(self) -> Path:
        """The folder relative paths in the assembly are resolved against."""
        return self.path.parent if self.path else Path.cwd()

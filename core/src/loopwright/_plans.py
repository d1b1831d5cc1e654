"""Definition plans: what a runtime works out once per definition, so that turns do none of it.

:meth:`Plans.plan` resolves everything a definition names (its tools, context strategy,
completion verifier, hooks and guardrails, and a provider for every model it may call), merges
its limits with the assembly's, and collects every problem into one
:class:`~loopwright.errors.ConfigError`. The engine then asks the plan for tool specs, hook
implementations in call order, limits and the output check, each a dictionary lookup.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from loopwright._decisions import Block, Decision
from loopwright._definition import DEFAULT_LIMITS, Assembly, Capabilities, Definition, Limits
from loopwright._engine import parse_output
from loopwright._patterns import schema_validator
from loopwright._plugins import HookSet, checked_guardrail, checked_verifier, hook_set
from loopwright._suggest import did_you_mean
from loopwright._template import TemplateError, render, render_value, resolve_inputs
from loopwright.errors import ConfigError, ConfigProblem
from loopwright.hookspecs import hookimpl

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from loopwright._instance import Instance
    from loopwright._plugins import HookView, PluginHost
    from loopwright._providers import Providers
    from loopwright._tools import Tool
    from loopwright._types import Message, ToolSpec
    from loopwright.abc import ContextStrategy

__all__ = ["DefinitionPlan", "Plans", "all_todos_done", "check_templates"]


@attrs.define
class DefinitionPlan:
    """What the runtime precomputes once per definition, so that turns do none of it."""

    definition: Definition
    tools: dict[str, Tool]
    specs: tuple[ToolSpec, ...]
    limits: Limits
    model_ref: str
    strategy: ContextStrategy | None
    #: The host's hooks with the definition's hook sets and guardrails placed among them
    #: (:meth:`PluginHost.view`, shared by definitions that name the same sets).
    view: HookView | None = None
    #: The validator of the definition's ``output`` schema, built on first use.
    output_validator: Any = None
    #: Whether a tool of the definition is offered only under some grants (``Tool.available``).
    gated: bool = False
    #: The specs offered under each set of grants, for gated definitions.
    offered: dict[Capabilities, tuple[ToolSpec, ...]] = attrs.Factory(dict)
    #: The header's ``definition`` snapshot, built on first use and shared by every instance
    #: of the definition (never mutated: headers are only read and encoded).
    snapshot: dict[str, Any] | None = None

    def header_snapshot(self) -> dict[str, Any]:
        """Return the definition's header snapshot, made once per definition."""
        if self.snapshot is None:
            self.snapshot = _definition_snapshot(self.definition)
        return self.snapshot


class Plans:
    """The definition plans of one runtime, and the completion verifiers it knows.

    Attributes:
        assembly: The runtime's assembly.
        plugins: The runtime's plugin host (its registries).
        providers: The runtime's providers (a plan resolves every model it may call).
    """

    def __init__(self, assembly: Assembly, plugins: PluginHost, providers: Providers) -> None:
        """Plan definitions against ``assembly``, the registries of ``plugins`` and ``providers``."""
        self.assembly = assembly
        self.plugins = plugins
        self.providers = providers
        self._cache: dict[int, DefinitionPlan] = {}
        #: Entry points (``hooks``) and guardrails (``guardrails``) made hook sets, by the key and
        #: name a definition gives, so that definitions naming the same ones share a hook view.
        self._sets: dict[tuple[str, str], HookSet] = {}
        self._verifiers: dict[str, Callable[[Sequence[Message]], tuple[bool, str]]] = {"allTodosDone": all_todos_done}

    def clear(self) -> None:
        """Forget every plan (the plugins changed)."""
        self._cache.clear()
        self._sets.clear()

    def add_verifier(self, name: str, verify: Callable[[Sequence[Message]], tuple[bool, str]]) -> None:
        """Add a completion verifier by name (see :meth:`loopwright.Runtime.add_verifier`)."""
        self._verifiers[name] = checked_verifier(name, verify, None)

    def _verifier_names(self) -> list[str]:
        return sorted({*self._verifiers, *self.plugins.verifiers.names()})

    def verifier(self, name: str) -> Callable[[Sequence[Message]], tuple[bool, str]]:
        """Return the completion verifier registered as ``name`` (by :meth:`add_verifier` or a plugin)."""
        found = self._verifiers.get(name)
        if found is not None:
            return found
        if name in self.plugins.verifiers:
            verifier: Callable[[Sequence[Message]], tuple[bool, str]] = self.plugins.verifiers.get(name)
            return verifier
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

    def plan(self, definition: Definition) -> DefinitionPlan:  # noqa: C901, PLR0912, PLR0915 - each check collects its problem
        """Return the plan of ``definition``, made on first use (then kept while the plugins stay the same).

        :raises ConfigError: Listing every problem that keeps an instance of it from running.
        """
        plan = self._cache.get(id(definition))
        if plan is not None and plan.definition is definition:
            return plan
        # Every installed plugin's hooks take part in the run: an entry point that cannot load
        # fails here, before an instance is created, not at the run's first hook.
        self.plugins.load_entry_points()
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
                    f"definition {definition.name!r} names the tool {name!r}, which no plugin registers"
                    f"{did_you_mean(name, self.plugins.tools.names())}; "
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
                problem(ConfigError(f"unknown context strategy {spec.kind!r}"
                                    f"{did_you_mean(spec.kind, self.plugins.context_strategies.names())}; registered: "
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
            model_ref = self.providers.model_ref(definition)
        except ConfigError as exc:
            problem(exc, ())
        problems.extend(self._model_problems(definition, model_ref, strategy))
        view = None
        if definition.hooks or definition.guardrails:
            try:
                view = self.plugins.view(self._definition_hooks(definition))
            except ConfigError as exc:
                problem(exc, ("hooks",) if definition.hooks else ("guardrails",))
        if problems:
            raise ConfigError(f"definition {definition.name!r} cannot run",
                              path=str(source) if source else None, problems=problems)
        assert model_ref is not None  # noqa: S101 - a missing model is a problem above
        plan = DefinitionPlan(definition=definition, tools=tools, specs=tuple(t.spec for t in tools.values()),
                               limits=limits, model_ref=model_ref, strategy=strategy, view=view,
                               gated=any(t.available is not None for t in tools.values()))
        self._cache[id(definition)] = plan
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
                self.providers.provider(self.providers.split_model(ref)[0])
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
        plan = self.plan(definition)
        if inputs is not None:
            check_templates(plan.definition, resolve_inputs(definition, inputs))

    def hook_impls(self, definition: Definition, hook: str) -> tuple[Any, ...]:
        """Return the implementations of ``hook`` for an instance of ``definition``, in call order.

        Host hooks wrap the hooks a definition names: for ``before_*`` hooks and observers the
        host's run first, for ``after_*`` hooks the definition's run first (the definition's
        :class:`~loopwright._plugins.HookView`, built once).
        """
        if not definition.hooks and not definition.guardrails:
            return self.plugins.hooks.impls(hook)
        plan = self._cache.get(id(definition))
        if plan is None or plan.definition is not definition:
            plan = self.plan(definition)
        return (plan.view or self.plugins.hooks).impls(hook)

    def _definition_hooks(self, definition: Definition) -> list[HookSet]:
        """Return the hook sets a definition names (``hooks:``, then ``guardrails:`` as sets), in its order.

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
        loaded = set(self.plugins.plugin_names())
        found = [s for ref in definition.hooks if (s := self._hook_set(definition, ref, loaded)) is not None]
        found.extend(self._guardrail_set(definition, ref, loaded) for ref in definition.guardrails)
        return found

    def _hook_set(self, definition: Definition, ref: str, loaded: set[str]) -> HookSet | None:
        """Return the hook set a ``hooks:`` entry names (``None``: a loaded plugin, whose hooks apply already)."""
        host = self.plugins
        if ref in host.hook_sets:
            found: HookSet = host.hook_sets.get(ref)
            return found
        if ref in loaded:
            return None
        made = self._sets.get(("hooks", ref))
        if made is not None:
            return made
        entry_point = host.installed(ref)
        if entry_point is None:
            raise ConfigError(
                f"definition {definition.name!r}: hooks: {ref!r} is neither a registered hook set "
                f"(registered: {', '.join(host.hook_sets.names()) or 'none'}) nor a plugin of the assembly "
                "or an installed entry point; a definition's hooks are never imported from a path")
        try:
            plugin = entry_point.load()
        except Exception as exc:
            raise ConfigError(f"definition {definition.name!r}: cannot load the entry point {ref!r}: "
                              f"{exc}") from exc
        made = self._sets["hooks", ref] = hook_set(plugin, f"{ref} (definition)")
        return made

    def _guardrail_set(self, definition: Definition, ref: str, loaded: set[str]) -> HookSet:
        """Return a ``guardrails:`` entry as a hook set of one ``before_tool_call`` implementation."""
        made = self._sets.get(("guardrails", ref))
        if made is not None:
            return made
        host = self.plugins
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
        guardrail = _Guardrail(policy)
        hooks = (("loopwright_before_tool_call", guardrail.loopwright_before_tool_call),)
        made = self._sets["guardrails", ref] = HookSet(f"guardrail {ref}", guardrail, hooks)
        return made

    def output_problems(self, definition: Definition, text: str | None) -> Any:
        """Check a final answer against the definition's ``output`` schema (see ``loopwright._engine.parse_output``)."""
        plan = self.plan(definition)
        if plan.output_validator is None:
            # RE2 for patterns: a model-written ``pattern`` must not be able to hang the loop. The
            # loader refused patterns RE2 cannot compile; lenient covers a definition built otherwise.
            plan.output_validator = schema_validator(definition.output or {}, lenient=True)
        return parse_output(text, plan.output_validator)

    def tool_for(self, definition: Definition, name: str, grants: Capabilities | None = None) -> Tool | None:
        """Return the tool ``name`` if the definition has it (and ``grants`` make it available)."""
        tool = self.plan(definition).tools.get(name)
        if tool is not None and grants is not None and tool.available is not None and not tool.available(grants):
            return None
        return tool

    def tool_names(self, definition: Definition, grants: Capabilities | None = None) -> list[str]:
        """Return the names of the definition's tools (those ``grants`` make available)."""
        tools = self.plan(definition).tools
        return [n for n, t in tools.items() if grants is None or t.available is None or t.available(grants)]

    def tool_specs(self, definition: Definition, grants: Capabilities | None = None) -> tuple[ToolSpec, ...]:
        """Return what the model is told about the definition's tools (the same tuple every turn).

        With ``grants``, tools whose ``available`` check refuses them are left out.
        """
        plan = self.plan(definition)
        if grants is None or not plan.gated:
            return plan.specs
        specs = plan.offered.get(grants)
        if specs is None:
            specs = plan.offered[grants] = tuple(
                t.spec for t in plan.tools.values() if t.available is None or t.available(grants))
        return specs

    def limits_for(self, definition: Definition) -> Limits:
        """Return the effective limits: defaults, then the assembly's, then the definition's."""
        return self.plan(definition).limits

    def limits_of(self, inst: Instance) -> Limits:
        """Return an instance's own limits: its definition's, capped by the ``budget`` its caller gave it.

        A budget (``tokens``, ``cost``, ``toolCalls``, ``elapsed`` seconds) is what remained of the
        tree's budget when the instance started; each applies to every segment. While it runs, the
        loop also holds it to each live ancestor's limits (:meth:`loopwright._engine._limits.Budgets.of`).
        """
        limits = self.plan(inst.definition).limits
        budget = inst.header.budget
        if not budget:
            return limits
        return attrs.evolve(
            limits, tokens=_smaller(limits.tokens, budget.get("tokens")),
            cost=_smaller(limits.cost, budget.get("cost")),
            tool_calls=_smaller(limits.tool_calls, budget.get("toolCalls")),
            elapsed=_smaller(limits.elapsed, budget.get("elapsed")))

    def context_strategy(self, definition: Definition) -> ContextStrategy | None:
        """Return the definition's context strategy, built once."""
        return self.plan(definition).strategy


def check_templates(definition: Definition, values: Mapping[str, Any]) -> None:
    """Render the definition's templates with ``values`` (a dotted path that is not there fails here)."""
    from loopwright._config import locate  # noqa: PLC0415 - only when something is wrong

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


class _Guardrail:
    """A guardrail as a before_tool_call hook set (one that raises: the walk blocks the call)."""

    def __init__(self, policy: Callable[..., Any]) -> None:
        self._policy = policy
        self._argnames = tuple(inspect.signature(policy).parameters)

    @hookimpl
    async def loopwright_before_tool_call(self, call: Any, tool: Any, instance: Any, turn: int) -> Any:
        values = {"call": call, "tool": tool, "instance": instance, "turn": turn}
        verdict = self._policy(**{a: values[a] for a in self._argnames})
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is None or verdict == "allow":
            return None
        if isinstance(verdict, Decision):
            return verdict
        return Block(str(verdict))


def _smaller(a: Any, b: Any) -> Any:
    """Return the smaller of two optional limits (``None`` is no limit)."""
    if a is None:
        return b
    return a if b is None else min(a, b)


def _definition_snapshot(defn: Definition) -> dict[str, Any]:
    from loopwright._config import definition_to_dict  # noqa: PLC0415 - the loader only to save a definition

    return definition_to_dict(defn)

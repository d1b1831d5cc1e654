"""The one table of hook rules (``loopwright.hookspecs.HOOKS``), pluggy wrappers refused, and the exact call order."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from helpers import Harness, call, defn, make_runtime, reply, run_to_rest

import loopwright
from loopwright import State, hookimpl, hookspecs
from loopwright._plugins import PluginHost, hook_set
from loopwright.errors import PluginError

pytestmark = pytest.mark.anyio


def specs() -> list[str]:
    return sorted(n for n, v in vars(hookspecs).items()
                  if n.startswith("loopwright_") and inspect.isfunction(v))


def test_all_lists_every_hookspec_sorted() -> None:
    """hookspecs.__all__ is plainly sorted and names every spec, loopwright_on_runtime_close included."""
    assert hookspecs.__all__ == sorted(hookspecs.__all__)
    assert [n for n in hookspecs.__all__ if n.startswith("loopwright_")] == specs()
    assert "loopwright_on_runtime_close" in hookspecs.__all__


def test_the_table_has_one_rule_per_spec_and_the_kind_lists_derive_from_it() -> None:
    """HOOKS covers every spec once; REGISTRATIONS, INTERCEPTORS and OBSERVERS are its kinds, in its order."""
    assert sorted(hookspecs.HOOKS) == specs()
    for kind, names in ((hookspecs.HookKind.REGISTRATION, hookspecs.REGISTRATIONS),
                        (hookspecs.HookKind.INTERCEPTOR, hookspecs.INTERCEPTORS),
                        (hookspecs.HookKind.OBSERVER, hookspecs.OBSERVERS)):
        assert names == tuple(n for n, rule in hookspecs.HOOKS.items() if rule.kind is kind)
    for name, rule in hookspecs.HOOKS.items():
        assert bool(rule.decisions) == (rule.kind is hookspecs.HookKind.INTERCEPTOR), name
        assert rule.per_definition == (rule.kind is not hookspecs.HookKind.REGISTRATION
                                       and name != "loopwright_on_runtime_close"), name


class Wrapper:
    @hookimpl(wrapper=True)
    def loopwright_before_tool_call(self, call: loopwright.ToolCall) -> Any:
        return (yield)


class OldWrapper:
    @hookimpl(hookwrapper=True)
    def loopwright_on_message(self, message: loopwright.Message) -> Any:
        yield


@pytest.mark.parametrize(("plugin", "hook", "option"), [
    (Wrapper(), "loopwright_before_tool_call", "wrapper"),
    (OldWrapper(), "loopwright_on_message", "hookwrapper"),
])
def test_a_wrapper_is_refused_at_registration(plugin: object, hook: str, option: str) -> None:
    """wrapper=True and hookwrapper=True implementations are refused, naming the plugin and the hook."""
    host = PluginHost()
    with pytest.raises(PluginError) as info:
        host.register(plugin, "wrapping")
    assert info.value.plugin_name == "wrapping"
    assert hook in str(info.value)
    assert f"{option}=True" in str(info.value)
    assert "wrapping" not in host.plugin_names()


async def test_a_wrapper_in_a_runtimes_plugins_fails_the_start_not_a_call(tmp_path: Path) -> None:
    """A runtime given a wrapper plugin fails to open; no tool call is ever turned into a Block."""
    add = _add()
    h = Harness(reply(None, call("add", a=1, b=2)), reply("done"), tools=[add])
    with pytest.raises(PluginError, match="loopwright_before_tool_call"):
        async with make_runtime(tmp_path, h, Wrapper()) as rt:
            await run_to_rest(rt, defn(tools=[add]))
    assert not h.requests


async def test_a_wrapper_in_a_definitions_hook_set_is_refused(tmp_path: Path) -> None:
    """A hook set with a wrapper is refused when its plugin registers it, naming the plugin and the hook."""

    class Offers:
        @hookimpl
        def loopwright_register_hooks(self, register: Any) -> None:
            register("wrapping_hooks", Wrapper())

    with pytest.raises(PluginError) as info:
        async with make_runtime(tmp_path, Harness(reply("hi")), Offers()):
            pass
    assert "loopwright_before_tool_call" in str(info.value)
    assert "wrapper=True" in str(info.value)


def _add() -> loopwright.Tool:
    @loopwright.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return add


class Everything:
    """Implements every hook a run calls, noting each call's hook name (and its detail) in order."""

    def __init__(self, log: list[str] | None = None, tag: str = "") -> None:
        self.log: list[str] = log if log is not None else []
        self.tag = tag

    def note(self, entry: str) -> None:
        self.log.append(f"{self.tag}{entry}")

    @hookimpl
    def loopwright_before_inference(self, turn: int) -> None:
        self.note(f"before_inference {turn}")

    @hookimpl
    def loopwright_after_inference(self, turn: int) -> None:
        self.note(f"after_inference {turn}")

    @hookimpl
    def loopwright_before_tool_call(self, call: loopwright.ToolCall) -> None:
        self.note(f"before_tool_call {call.name}")

    @hookimpl
    def loopwright_after_tool_call(self, call: loopwright.ToolCall) -> None:
        self.note(f"after_tool_call {call.name}")

    @hookimpl
    def loopwright_on_message(self, message: loopwright.Message) -> None:
        self.note(f"on_message {message.role}")

    @hookimpl
    def loopwright_on_state_change(self, new: str) -> None:
        self.note(f"on_state_change {new}")

    @hookimpl
    def loopwright_on_cost(self, turn: int) -> None:
        self.note(f"on_cost {turn}")

    @hookimpl
    def loopwright_on_runtime_close(self) -> None:
        self.note("on_runtime_close")


async def test_the_exact_order_of_hook_calls_over_one_scripted_run(tmp_path: Path) -> None:
    """One run with one tool call calls the hooks in exactly this order (tox's test_plugin_hooks_and_order style)."""
    add = _add()
    everything = Everything()
    h = Harness(reply(None, call("add", a=1, b=2)), reply("done"), tools=[add])
    async with make_runtime(tmp_path, h, everything) as rt:
        _, result = await run_to_rest(rt, defn(tools=[add]))
        assert result.state is State.WAITING
    assert everything.log == EXPECTED_ORDER


#: The order today. Note: docs/hooks.md says on_message sees "each tool result" too, but the loop
#: appends tool results without calling it (no "on_message tool" after after_tool_call): reported
#: to be fixed in _loop.py, then this list gains that line.
EXPECTED_ORDER: list[str] = [
    "on_state_change running",
    "on_message user",
    "before_inference 1",
    "after_inference 1",
    "on_message assistant",
    "on_cost 1",
    "before_tool_call add",
    "after_tool_call add",
    "before_inference 2",
    "after_inference 2",
    "on_message assistant",
    "on_cost 2",
    "on_state_change waiting",
    "on_runtime_close",
]


def test_the_table_says_which_side_runs_first() -> None:
    """definition_first is true exactly for the after_* interceptors: host hooks wrap a definition's."""
    for name, rule in hookspecs.HOOKS.items():
        assert rule.definition_first == name.startswith("loopwright_after_"), name


async def test_the_exact_order_with_a_definitions_hook_set(tmp_path: Path) -> None:
    """With a hook set named by the definition, the host's hooks wrap it: first before a step, last after it."""
    add = _add()
    log: list[str] = []
    host, own = Everything(log, "host "), Everything(log, "def ")

    class Offers:
        @hookimpl
        def loopwright_register_hooks(self, register: Any) -> None:
            register("everything", own)

    h = Harness(reply(None, call("add", a=1, b=2)), reply("done"), tools=[add])
    async with make_runtime(tmp_path, h, host, Offers()) as rt:
        _, result = await run_to_rest(rt, defn(tools=[add], hooks=("everything",)))
        assert result.state is State.WAITING
    assert log == [
        "host on_state_change running", "def on_state_change running",
        "host on_message user", "def on_message user",
        "host before_inference 1", "def before_inference 1",
        "def after_inference 1", "host after_inference 1",
        "host on_message assistant", "def on_message assistant",
        "host on_cost 1", "def on_cost 1",
        "host before_tool_call add", "def before_tool_call add",
        "def after_tool_call add", "host after_tool_call add",
        "host before_inference 2", "def before_inference 2",
        "def after_inference 2", "host after_inference 2",
        "host on_message assistant", "def on_message assistant",
        "host on_cost 2", "def on_cost 2",
        "host on_state_change waiting", "def on_state_change waiting",
        "host on_runtime_close",  # never a definition's: not per_definition in the table
    ]


def test_a_views_sets_join_on_the_side_the_table_says() -> None:
    """PluginHost.view(sets) places a definition's hook sets inside the host's hooks, per HOOKS."""
    host = PluginHost()
    host.register(Everything(), "host")
    view = host.view([hook_set(Everything(), "def")])
    for name in ("loopwright_before_tool_call", "loopwright_after_tool_call", "loopwright_on_message"):
        names = [p for p, _f, _a in view.impls(name)]
        expected = ["def", "host"] if hookspecs.HOOKS[name].definition_first else ["host", "def"]
        assert names == expected, name
    assert host.view([]).impls("loopwright_on_cost") is host.impls("loopwright_on_cost")
    assert [p for p, _f, _a in view.impls("loopwright_on_runtime_close")] == ["host"]


class First:
    @hookimpl(tryfirst=True)
    def loopwright_before_tool_call(self) -> None: ...

    @hookimpl(tryfirst=True)
    def loopwright_after_tool_call(self) -> None: ...


class Last:
    @hookimpl(trylast=True)
    def loopwright_before_tool_call(self) -> None: ...

    @hookimpl(trylast=True)
    def loopwright_after_tool_call(self) -> None: ...


def test_a_views_sets_stay_outside_the_hosts_tryfirst_and_trylast_ones() -> None:
    """Sets run after the host's trylast hooks before a step and before its tryfirst ones after it,
    in the definition's order (their own tryfirst/trylast marks do not move them past each other)."""
    host = PluginHost()
    for name, plugin in (("last1", Last()), ("plain", Everything()), ("first1", First()),
                         ("last2", Last()), ("first2", First())):
        host.register(plugin, name)
    view = host.view([hook_set(Last(), "a"), hook_set(Everything(), "b"), hook_set(First(), "c")])
    assert [p for p, _f, _a in host.impls("loopwright_before_tool_call")] == [
        "first1", "first2", "plain", "last1", "last2"]
    assert [p for p, _f, _a in view.impls("loopwright_before_tool_call")] == [
        "first1", "first2", "plain", "last1", "last2", "a", "b", "c"]
    assert [p for p, _f, _a in view.impls("loopwright_after_tool_call")] == [
        "a", "b", "c", "first1", "first2", "plain", "last1", "last2"]


def test_a_set_may_be_a_host_plugin_and_appear_twice() -> None:
    """pluggy registers each side of a set as an object of its own: a host plugin or a repeated set runs again."""
    plugin = Everything()
    host = PluginHost()
    host.register(plugin, "host")
    same = hook_set(plugin, "def")
    view = host.view([same, same])
    assert [p for p, _f, _a in view.impls("loopwright_on_message")] == ["host", "def", "def"]
    assert [f for _p, f, _a in view.impls("loopwright_on_message")] == [plugin.loopwright_on_message] * 3


def test_a_view_is_made_once_per_distinct_sets_and_follows_the_host() -> None:
    """The same sets give the same view; registering or unregistering a host plugin refreshes its tuples."""
    host = PluginHost()
    own = hook_set(Everything(), "def")
    view = host.view([own])
    assert host.view([own]) is view
    assert host.view([hook_set(Everything(), "def")]) is not view
    first = view.impls("loopwright_on_cost")
    assert [p for p, _f, _a in first] == ["def"]
    assert view.impls("loopwright_on_cost") is first
    host.register(Everything(), "host")
    assert [p for p, _f, _a in view.impls("loopwright_on_cost")] == ["host", "def"]
    host.unregister("host")
    assert [p for p, _f, _a in view.impls("loopwright_on_cost")] == ["def"]


async def test_definitions_naming_the_same_sets_share_one_view(tmp_path: Path) -> None:
    """Two definitions with the same hooks: and guardrails: get one view; the guardrail runs after the sets."""

    class Offers:
        @hookimpl
        def loopwright_register_hooks(self, register: Any) -> None:
            register("everything", Everything())

        @hookimpl
        def loopwright_register_guardrails(self, register: Any) -> None:
            register("never", lambda: None)

    async with make_runtime(tmp_path, Harness(), Everything(), Offers()) as rt:
        one = defn(hooks=("everything",), guardrails=("never",))
        two = defn(name="u", hooks=("everything",), guardrails=("never",))
        other = defn(name="v", hooks=("everything",))
        assert rt.plans.plan(one).view is rt.plans.plan(two).view
        assert rt.plans.plan(other).view is not rt.plans.plan(one).view
        names = [p for p, _f, _a in rt.plans.hook_impls(one, "loopwright_before_tool_call")]
        assert names[-2].startswith("everything (hook set of "), names
        assert names[-1] == "guardrail never", names
        assert names[:-2] == [p for p, _f, _a in rt.plugins.impls("loopwright_before_tool_call")]


def test_unregister_removes_what_the_plugin_registered_and_nothing_else() -> None:
    """PluginHost.unregister drops the plugin's hooks and components; another plugin's stay."""
    add = _add()

    class Tools:
        @hookimpl
        def loopwright_register_tools(self, register: Any) -> None:
            register(add)

        @hookimpl
        def loopwright_on_message(self) -> None:
            pass

    host = PluginHost()
    host.register(Tools(), "mine")
    host.register(Everything(), "other")
    assert "add" in host.tools
    host.unregister("mine")
    assert "add" not in host.tools
    assert [p for p, _f, _a in host.impls("loopwright_on_message")] == ["other"]
    assert host.plugin_names() == ["other"]

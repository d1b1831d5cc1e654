"""Tests of the pytest fixtures (runtime, fake_provider, pm) and of register_plugin."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from lwtesting_tools import run_pytest

import loopwright
from loopwright import Definition, State
from loopwright_testing import FakeProvider, ScriptedProvider, TestProvider, register_plugin, reply, tool_call

pytestmark = pytest.mark.anyio


async def test_runtime_fixture_serves_fake_models_from_the_fake_provider(runtime, fake_provider, tools_plugin):
    """The runtime fixture answers fake:any from fake_provider, and runs the tools of loopwright_plugins."""
    fake_provider.enqueue(reply(None, tool_call("add", a=2, b=3)), "five")
    run = await runtime.start_agent(Definition(name="x", model="fake:any", tools=("add",)), None, "2+3?")
    result = await run.result()
    assert result.text == "five"
    assert result.state is State.WAITING
    assert tools_plugin.calls == ["add"]
    assert [m.role for m in fake_provider.history[1].messages] == ["user", "assistant", "tool"]
    assert runtime.provider("fake") is fake_provider


async def test_runtime_fixture_uses_a_file_store_in_tmp_path(runtime, tmp_path):
    """The runtime fixture stores instances under tmp_path/store and also has the test and scripted kinds."""
    run = await runtime.start_agent(Definition(name="x", model="test:any"), None, "hello")
    assert (await run.result()).text == "test answer to: hello"
    assert any((tmp_path / "store").rglob("*"))
    assert isinstance(runtime.provider("test"), TestProvider)
    assert isinstance(runtime.provider("scripted"), ScriptedProvider)


async def test_pm_fixture_is_the_runtime_plugin_host(runtime, pm):
    """pm is the runtime's plugin host, with the test providers and the fake one registered."""
    assert pm is runtime.plugins
    assert {"test", "scripted", "fake"} <= set(pm.providers.names())
    assert pm.pm.has_plugin("loopwright_testing")


async def test_runtime_fixture_loads_no_entry_points(pm):
    """Installed entry-point plugins are not loaded, so they cannot change a test's outcome."""
    assert "testing" not in pm.plugin_names()
    assert "openai" not in pm.plugin_names()


async def test_register_plugin_unregisters_on_exit(runtime, pm):
    """register_plugin registers a plugin's hooks and components for the block and removes them after."""
    extra = FakeProvider("from the extra plugin")
    plugin = extra.as_plugin("extra")
    with register_plugin(runtime, plugin, "extra-plugin") as name:
        assert name == "extra-plugin"
        assert "extra" in pm.providers
        run = await runtime.start_agent(Definition(name="x", model="extra:any"), None, "hi")
        assert (await run.result()).text == "from the extra plugin"
    assert "extra" not in pm.providers
    assert not pm.pm.has_plugin("extra-plugin")


async def test_register_plugin_unregisters_when_the_block_raises(runtime, pm):
    """The plugin is removed even when the with block raises."""

    class Hooks:
        @loopwright.hookimpl
        def loopwright_before_inference(self):
            return None

    seen = []

    def use_and_fail() -> None:
        with register_plugin(runtime, Hooks()) as name:
            seen.append(name)
            assert pm.pm.has_plugin(name)
            raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        use_and_fail()
    [name] = seen
    assert not pm.pm.has_plugin(name)
    assert pm.impls("loopwright_before_inference") == ()


async def test_fake_provider_fixture_starts_empty(fake_provider):
    """fake_provider starts with no replies and no history."""
    assert fake_provider.remaining == 0
    assert fake_provider.history == []


def test_fixtures_work_for_a_plugin_author(tmp_path):
    """In a fresh project the fixtures are available without configuration, under the anyio marker."""
    output = run_pytest(
        tmp_path,
        """
        import pytest
        import loopwright
        from loopwright_testing import reply, tool_call

        @loopwright.tool()
        def double(x: int) -> int:
            '''Double a number.'''
            return 2 * x

        class Plugin:
            @loopwright.hookimpl
            def loopwright_register_tools(self, register):
                register(double)

        @pytest.fixture
        def loopwright_plugins():
            return [Plugin()]

        @pytest.mark.anyio
        async def test_double(runtime, fake_provider, pm):
            fake_provider.enqueue(reply(None, tool_call("double", x=21)), "done")
            definition = {"name": "d", "model": "fake:any", "tools": ["double"]}
            run = await runtime.start_agent(definition, prompt="go")
            assert (await run.result()).text == "done"
            assert fake_provider.history[-1].messages[-1].content == "42"
            assert "double" in pm.tools

        def test_untouched():
            assert True
        """,
    )
    assert re.search(r"test_double\[asyncio\] PASSED", output), output
    assert re.search(r"test_untouched PASSED", output), output
    assert " failed" not in output
    assert " error" not in output


def test_plugin_does_not_import_loopwright_for_unrelated_suites():
    """Loading the pytest plugin, as every pytest session does, imports neither loopwright nor providers."""
    code = (
        "import sys, loopwright_testing.pytest_plugin; "
        "loaded = sorted(m for m in sys.modules if m.startswith('loopwright')); print(loaded)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['loopwright_testing', 'loopwright_testing.pytest_plugin']"

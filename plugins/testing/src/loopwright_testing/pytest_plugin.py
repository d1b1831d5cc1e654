"""pytest fixtures for loopwright (loaded through the ``pytest11`` entry point ``loopwright``).

Fixtures:

``fake_provider``
    A :class:`~loopwright_testing.FakeProvider`, empty. The ``runtime`` fixture registers it as
    provider ``fake``, so a definition with ``model: fake:any`` is answered from its script.
``runtime``
    An open :class:`loopwright.Runtime` on a file store in ``tmp_path``, with the test
    providers and the fake provider registered and no entry-point plugins (so installed
    plugins cannot change the outcome). Async: use it from tests marked ``anyio``.
``pm``
    The runtime's :class:`~loopwright.PluginHost` (``pm.pm`` is the pluggy manager;
    ``pm.tools``, ``pm.providers`` ... the registries).

Override these to shape the runtime:

``loopwright_plugins``
    Extra plugin objects or modules the runtime registers (default: none).
``loopwright_assembly``
    The :class:`loopwright.Assembly` it opens (default: a file store under ``tmp_path/"store"``).

Example::

    @pytest.fixture
    def loopwright_plugins():
        return [my_tools_module]

    @pytest.mark.anyio
    async def test_adds(runtime, fake_provider):
        fake_provider.enqueue(reply(None, tool_call("add", a=1, b=2)), "3")
        run = await runtime.start_agent({"name": "x", "model": "fake:any", "tools": ["add"]}, prompt="1+2")
        assert (await run.result()).text == "3"

Nothing here runs or imports loopwright unless a test asks for one of these fixtures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from pathlib import Path

    from loopwright import Assembly, PluginHost, Runtime
    from loopwright_testing import FakeProvider

__all__ = ["fake_provider", "loopwright_assembly", "loopwright_plugins", "pm", "runtime"]

# The contract's checks are plain asserts; have pytest rewrite them for readable failures.
pytest.register_assert_rewrite("loopwright_testing.contract")


@pytest.fixture
def fake_provider() -> FakeProvider:
    """Return an empty :class:`~loopwright_testing.FakeProvider`; ``runtime`` serves ``fake:*`` with it.

    Queue replies with ``fake_provider.enqueue(...)``; read the requests in ``fake_provider.history``.
    """
    from loopwright_testing import FakeProvider  # noqa: PLC0415 - import only when used

    return FakeProvider()


@pytest.fixture
def loopwright_plugins() -> Sequence[object]:
    """Return the extra plugins the ``runtime`` fixture registers; override it to add yours."""
    return ()


@pytest.fixture
def loopwright_assembly(tmp_path: Path) -> Assembly:
    """Return the assembly the ``runtime`` fixture opens: a file store under ``tmp_path / "store"``."""
    from loopwright import Assembly, StoreConfig  # noqa: PLC0415

    return Assembly(store=StoreConfig(kind="file", options={"path": str(tmp_path / "store")}))


@pytest.fixture
async def runtime(
    anyio_backend: Any,
    loopwright_assembly: Assembly,
    loopwright_plugins: Sequence[object],
    fake_provider: FakeProvider,
) -> AsyncIterator[Runtime]:
    """Yield an open :class:`loopwright.Runtime`, closed after the test.

    It has the built-in plugins, this distribution's providers (``test``, ``scripted``), the
    ``fake_provider`` as provider ``fake``, and then ``loopwright_plugins``; entry points are not
    loaded. Request it from tests marked ``@pytest.mark.anyio``.
    """
    import loopwright  # noqa: PLC0415
    import loopwright_testing  # noqa: PLC0415

    del anyio_backend  # requested so that anyio's plugin runs this fixture
    plugins = [loopwright_testing, fake_provider.as_plugin("fake"), *loopwright_plugins]
    async with loopwright.Runtime(loopwright_assembly, plugins=plugins, autoload=False) as rt:
        yield rt


@pytest.fixture
def pm(runtime: Runtime) -> PluginHost:
    """Return the ``runtime`` fixture's plugin host (``pm.pm`` is its pluggy ``PluginManager``)."""
    return runtime.plugins

"""loopwright driver for the shared framework-overhead harness (made from its peers/_template.py).

Run it through the shared harness, which must be importable (``BENCH_HARNESS_DIR``, set by
its ``run_all.sh``)::

    EXTRA_PEERS=/path/to/loopwright/bench/peers bash /path/to/shared/bench/run_all.sh

Contract (see the harness's harness.py): ONE agent built once in setup(), with ONE tool named
"add"(a: int, b: int) -> int whose body is ``return await harness.add(a, b)``, a model that is
OpenAI-compatible Chat Completions at base_url, and run() performing one full run and
returning the final text.

How loopwright is used here, as a user would: one :class:`loopwright.Runtime` built and
entered once in setup() (an AsyncExitStack keeps it open until close()), its assembly naming a
provider ``bench: {kind: openai, baseUrl: <base_url>, apiKey: x}`` and the default ``file``
store (default options) in a new folder under ``$LOOPWRIGHT_BENCH_STORES`` (default: this
repository's ``bench/out/stores``, kept afterwards; bench/run.py's docstring says why not
/tmp); the tool registered by a plugin object passed to
``Runtime(assembly, plugins=[...])``; and one fresh instance per run (``start_agent`` then
``result``). Nothing of loopwright's is switched off. The provider's HTTP stack is its default
(``transport: auto``: aiohttp under asyncio); ``LOOPWRIGHT_BENCH_TRANSPORT=httpcore`` runs it
over httpx's own httpcore pool instead.
"""
# ruff: noqa: E402, I001, PTH100, PTH103, PTH118, PTH120, RUF012  (the shape of the shared harness's template)
import time; _T0 = time.perf_counter()  # noqa: E702
import contextlib
import os
import sys
import tempfile

# This file is named like the package it measures: keep its own folder off the import path, or
# `import loopwright` below would import this file again instead of the package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.environ.get("BENCH_HARNESS_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness

import loopwright
from loopwright._config import load_assembly

_IMPORT_S = time.perf_counter() - _T0


async def add(a: int, b: int) -> int:
    """Add two integers and return the sum."""
    return await harness.add(a, b)


class _Tools:
    """The plugin object that registers the ``add`` tool."""

    @loopwright.hookimpl
    def loopwright_register_tools(self, register):
        register(loopwright.tool(add, description=harness.TOOL_DESCRIPTION))


class Peer(harness.Peer):
    NAME = "loopwright"
    PACKAGES = ["loopwright-core", "loopwright-openai", "httpx", "anyio"]
    NOTES = ("loopwright.Runtime entered once (file store under bench/out/stores, default options), provider "
             "kind openai, one fresh instance per run (start_agent + result)")

    async def setup(self, base_url, api_key):
        self._stack = contextlib.AsyncExitStack()
        # LOOPWRIGHT_BENCH_TRANSPORT=httpcore measures the provider over httpx's own stack.
        transport = {"transport": os.environ["LOOPWRIGHT_BENCH_TRANSPORT"]} if os.environ.get(
            "LOOPWRIGHT_BENCH_TRANSPORT") else {}
        stores = os.environ.get("LOOPWRIGHT_BENCH_STORES") or os.path.join(os.path.dirname(_HERE), "out", "stores")
        os.makedirs(stores, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-peer-"), dir=stores)
        assembly = load_assembly({
            "store": {"kind": "file", "path": os.path.join(tmp, "instances")},
            "providers": {"bench": {"kind": "openai", "baseUrl": base_url, "apiKey": api_key, **transport}},
        })
        self.rt = await self._stack.enter_async_context(loopwright.Runtime(assembly, plugins=[_Tools()]))
        self.definition = loopwright.Definition(
            name="adder", model="bench:gpt-4o-mini", tools=("add",), system_prompt=harness.SYSTEM_PROMPT)

    async def run(self, prompt, run_id):
        del run_id  # every run is a new instance with its own generated id
        run = await self.rt.start_agent(self.definition, prompt=prompt)
        result = await run.result()
        return result.text

    async def close(self):
        await self._stack.aclose()


if __name__ == "__main__":
    harness.main(Peer)

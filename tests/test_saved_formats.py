"""What loopwright writes to disk follows the JSON Schemas in specs/ (the single source of truth)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

import loopwright
from loopwright._config import validate_data
from loopwright._header import InstanceHeader

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "quickstart"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_headers_and_records_of_a_real_run_match_the_schemas(tmp_path: Path) -> None:
    """The instance header and every record of a run with tools, hooks and a rest validate against specs/."""

    @loopwright.hookimpl
    def loopwright_before_tool_call(call: loopwright.ToolCall) -> loopwright.Decision | None:
        return loopwright.ModifyInputs({"text": "three little words"}) if call.name == "count_words" else None

    assembly = loopwright.Assembly(
        store=loopwright.StoreConfig(options={"path": str(tmp_path / "store")}),
        plugins=(str(EXAMPLE / "tools.py"),),
    )

    async with loopwright.Runtime(assembly, plugins=[_module_with(loopwright_before_tool_call)]) as rt:
        run = await rt.start_agent(EXAMPLE / "agents" / "wordsmith.yaml", {"text": "a b c"}, "count")
        result = await run.result()
        assert result.state is loopwright.State.WAITING
        header = json.loads((tmp_path / "store" / result.instance_id / "instance.json").read_text())
        assert validate_data("instance", header) == []
        typed = InstanceHeader.from_json(header)
        assert typed.to_json() == header  # the typed header round-trips what was saved, key for key
        assert validate_data("instance", typed.to_json()) == []
        assert typed.extra == {}  # every key a real run writes is a documented one
        records = await rt.records(result.instance_id)
        kinds = {r["kind"] for r in records}
        assert {"state", "turn", "tool_call", "hook"} <= kinds
        for record in records:
            assert validate_data("record", record) == [], record


def _module_with(*functions: object) -> object:
    module = types.ModuleType("saved_formats_hooks")
    for fn in functions:
        setattr(module, fn.__name__, fn)  # type: ignore[attr-defined]
    return module

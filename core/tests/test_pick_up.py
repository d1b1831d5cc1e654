"""Picking up work reads the instance again under its lease: never resumes from an older copy."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from helpers import Harness, call, defn, make_runtime, reply

import loopwright

pytestmark = pytest.mark.anyio



@loopwright.tool
def step(n: int) -> str:
    """Take a step.

    Args:
        n: Which one.
    """
    return f"stepped {n}"


async def test_a_result_saved_after_this_copy_was_read_is_not_answered_twice(tmp_path: Path) -> None:
    """Picking up reads the entry log again under the lease.

    The last runner appended a call's result after this worker read the instance and before its
    lease lapsed, with no header write. A worker that resumed from its older copy would repair the
    call ``unknown_outcome``: two results for one call (seen once in the postgres restart test).
    """
    first = Harness(reply(None, call("step", "c1", n=1)), reply("done"), tools=[step])
    async with make_runtime(tmp_path, first) as rt:
        run = await rt.start_agent(defn(tools=("step",)), prompt="go")
        await run.wait()
        iid = run.instance_id
    folder = tmp_path / "store" / iid
    lines = (folder / "entries.jsonl").read_text().splitlines(keepends=True)
    result = next(n for n, line in enumerate(lines) if '"role":"tool"' in line)
    assert '"t":"start"' in lines[result - 1]
    # The runner died with the call started and its result not yet saved, the instance running.
    (folder / "entries.jsonl").write_text("".join(lines[:result]))
    header = json.loads((folder / "instance.json").read_text())
    header.update(state="running", stopReason=None, runner="loopwright (host gone, pid 1)")
    (folder / "instance.json").write_text(json.dumps(header))
    second = Harness(reply("done after the step"), tools=[step])
    async with make_runtime(tmp_path, second) as rt:
        stale = await rt.get_agent(iid)  # this worker reads the instance ...
        assert [m.role for m in stale.inst.transcript][-1] == "assistant"
        with (folder / "entries.jsonl").open("a") as log:  # ... then the dying runner's result lands
            log.write(lines[result])
        picked = await rt.pick_up(iid)
        assert picked is not None, picked
        assert picked[1] == "resume", picked
        with anyio.fail_after(10):
            await picked[0].wait()
        tools = [m for m in picked[0].inst.transcript if m.role == "tool"]
        assert [(m.content, str(m.status)) for m in tools] == [("stepped 1", "success")], tools
        assert picked[0].inst.transcript[-1].content == "done after the step"

"""Checkpoints of the entry log (O(1) resume): loading from one is the same as replaying the whole log.

A checkpoint is a cache of the log, never a second truth: a torn, corrupt or stale one (not a
prefix of the log it sits next to) is ignored and the log is replayed whole, so no turn is lost.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from helpers import Harness, call, defn, make_runtime, reply, run_to_rest, runtime_id

from loopwright import HeaderFields, Limits, Message, ToolCall, tool
from loopwright._instance import Instance, message_from_json
from loopwright._instance import _message_structure as converter_structure
from loopwright._replay import CHECKPOINT_VERSION, _call_order, fold_checkpoint, rebuild, restore
from loopwright.abc import StoreSettings
from loopwright.builtins.file_store import CHECKPOINT_FILE, FileStore

pytestmark = pytest.mark.anyio

IID = "snap"


def make_store(base: Path) -> FileStore:
    s = FileStore(StoreSettings(kind="file", base_dir=base, options={}))
    s.checkpoint_bytes = 1  # every call with anything new folds a checkpoint
    return s


@pytest.fixture
async def store(tmp_path: Path):
    s = make_store(tmp_path)
    await s.create(IID, {"id": IID})
    yield s
    await s.aclose()


def msg(role: str, content: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"t": "msg", "m": {"role": role, "content": content, **extra.pop("m", {})}, **extra}


def turn(n: int, *calls: str, text: str | None = None) -> list[dict[str, Any]]:
    """An answer with ``calls`` (each started and answered), as the loop logs a turn."""
    usage = {"inputTokens": 10 * n, "outputTokens": 1, "totalTokens": 10 * n + 1, "requests": 1}
    tool_calls = [{"id": c, "name": "add", "arguments": {"a": n}} for c in calls]
    out: list[dict[str, Any]] = [
        msg("assistant", text, m={"toolCalls": tool_calls} if calls else {},
            turn={"n": n, "model": "s:m", "usage": usage, "cost": 0.5}),
    ]
    out.extend({"t": "start", "id": c} for c in calls)
    # Results land in finishing order: reversed, so loading must put them back in call order.
    out.extend(msg("tool", "ok", m={"toolCallId": c, "name": "add", "status": "success"}) for c in reversed(calls))
    return out


def state(entries: list[dict[str, Any]], checkpoint: dict[str, Any] | None = None) -> dict[str, Any]:
    inst = Instance(id=IID, definition=defn(), header=HeaderFields({}))
    rebuild(inst, entries, checkpoint)
    return {
        "transcript": list(inst.transcript), "usage": inst.usage, "cost": inst.cost, "turn": inst.turn,
        "context": inst.context_tokens, "seg": (inst.seg_iterations, inst.seg_tool_calls, inst.seg_tokens,
                                                inst.seg_cost),
        "tools": inst.tool_calls, "started": inst.started_calls, "begun": inst.begun,
        "task": inst.task_given, "initial": inst.last_initial,
    }


async def loaded(store: FileStore) -> dict[str, Any]:
    checkpoint, entries = await store.read_resume(IID)
    return state(entries, checkpoint)


async def full(store: FileStore) -> dict[str, Any]:
    return state(await store.read_entries(IID))


HISTORY: list[list[dict[str, Any]]] = [
    [{"t": "seg"}, msg("system", "sys"), msg("user", "go", m={"source": "api"}, task=True)],
    turn(1, "a", "b"),
    turn(2, "c"),
    [{"t": "spend", "usage": {"inputTokens": 3, "outputTokens": 2}, "cost": 0.25}],
    [{"t": "reset", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "summary"}],
      "spend": {"usage": {"inputTokens": 7, "outputTokens": 7}, "cost": 1.0, "model": "s:m"}}],
    turn(3, "d", "e", "f"),
    [{"t": "seg"}, msg("user", "more", m={"source": "api"})],
    turn(4, "g"),
    turn(5, text="done"),
]


async def test_checkpoint_at_every_step_loads_as_a_full_replay(store: FileStore) -> None:
    """After each batch (resets, segments, spends, reordered results), checkpoint + tail == the whole log."""
    folder = store.root / IID
    for batch in HISTORY:
        await store.append_entries(IID, batch)
        assert await loaded(store) == await full(store)  # the tail after the last checkpoint
        await store.checkpoint(IID, fold_checkpoint)
        assert (folder / CHECKPOINT_FILE).is_file()
        checkpoint, tail = await store.read_resume(IID)
        assert checkpoint is not None
        assert tail == []
        assert await loaded(store) == await full(store)
    final = await full(store)
    assert final["turn"] == 5
    assert [m.content for m in final["transcript"][:2]] == ["sys", "summary"]
    assert [m.tool_call_id for m in final["transcript"] if m.role == "tool"] == ["d", "e", "f", "g"]


async def test_checkpoint_then_more_entries_replays_only_the_tail(store: FileStore) -> None:
    """A checkpoint older than the log is used with the entries after it, mid-turn too."""
    for batch in HISTORY[:3]:
        await store.append_entries(IID, batch)
    await store.checkpoint(IID, fold_checkpoint)
    first = turn(3, "x", "y")
    await store.append_entries(IID, first[:3])  # the answer, both starts, one result: a turn cut short
    checkpoint, tail = await store.read_resume(IID)
    assert checkpoint is not None
    assert tail == first[:3]
    assert await loaded(store) == await full(store)
    await store.checkpoint(IID, fold_checkpoint)  # a checkpoint with a call still unanswered
    await store.append_entries(IID, first[3:])
    got = await loaded(store)
    assert got == await full(store)
    assert got["started"] == {"x", "y"}
    assert [m.tool_call_id for m in got["transcript"] if m.role == "tool"][-2:] == ["x", "y"]


async def test_checkpoint_waits_until_the_log_grew_enough(tmp_path: Path) -> None:
    """Below ``checkpoint_bytes`` of new log nothing is written: short instances never get one."""
    s = FileStore(StoreSettings(kind="file", base_dir=tmp_path, options={}))
    s.checkpoint_bytes = 256 * 1024  # the default
    try:
        await s.create(IID, {"id": IID})
        await s.append_entries(IID, HISTORY[0] + HISTORY[1])
        await s.checkpoint(IID, fold_checkpoint)
        assert not (s.root / IID / CHECKPOINT_FILE).exists()
        s.checkpoint_bytes = 100
        await s.checkpoint(IID, fold_checkpoint)
        assert (s.root / IID / CHECKPOINT_FILE).is_file()
    finally:
        await s.aclose()


@pytest.mark.parametrize("damage", ["torn", "body", "frame", "empty", "version", "state"])
async def test_damaged_checkpoint_is_ignored_and_nothing_is_lost(
    store: FileStore, damage: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A torn or corrupt checkpoint (a crash or power loss mid-write, a stray edit) falls back to the whole log."""
    for batch in HISTORY[:4]:
        await store.append_entries(IID, batch)
    await store.checkpoint(IID, fold_checkpoint)
    await store.append_entries(IID, HISTORY[4])
    path = store.root / IID / CHECKPOINT_FILE
    data = path.read_bytes()
    frame, body = data.split(b"\n", 1)
    if damage == "torn":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "body":  # same length, one turn's counter changed: the checksum catches it
        path.write_bytes(frame + b"\n" + body.replace(b'"turn":2', b'"turn":9'))
    elif damage == "frame":
        path.write_bytes(b"{not json\n" + body)
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a checksum that matches a state this version cannot read: still a full replay
        bad = json.loads(body)
        if damage == "version":
            bad["v"] = CHECKPOINT_VERSION + 1
        else:
            bad["messages"] = "oops"
        new_body = json.dumps(bad).encode()
        import hashlib  # noqa: PLC0415 - only this case rewrites the checksum

        f = json.loads(frame)
        f["sha256"] = hashlib.sha256(new_body).hexdigest()
        path.write_bytes(json.dumps(f).encode() + b"\n" + new_body + b"\n")
    caplog.set_level(logging.WARNING, logger="loopwright.builtins.file_store")
    checkpoint, entries = await store.read_resume(IID)
    if damage in ("version", "state"):
        # The frame checks out, so the store hands it over; the replay cannot read it, so
        # loading (restore) replays the whole log instead, with a warning.
        assert checkpoint is not None
        with pytest.raises(ValueError, match="checkpoint"):
            state(entries, checkpoint)
        inst = Instance(id=IID, definition=defn(), header=HeaderFields({}))
        caplog.clear()
        await restore(inst, store)
        assert list(inst.transcript) == (await full(store))["transcript"]
        assert inst.turn == (await full(store))["turn"]
        assert "replaying the whole entry log" in caplog.text
        return
    assert checkpoint is None
    assert entries == await store.read_entries(IID)
    assert await loaded(store) == await full(store)
    assert "ignoring the checkpoint" in caplog.text
    # The next checkpoint replaces the damaged one.
    await store.checkpoint(IID, fold_checkpoint)
    checkpoint, entries = await store.read_resume(IID)
    assert checkpoint is not None
    assert entries == []


@pytest.mark.parametrize("change", ["shorter", "rewritten", "off-boundary"])
async def test_stale_checkpoint_of_another_log_is_ignored(
    store: FileStore, change: str, caplog: pytest.LogCaptureFixture, tmp_path: Path,
) -> None:
    """A checkpoint that is not a prefix of the log next to it (a log cut, restored or rewritten) is never used."""
    for batch in HISTORY[:5]:
        await store.append_entries(IID, batch)
    await store.checkpoint(IID, fold_checkpoint)
    log = store.root / IID / "entries.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    if change == "shorter":  # e.g. a power loss took the log's last appends, not the checkpoint
        log.write_bytes(b"".join(lines[:-2]))
    elif change == "rewritten":  # the same length, other bytes before the offset, more after it
        data = b"".join(lines).replace(b'"cost":0.5', b'"cost":0.7')
        log.write_bytes(data + json.dumps(turn(9)[0]).encode() + b"\n")
    else:  # longer, and the offset now falls inside a line
        log.write_bytes(b'{"t":"seg","pad":"xx"}\n' + b"".join(lines))
    await store.aclose()
    fresh = make_store(tmp_path)
    try:
        caplog.set_level(logging.WARNING, logger="loopwright.builtins.file_store")
        checkpoint, entries = await fresh.read_resume(IID)
        assert checkpoint is None
        assert entries == await fresh.read_entries(IID)
        assert await loaded(fresh) == await full(fresh)
        assert "ignoring the checkpoint" in caplog.text
    finally:
        await fresh.aclose()


async def test_torn_log_tail_after_checkpoint_is_dropped(store: FileStore) -> None:
    """A torn last line after the checkpoint is dropped as in a full read, and the checkpoint still holds."""
    for batch in HISTORY[:3]:
        await store.append_entries(IID, batch)
    await store.checkpoint(IID, fold_checkpoint)
    await store.append_entries(IID, turn(3, "z"))
    log = store.root / IID / "entries.jsonl"
    with log.open("ab") as f:
        f.write(b'{"t":"msg","m":{"role":"assist')
    checkpoint, entries = await store.read_resume(IID)
    assert checkpoint is not None
    assert entries == turn(3, "z")
    assert await loaded(store) == await full(store)


def test_fast_message_parsing_matches_the_converter() -> None:
    """The direct parse of plain message JSON gives what the converter gives; anything else goes through it."""
    samples: list[Any] = [
        {"role": "assistant", "toolCalls": [{"id": "a", "name": "n", "arguments": {"x": [1]}},
                                            {"id": "b", "name": "n", "rawArguments": "{bad", "injected": True}],
         "model": "p:m", "providerData": {"p": {"sig": "s"}}},
        {"role": "tool", "content": "r", "toolCallId": "a", "name": "n", "status": "tool_error"},
        {"role": "user", "content": "hi", "source": "agent", "injected": True},
        {"role": "system", "content": "s", "extraKey": 1},  # unknown key: the converter ignores it
        {"role": "user", "content": 5},  # not a string: the converter's own conversion
        {"role": "tool", "content": "r", "status": "success", "toolCallId": "x", "name": 3},
    ]
    for data in samples:
        assert message_from_json(data) == converter_structure(data, Message)
    for bad in ({"role": "assistant", "toolCalls": [{"name": "n"}]}, {"content": "no role"},
                {"role": "tool", "status": "nope"}):
        with pytest.raises(Exception) as fast_error:  # noqa: PT011 - the converter's error, whatever it is
            message_from_json(bad)
        with pytest.raises(type(fast_error.value)):
            converter_structure(bad, Message)



def test_the_shaped_builders_match_the_converter_and_fall_back_on_anything_else() -> None:
    """The two commonest shapes (a tool result, an answer made only of calls), keyed by their exact
    key order, give what the converter gives; a value of another type, an extra key or another key
    order falls back to the general path, which still agrees with the converter."""
    result = {"role": "tool", "content": "r", "toolCallId": "a", "name": "n", "status": "success"}
    calls = {"role": "assistant", "toolCalls": [{"id": "a", "name": "n", "arguments": {"x": [1]}}], "model": "p:m"}
    samples: list[Any] = [
        result, calls,
        {**calls, "model": None},
        {**result, "content": None},
        {**result, "name": None},
        {"role": "assistant", "toolCalls": [{"id": "a", "name": "n", "arguments": {}, "rawArguments": "{x"}],
         "model": "p:m"},  # raw arguments on a call
        {"role": "assistant", "toolCalls": [{"id": "a", "name": "n", "arguments": {}, "injected": True}],
         "model": "p:m"},  # an injected call
        {"role": "assistant", "toolCalls": [{"name": "n", "id": "a", "arguments": {}}], "model": "p:m"},  # order
        {"content": "r", "role": "tool", "toolCallId": "a", "name": "n", "status": "success"},  # key order
        {**result, "role": "user"},
        {**calls, "role": "user"},
        {"role": "assistant", "toolCalls": [], "model": "p:m"},
    ]
    for data in samples:
        assert message_from_json(data) == converter_structure(data, Message), data
    built = message_from_json(calls)
    assert built.tool_calls[0].arguments == {"x": [1]}
    assert built.tool_calls[0].arguments is not calls["toolCalls"][0]["arguments"]  # a copy, not the saved dict
    for bad in ({**result, "status": "nope"}, {**result, "status": 3}):
        with pytest.raises(Exception) as fast_error:  # noqa: PT011 - the converter's error, whatever it is
            message_from_json(bad)
        with pytest.raises(type(fast_error.value)):
            converter_structure(bad, Message)


def test_call_order_puts_results_after_their_calls_and_leaves_the_rest() -> None:
    """Results saved in finishing order come back in call order; a result that matches no call goes
    last in its run; messages outside such runs keep their places."""
    def res(i: str) -> Message:
        return Message(role="tool", content=i, tool_call_id=i, name="n")

    ask = Message(role="assistant", tool_calls=(ToolCall(id="a", name="n"), ToolCall(id="b", name="n"),
                                                ToolCall(id="c", name="n")))
    one = Message(role="assistant", tool_calls=(ToolCall(id="d", name="n"),))
    msgs = [Message(role="user", content="q"), ask, res("c"), res("zz"), res("a"), res("b"),
            Message(role="user", content="more"), one, res("d"), Message(role="assistant", content="end")]
    out = _call_order(msgs)
    assert [m.content for m in out] == ["q", None, "a", "b", "c", "zz", "more", None, "d", "end"]
    assert [m.content for m in msgs][2:6] == ["c", "zz", "a", "b"]  # the input list is not changed
    ordered = [Message(role="user", content="q"), one, res("d")]
    assert _call_order(ordered) == ordered


# -- through the runtime -----------------------------------------------------------------------


@tool
async def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: One.
        b: Two.
    """
    return a + b


async def test_runtime_checkpoints_at_rest_and_resumes_from_it(tmp_path: Path) -> None:
    """An instance at rest is checkpointed; a fresh runtime loads it the same, and runs on from it."""
    calls = [call("add", f"k{i}", a=i, b=1) for i in range(6)]
    h = Harness(*(reply(None, c) for c in calls), reply("six"), tools=[add])
    d = defn(tools=[add], limits=Limits(max_iterations=50, tool_calls=50))
    async with make_runtime(tmp_path, h) as rt:
        rt.store.checkpoint_bytes = 1  # type: ignore[attr-defined]
        run, result = await run_to_rest(rt, d)
        assert result.text == "six"
        live = list(run.inst.transcript)
        iid = run.instance_id
    folder = tmp_path / "store" / iid
    assert (folder / CHECKPOINT_FILE).is_file()
    h.script(reply(None, call("add", "k9", a=9, b=1)), reply("seven"))
    async with make_runtime(tmp_path, h) as rt:
        rt.store.checkpoint_bytes = 1  # type: ignore[attr-defined]
        run = await rt.get_agent(iid)
        assert list(run.inst.transcript) == live
        assert run.inst.turn == 7
        assert run.inst.tool_calls == 6
        await run.message("again")
        result = await run.result()
        assert result.text == "seven"
        live = list(run.inst.transcript)
        turns, tools = run.inst.turn, run.inst.tool_calls
    async with make_runtime(tmp_path, h) as rt:
        checkpoint, tail = await rt.store.read_resume(iid)
        assert checkpoint is not None
        assert tail == []  # checkpointed again at rest: the new turns are in it
        (folder / CHECKPOINT_FILE).write_bytes(b"torn")
        rt.store.checkpoint_bytes = 1 << 40  # type: ignore[attr-defined]
    async with make_runtime(tmp_path, h) as rt:
        run = await rt.get_agent(iid)
        assert list(run.inst.transcript) == live
        assert (run.inst.turn, run.inst.tool_calls) == (turns, tools)
        wire_ids = [*(c.id for c in calls), "k9"]
        assert [m.provider_call_id for m in live if m.role == "tool"] == wire_ids
        assert [m.tool_call_id for m in live if m.role == "tool"] == [runtime_id(live, w) for w in wire_ids]
        assert isinstance(live[-3].tool_calls[0], ToolCall)

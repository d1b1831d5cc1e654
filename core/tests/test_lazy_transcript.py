"""A lazy transcript (issue 30): loading from a checked checkpoint builds none of its messages up front.

A fold builds every message it adds once and marks its checkpoint ``checked``; a load from a
checked checkpoint keeps those messages as JSON in a :class:`LazyTranscript`, builds each at
its first read, and builds the messages after the checkpoint up front, so that a log that
cannot be replayed is still refused at load. The transcript read is the full replay's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import cattrs
import pytest
from helpers import defn
from test_snapshot import HISTORY, IID, full, make_store, msg, turn

from loopwright import HeaderFields, Message
from loopwright._instance import Instance, LazyTranscript
from loopwright._replay import fold_checkpoint, restore
from loopwright.builtins.file_store import CHECKPOINT_FILE, FileStore

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(tmp_path: Path):
    s = make_store(tmp_path)
    await s.create(IID, {"id": IID})
    yield s
    await s.aclose()


async def restored(store: FileStore) -> Instance:
    inst = Instance(id=IID, definition=defn(), header=HeaderFields({}))
    await restore(inst, store)
    return inst


def unbuilt(transcript: Any) -> int:
    return sum(type(m) is dict for m in transcript._messages)


def rewrite_checkpoint(store: FileStore, change: Any) -> None:
    """Change the checkpoint's state with ``change(state)`` and make its checksum match again."""
    path = store.root / IID / CHECKPOINT_FILE
    frame, body = path.read_bytes().split(b"\n", 1)
    state = json.loads(body)
    change(state)
    new_body = json.dumps(state).encode()
    f = json.loads(frame)
    f["sha256"] = hashlib.sha256(new_body).hexdigest()
    path.write_bytes(json.dumps(f).encode() + b"\n" + new_body + b"\n")


async def test_a_load_from_a_checked_checkpoint_builds_its_messages_only_when_read(store: FileStore) -> None:
    """The checkpoint's messages stay JSON until read; the tail after it is built; the whole reads as a full replay."""
    for batch in HISTORY[:6]:
        await store.append_entries(IID, batch)
    await store.checkpoint(IID, fold_checkpoint)
    checkpoint, _ = await store.read_resume(IID)
    assert checkpoint is not None
    assert checkpoint["checked"] is True
    held = len(checkpoint["messages"])
    await store.append_entries(IID, turn(9, "p", "q"))  # after the checkpoint: built at load
    inst = await restored(store)
    transcript = inst.transcript
    assert isinstance(transcript, LazyTranscript)
    assert len(transcript) == held + 3
    assert unbuilt(transcript) == held
    # Reading the tail (as a resume does) builds the tail only.
    assert transcript[-1].tool_call_id == "q"
    assert unbuilt(transcript) == held
    assert transcript[0].role == "system"
    assert unbuilt(transcript) == held - 1
    expected = (await full(store))["transcript"]
    assert list(transcript) == expected
    assert unbuilt(transcript) == 0
    assert all(isinstance(m, Message) for m in transcript._messages)


async def test_a_lazy_transcript_reads_writes_and_encodes_as_a_transcript(store: FileStore) -> None:
    """Slices, reversed order, encodings, appends and replacements give what a plain transcript gives."""
    for batch in HISTORY:
        await store.append_entries(IID, batch)
    await store.checkpoint(IID, fold_checkpoint)
    expected = (await full(store))["transcript"]
    lazy = (await restored(store)).transcript
    assert isinstance(lazy, LazyTranscript)
    assert lazy[1:3] == expected[1:3]
    assert list(reversed(lazy)) == list(reversed(expected))
    assert lazy.index(expected[2]) == 2
    lazy = (await restored(store)).transcript
    assert lazy.encoded("k", lambda m: m.role) == [m.role for m in expected]
    lazy = (await restored(store)).transcript
    extra = Message(role="user", content="later")
    lazy.append(extra)
    assert list(lazy) == [*expected, extra]
    lazy = (await restored(store)).transcript
    lazy.replace_tail(2, [extra])
    assert list(lazy) == [*expected[:2], extra]
    assert unbuilt(lazy) == 0
    lazy = (await restored(store)).transcript
    lazy.replace([extra])
    assert list(lazy) == [extra]
    assert lazy.epoch == 1


async def test_a_message_after_a_checked_checkpoint_that_does_not_build_is_refused_at_load(
    store: FileStore,
) -> None:
    """The entries after the checkpoint are built at load: one of the wrong shape fails the load, as before."""
    for batch in HISTORY[:3]:
        await store.append_entries(IID, batch)
    await store.checkpoint(IID, fold_checkpoint)
    await store.append_entries(IID, [msg("assistant", "x", m={"toolCalls": "not a list"})])
    with pytest.raises(cattrs.BaseValidationError, match="structuring Message"):
        await restored(store)


async def test_a_fold_does_not_vouch_for_a_message_that_does_not_build(store: FileStore) -> None:
    """A checkpoint holding a message of the wrong shape is not marked checked, so the load still refuses it."""
    await store.append_entries(IID, [*HISTORY[0], msg("assistant", "x", m={"toolCalls": "not a list"})])
    await store.checkpoint(IID, fold_checkpoint)
    checkpoint, tail = await store.read_resume(IID)
    assert checkpoint is not None
    assert tail == []
    assert checkpoint["checked"] is False
    with pytest.raises(cattrs.BaseValidationError, match="structuring Message"):
        await restored(store)
    # A later fold does not vouch for it either (it checks every message the last one did not).
    await store.append_entries(IID, turn(1, "a"))
    await store.checkpoint(IID, fold_checkpoint)
    checkpoint, _ = await store.read_resume(IID)
    assert checkpoint is not None
    assert checkpoint["checked"] is False


async def test_a_checkpoint_without_the_mark_is_loaded_whole_and_the_next_fold_marks_it(store: FileStore) -> None:
    """An earlier version's checkpoint (no ``checked``) loads every message up front; the next fold checks them all."""
    for batch in HISTORY[:5]:
        await store.append_entries(IID, batch)
    await store.checkpoint(IID, fold_checkpoint)
    rewrite_checkpoint(store, lambda state: state.pop("checked"))
    checkpoint, _ = await store.read_resume(IID)
    assert checkpoint is not None
    assert "checked" not in checkpoint
    inst = await restored(store)
    assert type(inst.transcript).__name__ == "Transcript"
    assert list(inst.transcript) == (await full(store))["transcript"]
    await store.append_entries(IID, HISTORY[5])
    await store.checkpoint(IID, fold_checkpoint)
    checkpoint, _ = await store.read_resume(IID)
    assert checkpoint is not None
    assert checkpoint["checked"] is True
    inst = await restored(store)
    assert isinstance(inst.transcript, LazyTranscript)
    assert list(inst.transcript) == (await full(store))["transcript"]


async def test_results_held_as_json_are_put_back_in_call_order(store: FileStore) -> None:
    """Tool results logged in finishing order are in call order in the lazy transcript, as in a full replay."""
    for batch in [HISTORY[0], turn(1, "a", "b", "c")]:
        await store.append_entries(IID, batch)
    await store.checkpoint(IID, fold_checkpoint)
    transcript = (await restored(store)).transcript
    assert isinstance(transcript, LazyTranscript)
    assert [m.tool_call_id for m in transcript if m.role == "tool"] == ["a", "b", "c"]
    assert list(transcript) == (await full(store))["transcript"]

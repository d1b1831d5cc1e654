"""Attacks on long-term memory grants (issue 29, point 2): each must fail for the attacker.

A malicious model (the ``scripted`` provider of ``loopwright-testing``) runs in a real runtime
over a file store and the real sqlite memory. A test fails if the attack succeeds: a fact of
another subject or an ungranted namespace reaches the model, a write lands where it may not, a
child holds more than its caller, a tampered grant runs, or the memory file is reachable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

import loopwright
import loopwright_testing
from loopwright._capabilities import capabilities_from_dict, intersect, narrow_memory
from loopwright._config import load_assembly
from loopwright._definition import Capabilities, MemoryGrants, MemorySpec
from loopwright.errors import CapabilityError, GrantsError

pytestmark = pytest.mark.anyio

TIMEOUT = 60  # a hang guard only


def calls(*specs: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"toolCalls": [{"name": n, "arguments": a} for n, a in specs]}


def assembly(root: Path, providers: dict[str, Any], **extra: Any) -> loopwright.Assembly:
    data = {
        "store": {"path": str(root / "store")},
        "memory": {"path": str(root / "private" / "memory.db"), "createParents": True},
        "capabilities": {
            "memory": {"read": ["profile"], "write": ["tickets"]},
            "agents": {"spawn": True, "maxDepth": 3},
        },
        "providers": providers,
        **extra,
    }
    (root / "store").mkdir(exist_ok=True)
    return load_assembly(data)


def results(inst: Any) -> dict[str, Any]:
    return {m.tool_call_id: m for m in inst.transcript if m.role == "tool"}


async def seeded(rt: loopwright.Runtime) -> None:
    assert rt.memory is not None
    await rt.memory.remember("alice", "profile", "alice profile fact")
    await rt.memory.remember("alice", "secret", "alice secret fact")
    await rt.memory.remember("bob", "profile", "bob profile fact")


def agent(name: str, model: str, **memory: Any) -> loopwright.Definition:
    return loopwright.Definition(
        name=name,
        model=model,
        tools=("remember", "recall", "run_agent_async", "await_agent"),
        memory=MemorySpec(**memory) if memory else None,
    )


def test_narrowing_never_widens() -> None:
    """A request for more namespaces or another subject gets nothing more than the parent holds."""
    parent = MemoryGrants(subject="alice", read=("profile",), write=("tickets",))
    wider = MemoryGrants(subject="alice", read=("profile", "secret"), write=("tickets", "profile"))
    assert narrow_memory(parent, wider) == parent
    assert narrow_memory(parent, MemoryGrants(subject="bob", read=("profile",))) == MemoryGrants(subject="alice")
    # write never grants read, read never grants write
    assert narrow_memory(parent, MemoryGrants(read=("tickets",), write=("profile",))) == MemoryGrants(subject="alice")
    caps = intersect(Capabilities(memory=parent), Capabilities(memory=wider))
    assert caps.memory == parent


async def test_a_definition_asking_more_than_the_runtime_grants_gets_no_more(tmp_path: Path) -> None:
    """The definition asks to read ``secret`` and write ``profile``: neither is granted, so neither happens."""
    script = [
        calls(
            ("recall", {"query": "fact", "namespaces": ["secret"]}),
            ("remember", {"text": "forged", "namespace": "profile"}),
            ("recall", {"query": "fact"}),
        ),
        {"text": "done"},
    ]
    asm = assembly(tmp_path, {"evil": {"kind": "scripted", "replies": script}})
    async with loopwright.Runtime(asm, plugins=[loopwright_testing], autoload=False) as rt:
        await seeded(rt)
        d = agent("evil", "evil:m", subject="alice", read=["profile", "secret"], write=["profile", "tickets"])
        run = await rt.start_agent(d, None, "go")
        with anyio.fail_after(TIMEOUT):
            await run.wait()
        assert run.inst.grants.memory == MemoryGrants(subject="alice", read=("profile",), write=("tickets",))
        seen = results(run.inst)
        texts = " ".join(m.content or "" for m in run.inst.transcript)
        assert "alice secret fact" not in texts
        assert "bob profile fact" not in texts
        statuses = [m.status.value for m in seen.values()]
        assert statuses.count("tool_error") == 2
        assert rt.memory is not None
        assert await rt.memory.recall("alice", ["profile"], "forged") == []


async def test_a_child_never_reads_or_writes_beyond_its_caller(tmp_path: Path) -> None:
    """A child definition asking for ``secret`` and the subject ``bob`` holds nothing of either."""
    kid = {
        "name": "kid",
        "model": "kid:m",
        "tools": ["recall", "remember"],
        "memory": {"subject": "bob", "read": ["profile", "secret"], "write": ["tickets"]},
    }
    tame = {"name": "tame", "model": "kid:m", "tools": ["recall"], "memory": {"read": ["profile", "secret"]}}
    (tmp_path / "kid.yaml").write_text(json.dumps(kid))
    (tmp_path / "tame.yaml").write_text(json.dumps(tame))
    providers = {
        "evil": {
            "kind": "scripted",
            "replies": [
                calls(
                    ("run_agent_async", {"definition": "kid", "prompt": "go"}),
                    ("run_agent_async", {"definition": "tame", "prompt": "go"}),
                ),
                {"text": "done"},
            ],
        },
        "kid": {"kind": "scripted", "replies": [calls(("recall", {"query": "fact"})), {"text": "done"}] * 2},
    }
    asm = assembly(
        tmp_path, providers, agentDefinitions={"kid": str(tmp_path / "kid.yaml"), "tame": str(tmp_path / "tame.yaml")}
    )
    async with loopwright.Runtime(asm, plugins=[loopwright_testing], autoload=False) as rt:
        await seeded(rt)
        run = await rt.start_agent(agent("evil", "evil:m", subject="alice", read=["profile"]), None, "go")
        with anyio.fail_after(TIMEOUT):
            await run.wait()
            started = [json.loads(m.content or "{}")["instanceId"] for m in results(run.inst).values()]
            children = [await rt.get_agent(i) for i in started]
            for child in children:
                await child.wait()
        kid_run, tame_run = children
        # Another subject: no namespace at all, and the subject stays the caller's.
        assert kid_run.inst.grants.memory == MemoryGrants(subject="alice")
        # No subject: the caller's, and only what the caller may read (it may write nothing).
        assert tame_run.inst.grants.memory == MemoryGrants(subject="alice", read=("profile",))
        for child in children:
            texts = " ".join(m.content or "" for m in child.inst.transcript)
            assert "secret fact" not in texts
            assert "bob profile fact" not in texts


async def test_a_tampered_saved_grant_fails_closed(tmp_path: Path) -> None:
    """A saved memory grant made malformed refuses to run; one widened on disk is cut back to the runtime's."""
    asm = assembly(tmp_path, {"evil": {"kind": "scripted", "replies": [{"text": "done"}]}})
    async with loopwright.Runtime(asm, plugins=[loopwright_testing], autoload=False) as rt:
        run = await rt.start_agent(agent("evil", "evil:m", subject="alice", read=["profile"]), None, "go")
        with anyio.fail_after(TIMEOUT):
            await run.wait()
    header_file = tmp_path / "store" / run.instance_id / "instance.json"
    header = json.loads(header_file.read_text())
    assert header["capabilities"]["memory"] == {"subject": "alice", "read": ["profile"], "write": []}
    for bad in (
        {"subject": "alice", "read": "profile"},
        {"subject": "", "read": []},
        {"subject": "alice", "read": ["../x"]},
        {"subject": "alice", "everything": True},
    ):
        with pytest.raises(ValueError, match="memory"):
            capabilities_from_dict({**header["capabilities"], "memory": bad})
    header["capabilities"]["memory"] = {"subject": "alice", "read": "profile"}
    header_file.write_text(json.dumps(header))
    async with loopwright.Runtime(asm, plugins=[loopwright_testing], autoload=False) as rt:
        with pytest.raises(GrantsError, match="saved grants"):
            await rt.get_agent(run.instance_id)
    header["capabilities"]["memory"] = {"subject": "alice", "read": ["profile", "secret"], "write": ["profile"]}
    header_file.write_text(json.dumps(header))
    async with loopwright.Runtime(asm, plugins=[loopwright_testing], autoload=False) as rt:
        loaded = await rt.get_agent(run.instance_id)
        assert loaded.inst.grants.memory == MemoryGrants(subject="alice", read=("profile",))


async def test_the_memory_file_is_outside_every_granted_file_root(tmp_path: Path) -> None:
    """A file root that reaches the memory database (or contains it) is refused when the runtime opens."""
    for root in (tmp_path / "private", tmp_path / "private" / "memory.db"):
        asm = assembly(tmp_path, {}, capabilities={"files": {"read": [str(root)]}})
        with pytest.raises(CapabilityError, match="the memory"):
            async with loopwright.Runtime(asm, plugins=[loopwright_testing], autoload=False):
                pass

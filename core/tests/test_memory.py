"""Long-term memory (issue 29, point 2): the memory kind, its sqlite backend, recall, the tools, the CLI.

The sqlite memory is real (a database file in ``tmp_path``); the model is the scripted
provider of ``helpers``; the CLI runs as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import Harness, call, defn, make_runtime, reply, result_for, run_to_rest

import loopwright
from loopwright import Block, ModifyRequest, ToolStatus
from loopwright._config import load_assembly, load_definition
from loopwright._definition import Capabilities, InputSpec, MemoryConfig, MemoryGrants, MemorySpec
from loopwright.builtins.sqlite_memory import SqliteMemory, fts_query
from loopwright.errors import ConfigError
from loopwright.memory import MemorySettings

pytestmark = pytest.mark.anyio

NS = ("profile", "tickets")


def memory_at(tmp_path: Path) -> SqliteMemory:
    return SqliteMemory(MemorySettings(kind="sqlite", base_dir=tmp_path, options={"path": str(tmp_path / "m.db")}))


def runtime(
    tmp_path: Path, h: Harness, *, read: tuple[str, ...] = NS, write: tuple[str, ...] = NS, **assembly: Any
) -> loopwright.Runtime:
    """A runtime on a file store and a sqlite memory in ``tmp_path``, granting ``read`` and ``write``."""
    return make_runtime(
        tmp_path,
        h,
        memory=MemoryConfig(options={"path": str(tmp_path / "m.db")}),
        capabilities=Capabilities(memory=MemoryGrants(read=read, write=write)),
        **assembly,
    )


def with_memory(**kwargs: Any) -> loopwright.Definition:
    kwargs.setdefault("memory", MemorySpec(subject="alice", read=NS, write=("tickets",)))
    return defn(system_prompt="You help.", **kwargs)


# -- the sqlite memory ---------------------------------------------------------------------------


async def test_recall_ranks_by_the_words_of_the_query_within_the_subject_and_namespaces(tmp_path: Path) -> None:
    """The best lexical match comes first; other subjects and ungranted namespaces never appear."""
    async with memory_at(tmp_path) as mem:
        await mem.remember("alice", "profile", "Alice prefers e-mail over phone calls")
        await mem.remember("alice", "profile", "Alice lives in Lyon")
        await mem.remember("alice", "secret", "Alice's e-mail password hint")
        await mem.remember("bob", "profile", "Bob prefers e-mail too")
        found = await mem.recall("alice", ["profile"], "how to e-mail her?")
        assert [f.text for f in found] == ["Alice prefers e-mail over phone calls"]
        assert found[0].score is not None
        assert found[0].score > 0
        newest = await mem.recall("alice", ["profile"], "")
        assert [f.text for f in newest] == ["Alice lives in Lyon", "Alice prefers e-mail over phone calls"]
        assert await mem.recall("alice", [], "e-mail") == []


async def test_expired_facts_are_never_returned(tmp_path: Path) -> None:
    """A fact past its expiry is not recalled, with or without a query; one not yet expired is."""
    async with memory_at(tmp_path) as mem:
        past = datetime.now(UTC) - timedelta(seconds=1)
        future = datetime.now(UTC) + timedelta(days=1)
        await mem.remember("alice", "profile", "old address in Paris", expires=past)
        kept = await mem.remember("alice", "profile", "new address in Paris", expires=future)
        assert [f.id for f in await mem.recall("alice", ["profile"], "address Paris")] == [kept.id]
        assert [f.id for f in await mem.recall("alice", ["profile"])] == [kept.id]
        assert kept.expires is not None
        with pytest.raises(ValueError, match="aware"):
            await mem.remember("alice", "profile", "x", expires=datetime.now())  # noqa: DTZ005 - the point


async def test_forget_removes_every_fact_of_the_subject_in_every_namespace(tmp_path: Path) -> None:
    """forget(subject) empties every namespace of that subject only; forget_fact removes one."""
    async with memory_at(tmp_path) as mem:
        for ns in ("profile", "tickets", "notes"):
            await mem.remember("alice", ns, f"alice fact in {ns}")
        bob = await mem.remember("bob", "profile", "bob fact")
        assert await mem.forget("alice") == 3
        assert await mem.recall("alice", ["profile", "tickets", "notes"], "fact") == []
        assert await mem.forget_fact(bob.id) is True
        assert await mem.forget_fact(bob.id) is False
        assert await mem.recall("bob", ["profile"]) == []


async def test_a_query_cannot_use_fts5_syntax(tmp_path: Path) -> None:
    """Quotes, column filters, NEAR and stars are words: no query raises or widens the match."""
    assert (
        fts_query('text:alice OR "x" NEAR(a b) pre*')
        == '"text" OR "alice" OR "or" OR "x" OR "near" OR "a" OR "b" OR "pre"'
    )
    async with memory_at(tmp_path) as mem:
        await mem.remember("alice", "profile", "likes tea")
        for query in ('"', "*", "(", "'; --"):  # no words: the newest facts, as for an empty query
            assert len(await mem.recall("alice", ["profile"], query)) == 1
        for query in ("NEAR(", "text:", "AND OR NOT", "'; DROP TABLE facts; --"):
            assert await mem.recall("alice", ["profile"], query) == []
        assert len(await mem.recall("alice", ["profile"], "tea")) == 1


async def test_bad_arguments_are_refused_with_the_rule(tmp_path: Path) -> None:
    """A bad subject, namespace, text or limit raises ValueError naming the rule; nothing is written."""
    mem = memory_at(tmp_path)
    with pytest.raises(ValueError, match="not a memory namespace"):
        await mem.remember("alice", "../x", "t")
    with pytest.raises(ValueError, match="not a memory subject"):
        await mem.remember("", "profile", "t")
    with pytest.raises(ValueError, match="not a memory subject"):
        await mem.remember("a\nb", "profile", "t")
    with pytest.raises(ValueError, match="non-empty"):
        await mem.remember("alice", "profile", "   ")
    with pytest.raises(ValueError, match="limit"):
        await mem.recall("alice", ["profile"], "x", limit=0)
    assert not mem.path.exists()


async def test_nothing_is_created_until_the_first_write_and_then_owner_only(tmp_path: Path) -> None:
    """Reads of a missing database find nothing and create nothing; the first write makes it 0o600."""
    mem = memory_at(tmp_path)
    assert await mem.recall("alice", ["profile"], "x") == []
    assert await mem.forget("alice") == 0
    assert not mem.path.exists()
    await mem.remember("alice", "profile", "x")
    assert mem.path.stat().st_mode & 0o777 == 0o600
    await mem.aclose()


def test_options_are_checked_at_their_place(tmp_path: Path) -> None:
    """An unknown option or a missing folder is a ConfigError at ``$.memory.KEY``."""
    with pytest.raises(ConfigError) as exc:
        SqliteMemory(MemorySettings(kind="sqlite", base_dir=tmp_path, options={"pth": "x", "path": "no/such/m.db"}))
    paths = [p.path for p in exc.value.problems]
    assert paths == ["$.memory.pth", "$.memory.path"]


# -- the assembly and the runtime ----------------------------------------------------------------


async def test_the_runtime_builds_the_assembly_memory_and_hosts_use_it(tmp_path: Path) -> None:
    """``memory:`` in YAML picks the kind and path; ``runtime.memory`` is that memory, for hosts."""
    (tmp_path / "loopwright.yaml").write_text(
        f"store: {{path: {tmp_path / 'store'}}}\nmemory: {{kind: sqlite, path: {tmp_path / 'facts.db'}}}\n"
    )
    async with loopwright.Runtime.from_file(tmp_path / "loopwright.yaml", autoload=False) as rt:
        assert isinstance(rt.memory, SqliteMemory)
        fact = await rt.memory.remember("alice", "profile", "likes tea")
        assert [f.id for f in await rt.memory.recall("alice", ["profile"], "tea")] == [fact.id]
    assert (tmp_path / "facts.db").exists()


async def test_an_unknown_memory_kind_names_the_registered_ones(tmp_path: Path) -> None:
    """The error is placed at ``memory.kind`` and lists ``sqlite``."""
    (tmp_path / "loopwright.yaml").write_text(f"store: {{path: {tmp_path / 'store'}}}\nmemory: {{kind: sqlit}}\n")
    with pytest.raises(ConfigError, match=r"unknown memory kind .sqlit..*sqlite"):
        async with loopwright.Runtime.from_file(tmp_path / "loopwright.yaml", autoload=False):
            pass


def test_definitions_and_assemblies_read_memory_from_yaml() -> None:
    """``memory:`` of a definition and ``capabilities.memory`` of an assembly load; bad namespaces do not."""
    d = load_definition(
        {
            "name": "x",
            "memory": {"subject": "{{customer}}", "read": ["profile"], "recall": 3},
            "inputs": {"customer": "string"},
        }
    )
    assert d.memory == MemorySpec(subject="{{customer}}", read=("profile",), recall=3)
    a = load_assembly({"capabilities": {"memory": {"read": ["profile"], "write": ["tickets"]}}})
    assert a.capabilities.memory == MemoryGrants(read=("profile",), write=("tickets",))
    with pytest.raises(ConfigError, match="memory"):
        load_definition({"name": "x", "memory": {"subject": "a", "read": ["../up"]}})
    with pytest.raises(ConfigError, match="recall"):
        load_definition({"name": "x", "memory": {"subject": "a", "recall": 50}})


# -- recall before each model call ----------------------------------------------------------------


async def test_facts_are_recalled_into_the_request_as_one_marked_message_not_the_transcript(tmp_path: Path) -> None:
    """The matching facts reach the model after the system prompt, marked memory; the transcript never has them."""
    h = Harness(reply("ok"))
    async with runtime(tmp_path, h) as rt:
        assert rt.memory is not None
        await rt.memory.remember("alice", "profile", "Alice prefers e-mail over phone calls")
        await rt.memory.remember("alice", "profile", "Alice likes green tea")
        await rt.memory.remember("bob", "profile", "Bob prefers e-mail too")
        run, _result = await run_to_rest(rt, with_memory(), prompt="Should I phone her or e-mail?")
        sent = h.sent[0]
        assert [(m.role, m.source) for m in sent] == [("system", None), ("system", "memory"), ("user", "api")]
        assert "Alice prefers e-mail over phone calls" in (sent[1].content or "")
        assert "Bob" not in (sent[1].content or "")
        assert all(m.source != "memory" for m in run.inst.transcript)
    async with runtime(tmp_path, h) as rt:
        saved = await rt.get_agent(run.instance_id)
        assert all(m.source != "memory" for m in saved.inst.transcript)


async def test_an_agent_without_memory_pays_nothing(tmp_path: Path) -> None:
    """No ``memory:``: the request is the transcript, the tools are not offered, and no database is made."""
    h = Harness(reply("ok"))
    async with runtime(tmp_path, h) as rt:
        await run_to_rest(rt, defn(system_prompt="s", tools=("remember", "recall")))
    assert [(m.role, m.source) for m in h.sent[0]] == [("system", None), ("user", "api")]
    assert h.requests[0].tools == ()
    assert not (tmp_path / "m.db").exists()


class RecallHook:
    """Sees what was recalled; rewrites or blocks the request when told to."""

    def __init__(self, decision: str | None = None) -> None:
        self.seen: list[tuple[str, ...]] = []
        self.decision = decision

    @loopwright.hookimpl
    def loopwright_recall(self, facts: Any, request: Any) -> Any:
        self.seen.append(tuple(f.text for f in facts))
        if self.decision == "block":
            return Block("no memory today")
        if self.decision == "drop":
            kept = [m for m in request.messages if m.source != "memory"]
            return ModifyRequest(request=_evolve(request, kept))
        return None


def _evolve(request: Any, messages: list[Any]) -> Any:
    import attrs  # noqa: PLC0415

    return attrs.evolve(request, messages=messages)


async def test_the_recall_hook_sees_the_facts_and_may_modify_or_block(tmp_path: Path) -> None:
    """``loopwright_recall`` gets the facts; ModifyRequest drops them from the call, Block fails the run."""
    for decision, expected in ((None, 3), ("drop", 2)):
        h = Harness(reply("ok"))
        hook = RecallHook(decision)
        (tmp_path / str(decision)).mkdir()
        async with runtime(tmp_path / str(decision), h) as rt:
            rt.register_plugin(hook)
            assert rt.memory is not None
            await rt.memory.remember("alice", "profile", "Alice likes green tea")
            await run_to_rest(rt, with_memory(), prompt="tea?")
        assert hook.seen == [("Alice likes green tea",)]
        assert len(h.sent[0]) == expected
    h = Harness(reply("never"))
    (tmp_path / "block").mkdir()
    async with runtime(tmp_path / "block", h) as rt:
        rt.register_plugin(RecallHook("block"))
        _run, result = await run_to_rest(rt, with_memory(), prompt="tea?")
    assert result.state is loopwright.State.ERROR
    assert "no memory today" in (result.error or "")
    assert h.sent == []


# -- the tools -------------------------------------------------------------------------------------


async def test_the_model_remembers_and_recalls_through_its_grant(tmp_path: Path) -> None:
    """``remember`` writes about the grant's subject; ``recall`` finds it; an ungranted namespace is a tool_error."""
    h = Harness(
        reply(None, call("remember", "r1", text="Ticket 7: printer jammed", namespace="tickets")),
        reply(None, call("recall", "r2", query="printer")),
        reply(None, call("remember", "r3", text="x", namespace="profile")),
        reply(None, call("recall", "r4", query="x", namespaces=["secret"])),
        reply("done"),
    )
    async with runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, with_memory(tools=("remember", "recall")), prompt="help")
        transcript = run.inst.transcript
        assert result_for(transcript, "r1").status is ToolStatus.SUCCESS
        recalled = json.loads(result_for(transcript, "r2").content or "[]")
        assert [f["text"] for f in recalled] == ["Ticket 7: printer jammed"]
        denied = result_for(transcript, "r3")
        assert denied.status is ToolStatus.TOOL_ERROR
        assert "'profile' is not granted for writing" in (denied.content or "")
        assert result_for(transcript, "r4").status is ToolStatus.TOOL_ERROR
        assert rt.memory is not None
        assert [f.subject for f in await rt.memory.recall("alice", ["tickets"], "printer")] == ["alice"]
        assert await rt.memory.recall("alice", ["profile"], "x") == []


async def test_the_tools_are_offered_only_with_a_grant(tmp_path: Path) -> None:
    """Without a write grant ``remember`` is not offered (nor callable); ``recall`` still is."""
    h = Harness(reply("ok"))
    async with runtime(tmp_path, h, write=()) as rt:
        await run_to_rest(rt, with_memory(tools=("remember", "recall")))
    assert [t.name for t in h.requests[0].tools] == ["recall"]


async def test_the_subject_is_templated_from_inputs_and_saved_in_the_header(tmp_path: Path) -> None:
    """``subject: "{{customer}}"`` binds the grant; the header saves it; a reloaded instance keeps it."""
    h = Harness(reply("ok"))
    d = with_memory(inputs={"customer": InputSpec()}, memory=MemorySpec(subject="{{customer}}", read=("profile",)))
    async with runtime(tmp_path, h) as rt:
        run, _ = await run_to_rest(rt, d, inputs={"customer": "carol"})
        assert run.inst.header.capabilities["memory"] == {"subject": "carol", "read": ["profile"], "write": []}
    async with runtime(tmp_path, h) as rt:
        saved = await rt.get_agent(run.instance_id)
        assert saved.inst.grants.memory == MemoryGrants(subject="carol", read=("profile",))


# -- the CLI ----------------------------------------------------------------------------------------


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run(
        [sys.executable, "-m", "loopwright.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cli_remembers_recalls_and_forgets(tmp_path: Path) -> None:
    """``loopwright memory remember|recall|forget --subject S`` against the assembly's memory."""
    (tmp_path / "loopwright.yaml").write_text("memory: {path: .loopwright/memory.db}\n")
    done = cli(tmp_path, "memory", "remember", "--subject", "alice", "--namespace", "profile", "likes green tea")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("remembered ")
    cli(tmp_path, "memory", "remember", "--subject", "alice", "--namespace", "tickets", "printer jammed")
    found = cli(
        tmp_path,
        "--json",
        "memory",
        "recall",
        "--subject",
        "alice",
        "--namespace",
        "profile",
        "--namespace",
        "tickets",
        "tea",
    )
    assert found.returncode == 0, found.stderr
    assert [f["text"] for f in json.loads(found.stdout)["facts"]] == ["likes green tea"]
    bad = cli(tmp_path, "memory", "remember", "--subject", "alice", "--namespace", "../x", "t")
    assert bad.returncode == 2
    assert "not a memory namespace" in bad.stderr
    gone = cli(tmp_path, "memory", "forget", "--subject", "alice")
    assert (gone.returncode, gone.stdout.strip()) == (0, "forgot 2 facts")
    left = cli(
        tmp_path, "--json", "memory", "recall", "--subject", "alice", "--namespace", "profile", "--namespace", "tickets"
    )
    assert json.loads(left.stdout) == {"facts": []}
    neither = cli(tmp_path, "memory", "forget")
    assert neither.returncode == 2


async def test_recall_runs_under_anyio(tmp_path: Path) -> None:
    """The memory works from a worker thread's event loop too (anyio.to_thread)."""
    mem = memory_at(tmp_path)
    await mem.remember("alice", "profile", "one")

    def other() -> list[Any]:
        return anyio.run(mem.recall, "alice", ["profile"])

    assert [f.text for f in await anyio.to_thread.run_sync(other)] == ["one"]
    await mem.aclose()


def test_the_docs_python_example_runs(tmp_path: Path) -> None:
    """The Python program of docs/memory.md runs as written and forgets the one fact it remembered."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "memory.md").read_text(encoding="utf-8")
    program = text.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "example.py").write_text(program)
    env = {**os.environ, "LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "1"), done.stderr

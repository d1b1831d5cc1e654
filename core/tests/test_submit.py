"""Submitting work: ``Runtime.submit``, the engine seam, and ``pick_up`` starting queued instances.

A submitted instance is written ``running`` and ``queued`` with no runner; nothing runs in the
submitting runtime. A runner (the worker, an engine's activity) starts it through
``Runtime.pick_up``. An instance ``start_agent`` creates is created with its lease held, so a
worker polling the store at that moment can never take it for a dead runner's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import Harness, call, defn, make_runtime, records_of, reply, runtime_id

import loopwright
from loopwright import State, StopReason
from loopwright._definition import Assembly, Capabilities, EngineConfig, FileGrants, StoreConfig
from loopwright.abc import Engine, StoreSettings
from loopwright.builtins.file_store import FileStore
from loopwright.builtins.local_engine import LocalEngine
from loopwright.builtins.sqlite_store import SqliteStore
from loopwright.errors import ConfigError

pytestmark = pytest.mark.anyio


class RecordingEngine(Engine):
    """An engine that only notes what it was handed (``in_process`` False, as a remote engine's)."""

    in_process = False

    def __init__(self, options: dict[str, Any], runtime: loopwright.Runtime) -> None:
        self.options = options
        self.runtime = runtime
        self.submitted: list[str] = []
        self.closed = False

    async def submit(self, instance_id: str) -> None:
        self.submitted.append(instance_id)

    async def aclose(self) -> None:
        self.closed = True


class EnginePlugin:
    """Registers the ``recording`` engine kind, with one declared option."""

    def __init__(self) -> None:
        self.engines: list[RecordingEngine] = []

    def _make(self, options: dict[str, Any], runtime: loopwright.Runtime) -> RecordingEngine:
        engine = RecordingEngine(options, runtime)
        self.engines.append(engine)
        return engine

    @loopwright.hookimpl
    def loopwright_register_engines(self, register: Any) -> None:
        register("recording", self._make, options=loopwright.options.options_schema({"queue": {"type": "string"}}))


async def test_submit_writes_a_queued_instance_and_runs_nothing(tmp_path: Path) -> None:
    h = Harness(reply("done"))
    async with make_runtime(tmp_path, h) as rt:
        assert isinstance(rt.engine, LocalEngine)
        iid = await rt.submit(defn(system_prompt="be brief"), prompt="go")
        assert rt.running() == []
        header = await rt.store.read_header(iid)
        assert header["state"] == "running"
        assert header["queued"] is True
        assert header["runner"] is None
        assert header["submittedBy"] == rt.owner
        assert await rt.store.read_entries(iid) == []
        assert await rt.store.find_work(limit=10) == [iid]
    assert h.requests == []


async def test_pick_up_starts_a_queued_instance_in_another_runtime(tmp_path: Path) -> None:
    async with make_runtime(tmp_path, Harness()) as rt:
        iid = await rt.submit(defn(system_prompt="be brief"), prompt="go")
    h = Harness(reply("done"))
    async with make_runtime(tmp_path, h) as rt:
        picked = await rt.pick_up(iid)
        assert picked is not None
        run, why = picked
        assert why == "start"
        result = await run.wait()
        assert result.state is State.WAITING
        assert [m.content for m in run.inst.transcript] == ["be brief", "go", "done"]
        header = await rt.store.read_header(iid)
        assert "queued" not in header
        assert header["runner"] == rt.owner
        states = [(r["from"], r["to"]) for r in records_of(await rt.records(iid), "state")]
        assert states[0] == (None, "running")
        assert ("running", "running") not in states
        assert await rt.pick_up(iid) is None  # nothing left to do
    assert len(h.requests) == 1


async def test_resume_starts_a_queued_instance_here(tmp_path: Path) -> None:
    async with make_runtime(tmp_path, Harness()) as rt:
        iid = await rt.submit(defn(), prompt="go")
    async with make_runtime(tmp_path, Harness(reply("done"))) as rt:
        run = await rt.resume(iid)
        result = await run.wait()
        assert result.state is State.WAITING
        assert [m.content for m in run.inst.transcript] == ["go", "done"]


async def test_a_queued_instance_is_never_resumed_as_a_dead_runners(tmp_path: Path) -> None:
    """Resuming would repair an "interrupted" step and skip the start; a queued one must start."""
    async with make_runtime(tmp_path, Harness()) as rt:
        iid = await rt.submit(defn(system_prompt="sys"), prompt="go")
    async with make_runtime(tmp_path, Harness(reply("done"))) as rt:
        run, why = await rt.pick_up(iid) or (None, None)
        assert why == "start"
        await run.wait()
        kinds = [r["kind"] for r in await rt.records(iid)]
        assert "resumed" not in kinds
        assert not any(r["kind"] == "error" for r in await rt.records(iid))


async def test_submit_checks_like_start_agent_before_creating_anything(tmp_path: Path) -> None:
    async with make_runtime(tmp_path, Harness()) as rt:
        with pytest.raises(ConfigError, match="nope"):
            await rt.submit(defn(tools=("nope",)), prompt="go")
        with pytest.raises(ConfigError):
            await rt.submit(defn(model="missing:m"), prompt="go")
        with pytest.raises(ConfigError, match="nothing"):  # an input the definition does not declare
            await rt.submit(defn(), {"nothing": 1}, prompt="go")
        assert await rt.store.list_headers() == []


async def test_submit_narrows_the_grants_to_the_runtimes(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    asm_caps = Capabilities(files=FileGrants(read=(str(work),)))
    async with make_runtime(tmp_path, Harness(), capabilities=asm_caps) as rt:
        wider = Capabilities(files=FileGrants(read=(str(work),), write=(str(work),)), shell="allow", network=True)  # noqa: S604 - a grant
        iid = await rt.submit(defn(), prompt="go", capabilities=wider)
        header = await rt.store.read_header(iid)
    caps = header["capabilities"]
    assert caps["files"]["write"] == []
    assert caps["shell"] == "none"
    assert caps["network"] is False


async def test_submit_by_registered_name_only_uses_the_assemblys_file(tmp_path: Path) -> None:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "helper.yaml").write_text("name: helper\nmodel: s:m\n")
    async with make_runtime(tmp_path, Harness(), agent_definitions={"helper": str(tmp_path / "agents/helper.yaml")},
                            ) as rt:
        iid = await rt.submit("helper", prompt="go")
        assert (await rt.store.read_header(iid))["name"] == "helper"


async def test_the_engine_is_built_from_the_assembly_and_told_of_each_submit(tmp_path: Path) -> None:
    plugin = EnginePlugin()
    rt = make_runtime(tmp_path, plugin, Harness(), engine=EngineConfig(kind="recording", options={"queue": "q"}))
    async with rt:
        engine = rt.engine
        assert isinstance(engine, RecordingEngine)
        assert engine.options == {"queue": "q"}
        assert engine.runtime is rt
        first = await rt.submit(defn(), prompt="one")
        second = await rt.submit(defn(), prompt="two", instance_id="chosen-id")
        assert engine.submitted == [first, "chosen-id"]
        assert second == "chosen-id"
        assert not engine.closed
    assert engine.closed


async def test_an_unknown_engine_kind_or_option_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown engine kind 'nope'.*local"):
        async with make_runtime(tmp_path, Harness(), engine=EngineConfig(kind="nope")):
            pass
    with pytest.raises(ConfigError, match="invalid options for the engine"):
        async with make_runtime(tmp_path, Harness(), engine=EngineConfig(kind="local", options={"x": 1})):
            pass
    with pytest.raises(ConfigError, match="invalid options for the engine"):
        async with make_runtime(tmp_path, EnginePlugin(), Harness(),
                                engine=EngineConfig(kind="recording", options={"queue": 3})):
            pass


async def test_the_engine_key_is_read_from_the_assembly_file(tmp_path: Path) -> None:
    from loopwright._config import load_assembly  # noqa: PLC0415 - the loader, as the CLI uses it

    (tmp_path / "loopwright.yaml").write_text("engine: {kind: recording, queue: q}\n")
    assert load_assembly(tmp_path / "loopwright.yaml").engine == EngineConfig(kind="recording", options={"queue": "q"})
    (tmp_path / "loopwright.yaml").write_text("{}\n")
    assert load_assembly(tmp_path / "loopwright.yaml").engine == EngineConfig(kind="local")


async def test_the_local_engine_wakes_a_subscriber_in_this_process(tmp_path: Path) -> None:
    woken: list[str] = []
    async with make_runtime(tmp_path, Harness()) as rt:
        assert isinstance(rt.engine, LocalEngine)
        assert rt.engine.in_process is True
        unsubscribe = rt.engine.subscribe(woken.append)
        iid = await rt.submit(defn(), prompt="go")
        unsubscribe()
        await rt.submit(defn(), prompt="again")
    assert woken == [iid]


async def test_cancel_stops_a_queued_instance_and_nothing_starts_it(tmp_path: Path) -> None:
    h = Harness(reply("never"))
    async with make_runtime(tmp_path, h) as rt:
        iid = await rt.submit(defn(), prompt="go")
        run = await rt.cancel(iid)
        assert run.inst.state is State.STOPPED
        header = await rt.store.read_header(iid)
        assert header["stopReason"] == StopReason.CANCELLED.value
        assert iid not in await rt.store.find_work(limit=10)
        assert await rt.pick_up(iid) is None
    assert h.requests == []


async def test_dead_runners_go_ahead_of_the_queue(tmp_path: Path) -> None:
    async with make_runtime(tmp_path, Harness()) as rt:
        queued = [await rt.submit(defn(), prompt="go", instance_id=f"q{n}") for n in range(3)]
        # An instance a runner began and then died on: running, not queued, updated last.
        await rt.store.create("dead", {**(await rt.store.read_header(queued[0])), "instanceId": "dead",
                                       "queued": False, "runner": "loopwright (host h, pid 1)",
                                       "updatedAt": "2999-01-01T00:00:00.000Z"})
        assert await rt.store.find_work(limit=10) == ["dead", *queued]


_STORES: dict[str, tuple[type[Any], str]] = {"file": (FileStore, "./store"), "sqlite": (SqliteStore, "./lw.db")}


@pytest.mark.parametrize("kind", sorted(_STORES))
async def test_start_agent_cannot_lose_its_new_instance_to_a_polling_worker(tmp_path: Path, kind: str) -> None:
    """Issue 15 item 4: a worker polling the store took a fresh instance before its creator held the lease.

    The rival worker here looks the moment the store has created the instance, before
    ``start_agent`` goes on: it must find the lease held, and the creator must run it.
    """
    base, path = _STORES[kind]
    rival_picked: list[Any] = []

    async def rival(instance_id: str) -> None:
        asm = Assembly(store=StoreConfig(kind=kind, options={"path": path}), path=tmp_path / "loopwright.yaml")
        async with loopwright.Runtime(asm, plugins=[Harness(reply("stolen"))], autoload=False) as other:
            picked = await other.pick_up(instance_id)
            rival_picked.append(picked)
            if picked is not None:
                await picked[0].wait()

    class RacedStore(base):  # type: ignore[misc, valid-type]
        async def create(self, instance_id: str, header: Any) -> None:
            await super().create(instance_id, header)
            await rival(instance_id)

        async def create_leased(self, instance_id: str, header: Any, owner: str) -> Any:
            lease = await super().create_leased(instance_id, header, owner)
            await rival(instance_id)
            return lease

    store = RacedStore(StoreSettings(kind=kind, base_dir=tmp_path, options={"path": path}))
    h = Harness(reply("mine"))
    async with store, loopwright.Runtime(Assembly(), plugins=[h], autoload=False, store=store) as rt:
        run = await rt.start_agent(defn(), prompt="go")
        result = await run.wait()
    assert rival_picked == [None]
    assert result.state is State.WAITING
    assert run.inst.transcript[-1].content == "mine"


# -- through the CLI and a host script, as a user would (subprocesses) -------------------------

PLUGIN = Path(__file__).with_name("worker_plugin.py")

REMOTE_ENGINE = '''
import loopwright
from loopwright.abc import Engine


class RemoteEngine(Engine):
    """Runners live elsewhere (a worker process): the plain commands submit, then follow."""

    in_process = False

    def __init__(self, options, runtime):
        pass

    async def submit(self, instance_id):
        with open("submitted.txt", "a") as f:
            f.write(instance_id + "\\n")


@loopwright.hookimpl
def loopwright_register_engines(register):
    register("remote", RemoteEngine)
'''


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder with a file-store assembly, the worker plugin and two definitions."""
    shutil.copy(PLUGIN, tmp_path / "worker_plugin.py")
    (tmp_path / "loopwright.yaml").write_text("store: {kind: file, path: ./store}\nplugins: [worker_plugin.py]\n")
    (tmp_path / "chat.yaml").write_text("name: chat\nmodel: script:chat\n")
    (tmp_path / "approve.yaml").write_text("name: approve\nmodel: script:approve\ntools: [delete]\n")
    return tmp_path


def lw(project: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=project, env=_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def worker_once(project: Path) -> list[dict[str, Any]]:
    done = lw(project, "worker", "--once", "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def show(project: Path, iid: str) -> dict[str, Any]:
    done = lw(project, "show", iid, "--json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_run_detach_prints_the_id_and_a_worker_starts_it(project: Path) -> None:
    done = lw(project, "run", "--detach", "chat.yaml", "-p", "hello")
    assert done.returncode == 0, done.stderr
    iid = done.stdout.strip()
    assert show(project, iid)["queued"] is True
    assert f"loopwright show {iid}" in done.stderr
    events = worker_once(project)
    assert [(e["event"], e["instanceId"], e.get("reason")) for e in events] == [
        ("pickedUp", iid, "start"), ("finished", iid, None)]
    assert events[1]["text"] == "answer to: hello"
    shown = show(project, iid)
    assert (shown["state"], shown["queued"]) == ("waiting", False)


def test_submit_is_run_detach_and_says_so_in_json(project: Path) -> None:
    done = lw(project, "submit", "chat.yaml", "-p", "hello", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["state"], data["queued"], data["submitted"]) == ("running", True, True)
    assert lw(project, "run", "--detach", "--stream", "chat.yaml").returncode == 2


def test_a_bad_definition_is_refused_before_anything_is_queued(project: Path) -> None:
    (project / "bad.yaml").write_text("name: bad\nmodel: script:chat\ntools: [no_such_tool]\n")
    done = lw(project, "run", "--detach", "bad.yaml", "-p", "x")
    assert done.returncode == 2, done.stderr
    assert "no_such_tool" in done.stderr
    assert json.loads(lw(project, "ls", "--json").stdout) == []


def test_message_detach_is_answered_by_a_worker(project: Path) -> None:
    first = json.loads(lw(project, "run", "chat.yaml", "-p", "first", "--json").stdout)
    iid = first["instanceId"]
    done = lw(project, "message", "--detach", iid, "second")
    assert (done.returncode, done.stdout.strip()) == (0, iid), done.stderr
    assert show(project, iid)["state"] == "waiting"  # nothing ran in the message process
    events = worker_once(project)
    assert [(e["event"], e.get("reason")) for e in events] == [("pickedUp", "message"), ("finished", None)]
    assert events[1]["text"] == "answer to: second"


def test_approve_detach_is_continued_by_a_worker(project: Path) -> None:
    held = json.loads(lw(project, "run", "approve.yaml", "--json").stdout)
    iid = held["instanceId"]
    assert held["state"] == "waiting_for_approval"
    done = lw(project, "approve", "--detach", iid, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["instanceId"], data["submitted"], data["state"]) == (iid, True, "waiting_for_approval")
    assert not (project / "x.deleted").exists()
    events = worker_once(project)
    assert [(e["event"], e.get("reason")) for e in events] == [("pickedUp", "approval"), ("finished", None)]
    assert events[1]["text"] == "result: deleted x"
    # Deciding again is refused as without --detach: the call no longer waits.
    assert lw(project, "approve", "--detach", iid).returncode == 2


def test_deny_detach_gives_the_denial_to_the_worker(project: Path) -> None:
    iid = json.loads(lw(project, "run", "approve.yaml", "--json").stdout)["instanceId"]
    done = lw(project, "deny", "--detach", iid, "--reason", "not today")
    assert done.returncode == 0, done.stderr
    events = worker_once(project)
    assert events[-1]["text"] == "result: denied: not today"


def test_a_host_script_submits_and_a_worker_runs_it(project: Path) -> None:
    (project / "host.py").write_text(
        "import anyio, loopwright\n"
        "async def main():\n"
        "    async with loopwright.Runtime.from_file('loopwright.yaml') as rt:\n"
        "        for n in range(3):\n"
        "            print(await rt.submit('chat.yaml', prompt=f'task {n}'))\n"
        "anyio.run(main)\n")
    done = subprocess.run([sys.executable, "host.py"], cwd=project, env=_env(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    ids = done.stdout.split()
    assert len(ids) == 3
    events = worker_once(project)
    assert sorted(e["instanceId"] for e in events if e["event"] == "pickedUp") == sorted(ids)
    assert sorted(e["text"] for e in events if e["event"] == "finished") == [f"answer to: task {n}" for n in range(3)]


def test_with_an_engine_that_runs_elsewhere_a_plain_run_submits_and_follows(project: Path) -> None:
    (project / "remote_engine.py").write_text(REMOTE_ENGINE)
    (project / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\nplugins: [worker_plugin.py, remote_engine.py]\nengine: {kind: remote}\n")
    worker = subprocess.Popen([sys.executable, "-m", "loopwright.cli", "worker", "--poll", "50ms"], cwd=project,
                              env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        done = lw(project, "run", "chat.yaml", "-p", "far away", "--json")
        held = lw(project, "run", "approve.yaml", "--json")
        iid = json.loads(held.stdout)["instanceId"]
        approved = lw(project, "approve", iid, "--json")
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["state"], result["text"]) == ("waiting", "answer to: far away")
    assert held.returncode == 3, held.stderr
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["text"] == "result: deleted x"
    # Nothing ran in the commands' processes: the worker picked each piece of work up.
    assert [line.split(": ")[-1] for line in out.splitlines() if line.startswith("picked up")] == [
        "start", "start", "approval"], err
    told = (project / "submitted.txt").read_text().split()
    assert told == [result["instanceId"], iid, iid]


def test_worker_runs_the_engines_own_worker_when_it_has_one(project: Path) -> None:
    (project / "queue_engine.py").write_text(
        "import loopwright\n"
        "from loopwright.abc import Engine\n"
        "class QueueEngine(Engine):\n"
        "    def __init__(self, options, runtime):\n"
        "        pass\n"
        "    async def submit(self, instance_id):\n"
        "        pass\n"
        "    async def run_worker(self, *, poll, max_concurrent, once, grace):\n"
        "        print(f'queue worker: {max_concurrent} slots, once={once}')\n"
        "        return 0\n"
        "@loopwright.hookimpl\n"
        "def loopwright_register_engines(register):\n"
        "    register('queue', QueueEngine)\n")
    (project / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\nplugins: [worker_plugin.py, queue_engine.py]\nengine: {kind: queue}\n")
    lw(project, "run", "--detach", "chat.yaml", "-p", "x")
    done = lw(project, "worker", "--once", "--max-concurrent", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "queue worker: 3 slots, once=True\n"  # the store was not polled: nothing picked up


# -- records after an interruption (issue 15 item 7) ------------------------------------------


@pytest.mark.parametrize("how", ["resume", "pick_up", "message", "cancel"])
async def test_whoever_takes_over_an_interrupted_instance_writes_its_lost_records(tmp_path: Path, how: str) -> None:
    """A runner that stops mid-turn loses that turn's queued records; the next runner writes them from the log."""
    started = anyio.Event()

    @loopwright.tool(name="hang")
    async def hang() -> str:
        """Wait forever."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    async with make_runtime(tmp_path, Harness(reply("working", call("hang", "c_hang")), tools=[hang])) as rt:
        run = await rt.start_agent(defn(tools=[hang]), prompt="go")
        with anyio.fail_after(30):  # a hang guard
            await started.wait()
        iid = run.instance_id
    # The runtime closed in the middle of the call, as a killed process would stop.
    async with make_runtime(tmp_path, Harness(reply("done"), tools=[hang])) as rt:
        assert not [r for r in await rt.records(iid) if r["kind"] == "turn"]  # lost with the process
        if how == "resume":
            await (await rt.resume(iid)).wait()
        elif how == "pick_up":
            picked = await rt.pick_up(iid)
            assert picked is not None
            await picked[0].wait()
        elif how == "message":
            await (await rt.message(iid, "and now?")).wait()
        else:
            await rt.cancel(iid)
        records = await rt.records(iid)
        header = await rt.store.read_header(iid)
        hang_call = runtime_id((await rt.get_agent(iid)).inst.transcript, "c_hang")
    turns = [r["data"] for r in records if r["kind"] == "turn"]
    assert [t["turn"] for t in turns] == list(range(1, header["turns"] + 1))
    assert turns[0]["repaired"] is True
    assert sum(t["usage"]["totalTokens"] for t in turns) == header["usage"]["totalTokens"]
    calls = [r["data"] for r in records if r["kind"] == "tool_call"]
    # Every way of taking it over answers the interrupted call once (a cancel too: it started).
    assert [(c["toolCallId"], c["status"]) for c in calls] == [(hang_call, "unknown_outcome")]


async def test_a_message_to_a_queued_instance_starts_it_with_the_message(tmp_path: Path) -> None:
    """Delivering a message in-process to a submitted instance starts it (prompts first), never as a dead runner's."""
    async with make_runtime(tmp_path, Harness()) as rt:
        iid = await rt.submit(defn(system_prompt="sys"), prompt="go")
    async with make_runtime(tmp_path, Harness(reply("done"))) as rt:
        run = await rt.message(iid, "and this")
        await run.wait()
        assert [m.content for m in run.inst.transcript] == ["sys", "go", "and this", "done"]
        assert "queued" not in await rt.store.read_header(iid)

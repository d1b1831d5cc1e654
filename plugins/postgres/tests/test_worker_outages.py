"""Workers on the postgres store when the server goes away: fencing, outages, the connection budget, NOTIFY.

The tests that stop or restart the server run on a cluster of their own (``own_cluster``,
pg_cluster.py), never on the shared one. Workers are ``loopwright worker`` subprocesses; the
model and the counted tool are ``pg_worker_plugin.py``'s: ``steps:N`` makes N ``step`` calls
after a message, and every ``step`` that really ran is a line in ``effects.log``.

What each run must show, whatever the server did: every instance ends with its final answer,
none is in ``error``; every call has exactly one result, right after the call, in order (no two
runners interleaved their writes); a call answered ``success`` ran exactly once, and no call ran
twice; and the workers exit 0 at SIGTERM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

import anyio
import pytest

from loopwright.abc import StoreSettings

LOOPWRIGHT = str(Path(sys.executable).with_name("loopwright"))
PLUGIN = Path(__file__).resolve().with_name("pg_worker_plugin.py")
# Its LW_PAUSE_RUNNING holds a segment between its "running" header and its first turn.
CORE_PLUGIN = Path(__file__).resolve().parents[3] / "core" / "tests" / "worker_plugin.py"
SCHEMA = "lw_outages"


def make_project(root: Path, dsn: str, *, steps: int, store: str = "", schema: str = SCHEMA,
                 pausing: bool = False) -> Path:
    """A folder with an assembly on ``dsn`` (extra store options in ``store``) and steps.yaml.

    With ``pausing``, core/tests/worker_plugin.py is loaded too, for its ``LW_PAUSE_RUNNING``.
    """
    shutil.copy(PLUGIN, root / "pg_worker_plugin.py")
    if pausing:
        shutil.copy(CORE_PLUGIN, root / "worker_plugin.py")
    (root / "loopwright.yaml").write_text(
        f"store:\n  kind: postgres\n  dsnEnv: LW_WORKER_DSN\n  schema: {schema}\n{store}"
        f"plugins: [loopwright_postgres, pg_worker_plugin.py{', worker_plugin.py' if pausing else ''}]\n")
    (root / "steps.yaml").write_text(f"name: steps\nmodel: steps:{steps}\ntools: [step]\n")
    os.environ["LW_WORKER_DSN"] = dsn  # for the runtimes of this process (tests run one at a time)
    return root


def env(dsn: str, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    return {**base, "LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD": "1", "LW_WORKER_DSN": dsn, **extra}


# The output files of each worker start_worker started, by pid, until collect() reads them.
_OUTPUT: dict[int, tuple[IO[str], IO[str]]] = {}


def start_worker(project: Path, dsn: str, *args: str, **extra: str) -> subprocess.Popen[str]:
    """Start ``loopwright worker --json`` in ``project``; its stdout and stderr go to temporary files.

    Not to pipes: nothing reads them while the worker runs, and a full pipe (64 KiB: a few
    hundred JSON lines, or the store's retry warnings on a slow machine) blocks the worker's
    next write, and with it the whole worker. :func:`collect` gives the output.
    """
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # noqa: SIM115 - collect() closes them
    proc = subprocess.Popen([LOOPWRIGHT, "worker", "--json", *args], cwd=project, env=env(dsn, **extra),
                            stdout=out, stderr=err, text=True)
    _OUTPUT[proc.pid] = (out, err)
    return proc


def collect(worker: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    """Wait for a worker of :func:`start_worker` to exit; return its stdout and stderr."""
    worker.wait(timeout=timeout)
    texts = []
    for f in _OUTPUT.pop(worker.pid):
        f.seek(0)
        texts.append(f.read())
        f.close()
    return texts[0], texts[1]


def stop_workers(workers: list[subprocess.Popen[str]]) -> list[tuple[str, str]]:
    for w in workers:
        w.send_signal(signal.SIGTERM)
    outs = [collect(w) for w in workers]
    assert [w.returncode for w in workers] == [0] * len(workers), [err[-3000:] for _out, err in outs]
    return outs


async def _create(project: Path, n: int) -> list[str]:
    from loopwright import Runtime  # noqa: PLC0415

    async with Runtime.from_file(project / "loopwright.yaml") as rt:
        ids: list[str] = []
        for start in range(0, n, 50):
            batch = range(start, min(n, start + 50))
            runs = [await rt.start_agent(project / "steps.yaml", prompt=f"i{k}") for k in batch]
            for run in runs:
                assert (await run.wait()).text == "ready"
            ids += [run.instance_id for run in runs]
        return ids


def create_resting(project: Path, n: int) -> list[str]:
    """Create ``n`` instances that rest at once (task prompts i0, i1, ...), in this process."""
    return anyio.run(_create, project, n)


def store_call(dsn: str, fn: Any, schema: str = SCHEMA) -> Any:
    from loopwright_postgres import PostgresStore  # noqa: PLC0415

    async def main() -> Any:
        settings = StoreSettings(kind="postgres", base_dir=Path.cwd(), options={"dsn": dsn, "schema": schema})
        async with PostgresStore(settings) as store:
            return await fn(store)
    return anyio.run(main)


def post_go(dsn: str, ids: list[str], schema: str = SCHEMA) -> None:
    async def post(store: Any) -> None:
        for iid in ids:
            await store.post(iid, {"type": "message", "text": "go", "source": "api", "at": "2026-01-01T00:00:00Z"})
    store_call(dsn, post, schema)


def states(dsn: str, schema: str = SCHEMA) -> Counter[str]:
    async def read(store: Any) -> Counter[str]:
        return Counter(h.get("state") for h in await store.list_headers())
    return store_call(dsn, read, schema)


def wait_until(what: str, check: Any, timeout: float = 300, *, seen: Any = None) -> None:
    """Poll ``check()`` until true (a hang guard, not a timing bound).

    On giving up, the message shows ``seen()`` (what the test last saw) when it is given.
    """
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up waiting for {what}" + (f"; last seen: {seen()}" if seen else ""))
        time.sleep(0.2)


def finished(dsn: str, n: int, schema: str = SCHEMA) -> Any:
    """A check that all ``n`` instances are done: they rest, and no message waits for any of them.

    Resting is not enough: an instance whose ``go`` no worker has taken yet rests too, and all
    ``n`` rest at once whenever the last ones are between a worker's looks. The check fails at
    once when one is in ``error`` (no long wait).
    """
    async def unread(store: Any) -> tuple[Counter[str], list[str]]:
        headers = await store.list_headers()
        waiting = []
        for h in headers:
            posts, _ = await store.read_posts(h["instanceId"], int(h.get("inboxCursor") or 0))
            if h.get("inbox") or any(p.get("type") == "message" for p in posts):
                waiting.append(h["instanceId"])
        return Counter(h.get("state") for h in headers), waiting

    def check() -> bool:
        now, mail_waits = store_call(dsn, unread, schema)
        assert not now["error"], f"an instance ended in error: {now}"
        return now == Counter({"waiting": n}) and not mail_waits
    return check


def effects(project: Path) -> Counter[str]:
    path = project / "effects.log"
    return Counter(path.read_text().split()) if path.exists() else Counter()


async def _check(project: Path, ids: list[str], steps: int) -> dict[str, str]:
    from loopwright import Runtime  # noqa: PLC0415

    ran = effects(project)
    statuses: dict[str, str] = {}
    async with Runtime.from_file(project / "loopwright.yaml") as rt:
        for iid in ids:
            run = await rt.get_agent(iid)
            assert run.inst.state.value == "waiting", (iid, run.inst.state)
            msgs = list(run.inst.transcript)
            task = next(m.content for m in msgs if m.role == "user")
            assert msgs[-1].content == f"done {task}", (iid, msgs[-3:])
            # The model's ids (``provider_id``); ``id`` is the runtime's own, one per call.
            calls = [(c.provider_id, c.arguments["tag"]) for m in msgs for c in m.tool_calls]
            assert [c for c, _tag in calls] == [f"call_{k}" for k in range(1, steps + 1)], (iid, calls)
            runtime_ids = [c.id for m in msgs for c in m.tool_calls]
            assert len(set(runtime_ids)) == len(runtime_ids), (iid, runtime_ids)
            for k, m in enumerate(msgs):
                if m.tool_calls:  # its one result comes right after it: no other runner wrote in between
                    answer = msgs[k + 1]
                    assert (answer.role, answer.tool_call_id, answer.provider_call_id) == (
                        "tool", m.tool_calls[0].id, m.tool_calls[0].provider_id), (iid, msgs[k:k + 3])
            results = [m for m in msgs if m.role == "tool"]
            # On a failure, the whole transcript in short: which call got an extra result, and what it said.
            assert len(results) == steps, (iid, [(m.role, m.tool_call_id or [c.id for c in m.tool_calls],
                                                  m.provider_call_id, str(m.status), (m.content or "")[:60])
                                                 for m in msgs])
            for (_call, tag), result in zip(calls, results, strict=True):
                status = result.status.value if result.status else "?"
                statuses[tag] = status
                assert ran[tag] <= 1, (tag, ran[tag])
                if status == "success":
                    assert ran[tag] == 1, (tag, ran[tag])
    assert set(ran) <= set(statuses), set(ran) - set(statuses)
    return statuses


def keeper_up(dsn: str, pid: int) -> bool:
    """Whether process ``pid`` has its keeper connected: its worker made its first look and waits now."""
    import psycopg  # noqa: PLC0415

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           (f"loopwright keeper (pid {pid})",)).fetchone()
    return bool(row and row[0])


def check_all(project: Path, ids: list[str], steps: int) -> dict[str, str]:
    """The invariants of the module docstring, for every instance; return each call's result status."""
    return anyio.run(_check, project, ids, steps)


def test_a_server_restart_mid_run_never_lets_two_runners_write(tmp_path: Path, own_cluster: Any) -> None:
    """Fencing: restarts (fast, and one long enough for the leases to expire) while 2 workers run 8 instances."""
    steps = 8
    project = make_project(tmp_path, own_cluster.dsn, steps=steps, store="  leaseTtl: 3\n")
    ids = create_resting(project, 8)
    first = start_worker(project, own_cluster.dsn, "--poll", "100ms", "--max-concurrent", "8")
    workers = [first]
    try:
        post_go(own_cluster.dsn, ids)
        wait_until("the first worker to run every instance",
                   lambda: len({t.split(":")[0] for t in effects(project)}) == 8)
        workers.append(start_worker(project, own_cluster.dsn, "--poll", "100ms", "--max-concurrent", "8"))
        time.sleep(0.5)
        own_cluster.restart("fast")
        time.sleep(1)
        # Down for longer than a lease lasts: when it is back, the other worker may take leases
        # over while the first one still runs them. Only the fence keeps their writes apart.
        own_cluster.stop("fast")
        time.sleep(4)
        own_cluster.start()
        wait_until("every instance to finish", finished(own_cluster.dsn, 8), seen=lambda: states(own_cluster.dsn))
    finally:
        outs = stop_workers(workers)
    check_all(project, ids, steps)
    for out, _err in outs:  # a look for work may fail while the server is down; no instance does
        for line in out.splitlines():
            event = json.loads(line)
            assert event["event"] in ("pickedUp", "finished", "left") or event["instanceId"] is None, line


@pytest.mark.parametrize("seconds", [3, 15])
def test_workers_ride_out_an_outage(tmp_path: Path, own_cluster: Any, seconds: int) -> None:
    """A 3 s and a 15 s outage under 2 workers: every instance completes, none in error, both exit 0."""
    steps = 8
    project = make_project(tmp_path, own_cluster.dsn, steps=steps)
    ids = create_resting(project, 32)
    # Short steps: many writes are in flight when the server stops.
    workers = [start_worker(project, own_cluster.dsn, "--poll", "200ms", "--max-concurrent", "8",
                            LW_STEP_SECONDS="0.02") for _ in range(2)]
    try:
        post_go(own_cluster.dsn, ids)
        wait_until("work to start", lambda: sum(effects(project).values()) >= 16)
        own_cluster.stop("fast")
        time.sleep(seconds)
        assert [w.poll() for w in workers] == [None, None], "a worker exited during the outage"
        own_cluster.start()
        wait_until("every instance to finish", finished(own_cluster.dsn, 32), seen=lambda: states(own_cluster.dsn))
    finally:
        stop_workers(workers)
    check_all(project, ids, steps)


def test_a_store_write_during_an_outage_waits_and_lands_once(tmp_path: Path, own_cluster: Any) -> None:
    """A fenced write made while the server is down is retried until it is back, applied once, lease kept."""
    project = make_project(tmp_path, own_cluster.dsn, steps=1)
    (iid,) = create_resting(project, 1)

    async def main() -> None:
        from loopwright_postgres import PostgresStore  # noqa: PLC0415

        settings = StoreSettings(kind="postgres", base_dir=tmp_path, options={"dsn": own_cluster.dsn,
                                                                              "schema": SCHEMA})
        async with PostgresStore(settings) as store:
            before = len(await store.read_entries(iid))
            lease = await store.acquire(iid, "me")
            await anyio.to_thread.run_sync(own_cluster.stop, "fast")
            async with anyio.create_task_group() as tg:
                tg.start_soon(store.append_entries, iid, [{"kind": "note", "n": 1}])
                await anyio.sleep(2)
                await anyio.to_thread.run_sync(own_cluster.start)
            assert len(await store.read_entries(iid)) == before + 1
            assert not lease.lost
            await store.write_header(iid, await store.read_header(iid))  # still ours
            lease.release()

    anyio.run(main)


def test_400_instances_run_at_once_within_30_connections(tmp_path: Path) -> None:
    """One worker runs 400 instances at the same time on a server that allows 30 connections."""
    from pg_cluster import Cluster  # noqa: PLC0415

    cluster = Cluster(max_connections=30)
    try:
        project = make_project(tmp_path, cluster.dsn, steps=1)
        ids = create_resting(project, 400)
        worker = start_worker(project, cluster.dsn, "--poll", "200ms", "--max-concurrent", "400",
                              LW_STEP_SECONDS="0", LW_STEP_BARRIER="go.flag")
        try:
            post_go(cluster.dsn, ids)
            # Every step waits for go.flag: 400 lines mean 400 instances in a tool call at once.
            wait_until("400 instances in their tool call at once", lambda: len(effects(project)) == 400, 600)
            (project / "go.flag").write_text("go")
            wait_until("every instance to finish", finished(cluster.dsn, 400), 600, seen=lambda: states(cluster.dsn))
        finally:
            outs = stop_workers([worker])
            sys.stdout.write(f"worker's stderr (end): {outs[0][1][-6000:]}\n")  # pytest shows it on a failure
        assert "too many clients" not in outs[0][1]
        statuses = check_all(project, ids, 1)
        assert set(statuses.values()) == {"success"}
    finally:
        cluster.remove()


def test_a_worker_wakes_on_notify_not_on_its_poll(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    """With a 10-minute poll interval, a message posted to a resting instance is picked up at once (NOTIFY)."""
    project = make_project(tmp_path, pg_dsn, steps=1, schema=pg_schema)
    (iid,) = create_resting(project, 1)
    worker = subprocess.Popen([LOOPWRIGHT, "worker", "--poll", "10m"], cwd=project, env=env(pg_dsn),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stderr is not None
        assert worker.stderr.readline().startswith("worker: serving")
        wait_until("the worker to wait", lambda: keeper_up(pg_dsn, worker.pid))  # its first look found nothing
        posted = time.monotonic()
        post_go(pg_dsn, [iid], pg_schema)
        assert worker.stdout is not None
        line = worker.stdout.readline()
        waited = time.monotonic() - posted
        assert line.startswith(f"picked up {iid}: message"), line
        # Only the notification can explain a pick-up well before the 600 s poll (hang guard: the test's own).
        assert waited < 300, waited
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)
    assert worker.returncode == 0


def test_a_killed_workers_instances_are_taken_over_before_the_poll(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    """SIGKILL of a worker mid-call: an idle worker with a 10-minute poll resumes its instance at once.

    No write notifies a death: the waiting worker's keeper looks for work under dead processes'
    leases every 2 s.
    """
    project = make_project(tmp_path, pg_dsn, steps=1, schema=pg_schema)
    (iid,) = create_resting(project, 1)
    doomed = start_worker(project, pg_dsn, "--poll", "10m", LW_STEP_SECONDS="600")
    post_go(pg_dsn, [iid], pg_schema)
    wait_until("the call to start", lambda: len(effects(project)) == 1)
    heir = subprocess.Popen([LOOPWRIGHT, "worker", "--poll", "10m"], cwd=project, env=env(pg_dsn),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert heir.stderr is not None
        assert heir.stderr.readline().startswith("worker: serving")
        # Its first look found the instance held by a live worker; it waits now.
        wait_until("the worker to wait", lambda: keeper_up(pg_dsn, heir.pid))
        doomed.kill()
        collect(doomed)
        killed = time.monotonic()
        assert heir.stdout is not None
        line = heir.stdout.readline()
        assert line.startswith(f"picked up {iid}: resume"), line
        assert time.monotonic() - killed < 300  # well before the 600 s poll
        wait_until("the instance to finish", lambda: states(pg_dsn, pg_schema) == Counter({"waiting": 1}))
    finally:
        heir.send_signal(signal.SIGTERM)
        heir.communicate(timeout=60)
        doomed.kill()
    assert heir.returncode == 0
    check_all(project, [iid], 1)


def sigterm_during_an_outage(worker: subprocess.Popen[str], cluster: Any) -> str:
    """Stop the server, SIGTERM the worker, check it exits 0, start the server again; return its stdout."""
    cluster.stop("fast")
    try:
        worker.send_signal(signal.SIGTERM)
        out, err = collect(worker)
        assert worker.returncode == 0, err[-3000:]
    finally:
        worker.kill()
        cluster.start()
    return out


def test_sigterm_during_an_outage_stops_the_worker_and_loses_nothing(tmp_path: Path, own_cluster: Any) -> None:
    """A worker told to stop while the server is down exits 0; once it is back, another worker finishes the work."""
    steps = 4
    project = make_project(tmp_path, own_cluster.dsn, steps=steps, store="  leaseTtl: 3\n")
    ids = create_resting(project, 6)
    worker = start_worker(project, own_cluster.dsn, "--poll", "200ms", "--grace", "1s")
    post_go(own_cluster.dsn, ids)
    wait_until("work to start", lambda: len(effects(project)) >= 4)
    sigterm_during_an_outage(worker, own_cluster)
    assert set(states(own_cluster.dsn)) <= {"running", "waiting"}
    heir = start_worker(project, own_cluster.dsn, "--poll", "200ms")
    try:
        wait_until("every instance to finish", finished(own_cluster.dsn, 6), seen=lambda: states(own_cluster.dsn))
    finally:
        stop_workers([heir])
    check_all(project, ids, steps)


def test_mail_read_by_a_worker_stopped_during_an_outage_is_answered_by_the_next(tmp_path: Path,
                                                                               own_cluster: Any) -> None:
    """The take-over after a stop gives the model the message its first runner had read but not yet given.

    Every segment pauses after its header says ``running`` (with the message moved from the
    mailbox into the header's queue) and before its first turn; the server stops, the worker is
    told to stop and leaves all of them ``running``. The heir resumes each one: its transcript
    ends with the "ready" of the segment before, and the queued message must still be read.
    """
    steps = 2
    project = make_project(tmp_path, own_cluster.dsn, steps=steps, store="  leaseTtl: 3\n", pausing=True)
    ids = create_resting(project, 4)
    worker = start_worker(project, own_cluster.dsn, "--poll", "200ms", "--grace", "1s", LW_PAUSE_RUNNING="600")
    post_go(own_cluster.dsn, ids)
    wait_until("every segment to pause", lambda: all((project / f"paused.{iid}").exists() for iid in ids))
    out = sigterm_during_an_outage(worker, own_cluster)
    assert states(own_cluster.dsn) == Counter({"running": 4}), out

    async def queues(store: Any) -> list[list[str]]:
        return [[m["text"] for m in (await store.read_header(iid))["inbox"]] for iid in ids]
    assert store_call(own_cluster.dsn, queues) == [["go"]] * 4  # read from the mailbox, not given yet
    heir = start_worker(project, own_cluster.dsn, "--poll", "200ms")
    try:
        wait_until("every instance to finish", finished(own_cluster.dsn, 4), seen=lambda: states(own_cluster.dsn))
    finally:
        stop_workers([heir])
    check_all(project, ids, steps)

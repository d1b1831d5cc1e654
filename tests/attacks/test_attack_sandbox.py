"""Attacks on ``shell: sandbox`` (issue 28): real commands under real bubblewrap, driven through the CLI.

A malicious model (the ``scripted`` provider) runs shell commands under ``shell: sandbox``. Each
test fails if the attack succeeds: the canary (a secret outside every root, or a provider key in
the runtime's environment) shows up in what was saved, a file appears where the grants allow
none, a connection is made without the network grant, a process outlives its command, or a limit
does not hold. Where a refusal alone could hide a broken test, a control beside it shows the same
command working when it is allowed (the read root read, the write root written, the connection
made with ``network: true``).

Where the sandbox cannot start these tests are skipped, unless ``LOOPWRIGHT_REQUIRE_SANDBOX=1``
(as ``.ci/run`` sets): then they fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

import loopwright
from loopwright.capabilities import BWRAP_ENV, sandbox_problem

TIMEOUT = 180  # a hang guard only
PROBLEM = sandbox_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None and os.environ.get("LOOPWRIGHT_REQUIRE_SANDBOX") != "1",
                                reason=f"the sandbox cannot start here: {PROBLEM}")
SHELL = "execute_terminal_command"
#: Tight limits, so that each attack meets its wall quickly.
LIMITS = {"processes": 32, "outputBytes": 1024 * 1024, "tmpBytes": 8 * 1024 * 1024, "fileBytes": 4 * 1024 * 1024}


@attrs.frozen
class Project:
    """A project: ``work/`` is the write root, ``ref/`` a read root, ``secret/key.txt`` (the canary) outside both."""

    root: Path
    canary: str

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def ref(self) -> Path:
        return self.root / "ref"

    @property
    def secret(self) -> Path:
        return self.root / "secret" / "key.txt"

    @property
    def store(self) -> Path:
        return self.root / "store"

    def assembly(self, replies: Sequence[Any], *, network: bool = False, shell: str = "sandbox",
                 sandbox: Mapping[str, Any] | None = None, **keys: Any) -> None:
        """Write ``loopwright.yaml``: a file store in ./store, the os and testing plugins, the scripted model."""
        data = {
            "store": {"kind": "file", "path": "./store"}, "plugins": ["os", "testing"],
            "capabilities": {"files": {"read": ["./ref"], "write": ["./work"]}, "shell": shell, "network": network,
                             **keys.pop("capabilities", {})},
            "providers": {"evil": {"kind": "scripted", "replies": [*replies, {"text": "done"}]},
                          **keys.pop("providers", {})},
            "pluginSettings": {"os": {"sandbox": dict(LIMITS if sandbox is None else sandbox)}}, **keys}
        (self.root / "loopwright.yaml").write_text(json.dumps(data, indent=1))
        agents = self.root / "agents"
        agents.mkdir(exist_ok=True)
        (agents / "evil.yaml").write_text(json.dumps({"name": "evil", "model": "evil:m", "tools": [SHELL]}))

    def lw(self, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``loopwright ARGS`` in the project folder (only the plugins the assembly lists)."""
        proc = subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=self.root, capture_output=True,
                              text=True, env={**cli_env(), **(env or {})}, timeout=TIMEOUT, check=False)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def run(self, *commands: str | Mapping[str, Any], env: Mapping[str, str] | None = None,
            **assembly: Any) -> list[dict[str, Any]]:
        """Run agent ``evil``, one turn per command (a string, or the call's arguments); return its results."""
        replies = [{"toolCalls": [{"name": SHELL, "arguments": {"command": c} if isinstance(c, str) else dict(c)}]}
                   for c in commands]
        self.assembly(replies, **assembly)
        done = self.lw("run", "--json", "agents/evil.yaml", env=env)
        assert done.returncode == 0, done
        result = json.loads(done.stdout)
        assert result["state"] == "waiting", result
        return self.tool_results(result["instanceId"])

    def tool_results(self, instance_id: str) -> list[dict[str, Any]]:
        lines = (self.store / instance_id / "entries.jsonl").read_text().splitlines()
        return [e["m"] for e in map(json.loads, lines) if e.get("t") == "msg" and e["m"].get("role") == "tool"]

    def saw_canary(self) -> list[str]:
        """Every saved file (transcripts, records, headers) that holds the canary."""
        return [str(p) for p in self.store.rglob("*") if p.is_file() and self.canary in p.read_text()]


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


@pytest.fixture
def project(tmp_path: Path) -> Project:
    root = tmp_path / "project"
    for folder in ("work", "ref", "secret"):
        (root / folder).mkdir(parents=True)
    p = Project(root, f"canary-{uuid.uuid4().hex}")
    p.secret.write_text(p.canary)
    (p.ref / "readme.txt").write_text("reference text\n")
    return p


def content(result: Mapping[str, Any]) -> str:
    return str(result["content"])


def processes_with(marker: str) -> list[int]:
    """The host's live processes whose command line holds ``marker``."""
    found = []
    for name in os.listdir("/proc"):  # noqa: PTH208 - hundreds of names, no Path objects needed
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def none_left(marker: str, within: float = 10.0) -> bool:
    """Wait until no process holds ``marker`` (a hang guard, not a bound the machine must meet)."""
    deadline = time.monotonic() + within
    while processes_with(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- files -------------------------------------------------------------------------------------------------


def test_a_file_outside_the_read_roots_cannot_be_read(project: Project) -> None:
    """``cat`` of the secret by absolute path, by ``..``, and a listing of the project: nothing; the read root reads."""
    results = project.run(
        f"cat {project.secret}; cat ../secret/key.txt; ls {project.root}; ls /; echo end",
        f"cat {project.ref}/readme.txt",  # the control
    )
    attack, control = results
    assert attack["status"] == "success"
    assert "No such file or directory" in content(attack)
    assert "secret" not in content(attack).split("--- stdout ---")[-1].split("--- stderr ---")[0]
    assert control["status"] == "success"
    assert "reference text" in content(control)
    assert project.saw_canary() == []


def test_nothing_outside_the_write_roots_can_be_written(project: Project) -> None:
    """Writing beside the secret, into the read root and into /usr fails; the write root is written (the control)."""
    planted = project.root / "secret" / "planted.txt"
    results = project.run(
        f"echo x > {planted}; echo x > {project.ref}/planted.txt; echo x > /usr/planted.txt; "
        f"mkdir -p {project.root}/new; echo end",
        "echo written > ok.txt",
    )
    attack, control = results
    assert "Read-only file system" in content(attack)
    assert not planted.exists()
    assert not (project.ref / "planted.txt").exists()
    assert not Path("/usr/planted.txt").exists()
    assert not (project.root / "new").exists()
    assert control["status"] == "success"
    assert (project.work / "ok.txt").read_text() == "written\n"


def test_the_store_cannot_be_reached(project: Project) -> None:
    """The store (a sibling of the roots) is not in the sandbox: not by path, not by a search of the whole tree."""
    (result,) = project.run(f"ls -la {project.store}; cat {project.store}/*/instance.json; "
                            "find / -name 'instance.json' -o -name 'entries.jsonl' 2>/dev/null; echo end")
    assert result["status"] == "success"
    assert "No such file or directory" in content(result)
    assert "instance.json" not in content(result).split("--- stdout ---")[-1].replace(
        f"{project.store}/*/instance.json", "")
    assert "capabilitiesRecorded" not in content(result)


def test_symlinks_planted_in_a_root_lead_nowhere(project: Project) -> None:
    """Links in the write root to the secret's folder and file: reads, lists and writes through them fail."""
    (project.work / "dir").symlink_to(project.root / "secret")
    (project.work / "key.txt").symlink_to(project.secret)
    (project.ref / "up").symlink_to(project.root)
    (result,) = project.run("cat key.txt; cat dir/key.txt; ls dir/; echo x > dir/planted.txt; "
                            f"cat {project.ref}/up/secret/key.txt; ls {project.ref}/up/; echo end")
    assert result["status"] == "success"
    text = content(result)
    for failed in ("cat: key.txt: No such file", "cat: dir/key.txt: No such file", "ls: cannot access 'dir/'",
                   "dir/planted.txt: Directory nonexistent", f"{project.ref}/up/secret/key.txt: No such file"):
        assert failed in text, text
    assert text.split("--- stdout ---\n")[1].startswith("ref\nwork\nend\n")  # up/ shows only the mount points
    assert project.saw_canary() == []
    assert sorted(p.name for p in (project.root / "secret").iterdir()) == ["key.txt"]


def test_proc_shows_only_the_sandbox(project: Project) -> None:
    """/proc is the sandbox's own: the host's processes, environments, roots and sysctls are out of reach."""
    key = f"sk-{project.canary}"
    (result,) = project.run(
        "ls /proc | grep -c '^[0-9]'; cat /proc/*/environ | tr '\\0' '\\n'; "
        f"cat /proc/1/root{project.secret}; cat /proc/self/root{project.secret}; "
        f"ls /proc/{os.getpid()}/; cat /proc/self/mountinfo | grep -c .; "
        "mount -t proc proc /tmp 2>&1; echo 1 > /proc/sys/vm/drop_caches; echo sysctl=$?; "
        "ls /proc/sys | wc -l; cat /proc/timer_list | wc -c; echo end",
        env={"OPENAI_API_KEY": key})
    text = content(result)
    stdout = text.split("--- stdout ---\n")[1]
    assert int(stdout.splitlines()[0]) < 10  # bubblewrap's reaper, the shell, its few children
    assert project.canary not in text
    assert project.saw_canary() == []
    assert "must be superuser" in text or "Operation not permitted" in text or "Permission denied" in text
    # /proc/sys is hidden: run as root, the sandbox's uid is root's outside it, and sysctls check only that.
    assert "sysctl=2" in text
    assert "\n0\n0\nend" in stdout


# -- environment, network ----------------------------------------------------------------------------------


def test_the_provider_key_in_the_runtimes_environment_is_not_passed_on(project: Project) -> None:
    """OPENAI_API_KEY is in the CLI's environment; the command sees a cleared one (and the model never the key)."""
    key = f"sk-{project.canary}"
    (result,) = project.run('env; echo "key=[$OPENAI_API_KEY]"; cat /proc/self/environ /proc/1/environ',
                            env={"OPENAI_API_KEY": key, "ANTHROPIC_API_KEY": key})
    assert result["status"] == "success"
    assert "key=[]" in content(result)
    assert project.canary not in content(result)
    assert project.saw_canary() == []


def test_naming_a_provider_key_in_the_sandbox_env_is_refused(project: Project) -> None:
    """``pluginSettings.os.sandbox.env: [OPENAI_API_KEY]`` is an error before anything runs."""
    project.assembly([{"toolCalls": [{"name": SHELL, "arguments": {"command": "touch ran.txt"}}]}],
                     sandbox={"env": ["OPENAI_API_KEY"]})
    done = project.lw("run", "--json", "agents/evil.yaml", env={"OPENAI_API_KEY": f"sk-{project.canary}"})
    assert done.returncode != 0
    assert "OPENAI_API_KEY" in done.stderr
    assert "looks like a secret" in done.stderr
    assert not (project.work / "ran.txt").exists()


@pytest.fixture
def server() -> Iterator[tuple[int, str]]:
    """A TCP server on 127.0.0.1 that greets every connection with a random line; yields (port, greeting)."""
    greeting = f"hello-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(greeting.encode() + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], greeting
    stop.set()
    thread.join(5)
    listener.close()


def _connect(port: int) -> str:
    return (f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && head -n 1 <&3' 2>&1; echo rc=$?; "
            "ls /etc/resolv.conf 2>&1")


def test_no_tcp_connection_without_the_network_grant(project: Project, server: tuple[int, str]) -> None:
    """Without ``network``, a connection to a server on the host's 127.0.0.1 fails (a network namespace of its own)."""
    port, greeting = server
    (result,) = project.run(_connect(port))
    assert greeting not in content(result)
    assert "Connection refused" in content(result)
    assert "rc=1" in content(result)


def test_a_tcp_connection_works_with_the_network_grant(project: Project, server: tuple[int, str]) -> None:
    """The control: with ``network: true`` the same command reaches the server and reads its greeting."""
    port, greeting = server
    (result,) = project.run(_connect(port), network=True)
    assert greeting in content(result)
    assert "rc=0" in content(result)


# -- limits ------------------------------------------------------------------------------------------------


def test_a_fork_bomb_is_stopped_and_leaves_nothing_behind(project: Project) -> None:
    """``bomb() { bomb | bomb & }; bomb``: past 32 processes the whole sandbox is killed, quickly, and says so."""
    marker = f"marker{uuid.uuid4().hex}"
    t0 = time.monotonic()
    (result,) = project.run({"command": f"bomb() {{ bomb | bomb & }}; bomb; sleep 100; echo {marker}",
                             "timeout": 60})
    assert time.monotonic() - t0 < 55  # stopped by the process bound, not by the timeout
    assert result["status"] == "tool_error"
    assert content(result).startswith("stopped: it ran more than 32 processes at once (the sandbox's limit)")
    assert none_left(marker)


def test_filling_the_disk_hits_a_wall(project: Project) -> None:
    """The private ``/tmp`` holds 8 MiB and no file may pass 4 MiB: both fills stop there, the host's disk untouched."""
    (result,) = project.run("for i in $(seq 20); do head -c 1000000 /dev/zero > /tmp/fill$i || break; done; "
                            "df -k /tmp | tail -1; head -c 50000000 /dev/zero > big.bin; echo rc=$?; echo end")
    text = content(result)
    assert "No space left on device" in text
    assert " 8192 " in text  # the size of the private /tmp, in KiB
    assert "100% /tmp" in text
    assert "rc=153" in text  # 128 + SIGXFSZ: RLIMIT_FSIZE stopped the write
    assert (project.work / "big.bin").stat().st_size <= LIMITS["fileBytes"]
    assert not Path("/tmp/fill1").exists()  # noqa: S108 - the host's /tmp: the sandbox had its own


def test_nothing_but_the_bounded_tmpfs_and_the_write_roots_is_writable(project: Project) -> None:
    """The sandbox's root, ``/dev`` and ``/usr`` are read-only; ``/dev/shm`` fills up at 8 MiB like ``/tmp``."""
    (result,) = project.run(
        "echo x > /planted; LC_ALL=C.UTF-8 mkdir /newdir; echo x > /dev/planted; echo x > /usr/planted; "
        "for i in $(seq 20); do head -c 1000000 /dev/zero > /dev/shm/fill$i || break; done; "
        "df -k /dev/shm | tail -1; echo hi > /dev/null && echo devnull-ok; echo end")
    text = content(result)
    for refused in ("/planted: Read-only file system", "/newdir\u2019: Read-only file system",
                    "/dev/planted: Read-only file system", "/usr/planted: Read-only file system",
                    "No space left on device"):
        assert refused in text, text
    assert "100% /dev/shm" in text
    assert "devnull-ok" in text


def test_printing_gigabytes_is_cut_at_the_output_limit(project: Project) -> None:
    """``yes`` forever: stopped once 1 MiB was read, never buffered whole; the model gets a short result."""
    t0 = time.monotonic()
    (result,) = project.run({"command": "yes loopwright-output-flood", "timeout": 60})
    assert time.monotonic() - t0 < 55
    assert result["status"] == "tool_error"
    assert content(result).startswith("stopped: its output passed the limit of 1,048,576 bytes")
    assert len(content(result)) < 100_000
    assert "bytes of stdout omitted" in content(result)


def test_sleeping_past_the_timeout_kills_every_process(project: Project) -> None:
    """A command and the process it left in the background both outlast the timeout: both are killed."""
    marker = f"{uuid.uuid4().int % 10**9}"
    (result,) = project.run({"command": f"sleep 600.{marker} & echo started; sleep 601.{marker}", "timeout": 2})
    assert result["status"] == "tool_error"
    assert content(result).startswith("timed out after 2 s: the command and every process it started were stopped")
    assert "started" in content(result)
    assert none_left(marker)


def test_a_cpu_hog_is_stopped_by_its_cpu_limit(project: Project) -> None:
    """A busy loop is killed by RLIMIT_CPU (2 s here) long before the wall-time limit (60 s)."""
    t0 = time.monotonic()
    (result,) = project.run({"command": "while :; do :; done", "timeout": 60},
                            sandbox={**LIMITS, "cpuSeconds": 2})
    assert time.monotonic() - t0 < 55
    assert result["status"] == "success"
    assert content(result).startswith("exit code: 137 (128 + SIGKILL")  # the hard CPU limit's SIGKILL


def test_memory_past_its_limit_cannot_be_allocated(project: Project) -> None:
    """RLIMIT_AS: a 64 MiB address space cannot hold a 200 MB string (the shell dies); 1 MB fits (the control)."""
    hog = '(x=$(head -c {n} /dev/zero | tr "\\0" a); echo "got ${{#x}}"); echo "rc=$?"'
    (result,) = project.run(f"{hog.format(n=200_000_000)}; echo ===; {hog.format(n=1_000_000)}",
                            sandbox={**LIMITS, "memoryBytes": 64 * 1024 * 1024})
    text = content(result)
    assert "===" in text, text
    first, second = text.split("===")
    assert "got 200000000" not in first
    assert "rc=0" not in first
    assert "got 1000000\nrc=0" in second


# -- failing closed ----------------------------------------------------------------------------------------


def test_no_bubblewrap_refuses_the_assembly_and_runs_nothing(project: Project) -> None:
    """No bubblewrap (``LOOPWRIGHT_BWRAP`` at a path with nothing): ``run`` exits 2 naming why; validate says so."""
    project.assembly([{"toolCalls": [{"name": SHELL, "arguments": {"command": "touch ran.txt"}}]}])
    missing = {BWRAP_ENV: str(project.root / "no-bwrap-here")}
    done = project.lw("run", "--json", "agents/evil.yaml", env=missing)
    assert done.returncode == 2, done
    assert "capabilities.shell is 'sandbox', but the sandbox cannot start on this machine" in done.stderr
    assert "no-bwrap-here" in done.stderr
    assert not (project.work / "ran.txt").exists()
    assert not project.store.exists() or not any(project.store.iterdir())
    checked = project.lw("validate", "loopwright.yaml", env=missing)
    assert checked.returncode == 2
    assert "the sandbox cannot start on this machine" in checked.stdout + checked.stderr
    works = project.lw("validate", "./loopwright.yaml")  # the control: where it works, validate says so
    assert works.returncode == 0, works
    assert "shell: sandbox: the sandbox works on this machine" in works.stdout


# -- a child with narrower grants --------------------------------------------------------------------------


def test_a_child_with_narrower_grants_gets_a_narrower_sandbox(project: Project) -> None:
    """A sandbox parent starts a child asking for ``shell: allow`` and only ``work/sub``: the child is sandboxed
    and its sandbox binds only ``work/sub``; the parent's own command still sees all of ``work/`` (the control).
    """
    sub = project.work / "sub"
    sub.mkdir()
    (project.work / "parent-only.txt").write_text(project.canary)
    child_grants = {"files": {"read": [str(sub)], "write": [str(sub)]}, "shell": "allow"}
    probe = (f"cat {project.work}/parent-only.txt; echo x > {project.work}/from-child.txt; "
             "echo child > mine.txt; pwd; cat /proc/self/status | grep -c NoNewPrivs; echo end")
    project.assembly(
        [{"toolCalls": [{"name": "run_agent_async",
                         "arguments": {"definition": "child", "prompt": "go", "grants": child_grants}}]},
         {"toolCalls": [{"name": SHELL, "arguments": {"command": f"ls {project.work}"}}]}],
        capabilities={"agents": {"spawn": True}},
        providers={"kid": {"kind": "scripted", "replies": [
            {"toolCalls": [{"name": SHELL, "arguments": {"command": probe}}]}, {"text": "child done"}]}},
        agentDefinitions={"child": "agents/child.yaml"})
    (project.root / "agents" / "child.yaml").write_text(json.dumps({"name": "child", "model": "kid:m",
                                                                    "tools": [SHELL]}))
    (project.root / "agents" / "evil.yaml").write_text(json.dumps({"name": "evil", "model": "evil:m",
                                                                   "tools": [SHELL, "run_agent_async"]}))

    async def main() -> tuple[str, str]:
        async with loopwright.Runtime.from_file(project.root / "loopwright.yaml", autoload=False) as rt:
            with anyio.fail_after(TIMEOUT):
                run = await rt.start_agent(str(project.root / "agents" / "evil.yaml"), None, "go")
                await run.wait()
                await rt.wait_idle()
            return run.instance_id, json.loads(next(
                m["content"] for m in project.tool_results(run.instance_id) if "instanceId" in m["content"]))[
                    "instanceId"]

    os.environ["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        parent_id, child_id = anyio.run(main)
    finally:
        del os.environ["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"]
    header = json.loads((project.store / child_id / "instance.json").read_text())
    assert header["capabilities"]["shell"] == "sandbox"  # asked for allow: a sandbox parent's child is sandboxed
    assert header["capabilities"]["files"] == {"read": [str(sub.resolve())], "write": [str(sub.resolve())]}
    (child_result,) = project.tool_results(child_id)
    text = content(child_result)
    assert "No such file or directory" in text  # work/parent-only.txt is not in the child's sandbox
    assert project.canary not in text
    assert not (project.work / "from-child.txt").exists()
    assert (sub / "mine.txt").read_text() == "child\n"
    assert f"{sub.resolve()}\n" in text
    parent_ls = [m for m in project.tool_results(parent_id) if "parent-only.txt" in m["content"]]
    assert len(parent_ls) == 1  # the control: the parent's own sandbox has all of work/

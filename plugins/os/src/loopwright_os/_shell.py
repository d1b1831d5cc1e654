"""``execute_terminal_command {command, timeout?}``: a shell command under the instance's ``shell`` grant.

The grant decides who says yes (seed 000, "Approvals"):

``none``
    The tool is not offered; a call to it gets ``unknown_tool``.
``allow``
    The command runs.
``approval``
    The host's approver (``Runtime(shell_approver=...)``) decides inside the tool; a refusal is a
    ``denied`` result with the approver's reason. A runtime without an approver holds the call at
    the loop's approval gate instead, so a saved instance resumed elsewhere is never let through.
``loopApproval``
    Every call is held with a pending approval that shows the command, and runs after ``approve``
    (in any process, after a restart too).
``sandbox``
    The command runs in a bubblewrap sandbox built from the instance's grants
    (:mod:`loopwright_os._sandbox`): only its file roots, no network unless granted, a cleared
    environment, limits on CPU, memory, processes, output and time. Where the sandbox cannot
    start the call fails (``tool_error``) and nothing runs: never unsandboxed.
``sandboxLoopApproval``
    Held as under ``loopApproval``, then run as under ``sandbox``.

The command runs as ``/bin/sh -c COMMAND`` in a new session, so it leads its own process group.
When it exits or runs out of time, the whole group is stopped (SIGTERM, then SIGKILL after
:data:`KILL_GRACE` seconds): nothing it started outlives the call. Cancelling the run or the
loop's tool timeout stops the group the same way.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from loopwright import ToolContext, tool
from loopwright.errors import ToolCallDenied, ToolError
from loopwright_os._sandbox import SANDBOX_MODES, SandboxPlan, SandboxSettings, plan_sandbox, sandbox_settings

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream, ByteSendStream, Process

    from loopwright import Capabilities, Tool

__all__ = [
    "DEFAULT_TIMEOUT",
    "KILL_GRACE",
    "OUTPUT_HEAD",
    "OUTPUT_TAIL",
    "Outcome",
    "collect",
    "execute_terminal_command",
    "shell_tool",
]

#: Seconds a command may run when the call gives no ``timeout``.
DEFAULT_TIMEOUT = 60.0
#: Seconds between SIGTERM and SIGKILL to the command's process group.
KILL_GRACE = 0.5
#: Bytes kept from the start and from the end of each stream (stdout, stderr); the middle of a
#: longer output is dropped with a marker. Both streams together stay under the loop's 100,000
#: character cut.
OUTPUT_HEAD = 16 * 1024
OUTPUT_TAIL = 16 * 1024
#: Seconds kept back from the loop's tool timeout, so that the tool itself stops the command and
#: reports its output before the loop gives up on the call.
_RESERVE = 3 * KILL_GRACE
#: What a shell adds to a signal's number in an exit code (bubblewrap reports its command's death so).
_SIGNALLED = 128
#: Seconds between two counts of a sandbox's processes.
_WATCH_EVERY = 0.01


def _offered(grants: Capabilities) -> bool:
    return grants.shell != "none"


def _hold(arguments: Mapping[str, Any], context: ToolContext) -> str | None:
    """Hold the call at the loop's gate under ``loopApproval``, and under ``approval`` without an approver."""
    mode = context.grants.shell
    if mode in ("loopApproval", "sandboxLoopApproval") or (mode == "approval" and context.shell_approver is None):
        return f"run shell command: {arguments.get('command')}"
    return None


def shell_tool(settings: Mapping[str, Any] | None = None) -> Tool:
    """Return ``execute_terminal_command`` as the assembly's ``pluginSettings.os`` configure it.

    :param settings: The ``os`` entry of ``pluginSettings``; its ``sandbox`` entry sets the
        limits and the environment of sandboxed commands (:func:`~loopwright_os._sandbox.sandbox_settings`).
    :raises ValueError: The ``sandbox`` entry is malformed (or passes on a secret).
    """
    sandbox = sandbox_settings(settings)

    @tool(name="execute_terminal_command", parallel_safe=False, available=_offered, hold=_hold)
    async def execute_terminal_command(
        command: str, timeout: float | None = None, *, context: ToolContext,  # noqa: ASYNC109 - the tool's argument
    ) -> str:
        """Run a shell command (/bin/sh -c) and return its exit code, stdout and stderr.

        Args:
            command: The command line. It runs in the working folder: the first writable file root,
                else a fresh temporary folder.
            timeout: Seconds before the command and every process it started are stopped (default 60).
            context: The calling instance's grants and the host's approver, filled in by the loop.
        """
        return await _execute(command, timeout, context, sandbox)

    return execute_terminal_command


async def _execute(command: str, wanted: float | None, context: ToolContext, sandbox: SandboxSettings) -> str:
    """Run the call: ``wanted`` is the call's ``timeout`` argument."""
    mode = context.grants.shell
    if mode == "none":
        raise ToolError("shell access is not granted to this agent")
    if wanted is not None and wanted <= 0:
        raise ToolError("timeout must be a positive number of seconds")
    if mode == "approval" and context.shell_approver is not None:
        await _ask(context.shell_approver, command, context)
    budget = context.timeout - _RESERVE if context.timeout > 2 * _RESERVE else context.timeout / 2
    limit = min(wanted or DEFAULT_TIMEOUT, budget)
    if mode in SANDBOX_MODES:
        private = [*(("the store", p) for p in context.store_locations),
                   *(("a record sink", p) for p in context.sink_locations)]
        plan = plan_sandbox(command, context.grants, base=context.base_dir, private=private, settings=sandbox)
        return await _run(command, Path("/"), limit, plan=plan)
    workdir = _workdir(context)
    scratch = None
    if workdir is None:
        scratch = workdir = Path(tempfile.mkdtemp(prefix="loopwright-shell-"))
    try:
        return await _run(command, workdir, limit)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


#: The tool with the default settings (what the plugin registers is built by :func:`shell_tool`).
execute_terminal_command = shell_tool()


async def _ask(approver: Any, command: str, context: ToolContext) -> None:
    """Ask the host's approver; raise :class:`ToolCallDenied` unless it answers exactly True."""
    try:
        if inspect.iscoroutinefunction(approver):
            verdict = await approver(command, context)
        else:
            # A terminal prompt blocks: it gets a worker thread, not the event loop.
            verdict = await anyio.to_thread.run_sync(approver, command, context)
            if inspect.isawaitable(verdict):
                verdict = await verdict
    except Exception as exc:  # an approver that fails refuses (fail closed)
        raise ToolCallDenied(f"the shell approver failed ({type(exc).__name__}: {exc})") from exc
    if verdict is True:
        return
    reason = verdict if isinstance(verdict, str) and verdict else "the shell approver refused the command"
    raise ToolCallDenied(reason)


def _workdir(context: ToolContext) -> Path | None:
    """Return the first writable root that is a folder, resolved against the assembly's folder."""
    for root in context.grants.files.write:
        path = (context.base_dir / Path(root).expanduser()).resolve()
        if path.is_dir():
            return path
    return None


class _Capture:
    """Keeps the first :data:`OUTPUT_HEAD` and the last :data:`OUTPUT_TAIL` bytes of a stream."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = OUTPUT_HEAD - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * OUTPUT_TAIL:
                del self.tail[:-OUTPUT_TAIL]

    def text(self, name: str) -> str:
        tail = bytes(self.tail[-OUTPUT_TAIL:])
        omitted = self.total - len(self.head) - len(tail)
        out = self.head.decode("utf-8", errors="replace")
        if omitted > 0:
            out += (f"\n[... {omitted:,} bytes of {name} omitted: it had {self.total:,} bytes; the first "
                    f"{OUTPUT_HEAD:,} and the last {OUTPUT_TAIL:,} are shown ...]\n")
        return out + tail.decode("utf-8", errors="replace")


class _Guard:
    """What stops a sandboxed command early: its output bound and its process bound.

    Attributes:
        output_bytes: Bytes of stdout plus stderr allowed (``None``: no bound, only the capture's cut).
        tripped: Why the command was stopped early, once it was.
        sandbox_init: The pid (on the host) of the sandbox's first process, once found; killing
            it makes the kernel kill every process of the sandbox's pid namespace.
    """

    def __init__(self, output_bytes: int | None, process: Process) -> None:
        self.output_bytes = output_bytes
        self.process = process
        self.group = self.bwrap = process.pid
        self.tripped: str | None = None
        self.sandbox_init: int | None = None

    def trip(self, why: str) -> None:
        """Stop the whole command now (SIGKILL): the sandbox's namespace, and the process group.

        Only while bubblewrap has not been reaped: its pid and its child's cannot have been reused.
        """
        if self.tripped is None:
            self.tripped = why
        if self.process.returncode is not None:
            return
        if self.sandbox_init is None:
            self.sandbox_init = _sandbox_init(self.bwrap)
        if self.sandbox_init is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.sandbox_init, signal.SIGKILL)
        _signal(self.group, signal.SIGKILL)


async def _drain(stream: ByteReceiveStream | None, capture: _Capture, guard: _Guard | None = None,
                 other: _Capture | None = None) -> None:
    if stream is None:
        return
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        async for chunk in stream:
            capture.add(chunk)
            if guard is not None and guard.output_bytes is not None and other is not None \
                    and capture.total + other.total > guard.output_bytes:
                guard.trip(f"its output passed the limit of {guard.output_bytes:,} bytes")
                return


async def _watch(guard: _Guard, processes: int) -> None:
    """Count the sandbox's processes every :data:`_WATCH_EVERY` seconds; past ``processes``, stop it all.

    RLIMIT_NPROC is not enforced for uid 0, so as root this is what bounds a fork bomb: the
    kernel kills every process of a pid namespace when its first one dies. The count walks the
    sandbox's tree from its first process (every orphan in a pid namespace is reparented to it),
    so it costs what the sandbox holds, not what the host runs.
    """
    namespace: str | None = None
    while guard.tripped is None:
        await anyio.sleep(_WATCH_EVERY)  # most commands are over before the first count
        if guard.sandbox_init is None:
            guard.sandbox_init = _sandbox_init(guard.bwrap)
            if guard.sandbox_init is None:
                continue
        count = _descendants(guard.sandbox_init)
        if count is None:  # no /proc/PID/task/TID/children here: count the pid namespace's members
            namespace = namespace or _pid_namespace(guard.sandbox_init)
            count = _count_in(namespace) - 1 if namespace is not None else 0
        # The sandbox's own first process (bubblewrap's reaper) is not one of the command's.
        if count > processes:
            guard.trip(f"it ran more than {processes} processes at once (the sandbox's limit)")
            return


def _children(pid: int) -> list[int] | None:
    """Return the children of every thread of ``pid``, or None where the kernel does not list them."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")  # noqa: PTH208 - a few names
    except OSError:
        return []
    out: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:  # noqa: PTH123 - many tiny reads
                out.extend(int(n) for n in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{task}"):  # noqa: PTH110 - the task ended meanwhile
                continue
            return None
        except OSError:
            continue
    return out


def _descendants(pid: int) -> int | None:
    """Return how many processes descend from ``pid`` (None: the kernel does not list children)."""
    count, todo = 0, [pid]
    while todo:
        children = _children(todo.pop())
        if children is None:
            return None
        count += len(children)
        todo.extend(children)
    return count


def _sandbox_init(bwrap: int) -> int | None:
    """Return the pid of bubblewrap's child (the first process of the sandbox's pid namespace), if it has one yet."""
    children = _children(bwrap)
    if children is not None:
        return children[0] if children else None
    for name in _proc_names():
        stat = _stat(name)
        if stat is not None and len(stat) > 1 and int(stat[1]) == bwrap:
            return int(name)
    return None


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")  # noqa: PTH115 - a string to compare, no Path needed
    except OSError:
        return None


def _count_in(namespace: str) -> int:
    """Return how many processes are in the pid namespace ``namespace`` (``pid:[inode]``)."""
    count = 0
    for name in _proc_names():
        try:
            if os.readlink(f"/proc/{name}/ns/pid") == namespace:  # noqa: PTH115 - hundreds of reads
                count += 1
        except OSError:
            continue
    return count


def _proc_names() -> list[str]:
    try:
        return [n for n in os.listdir("/proc") if n.isdigit()]  # noqa: PTH208 - hundreds of names
    except OSError:
        return []


def _stat(name: str) -> list[bytes] | None:
    """Return the fields of ``/proc/NAME/stat`` after the command name (state, ppid, pgrp, ...)."""
    try:
        with open(f"/proc/{name}/stat", "rb") as f:  # noqa: PTH123 - many tiny reads
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()


@attrs.frozen
class Outcome:
    """What a finished process left: its exit code, its output, and why it was stopped early (if it was)."""

    returncode: int | None
    out: _Capture
    err: _Capture
    timed_out: bool
    tripped: str | None


async def _run(command: str, workdir: Path, limit: float, *, plan: SandboxPlan | None = None) -> str:
    """Run ``command`` (in ``plan``'s sandbox when given); return the report, or raise ToolError.

    Raises ToolError, with the output so far, when the command timed out or (sandboxed) passed
    its output or process bound.
    """
    done = await collect(command, workdir, limit, plan=plan)
    report = _report(done.returncode, done.out, done.err, sandboxed=plan is not None)
    if done.timed_out:
        raise ToolError(f"timed out after {limit:g} s: the command and every process it started were "
                        f"stopped\n{report}")
    if done.tripped is not None:
        raise ToolError(f"stopped: {done.tripped}; the command and every process it started were "
                        f"stopped\n{report}")
    return report


async def collect(command: str, workdir: Path, limit: float, *, plan: SandboxPlan | None = None,
                  stdin: bytes | None = None) -> Outcome:
    """Run ``command`` (``plan.argv`` when a sandbox plan is given) to its end or ``limit`` seconds.

    Whatever happens (an exit, the limit, a bound of the sandbox, the call cancelled), every
    process it started is stopped before this returns. ``stdin`` is written to its standard input,
    which is then closed (``None``: ``/dev/null``).
    """
    feed = subprocess.DEVNULL if stdin is None else subprocess.PIPE
    if plan is None:
        process = await anyio.open_process(command, cwd=workdir, stdin=feed, start_new_session=True)
    else:
        process = await anyio.open_process(list(plan.argv), cwd=workdir, env=dict(plan.env),
                                           stdin=feed, start_new_session=True)
    group = process.pid  # the session leader's pid is its process group id
    guard = _Guard(plan.settings.output_bytes if plan is not None else None, process)
    out, err = _Capture(), _Capture()
    timed_out = stopped = False
    try:
        async with anyio.create_task_group() as tg:
            if stdin is not None:
                tg.start_soon(_feed, process.stdin, stdin)
            tg.start_soon(_drain, process.stdout, out, guard, err)
            tg.start_soon(_drain, process.stderr, err, guard, out)
            if plan is not None:
                watch = anyio.CancelScope()
                tg.start_soon(_watched, watch, guard, plan.settings.processes)
            with anyio.move_on_after(limit) as scope:
                await process.wait()
            timed_out = scope.cancelled_caught
            if plan is not None:
                watch.cancel()
                if timed_out:
                    guard.trip("timed out")
            await _stop_group(group)
            stopped = True
            await process.wait()
            # A process that left the group (setsid) may still hold the pipes: stop reading soon.
            tg.cancel_scope.deadline = anyio.current_time() + KILL_GRACE
    finally:
        with anyio.CancelScope(shield=True):  # also when the run is cancelled or the loop timed out
            if plan is not None and process.returncode is None:
                guard.trip("stopped")
            if not stopped:
                await _stop_group(group)
            await process.aclose()
    tripped = guard.tripped if guard.tripped not in (None, "stopped", "timed out") else None
    return Outcome(returncode=process.returncode, out=out, err=err, timed_out=timed_out, tripped=tripped)


async def _feed(stream: ByteSendStream | None, data: bytes) -> None:
    """Write ``data`` to the process's stdin and close it (a process that stops reading just loses the rest)."""
    if stream is None:
        return
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await stream.send(data)
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await stream.aclose()


async def _watched(scope: anyio.CancelScope, guard: _Guard, processes: int) -> None:
    with scope:
        await _watch(guard, processes)


def _report(returncode: int | None, out: _Capture, err: _Capture, *, sandboxed: bool = False) -> str:
    """Return the result text; ``sandboxed``: bubblewrap reports a command killed by signal N as 128 + N."""
    if returncode is None:
        status = "exit code: unknown"
    elif returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        status = f"exit code: {returncode} (killed by {name})"
    elif sandboxed and _SIGNALLED < returncode < _SIGNALLED + 65:
        try:
            name = signal.Signals(returncode - _SIGNALLED).name
        except ValueError:
            name = str(returncode - _SIGNALLED)
        status = f"exit code: {returncode} (128 + {name}: killed by that signal, or it exited with {returncode})"
    else:
        status = f"exit code: {returncode}"
    parts = [status]
    if out.total:
        parts.append("--- stdout ---\n" + out.text("stdout"))
    if err.total:
        parts.append("--- stderr ---\n" + err.text("stderr"))
    if not out.total and not err.total:
        parts.append("(no output)")
    return "\n".join(parts)


async def _stop_group(group: int) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after :data:`KILL_GRACE` seconds."""
    if not _signal(group, signal.SIGTERM):
        return
    with anyio.move_on_after(KILL_GRACE):
        while _alive(group):  # noqa: ASYNC110 - nothing signals a group's end: poll it
            await anyio.sleep(0.02)
        return
    _signal(group, signal.SIGKILL)


def _signal(group: int, sig: int) -> bool:
    """Send ``sig`` to the group; return False when the group no longer exists."""
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a member changed user: it still exists, and SIGKILL will be tried
    return True


def _alive(group: int) -> bool:
    """Return whether a live (not zombie) process is in the group."""
    if not _signal(group, 0):
        return False
    members = _linux_members(group)
    return members is None or bool(members)


def _linux_members(group: int) -> list[int] | None:
    """Return the non-zombie pids of the group from ``/proc``, or None where there is no ``/proc``.

    A zombie still answers signals, and orphans are reaped by PID 1, which in a container may
    never do it; counting them as alive would wait out the grace period for nothing.
    """
    try:
        names = os.listdir("/proc")  # noqa: PTH208 - hundreds of names, no Path objects needed
    except OSError:
        return None
    found = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:  # noqa: PTH123 - many tiny reads
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == group and fields[0] not in (b"Z", b"X"):  # noqa: PLR2004
            found.append(int(name))
    return found

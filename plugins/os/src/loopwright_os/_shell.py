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

from loopwright import ToolContext, tool
from loopwright.errors import ToolCallDenied, ToolError

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream

    from loopwright import Capabilities

__all__ = ["DEFAULT_TIMEOUT", "KILL_GRACE", "OUTPUT_HEAD", "OUTPUT_TAIL", "execute_terminal_command"]

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


def _offered(grants: Capabilities) -> bool:
    return grants.shell != "none"


def _hold(arguments: Mapping[str, Any], context: ToolContext) -> str | None:
    """Hold the call at the loop's gate under ``loopApproval``, and under ``approval`` without an approver."""
    mode = context.grants.shell
    if mode == "loopApproval" or (mode == "approval" and context.shell_approver is None):
        return f"run shell command: {arguments.get('command')}"
    return None


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
    mode = context.grants.shell
    if mode == "none":
        raise ToolError("shell access is not granted to this agent")
    if timeout is not None and timeout <= 0:
        raise ToolError("timeout must be a positive number of seconds")
    if mode == "approval" and context.shell_approver is not None:
        await _ask(context.shell_approver, command, context)
    budget = context.timeout - _RESERVE if context.timeout > 2 * _RESERVE else context.timeout / 2
    limit = min(timeout or DEFAULT_TIMEOUT, budget)
    workdir = _workdir(context)
    scratch = None
    if workdir is None:
        scratch = workdir = Path(tempfile.mkdtemp(prefix="loopwright-shell-"))
    try:
        return await _run(command, workdir, limit)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


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


async def _drain(stream: ByteReceiveStream | None, capture: _Capture) -> None:
    if stream is None:
        return
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        async for chunk in stream:
            capture.add(chunk)


async def _run(command: str, workdir: Path, limit: float) -> str:
    """Run ``command``; return the report, or raise ToolError (with the output) when it timed out."""
    process = await anyio.open_process(command, cwd=workdir, stdin=subprocess.DEVNULL, start_new_session=True)
    group = process.pid  # the session leader's pid is its process group id
    out, err = _Capture(), _Capture()
    timed_out = stopped = False
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_drain, process.stdout, out)
            tg.start_soon(_drain, process.stderr, err)
            with anyio.move_on_after(limit) as scope:
                await process.wait()
            timed_out = scope.cancelled_caught
            await _stop_group(group)
            stopped = True
            await process.wait()
            # A process that left the group (setsid) may still hold the pipes: stop reading soon.
            tg.cancel_scope.deadline = anyio.current_time() + KILL_GRACE
    finally:
        with anyio.CancelScope(shield=True):  # also when the run is cancelled or the loop timed out
            if not stopped:
                await _stop_group(group)
            await process.aclose()
    report = _report(process.returncode, out, err)
    if timed_out:
        raise ToolError(f"timed out after {limit:g} s: the command and every process it started were "
                        f"stopped\n{report}")
    return report


def _report(returncode: int | None, out: _Capture, err: _Capture) -> str:
    if returncode is None:
        status = "exit code: unknown"
    elif returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        status = f"exit code: {returncode} (killed by {name})"
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

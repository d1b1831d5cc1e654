"""Following a run: its events to a progress display until it rests, and Ctrl-C that cancels it cleanly.

:func:`follow` consumes :meth:`AgentRun.events` until the instance rests and hands each event
to a progress display (:mod:`loopwright.cli._displays`: live on a terminal, plain when piped,
silent under ``--json``; the display names are exported from here too).
:func:`terminal_approver` asks at the terminal about shell commands under an ``approval``
grant, pausing the live display while the question is on screen.

Everything shown that came from a model or a tool (call names, arguments, results, reasons, the
model's words, streamed text, the command in the shell-approval question) goes through
:func:`loopwright.display.safe_text` or :func:`~loopwright.display.safe_json` first, so that a
control character or an ANSI escape in it shows as a visible escape instead of acting on the
terminal: what the person approves is what runs.

The first SIGINT cancels the run: the instance is saved ``stopped`` with ``cancelled: true``
and the partial turn kept, at once (a sync tool's thread is abandoned, not waited for). A
second one gives the cancel up to :data:`_CANCEL_GRACE` seconds to be saved, then exits 130,
leaving an instance whose cancel was not saved ``running`` for ``loopwright resume``. Once a
cancelled run has rested, a further SIGINT while the process ends exits 130 at once, quietly.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio

from loopwright.cli._displays import LiveProgress, PlainProgress, Progress, make_progress
from loopwright.display import safe_text

if TYPE_CHECKING:
    from loopwright._runtime import AgentRun
    from loopwright._types import AgentResult

__all__ = ["LiveProgress", "PlainProgress", "Progress", "follow", "make_progress", "terminal_approver"]

#: Seconds a second Ctrl-C waits for the cancel of the first to be saved before it quits anyway.
_CANCEL_GRACE = 2.0


async def follow(run: AgentRun, progress: Progress, *, stalled: Callable[[], bool] | None = None,
                 ) -> tuple[AgentResult, bool]:
    """Show ``run``'s events, and those of the agents it starts, until its instance rests; Ctrl-C cancels it.

    Call it right after the run was started or continued, before anything else awaits: the
    loop publishes some events only while somebody follows the run, so the subscription must
    happen before the run's task gets to execute. Nothing here awaits before it.

    :param stalled: Looked at a few times a second: once it returns true (the tree waits for
        approvals only), following stops and the result is the run's as it stands (``running``).
    :return: The result, and whether the user interrupted.
    """
    interrupted = False

    async def watch(signals: AsyncIterator[int]) -> None:
        nonlocal interrupted
        async for _ in signals:
            if interrupted:
                # The cancel is saved within moments (nothing waits for a tool's thread): let it
                # finish, so a quick double Ctrl-C still leaves the instance stopped, not running.
                with anyio.move_on_after(_CANCEL_GRACE):
                    await run.wait()
                if run.running:
                    _exit_now(run.instance_id)
                continue
            interrupted = True
            progress.note("cancelling (Ctrl-C again to quit at once) ...")
            tg.start_soon(run.cancel)

    global _current  # noqa: PLW0603 - the terminal approver needs the display that is on screen
    _current = progress
    try:
        with progress, _interrupts() as signals:
            async with anyio.create_task_group() as tg:
                if signals is not None:
                    tg.start_soon(watch, signals)
                with anyio.CancelScope() as following:
                    if stalled is not None:
                        tg.start_soon(_watch_stall, stalled, following)
                    async for event in run.events(subtree=True):
                        progress.event(event)
                    result = await run.wait()
                if following.cancelled_caught:
                    result = run.inst.result()
                tg.cancel_scope.cancel()
    finally:
        _current = None
        if interrupted:
            _quit_on_interrupt()
    return result, interrupted


async def _watch_stall(stalled: Callable[[], bool], scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once ``stalled()`` holds on two looks in a row (the tree waits for its operator)."""
    seen = 0
    while seen < 2:  # noqa: PLR2004 - twice: a decision taken in between resets it
        await anyio.sleep(_STALL_POLL)
        seen = seen + 1 if stalled() else 0
    scope.cancel()


_STALL_POLL = 0.1
#: Event-loop steps the terminal question yields before it is asked (see terminal_approver).
_EVENT_HOPS = 8
_current: Progress | None = None
_prompt_lock: anyio.Lock | None = None


async def terminal_approver(command: str, context: Any) -> bool | str:
    r"""Ask at the terminal whether to run a shell command (``shell: approval`` grants).

    The live display pauses while the question is on screen. Parallel calls ask one at a time.
    The command is shown through :func:`loopwright.display.safe_text`: a carriage return, an
    ANSI escape or a line break in it is shown as ``\r``, ``\x1b``, ``\n``, so the line on
    screen is the command that runs. Returns ``True`` for yes, otherwise the reason the model sees.
    Ctrl-C at the question cancels the run as anywhere else, at once: the thread reading the
    terminal is abandoned, not waited for.
    """
    global _prompt_lock  # noqa: PLW0603 - one prompt at a time in this process
    if _prompt_lock is None:
        _prompt_lock = anyio.Lock()
    async with _prompt_lock:
        # Let the follower show the events already published (the call's own line above all):
        # they travel through a task or two of the subtree's event streams, each one step of
        # the event loop, and the question below is written from a thread at once.
        for _ in range(_EVENT_HOPS):
            await anyio.lowlevel.checkpoint()
        display = _current
        if isinstance(display, LiveProgress):
            display.pause()
        try:
            who = safe_text(getattr(context, "instance_id", "?"))
            question = f"\ninstance {who} wants to run:\n  {safe_text(command)}\nRun this command? [y/N] "
            # A daemon thread, abandoned when the run is cancelled (Ctrl-C at the question): a
            # thread blocked reading the terminal cannot be stopped, and an anyio worker thread
            # would be joined at exit, keeping the CLI until Enter. Imported here, where the loop
            # (which imports it anyway) is running, so that this module stays cheap to import.
            from loopwright._tools import run_in_daemon_thread  # noqa: PLC0415

            answer = await run_in_daemon_thread(functools.partial(_ask_terminal, question))
        finally:
            if isinstance(display, LiveProgress):
                display.resume()
    if answer.strip().lower() in ("y", "yes"):
        return True
    return "refused at the terminal"


def _ask_terminal(question: str) -> str:
    sys.stderr.write(question)
    sys.stderr.flush()
    try:
        return sys.stdin.readline()
    except (OSError, ValueError):
        return ""


@contextlib.contextmanager
def _interrupts() -> Iterator[AsyncIterator[int] | None]:
    """Receive SIGINT as a stream while inside. Entering does not await.

    Gives ``None`` where that is impossible (Windows, a thread): Ctrl-C raises KeyboardInterrupt then.
    """
    try:
        receiver = anyio.open_signal_receiver(signal.SIGINT)
        signals = receiver.__enter__()
    except (NotImplementedError, RuntimeError, ValueError):
        yield None
        return
    try:
        yield signals
    finally:
        receiver.__exit__(None, None, None)


def _quit_on_interrupt() -> None:
    """From now on, SIGINT exits 130 at once and quietly (the run it cancelled has rested and is saved).

    Without this, a Ctrl-C pressed again while the process ends would raise KeyboardInterrupt
    wherever the main thread is (a traceback), or kill it by the signal once the interpreter
    finalizes.
    """
    def handler(signum: int, frame: Any) -> None:
        del signum, frame
        with contextlib.suppress(Exception):  # a flush interrupted mid-write is reentrant
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(130)

    with contextlib.suppress(ValueError):  # not the main thread: Ctrl-C stays as it is
        signal.signal(signal.SIGINT, handler)


def _exit_now(instance_id: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(f"\ninterrupted; instance {instance_id} may still be marked running: "
                     f"continue it with: loopwright resume {instance_id}\n")
    sys.stderr.flush()
    os._exit(130)

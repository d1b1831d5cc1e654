r"""The progress displays of a followed run: what is shown on stderr while an instance runs.

:func:`make_progress` picks one for the process, and :func:`loopwright.cli._progress.follow`
hands it each event:

* :class:`LiveProgress` when stdout and stderr are terminals: a rich spinner line with the turn,
  tool calls, tokens and cost, and one line per tool call above it (on stderr, so the answer
  alone goes to stdout);
* :class:`PlainProgress` otherwise: one plain line per tool call and result on stderr, with no
  ANSI escapes and no spinner;
* :class:`Progress` (silent) under ``--json``.

Everything shown that came from a model or a tool (call names, arguments, results, reasons, the
model's words, streamed text) goes through :func:`loopwright.display.safe_text` or
:func:`~loopwright.display.safe_json` first, so that a control character or an ANSI escape in it
shows as a visible escape (``ESC`` as ``\x1b``) instead of acting on the terminal. :mod:`rich`
is imported only by :class:`LiveProgress`, when a terminal shows it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TextIO

from loopwright.cli._output import format_cost, is_terminal
from loopwright.display import safe_json, safe_text

if TYPE_CHECKING:
    from types import TracebackType

    from loopwright._types import Event
    from loopwright.cli._settings import CliSettings

__all__ = ["LiveProgress", "PlainProgress", "Progress", "make_progress"]

_ARGS_WIDTH = 120
_TEXT_WIDTH = 200


def _short(text: str, width: int) -> str:
    """Return ``text`` on one line (runs of white space as one space), cut to ``width``, safe to show."""
    text = safe_text(" ".join(text.split()))
    return text if len(text) <= width else text[: width - 3] + "..."


def _args(arguments: Mapping[str, Any] | None) -> str:
    return _short(safe_json(dict(arguments or {})), _ARGS_WIDTH)


def _detail(status: str, content: Any) -> str:
    """Return a failed result's content to show after its status, without the status said twice.

    The loop writes denied and blocked results as ``denied: REASON``; shown as ``-> denied: ...``
    the prefix is dropped.
    """
    text = str(content or "")
    prefix = f"{status}: "
    return _short(text.removeprefix(prefix) if text.startswith(prefix) else text, _TEXT_WIDTH)


class Progress:
    """A silent progress display; subclasses show events. Used as a context manager.

    Attributes:
        turn: The latest turn number seen.
        tool_calls: Tool calls started in this segment.
        tokens: Tokens the instance used, from :meth:`start_from` on.
        cost: What the instance cost, from :meth:`start_from` on; ``None`` once any price is unknown.
        agents: The agents below the followed one seen so far: ``{instance id: (name, state)}``.
    """

    def __init__(self) -> None:
        """Start with zero counters."""
        self.turn = 0
        self.tool_calls = 0
        self.tokens = 0
        self.cost: float | None = 0.0
        self._said: tuple[int | None, str] | None = None
        #: The turn being streamed and its text so far.
        self.streamed: tuple[int | None, str] = (None, "")
        self.agents: dict[str, tuple[str, str]] = {}

    #: Whether this display prints streamed text as it arrives.
    shows_deltas = False

    def start_from(self, turn: int, tokens: int, cost: float | None) -> None:
        """Count on from an instance's totals (a continued instance does not start at 0 tokens)."""
        self.turn, self.tokens, self.cost = turn, tokens, cost

    def show_delta(self, text: str) -> None:
        """Show a piece of streamed text (nothing here)."""

    def show_reset(self) -> None:
        """Say that the streamed answer starts over (nothing here)."""

    def end_delta_line(self) -> None:
        """End the line of streamed text before tool calls are shown (nothing here)."""

    def streamed_answer(self) -> str | None:
        """Return the text streamed to the screen in the last streamed turn, if this display shows deltas."""
        return self.streamed[1] if self.shows_deltas and self.streamed[0] is not None else None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        return None

    def event(self, event: Event) -> None:  # noqa: C901 - one branch per event kind
        """Take one event: update the counters, then show it.

        An event of an agent below the followed one (``depth`` above 0) adds to the tokens and
        the cost, and its tool calls, results, approvals and states are shown as that agent's.
        """
        data = event.data
        depth = int(data.get("depth") or 0)
        if depth:
            self._agent_event(event, depth)
            return
        if event.turn is not None:
            self.turn = max(self.turn, event.turn)
        if event.kind == "usage":
            usage = data.get("usage") or {}
            self.tokens += int(usage.get("totalTokens") or
                               (usage.get("inputTokens") or 0) + (usage.get("outputTokens") or 0))
            amount = data.get("cost")
            self.cost = None if self.cost is None or amount is None else self.cost + float(amount)
        elif event.kind == "text_delta":
            self.streamed = (event.turn, (self.streamed[1] if self.streamed[0] == event.turn else "")
                             + str(data.get("delta") or ""))
            self.show_delta(str(data.get("delta") or ""))
            return
        elif event.kind == "stream_reset":
            self.streamed = (event.turn, "")
            self.show_reset()
            return
        elif event.kind == "text":
            if self.streamed[0] == event.turn and self.shows_deltas:
                return  # already on the screen
            # Shown only if the turn goes on with tool calls: the last text is the answer,
            # printed in full at the end.
            self._said = (event.turn, str(data.get("text") or ""))
            return
        elif event.kind == "tool_call":
            self.tool_calls += 1
            if self.shows_deltas and self.streamed[0] == event.turn and self.streamed[1]:
                self.end_delta_line()
            if self._said is not None and self._said[0] == event.turn and self._said[1]:
                self.show_text(event.turn, self._said[1])
            self._said = None
        self.show(event)

    def _agent_event(self, event: Event, depth: int) -> None:
        data = event.data
        if event.kind == "usage":
            usage = data.get("usage") or {}
            self.tokens += int(usage.get("totalTokens") or 0)
            amount = data.get("cost")
            self.cost = None if self.cost is None or amount is None else self.cost + float(amount)
        elif event.kind == "state":
            self.agents[event.instance_id] = (str(data.get("agent") or ""), str(data.get("state") or ""))
        if event.kind in {"tool_call", "tool_result", "approval", "state"}:
            self.show_agent(event, depth)

    def show(self, event: Event) -> None:
        """Show an event (nothing here)."""

    def show_agent(self, event: Event, depth: int) -> None:
        """Show an event of an agent ``depth`` levels below the followed one (nothing here)."""

    def running_agents(self) -> int:
        """How many agents below the followed one are running, as their last state events said."""
        return sum(1 for _name, state in self.agents.values() if state == "running")

    def show_text(self, turn: int | None, text: str) -> None:
        """Show what the model said before calling tools (nothing here)."""

    def note(self, text: str) -> None:
        """Show a message from the CLI itself (nothing here)."""


class PlainProgress(Progress):
    """One plain line per tool call, result and approval request, on a text stream (stderr)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        """Write to ``stream`` (default: stderr)."""
        super().__init__()
        self._stream = stream or sys.stderr

    def _line(self, text: str) -> None:
        self._stream.write(text + "\n")
        self._stream.flush()

    def show(self, event: Event) -> None:
        """Write a line for ``tool_call``, ``tool_result`` and ``approval`` events."""
        data = event.data
        at = f"turn {event.turn}: " if event.turn is not None else ""
        name = safe_text(data.get("name"))
        if event.kind == "tool_call":
            self._line(f"{at}{name} {_args(data.get('arguments'))}")
        elif event.kind == "tool_result":
            status = safe_text(data.get("status"))
            detail = "" if status == "success" else f": {_detail(status, data.get('content'))}"
            self._line(f"{at}{name} -> {status}{detail}")
        elif event.kind == "approval":
            self._line(f"{at}{safe_text(data.get('tool'))} waits for approval: "
                       f"{safe_text(data.get('reason') or '')}".rstrip())

    def show_agent(self, event: Event, depth: int) -> None:
        """Write a line, indented by depth, for an agent's tool calls, results, approvals and states."""
        data = event.data
        who = f"{'  ' * depth}[{safe_text(data.get('agent'))} {safe_text(event.instance_id)}] "
        line = _agent_line(event)
        if line:
            self._line(who + line)

    def show_text(self, turn: int | None, text: str) -> None:
        """Write the model's words before its tool calls, shortened."""
        at = f"turn {turn}: " if turn is not None else ""
        self._line(f"{at}says: {_short(text, _TEXT_WIDTH)}")

    def note(self, text: str) -> None:
        """Write ``text`` as a line."""
        self._line(text)


class LiveProgress(Progress):
    """A rich live display on stderr: a spinner with the counters, tool calls printed above it."""

    shows_deltas = True

    def __init__(self) -> None:
        """Prepare the display; it starts on ``__enter__``."""
        super().__init__()
        self._live_on = False
        from rich.console import Console  # noqa: PLC0415 - rich only when a terminal shows it
        from rich.live import Live  # noqa: PLC0415 - rich only when a terminal shows it
        from rich.spinner import Spinner  # noqa: PLC0415 - rich only when a terminal shows it

        self._console = Console(stderr=True)
        self._spinner = Spinner("dots", text=self._status())
        self._live = Live(self._spinner, console=self._console, transient=True, refresh_per_second=10)

    def __enter__(self) -> Self:
        self._live.start()
        self._live_on = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        self.pause()

    def pause(self) -> None:
        """Stop the spinner (streamed text and prompts need the terminal to themselves)."""
        if self._live_on:
            self._live.stop()
            self._live_on = False

    def resume(self) -> None:
        """Start the spinner again, unless text is streaming."""
        if not self._live_on and self.streamed[0] is None:
            self._live.start()
            self._live_on = True

    def show_delta(self, text: str) -> None:
        """Print streamed text on stdout as it arrives, made safe to show; the spinner stops for the rest of the run."""
        self.pause()
        sys.stdout.write(safe_text(text, multiline=True))
        sys.stdout.flush()

    def show_reset(self) -> None:
        """Tell the reader the answer starts over (a retry or a fallback model)."""
        sys.stdout.write("\n")
        sys.stdout.flush()
        self._console.print("[yellow]the answer starts over (retry or fallback model)[/]", highlight=False)

    def end_delta_line(self) -> None:
        """End the streamed line before tool calls are printed."""
        sys.stdout.write("\n")
        sys.stdout.flush()

    def _status(self) -> str:
        calls = f"{self.tool_calls} tool call{'' if self.tool_calls == 1 else 's'}"
        running = self.running_agents()
        agents = f" · {running} agent{'' if running == 1 else 's'} running" if running else ""
        return (f"turn {self.turn or 1} · {calls} · {self.tokens:,} tokens · "
                f"cost {format_cost(self.cost)}{agents}")

    def start_from(self, turn: int, tokens: int, cost: float | None) -> None:
        """Count on from an instance's totals, and show them from the first frame."""
        super().start_from(turn, tokens, cost)
        self._spinner.update(text=self._status())

    def event(self, event: Event) -> None:
        """Take one event and refresh the spinner line."""
        super().event(event)
        self._spinner.update(text=self._status())

    def show(self, event: Event) -> None:
        """Print a line above the spinner for tool calls, results and approval requests."""
        from rich.markup import escape  # noqa: PLC0415 - rich only when a terminal shows it

        data = event.data
        name = escape(safe_text(data.get("name")))
        if event.kind == "tool_call":
            self._console.print(f"[cyan]→ {name}[/] [dim]{escape(_args(data.get('arguments')))}[/]",
                                highlight=False)
        elif event.kind == "tool_result":
            if data.get("status") == "success":
                self._console.print(f"  [green]✓ {name}[/]", highlight=False)
            else:
                detail = escape(_detail(safe_text(data.get("status")), data.get("content")))
                self._console.print(f"  [red]✗ {name} {escape(safe_text(data.get('status')))}[/]: {detail}",
                                    highlight=False)
        elif event.kind == "approval":
            self._console.print(f"[yellow]⏸ {escape(safe_text(data.get('tool')))} waits for approval[/]: "
                                f"{escape(safe_text(data.get('reason') or ''))}", highlight=False)

    def show_agent(self, event: Event, depth: int) -> None:
        """Print an agent's line above the spinner, indented by depth; the spinner counts running agents."""
        from rich.markup import escape  # noqa: PLC0415

        line = _agent_line(event)
        if line:
            who = f"{safe_text(event.data.get('agent'))} {safe_text(event.instance_id)}"
            self._console.print(f"{'  ' * depth}[magenta]└ {escape(who)}[/] {escape(line)}", highlight=False)
        self._spinner.update(text=self._status())

    def show_text(self, turn: int | None, text: str) -> None:  # noqa: ARG002 - the spinner shows the turn
        """Print the model's words before its tool calls, dimmed and shortened."""
        from rich.markup import escape  # noqa: PLC0415 - rich only when a terminal shows it

        self._console.print(f"[dim]{escape(_short(text, _TEXT_WIDTH))}[/]", highlight=False)

    def note(self, text: str) -> None:
        """Print ``text`` above the spinner."""
        from rich.markup import escape  # noqa: PLC0415 - rich only when a terminal shows it

        self._console.print(f"[yellow]{escape(safe_text(text, multiline=True))}[/]", highlight=False)


def _agent_line(event: Event) -> str:
    """Return the text shown for an event of an agent below the followed one ("" for none), made safe."""
    data = event.data
    if event.kind == "tool_call":
        return f"→ {safe_text(data.get('name'))} {_args(data.get('arguments'))}"
    if event.kind == "tool_result":
        return f"{safe_text(data.get('name'))} -> {safe_text(data.get('status'))}"
    if event.kind == "approval":
        return f"{safe_text(data.get('tool'))} waits for approval: {safe_text(data.get('reason') or '')}".rstrip()
    if event.kind == "state":
        return f"is {safe_text(data.get('state'))}"
    return ""


def make_progress(settings: CliSettings) -> Progress:
    """Return the display for this process: silent under ``--json``, live on a terminal, plain when piped."""
    if settings.json:
        return Progress()
    if is_terminal() and sys.stderr.isatty():
        return LiveProgress()
    return PlainProgress()

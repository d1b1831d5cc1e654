r"""What the CLI prints: results, status lines, instance tables, plugin lists, JSON.

Text goes through :func:`click.echo`. Tables use :mod:`rich` only when stdout is a terminal;
piped output is plain text without ANSI escapes, stable enough to ``grep`` and ``cut``. Results
go to stdout and diagnostics (status lines, errors, hints) to stderr, so ``loopwright run x.yaml
> answer.txt`` keeps only the answer.

Whatever came from a model or a tool (calls, arguments, ids, names, reasons, errors, and the
answer when stdout is a terminal) is shown through :func:`loopwright.display.safe_text`, and JSON
through :func:`loopwright.display.safe_json`: a control character, an ANSI escape or a bidi
override in it is shown as a visible escape (``ESC`` as ``\x1b``, ``CR`` as ``\r``) and never acts
on the screen. A piped answer is printed exactly as the model wrote it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from loopwright._convert import converter
from loopwright._states import State, StopReason
from loopwright._views import result_to_json
from loopwright.cli._exits import EXIT_APPROVAL, EXIT_CANCELLED, EXIT_ERROR, EXIT_OK
from loopwright.display import safe_json, safe_text

if TYPE_CHECKING:
    from loopwright._header import InstanceHeader
    from loopwright._types import AgentResult
    from loopwright.cli._settings import CliSettings

__all__ = [
    "echo_json",
    "exit_code",
    "format_cost",
    "format_tokens",
    "is_terminal",
    "print_instance",
    "print_instances",
    "print_plugins",
    "print_tree",
    "report",
    "status_line",
]


def is_terminal() -> bool:
    """Whether stdout is an interactive terminal (tables and live progress use rich then)."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout, with every hidden character escaped (the same value)."""
    click.echo(safe_json(data, indent=2))


def exit_code(result: AgentResult) -> int:
    """Return the exit code of a result: 0 rests, 3 waits for approval, 130 cancelled, 1 anything else.

    ``completed`` and ``waiting`` rest. Every error state is 1, and so is a run stopped for
    another reason than completion (a content filter).
    """
    if result.state is State.WAITING_FOR_APPROVAL:
        return EXIT_APPROVAL
    if result.state is State.STOPPED and result.cancelled:
        return EXIT_CANCELLED
    if result.state is State.WAITING:
        return EXIT_OK
    if result.state is State.STOPPED and result.stop_reason is StopReason.COMPLETED:
        return EXIT_OK
    return EXIT_ERROR


def format_cost(amount: float | None, currency: str = "USD") -> str:
    """``$0.0123``; ``unknown`` when a price is unknown (never shown as 0).

    Amounts under 0.0001 keep two significant digits in fixed notation (``$0.000006``,
    ``$0.0000012``), never an exponent.
    """
    if amount is None:
        return "unknown"
    text = f"{amount:,.4f}"
    if 0 < abs(amount) < 0.0001:  # noqa: PLR2004
        import math  # noqa: PLC0415 - only tiny amounts need it

        digits = 1 - math.floor(math.log10(abs(amount)))
        text = f"{amount:.{digits}f}".rstrip("0")
    return f"${text}" if currency == "USD" else f"{text} {currency}"


def format_tokens(usage: Mapping[str, Any] | None, unit: str = " tokens") -> str:
    """``1,234 tokens (1,000 in, 234 out)`` from a camelCase usage mapping.

    Calls that came back without token counts are named: ``... out; 2 calls not counted)``.
    """
    usage = usage or {}
    given_in, given_out = int(usage.get("inputTokens") or 0), int(usage.get("outputTokens") or 0)
    total = int(usage.get("totalTokens") or 0) or given_in + given_out
    unreported = int(usage.get("unreportedRequests") or 0)
    missing = f"; {unreported} call{'s' if unreported != 1 else ''} not counted" if unreported else ""
    return f"{total:,}{unit} ({given_in:,} in, {given_out:,} out{missing})"


def _when(stamp: Any) -> str:
    """``2026-11-30 00:18:48`` from an ISO 8601 stamp (UTC)."""
    text = str(stamp or "")
    seconds = len("2026-11-30T00:18:48")
    return text[:seconds].replace("T", " ") if len(text) >= seconds and text[10] == "T" else text


def _state_text(state: str | None, stop_reason: str | None, limit: str | None = None) -> str:
    text = state or "?"
    if stop_reason and stop_reason != state:
        named = f": {limit}" if limit and stop_reason == "limit_exceeded" else ""
        text += f" ({stop_reason}{named})"
    return text


def status_line(result: AgentResult, turns: int | None) -> str:
    """One line on where a run left its instance: id, state, stop reason, turns, tokens, cost."""
    state = _state_text(result.state.value, result.stop_reason.value if result.stop_reason else None,
                        result.limit)
    parts = [f"{result.instance_id}: {state}"]
    if turns is not None:
        parts.append(f"{turns} turn{'' if turns == 1 else 's'}")
    parts.append(format_tokens(converter.unstructure(result.usage)))
    parts.append(f"cost {format_cost(result.cost.amount, result.cost.currency)}")
    return ", ".join(parts)


def _arguments(arguments: Mapping[str, Any]) -> str:
    """Return a call's arguments as one line of JSON, safe to show."""
    return safe_json(dict(arguments))


def _print_pending(result: AgentResult) -> None:
    # Imported here: ls and show import this module and, reading a bare store, no value objects.
    from loopwright._types import approval_digest  # noqa: PLC0415

    waiting = [p for p in result.pending_approvals if p.decision is None]
    calls = f"{len(waiting)} call{'' if len(waiting) == 1 else 's'}"
    in_tree = any(p.instance_id not in {None, result.instance_id} for p in waiting)
    if result.state is State.WAITING_FOR_APPROVAL and not in_tree:
        click.echo(f"instance {result.instance_id} is waiting for approval of {calls}:")
    else:
        click.echo(f"instance {result.instance_id} is {result.state.value}, waiting on {len(waiting)} "
                   f"approval{'' if len(waiting) == 1 else 's'} in its tree:")
    for p in waiting:
        click.echo(f"  {safe_text(p.tool_call_id)}  {safe_text(p.tool)} {_arguments(p.arguments)}")
        click.echo(f"      digest {approval_digest(p)}")
        if p.instance_id not in {None, result.instance_id}:
            click.echo(f"      in {_path(p.path)}")
        if p.reason:
            click.echo(f"      {safe_text(p.reason)}")
    more = " [--call CALL_ID [--digest DIGEST]]" if len(waiting) > 1 and not in_tree else \
        " --call CALL_ID [--digest DIGEST]" if in_tree else ""
    click.echo(f"approve with: loopwright approve {result.instance_id}{more}")
    click.echo(f"deny with:    loopwright deny {result.instance_id}{more} --reason TEXT")
    if in_tree:
        click.echo(f"all at once:  loopwright approve {result.instance_id} --subtree")


def _path(path: Sequence[Mapping[str, Any]]) -> str:
    """``root 2026... > child 2026...``: a path from a root, made safe to show."""
    return " > ".join(f"{safe_text(step.get('name'))} {safe_text(step.get('instanceId'))}" for step in path)


def report(result: AgentResult, settings: CliSettings, *, turns: int | None,  # noqa: C901 - one branch per outcome
           cancel_command: bool = False) -> int:
    """Print a result as ``run`` does and return its exit code.

    With ``--json``: :func:`~loopwright._runtime.result_to_json` on stdout. Without: the final
    text (or the structured output, or the calls waiting for approval) on stdout and a
    :func:`status_line` on stderr. In both modes an error state prints ``error: ...`` on stderr
    (with, for an instance that failed before its first turn, a line saying that it is kept and
    how to retry it), and a cancelled run says how to continue it.

    :param cancel_command: For ``cancel``: no hint, and exit 0 (the command did what it was asked).
    """
    code = exit_code(result)
    if result.state is State.RUNNING and any(p.decision is None for p in result.pending_approvals):
        code = EXIT_APPROVAL  # running, but only waiting for calls held in its tree
    if settings.json:
        data = result_to_json(result)
        # Every usage key is present even when 0 (the converter drops defaults).
        data["usage"] = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0, **(data.get("usage") or {})}
        echo_json(data)
    else:
        if code == EXIT_APPROVAL:
            _print_pending(result)
        elif code == EXIT_OK:
            if result.text is not None and result.text == settings.streamed_text:
                click.echo()  # the answer is on the screen already: it streamed there
            elif result.text is not None:
                click.echo(safe_text(result.text, multiline=True) if is_terminal() else result.text)
            elif result.output is not None:
                echo_json(result.output)
        click.echo(safe_text(status_line(result, turns)), err=True)
    if code == EXIT_ERROR:
        reason = result.error or _state_text(result.state.value, result.stop_reason.value
                                             if result.stop_reason else None)
        click.echo(f"error: {safe_text(reason, multiline=True)}", err=True)
        if result.state is State.ERROR and turns == 0 and not cancel_command:
            click.echo(_before_first_turn(result.instance_id), err=True)
    if cancel_command:
        return EXIT_OK
    if code == EXIT_CANCELLED:
        click.echo(f"cancelled; resume with: loopwright message {result.instance_id} TEXT", err=True)
    return code


def _before_first_turn(instance_id: str) -> str:
    """Return what ``report`` adds for an instance that failed before its first turn: it is kept, and how to go on."""
    iid = safe_text(instance_id)
    return (f"the instance {iid} is saved in the error state, with its prompt and no turn: once the cause is "
            f"fixed, retry it with 'loopwright message {iid} TEXT', or start anew with 'loopwright run' "
            f"('loopwright delete {iid}' removes it; 'loopwright ls --state error' lists such instances)")


# ---------------------------------------------------------------------------------------------
# show and ls
# ---------------------------------------------------------------------------------------------


#: The rows of ``show`` that hold prose: their line breaks are kept.
_PROSE_ROWS = frozenset({"delegation prompt", "error", "pending approval", "pending in tree", "text", "tree"})


def _instance_rows(summary: Mapping[str, Any], header: InstanceHeader) -> list[tuple[str, str]]:
    """Return the ``show`` rows, each value made safe to show."""
    return [(key, safe_text(value, multiline=key in _PROSE_ROWS)) for key, value in _raw_rows(summary, header)]


def _raw_rows(summary: Mapping[str, Any], header: InstanceHeader) -> list[tuple[str, str]]:  # noqa: C901, PLR0912
    state = _state_text(summary.get("state"), summary.get("stopReason"), header.limit)
    tree = summary.get("tree") or {}
    below = int(tree.get("waitingOn") or 0) - len(tree.get("pendingApprovals") or [])
    if below > 0:
        state += f", waiting on {below} approval{'' if below == 1 else 's'} in its tree"
    rows = [
        ("instance", str(summary.get("instanceId"))),
        ("name", str(summary.get("name") or "")),
        ("state", state),
    ]
    if summary.get("cancelled"):
        rows.append(("cancelled", "true"))
    rows.append(("model", str(summary.get("model") or "")))
    if header.turns is not None:
        rows.append(("turns", str(header.turns)))
    rows += [
        ("tokens", format_tokens(summary.get("usage"), unit="")),
        ("cost", format_cost(summary.get("cost"))),
        ("subtree cost", format_cost(summary.get("subtreeCost"))),
    ]
    for key, label in (("spawnerInstanceId", "spawner"), ("callerInstanceId", "caller"),
                       ("callerToolCallId", "caller call"), ("delegationPrompt", "delegation prompt")):
        if summary.get(key):
            rows.append((label, str(summary[key])))
    for key, label in (("createdAt", "created"), ("updatedAt", "updated")):
        if summary.get(key):
            rows.append((label, f"{_when(summary[key])} UTC"))
    if summary.get("error"):
        rows.append(("error", str(summary["error"])))
    for p in summary.get("pendingApprovals") or []:
        if p.get("decision") is None:
            rows.append(("pending approval", f"{_held_call(p)}\ndigest {safe_text(p.get('digest'))}"))
    for p in summary.get("treePendingApprovals") or []:
        if p.get("instanceId") not in {None, summary.get("instanceId")}:
            where = f"digest {safe_text(p.get('digest'))}\nin {_path(p.get('path') or [])}"
            rows.append(("pending in tree", f"{_held_call(p)}\n{where}"))
    forked = header.forked_from
    if isinstance(forked, Mapping):
        rows.append(("forked from", f"{forked.get('instanceId')} at turn {forked.get('turn')}"))
    if tree.get("children"):
        rows.append(("tree", "\n".join(_tree_lines(tree))))
    elif summary.get("children"):
        for child in summary.get("children") or []:
            rows.append(("child", str(child.get("instanceId") if isinstance(child, Mapping) else child)))
    if header.text:
        rows.append(("text", str(header.text)))
    return rows


def _held_call(p: Mapping[str, Any]) -> str:
    """``CALL_ID TOOL {arguments}`` of a summary's pending approval, on one line, each part made safe to show."""
    return f"{safe_text(p.get('toolCallId'))} {safe_text(p.get('tool'))} {_arguments(p.get('arguments') or {})}"


def _tree_lines(node: Mapping[str, Any], prefix: str = "", last: bool = True, *, top: bool = True) -> list[str]:
    """Return the lines that draw ``node`` and its children, each value made safe to show (one line each)."""
    turns = int(node.get("turns") or 0)
    waiting = int(node.get("waitingOn") or 0)
    own = len(node.get("pendingApprovals") or [])
    parts = [f"{safe_text(node.get('name'))} {safe_text(node.get('instanceId'))}",
             safe_text(_state_text(node.get("state"), node.get("stopReason"))),
             f"{turns} turn{'' if turns == 1 else 's'}"]
    if own:
        parts.append(f"{own} pending approval{'' if own == 1 else 's'}")
    if waiting > own:
        parts.append(f"waiting on {waiting - own} below")
    parts.append(f"subtree cost {format_cost(node.get('subtreeCost'))}")
    branch = "" if top else ("└─ " if last else "├─ ")
    lines = [prefix + branch + ", ".join(parts)]
    children = node.get("children") or []
    inner = prefix if top else prefix + ("   " if last else "│  ")
    for i, child in enumerate(children):
        lines += _tree_lines(child, inner, i == len(children) - 1, top=False)
    return lines


def print_tree(node: Mapping[str, Any]) -> None:
    """Print one instance tree (``ls --tree``), one line per instance, every value made safe to show."""
    for line in _tree_lines(node):
        click.echo(line)


def print_instance(summary: Mapping[str, Any], header: InstanceHeader) -> None:
    """Print one instance as ``key  value`` lines (a rich table on a terminal).

    :param header: Its saved header, read as saved (``InstanceHeader.from_json(..., lenient=True)``).
    """
    rows = _instance_rows(summary, header)
    if is_terminal():
        from rich import box  # noqa: PLC0415 - rich only for terminals
        from rich.console import Console  # noqa: PLC0415 - rich only for terminals
        from rich.table import Table  # noqa: PLC0415 - rich only for terminals
        from rich.text import Text  # noqa: PLC0415 - rich only for terminals

        table = Table(show_header=False, box=box.SIMPLE)
        table.add_column(style="bold")
        table.add_column(overflow="fold")
        for key, value in rows:
            table.add_row(key, Text(value))  # Text: a value's [brackets] are not rich markup
        Console().print(table)
        return
    width = max(len(k) for k, _v in rows)
    for key, value in rows:
        lines = value.splitlines() or [""]
        click.echo(f"{key:<{width}}  {lines[0]}")
        for line in lines[1:]:
            click.echo(f"{'':<{width}}  {line}")


_LS_COLUMNS = ("ID", "NAME", "STATE", "TOKENS", "COST", "UPDATED (UTC)")


def print_instances(summaries: Sequence[Mapping[str, Any]]) -> None:
    """Print instances as a table: plain aligned columns, or a rich table on a terminal."""
    rows: list[tuple[str, ...]] = []
    for s in summaries:
        usage = s.get("usage") or {}
        total = usage.get("totalTokens") or (usage.get("inputTokens") or 0) + (usage.get("outputTokens") or 0)
        state = _state_text(s.get("state"), s.get("stopReason"))
        if s.get("cancelled") and s.get("stopReason") != "cancelled":
            state += ", cancelled"
        if s.get("queued"):
            state += " (queued)"
        row: tuple[str, ...] = (str(s.get("instanceId")), str(s.get("name") or ""), state, f"{int(total):,}",
                                format_cost(s.get("cost")), _when(s.get("updatedAt")))
        rows.append(tuple(safe_text(value) for value in row))
    if not rows:
        click.echo("no instances", err=True)
        return
    if is_terminal():
        from rich import box  # noqa: PLC0415 - rich only for terminals
        from rich.console import Console  # noqa: PLC0415 - rich only for terminals
        from rich.table import Table  # noqa: PLC0415 - rich only for terminals
        from rich.text import Text  # noqa: PLC0415 - rich only for terminals

        table = Table(box=box.SIMPLE_HEAD)
        for name in _LS_COLUMNS:
            table.add_column(name, justify="right" if name in {"TOKENS", "COST"} else "left",
                             no_wrap=name != "NAME", overflow="ellipsis")
        for row in rows:
            table.add_row(*(Text(value) for value in row))  # no rich markup from a name
        Console().print(table)
        return
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_LS_COLUMNS)]
    for row in [_LS_COLUMNS, *rows]:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


# ---------------------------------------------------------------------------------------------
# plugins
# ---------------------------------------------------------------------------------------------

_REGISTERED_LABELS = (
    ("providers", "providers"), ("tools", "tools"), ("stores", "stores"), ("engines", "engines"),
    ("contextStrategies", "context strategies"), ("recordSinks", "record sinks"), ("commands", "commands"),
)


def print_plugins(plugins: Sequence[Mapping[str, Any]]) -> None:
    """Print each plugin, in load order, with its source, what it registered and its hooks."""
    for plugin in plugins:
        source = plugin.get("source") or ""
        where = f" ({source}: {plugin['value']})" if plugin.get("value") else f" ({source})" if source else ""
        click.echo(f"{plugin['name']}{where}")
        registered = plugin.get("registered") or {}
        said = False
        for key, label in _REGISTERED_LABELS:
            names = registered.get(key) or []
            if names:
                click.echo(f"  {label}: {', '.join(names)}")
                said = True
        if plugin.get("hooks"):
            click.echo(f"  hooks: {', '.join(plugin['hooks'])}")
            said = True
        if not said:
            click.echo("  (registers nothing)")

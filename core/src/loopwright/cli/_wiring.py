"""The click wiring of ``loopwright``: the group and its built-in commands, with their arguments and options.

Each command checks the combinations of options click cannot (``--stream`` with ``--detach``,
``--call`` with ``--subtree`` ...; a usage error, exit 2) and hands its values to
:mod:`loopwright.cli._commands` by name, importing that module only then: the work opens a
runtime and runs under ``anyio.run``. What every command shares (the settings, ``--json`` and
``-c``, the group class that finds plugin commands) is :mod:`loopwright.cli._settings`; the
option types of its own (``-i KEY=VALUE``, durations) are :mod:`loopwright.cli._params`.

This module imports click and the standard library only, so that ``loopwright --help`` (and
each command's ``--help``) imports no runtime, no YAML machinery and no plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from loopwright.cli._params import Duration, parse_inputs
from loopwright.cli._settings import CliSettings, LoopwrightGroup, common_params, pass_settings

__all__ = ["cli"]

_STATES = ("running", "waiting", "waiting_for_approval", "stopped", "error")
_FILE_KINDS = ("definition", "assembly", "instance", "record")


@click.group(cls=LoopwrightGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog="Plugins may add commands: 'loopwright plugins' lists them. "
                    "Exit codes: 0 rests (completed, waiting), 3 waiting for approval, 1 error, "
                    "2 bad input, 130 cancelled.")
@click.version_option(package_name="loopwright-core", prog_name="loopwright", message="%(prog)s %(version)s")
def cli() -> None:
    """Run agents from YAML definitions, and steer the instances they leave in the store.

    --json and -c/--config go before or after the command name.
    """


cli.params.extend(common_params())


def _command(name: str) -> Callable[[Callable[..., Any]], click.Command]:
    """Like ``cli.command(name)``, adding ``--json`` and ``-c/--config``."""
    def decorate(fn: Callable[..., Any]) -> click.Command:
        command = cli.command(name)(fn)
        command.params.extend(common_params())
        return command
    return decorate


def _invoke(name: str, settings: CliSettings, *args: Any) -> int:
    """Run ``_commands.<name>(settings, *args)``; the runtime is imported only now."""
    from loopwright.cli import _commands  # noqa: PLC0415 - keeps 'loopwright --help' cheap

    return int(getattr(_commands, name)(settings, *args))


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


@_command("run")
@click.argument("definition")
@click.option("-p", "--prompt", help="The task prompt, sent after the definition's initial prompts.")
@click.option("-i", "--input", "inputs", multiple=True, metavar="KEY=VALUE",
              help="An input value (repeatable). VALUE is read as JSON for inputs that are not strings "
                   '(3, true, {"a": 1}); KEY=@FILE reads the value from a file.')
@click.option("--stream", is_flag=True, help="Ask the provider to stream its answers.")
@click.option("--detach", is_flag=True,
              help="Write the work to the store for a worker (loopwright worker), print the id and exit 0 at once.")
@click.option("--thread", "thread_id", metavar="ID",
              help="A conversation you name: the first run starts instance ID with the prompt, later ones send "
                   "the prompt to it as a message (the model sees everything said before).")
@pass_settings
def run_command(settings: CliSettings, definition: str, prompt: str | None, inputs: tuple[str, ...],  # noqa: PLR0917 - click
                stream: bool, detach: bool, thread_id: str | None) -> int:
    """Start an instance of DEFINITION and follow it until it rests.

    DEFINITION is a definition file or a name from the assembly's agentDefinitions. Prints the
    final text (or the calls waiting for approval) and a status line on stderr. With --detach
    (or 'loopwright submit'), the instance is queued for a worker and its id printed at once.
    With --thread ID, the run is a turn of the conversation ID ('loopwright delete ID' ends it).
    """
    _no_stream(stream, detach)
    if thread_id is not None and not prompt:
        raise click.UsageError("--thread sends the prompt to the conversation: give -p TEXT too")
    return _invoke("run", settings, definition, prompt, parse_inputs(inputs), stream, detach, thread_id)


@_command("submit")
@click.argument("definition")
@click.option("-p", "--prompt", help="The task prompt, sent after the definition's initial prompts.")
@click.option("-i", "--input", "inputs", multiple=True, metavar="KEY=VALUE",
              help="An input value (repeatable), as for run.")
@pass_settings
def submit_command(settings: CliSettings, definition: str, prompt: str | None, inputs: tuple[str, ...]) -> int:
    """Queue an instance of DEFINITION for a worker and print its id: 'run --detach'.

    Nothing runs here: a 'loopwright worker' sharing the store (or the assembly's engine)
    starts it. Exits 0 once the instance is saved; 'loopwright show ID' follows it.
    """
    stream, detach = False, True
    return _invoke("run", settings, definition, prompt, parse_inputs(inputs), stream, detach)


def _one_call(call_id: str | None, subtree: bool, digest: str | None) -> None:
    if subtree and call_id is not None:
        raise click.UsageError("give --call or --subtree, not both")
    if digest is not None and call_id is None:
        raise click.UsageError("--digest names one call's digest: give its --call CALL_ID too")


def _no_stream(stream: bool, detach: bool) -> None:
    if stream and detach:
        raise click.UsageError("--detach runs nothing here, so --stream does not apply: give one of them")


@_command("approve")
@click.argument("instance_id", metavar="ID")
@click.option("--call", "call_id", metavar="CALL_ID",
              help="Approve only this call, held by ID or by any agent below it (default: every call ID holds).")
@click.option("--subtree", is_flag=True, help="Approve every call held in ID's tree, and print each.")
@click.option("--digest", metavar="DIGEST",
              help="With --call: approve only if the call is still the one with this digest (as shown, or in "
                   "pendingApprovals of --json); another call is refused, exit 2, and nothing runs.")
@click.option("--stream", is_flag=True, help="Ask the provider to stream its answers.")
@click.option("--detach", is_flag=True,
              help="Write the work to the store for a worker (loopwright worker), print the id and exit 0 at once.")
@pass_settings
def approve_command(settings: CliSettings, instance_id: str, call_id: str | None, subtree: bool,  # noqa: PLR0917 - click
                    digest: str | None, stream: bool, detach: bool) -> int:
    """Approve held tool calls of instance ID or its tree, then follow ID until it rests.

    The instance holding the call goes on, and so do the agents above it waiting for it. A
    call that is no longer waiting is an error (exit 2). With --detach, only the decision is
    saved: a worker continues the instance.
    """
    _one_call(call_id, subtree, digest)
    _no_stream(stream, detach)
    return _invoke("approve", settings, instance_id, call_id, subtree, stream, detach, digest)


@_command("deny")
@click.argument("instance_id", metavar="ID")
@click.option("--call", "call_id", metavar="CALL_ID",
              help="Deny only this call, held by ID or by any agent below it (default: every call ID holds).")
@click.option("--subtree", is_flag=True, help="Deny every call held in ID's tree, and print each.")
@click.option("--digest", metavar="DIGEST",
              help="With --call: deny only if the call is still the one with this digest (as shown, or in "
                   "pendingApprovals of --json); another call is refused, exit 2, and nothing runs.")
@click.option("--reason", help="Why; the model reads it in the call's 'denied' result.")
@click.option("--stream", is_flag=True, help="Ask the provider to stream its answers.")
@click.option("--detach", is_flag=True,
              help="Write the work to the store for a worker (loopwright worker), print the id and exit 0 at once.")
@pass_settings
def deny_command(settings: CliSettings, instance_id: str, call_id: str | None, subtree: bool,  # noqa: PLR0917 - click
                 digest: str | None, reason: str | None, stream: bool, detach: bool) -> int:
    """Deny held tool calls of instance ID or its tree, then follow ID until it rests (--detach: a worker goes on)."""
    _one_call(call_id, subtree, digest)
    _no_stream(stream, detach)
    return _invoke("deny", settings, instance_id, call_id, reason, subtree, stream, detach, digest)


@_command("message")
@click.argument("instance_id", metavar="ID")
@click.argument("text")
@click.option("--stream", is_flag=True, help="Ask the provider to stream its answers.")
@click.option("--detach", is_flag=True,
              help="Write the work to the store for a worker (loopwright worker), print the id and exit 0 at once.")
@pass_settings
def message_command(settings: CliSettings, instance_id: str, text: str, stream: bool, detach: bool) -> int:
    """Send TEXT to instance ID and follow it until it rests.

    A message to an instance waiting on ask_user is the answer. While calls wait for approval,
    the message is queued and read once they are decided. With --detach, the message is only
    posted: a worker (or the instance's runner) reads it.
    """
    _no_stream(stream, detach)
    return _invoke("message", settings, instance_id, text, stream, detach)


@_command("resume")
@click.argument("instance_id", metavar="ID")
@click.option("--stream", is_flag=True, help="Ask the provider to stream its answers.")
@click.option("--detach", is_flag=True,
              help="Write the work to the store for a worker (loopwright worker), print the id and exit 0 at once.")
@pass_settings
def resume_command(settings: CliSettings, instance_id: str, stream: bool, detach: bool) -> int:
    """Continue instance ID after a crash left it running, and follow it until it rests.

    A resting instance is left as it is and its result printed; send it a message to go on.
    With --detach, the instance is handed to the engine for a worker to continue.
    """
    _no_stream(stream, detach)
    return _invoke("resume", settings, instance_id, stream, detach)


@_command("fork")
@click.argument("instance_id", metavar="ID")
@click.option("--at", "at_turn", type=click.IntRange(min=0), metavar="TURN",
              help="Fork at the end of this turn.  [default: the history as it stands]")
@pass_settings
def fork_command(settings: CliSettings, instance_id: str, at_turn: int | None) -> int:
    """Create a new instance whose history is ID's up to the end of a turn; print its id.

    The new instance keeps ID's grants and gates (never wider), records forkedFrom, copies no
    agent ID started, and rests, ready for a message. ID is not changed. A turn whose calls
    still wait (for approval or an answer) cannot be forked at (exit 2).
    """
    return _invoke("fork", settings, instance_id, at_turn)


@_command("rewind")
@click.argument("instance_id", metavar="ID")
@click.option("--to", "to_turn", type=click.IntRange(min=0), metavar="TURN", required=True,
              help="The turn to go back to the end of.")
@pass_settings
def rewind_command(settings: CliSettings, instance_id: str, to_turn: int) -> int:
    """Move resting instance ID back to the end of turn TURN; it rests, ready for a message.

    The log stays append-only: a rewind entry marks the point, and what came after stays in the
    records. A held turn, or an instance waiting for approval, is refused (exit 2).
    """
    return _invoke("rewind", settings, instance_id, to_turn)


@_command("cancel")
@click.argument("instance_id", metavar="ID")
@pass_settings
def cancel_command(settings: CliSettings, instance_id: str) -> int:
    """Cancel instance ID: it becomes stopped, with cancelled true. Exits 0 once done."""
    return _invoke("cancel", settings, instance_id)


@_command("show")
@click.argument("instance_id", metavar="ID")
@pass_settings
def show_command(settings: CliSettings, instance_id: str) -> int:
    """Show the state, usage, cost and pending approvals of instance ID, and its tree.

    Calls held anywhere below ID are listed with the path to their holder; the tree shows each
    agent's name, state, turns, pending approvals and subtree cost.
    """
    return _invoke("show", settings, instance_id)


@_command("ls")
@click.option("--state", type=click.Choice(_STATES), help="Only instances in this state.")
@click.option("--tree", is_flag=True, help="Draw every tree in the store (nested objects with --json).")
@pass_settings
def ls_command(settings: CliSettings, state: str | None, tree: bool) -> int:
    """List the instances in the store, oldest first."""
    if tree and state is not None:
        raise click.UsageError("give --state or --tree, not both")
    return _invoke("ls", settings, state, tree)


@_command("records")
@click.argument("instance_id", metavar="ID")
@click.option("--kind", "kinds", multiple=True, metavar="KIND",
              help="Only records of this kind (repeatable): turn, tool_call, state, approval, hook, error ...")
@pass_settings
def records_command(settings: CliSettings, instance_id: str, kinds: tuple[str, ...]) -> int:
    """Print the record log of instance ID as JSON lines, each with a 'kind'."""
    return _invoke("records", settings, instance_id, kinds)


@_command("plugins")
@pass_settings
def plugins_command(settings: CliSettings) -> int:
    """List the plugins in load order, with what each registered and the hooks it implements."""
    return _invoke("plugins", settings)


@_command("validate")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--kind", type=click.Choice(_FILE_KINDS),
              help="What the files describe.  [default: guessed from the name and the keys]")
@pass_settings
def validate_command(settings: CliSettings, files: tuple[str, ...], kind: str | None) -> int:
    """Check definitions, assemblies, instance headers or record logs against the schemas.

    Prints each problem as file:line:column: message @ $.path. Exits 0 when every file is
    valid, 2 otherwise.
    """
    return _invoke("validate", settings, files, kind)


@_command("delete")
@click.argument("instance_id", metavar="ID")
@pass_settings
def delete_command(settings: CliSettings, instance_id: str) -> int:
    """Delete the root instance ID (a thread, say), the instances below it, and all the store keeps of them.

    Refused (exit 1) while any of them runs, here or in another process: cancel it first. A child
    is deleted only with its root. Records already sent to other record sinks (OpenTelemetry, a
    JSON-lines file) stay there. Prints each id deleted.
    """
    return _invoke("delete", settings, instance_id)


@_command("gc")
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option("--keep", type=Duration(), metavar="DURATION",
              help="Keep trees this long instead of the assembly's retention.instances (30d, 12h ...).")
@click.option("--limit", type=click.IntRange(1), metavar="N", help="Handle at most N trees, oldest first.")
@pass_settings
def gc_command(settings: CliSettings, dry_run: bool, keep: float | None, limit: int | None) -> int:
    """Delete the instance trees at rest for longer than the assembly's retention keeps them.

    A tree (a root and every instance below it) goes whole, with all the store keeps of it, once
    it has not changed for retention.instances; never while one of its instances runs, is queued,
    is held for an approval, asks a question or has unread messages. A tree another process
    holds is left for the next pass. Idle workers do the same every few minutes. Exits 2 when
    no retention is set and no --keep is given.
    """
    return _invoke("gc", settings, dry_run, keep, limit)


@cli.group("memory")
def memory_group() -> None:
    """Long-term memory: remember, recall and forget facts about a subject (a person, a tenant).

    An operator's commands: no grant is checked. 'forget --subject S' removes every fact about S
    in every namespace; transcripts and records that mention S stay until 'loopwright delete'.
    """


def _memory_command(name: str) -> Callable[[Callable[..., Any]], click.Command]:
    """Like :func:`_command`, for a subcommand of ``memory``."""
    def decorate(fn: Callable[..., Any]) -> click.Command:
        command = memory_group.command(name)(fn)
        command.params.extend(common_params())
        return command
    return decorate


@_memory_command("remember")
@click.option("--subject", required=True, metavar="S", help="Whom the fact is about.")
@click.option("--namespace", required=True, metavar="N", help="Where to keep it.")
@click.option("--expires-in", type=Duration(), metavar="DURATION", help="Forget it after this long (30s, 2m ...).")
@click.argument("text")
@pass_settings
def memory_remember_command(settings: CliSettings, subject: str, namespace: str, expires_in: float | None,
                            text: str) -> int:
    """Remember TEXT about a subject in a namespace; prints the new fact's id."""
    return _invoke("memory_remember", settings, subject, namespace, text, expires_in)


@_memory_command("recall")
@click.option("--subject", required=True, metavar="S", help="Whom the facts are about.")
@click.option("--namespace", "namespaces", multiple=True, metavar="N", help="Where to look (repeatable; one at least).")
@click.option("--limit", type=click.IntRange(1, 100), default=10, show_default=True, help="The most facts printed.")
@click.argument("query", default="")
@pass_settings
def memory_recall_command(settings: CliSettings, subject: str, namespaces: tuple[str, ...], limit: int,
                          query: str) -> int:
    """Print the facts about a subject that best match QUERY (the newest without one), unexpired only."""
    return _invoke("memory_recall", settings, subject, namespaces, query, limit)


@_memory_command("forget")
@click.option("--subject", metavar="S", help="Forget every fact about S, in every namespace.")
@click.option("--fact", "fact_id", metavar="ID", help="Forget the one fact ID.")
@pass_settings
def memory_forget_command(settings: CliSettings, subject: str | None, fact_id: str | None) -> int:
    """Forget every fact about a subject (--subject), or one fact (--fact); prints how many."""
    return _invoke("memory_forget", settings, subject, fact_id)


@_command("worker")
@click.option("--poll", type=Duration(), default="1s", show_default=True, metavar="DURATION",
              help="How often to look for work in the store (500ms, 1s, 2m ...).")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=8, show_default=True, metavar="N",
              help="The most instances run at once.")
@click.option("--once", is_flag=True, help="Run the work there is, wait for it to rest, then exit.")
@click.option("--grace", type=Duration(), default="30s", show_default=True, metavar="DURATION",
              help="After SIGTERM or Ctrl-C, how long running segments may take to rest before they are "
                   "left running for another worker.")
@pass_settings
def worker_command(settings: CliSettings, poll: float, max_concurrent: int, once: bool, grace: float) -> int:
    """Run the work other processes leave in the store, until SIGTERM or Ctrl-C.

    Starts instances submitted with 'run --detach' (or 'submit'), resumes instances whose runner
    died (ahead of the queue), continues instances whose held calls were decided elsewhere, and
    answers messages posted to resting instances. Any number of workers may
    share a store: each instance runs in one of them at a time. Prints one line per instance
    picked up and one when it rests (JSON lines with --json).
    """
    if poll <= 0:
        raise click.BadParameter("must be above 0", param_hint="'--poll'")
    return _invoke("worker", settings, poll, max_concurrent, once, grace)


@_command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on. Anything but loopback needs tokens in the assembly's server: key.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="The port (0: any free one; the URL printed says which).")
@pass_settings
def serve_command(settings: CliSettings, host: str, port: int) -> int:
    """Serve the HTTP API (/v1, /healthz, /openapi.json) over the assembly's store, until SIGTERM or Ctrl-C.

    Needs the loopwright-serve package (pip install "loopwright[serve]"). Tokens and scopes come
    from the assembly's server: key; without them it listens on loopback only. Prints the URL
    it listens on. See docs/serve.md.
    """
    return _invoke("server", settings, host, port)


@_command("mcp-serve")
@pass_settings
def mcp_serve_command(settings: CliSettings) -> int:
    """Serve the assembly's registered agents as MCP tools over stdio, for editors and MCP clients.

    Each entry of agentDefinitions is a tool taking {prompt, inputs?} and answering with the
    agent's final text. Needs the loopwright-serve package (pip install "loopwright[serve]").
    Stdout carries the protocol only. See docs/protocols.md.
    """
    return _invoke("mcp_serve", settings)

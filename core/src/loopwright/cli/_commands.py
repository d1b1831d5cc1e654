"""The commands' work: open a runtime, act on instances, print, return the exit code.

Each public function here takes the :class:`~loopwright.cli.CliSettings` and the parsed
arguments of one command, and returns its exit code. Opening the assembly, its runtime and its
instances is :mod:`loopwright.cli._opening` (with the sync-async edge, ``anyio.run``), and
following an instance until it rests is :mod:`loopwright.cli._following`.

What only some commands use is imported inside them (the runtime and anyio, the live display
and the terminal question for the commands that follow a run, the worker loop, entry-point
metadata for ``plugins``), so that ``ls`` and ``show`` import no more than reading the store
takes: on an assembly a bare store can serve (:func:`loopwright._reading.bare_store`: a
built-in store and nothing else to open) they read it without a runtime, and without an event
loop for the file store; on any other, they open a runtime as every command does.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from loopwright import _reading
from loopwright._states import State
from loopwright._views import header_of, summary
from loopwright.cli._exits import EXIT_OK, EXIT_USAGE, CliError
from loopwright.cli._following import follow_agent, follow_elsewhere, report_submitted
from loopwright.cli._opening import assembly, lookup, read_header, runtime, sync
from loopwright.cli._output import (
    echo_json,
    print_instance,
    print_instances,
    print_plugins,
    print_tree,
    report,
)
from loopwright.display import safe_json, safe_text
from loopwright.errors import (
    CapabilityError,
    ConfigError,
    ConfigProblem,
    InstanceLockedError,
    LoopwrightError,
    PluginError,
)

if TYPE_CHECKING:
    from loopwright._runtime import Runtime
    from loopwright.abc import Store
    from loopwright.cli._main import CliSettings

__all__ = [
    "approve",
    "cancel",
    "deny",
    "fork",
    "ls",
    "mcp_serve",
    "message",
    "plugins",
    "records",
    "resume",
    "rewind",
    "run",
    "server",
    "show",
    "validate",
    "worker",
]


# ---------------------------------------------------------------------------------------------
# run and the commands that continue an instance
# ---------------------------------------------------------------------------------------------


@sync
async def run(settings: CliSettings, definition: str, prompt: str | None, inputs: Mapping[str, str],  # noqa: PLR0917 - click passes them in order
              stream: bool, detach: bool = False) -> int:
    """``loopwright run``: start an instance and follow it until it rests (``detach``: queue it for a worker)."""
    from loopwright._template import resolve_inputs  # noqa: PLC0415 - only for run, for a cheap start

    async with runtime(settings) as rt:
        if definition not in rt.assembly.agent_definitions and not Path(definition).exists():  # noqa: ASYNC240
            names = ", ".join(sorted(rt.assembly.agent_definitions))
            known = f"; the assembly's agentDefinitions are: {names}" if names else ""
            raise CliError(f"no definition file {definition!r}{known}", EXIT_USAGE)
        defn = rt.load_definition(definition)
        values = resolve_inputs(defn, inputs, from_strings=True)
        if detach or not rt.engine.in_process:
            instance_id = await rt.submit(defn, values, prompt)
            if detach:
                return report_submitted(settings, await rt.store.read_header(instance_id), "queued")
            return await follow_elsewhere(settings, rt, instance_id)
        agent = await rt.start_agent(defn, values, prompt, stream=stream)
        return await follow_agent(settings, agent)


async def _decide(settings: CliSettings, instance_id: str, call_id: str | None, *, subtree: bool,  # noqa: C901 - each way to go on
                  decision: Literal["approved", "denied"], reason: str | None, stream: bool = False,
                  detach: bool = False) -> int:
    """Decide held calls of ``instance_id``'s tree, then follow it (see ``approve``; ``detach``: a worker goes on)."""
    async with runtime(settings) as rt:
        agent = await lookup(rt, instance_id)
        agent.stream = stream
        if call_id is None and not subtree and agent.state is not State.WAITING_FOR_APPROVAL:
            waiting = await rt.tree_approvals(instance_id)
            hint = (f"; {len(waiting)} call{'' if len(waiting) == 1 else 's'} wait{'s' if len(waiting) == 1 else ''} "
                    f"in its tree: decide one with --call CALL_ID, or all with --subtree") if waiting else ""
            raise CliError(f"instance {instance_id} is {agent.state.value}, not waiting for approval{hint}",
                           EXIT_USAGE)
        elsewhere = detach or not rt.engine.in_process
        try:
            if elsewhere:
                decided = await rt.submit_decision(instance_id, call_id, decision, reason, subtree=subtree)
            elif subtree:
                decided = await rt.decide_subtree(agent, decision, reason)
            else:
                decided = await rt.decide(agent, call_id, decision, reason)
        except InstanceLockedError as exc:
            raise CliError(f"{exc}: its calls are being decided or run there, none waits here", EXIT_USAGE) from None
        except LoopwrightError as exc:
            if type(exc) is not LoopwrightError:
                raise
            raise CliError(str(exc), EXIT_USAGE) from None
        if not settings.json:
            for p in decided:
                where = " > ".join(f"{safe_text(step.get('name'))} {safe_text(step.get('instanceId'))}"
                                   for step in p.path) or safe_text(p.instance_id or instance_id)
                click.echo(f"{decision}: {safe_text(p.tool_call_id)} {safe_text(p.tool)} (in {where})", err=True)
        if detach:
            return report_submitted(settings, await rt.store.read_header(instance_id),
                                    f"{decision}, for a worker to go on")
        if elsewhere:
            return await follow_elsewhere(settings, rt, instance_id)
        return await follow_agent(settings, agent)


@sync
async def approve(settings: CliSettings, instance_id: str, call_id: str | None, subtree: bool = False,  # noqa: PLR0917 - click passes them in order
                  stream: bool = False, detach: bool = False) -> int:
    """``loopwright approve``: approve held calls (anywhere in its tree with ``--call``, ``--subtree``), then follow.

    ``stream`` asks the provider to stream the answers that follow; ``detach`` only saves the decision.
    """
    return await _decide(settings, instance_id, call_id, subtree=subtree, decision="approved", reason=None,
                         stream=stream, detach=detach)


@sync
async def deny(settings: CliSettings, instance_id: str, call_id: str | None, reason: str | None,  # noqa: PLR0917 - click passes them in order
               subtree: bool = False, stream: bool = False, detach: bool = False) -> int:
    """``loopwright deny``: deny held calls (the model sees ``denied: REASON``), then follow the instance."""
    return await _decide(settings, instance_id, call_id, subtree=subtree, decision="denied", reason=reason,
                         stream=stream, detach=detach)


@sync
async def message(settings: CliSettings, instance_id: str, text: str, stream: bool, detach: bool = False) -> int:
    """``loopwright message``: send a message, then follow the instance.

    ``stream`` asks the provider to stream; ``detach`` only posts the message, for a worker.
    """
    async with runtime(settings) as rt:
        agent = await lookup(rt, instance_id)
        agent.stream = stream
        if agent.state is State.WAITING_FOR_APPROVAL and not settings.json:
            click.echo("the message is queued: it is read once the calls waiting for approval are decided",
                       err=True)
        if detach or not rt.engine.in_process:
            await rt.submit_message(instance_id, text, source="user")
            if detach:
                return report_submitted(settings, await rt.store.read_header(instance_id), "the message is posted")
            return await follow_elsewhere(settings, rt, instance_id)
        agent = await rt.message(instance_id, text, source="user")
        if not agent.running and agent.state is State.RUNNING:
            # Another process runs it: the message is in its mailbox, read at its next turn boundary.
            if settings.json:
                echo_json({**summary(await rt.store.read_header(instance_id)), "delivered": True})
            else:
                click.echo(f"delivered: instance {instance_id} is running in another process, which reads the "
                           "message at its next turn boundary", err=True)
            return EXIT_OK
        return await follow_agent(settings, agent)


@sync
async def resume(settings: CliSettings, instance_id: str, stream: bool, detach: bool = False) -> int:
    """``loopwright resume``: continue an instance a crash left running, then follow it (``detach``: a worker does)."""
    async with runtime(settings) as rt:
        agent = await lookup(rt, instance_id)
        agent.stream = stream
        if agent.state is not State.RUNNING and not settings.json:
            hint = "" if agent.state is State.WAITING_FOR_APPROVAL else (
                f" (send it a message to go on: loopwright message {instance_id} TEXT)")
            click.echo(f"instance {instance_id} is {agent.state.value}, not running: nothing to resume{hint}",
                       err=True)
        if detach or not rt.engine.in_process:
            handed = await rt.submit_resume(instance_id)
            if detach:
                header = await rt.store.read_header(instance_id)
                return report_submitted(settings, header, "to be continued") if handed else report(
                    agent.inst.result(), settings, turns=agent.inst.turn)
            if handed:
                return await follow_elsewhere(settings, rt, instance_id)
            return report(agent.inst.result(), settings, turns=agent.inst.turn)
        agent = await rt.resume(instance_id)
        return await follow_agent(settings, agent)


@sync
async def fork(settings: CliSettings, instance_id: str, at_turn: int | None) -> int:
    """``loopwright fork``: a new instance with ID's history up to the end of a turn; prints its summary."""
    async with runtime(settings) as rt:
        await lookup(rt, instance_id)
        try:
            agent = await rt.fork(instance_id, at_turn)
        except LoopwrightError as exc:
            if type(exc) is not LoopwrightError:
                raise
            raise CliError(str(exc), EXIT_USAGE) from None
        data = await rt.summary(agent.instance_id)
        if settings.json:
            echo_json(data)
        else:
            forked = data["tree"].get("forkedFrom") or {}
            click.echo(agent.instance_id)
            click.echo(f"forked from {instance_id} at turn {forked.get('turn')}; it rests, ready for a message: "
                       f"loopwright message {agent.instance_id} TEXT", err=True)
        return EXIT_OK


@sync
async def rewind(settings: CliSettings, instance_id: str, to_turn: int) -> int:
    """``loopwright rewind``: move ID back to the end of a turn (the log keeps what came after)."""
    async with runtime(settings) as rt:
        await lookup(rt, instance_id)
        try:
            await rt.rewind(instance_id, to_turn)
        except InstanceLockedError as exc:
            raise CliError(f"cannot rewind: {exc}", EXIT_USAGE) from None
        except LoopwrightError as exc:
            if type(exc) is not LoopwrightError:
                raise
            raise CliError(str(exc), EXIT_USAGE) from None
        data = await rt.summary(instance_id)
        if settings.json:
            echo_json(data)
        else:
            click.echo(f"instance {instance_id} is back at the end of turn {to_turn}; it rests, ready for a "
                       f"message: loopwright message {instance_id} TEXT", err=True)
        return EXIT_OK


@sync
async def cancel(settings: CliSettings, instance_id: str) -> int:
    """``loopwright cancel``: mark the instance stopped and cancelled, print its result, exit 0."""
    async with runtime(settings) as rt:
        agent = await lookup(rt, instance_id)
        agent = await rt.cancel(instance_id)
        result = await agent.wait()
        return report(result, settings, turns=agent.inst.turn, cancel_command=True)


# ---------------------------------------------------------------------------------------------
# Reading the store
# ---------------------------------------------------------------------------------------------


def show(settings: CliSettings, instance_id: str) -> int:
    """``loopwright show``: one instance's summary, and the tree of the agents it started."""
    async def query(store: Store) -> int:
        header = await read_header(store, instance_id)
        data = await _reading.instance_summary(store, instance_id)
        if settings.json:
            echo_json(data)
        else:
            print_instance(data, header_of(header))
        return EXIT_OK

    return _read(settings, query)


def ls(settings: CliSettings, state: str | None, tree: bool = False) -> int:
    """``loopwright ls``: every instance's summary, optionally only those in ``state``; or every tree."""
    async def query(store: Store) -> int:
        if tree:
            trees = await _reading.trees(store)
            if settings.json:
                echo_json(trees)
            elif not trees:
                click.echo("no instances", err=True)
            else:
                for node in trees:
                    print_tree(node)
            return EXIT_OK
        summaries = await _reading.list_instances(store, state)
        if settings.json:
            echo_json(summaries)
        else:
            print_instances(summaries)
        return EXIT_OK

    return _read(settings, query)


def _read(settings: CliSettings, query: Callable[[Store], Awaitable[int]]) -> int:
    """Run ``query`` on the assembly's store: a bare store when one serves it, else an opened runtime's."""
    loaded = assembly(settings)
    bare = _reading.bare_store(loaded)
    if bare is not None:
        return bare.run(query)

    @sync
    async def in_runtime() -> int:
        async with runtime(settings, loaded) as rt:
            return await query(rt.store)

    return in_runtime()


@sync
async def records(settings: CliSettings, instance_id: str, kinds: Sequence[str]) -> int:
    """``loopwright records``: the record log as JSON lines (``--json`` changes nothing), safe to show."""
    async with runtime(settings) as rt:
        await read_header(rt.store, instance_id)
        wanted = set(kinds)
        for record in await rt.records(instance_id):
            if not wanted or record.get("kind") in wanted:
                click.echo(safe_json(record, separators=(",", ":")))
        return EXIT_OK


@sync
async def worker(settings: CliSettings, poll: float, max_concurrent: int, once: bool, grace: float) -> int:
    """``loopwright worker``: run the work other processes leave in the store until stopped."""
    from loopwright.cli._worker import worker as serve  # noqa: PLC0415 - only for worker, for a cheap start

    return await serve(settings, poll, max_concurrent, once, grace)


def _runtime_from_file(settings: CliSettings) -> Runtime:
    """Return ``Runtime.from_file`` of the assembly the options name (no terminal approver)."""
    from loopwright._runtime import Runtime  # noqa: PLC0415 - the runtime only for commands that open one: keeps ls and show cheap

    return Runtime.from_file(settings.assembly_path())


def server(settings: CliSettings, host: str, port: int) -> int:
    """``loopwright serve``: the HTTP API over the assembly's store, until SIGTERM or Ctrl-C.

    Prints the URL it listens on (the real port for ``--port 0``) on one line of stdout, flushed,
    before it serves; without ``server.tokens`` it says on stderr that it answers loopback only.
    """
    try:
        # The server, Starlette and uvicorn only for this command: the CLI's start-up stays cheap,
        # and the core does not depend on them.
        import loopwright_serve  # noqa: PLC0415
    except ImportError as exc:
        raise CliError(f'loopwright serve needs the loopwright-serve package: pip install "loopwright[serve]" '
                       f"({exc})", EXIT_USAGE) from None
    rt = _runtime_from_file(settings)
    server_settings = loopwright_serve.ServerSettings.from_runtime(rt)
    server_settings.check_host(host)
    app = loopwright_serve.build_app(loopwright_serve.ServeContext(rt, server_settings))

    def announce(url: str) -> None:
        click.echo(f"loopwright serve: listening on {url}")
        sys.stdout.flush()
        if not server_settings.tokens:
            click.echo("loopwright serve: no tokens in the assembly's server: key, so it answers loopback only, "
                       "and every request may do everything (docs/serve.md)", err=True)

    loopwright_serve.run_server(app, host, port, announce=announce)
    return EXIT_OK


def mcp_serve(settings: CliSettings) -> int:
    """``loopwright mcp-serve``: the registered agents as MCP tools over stdio, until the client closes stdin."""
    try:
        # The MCP server lives in loopwright-serve, with the mcp SDK: imported only for this command.
        from loopwright_serve._mcp_server import serve_stdio  # noqa: PLC0415
    except ImportError as exc:
        raise CliError(f'loopwright mcp-serve needs the loopwright-serve package: pip install "loopwright[serve]" '
                       f"({exc})", EXIT_USAGE) from None
    config = settings.assembly_path()
    import anyio  # noqa: PLC0415 - the event loop only for commands that need one: keeps ls and show cheap

    anyio.run(serve_stdio, str(config) if config is not None else None)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Plugins and files
# ---------------------------------------------------------------------------------------------

_REGISTRY_KEYS = {
    "provider": "providers", "tool": "tools", "store": "stores", "engine": "engines",
    "context strategy": "contextStrategies",
    "record sink": "recordSinks", "command": "commands", "guardrail": "guardrails", "verifier": "verifiers",
    "hook set": "hookSets",
}


def plugins(settings: CliSettings) -> int:
    """``loopwright plugins``: each plugin in load order, where it came from and what it registered."""
    from loopwright._plugins import BUILTIN_PLUGINS  # noqa: PLC0415 - the plugin host only for plugins: keeps ls and show cheap

    rt = runtime(settings)
    rt.load_plugins()
    host = rt.plugins
    listed = set(rt.assembly.plugins)
    out: list[dict[str, Any]] = []
    for name in host.plugin_names():
        installed = host.installed(name)
        if name in BUILTIN_PLUGINS:
            source, value = "builtin", None
        elif installed is not None:
            source, value = "entrypoint", installed.value
        elif name in listed:
            source, value = "assembly", None
        else:
            source, value = "host", None
        registered: dict[str, list[str]] = {key: [] for key in _REGISTRY_KEYS.values()}
        for kind, names in host.registered_by(name).items():
            registered[_REGISTRY_KEYS.get(kind, kind)] = list(names)
        plugin = host.pm.get_plugin(name)
        callers = (host.pm.get_hookcallers(plugin) or []) if plugin is not None else []
        hooks = sorted(c.name.removeprefix("loopwright_") for c in callers
                       if not c.name.startswith("loopwright_register_"))
        entry: dict[str, Any] = {"name": name, "source": source, "registered": registered, "hooks": hooks}
        if value is not None:
            entry["value"] = value
        out.append(entry)
    if settings.json:
        echo_json(out)
    else:
        print_plugins(out)
    return EXIT_OK


def validate(settings: CliSettings, files: Sequence[str], kind: str | None) -> int:
    """``loopwright validate``: every problem of every file; exit 0 if all are valid, else 2.

    With an assembly (``-c``, or ``./loopwright.yaml``), files that are valid on their own are
    also checked as ``run`` checks them, calling no model: an assembly opens a runtime (plugins,
    store and record sinks, each outside every granted root), and a definition's tools, models,
    context strategy, verifier and hooks resolve against the ``-c`` assembly's runtime.
    """
    from loopwright._config import detect_kind, load_yaml, validate_file  # noqa: PLC0415 - the loader only for validate

    results: list[dict[str, Any]] = []
    checker = _RunChecks(settings.assembly_path()) if settings.config is not None else None
    for file in files:
        problems = validate_file(file, kind)  # type: ignore[arg-type]
        found = kind
        if found is None:
            try:
                found = detect_kind(file, None if file.endswith(".jsonl") else load_yaml(file)[0])
            except ConfigError:
                found = None
        if checker is not None and not problems and found in {"definition", "assembly"}:
            problems = checker.problems(file, found)
        results.append({
            "file": file, "kind": found, "valid": not problems,
            "problems": [{"file": p.file, "line": p.line, "column": p.column, "path": p.path,
                          "message": p.message} for p in problems],
        })
        if not settings.json:
            if problems:
                for p in problems:
                    click.echo(safe_text(p, multiline=True))
            else:
                click.echo(f"{file}: valid {found or ''}".rstrip())
    if settings.json:
        echo_json(results)
    invalid = [r for r in results if not r["valid"]]
    if invalid and not settings.json:
        count = sum(len(r["problems"]) for r in invalid)
        click.echo(f"{len(invalid)} of {len(results)} file{'' if len(results) == 1 else 's'} invalid, "
                   f"{count} problem{'' if count == 1 else 's'}", err=True)
    return EXIT_USAGE if invalid else EXIT_OK


class _RunChecks:
    """What ``run`` checks beyond the schemas, for ``validate -c``: one runtime per assembly, no model called."""

    def __init__(self, assembly: Path | None) -> None:
        self._assembly = assembly

    def problems(self, file: str, kind: str) -> list[Any]:
        """Return the problems ``run`` would refuse ``file`` (a ``definition`` or an ``assembly``) for."""
        import anyio  # noqa: PLC0415 - the event loop only for commands that need one: keeps ls and show cheap

        return anyio.run(self._check, Path(file), kind)

    async def _check(self, file: Path, kind: str) -> list[Any]:
        from loopwright._runtime import Runtime  # noqa: PLC0415 - the runtime only for validate -c: keeps ls and show cheap

        assembly = file if kind == "assembly" else self._assembly
        where = str(assembly) if assembly is not None else None
        try:
            async with Runtime.from_file(assembly) as rt:
                if kind == "definition":
                    rt.check_definition(rt.load_definition(file))
        except ConfigError as exc:
            return list(exc.problems) or [ConfigProblem(str(exc), file=exc.path or where)]
        except (PluginError, CapabilityError) as exc:
            return [ConfigProblem(str(exc), file=where)]
        return []

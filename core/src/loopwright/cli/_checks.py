"""The commands that look at the set-up rather than at instances: ``plugins`` and ``validate``.

``plugins`` lists each plugin in load order, where it came from, what it registered and the hooks
it implements. ``validate`` checks files against the schemas and, with an assembly, as ``run``
would check them, calling no model; it exits 2 when a file is invalid.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from loopwright.cli._exits import EXIT_OK, EXIT_USAGE
from loopwright.cli._opening import runtime
from loopwright.cli._output import echo_json, print_plugins
from loopwright.display import safe_text
from loopwright.errors import CapabilityError, ConfigError, ConfigProblem, PluginError, shown_path

if TYPE_CHECKING:
    from loopwright.cli._settings import CliSettings

__all__ = ["plugins", "validate"]


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

    Files that are valid on their own are also checked as ``run`` checks them, calling no model:
    an assembly (given as the file) opens a runtime (plugins, store and its options, record sinks,
    each outside every granted root); a definition's tools, models, context strategy, verifier
    and hooks resolve against the runtime of the assembly ``run`` would use (``-c``, else
    ``./loopwright.yaml``), or against the defaults ``run`` uses when there is no assembly.
    """
    from loopwright._config import detect_kind, load_yaml, validate_file  # noqa: PLC0415 - the loader only for validate

    results: list[dict[str, Any]] = []
    checker = _RunChecks(settings.assembly_path())
    for file in files:
        problems = validate_file(file, kind)  # type: ignore[arg-type]
        found = kind
        if found is None:
            try:
                found = detect_kind(file, None if file.endswith(".jsonl") else load_yaml(file)[0])
            except ConfigError:
                found = None
        if not problems and checker.applies(found):
            problems = checker.problems(file, str(found))
        results.append({
            "file": shown_path(file), "kind": found, "valid": not problems,
            "problems": [{"file": shown_path(p.file) if p.file else None, "line": p.line, "column": p.column,
                          "path": p.path, "message": p.message} for p in problems],
        })
        if not settings.json:
            if problems:
                for p in problems:
                    click.echo(safe_text(p, multiline=True))
            else:
                click.echo(f"{shown_path(file)}: valid {found or ''}".rstrip())
                checker.echo_sandbox_note(file)  # issue 28: whether the sandbox works, when the grants need it
    if settings.json:
        echo_json(results)
    invalid = [r for r in results if not r["valid"]]
    if invalid and not settings.json:
        count = sum(len(r["problems"]) for r in invalid)
        click.echo(f"{len(invalid)} of {len(results)} file{'' if len(results) == 1 else 's'} invalid, "
                   f"{count} problem{'' if count == 1 else 's'}", err=True)
    return EXIT_USAGE if invalid else EXIT_OK


class _RunChecks:
    """What ``run`` checks beyond the schemas, for ``validate``: one runtime per assembly, no model called."""

    def __init__(self, assembly: Path | None) -> None:
        """Check definitions against ``assembly`` (``None``: there is none; the defaults ``run`` would use)."""
        self._assembly = assembly
        #: For each file whose runtime grants a sandboxed shell and opened: that the sandbox works here.
        #: (Where it does not, the runtime refuses to open and says why: one of the file's problems.)
        self.sandbox_notes: dict[str, str] = {}

    def echo_sandbox_note(self, file: str) -> None:
        """Print the note of ``file``'s sandbox, if it has one (issue 28)."""
        note = self.sandbox_notes.get(str(Path(file)))
        if note is not None:
            click.echo(f"  {note}")

    def applies(self, kind: str | None) -> bool:
        """Whether a file of ``kind`` gets these checks: an assembly or a definition (``run`` takes no other)."""
        return kind in {"assembly", "definition"}

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
                _note_sandbox(self.sandbox_notes, str(file), rt.assembly.capabilities.shell)
        except ConfigError as exc:
            return list(exc.problems) or [ConfigProblem(str(exc), file=exc.path or where)]
        except (PluginError, CapabilityError) as exc:
            return [ConfigProblem(str(exc), file=where)]
        return []


def _note_sandbox(notes: dict[str, str], file: str, mode: str) -> None:
    """Note that ``shell: MODE`` works here when it is a sandboxed mode (issue 28; the runtime has just probed it)."""
    from loopwright.capabilities import SANDBOX_MODES, sandbox_problem  # noqa: PLC0415 - only for validate

    if mode in SANDBOX_MODES and sandbox_problem() is None:
        notes[file] = f"shell: {mode}: the sandbox works on this machine (bubblewrap, user and network namespaces)"

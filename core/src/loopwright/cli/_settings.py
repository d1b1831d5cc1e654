"""What every command shares: :class:`CliSettings`, the ``--json`` and ``-c/--config`` options, and the group class.

:class:`CliSettings` holds the options every command takes, wherever they were given on the
command line (:func:`common_params` makes them, :data:`pass_settings` hands them to a command),
and what an interrupted command reports. :class:`LoopwrightGroup` is the class of the
``loopwright`` group: it finds plugin commands by name, giving them the same two options.

This module imports click and the standard library only (the runtime, inside the function that
looks a plugin command up), so that ``loopwright --help`` stays cheap. The work modules import
:class:`CliSettings` only to type their arguments.
"""

from __future__ import annotations

from pathlib import Path

import click

from loopwright.cli._exits import EXIT_USAGE, CliError

__all__ = ["DEFAULT_CONFIG", "CliSettings", "LoopwrightGroup", "common_params", "pass_settings"]

#: The assembly read when ``-c`` is not given, if it exists (relative to the working folder).
DEFAULT_CONFIG = Path("loopwright.yaml")


class CliSettings:
    """The options every command takes, wherever they were given on the command line.

    ``--json`` and ``-c/--config`` are accepted before and after the command name; the value
    given after it wins.

    Attributes:
        json: Whether to print JSON instead of text.
        config: The assembly file given with ``-c``, or ``None``.
        instance_id: The instance a command is following, so that an interruption can say
            how to continue it.
        streamed_text: The answer as it was already printed while it streamed, so the result
            does not print it twice.
    """

    __slots__ = ("config", "instance_id", "json", "streamed_text")

    def __init__(self) -> None:
        """Start with the defaults: text output, no ``-c``."""
        self.json = False
        self.config: Path | None = None
        self.instance_id: str | None = None
        self.streamed_text: str | None = None

    def assembly_path(self) -> Path | None:
        """Return the assembly to load: ``-c PATH``, else ``./loopwright.yaml`` if it exists, else ``None``.

        :raises CliError: (exit 2) ``-c`` names a file that does not exist.
        """
        if self.config is not None:
            if not self.config.is_file():
                what = "is a folder" if self.config.is_dir() else "does not exist"
                raise CliError(f"assembly file {str(self.config)!r} given with -c/--config {what}", EXIT_USAGE)
            return self.config
        return DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None


#: Passes the :class:`CliSettings` of the command line to a command, as its first argument.
pass_settings = click.make_pass_decorator(CliSettings, ensure=True)


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(CliSettings).json = True


def _set_config(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.ensure_object(CliSettings).config = value


def common_params() -> list[click.Parameter]:
    """Return new ``--json`` and ``-c/--config`` options: each command and the group get their own copies.

    Neither is passed to the command: each sets its value on the context's :class:`CliSettings`.
    """
    return [
        click.Option(["--json", "json_output"], is_flag=True, expose_value=False, callback=_set_json,
                     help="Print JSON instead of text."),
        click.Option(["-c", "--config"], metavar="PATH", type=click.Path(path_type=Path), expose_value=False,
                     callback=_set_config,
                     help="The assembly file.  [default: ./loopwright.yaml if it exists]"),
    ]


class LoopwrightGroup(click.Group):
    """The ``loopwright`` group: built-in commands, then plugin commands looked up by name.

    ``--help`` lists only the built-ins, so that it loads no plugin; a name that is not a
    built-in loads the plugins (from the assembly) and looks for a plugin command of that name.
    """

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Return the built-in command ``cmd_name``, else a plugin's, else ``None``."""
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None or ctx.resilient_parsing:
            return cmd
        return _plugin_command(ctx.ensure_object(CliSettings), cmd_name)


def _plugin_command(settings: CliSettings, name: str) -> click.Command | None:
    """Return the plugin command ``name``, with ``--json`` and ``-c`` added, or ``None`` if no plugin adds it.

    :raises CliError: (exit 2) the plugins that could add it did not load.
    """
    from loopwright._runtime import Runtime  # noqa: PLC0415 - only when a plugin command is asked for
    from loopwright.errors import LoopwrightError  # noqa: PLC0415 - keeps this module to click and the stdlib

    try:
        runtime = Runtime.from_file(settings.assembly_path())
        runtime.load_plugins()
    except LoopwrightError as exc:
        raise CliError(f"no such command {name!r}, and the plugins that could add it did not load: {exc}",
                       EXIT_USAGE) from exc
    if name not in runtime.plugins.commands:
        return None
    command: click.Command = runtime.plugins.commands.get(name)
    if not getattr(command, "_loopwright_common_params", False):
        # A plugin's own --json or -c wins over ours.
        taken = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
        command.params.extend(p for p in common_params() if not taken & {*p.opts, *p.secondary_opts})
        command._loopwright_common_params = True  # type: ignore[attr-defined]  # noqa: SLF001
    return command

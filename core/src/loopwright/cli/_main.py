"""The entry point of ``loopwright``: :func:`main`, and how what escapes a command becomes an exit code.

:func:`main` runs the group (:mod:`loopwright.cli._wiring`) and exits with the command's exit
code. An error prints one ``error: ...`` line on stderr, without a traceback unless
``LOOPWRIGHT_DEBUG=1`` (:func:`describe_error` words it and picks its code); Ctrl-C outside a
followed run prints how to continue the instance; a closed stdout (``| head``) stops quietly.
This module imports click and the standard library only.

Exit codes (see ``docs/cli.md``): 0 the instance rests (``completed``, ``waiting``); 3 it waits
for approval; 1 it is in an error state, or the CLI failed; 2 bad input (usage, invalid YAML or
definition, unknown instance); 130 cancelled, Ctrl-C included.

The group, the settings, the default assembly, the exit codes and :class:`CliError` are
exported from here too, as :mod:`loopwright.cli` and plugins have always found them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

import click

from loopwright.cli._exits import EXIT_APPROVAL, EXIT_CANCELLED, EXIT_ERROR, EXIT_OK, EXIT_USAGE, CliError
from loopwright.cli._settings import DEFAULT_CONFIG, CliSettings
from loopwright.cli._wiring import cli

if TYPE_CHECKING:
    from loopwright.errors import ConfigError

__all__ = [  # noqa: RUF022 - plainly sorted, as the project's __all__ test checks
    "CliError",
    "CliSettings",
    "DEFAULT_CONFIG",
    "EXIT_APPROVAL",
    "EXIT_CANCELLED",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_USAGE",
    "cli",
    "main",
]


def main(args: Sequence[str] | None = None) -> NoReturn:
    """Run the CLI with ``args`` (default: ``sys.argv[1:]``) and exit with its exit code.

    Errors print one ``error: ...`` line (no traceback unless ``LOOPWRIGHT_DEBUG=1``).
    """
    code = _run(args)
    if code == EXIT_CANCELLED:
        # The cancelled run is saved: a Ctrl-C pressed again while the interpreter ends has nothing
        # left to stop, and must not kill the process by the signal (an exit status other than 130).
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


def _run(args: Sequence[str] | None) -> int:  # noqa: PLR0911 - one return per way out
    debug = os.environ.get("LOOPWRIGHT_DEBUG", "") not in ("", "0")
    settings = CliSettings()
    try:
        rv = cli.main(args=list(args) if args is not None else None, prog_name="loopwright",
                      standalone_mode=False, obj=settings)
    except click.Abort:
        # Ctrl-C outside a followed run (a followed run is cancelled and saved instead).
        _interrupted(settings)
        return EXIT_CANCELLED
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except BrokenPipeError:
        # The reader went away (`loopwright records ID | head`): stop quietly, as `cat` does.
        _silence_stdout()
        return EXIT_ERROR
    except Exception as exc:
        leaf = _unwrap(exc)
        if isinstance(leaf, click.ClickException):
            leaf.show()
            return leaf.exit_code
        if debug:
            raise
        code, message = describe_error(leaf)
        from loopwright.display import safe_text  # noqa: PLC0415 - keeps this module to click and the stdlib

        click.echo(f"error: {safe_text(message, multiline=True)}", err=True)
        return code
    except KeyboardInterrupt:
        _interrupted(settings)
        return EXIT_CANCELLED
    return rv if isinstance(rv, int) else EXIT_OK


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that flushing it at exit raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _interrupted(settings: CliSettings) -> None:
    iid = settings.instance_id
    hint = f"; continue instance {iid} with: loopwright resume {iid}" if iid else ""
    click.echo(f"interrupted{hint}", err=True)


def _unwrap(exc: BaseException) -> BaseException:
    """Return the single leaf of nested exception groups (anyio task groups), else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def describe_error(exc: BaseException) -> tuple[int, str]:
    """Return the exit code and the message for an exception that escaped a command.

    Bad input (configuration, plugins that cannot load, an unknown instance) is 2; anything
    else is 1. The message is the error's own; for errors that are not loopwright's, it is
    prefixed with the exception's type.
    """
    from loopwright import errors  # noqa: PLC0415 - already imported with loopwright; kept local for clarity

    if isinstance(exc, errors.InstanceNotFoundError):
        return EXIT_USAGE, f"no instance {exc.instance_id!r} in the store ('loopwright ls' lists them)"
    if isinstance(exc, errors.ConfigError):
        return EXIT_USAGE, format_config_error(exc)
    if isinstance(exc, (errors.PluginError, errors.CapabilityError)):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, errors.RunCancelledError):
        return EXIT_CANCELLED, str(exc)
    if isinstance(exc, errors.LoopwrightError):
        return EXIT_ERROR, str(exc)
    text = str(exc)
    return EXIT_ERROR, f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def format_config_error(exc: ConfigError) -> str:
    """Return the message and the problems, one per line, without repeating a problem the message states."""
    head = str(exc.args[0]).split("\n", 1)[0] if exc.args else "invalid configuration"
    lines = [head]
    for problem in exc.problems:
        text = str(problem) if problem.file is not None else problem.message
        if text.removesuffix(" @ $") != head:
            lines.append(f"  {text}")
    return "\n".join(lines)

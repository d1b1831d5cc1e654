"""The exit codes of ``loopwright`` and :class:`CliError`, below every other CLI module.

:mod:`loopwright.cli._main` (the entry point), the click wiring (:mod:`~loopwright.cli._wiring`,
:mod:`~loopwright.cli._settings`) and the modules that do the work (:mod:`~loopwright.cli._commands`
and the modules it gathers, :mod:`~loopwright.cli._output`, :mod:`~loopwright.cli._worker` ...) all
import these from here, so none of them imports ``_main`` back at run time. This module imports
click and the standard library only.
"""

from __future__ import annotations

from typing import Any

import click

__all__ = ["EXIT_APPROVAL", "EXIT_CANCELLED", "EXIT_ERROR", "EXIT_OK", "EXIT_USAGE", "CliError"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_APPROVAL = 3
EXIT_CANCELLED = 130


class CliError(click.ClickException):
    """A failure reported as one ``error: ...`` line on stderr, with its exit code.

    Attributes:
        exit_code: The process's exit code (2 for bad input, 1 otherwise).
    """

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        """Make the error; ``exit_code`` defaults to 1."""
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it a ClassVar

    def show(self, file: Any = None) -> None:
        """Print ``error: MESSAGE`` to stderr (or ``file``), made safe to show (it may quote model output)."""
        from loopwright.display import safe_text  # noqa: PLC0415 - keeps this module to click and the stdlib

        click.echo(f"error: {safe_text(self.format_message(), multiline=True)}", err=file is None, file=file)

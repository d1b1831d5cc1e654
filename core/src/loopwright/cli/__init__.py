"""The ``loopwright`` command line.

``loopwright`` is a :mod:`click` group; :func:`main` is the console script. Importing this package
is cheap on purpose: the runtime, the YAML machinery, :mod:`rich` and every plugin are imported
inside the commands that need them, so ``loopwright --help`` imports no provider (and no httpx).

Plugins add commands through the ``loopwright_register_commands`` hook. They are looked up only
when a command name is not a built-in one, and they get ``--json`` and ``-c/--config`` like the
built-ins; inside one, ``click.get_current_context().find_object(CliSettings)`` returns the
parsed values.

The full reference, with every output and exit code, is ``docs/cli.md``.
"""

from __future__ import annotations

from loopwright.cli._main import CliSettings, cli, main

__all__ = ["CliSettings", "cli", "main"]

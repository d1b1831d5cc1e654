"""The values of options that take more than click's own types: ``-i KEY=VALUE`` inputs and durations.

:func:`parse_inputs` turns the ``-i`` options of ``run`` and ``submit`` into a mapping (reading
``KEY=@FILE`` values from files); :class:`Duration` is the type of ``worker --poll`` and
``--grace``. Both report bad values as usage errors (exit 2). This module imports click and the
standard library only (the duration grammar, inside :meth:`Duration.convert`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

__all__ = ["Duration", "parse_inputs"]


class Duration(click.ParamType):  # type: ignore[type-arg]
    """Seconds, or a string with a unit: ``500ms``, ``1s``, ``2m``, ``1h``."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """Return the seconds ``value`` stands for; a value that is not a duration fails the option (exit 2)."""
        if isinstance(value, (int, float)):
            return float(value)
        from loopwright._duration import parse_duration  # noqa: PLC0415 - only when the option is given
        from loopwright.errors import ConfigError  # noqa: PLC0415 - keeps this module to click and the stdlib

        try:
            return parse_duration(value)
        except (ConfigError, ValueError) as exc:
            self.fail(str(exc), param, ctx)


def parse_inputs(pairs: Sequence[str]) -> dict[str, str]:
    """Turn ``-i KEY=VALUE`` options into ``{KEY: VALUE}``, reading ``KEY=@FILE`` values from files.

    Values stay text here; the runtime reads them as JSON for inputs declared with another type.
    A file's one trailing newline is dropped. ``KEY=@@TEXT`` gives the literal ``@TEXT``.

    :raises click.BadParameter: (exit 2) a pair without ``=``, an empty or repeated key, or a
        file that cannot be read.
    """
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="'-i' / '--input'")
        if key in values:
            raise click.BadParameter(f"input {key!r} is given twice", param_hint="'-i' / '--input'")
        if value.startswith("@@"):
            value = value[1:]
        elif value.startswith("@"):
            path = Path(value[1:]).expanduser()
            try:
                value = path.read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise click.BadParameter(f"cannot read {str(path)!r} for input {key!r}: {reason}",
                                         param_hint="'-i' / '--input'") from exc
        values[key] = value
    return values

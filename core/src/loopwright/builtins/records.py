"""Built-in plugin: the ``jsonl`` record sink.

``records: [{kind: jsonl, path: records.jsonl}]`` appends every record of every instance to one
JSON-lines file (a relative path is taken from the assembly's folder, as the store's is), flushed
per record. The file is the audit trail, so it obeys the store's rule: it must lie outside every
granted file root (:meth:`JsonlSink.locations`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from loopwright._types import Record
from loopwright.abc import RecordSink
from loopwright.errors import ConfigError
from loopwright.hookspecs import hookimpl

__all__ = ["JsonlSink"]


class JsonlSink(RecordSink):
    """Appends records as JSON lines to ``path``."""

    def __init__(self, options: Mapping[str, Any], *, base_dir: Path | None = None) -> None:
        """Open ``options["path"]`` for appending (created with its folder if needed).

        A relative path is taken from ``base_dir`` (the assembly's folder; default: the working folder).
        """
        if "path" not in options:
            raise ConfigError("record sink jsonl needs a path")
        path = Path(options["path"]).expanduser()
        self.path = path if path.is_absolute() or base_dir is None else base_dir / path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    async def write(self, record: Record) -> None:
        """Append one record as a line: ``{kind, instanceId, at, data}``."""
        if self._file is None:
            return
        line = json.dumps({"kind": record.kind, "instanceId": record.instance_id, "at": record.at,
                           "data": record.data}, ensure_ascii=False, default=str)
        self._file.write(line + "\n")
        self._file.flush()

    async def aclose(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def locations(self) -> Sequence[Path]:
        """Return the file, resolved: no agent may be granted a root that holds it."""
        return (self.path.resolve(),)


@hookimpl
def loopwright_register_record_sinks(register: Any, runtime: Any) -> None:
    """Register ``jsonl``, its relative paths taken from the runtime's assembly's folder."""
    base_dir = runtime.assembly.base_dir if runtime is not None else None
    register("jsonl", functools.partial(JsonlSink, base_dir=base_dir))

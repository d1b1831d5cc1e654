"""Built-in plugin: the ``jsonl`` record sink.

``records: [{kind: jsonl, path: records.jsonl}]`` appends every record of every instance to one
JSON-lines file (relative paths are taken from the working directory), flushed per record. The
file is the audit trail, so it obeys the store's rule: it must lie outside every granted file
root (:meth:`JsonlSink.locations`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from loopwright._plugins import hookimpl
from loopwright._types import Record
from loopwright.abc import RecordSink
from loopwright.errors import ConfigError

__all__ = ["JsonlSink"]


class JsonlSink(RecordSink):
    """Appends records as JSON lines to ``path``."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        """Open ``options["path"]`` for appending (created with its folder if needed)."""
        if "path" not in options:
            raise ConfigError("record sink jsonl needs a path")
        self.path = Path(options["path"])
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
def loopwright_register_record_sinks(register: Any) -> None:
    """Register ``jsonl``."""
    register("jsonl", JsonlSink)

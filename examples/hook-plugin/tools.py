"""Two tools over the notes/ folder next to this file: one reads, one deletes."""

from collections.abc import Callable
from pathlib import Path

import loopwright

NOTES = Path(__file__).parent / "notes"


@loopwright.tool
def read_note(name: str) -> str:
    """Read a note.

    Args:
        name: The note's file name in notes/.
    """
    path = NOTES / name
    if not path.is_file():
        raise loopwright.ToolError(f"no note named {name!r}")
    return path.read_text(encoding="utf-8")


@loopwright.tool(parallel_safe=False)
def delete_note(name: str) -> str:
    """Delete a note.

    Args:
        name: The note's file name in notes/.
    """
    (NOTES / name).unlink()
    return f"deleted {name}"


@loopwright.hookimpl
def loopwright_register_tools(register: Callable[..., None]) -> None:
    register(read_note, delete_note)

"""loopwright-os: shell and file tools, each confined to the calling instance's grants.

Found through the entry point ``os = "loopwright_os"`` of group ``loopwright``. A definition
names the tools it wants, by name or by path (a path resolves by its last segment)::

    tools: [execute_terminal_command, /agent-tools/os/read-file, write-file, list-directory]

* ``execute_terminal_command {command, timeout?}`` runs ``/bin/sh -c COMMAND`` under the
  ``shell`` grant: not offered with ``none``; runs with ``allow``; asks the host's
  ``Runtime(shell_approver=...)`` with ``approval`` (the loop's approval gate when the runtime
  has no approver); is held for ``approve``/``deny`` with ``loopApproval``; runs in a bubblewrap
  sandbox confined to the grants with ``sandbox`` (held first with ``sandboxLoopApproval``).
* ``read-file {path, offset?}``, ``write-file {path, content}`` and ``list-directory {path?}``
  work under the ``files`` grants, with every path checked after symlinks are resolved. The
  assembly's ``pluginSettings: {os: {allowHardLinks: true}}`` lets ``read-file`` read files that
  have other hard links (refused by default).

A plugin's own tool may run sandboxed too: :func:`sandboxed_tool` makes one whose every call runs
a program in the calling instance's sandbox, its arguments as JSON on stdin. :func:`plan_sandbox`
builds the command line of such a sandbox for any program (what another plugin would start in one).

The rules and what the tests prove are in ``docs/tools/os.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopwright import hookimpl
from loopwright_os._files import list_directory, read_file, read_file_tool, write_file
from loopwright_os._sandbox import SandboxPlan, SandboxSettings, plan_sandbox, sandbox_settings
from loopwright_os._sandboxed_tools import sandboxed_tool
from loopwright_os._shell import execute_terminal_command, shell_tool

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "SandboxPlan",
    "SandboxSettings",
    "execute_terminal_command",
    "list_directory",
    "loopwright_register_tools",
    "plan_sandbox",
    "read_file",
    "sandbox_settings",
    "sandboxed_tool",
    "shell_tool",
    "write_file",
]


@hookimpl
def loopwright_register_tools(register: Callable[..., None], settings: Mapping[str, Any]) -> None:
    """Register ``execute_terminal_command``, ``read-file``, ``write-file`` and ``list-directory``.

    ``read-file`` follows the ``os`` entry of the assembly's ``pluginSettings`` (``allowHardLinks``),
    and ``execute_terminal_command`` its ``sandbox`` entry (the limits of ``shell: sandbox``).
    """
    register(shell_tool(settings.get("os")), read_file_tool(settings.get("os")), write_file, list_directory)

"""Grant checks a plugin may use: the public face of ``loopwright._capabilities``.

- :func:`is_within`: whether a path is a root or lies under it, symlinks resolved (a file tool
  checks each path against the instance's granted roots with it, as the core does).
- :func:`intersect`: the grants a child gets, never wider than its parent's.
- :func:`narrow_shell`: the shell mode a child gets under its parent's (sandboxed if either is).
- :func:`sandbox_problem`: why the sandboxed shell cannot start on this machine, or ``None``;
  :data:`SANDBOX_MODES` are the shell modes that need it, :data:`BWRAP_ENV` names the binary.

.. versionadded:: 0.2
"""

from __future__ import annotations

from loopwright._capabilities import BWRAP_ENV, SANDBOX_MODES, intersect, is_within, narrow_shell, sandbox_problem

__all__ = ["BWRAP_ENV", "SANDBOX_MODES", "intersect", "is_within", "narrow_shell", "sandbox_problem"]

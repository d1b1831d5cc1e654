"""Grant checks a plugin may use: the public face of ``loopwright._capabilities``.

- :func:`is_within`: whether a path is a root or lies under it, symlinks resolved (a file tool
  checks each path against the instance's granted roots with it, as the core does).
- :func:`intersect`: the grants a child gets, never wider than its parent's.

.. versionadded:: 0.2
"""

from __future__ import annotations

from loopwright._capabilities import intersect, is_within

__all__ = ["intersect", "is_within"]

"""The instance id rule: one rule, in one public place, for every store and every surface (issue 25, item 4).

An instance id is 1 to 128 of ``A-Z a-z 0-9 _ . -``, starting with a letter, a digit or ``_``,
and without ``..``. So an id is always a safe folder name and URL path segment, is never ``.``,
``..`` or a hidden file, and never reads as an option when an operator types it into the CLI
(``-rf``, ``--help``). The runtime's own ids (``20261207-052531-f3105bdf``) follow it; so must
ids a client chooses (an A2A context id, an AG-UI thread id), and every store refuses others.
"""

from __future__ import annotations

import re
from typing import Final

from loopwright.errors import StoreError

__all__ = ["INSTANCE_ID_RULE", "check_instance_id", "is_instance_id"]

#: The rule, as error messages word it.
INSTANCE_ID_RULE: Final = "1 to 128 of A-Z a-z 0-9 _ . -, starting with a letter, a digit or _, without '..'"

_ID: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def is_instance_id(value: object) -> bool:
    """Whether ``value`` is a string that follows the instance id rule (:data:`INSTANCE_ID_RULE`)."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None and ".." not in value


def check_instance_id(value: object) -> str:
    """Return ``value`` if it follows the instance id rule.

    :raises StoreError: It does not; the message quotes it and states the rule.
    """
    if not is_instance_id(value):
        raise StoreError(f"invalid instance id {value!r}: use {INSTANCE_ID_RULE}")
    return value  # type: ignore[return-value]

"""cattrs converters between the frozen classes and their JSON forms (camelCase keys).

``converter`` is used for everything loopwright writes: instance logs, records and ``--json``.
Defaults are omitted when unstructuring, so logs stay small, and structuring fills them back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

__all__ = ["camel", "converter", "make_converter", "snake"]

_CAMEL_RE = re.compile(r"_([a-z0-9])")
_SNAKE_RE = re.compile(r"([A-Z])")


def camel(name: str) -> str:
    """Return the camelCase form of a snake_case name (``max_iterations`` → ``maxIterations``)."""
    return _CAMEL_RE.sub(lambda m: m.group(1).upper(), name.lstrip("_"))


def snake(name: str) -> str:
    """Return the snake_case form of a camelCase name."""
    return _SNAKE_RE.sub(lambda m: "_" + m.group(1).lower(), name)


def make_converter(*, omit_defaults: bool = True, forbid_extra_keys: bool = False) -> cattrs.Converter:
    """Build a converter whose attrs classes use camelCase keys.

    :param omit_defaults: Leave out fields equal to their default when unstructuring.
    :param forbid_extra_keys: Reject unknown keys when structuring.
    """
    conv = cattrs.Converter(forbid_extra_keys=forbid_extra_keys)

    def unstructure_factory(cls: type) -> Any:
        overrides: dict[str, Any] = {
            a.name: override(rename=camel(a.name), omit_if_default=omit_defaults,
                             omit=a.name.startswith("_"))
            for a in attrs.fields(cls)
        }
        return make_dict_unstructure_fn(cls, conv, **overrides)

    def structure_factory(cls: type) -> Any:
        overrides: dict[str, Any] = {a.name: override(rename=camel(a.name), omit=a.name.startswith("_"))
                     for a in attrs.fields(cls)}
        return make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=forbid_extra_keys, **overrides)

    conv.register_unstructure_hook_factory(attrs.has, unstructure_factory)
    conv.register_structure_hook_factory(attrs.has, structure_factory)
    conv.register_unstructure_hook(Path, str)
    conv.register_structure_hook(Path, lambda v, _t: Path(v))
    conv.register_structure_hook_func(lambda t: t == Mapping[str, Any], lambda v, _t: dict(v))
    return conv


#: The converter for logs, records and ``--json``.
converter = make_converter()

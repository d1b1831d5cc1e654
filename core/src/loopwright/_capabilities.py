"""Grants: what an instance may touch, and :func:`intersect`, which never widens them.

Paths are compared after symlinks are resolved (``Path.resolve``), so a link inside a granted
root that points outside it grants nothing outside it. Relative roots are never resolved against
the working folder: the runtime resolves the assembly's roots (and those a host asks for) against
the assembly's folder once, when it is built (:func:`resolve_roots`); a relative root or path
left anywhere else lies within nothing, and a saved grant with one is malformed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from loopwright._definition import Capabilities, FileGrants
from loopwright.errors import CapabilityError

__all__ = [
    "NO_GRANTS",
    "capabilities_from_dict",
    "capabilities_to_dict",
    "check_store_outside",
    "intersect",
    "is_within",
    "resolve_roots",
]

_SHELL_ORDER = {"none": 0, "loopApproval": 1, "approval": 2, "allow": 3}
_SHELL_BY_RANK = {v: k for k, v in _SHELL_ORDER.items()}

#: Grants that allow nothing; what a malformed saved grant fails closed to.
NO_GRANTS = Capabilities(agents_max_depth=0, agents_max_agents=0)


def _resolve(path: str | Path, base: Path) -> Path:
    p = Path(path).expanduser()
    return (p if p.is_absolute() else base / p).resolve()


def _absolute(path: str | Path) -> Path | None:
    """Return ``path`` with symlinks resolved, or ``None`` if it is relative (it names no place)."""
    p = Path(path).expanduser()
    return p.resolve() if p.is_absolute() else None


def is_within(path: str | Path, root: str | Path) -> bool:
    """Return whether ``path`` is ``root`` or lies under it, both with symlinks resolved.

    A relative ``path`` or ``root`` is never resolved against the working folder: it lies within
    nothing, and nothing lies within it.
    """
    p, r = _absolute(path), _absolute(root)
    return p is not None and r is not None and (p == r or r in p.parents)


def resolve_roots(caps: Capabilities, base: Path) -> Capabilities:
    """Return ``caps`` with every file root made absolute against ``base`` and its symlinks resolved.

    The runtime calls this once, when it is built, for the assembly's grants (``base`` is the
    assembly's folder) and for grants a host asks for in ``start_agent``, so what is saved in a
    header means the same folder in every process, whatever its working folder.
    """
    files = FileGrants(read=tuple(str(_resolve(r, base)) for r in caps.files.read),
                       write=tuple(str(_resolve(r, base)) for r in caps.files.write))
    return attrs.evolve(caps, files=files)


def _narrow(requested: Iterable[str], allowed: Sequence[str]) -> tuple[str, ...]:
    out = []
    for req in requested:
        resolved = _absolute(req)
        if resolved is not None and any(is_within(resolved, root) for root in allowed):
            out.append(str(resolved))
    return tuple(out)


def intersect(parent: Capabilities, requested: Capabilities | None) -> Capabilities:
    """Return what ``requested`` asks for, narrowed to what ``parent`` holds.

    A requested file root survives only if it lies within one of the parent's roots (read roots
    may lie within read or write roots; write roots only within write roots); a relative root,
    on either side, grants nothing (see :func:`resolve_roots`). Shell access
    takes the stricter mode (``none`` < ``loopApproval`` < ``approval`` < ``allow``), network
    and spawning need both, and the depth and the number of agents (``maxAgents``) are the
    smaller. ``requested=None`` means "all the
    parent holds".
    """
    if requested is None:
        return parent
    readable = parent.files.read + parent.files.write
    files = FileGrants(
        read=_narrow(requested.files.read, readable),
        write=_narrow(requested.files.write, parent.files.write),
    )
    shell = _SHELL_BY_RANK[min(_SHELL_ORDER[parent.shell], _SHELL_ORDER[requested.shell])]
    return Capabilities(
        files=files,
        shell=shell,  # type: ignore[arg-type]
        network=parent.network and requested.network,
        agents_spawn=parent.agents_spawn and requested.agents_spawn,
        agents_max_depth=min(parent.agents_max_depth, requested.agents_max_depth),
        agents_max_agents=min(parent.agents_max_agents, requested.agents_max_agents),
    )


def capabilities_to_dict(caps: Capabilities) -> dict[str, Any]:
    """Return the JSON form of ``caps``: the ``capabilities`` key of an instance header, and the YAML form.

    The one serialiser of grants: the loader's converter (``definition_to_dict``) writes
    capabilities with it too; :func:`capabilities_from_dict`, the one reader, reads it back.
    """
    return {
        "files": {"read": list(caps.files.read), "write": list(caps.files.write)},
        "shell": caps.shell,
        "network": caps.network,
        "agents": {"spawn": caps.agents_spawn, "maxDepth": caps.agents_max_depth,
                   "maxAgents": caps.agents_max_agents},
    }


def capabilities_from_dict(data: Any, *, saved: bool = True) -> Capabilities:
    """Parse the JSON form of grants (:func:`capabilities_to_dict`). Raise ValueError unless it is well formed.

    The one reader of grants: a saved ``capabilities`` entry of an instance header, and (with
    ``saved=False``) the ``capabilities:`` of an assembly or a host's YAML, which the loader's
    converter reads with it. Missing keys take :class:`Capabilities`' defaults.

    :param saved: File roots must be absolute (the runtime saves them resolved): a relative one
        would mean a different folder in a process with another working folder, so it makes a
        saved entry malformed. ``False`` for the YAML form, whose relative roots the runtime
        resolves against the assembly's folder (:func:`resolve_roots`).
    """
    if not isinstance(data, Mapping) or set(data) - {"files", "shell", "network", "agents"}:
        raise ValueError("capabilities must be a mapping of files, shell, network and agents")
    files = data.get("files", {})
    agents = data.get("agents", {})
    if not isinstance(files, Mapping) or not isinstance(agents, Mapping):
        raise ValueError("files and agents must be mappings")  # noqa: TRY004 - as above
    read, write = files.get("read", []), files.get("write", [])
    if not all(isinstance(x, list) and all(isinstance(s, str) for s in x) for x in (read, write)):
        raise ValueError("file roots must be lists of strings")
    relative = [r for r in (*read, *write) if not Path(r).is_absolute()]
    if relative and saved:
        raise ValueError(f"file root {relative[0]!r} is not absolute (saved roots are resolved when granted)")
    shell = data.get("shell", "none")
    if shell not in _SHELL_ORDER:
        raise ValueError(f"unknown shell mode {shell!r}")
    network, spawn = data.get("network", False), agents.get("spawn", False)
    if set(agents) - {"spawn", "maxDepth", "maxAgents"}:
        raise ValueError("agents must be a mapping of spawn, maxDepth and maxAgents")
    depth = agents.get("maxDepth", Capabilities().agents_max_depth)
    # A header saved before maxAgents existed gets the default; a present one must be a count.
    count = agents.get("maxAgents", Capabilities().agents_max_agents)
    if not saved:  # YAML's ``maxDepth: 2.0`` is the integer JSON Schema says it is
        depth, count = (int(n) if isinstance(n, float) and n.is_integer() else n for n in (depth, count))
    if not isinstance(network, bool) or not isinstance(spawn, bool) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (depth, count)):
        raise ValueError(
            "network and agents.spawn must be booleans, agents.maxDepth and agents.maxAgents whole numbers (0 or more)")
    return Capabilities(files=FileGrants(read=tuple(read), write=tuple(write)), shell=shell,
                        network=network, agents_spawn=spawn, agents_max_depth=depth, agents_max_agents=count)


def check_store_outside(store_locations: Iterable[Path], caps: Capabilities, *, base: Path,
                        what: str = "the store") -> None:
    """Raise :class:`CapabilityError` if any granted file root overlaps a store location.

    Record sinks obey the same rule (``what`` names them in the message): an agent that could
    write there could rewrite its transcript, grants or audit trail.
    """
    for loc in store_locations:
        store = _resolve(loc, base)
        for root in caps.files.read + caps.files.write:
            r = _resolve(root, base)
            if store == r or r in store.parents or store in r.parents:
                raise CapabilityError(
                    f"{what} at {store} lies within the granted file root {r} (or contains it); "
                    f"agents must never reach {what}: move it or narrow the grant")

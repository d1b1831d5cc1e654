"""Grants: what an instance may touch, and :func:`intersect`, which never widens them.

Paths are compared after symlinks are resolved (``Path.resolve``), so a link inside a granted
root that points outside it grants nothing outside it. Relative roots are never resolved against
the working folder: the runtime resolves the assembly's roots (and those a host asks for) against
the assembly's folder once, when it is built (:func:`resolve_roots`); a relative root or path
left anywhere else lies within nothing, and a saved grant with one is malformed.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from loopwright._definition import Capabilities, FileGrants, MemoryGrants
from loopwright.errors import CapabilityError

__all__ = [
    "BWRAP_ENV",
    "MAX_SUBJECT",
    "NO_GRANTS",
    "SANDBOX_MODES",
    "bind_memory",
    "capabilities_from_dict",
    "capabilities_to_dict",
    "check_namespace",
    "check_store_outside",
    "check_subject",
    "intersect",
    "is_within",
    "memory_from_dict",
    "narrow_memory",
    "narrow_shell",
    "resolve_roots",
    "sandbox_problem",
]

#: Each shell mode as (who must say yes, sandboxed): 0 nobody, 1 the host's approver, 2 the
#: loop's approval gate. ``none`` is below every mode. Narrowing takes the stricter of each part.
_SHELL_PARTS = {"allow": (0, False), "approval": (1, False), "loopApproval": (2, False),
                "sandbox": (0, True), "sandboxLoopApproval": (2, True)}
_SHELL_BY_PARTS = {v: k for k, v in _SHELL_PARTS.items()}
_SHELL_MODES = ("none", *_SHELL_PARTS)
#: The modes whose commands run in the sandbox (``loopwright_os``): a runtime refuses them where it cannot start.
SANDBOX_MODES = frozenset(mode for mode, (_, sandboxed) in _SHELL_PARTS.items() if sandboxed)

#: The environment variable naming the bubblewrap binary the sandbox runs (default: ``bwrap`` on ``PATH``).
BWRAP_ENV = "LOOPWRIGHT_BWRAP"

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


def narrow_shell(parent: str, requested: str) -> str:
    """Return the stricter of two shell modes: the child's mode under a parent's.

    ``none`` wins over everything. Otherwise the approval is the stricter one (nobody <
    the host's approver < the loop's gate) and the result is sandboxed when either side is, so
    a child of a ``sandbox`` parent is always sandboxed (never ``allow``). A sandboxed mode
    asked for with the host's approver (``approval`` with ``sandbox``) becomes
    ``sandboxLoopApproval``: there is no sandboxed mode with the host's approver.
    """
    if parent == "none" or requested == "none":
        return "none"
    (pa, ps), (ra, rs) = _SHELL_PARTS[parent], _SHELL_PARTS[requested]
    asks, sandboxed = max(pa, ra), ps or rs
    if sandboxed and asks == 1:
        asks = 2
    return _SHELL_BY_PARTS[asks, sandboxed]


#: A memory namespace: 1-64 of letters, digits and ``_.:-``, not starting with ``.``, ``:`` or ``-``.
_NAMESPACE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}")
#: The longest subject, in characters.
MAX_SUBJECT = 256


def check_namespace(name: Any) -> str:
    """Return ``name`` if it is a valid memory namespace; raise ValueError naming the rule otherwise."""
    if not isinstance(name, str) or _NAMESPACE.fullmatch(name) is None:
        raise ValueError(f"{name!r} is not a memory namespace: 1-64 of letters, digits and _.:- "
                         "(starting with a letter, digit or _)")
    return name


def check_subject(subject: Any) -> str:
    """Return ``subject`` if it is a valid memory subject; raise ValueError naming the rule otherwise.

    A subject is 1-256 characters, none of them a control character.
    """
    if not isinstance(subject, str) or not subject or len(subject) > MAX_SUBJECT \
            or any(ord(c) < 32 or ord(c) == 127 for c in subject):  # noqa: PLR2004 - the C0 controls and DEL
        raise ValueError(f"{str(subject)[:40]!r} is not a memory subject: 1-{MAX_SUBJECT} characters, "
                         "no control characters")
    return subject


def narrow_memory(parent: MemoryGrants, requested: MemoryGrants) -> MemoryGrants:
    """Return the memory grants ``requested`` asks for, narrowed to ``parent``'s (never wider).

    A namespace survives only if the parent may do the same with it (read within read, write
    within write: writing never grants reading). A parent bound to a subject keeps it: a
    request for another subject gets no namespace at all (fail closed), one for none or the
    same gets the parent's subject. An unbound parent (the assembly's grant) takes the
    requested subject.
    """
    subject = parent.subject if parent.subject is not None else requested.subject
    if parent.subject is not None and requested.subject not in (None, parent.subject):
        return MemoryGrants(subject=parent.subject)
    return MemoryGrants(subject=subject, read=tuple(n for n in requested.read if n in parent.read),
                        write=tuple(n for n in requested.write if n in parent.write))


def bind_memory(grants: Capabilities, spec: Any, subject: str | None) -> Capabilities:
    """Return the grants of a new instance whose definition's ``memory:`` is ``spec``.

    Without ``spec`` the instance gets no memory (nor do its children). With one, its memory
    grants are narrowed (:func:`narrow_memory`) to what it asks for: ``spec.read``,
    ``spec.write`` and ``subject`` (``spec.subject`` rendered from the instance's inputs).
    ``grants`` itself is returned when nothing changes.

    :param spec: A :class:`~loopwright._definition.MemorySpec`, or ``None``.
    :raises ValueError: ``subject`` breaks :func:`check_subject`'s rule.
    """
    if spec is None:
        return grants if grants.memory == MemoryGrants() else attrs.evolve(grants, memory=MemoryGrants())
    asked = MemoryGrants(subject=None if subject is None else check_subject(subject), read=tuple(spec.read),
                         write=tuple(spec.write))
    bound = narrow_memory(grants.memory, asked)
    return grants if bound == grants.memory else attrs.evolve(grants, memory=bound)


def intersect(parent: Capabilities, requested: Capabilities | None) -> Capabilities:
    """Return what ``requested`` asks for, narrowed to what ``parent`` holds.

    A requested file root survives only if it lies within one of the parent's roots (read roots
    may lie within read or write roots; write roots only within write roots); a relative root,
    on either side, grants nothing (see :func:`resolve_roots`). Shell access
    takes the stricter mode (:func:`narrow_shell`: ``none`` < ``loopApproval`` < ``approval`` <
    ``allow``, and sandboxed when either side is), network
    and spawning need both, the depth and the number of agents (``maxAgents``) are the
    smaller, and memory is narrowed by :func:`narrow_memory`. ``requested=None`` means "all the
    parent holds".
    """
    if requested is None:
        return parent
    readable = parent.files.read + parent.files.write
    files = FileGrants(
        read=_narrow(requested.files.read, readable),
        write=_narrow(requested.files.write, parent.files.write),
    )
    shell = narrow_shell(parent.shell, requested.shell)
    return Capabilities(
        files=files,
        shell=shell,  # type: ignore[arg-type]
        network=parent.network and requested.network,
        agents_spawn=parent.agents_spawn and requested.agents_spawn,
        agents_max_depth=min(parent.agents_max_depth, requested.agents_max_depth),
        agents_max_agents=min(parent.agents_max_agents, requested.agents_max_agents),
        memory=narrow_memory(parent.memory, requested.memory),
    )


def capabilities_to_dict(caps: Capabilities) -> dict[str, Any]:
    """Return the JSON form of ``caps``: the ``capabilities`` key of an instance header, and the YAML form.

    The one serialiser of grants: the loader's converter (``definition_to_dict``) writes
    capabilities with it too; :func:`capabilities_from_dict`, the one reader, reads it back.
    ``memory`` is written only when it grants something, so the grants of instances without
    memory are saved as before it existed.
    """
    out: dict[str, Any] = {
        "files": {"read": list(caps.files.read), "write": list(caps.files.write)},
        "shell": caps.shell,
        "network": caps.network,
        "agents": {"spawn": caps.agents_spawn, "maxDepth": caps.agents_max_depth,
                   "maxAgents": caps.agents_max_agents},
    }
    memory = caps.memory
    if memory != MemoryGrants():
        out["memory"] = {"subject": memory.subject, "read": list(memory.read), "write": list(memory.write)}
    return out


def memory_from_dict(data: Any) -> MemoryGrants:
    """Parse the ``memory`` entry of grants; raise ValueError unless it is well formed.

    ``{subject, read, write}``: ``subject`` a non-empty string or null, ``read`` and ``write``
    lists of namespaces (:func:`loopwright.memory.check_namespace`'s rule). Missing keys take
    the defaults (nothing granted).
    """
    if not isinstance(data, Mapping) or set(data) - {"subject", "read", "write"}:
        raise ValueError("memory must be a mapping of subject, read and write")
    subject = data.get("subject")
    if subject is not None:
        check_subject(subject)
    lists = []
    for key in ("read", "write"):
        value = data.get(key, [])
        if not isinstance(value, list):
            raise ValueError(f"memory.{key} must be a list of namespaces")  # noqa: TRY004 - a ValueError, as above
        for name in value:
            check_namespace(name)
        lists.append(tuple(dict.fromkeys(value)))
    return MemoryGrants(subject=subject, read=lists[0], write=lists[1])


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
    if not isinstance(data, Mapping) or set(data) - {"files", "shell", "network", "agents", "memory"}:
        raise ValueError("capabilities must be a mapping of files, shell, network, agents and memory")
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
    if shell not in _SHELL_MODES:
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
    memory = memory_from_dict(data["memory"]) if "memory" in data else MemoryGrants()
    return Capabilities(files=FileGrants(read=tuple(read), write=tuple(write)), shell=shell,
                        network=network, agents_spawn=spawn, agents_max_depth=depth, agents_max_agents=count,
                        memory=memory)


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


def sandbox_problem() -> str | None:
    """Return why the sandboxed shell cannot start on this machine, or ``None`` when it can.

    The check runs a command the way ``loopwright_os`` runs one (bubblewrap, every namespace
    new, a user namespace without capabilities, no network), so "it can" means it just did. The
    binary is :data:`BWRAP_ENV` when set (used as given, never looked up elsewhere), else ``bwrap``
    on ``PATH``. A runtime whose grants name a sandboxed mode refuses to open with this reason:
    a command is never run unsandboxed instead. The answer is kept for the process's lifetime,
    per binary.
    """
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (bubblewrap and namespaces); this is {sys.platform}"
    given = os.environ.get(BWRAP_ENV)
    path = given or shutil.which("bwrap")
    if not path:
        return ("bubblewrap is not installed (no `bwrap` on PATH): install Debian's `bubblewrap` package, "
                f"or set {BWRAP_ENV} to its path")
    return _probe(path, given is not None)


@functools.cache
def _probe(path: str, given: bool) -> str | None:
    where = f"{path} (from {BWRAP_ENV})" if given else path
    if not Path(path).is_file() or not os.access(path, os.X_OK):
        return f"bubblewrap {where} is not an executable file"
    if shutil.which("prlimit", path="/usr/bin:/bin") is None:
        return "the sandbox sets its limits with util-linux's `prlimit`, which is not in /usr/bin or /bin"
    argv = [path, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", "1000", "--gid", "1000",
            "--cap-drop", "ALL", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp",  # noqa: S108 - the sandbox's own tmpfs, not the host's
            "--clearenv", "--", "/bin/sh", "-c", "exit 0"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=20, check=False, stdin=subprocess.DEVNULL)  # noqa: S603 - a fixed argv
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap {where} could not run: {exc}"
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", errors="replace").strip() or f"exit code {done.returncode}"
        return (f"bubblewrap {where} cannot start a sandbox here ({why}); it needs unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0) and network namespaces")
    return None

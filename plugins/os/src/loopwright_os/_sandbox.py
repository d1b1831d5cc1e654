"""The sandbox of ``shell: sandbox``: one bubblewrap sandbox per command, built from the caller's grants.

What a sandboxed command sees and may do (every point is enforced by the kernel, not by us):

* **Files.** A fresh mount namespace whose root is an empty tmpfs. The system's ``/usr`` (and
  ``/bin``, ``/sbin``, ``/lib*`` as the host has them: links into ``/usr`` or read-only binds) is
  bound read-only; ``/proc`` is a new procfs of the sandbox's own pid namespace, without
  ``/proc/sys``, ``/proc/sysrq-trigger`` and the other interfaces of :data:`_PROC_DIRS` and
  :data:`_PROC_FILES`; ``/dev`` holds
  only the harmless devices (null, zero, full, random, urandom, tty); ``/tmp`` and ``/dev/shm``
  are private tmpfs mounts of :attr:`SandboxSettings.tmp_bytes` each; the root and ``/dev``
  themselves are read-only. Each read root is bound read-only and each write root
  read-write, at its own path, after symlinks are resolved exactly as the file tools resolve
  them (a link inside a root that points elsewhere leads to a path the sandbox does not have).
  Nothing else of the host exists inside: not ``/etc``, not ``/home``, not the store.
* **The store and the record sinks** are never inside: :func:`plan_sandbox` refuses to build a
  sandbox in which one of their locations would be visible through any bind.
* **Network.** A new, empty network namespace (only a loopback of its own) unless the grant says
  ``network: true``; then the host's network, with ``/etc/resolv.conf``, ``/etc/hosts``,
  ``/etc/nsswitch.conf`` and the CA certificates bound read-only so names and TLS work.
* **Identity.** A new user namespace in which the command runs as uid/gid 1000 with no
  capabilities at all, and may not create user namespaces of its own (``--disable-userns``).
  New pid, IPC, UTS and cgroup namespaces: it sees only its own processes.
* **Environment.** Cleared: ``PATH``, ``HOME`` (the working folder), ``TMPDIR`` and ``LANG``,
  plus the variables the assembly names in ``pluginSettings.os.sandbox.env``, which may not
  look like secrets (``*API_KEY*``, ``*SECRET*``, ``*TOKEN*``, ``*PASSWORD*``).
* **Limits** (:class:`SandboxSettings`), set with ``prlimit`` inside the sandbox, as hard limits
  it cannot raise: CPU seconds, address space and largest file per process, no core files. The
  number of processes is bounded twice: ``RLIMIT_NPROC`` (which the kernel does not apply to
  uid 0, so it holds only where the runtime is not root) and a watchdog that counts the
  processes of the sandbox's pid namespace and, past the bound, kills the namespace's first
  process, which makes the kernel kill every process in it. Output past
  :attr:`SandboxSettings.output_bytes` and the wall-time limit stop the command the same way.

This module builds the command line; :mod:`loopwright_os._shell` runs it.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from loopwright.capabilities import BWRAP_ENV, SANDBOX_MODES, sandbox_problem
from loopwright.errors import ToolError

if TYPE_CHECKING:
    from loopwright import Capabilities

__all__ = [
    "SANDBOX_GID",
    "SANDBOX_MODES",
    "SANDBOX_UID",
    "SandboxPlan",
    "SandboxSettings",
    "bwrap_path",
    "plan_sandbox",
    "sandbox_settings",
]

#: The uid and gid a sandboxed command runs as inside its user namespace (never 0: no capabilities).
SANDBOX_UID = 1000
SANDBOX_GID = 1000

#: The system folders bound read-only (or linked, when the host links them into ``/usr``).
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: What a command needs of ``/etc`` to reach the network, bound only when the grant allows it.
_NETWORK_ETC = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates",
                "/etc/gai.conf")
#: What of the sandbox's own /proc is hidden: kernel interfaces that check only that the writer's
#: uid is root's, not a capability. Run by root, the sandbox's uid 1000 *is* root's uid outside
#: its user namespace, so without these masks a command could write the host's sysctls
#: (``/proc/sys/kernel/core_pattern``: code run as root) or ``/proc/sysrq-trigger``. Folders get a
#: read-only 4 KiB tmpfs over them, files ``/dev/null`` (bubblewrap itself covers /proc/irq and /proc/bus).
_PROC_DIRS = ("sys", "fs", "acpi", "scsi", "asound", "driver")
_PROC_FILES = ("sysrq-trigger", "kcore", "kmsg", "timer_list", "timer_stats", "sched_debug", "latency_stats",
               "kallsyms", "keys", "key-users")
_SECRET = re.compile(r"API_?KEY|SECRET|TOKEN|PASSWORD|PASSWD", re.IGNORECASE)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The sandbox's own ``/tmp``: a private tmpfs, not the host's.
_TMP = "/tmp"  # noqa: S108
_SHM = "/dev/shm"  # noqa: S108


@attrs.frozen(kw_only=True)
class SandboxSettings:
    """The limits and the environment of sandboxed commands (``pluginSettings.os.sandbox``).

    Attributes:
        env: Names of host environment variables passed on (absent ones are left out).
        cpu_seconds: CPU seconds each process may use (RLIMIT_CPU).
        memory_bytes: Address space of each process (RLIMIT_AS).
        processes: Processes a command may run at once, itself included.
        output_bytes: Bytes of stdout plus stderr read before the command is stopped.
        tmp_bytes: Size of the private ``/tmp``.
        file_bytes: Largest file a process may write (RLIMIT_FSIZE).
    """

    env: tuple[str, ...] = ()
    cpu_seconds: int = 60
    memory_bytes: int = 2 * 1024**3
    processes: int = 64
    output_bytes: int = 8 * 1024**2
    tmp_bytes: int = 64 * 1024**2
    file_bytes: int = 256 * 1024**2


_KEYS = {"env": "env", "cpuSeconds": "cpu_seconds", "memoryBytes": "memory_bytes", "processes": "processes",
         "outputBytes": "output_bytes", "tmpBytes": "tmp_bytes", "fileBytes": "file_bytes"}


def sandbox_settings(os_settings: Mapping[str, Any] | None) -> SandboxSettings:
    """Read ``pluginSettings.os.sandbox``; raise ValueError naming the key that is wrong.

    The assembly's schema checks the types; this also refuses passing on a variable whose name
    looks like a secret: a provider key must never reach a sandboxed command.
    """
    raw = (os_settings or {}).get("sandbox") or {}
    if not isinstance(raw, Mapping) or set(raw) - set(_KEYS):
        raise ValueError(f"pluginSettings.os.sandbox takes only {', '.join(sorted(_KEYS))}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "env":
            if not isinstance(value, list) or not all(isinstance(n, str) and _NAME.match(n) for n in value):
                raise ValueError("pluginSettings.os.sandbox.env must be a list of environment variable names")
            secret = [n for n in value if _SECRET.search(n)]
            if secret:
                raise ValueError(f"pluginSettings.os.sandbox.env names {secret[0]!r}, which looks like a secret "
                                 "(API_KEY, SECRET, TOKEN, PASSWORD): secrets are never passed to a sandbox")
            values["env"] = tuple(value)
        elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"pluginSettings.os.sandbox.{key} must be a positive whole number")
        else:
            values[_KEYS[key]] = value
    return SandboxSettings(**values)


@attrs.frozen(kw_only=True)
class SandboxPlan:
    """A command ready to run in its sandbox.

    Attributes:
        argv: The whole command line: bubblewrap, its options, ``prlimit`` and ``/bin/sh -c COMMAND``.
        env: The environment bubblewrap itself gets (it clears it for the command).
        workdir: The working folder inside the sandbox (the first write root, else ``/tmp``).
        reads: The read roots bound read-only, resolved.
        writes: The write roots bound read-write, resolved.
        settings: The limits it runs under.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str
    reads: tuple[Path, ...]
    writes: tuple[Path, ...]
    settings: SandboxSettings


def bwrap_path() -> str:
    """Return the bubblewrap binary to run, or raise ToolError saying why the sandbox cannot start.

    Fails closed: whatever makes :func:`loopwright.capabilities.sandbox_problem` answer (no
    bubblewrap, no user namespaces, not Linux) is an error here, never an unsandboxed run.
    """
    problem = sandbox_problem()
    if problem is not None:
        raise ToolError(f"the sandbox cannot start on this machine, so the command was not run: {problem}")
    path = os.environ.get(BWRAP_ENV) or shutil.which("bwrap")
    assert path is not None  # noqa: S101 - sandbox_problem found it
    return path


def _resolve(path: str | Path, base: Path) -> Path:
    """Make ``path`` absolute against ``base`` and resolve its symlinks, as the file tools do."""
    p = Path(path).expanduser()
    return (p if p.is_absolute() else base / p).resolve()


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def _system_binds() -> list[str]:
    """Return the options that give the sandbox the host's ``/usr`` and its ``/bin``, ``/lib`` ... as they are."""
    out: list[str] = []
    for name in _SYSTEM:
        p = Path(name)
        if p.is_symlink():
            out += ["--symlink", str(p.readlink()), name]
        elif p.is_dir():
            out += ["--ro-bind", name, name]
    return out


def _proc_masks() -> list[str]:
    """Return the options that hide :data:`_PROC_DIRS` and :data:`_PROC_FILES` (those this kernel has)."""
    out: list[str] = []
    for name in _PROC_DIRS:
        if Path("/proc", name).is_dir():
            out += ["--perms", "0555", "--size", "4096", "--tmpfs", f"/proc/{name}"]
    for name in _PROC_FILES:
        if Path("/proc", name).exists():
            out += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    return out


def _roots(grants: Capabilities, base: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """Return the existing read roots (those not inside a write root) and write roots, resolved."""
    writes = tuple(dict.fromkeys(p for p in (_resolve(r, base) for r in grants.files.write) if p.exists()))
    reads = tuple(dict.fromkeys(
        p for p in (_resolve(r, base) for r in grants.files.read)
        if p.exists() and not any(p == w or w in p.parents for w in writes)))
    return reads, writes


def _check_private(private: Iterable[tuple[str, Path]], binds: Iterable[Path], base: Path) -> None:
    """Raise ToolError if a store or record-sink location would be visible through one of ``binds``."""
    binds = tuple(binds)
    for what, loc in private:
        where = _resolve(loc, base)
        for bind in binds:
            if _overlaps(where, bind):
                raise ToolError(f"refusing to start the sandbox: {what} at {where} would be visible in it "
                                f"through {bind}; the command was not run")


def _environment(settings: SandboxSettings, workdir: str, environ: Mapping[str, str]) -> list[str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": _TMP, "LANG": "C.UTF-8"}
    for name in settings.env:
        if name in environ and name not in env:
            env[name] = environ[name]
    out = ["--clearenv"]
    for name, value in env.items():
        out += ["--setenv", name, value]
    return out


def plan_sandbox(
    command: str | Sequence[str], grants: Capabilities, *, base: Path, private: Iterable[tuple[str, Path]],
    settings: SandboxSettings, environ: Mapping[str, str] | None = None, binds: Sequence[str | Path] = (),
) -> SandboxPlan:
    """Return how to run ``command`` in a sandbox confined to ``grants``.

    :param command: A shell command line (run as ``/bin/sh -c COMMAND``), or a program and its
        arguments (run as they are; the program must be inside the sandbox: under ``/usr``, a
        root, or ``binds``).
    :param base: The folder relative roots are resolved against (the assembly's).
    :param binds: More folders (or files) bound read-only, resolved like roots: what a tool's own
        program needs (its code), chosen by the host or a plugin, never by a model.
    :param private: ``(what, location)`` pairs that must not be visible in the sandbox: the
        store's locations and the record sinks'.
    :param environ: Where the names of ``settings.env`` are looked up (default: ``os.environ``).
    :raises ToolError: The sandbox cannot start here, or a private location would be visible.
    """
    bwrap = bwrap_path()
    reads, writes = _roots(grants, base)
    network = grants.network
    etc = [Path(p).resolve() for p in _NETWORK_ETC if Path(p).exists()] if network else []
    system = [Path(p).resolve() for p in _SYSTEM if Path(p).is_dir() and not Path(p).is_symlink()]
    extra = tuple(p for p in (_resolve(b, base) for b in binds) if p.exists())
    _check_private(private, (*system, *etc, *reads, *writes, *extra), base)
    workdir = next((str(w) for w in writes if w.is_dir()), _TMP)
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_GID), "--cap-drop", "ALL", "--die-with-parent", "--new-session",
            "--hostname", "sandbox", *_system_binds(), "--proc", "/proc", *_proc_masks(), "--dev", "/dev",
            "--size", str(settings.tmp_bytes), "--tmpfs", _TMP,
            "--size", str(settings.tmp_bytes), "--tmpfs", _SHM]
    if network:
        argv.append("--share-net")
        for name in _NETWORK_ETC:
            if Path(name).exists():
                argv += ["--ro-bind", name, name]
    # Parents first, so that a root inside another is mounted over it and keeps its own mode.
    mounts = [(p, "--ro-bind") for p in extra] + [(p, "--ro-bind") for p in reads] + [(p, "--bind") for p in writes]
    for path, option in sorted(mounts, key=lambda item: len(item[0].parts)):
        argv += [option, str(path), str(path)]
    # The root and /dev are tmpfs mounts without a size: read-only, so that only /tmp, /dev/shm
    # (both bounded) and the write roots can be written.
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    argv += ["--chdir", workdir, *_environment(settings, workdir, os.environ if environ is None else environ)]
    s = settings
    argv += ["--", "/usr/bin/prlimit" if Path("/usr/bin/prlimit").exists() else "/bin/prlimit",
             f"--cpu={s.cpu_seconds}:{s.cpu_seconds}", f"--as={s.memory_bytes}:{s.memory_bytes}",
             f"--fsize={s.file_bytes}:{s.file_bytes}", f"--nproc={s.processes}:{s.processes}", "--core=0:0",
             "--", *(("/bin/sh", "-c", command) if isinstance(command, str) else command)]
    return SandboxPlan(argv=tuple(argv), env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, workdir=workdir,
                       reads=reads, writes=writes, settings=settings)

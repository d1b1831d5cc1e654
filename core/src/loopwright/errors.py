"""Every exception loopwright raises, each carrying the context needed to act on it.

The tree::

    LoopwrightError                  base of everything below
    ├── ConfigError                  a YAML file or a setting is wrong (.path, .problems)
    ├── PluginError                  a plugin could not load or broke a rule (.plugin_name)
    │   └── RegistrationError        a component name was registered twice (.name, .first, .second)
    ├── ProviderError                a model call failed (.provider, .status, .body, .retry_after, .transient)
    ├── StoreError                   the instance store failed or holds bad data (.instance_id)
    │   ├── InstanceNotFoundError    no instance with that id (.instance_id)
    │   ├── InstanceLockedError      another process is running the instance (.instance_id, .holder)
    │   ├── LeaseLostError           this runner's lease was taken over: its write was refused (.instance_id)
    │   ├── StoreUnavailableError    the store stayed unreachable past its outage tolerance (.instance_id)
    │   └── GrantsError              saved grants are malformed: fail closed (.instance_id)
    ├── ApprovalDigestMismatchError  a decision's digest is not the pending call's
    │                                (.instance_id, .tool_call_id, .current_digest)
    ├── CapabilityError              a grant would widen, or the store lies in an agent's reach
    ├── RunError                     a run ended in the ``error`` state (.result)
    │   └── HookBlockedError         a before_inference hook blocked the model call (.hook, .reason)
    ├── ToolError                    raised *by a tool* to report a failure to the model (status tool_error)
    └── ControlFlow                  not failures: signals that steer a run
        ├── RunCancelledError        the run was cancelled; the instance is stopped and kept (.result)
        └── ToolCallDenied           raised *by a tool* whose approver refused the call (status denied)

A tool raising :class:`ToolError` gives the model its message with status ``tool_error``; any other
exception from a tool gives ``tool_failed``. Neither ends the run.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from loopwright._types import AgentResult

__all__ = [
    "ApprovalDigestMismatchError",
    "CapabilityError",
    "ConfigError",
    "ConfigProblem",
    "ControlFlow",
    "GrantsError",
    "HookBlockedError",
    "InstanceLockedError",
    "InstanceNotFoundError",
    "LeaseLostError",
    "LoopwrightError",
    "PluginError",
    "ProviderError",
    "RegistrationError",
    "RowIntegrityError",
    "RunCancelledError",
    "RunError",
    "StoreError",
    "StoreUnavailableError",
    "ToolCallDenied",
    "ToolError",
    "UnloadableInstanceError",
    "shown_path",
]


def shown_path(path: str | os.PathLike[str]) -> str:
    """Return how every loopwright message names a file: the one form of path in errors.

    A file beneath the working directory is named relative to it (``agents/a.yaml``, never
    ``./agents/a.yaml`` or ``/home/me/project/agents/a.yaml``); any other file by its absolute
    path. The path is made absolute without resolving symlinks (the name the user wrote, not
    where it points); text that names no file (``<data>``, ``<text>``) is returned unchanged.
    """
    text = os.fspath(path)
    if not text or text.startswith("<"):
        return text
    absolute = os.path.abspath(text)  # noqa: PTH100 - not resolve(): symlinks stay as the user named them
    try:
        here = os.getcwd()  # noqa: PTH109 - a str, as abspath's
    except OSError:  # the working directory was removed
        return absolute
    if absolute == here or absolute.startswith(here.rstrip(os.sep) + os.sep):
        return os.path.relpath(absolute, here)
    return absolute


class LoopwrightError(Exception):
    """Base class of every loopwright exception."""


class ConfigProblem:
    """One problem found in a configuration file.

    Attributes:
        file: The file's path as given, or ``None`` for data that came from Python; the message
            names it by :func:`shown_path`.
        line: 1-based line, or ``None`` when the position is unknown.
        column: 1-based column, or ``None`` when the position is unknown.
        path: A JSON path such as ``$.providers.default.baseUrl``.
        message: What is wrong, in a sentence.
    """

    __slots__ = ("column", "file", "line", "message", "path")

    def __init__(
        self, message: str, *, file: str | None = None, line: int | None = None,
        column: int | None = None, path: str = "$",
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.path = path

    def __str__(self) -> str:
        where = shown_path(self.file) if self.file else "<data>"
        if self.line is not None:
            where += f":{self.line}:{self.column or 1}"
        return f"{where}: {self.message} @ {self.path}"

    def __repr__(self) -> str:
        return f"ConfigProblem({self!s})"


class ConfigError(LoopwrightError):
    """A configuration file or value is invalid.

    Attributes:
        path: The file that was being read, if any.
        problems: Every problem found, each with file, line, column and JSON path.
    """

    def __init__(self, message: str, *, path: str | None = None,
                 problems: Sequence[ConfigProblem] = ()) -> None:
        self.path = path
        self.problems = tuple(problems)
        text = message
        if self.problems:
            text += "\n" + "\n".join(f"  {p}" for p in self.problems)
        super().__init__(text)


class PluginError(LoopwrightError):
    """A plugin failed to load or broke a plugin rule.

    Attributes:
        plugin_name: The plugin's registered name.
    """

    def __init__(self, message: str, *, plugin_name: str | None = None) -> None:
        self.plugin_name = plugin_name
        super().__init__(f"plugin {plugin_name!r}: {message}" if plugin_name else message)


class RegistrationError(PluginError):
    """A component name was registered twice.

    Attributes:
        kind: What was registered (``provider``, ``tool``, ``store`` ...).
        name: The contested name.
        first: The plugin that registered it first.
        second: The plugin that tried to register it again.
    """

    def __init__(self, *, kind: str, name: str, first: str, second: str) -> None:
        self.kind = kind
        self.name = name
        self.first = first
        self.second = second
        super().__init__(
            f"{kind} {name!r} is registered by both {first!r} and {second!r}", plugin_name=second,
        )


class ProviderError(LoopwrightError):
    """A model call failed.

    Attributes:
        provider: The provider's name in the assembly (or its kind).
        model: The model that was asked.
        status: The HTTP status, or ``None`` for transport failures.
        body: The response body, truncated to 2,000 characters.
        retry_after: Seconds the server asked us to wait, if it said.
        transient: Whether retrying may help (408, 429, 5xx, timeouts, resets).
        request: The ``httpx.Request`` when there was one.
    """

    def __init__(
        self, message: str, *, provider: str, model: str | None = None, status: int | None = None,
        body: str | None = None, retry_after: float | None = None, transient: bool = False,
        request: Any = None,
    ) -> None:
        self.provider = provider
        self.model = model
        self.status = status
        self.body = body[:2000] if body else body
        self.retry_after = retry_after
        self.transient = transient
        self.request = request
        where = f"{provider}:{model}" if model else provider
        status_text = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"{where}{status_text}: {message}")


class StoreError(LoopwrightError):
    """The instance store failed or holds data that cannot be used.

    Attributes:
        instance_id: The instance concerned, if any.
    """

    def __init__(self, message: str, *, instance_id: str | None = None) -> None:
        self.instance_id = instance_id
        super().__init__(f"instance {instance_id}: {message}" if instance_id else message)


class InstanceNotFoundError(StoreError):
    """No instance with that id exists in the store."""

    def __init__(self, instance_id: str) -> None:
        super().__init__("not found", instance_id=instance_id)


class InstanceLockedError(StoreError):
    """Another runner holds the instance ("running elsewhere").

    Attributes:
        holder: A description of the holder (host and pid) when known.
    """

    def __init__(self, instance_id: str, holder: str | None = None) -> None:
        self.holder = holder
        by = f" by {holder}" if holder else ""
        super().__init__(f"is running elsewhere{by}", instance_id=instance_id)


class LeaseLostError(StoreError):
    """The runner's lease on the instance is no longer its own: the store refused the write.

    A store that fences (the postgres store) checks, in the same statement as every write to an
    instance whose lease it holds, that the lease is still the one it took; when another runner
    took the instance over meanwhile (this one was cut off from the database for longer than the
    lease lasts), nothing is written and this is raised. The runtime then ends the segment
    without changing the instance's state: the instance belongs to its new runner.
    """


class StoreUnavailableError(StoreError):
    """The store could not be reached, and kept failing for longer than its outage tolerance.

    Raised by a store that rides out outages (the postgres store retries with backoff for
    ``outageTolerance`` seconds). Transient by nature: the runtime ends the segment without
    changing the instance's state (it stays as last saved, for any worker to pick up again),
    and a worker backs off and retries instead of exiting.
    """


class UnloadableInstanceError(StoreError):
    """A saved instance cannot be loaded as saved: its row is malformed or was tampered with.

    Raised when loading a saved instance (:meth:`loopwright.Runtime.get_agent`) finds a header
    whose definition, grants or gates are invalid, an entry log that cannot be replayed, or (when
    a worker picks it up) a definition this runtime cannot run. The instance fails closed: nothing
    of it runs. A worker quarantines it (``quarantined`` is then true): the instance is saved in
    state ``error`` with a ``quarantined:`` error naming the reason, no worker takes it again,
    and the worker goes on serving the others.

    Attributes:
        reason: What is wrong with the row, without the instance prefix.
        quarantined: The instance was saved in state ``error`` for it.
    """

    def __init__(self, message: str, *, instance_id: str | None = None, quarantined: bool = False) -> None:
        self.reason = message
        self.quarantined = quarantined
        super().__init__(message, instance_id=instance_id)


class GrantsError(UnloadableInstanceError):
    """Saved grants are marked as recorded but are missing or malformed; the instance fails closed."""


class RowIntegrityError(UnloadableInstanceError):
    """A saved row's signature is missing or does not verify, under an assembly with ``integrity.keyEnv``.

    What the runtime saves of an instance's definition, grants and gates is signed when the
    assembly names an integrity key (docs/security.md); a row whose signature does not verify
    was changed since, or signed with another key, and fails closed: nothing of it runs.
    """


class ApprovalDigestMismatchError(LoopwrightError):
    """A decision carried a digest that is not the pending call's: nothing was decided, nothing ran (issue 25).

    Attributes:
        instance_id: The instance holding the call.
        tool_call_id: The call's id.
        current_digest: :func:`~loopwright._types.approval_digest` of the call pending now.
    """

    def __init__(self, message: str, *, instance_id: str, tool_call_id: str, current_digest: str) -> None:
        """Carry the instance, the call and the digest a retry must name."""
        super().__init__(message)
        self.instance_id = instance_id
        self.tool_call_id = tool_call_id
        self.current_digest = current_digest


class CapabilityError(LoopwrightError):
    """A grant would widen, or an agent could reach the store."""


class RunError(LoopwrightError):
    """A run ended in the ``error`` state after the model failed for good.

    Attributes:
        result: The saved :class:`~loopwright.AgentResult` of the instance.
        cause: The underlying exception (for example a :class:`ProviderError`).
    """

    def __init__(self, message: str, *, result: AgentResult | None = None,
                 cause: BaseException | None = None) -> None:
        self.result = result
        self.cause = cause
        super().__init__(message)


class HookBlockedError(RunError):
    """A ``before_inference`` hook returned :class:`~loopwright.Block`.

    Attributes:
        hook: The plugin name of the blocking hook.
        reason: The reason it gave.
    """

    def __init__(self, *, hook: str, reason: str, result: AgentResult | None = None) -> None:
        self.hook = hook
        self.reason = reason
        super().__init__(f"hook {hook!r} blocked the model call: {reason}", result=result)


class ToolError(LoopwrightError):
    """Raise from a tool to report a failure the model should read (status ``tool_error``)."""


class ControlFlow(LoopwrightError):  # noqa: N818 - a branch of signals, not an error
    """Base of exceptions that steer a run rather than report a failure."""


class ToolCallDenied(ControlFlow):
    """Raise from a tool when the host's own approver refuses the call (``shell: approval``).

    The model gets a ``denied`` result reading ``denied: <message>``, as for a call denied through
    the loop's approval gate.
    """


class RunCancelledError(ControlFlow):
    """The run was cancelled. The instance is ``stopped`` with ``cancelled: true`` and can be resumed.

    Attributes:
        result: The instance's result at the moment it was cancelled.
    """

    def __init__(self, message: str = "run cancelled", *, result: AgentResult | None = None) -> None:
        self.result = result
        super().__init__(message)

"""What the agents layer sees of the runtime: the :class:`AgentHost` protocol.

:class:`~loopwright._agents.Agents` (the agent tools' view, one per call) and
:class:`~loopwright._monitors.Monitors` (one per runtime) are handed an object of this shape,
never the runtime class: the runtime satisfies it, and so can a test double. It names only
what they use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import os
    from collections.abc import Mapping

    from loopwright._definition import Assembly, Capabilities, Definition, Limits
    from loopwright._header_fields import ChildLinks
    from loopwright._instance import Instance
    from loopwright._monitors import Monitors
    from loopwright._run import AgentRun
    from loopwright.abc import Store

__all__ = ["AgentHost"]


class AgentHost(Protocol):
    """The runtime as the agent tools and the monitors use it.

    Attributes:
        assembly: The runtime's assembly (its registered definitions, folder and reach rule).
        store: The runtime's store.
        owner: Who runs instances here (a lease's owner).
        awaiting: The agents each instance running here waits for in ``await_agent``, by id.
        monitors: The runtime's monitors.
    """

    assembly: Assembly
    store: Store
    owner: str
    awaiting: dict[str, tuple[str, ...]]
    monitors: Monitors

    def known_run(self, instance_id: str) -> AgentRun | None:
        """Return the run of an instance this runtime holds now, if any (no store access)."""

    async def get_agent(self, instance_id: str) -> AgentRun:
        """Return the run of an instance, loading it from the store if needed."""

    async def resume(self, instance_id: str) -> AgentRun:
        """Continue an instance a crash left ``running``."""

    async def create_run(self, defn: Definition, inputs: Mapping[str, Any] | None, prompt: str | None, *,
                         grants: Capabilities, instance_id: str | None = None,
                         links: ChildLinks | None = None, spawner: Instance | None = None,
                         registered: str | None = None) -> AgentRun:
        """Create an instance with exactly ``grants`` (and the id ``instance_id``, if given) and start it."""

    def registered_name(self, definition: object) -> str | None:
        """Return ``definition`` if it names a definition registered in the assembly."""

    def load_definition(self, definition: str | os.PathLike[str]) -> Definition:
        """Load a registered or file definition."""

    def check_untrusted(self, definition: Definition) -> None:
        """Check that a definition names code only by registered name."""

    def tool_names(self, definition: Definition, grants: Capabilities | None = None) -> list[str]:
        """Return the names of the definition's tools that ``grants`` make available."""

    def limits_for(self, definition: Definition) -> Limits:
        """Return a definition's effective limits."""

    def limits_of(self, inst: Instance) -> Limits:
        """Return an instance's own limits (capped by its budget)."""

    async def subtree_cost(self, instance_id: str) -> float | None:
        """Return an instance's cost plus that of every agent below it."""

    def queue_record(self, instance_id: str, kind: str, data: Mapping[str, Any]) -> None:
        """Queue a record, written with the next save."""

    async def write_header(self, inst: Instance) -> None:
        """Save an instance's header."""

"""What the A2A and AG-UI surfaces share: protocol ids as instance ids, and their gated responses.

A protocol session (an A2A task or context, an AG-UI thread) *is* a loopwright instance: its id
is the instance id. Only top-level instances of the surface's own definition can be reached so.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

from loopwright import HeaderFields, is_instance_id
from loopwright.errors import InstanceNotFoundError

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.responses import Response
    from starlette.types import Receive, Scope, Send

    from loopwright_serve._context import StreamGate

__all__ = ["GatedResponse", "Session", "new_id", "valid_id"]

def valid_id(value: str) -> bool:
    """Whether ``value`` may be used as an instance id: :func:`loopwright.is_instance_id`, every store's rule."""
    return is_instance_id(value)


def new_id() -> str:
    """Return a fresh instance id, shaped like the runtime's own."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


class Session:
    """The instances one registered definition owns over a protocol.

    :param runtime: The open runtime.
    :param key: The name the definition is registered under (``agentDefinitions``).
    """

    def __init__(self, runtime: Any, key: str) -> None:
        """Read the definition once, for the ``name`` its instances carry."""
        self.runtime = runtime
        self.key = key
        definition = runtime.load_definition(key)
        self.definition_name: str = definition.name
        self.description: str = definition.description or f"the loopwright agent {key}"

    def owns(self, header: HeaderFields) -> bool:
        """Whether an instance belongs to this session: a top-level instance of the definition."""
        return header.name == self.definition_name and not header.spawner_instance_id

    async def header(self, instance_id: str) -> HeaderFields | None:
        """Return the saved header of ``instance_id`` whoever owns it, or ``None`` if there is no such instance."""
        if not valid_id(instance_id):
            return None
        try:
            return HeaderFields(await self.runtime.store.read_header(instance_id))
        except InstanceNotFoundError:
            return None

    async def read(self, instance_id: str) -> HeaderFields | None:
        """Return the header of an instance this session owns, or ``None``."""
        header = await self.header(instance_id)
        return header if header is not None and self.owns(header) else None


class GatedResponse:
    """A streaming response counted by the server's stream gate while it is sent.

    The caller has entered the gate (:meth:`StreamGate.enter`, which refuses with 503 past
    ``server.maxEventStreams``); this leaves it once the response is sent, or fails, or the
    client goes away, and then calls ``cleanup`` (if given): what the response held, such as
    a live subscription, is given back even when its body was never read.
    """

    def __init__(self, response: Response, gate: StreamGate, cleanup: Callable[[], None] | None = None) -> None:
        """Wrap ``response``, which holds one place in ``gate``."""
        self.response = response
        self.gate = gate
        self.cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the response, then give its place back."""
        try:
            await self.response(scope, receive, send)
        finally:
            self.gate.leave()
            if self.cleanup is not None:
                self.cleanup()

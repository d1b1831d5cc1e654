"""The surfaces the server mounts, in order: ``"module:Class"``, each a :class:`~loopwright_serve.Surface`.

A surface whose module cannot be imported for want of an optional package (``a2a-sdk``,
``ag-ui-protocol``) is left out with one log line naming what to install.
"""

from __future__ import annotations

__all__ = ["SURFACES"]

SURFACES: tuple[str, ...] = (
    "loopwright_serve._api:ApiSurface",
    "loopwright_serve._ui:UiSurface",
    "loopwright_serve._openai_compat:OpenAICompatSurface",
    "loopwright_serve._mcp_server:McpSurface",
    "loopwright_serve._a2a:A2ASurface",
    "loopwright_serve._agui:AguiSurface",
)

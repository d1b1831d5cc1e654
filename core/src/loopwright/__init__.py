"""loopwright: a durable, pluggable runtime for LLM agents.

Start with :func:`run_agent` (synchronous) or :class:`Runtime` (async). Plugins implement the
hooks in :mod:`loopwright.hookspecs` with :data:`hookimpl` and the interfaces in
:mod:`loopwright.abc`; errors live in :mod:`loopwright.errors`.
"""

from __future__ import annotations

from typing import Any

from loopwright._capabilities import intersect
from loopwright._decisions import (
    Block,
    Decision,
    ModifyInputs,
    ModifyMessage,
    ModifyRequest,
    ModifyResult,
    RequireApproval,
    Respond,
)
from loopwright._definition import (
    Assembly,
    Capabilities,
    Completion,
    Definition,
    FileGrants,
    InitialPrompt,
    InitialToolCall,
    Limits,
    PluginSpec,
    ProviderConfig,
    StoreConfig,
)
from loopwright._plugins import hookimpl
from loopwright._runtime import AgentRun, Runtime
from loopwright._sync import run_agent
from loopwright._tools import Tool, tool
from loopwright._types import (
    AgentResult,
    Cost,
    Event,
    InstanceInfo,
    Message,
    ModelRequest,
    ModelResponse,
    PendingApproval,
    Record,
    State,
    StopReason,
    ToolCall,
    ToolOutput,
    ToolResult,
    ToolSpec,
    ToolStatus,
    Transcript,
    Usage,
)
from loopwright.abc import ProviderSettings, StoreSettings
from loopwright.errors import ToolError

__all__ = [
    "AgentResult",
    "AgentRun",
    "Assembly",
    "Block",
    "Capabilities",
    "Completion",
    "Cost",
    "Decision",
    "Definition",
    "Event",
    "FileGrants",
    "InitialPrompt",
    "InitialToolCall",
    "InstanceInfo",
    "Limits",
    "Message",
    "ModelRequest",
    "ModelResponse",
    "ModifyInputs",
    "ModifyMessage",
    "ModifyRequest",
    "ModifyResult",
    "PendingApproval",
    "PluginSpec",
    "ProviderConfig",
    "ProviderSettings",
    "Record",
    "RequireApproval",
    "Respond",
    "Runtime",
    "State",
    "StopReason",
    "StoreConfig",
    "StoreSettings",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolOutput",
    "ToolResult",
    "ToolSpec",
    "ToolStatus",
    "Transcript",
    "Usage",
    "hookimpl",
    "intersect",
    "retry_transient",
    "run_agent",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version  # noqa: PLC0415

        return version("loopwright-core")
    if name == "retry_transient":
        from loopwright._retry import retry_transient  # noqa: PLC0415

        return retry_transient
    raise AttributeError(f"module 'loopwright' has no attribute {name!r}")

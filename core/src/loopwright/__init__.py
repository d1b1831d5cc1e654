"""loopwright: a durable, pluggable runtime for LLM agents.

Start with :func:`run_agent` (synchronous) or :class:`Runtime` (async). Plugins implement the
hooks in :mod:`loopwright.hookspecs` with :data:`hookimpl` and the interfaces in
:mod:`loopwright.abc`; errors live in :mod:`loopwright.errors`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loopwright._capabilities import intersect
    from loopwright._config import read_yaml
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
        EngineConfig,
        FileGrants,
        InitialPrompt,
        InitialToolCall,
        Limits,
        PluginSpec,
        ProviderConfig,
        StoreConfig,
    )
    from loopwright._duration import parse_duration
    from loopwright._header import InstanceHeader
    from loopwright._header_fields import HeaderFields
    from loopwright._ids import INSTANCE_ID_RULE, check_instance_id, is_instance_id
    from loopwright._plugins import PluginHost, hookimpl
    from loopwright._retry import parse_retry_after, retry_transient
    from loopwright._runtime import AgentRun, Runtime
    from loopwright._sync import run_agent
    from loopwright._threads import Thread
    from loopwright._tools import Tool, ToolContext, tool
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
        StreamDelta,
        ToolCall,
        ToolOutput,
        ToolResult,
        ToolSpec,
        ToolStatus,
        Transcript,
        Usage,
        approval_digest,
        call_digest,
    )
    from loopwright.abc import ProviderSettings, StoreSettings
    from loopwright.errors import ToolError

__all__ = [
    "INSTANCE_ID_RULE",
    "AgentResult",
    "AgentRun",
    "Assembly",
    "Block",
    "Capabilities",
    "Completion",
    "Cost",
    "Decision",
    "Definition",
    "EngineConfig",
    "Event",
    "FileGrants",
    "HeaderFields",
    "InitialPrompt",
    "InitialToolCall",
    "InstanceHeader",
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
    "PluginHost",
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
    "StreamDelta",
    "Thread",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "ToolResult",
    "ToolSpec",
    "ToolStatus",
    "Transcript",
    "Usage",
    "approval_digest",
    "call_digest",
    "check_instance_id",
    "hookimpl",
    "intersect",
    "is_instance_id",
    "parse_duration",
    "parse_retry_after",
    "read_yaml",
    "retry_transient",
    "run_agent",
    "tool",
]

# Names are imported on first use, so that ``import loopwright`` (and ``loopwright --help``)
# stays cheap: the JSON Schema, YAML and pricing machinery load only when something needs them.
_LAZY: dict[str, str] = {
    "AgentResult": "loopwright._types",
    "AgentRun": "loopwright._runtime",
    "Assembly": "loopwright._definition",
    "Block": "loopwright._decisions",
    "Capabilities": "loopwright._definition",
    "Completion": "loopwright._definition",
    "Cost": "loopwright._types",
    "Decision": "loopwright._decisions",
    "Definition": "loopwright._definition",
    "EngineConfig": "loopwright._definition",
    "Event": "loopwright._types",
    "FileGrants": "loopwright._definition",
    "InitialPrompt": "loopwright._definition",
    "InitialToolCall": "loopwright._definition",
    "HeaderFields": "loopwright._header_fields",
    "InstanceHeader": "loopwright._header",
    "InstanceInfo": "loopwright._types",
    "Limits": "loopwright._definition",
    "Message": "loopwright._types",
    "ModelRequest": "loopwright._types",
    "ModelResponse": "loopwright._types",
    "ModifyInputs": "loopwright._decisions",
    "ModifyMessage": "loopwright._decisions",
    "ModifyRequest": "loopwright._decisions",
    "ModifyResult": "loopwright._decisions",
    "PendingApproval": "loopwright._types",
    "PluginHost": "loopwright._plugins",
    "PluginSpec": "loopwright._definition",
    "ProviderConfig": "loopwright._definition",
    "ProviderSettings": "loopwright.abc",
    "Record": "loopwright._types",
    "RequireApproval": "loopwright._decisions",
    "Respond": "loopwright._decisions",
    "Runtime": "loopwright._runtime",
    "State": "loopwright._types",
    "StopReason": "loopwright._types",
    "StoreConfig": "loopwright._definition",
    "StoreSettings": "loopwright.abc",
    "StreamDelta": "loopwright._types",
    "Thread": "loopwright._threads",
    "Tool": "loopwright._tools",
    "ToolCall": "loopwright._types",
    "ToolContext": "loopwright._tools",
    "ToolError": "loopwright.errors",
    "ToolOutput": "loopwright._types",
    "ToolResult": "loopwright._types",
    "ToolSpec": "loopwright._types",
    "ToolStatus": "loopwright._types",
    "Transcript": "loopwright._types",
    "Usage": "loopwright._types",
    "approval_digest": "loopwright._types",
    "call_digest": "loopwright._types",
    "hookimpl": "loopwright.hookspecs",
    "intersect": "loopwright._capabilities",
    "parse_duration": "loopwright._duration",
    "INSTANCE_ID_RULE": "loopwright._ids",
    "check_instance_id": "loopwright._ids",
    "is_instance_id": "loopwright._ids",
    "parse_retry_after": "loopwright._retry",
    "read_yaml": "loopwright._config",
    "retry_transient": "loopwright._retry",
    "run_agent": "loopwright._sync",
    "tool": "loopwright._tools",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version  # noqa: PLC0415 - metadata only when __version__ is asked for

        return version("loopwright-core")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'loopwright' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

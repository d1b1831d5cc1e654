"""The JSON views as ``loopwright._views`` built them by hand before issue 9 (frozen at commit 6489697).

The reference :mod:`test_views` compares the views built by the one converter against, byte
for byte. Do not edit it to make a test pass: it is what ``show``, ``ls`` and ``--json`` printed.
``agent_report`` is ``Agents._report`` of the same commit, as a function of a header.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from loopwright._types import AgentResult, PendingApproval, Usage

__all__ = [
    "agent_report",
    "approval_json",
    "approval_to_json",
    "children_in",
    "result_to_json",
    "short_json",
    "subtree_in",
    "summary",
    "tree_node",
    "usage_to_json",
]


def subtree_in(header: Mapping[str, Any], by_id: Mapping[Any, Mapping[str, Any]], seen: set[Any]) -> float | None:
    """Return the subtree cost of ``header``'s instance from headers already read (``by_id``)."""
    own, below = header.get("cost", 0.0), children_in(header, by_id, seen)
    return None if own is None or below is None else own + below


def children_in(header: Mapping[str, Any], by_id: Mapping[Any, Mapping[str, Any]], seen: set[Any]) -> float | None:
    """Return the summed subtree costs of ``header``'s children found in ``by_id`` (``None`` if unknown)."""
    total: float | None = 0.0
    for child in header.get("children") or []:
        if child in seen or child not in by_id:
            continue
        seen.add(child)
        below = subtree_in(by_id[child], by_id, seen)
        total = None if total is None or below is None else total + below
    return total


def tree_node(header: Mapping[str, Any], by_id: Mapping[Any, Mapping[str, Any]], seen: set[Any]) -> dict[str, Any]:
    """Return the ``tree`` node of ``header``'s instance, its children's nodes from ``by_id`` (a loop is cut)."""
    seen.add(header.get("instanceId"))
    children = [tree_node(by_id[c], by_id, seen) for c in header.get("children") or []
                if c in by_id and c not in seen]
    own = [approval_json(p) for p in header.get("pendingApprovals") or [] if p.get("decision") is None]
    cost = header.get("cost", 0.0)
    below = [c["subtreeCost"] for c in children]
    subtree = None if cost is None or None in below else cost + sum(below)
    return {
        "instanceId": header.get("instanceId"), "name": header.get("name"), "state": header.get("state"),
        "stopReason": header.get("stopReason"), "turns": int(header.get("turns") or 0),
        "depth": int(header.get("depth") or 0), "pendingApprovals": own,
        "waitingOn": len(own) + sum(c["waitingOn"] for c in children),
        "cost": cost, "subtreeCost": subtree, "forkedFrom": header.get("forkedFrom"), "children": children,
    }


def approval_json(p: Mapping[str, Any]) -> dict[str, Any]:
    """Return a saved ``pendingApprovals`` entry as the views show it (every key present)."""
    return {"toolCallId": p.get("toolCallId"), "tool": p.get("tool"), "arguments": p.get("arguments"),
            "reason": p.get("reason"), "requestedAt": p.get("requestedAt"), "decision": p.get("decision")}


def approval_to_json(p: PendingApproval) -> dict[str, Any]:
    """Return the ``--json`` form of a pending approval: with its holder and path when it has them."""
    out: dict[str, Any] = {"toolCallId": p.tool_call_id, "tool": p.tool, "arguments": dict(p.arguments),
                           "reason": p.reason}
    if p.instance_id is not None:
        out["instanceId"] = p.instance_id
        out["path"] = [dict(step) for step in p.path]
    if p.decision is not None:
        out["decision"] = p.decision
    return out


def short_json(value: Any, limit: int = 200) -> str:
    """Return ``value`` as JSON text, cut to ``limit`` characters (for messages)."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


def summary(header: Mapping[str, Any], *, subtree_cost: float | object | None = ...) -> dict[str, Any]:
    """Return the JSON summary of an instance (``show`` and ``ls``), camelCase keys.

    :param subtree_cost: Its ``subtreeCost`` when the caller read its children (see
        :meth:`Runtime.subtree_cost`); by default its own cost.
    """
    usage = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0, **(header.get("usage") or {})}
    return {
        "instanceId": header.get("instanceId"),
        "name": header.get("name"),
        "state": header.get("state"),
        "queued": header.get("queued") is True,
        "stopReason": header.get("stopReason"),
        "cancelled": bool(header.get("cancelled", False)),
        "error": header.get("error"),
        "model": header.get("model"),
        "pendingApprovals": [approval_json(p) for p in header.get("pendingApprovals") or []],
        "usage": usage,
        "cost": header.get("cost"),
        "subtreeCost": header.get("cost") if subtree_cost is ... else subtree_cost,
        "spawnerInstanceId": header.get("spawnerInstanceId"),
        "callerInstanceId": header.get("callerInstanceId"),
        "callerToolCallId": header.get("callerToolCallId"),
        "delegationPrompt": header.get("delegationPrompt"),
        "createdAt": header.get("createdAt"),
        "updatedAt": header.get("updatedAt"),
        "children": list(header.get("children") or []),
        "depth": int(header.get("depth") or 0),
    }


def result_to_json(result: AgentResult) -> dict[str, Any]:
    """Return the ``--json`` form of a result: camelCase keys, every key present."""
    return {
        "instanceId": result.instance_id,
        "state": result.state.value,
        "stopReason": result.stop_reason.value if result.stop_reason else None,
        "text": result.text,
        "output": result.output,
        "usage": usage_to_json(result.usage),
        "cost": result.cost.amount,
        "subtreeCost": result.subtree_cost.amount,
        "pendingApprovals": [approval_to_json(p) for p in result.pending_approvals if p.decision is None],
        "error": result.error,
        "cancelled": result.cancelled,
        "limit": result.limit,
        "model": result.model,
    }


def usage_to_json(usage: Usage) -> dict[str, Any]:
    """Return ``{inputTokens, outputTokens, totalTokens}`` (always) plus the counts that are known.

    ``unreportedRequests`` appears when some model calls came back without token counts.
    """
    out: dict[str, Any] = {"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens,
                           "totalTokens": usage.total_tokens}
    known = (("cacheReadTokens", usage.cache_read_tokens), ("cacheWriteTokens", usage.cache_write_tokens),
             ("reasoningTokens", usage.reasoning_tokens))
    out.update({key: value for key, value in known if value is not None})
    if usage.requests:
        out["requests"] = usage.requests
    if usage.unreported_requests:
        out["unreportedRequests"] = usage.unreported_requests
    return out


def agent_report(header: Mapping[str, Any], agent_id: str, subtree: float | None) -> dict[str, Any]:
    """``Agents._report`` of commit 6489697."""
    usage = header.get("usage") or {}
    return {
        "instanceId": agent_id, "name": header.get("name"), "state": header.get("state"),
        "stopReason": header.get("stopReason"), "text": header.get("text"), "output": header.get("output"),
        "error": header.get("error"), "turns": header.get("turns"), "cost": header.get("cost"),
        "subtreeCost": subtree, "contextTokens": usage.get("inputTokens"),
        "pendingApprovals": [p.get("toolCallId") for p in header.get("pendingApprovals") or []
                             if p.get("decision") is None],
    }

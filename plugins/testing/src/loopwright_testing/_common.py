"""What the test providers share: token estimates and deterministic tool-call ids."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from loopwright import Message, Transcript, Usage

if TYPE_CHECKING:
    from collections.abc import Sequence

    from loopwright import ModelRequest

__all__ = ["estimate_usage", "next_turn", "tokens_of"]

_CACHE_KEY = "loopwright-testing"


def _facts(message: Message) -> tuple[int, bool]:
    """Return ``(characters, is_assistant)`` of one message; pure, so the transcript caches it."""
    chars = len(message.content or "")
    for call in message.tool_calls:
        chars += len(call.name) + len(call.raw_arguments or _arguments_text(call.arguments))
    return chars, message.role == "assistant"


def _arguments_text(arguments: Any) -> str:
    """Return decoded arguments as JSON text; arguments too deep or odd to encode count as a fixed size."""
    try:
        return json.dumps(dict(arguments), default=str)
    except (RecursionError, ValueError):  # the loop answers such arguments with invalid_arguments
        return "x" * 64


def _all_facts(messages: Sequence[Message]) -> Sequence[tuple[int, bool]]:
    if isinstance(messages, Transcript):
        # Encoded once per message and cached on the transcript: a long run costs no re-scan (DESIGN).
        return messages.encoded(_CACHE_KEY, _facts)
    return [_facts(m) for m in messages]


def tokens_of(chars: int) -> int:
    """Return the token estimate of ``chars`` characters: a quarter, rounded up, at least 1."""
    return max(1, -(-chars // 4))


def estimate_usage(request: ModelRequest, answer: Message) -> Usage:
    """Return a deterministic usage: characters / 4 of the request (tools included) and the answer.

    ``requests`` is 1; cache and reasoning counts stay ``None`` (unknown).
    """
    chars = sum(c for c, _ in _all_facts(request.messages))
    for spec in request.tools:
        chars += len(spec.name) + len(spec.description) + len(json.dumps(dict(spec.parameters), default=str))
    out_chars, _ = _facts(answer)
    inp, out = tokens_of(chars), tokens_of(out_chars)
    return Usage(input_tokens=inp, output_tokens=out, total_tokens=inp + out, requests=1)


def next_turn(messages: Sequence[Message]) -> str:
    """Return a token for the next model turn of this conversation, for tool-call ids.

    It is the number of assistant messages plus one, so ids are the same on every run of the
    same conversation; after the transcript was replaced wholesale (compaction) the epoch is
    appended, so ids stay unique within the instance.
    """
    turn = sum(1 for _, is_assistant in _all_facts(messages) if is_assistant) + 1
    epoch = messages.epoch if isinstance(messages, Transcript) else 0
    return f"{turn}" if not epoch else f"{turn}e{epoch}"

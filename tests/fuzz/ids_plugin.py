"""The call-id fuzzers' tools and served model, in one file: imported in process, copied as a plugin file.

``test_fuzz_call_ids.py`` imports :data:`ARGUMENTS`, :func:`echo` and :func:`guarded` for the
runtime it drives in process, and writes this file's text as the ``model.py`` plugin file of
the ``loopwright serve`` it starts (which registers the ``planned`` provider and both tools).
"""

import json

import loopwright
from loopwright import Message, ModelResponse, ToolCall
from loopwright.abc import Provider

ARGUMENTS = {"echo": {"text": "x"}, "guarded": {"n": 1}}


@loopwright.tool
def echo(text: str) -> str:
    """Say it back.

    Args:
        text: What.
    """
    return text


@loopwright.tool(requires_approval=True)
def guarded(n: int) -> str:
    """Needs a yes.

    Args:
        n: A number.
    """
    return f"ran {n}"


class Planned(Provider):
    """Makes the calls its prompt lists, with those ids; then answers with the wire ids it got back."""

    def __init__(self, settings):
        self.settings = settings

    async def complete(self, request):
        last = request.messages[-1]
        if last.role == "user":
            calls = tuple(ToolCall(id=i, name=t, arguments=ARGUMENTS[t]) for i, t in json.loads(last.content))
            return ModelResponse(message=Message(role="assistant", tool_calls=calls), finish_reason="tool_calls")
        wire = [m.provider_call_id for m in request.messages if m.role == "tool"]
        return ModelResponse(message=Message(role="assistant", content=json.dumps(wire)))


@loopwright.hookimpl
def loopwright_register_providers(register):
    register("planned", Planned)


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(echo, guarded)

"""A scripted provider, a few tools and a plugin command for the CLI tests.

The test assembly lists this file in ``plugins:``. The model ``replay:NAME`` plays the replies of
``scripts/NAME.json`` (next to this file). Which reply comes next is the number of assistant
messages already in the transcript, so a script goes on correctly in a new process (after an
approval, a message, a resume) with no state of its own; past the end, the last reply repeats.

A reply is ``{"text": ..., "calls": [{"name", "arguments", "id"?}]}`` or ``{"error": MESSAGE}``.
In ``text``, ``{last}`` becomes the content of the transcript's last message and ``{system}``
that of the system prompt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import click

import loopwright
from loopwright.abc import Provider, ProviderSettings
from loopwright.cli import CliSettings
from loopwright.errors import ProviderError

SCRIPTS = Path(__file__).parent / "scripts"


class ReplayProvider(Provider):
    """Plays ``scripts/<model>.json``. Free: its calls cost 0 (and genai-prices is never imported)."""

    free = True

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    async def complete(self, request: loopwright.ModelRequest) -> loopwright.ModelResponse:
        replies = json.loads((SCRIPTS / f"{request.model}.json").read_text())
        index = sum(1 for m in request.messages if m.role == "assistant")
        reply: dict[str, Any] = replies[min(index, len(replies) - 1)]
        if "error" in reply:
            raise ProviderError(reply["error"], provider=request.provider, model=request.model)
        text = reply.get("text")
        if text is not None:
            last = request.messages[-1].content if request.messages else ""
            system = next((m.content for m in request.messages if m.role == "system"), "")
            text = text.replace("{last}", last or "").replace("{system}", system or "")
        calls = tuple(
            loopwright.ToolCall(id=c.get("id", f"call_{index}_{k}"), name=c["name"], arguments=c.get("arguments", {}))
            for k, c in enumerate(reply.get("calls", [])))
        return loopwright.ModelResponse(
            message=loopwright.Message(role="assistant", content=text, tool_calls=calls),
            usage=loopwright.Usage(input_tokens=10, output_tokens=5, total_tokens=15, requests=1),
            finish_reason="tool_calls" if calls else "stop")


@loopwright.tool
def echo(text: str) -> str:
    """Return the text.

    Args:
        text: Anything.
    """
    return text


@loopwright.tool(requires_approval=True)
def delete(path: str) -> str:
    """Pretend to delete a file.

    Args:
        path: The file.
    """
    return f"deleted {path}"


@loopwright.tool
async def slow(marker: str) -> str:
    """Write a marker file, then take a minute.

    Args:
        marker: The file written when the tool starts.
    """
    Path(marker).write_text("started")
    await anyio.sleep(60)
    return "done"


@click.command("hello")
@click.argument("who", default="world")
def hello(who: str) -> None:
    """Say hello (a plugin command)."""
    settings = click.get_current_context().find_object(CliSettings)
    if settings is not None and settings.json:
        click.echo(json.dumps({"hello": who}))
    else:
        click.echo(f"hello {who}")


@loopwright.hookimpl
def loopwright_register_providers(register: Any) -> None:
    register("replay", ReplayProvider)


@loopwright.hookimpl
def loopwright_register_tools(register: Any) -> None:
    register(echo, delete, slow)


@loopwright.hookimpl
def loopwright_register_commands(register: Any) -> None:
    register(hello)


@loopwright.hookimpl
def loopwright_on_state_change() -> None:
    """Observe nothing: only here so that ``plugins`` lists a hook."""

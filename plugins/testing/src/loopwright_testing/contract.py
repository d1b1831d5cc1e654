"""A contract test class that provider plugins subclass to check the basics of a Provider.

Usage, in a provider plugin's tests::

    import httpx
    from loopwright import ProviderSettings
    from loopwright_testing.contract import ProviderContract

    class TestMyProvider(ProviderContract):
        model = "my-model"

        def make_provider(self):
            client = httpx.AsyncClient(transport=httpx.MockTransport(my_fake_api))
            return MyProvider(ProviderSettings(name="mine", kind="mine", http_client=client))

The checks are generic: ``complete()`` returns a :class:`~loopwright.ModelResponse` holding an
assistant message, tool specs are accepted, usage is a :class:`~loopwright.Usage`, and
``aclose()`` works. ``make_provider`` may be ``async def``; for setup that needs other fixtures,
override the ``provider`` fixture instead. The tests are marked ``anyio``: they run under every
backend the subclass's ``anyio_backend`` fixture gives (anyio's default is asyncio).

A fuller conformance kit, with a wire-level fake server, will come later.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

import pytest

from loopwright import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec, Usage
from loopwright.abc import Provider

__all__ = ["ProviderContract"]

_FINISH_REASONS = frozenset({"stop", "tool_calls", "length", "content_filter", "error"})

_ADD = ToolSpec(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
)


class ProviderContract:
    """Subclass as ``Test<Something>`` and implement :meth:`make_provider`.

    Attributes:
        model: The model id put in the requests (after ``PROVIDER:``).
        provider_name: The provider name put in the requests.

    """

    model: ClassVar[str] = "any"
    provider_name: ClassVar[str] = "contract"

    def make_provider(self) -> Provider:
        """Return a fresh provider to check; may be ``async def``. Each test gets its own."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_provider()")

    def request(self, *messages: Message, tools: tuple[ToolSpec, ...] = ()) -> ModelRequest:
        """Return a request for the provider under test (override to add settings)."""
        return ModelRequest(model=self.model, provider=self.provider_name, messages=messages, tools=tools)

    @pytest.fixture
    async def provider(self, anyio_backend: Any) -> AsyncIterator[Provider]:
        """Yield the provider from :meth:`make_provider` and close it after the test."""
        del anyio_backend  # requested so that anyio's plugin runs this fixture
        made = self.make_provider()
        if inspect.isawaitable(made):
            made = await made
        assert isinstance(made, Provider), f"make_provider() returned {type(made).__name__}, not a Provider"
        try:
            yield made
        finally:
            await made.aclose()

    @pytest.mark.anyio
    async def test_complete_returns_an_assistant_message(self, provider: Provider) -> None:
        """complete() on a plain user message returns a ModelResponse holding an assistant message."""
        response = await provider.complete(
            self.request(Message(role="system", content="You are terse."), Message(role="user", content="Say hello."))
        )
        assert isinstance(response, ModelResponse)
        assert isinstance(response.message, Message)
        assert response.message.role == "assistant"
        assert response.message.content is not None or response.message.tool_calls
        assert response.finish_reason in _FINISH_REASONS

    @pytest.mark.anyio
    async def test_usage_is_a_usage(self, provider: Provider) -> None:
        """The response's usage is a Usage with non-negative integer counts."""
        response = await provider.complete(self.request(Message(role="user", content="Count to three.")))
        usage = response.usage
        assert isinstance(usage, Usage)
        for field in ("input_tokens", "output_tokens", "total_tokens", "requests"):
            value = getattr(usage, field)
            assert isinstance(value, int), f"usage.{field} is {value!r}"
            assert value >= 0, f"usage.{field} is {value!r}"

    @pytest.mark.anyio
    async def test_tool_specs_are_accepted(self, provider: Provider) -> None:
        """A request with tool specs succeeds, and any tool call names an offered tool with an id."""
        response = await provider.complete(
            self.request(Message(role="user", content="What is 1 + 2? Use the add tool."), tools=(_ADD,))
        )
        assert isinstance(response, ModelResponse)
        assert response.message.role == "assistant"
        for call in response.message.tool_calls:
            assert isinstance(call, ToolCall)
            assert call.name == "add", f"called {call.name!r}, which was not offered"
            assert isinstance(call.arguments, Mapping)
            assert isinstance(call.id, str)

    @pytest.mark.anyio
    async def test_tool_results_are_accepted(self, provider: Provider) -> None:
        """A transcript ending in a tool result (after the assistant's call) is accepted."""
        call = ToolCall(id="call_1", name="add", arguments={"a": 1, "b": 2})
        response = await provider.complete(
            self.request(
                Message(role="user", content="What is 1 + 2?"),
                Message(role="assistant", tool_calls=(call,)),
                Message(role="tool", tool_call_id="call_1", name="add", content="3"),
                tools=(_ADD,),
            )
        )
        assert isinstance(response, ModelResponse)
        assert response.message.role == "assistant"

    @pytest.mark.anyio
    async def test_aclose_works(self) -> None:
        """aclose() returns, and the provider works as an async context manager."""
        made = self.make_provider()
        if inspect.isawaitable(made):
            made = await made
        async with made as entered:
            assert entered is made

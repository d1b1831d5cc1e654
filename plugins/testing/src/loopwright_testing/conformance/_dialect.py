"""What the kit needs to know about one wire format: the :class:`Dialect` base class."""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from loopwright.abc import ProviderSettings
from loopwright_testing.conformance._model import WireFormatError

if TYPE_CHECKING:
    from loopwright_testing.conformance._model import (
        CapturedRequest,
        ScriptedAnswer,
        ScriptedError,
        SSEEvent,
        WireRequest,
    )

__all__ = ["Dialect", "wire_json"]


def wire_json(data: Any) -> str:
    """Return compact JSON text, not ASCII-escaped, as the vendors write it."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


class Dialect(abc.ABC):
    """One vendor wire format, as the conformance scenarios need it.

    A dialect is a small, stateless object with two halves:

    * **rendering** what the scripted model says: :meth:`render_answer` (the JSON body of a
      plain answer), :meth:`render_stream` (the SSE events of a streamed one) and
      :meth:`render_error` (the JSON body of a failure), each given the request being answered;
    * **reading** what the provider sent: :meth:`read_request` turns a captured request into a
      vendor-neutral :class:`~loopwright_testing.conformance.WireRequest`, and raises
      :class:`~loopwright_testing.conformance.WireFormatError` for anything the vendor's API
      would reject, so scenarios catch providers that build invalid requests.

    Plus the endpoint (:attr:`path`, :meth:`base_url`), how to build the provider's settings
    (:meth:`settings`) and how the API key travels (:meth:`auth_problem`).

    Attributes:
        name: A short name for messages, such as ``openai-chat``.
        path: The path the provider must ``POST`` to, such as ``/v1/chat/completions``.
        raw_arguments_on: Where the wire format can carry tool arguments that are not valid
            JSON: ``"json"`` (a plain answer), ``"stream"`` (a streamed one) or both. The
            malformed-arguments scenario checks each of them.
    """

    name: ClassVar[str] = "?"
    path: ClassVar[str] = "/"
    raw_arguments_on: ClassVar[frozenset[str]] = frozenset({"json", "stream"})

    # -- the endpoint and the provider's settings --------------------------------------------------

    def base_url(self, server_url: str) -> str:
        """Return the ``base_url`` the provider is configured with, given the server's root URL.

        The default is the root itself; a vendor whose providers append a path to a base URL
        that already holds a version (``.../v1`` + ``/chat/completions``) returns that.
        """
        return server_url

    def settings(
        self, server_url: str, *, name: str, kind: str, api_key: str | None, options: Mapping[str, Any],
    ) -> ProviderSettings:
        """Return the settings that point a provider of ``kind`` at the server.

        No ``http_client`` is injected: the provider builds its own and talks real HTTP.
        """
        return ProviderSettings(name=name, kind=kind, base_url=self.base_url(server_url), api_key=api_key,
                                options=dict(options))

    def auth_problem(self, request: CapturedRequest, api_key: str) -> str | None:
        """Return why the request does not carry ``api_key`` as the vendor expects, or ``None``.

        The default checks nothing.
        """
        del request, api_key
        return None

    # -- rendering -------------------------------------------------------------------------------

    @abc.abstractmethod
    def render_answer(self, answer: ScriptedAnswer, request: CapturedRequest) -> Any:
        """Return the JSON body (a ``dict``) of a plain answer carrying ``answer``.

        :raises UnrepresentableError: If the format cannot carry it in one piece.
        """
        raise NotImplementedError

    @abc.abstractmethod
    def render_stream(self, answer: ScriptedAnswer, request: CapturedRequest) -> Sequence[SSEEvent]:
        """Return the SSE events that stream ``answer``, in order, end marker included.

        Send the text as :attr:`ScriptedAnswer.stream_text_pieces` and each call's arguments as
        :attr:`ScriptedCall.argument_pieces`, one piece per event, so the scenarios can check
        that the pieces reach the caller as pieces. The first text piece must appear verbatim
        (JSON-escaped) in the data of the event that carries it: the streaming scenario holds
        the rest of the stream back after that event until the provider has yielded it.
        """
        raise NotImplementedError

    @abc.abstractmethod
    def render_error(self, error: ScriptedError, request: CapturedRequest) -> Any:
        """Return the JSON body of a failure with ``error.status``, carrying ``error.message``."""
        raise NotImplementedError

    def error_headers(self, error: ScriptedError) -> Mapping[str, str]:
        """Return headers the vendor adds to a failure (request ids ...); ``error.headers`` come on top."""
        del error
        return {}

    def vendor_finish_reason(self, finish_reason: str) -> str:
        """Return the vendor's own word for a normalised finish reason (the default keeps it)."""
        return finish_reason

    # -- reading ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def read_request(self, request: CapturedRequest) -> WireRequest:
        """Return the request in vendor-neutral terms.

        :raises WireFormatError: If the request breaks a rule of the vendor's API (the real API
            would answer 400), with a message that names the rule and the place.
        """
        raise NotImplementedError

    def wants_stream(self, request: CapturedRequest) -> bool:
        """Return whether the request asks for a streamed answer (default: ``read_request``'s ``stream``)."""
        return self.read_request(request).stream

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# -- helpers for dialect authors -------------------------------------------------------------------


def require(condition: object, where: str, message: str) -> None:
    """Raise :class:`WireFormatError` ``"{where}: {message}"`` unless ``condition`` holds."""
    if not condition:
        raise WireFormatError(f"{where}: {message}")


def object_at(value: Any, where: str) -> dict[str, Any]:
    """Return ``value`` if it is a JSON object, else raise :class:`WireFormatError`."""
    require(isinstance(value, dict), where, f"must be an object, not {type(value).__name__}")
    return value  # type: ignore[no-any-return]


def list_at(value: Any, where: str) -> list[Any]:
    """Return ``value`` if it is a JSON array, else raise :class:`WireFormatError`."""
    require(isinstance(value, list), where, f"must be an array, not {type(value).__name__}")
    return value  # type: ignore[no-any-return]


def text_at(value: Any, where: str) -> str:
    """Return ``value`` if it is a string, else raise :class:`WireFormatError`."""
    require(isinstance(value, str), where, f"must be a string, not {type(value).__name__}")
    return value  # type: ignore[no-any-return]


def parse_json_text(text: str) -> Any:
    """Return ``text`` parsed as JSON, or ``text`` itself when it is not valid JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return text

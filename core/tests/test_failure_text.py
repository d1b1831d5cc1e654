"""The ``error`` an instance keeps when its model call failed for good names the request (issue 31, point 3)."""

from __future__ import annotations

import httpx

from loopwright._engine._turn import _failure_text
from loopwright.errors import ProviderError


def test_the_request_is_named_without_its_query_or_user_info() -> None:
    """A key may travel in the query (``?key=``) or the user info: neither is shown; the method and path are."""
    request = httpx.Request("POST", "https://me:pw@example.test:8443/v1beta/models/m:generate?key=SECRET#x")
    failure = ProviderError("model not found", provider="g", model="m", status=404, request=request)
    text = _failure_text(failure)
    assert text == ("g:m (HTTP 404): model not found "
                    "(request: POST https://example.test:8443/v1beta/models/m:generate)")
    assert "SECRET" not in text
    assert "pw" not in text


def test_a_failure_without_a_request_is_its_message() -> None:
    """A provider that made no HTTP request (the test provider, a misconfigured model) keeps its message as it was."""
    assert _failure_text(ProviderError("boom", provider="p", model="m")) == "p:m: boom"
    assert _failure_text(ProviderError("boom", provider="p", request=object())) == "p: boom"

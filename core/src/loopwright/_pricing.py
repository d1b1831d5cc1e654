"""Prices of model calls: the assembly's overrides first, then the genai-prices table.

An unknown price stays unknown (``Cost(amount=None)``), never 0. Lookups are cached per model,
and flat prices are computed directly, so pricing a turn costs a few microseconds; genai-prices
itself (its data loads in about 0.3 s) is imported on the first lookup only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loopwright._types import UNKNOWN_COST, ZERO_COST, Cost, Usage

__all__ = ["PriceTable"]

_PER_MILLION = 1_000_000.0


class PriceTable:
    """Prices per ``PROVIDER:MODEL``.

    :param overrides: The assembly's ``pricing:``: ``{"openai:gpt-4o": {"input": 2.5, "output": 10,
        "cacheRead": 1.25, "cacheWrite": 0}}`` in USD per million tokens. A key may also be a bare
        model id, which matches that model under any provider.
    """

    def __init__(self, overrides: Mapping[str, Mapping[str, float]] | None = None) -> None:
        """Build a table; nothing is looked up until :meth:`cost` is called."""
        self._overrides = dict(overrides or {})
        self._cache: dict[tuple[str | None, str], Any] = {}

    def cost(self, usage: Usage, *, model: str, price_provider: str | None, free: bool = False) -> Cost:
        """Return the cost of ``usage`` on ``model``.

        :param usage: Tokens of one call.
        :param model: The model id (without ``PROVIDER:``).
        :param price_provider: The genai-prices provider id (``openai``, ``anthropic`` ...), or
            ``None`` when the provider has no entry there; overrides still apply.
        :param free: The provider charges nothing (the test providers).
        """
        key = (price_provider, model)
        price = self._cache.get(key)
        if price is None:
            price = self._cache[key] = self._lookup(price_provider, model, free=free)
        if price is False:
            return UNKNOWN_COST
        if price is True:
            return ZERO_COST
        if usage.unreported_requests:
            return UNKNOWN_COST  # tokens the provider did not count have an unknown price
        if isinstance(price, tuple):
            inp, out, cache_read, cache_write = price
            cached = usage.cache_read_tokens or 0
            written = usage.cache_write_tokens or 0
            uncached = max(usage.input_tokens - cached - written, 0)
            if (cached and cache_read is None) or (written and cache_write is None):
                return UNKNOWN_COST
            amount = (uncached * inp + usage.output_tokens * out
                      + cached * (cache_read or 0.0) + written * (cache_write or 0.0)) / _PER_MILLION
            return Cost(amount=amount)
        return _tiered(price, usage)

    def _lookup(self, price_provider: str | None, model: str, *, free: bool) -> Any:
        full = f"{price_provider}:{model}" if price_provider else model
        for ref in (full, model):
            if ref in self._overrides:
                o = self._overrides[ref]
                return (float(o.get("input", 0.0)), float(o.get("output", 0.0)),
                        _opt(o.get("cacheRead")), _opt(o.get("cacheWrite")))
        if free:
            return True
        if price_provider is None:
            return False
        try:
            from genai_prices import Usage as GUsage  # noqa: PLC0415 - 0.3 s import, lazily
            from genai_prices import calc_price  # noqa: PLC0415 - with the line above
            found = calc_price(GUsage(input_tokens=1, output_tokens=1), model_ref=model,
                               provider_id=price_provider)
        except (LookupError, ValueError):
            return False
        mp = found.model_price
        flat = [mp.input_mtok, mp.output_mtok, mp.cache_read_mtok, getattr(mp, "cache_write_mtok", None)]
        if all(v is None or isinstance(v, (int, float)) or type(v).__name__ == "Decimal" for v in flat):
            return (float(flat[0] or 0), float(flat[1] or 0), _opt(flat[2]), _opt(flat[3]))  # type: ignore[arg-type]
        return mp


def _opt(v: Any) -> float | None:
    return None if v is None else float(v)


def _tiered(model_price: Any, usage: Usage) -> Cost:
    from genai_prices import Usage as GUsage  # noqa: PLC0415 - only for tiered prices

    calc = model_price.calc_price(GUsage(
        input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens, cache_write_tokens=usage.cache_write_tokens))
    return Cost(amount=float(calc["total_price"]))

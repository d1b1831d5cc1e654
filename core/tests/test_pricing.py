"""Prices: the genai-prices table, overrides, cache rates, unknown prices, and the runtime's totals."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import Harness, call, defn, make_runtime, records_of, reply, run_to_rest

import loopwright
from loopwright import Cost, Usage
from loopwright._pricing import PriceTable
from loopwright._runtime import usage_to_json


def usage(inp: int = 0, out: int = 0, cached: int | None = None, written: int | None = None) -> Usage:
    return Usage(input_tokens=inp, output_tokens=out, total_tokens=inp + out, cache_read_tokens=cached,
                 cache_write_tokens=written)


def test_genai_prices_knows_gpt_4o_mini() -> None:
    """openai:gpt-4o-mini has a positive price from the genai-prices table."""
    cost = PriceTable().cost(usage(1_000_000, 1_000_000), model="gpt-4o-mini", price_provider="openai")
    assert cost.amount is not None
    assert cost.amount > 0
    assert cost.currency == "USD"


def test_unknown_model_price_is_unknown_never_zero() -> None:
    """A model nobody prices gives Cost(amount=None), not 0."""
    table = PriceTable()
    cost = table.cost(usage(100, 100), model="no-such-model-xyz", price_provider="openai")
    assert cost == Cost(amount=None)
    assert table.cost(usage(100, 100), model="gpt-4o-mini", price_provider=None).amount is None


def test_unknown_plus_known_stays_unknown() -> None:
    """Adding an unknown cost to a known one gives an unknown total."""
    assert (Cost(amount=1.0) + Cost(amount=None)).amount is None
    assert (Cost(amount=None) + Cost(amount=1.0)).amount is None
    assert (Cost(amount=1.0) + Cost(amount=2.0)).amount == 3.0


def test_free_provider_costs_zero() -> None:
    """A free provider's calls cost exactly 0, which is known."""
    assert PriceTable().cost(usage(10, 10), model="anything", price_provider=None, free=True) == Cost(amount=0.0)


def test_assembly_override_wins_over_the_table() -> None:
    """An override for PROVIDER:MODEL replaces the table's price."""
    table = PriceTable({"openai:gpt-4o-mini": {"input": 1.0, "output": 2.0}})
    cost = table.cost(usage(1_000_000, 500_000), model="gpt-4o-mini", price_provider="openai")
    assert cost.amount == pytest.approx(1.0 + 1.0)


def test_bare_model_override_matches_any_provider() -> None:
    """An override keyed by a bare model id prices that model under any provider, even an unknown one."""
    table = PriceTable({"my-model": {"input": 3.0, "output": 0.0}})
    assert table.cost(usage(1_000_000), model="my-model", price_provider=None).amount == pytest.approx(3.0)
    assert table.cost(usage(1_000_000), model="my-model", price_provider="acme").amount == pytest.approx(3.0)


def test_override_beats_free() -> None:
    """An explicit override prices even a provider that calls itself free."""
    table = PriceTable({"s:m": {"input": 2.0}})
    assert table.cost(usage(1_000_000), model="m", price_provider="s", free=True).amount == pytest.approx(2.0)


def test_cached_tokens_are_priced_at_the_cache_rate() -> None:
    """Cache reads and writes are priced at their own rates; the rest of the input at the input rate."""
    table = PriceTable({"p:m": {"input": 10.0, "output": 20.0, "cacheRead": 1.0, "cacheWrite": 12.5}})
    cost = table.cost(usage(1_000, 100, cached=400, written=100), model="m", price_provider="p")
    expected = (500 * 10.0 + 100 * 20.0 + 400 * 1.0 + 100 * 12.5) / 1_000_000
    assert cost.amount == pytest.approx(expected)


def test_cached_tokens_without_a_cache_rate_are_unknown() -> None:
    """Cached tokens on a model with no cache price make the cost unknown rather than guessed."""
    table = PriceTable({"p:m": {"input": 10.0, "output": 20.0}})
    assert table.cost(usage(1_000, 100, cached=400), model="m", price_provider="p").amount is None
    assert table.cost(usage(1_000, 100), model="m", price_provider="p").amount is not None


def test_genai_prices_cache_rate_is_cheaper_than_input() -> None:
    """With the table's prices, cached input tokens cost less than uncached ones."""
    table = PriceTable()
    plain = table.cost(usage(1_000_000), model="gpt-4o-mini", price_provider="openai").amount
    cached = table.cost(usage(1_000_000, cached=1_000_000), model="gpt-4o-mini", price_provider="openai").amount
    assert plain is not None
    assert cached is not None
    assert 0 < cached < plain


# ------------------------------------------------------------------------------------------
# The runtime's totals
# ------------------------------------------------------------------------------------------


@loopwright.tool
def noop() -> str:
    """Do nothing."""
    return ""


@pytest.mark.anyio
async def test_agent_result_cost_and_subtree_cost(tmp_path: Path) -> None:
    """AgentResult.cost sums every turn's price; subtree_cost includes it (no children here)."""
    h = Harness(reply(None, call("noop"), usage=usage(1_000, 100)), reply("done", usage=usage(2_000, 300)),
                tools=[noop], priced=True)
    pricing = {"s:m": {"input": 1.0, "output": 10.0}}
    async with make_runtime(tmp_path, h, pricing=pricing) as rt:
        run, result = await run_to_rest(rt, defn(tools=[noop]))
        expected = (3_000 * 1.0 + 400 * 10.0) / 1_000_000
        assert result.cost.amount == pytest.approx(expected)
        assert result.subtree_cost.amount == pytest.approx(expected)
        turns = records_of(await rt.records(run.instance_id), "turn")
        assert [t["cost"] for t in turns] == pytest.approx([0.002, 0.005])
        header = await rt.store.read_header(run.instance_id)
        assert header["cost"] == pytest.approx(expected)
    async with make_runtime(tmp_path, Harness(tools=[noop], priced=True), pricing=pricing) as rt2:
        again = await rt2.get_agent(run.instance_id)
        assert again.inst.result().cost.amount == pytest.approx(expected)


@pytest.mark.anyio
async def test_unknown_price_makes_the_instance_cost_unknown(tmp_path: Path) -> None:
    """A priced provider with no known price gives cost None for the turn and the instance, never 0."""
    h = Harness(reply("done"), priced=True)
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn())
        assert result.cost.amount is None
        assert result.subtree_cost.amount is None
        (turn,) = records_of(await rt.records(run.instance_id), "turn")
        assert turn["cost"] is None
    async with make_runtime(tmp_path, Harness(priced=True)) as rt2:
        again = await rt2.get_agent(run.instance_id)
        assert again.inst.result().cost.amount is None


@pytest.mark.anyio
async def test_free_provider_gives_a_known_zero_cost(tmp_path: Path) -> None:
    """A free (test) provider's run costs a known 0.0."""
    async with make_runtime(tmp_path, Harness(reply("hi"))) as rt:
        _, result = await run_to_rest(rt, defn())
        assert result.cost == Cost(amount=0.0)


def test_a_call_without_token_counts_has_an_unknown_price() -> None:
    """Usage with an unreported request costs None even with a known price; a free provider stays 0."""
    table = PriceTable({"openai:gpt-4o-mini": {"input": 1.0, "output": 2.0}})
    unreported = Usage(requests=1, unreported_requests=1)
    assert table.cost(unreported, model="gpt-4o-mini", price_provider="openai") == Cost(amount=None)
    assert table.cost(usage(10, 10), model="gpt-4o-mini", price_provider="openai").amount is not None
    assert PriceTable().cost(unreported, model="x", price_provider=None, free=True) == Cost(amount=0.0)


def test_unreported_requests_add_up() -> None:
    """Usage sums unreported_requests like requests."""
    total = Usage(requests=1, unreported_requests=1) + Usage(input_tokens=5, requests=1) + Usage(
        requests=1, unreported_requests=1)
    assert (total.requests, total.unreported_requests, total.input_tokens) == (3, 2, 5)


@pytest.mark.anyio
async def test_a_provider_that_counts_nothing_makes_the_cost_unknown(tmp_path: Path) -> None:
    """A provider returning the default Usage() is one request without counts: cost None, never 0.

    The turn record, the header and the JSON result say how many calls were not counted.
    """
    h = Harness(reply(None, call("noop"), usage=Usage()), reply("done"), tools=[noop], priced=True)
    pricing = {"s:m": {"input": 1.0, "output": 10.0}}
    async with make_runtime(tmp_path, h, pricing=pricing) as rt:
        run, result = await run_to_rest(rt, defn(tools=[noop]))
        assert (result.usage.requests, result.usage.unreported_requests) == (2, 1)
        assert result.cost.amount is None
        first, second = records_of(await rt.records(run.instance_id), "turn")
        assert first["cost"] is None
        assert first["usage"]["unreportedRequests"] == 1
        assert second["cost"] == pytest.approx(11.0 / 1_000_000)
        header = await rt.store.read_header(run.instance_id)
        assert header["usage"]["unreportedRequests"] == 1
        assert usage_to_json(result.usage)["unreportedRequests"] == 1
    async with make_runtime(tmp_path, Harness(tools=[noop], priced=True), pricing=pricing) as rt2:
        again = (await rt2.get_agent(run.instance_id)).inst.result()
        assert (again.usage.unreported_requests, again.cost.amount) == (1, None)

"""The garbage-collector policy during bursts (issue 30, point 2): raised while many segments run, put back after."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import anyio
import pytest

import loopwright
from loopwright import Definition, Message, ModelResponse, hookimpl
from loopwright._definition import Assembly, StoreConfig
from loopwright._gc import BURST, BurstPolicy
from loopwright.abc import Provider


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """The process's thresholds, put back after the test whatever it did."""
    saved = gc.get_threshold()
    yield saved
    gc.set_threshold(*saved)


def test_the_threshold_is_raised_from_the_bound_and_put_back_below_a_quarter(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(700, 10, 10)
    policy = BurstPolicy(segments=8, threshold=20_000, enabled=True)
    for _ in range(7):
        policy.segment_started()
    assert gc.get_threshold() == (700, 10, 10)
    policy.segment_started()
    assert gc.get_threshold() == (20_000, 10, 10)
    assert policy.raised
    for _ in range(6):  # 2 left: not yet below a quarter of 8
        policy.segment_ended()
    assert gc.get_threshold() == (20_000, 10, 10)
    policy.segment_ended()
    assert gc.get_threshold() == (700, 10, 10)
    assert not policy.raised


def test_a_host_setting_is_never_lowered_nor_overwritten(thresholds: tuple[int, int, int]) -> None:
    policy = BurstPolicy(segments=2, threshold=20_000, enabled=True)
    gc.set_threshold(100_000, 10, 10)  # the host raised it further: left alone
    policy.segment_started()
    policy.segment_started()
    assert gc.get_threshold() == (100_000, 10, 10)
    policy.segment_ended()
    policy.segment_ended()
    assert gc.get_threshold() == (100_000, 10, 10)
    gc.set_threshold(700, 10, 10)
    policy.segment_started()
    policy.segment_started()
    assert gc.get_threshold() == (20_000, 10, 10)
    gc.set_threshold(5_000, 1, 1)  # the host set its own during the burst: kept at the end
    policy.segment_ended()
    policy.segment_ended()
    assert gc.get_threshold() == (5_000, 1, 1)


def test_off_by_the_environment(monkeypatch: pytest.MonkeyPatch, thresholds: tuple[int, int, int]) -> None:
    monkeypatch.setenv("LOOPWRIGHT_GC_BURST", "0")
    gc.set_threshold(700, 10, 10)
    policy = BurstPolicy(segments=1, threshold=20_000)
    policy.segment_started()
    assert gc.get_threshold() == (700, 10, 10)


class Slow(Provider):
    """Answers after the test lets it: every segment is running at the moment the test looks."""

    def __init__(self, settings: object, gate: anyio.Event) -> None:
        self.gate = gate

    async def complete(self, request: object) -> ModelResponse:
        await self.gate.wait()
        return ModelResponse(message=Message(role="assistant", content="done"))


@pytest.mark.anyio
async def test_a_burst_of_real_segments_raises_it_and_resting_puts_it_back(
        tmp_path: object, thresholds: tuple[int, int, int]) -> None:
    gate = anyio.Event()

    class Plugin:
        @hookimpl
        def loopwright_register_providers(self, register):
            register("slow", lambda settings: Slow(settings, gate))

    gc.set_threshold(700, 10, 10)
    assembly = Assembly(store=StoreConfig(kind="file", options={"path": str(tmp_path)}))
    async with loopwright.Runtime(assembly, plugins=[Plugin()]) as rt:
        definition = Definition(name="a", model="slow:any")
        runs = [await rt.start_agent(definition, prompt=f"p{i}") for i in range(BURST.segments)]
        assert BURST.raised
        assert gc.get_threshold()[0] == BURST.threshold
        gate.set()
        for run in runs:
            await run.result()
        with anyio.fail_after(30):
            while BURST.raised:
                await anyio.sleep(0.01)
    assert gc.get_threshold() == (700, 10, 10)

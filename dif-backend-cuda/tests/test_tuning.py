"""`tuning.fastest` without a GPU: a fake device clock (each candidate call advances it by that candidate's
cost) stands in for CUDA events, so the choice, the warm-up and the dropping of failing candidates can be
checked exactly."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

import pytest

from dif_backend_cuda import tuning


class FakeDevice:
    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[int] = []

    def module(self) -> types.ModuleType:
        device = self

        class Event:
            def record(self, stream: object) -> None:
                self.at = device.now

            def synchronize(self) -> None:
                pass

        cupy = types.ModuleType("cupy")
        cupy.cuda = types.SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: b.at - a.at)  # type: ignore[attr-defined]
        return cupy


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> FakeDevice:
    fake = FakeDevice()
    monkeypatch.setitem(sys.modules, "cupy", fake.module())
    return fake


Runner = Callable[[int], None]


class Stream:
    def synchronize(self) -> None:
        pass


def runner(device: FakeDevice, cost: Callable[[int, int], float], fails: frozenset[int] = frozenset()) -> Runner:
    """`cost(index, nth call of that index)` in ms; indices in `fails` raise like an unsupported algorithm."""
    seen: dict[int, int] = {}

    def run(index: int) -> None:
        if index in fails:
            raise RuntimeError("not supported")
        seen[index] = seen.get(index, 0) + 1
        device.calls.append(index)
        device.now += cost(index, seen[index])

    return run


def test_picks_the_cheapest_and_reports_its_time(device: FakeDevice) -> None:
    costs = [1.0, 0.7, 0.9]
    index, ms = tuning.fastest(runner(device, lambda i, n: costs[i]), 3, Stream())
    assert (index, ms) == (1, pytest.approx(0.7))


def test_warm_up_keeps_a_cold_start_from_deciding(device: FakeDevice) -> None:
    """The device is slow for its first 20 ms (clocks ramping): candidate 0, timed first, must still win."""

    def cost(index: int, nth: int) -> float:
        base = (0.5, 0.55)[index]
        return base * 3 if device.now < 20.0 else base

    index, _ = tuning.fastest(runner(device, cost), 2, Stream())
    assert index == 0
    assert device.now >= tuning.WARM_MS


def test_median_ignores_one_slow_round(device: FakeDevice) -> None:
    """One batch of candidate 0 is 12x slow (a hiccup): its mean would lose to candidate 1, its median wins."""
    slow_calls = [0]

    def cost(index: int, nth: int) -> float:
        if index == 1 and nth == 3:  # candidate 1's first round (nth 1, 2 were its probe): slow 0's next batch
            slow_calls[0] = tuning.BATCH
        if index == 0 and slow_calls[0]:
            slow_calls[0] -= 1
            return 5.0
        return 0.4 if index == 0 else 0.45

    index, ms = tuning.fastest(runner(device, cost), 2, Stream())
    assert (index, ms) == (0, pytest.approx(0.4))
    assert (5.0 + (tuning.ROUNDS - 1) * 0.4) / tuning.ROUNDS > 0.45


def test_failing_candidates_are_dropped_and_all_failing_raises(device: FakeDevice) -> None:
    index, _ = tuning.fastest(runner(device, lambda i, n: 1.0 - 0.1 * i, fails={2}), 3, Stream())
    assert index == 1 and 2 not in device.calls
    with pytest.raises(RuntimeError, match="none of the 2 candidates"):
        tuning.fastest(runner(device, lambda i, n: 1.0, fails={0, 1}), 2, Stream())


def test_a_far_slower_candidate_is_not_timed_past_its_probe(device: FakeDevice) -> None:
    """Probed with two calls (the first pays lazy loading: here 10x), then dropped at 3x the best."""
    costs = [1.0, 3.0, 1.1]
    index, _ = tuning.fastest(runner(device, lambda i, n: costs[i] * (10 if n == 1 else 1)), 3, Stream())
    assert index == 0
    assert device.calls.count(1) == 2 and device.calls.count(2) > 2

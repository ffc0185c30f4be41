"""Choosing the fastest of a library's candidate kernels for one problem (cuBLASLt algorithms, cuDNN
execution plans), at prepare time, on the problem's own device buffers.

Timing has to survive two effects that would otherwise decide the choice: the GPU's clocks ramp up from
idle over tens of milliseconds (whichever candidate is timed first looks slow), and a long forward runs
at the power limit (a candidate that wins one isolated call may not win back-to-back). So the device is
first kept busy for `WARM_MS`, then every candidate is timed `ROUNDS` times in turn, each time over
`BATCH` back-to-back calls, and the median decides. Candidates more than `PRUNE` times slower than the
best on one (second) call are dropped first: slow cuDNN convolution plans would otherwise cost seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

WARM_MS = 30.0
ROUNDS = 5
BATCH = 3
WARM_LIMIT = 200  # calls at most while warming (a tiny problem never reaches WARM_MS)
PRUNE = 1.5  # candidates slower than this many times the best single call are not timed further


def fastest(run: Callable[[int], None], count: int, stream: Any) -> tuple[int, float]:
    """(index, median ms per call) of the fastest of `count` candidates; `run(i)` enqueues candidate i
    once on `stream`. A candidate that raises is dropped; RuntimeError when none runs."""
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()

    def timed(index: int, calls: int) -> float:
        start.record(stream)
        for _ in range(calls):
            run(index)
        end.record(stream)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end)

    probe: dict[int, float] = {}
    for index in range(count):
        try:
            timed(index, 1)  # the first call pays lazy module loading and library setup
            probe[index] = timed(index, 1)
        except Exception:  # noqa: BLE001 - a candidate the library cannot run is simply not chosen
            stream.synchronize()
    if not probe:
        raise RuntimeError(f"none of the {count} candidates could run")
    # a candidate far behind on one call cannot win; timing it further would only lengthen prepare
    alive = sorted(probe, key=probe.__getitem__)
    alive = [i for i in alive if probe[i] <= PRUNE * probe[alive[0]]]
    warmed, calls = 0.0, 0
    while warmed < WARM_MS and calls < WARM_LIMIT:
        warmed += timed(alive[0], 4)
        calls += 4
    times: dict[int, list[float]] = {i: [] for i in alive}
    for _ in range(ROUNDS):
        for index in alive:
            times[index].append(timed(index, BATCH) / BATCH)
    best = min(alive, key=lambda i: statistics.median(times[i]))
    return best, statistics.median(times[best])

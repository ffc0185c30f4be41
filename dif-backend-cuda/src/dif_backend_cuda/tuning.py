"""Choosing the fastest of a library's candidate kernels for one problem (cuBLASLt algorithms, cuDNN
execution plans), at prepare time, on the problem's own device buffers, and keeping the choice on disk.

`Choices` decides per problem: a choice made before (this process, or the disk cache keyed by library
version, device, driver and problem) is reused; otherwise, with tuning on (`DIF_CUDA_TUNE=on`), the
candidates are timed (`fastest`) and the winner stored; with the default `cached`, the library's own first
candidate runs and nothing is timed, so a first run never stalls on probing.

Timing has to survive two effects that would otherwise decide the choice: the GPU's clocks ramp up from
idle over tens of milliseconds (whichever candidate is timed first looks slow), and a long forward runs
at the power limit (a candidate that wins one isolated call may not win back-to-back). So the device is
first kept busy for `WARM_MS`, then every candidate is timed `ROUNDS` times in turn, each time over
`BATCH` back-to-back calls, and the median decides. Candidates more than `PRUNE` times slower than the
best on one (second) call are dropped first: slow cuDNN convolution plans would otherwise cost seconds.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dif.diskcache import key_digest, read_entry, write_entry

TUNE_CHOICES = ("cached", "on", "off")
"""`tune` of the cuda backend: reuse stored choices (else the library's first), time misses and store them,
or always take the library's first."""

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


def choose_form(
    choices: Choices, problem: tuple[Any, ...], makers: Sequence[Callable[[], Any]], stream: Any
) -> tuple[int, Any]:
    """(index, step) of the form of one node to run: `makers[i]()` builds form i's step (a callable on a
    stream), each at most once and only when it is timed or chosen; `Choices.choose` decides (a stored
    choice, else with tuning on the fastest by `fastest`, else form 0)."""
    built: dict[int, Any] = {}

    def form(i: int) -> Any:
        if i not in built:
            built[i] = makers[i]()
        return built[i]

    def measure() -> int:
        return fastest(lambda i: form(i)(stream), len(makers), stream)[0]

    index, _how = choices.choose(problem, len(makers), measure)
    return index, form(index)


class Choices:
    """The candidate index chosen per problem for one library (`library`, at `version`) on one device
    (`device`: name, arch, driver ...), under `mode` (one of `TUNE_CHOICES`); stored choices live under
    `root` as `dif.diskcache` entries, one per problem."""

    def __init__(self, library: str, version: str, device: Mapping[str, str], mode: str, root: Path) -> None:
        if mode not in TUNE_CHOICES:
            raise ValueError(f"tune mode {mode!r} is not one of {TUNE_CHOICES}")
        self.library, self.mode, self.root = library, mode, root
        self.fingerprint = {"library": library, "version": version, **device}
        self._memo: dict[tuple[Any, ...], tuple[int, str]] = {}

    def choose(self, problem: tuple[Any, ...], count: int, measure: Callable[[], int]) -> tuple[int, str]:
        """(index among `count` candidates, how it was chosen: "tuned", "cached" or "heuristic");
        `measure()` times the candidates and returns the fastest one's index (called in mode "on" only,
        once per problem and count)."""
        memo_key = (*problem, count)
        if memo_key in self._memo:
            return self._memo[memo_key]
        if self.mode == "off" or count < 2:
            return self._memo.setdefault(memo_key, (0, "heuristic"))
        key = {**self.fingerprint, "problem": repr(problem), "candidates": str(count)}
        path = self.root / f"{self.library}-{key_digest(key)}.json"
        stored = read_entry(path, key)
        choice = _stored_choice(stored, count) if stored is not None else None
        if choice is not None:
            return self._memo.setdefault(memo_key, (choice, "cached"))
        if self.mode == "cached":
            return self._memo.setdefault(memo_key, (0, "heuristic"))
        choice = measure()
        write_entry(path, json.dumps({"choice": choice}).encode(), key)
        return self._memo.setdefault(memo_key, (choice, "tuned"))

    def _artifact_key(self, problem: tuple[Any, ...]) -> tuple[Path, dict[str, str]]:
        key = {**self.fingerprint, "problem": repr(problem), "artifact": "plan"}
        return self.root / f"{self.library}-plan-{key_digest(key)}.bin", key

    def read_artifact(self, problem: tuple[Any, ...]) -> bytes | None:
        """The library's built plan for `problem` stored by `write_artifact` (a serialized cuDNN execution plan),
        None when there is none intact for this library version and device."""
        path, key = self._artifact_key(problem)
        return read_entry(path, key)

    def write_artifact(self, problem: tuple[Any, ...], payload: bytes) -> None:
        path, key = self._artifact_key(problem)
        write_entry(path, payload, key)


def _stored_choice(payload: bytes, count: int) -> int | None:
    """The index an intact entry holds, when it is one of `count` candidates (else None: re-decided)."""
    try:
        choice = json.loads(payload)["choice"]
    except (ValueError, KeyError, TypeError):
        return None
    return choice if isinstance(choice, int) and 0 <= choice < count else None

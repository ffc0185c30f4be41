"""What a run cost: wall time per named stage and the process's peak resident memory.

Where it sits: around the stages of a pipeline (load, encode, denoise, decode, save). The numbers
go into the run's summary (`dif.report`) and, as `stage.NAME` events, into its telemetry document.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from attrs import define, field


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


@define
class StageTimer:
    """Seconds per stage, in the order the stages finished; `on_stage(name, seconds)` hears each one.

    A stage that raises records nothing (its time would describe a run that did not happen)."""

    on_stage: Callable[[str, float], None] | None = None
    timings: dict[str, float] = field(factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.record(name, time.perf_counter() - start)

    def record(self, name: str, seconds: float) -> None:
        self.timings[name] = seconds
        if self.on_stage is not None:
            self.on_stage(name, seconds)


def stage_events(timings: Mapping[str, float]) -> list[dict[str, Any]]:
    """Telemetry events `{"name": "stage.NAME", "ms": ...}` for stage timings in seconds."""
    return [{"name": f"stage.{name}", "ms": round(seconds * 1000.0, 3)} for name, seconds in timings.items()]

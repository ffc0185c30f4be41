"""Fuzzing, step 2: a reader under fuzz (`FuzzTarget`) and the loop that feeds it mutated inputs.

Where it sits: `dif.testing.fuzz_targets` lists dif-core's readers as targets (frontends' tests add
theirs); `run_fuzz` gives each case to the reader and keeps every exception that is not a `DifError`
(each one a bug: a reader must say what is wrong with a file, not crash). perf/fuzz.py runs every
target at scale; a short run in the tests keeps the count at zero.
"""

from __future__ import annotations

import atexit
import hashlib
import random
import shutil
import signal
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from attrs import frozen

from dif.errors import DifError
from dif.testing.fuzz_mutate import Kind, Mutator


@frozen
class FuzzTarget:
    """One reader: `load` takes the bytes of one file (writing them where the reader wants a path);
    `seeds` makes the valid inputs that mutations start from; `kind` picks the mutations."""

    name: str
    load: Callable[[bytes], object]
    seeds: Callable[[], Sequence[bytes]]
    kind: Kind
    reader: str  # the reader's function, for the table


@frozen
class Failure:
    """A non-DifError exception: its type, message, where it was raised, the input's sha256 and case index."""

    type: str
    message: str
    where: str
    sha256: str
    case: int


@frozen
class FuzzResult:
    target: str
    cases: int
    failures: tuple[Failure, ...]
    seconds: float
    slowest_case_s: float


class CaseTimeout(BaseException):
    """Raised into a case that runs past its limit (a BaseException: a reader's `except Exception` cannot hide it)."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise CaseTimeout


def _raised_at(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if "/dif" in f.filename] or frames
    last = inside[-1] if inside else None
    return "?" if last is None else f"{Path(last.filename).name}:{last.lineno} ({last.name})"


def case_input(target: FuzzTarget, mutator: Mutator, seed: int, case: int) -> bytes:
    """The input of case `case` (the same for the same target, seed and index, in any process)."""
    return mutator.case(random.Random(f"{seed}:{target.name}:{case}"))


def run_fuzz(
    target: FuzzTarget, cases: int, seed: int = 0, *, start: int = 0, case_timeout_s: float = 20.0
) -> FuzzResult:
    """Feed cases `start .. start+cases-1` to `target.load`. Every exception other than a `DifError`
    (a timeout included, when this runs on the main thread where SIGALRM can interrupt) is a `Failure`."""
    mutator = Mutator(target.seeds(), target.kind)
    failures: list[Failure] = []
    timed = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, _on_alarm) if timed else None
    slowest = 0.0
    began = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DifWarnings (and library warnings) about broken inputs are expected
            for case in range(start, start + cases):
                data = case_input(target, mutator, seed, case)
                t0 = time.perf_counter()
                try:
                    if timed:
                        signal.setitimer(signal.ITIMER_REAL, case_timeout_s)
                    try:
                        target.load(data)
                    finally:
                        if timed:
                            signal.setitimer(signal.ITIMER_REAL, 0)
                except DifError:
                    pass
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as exc:  # noqa: B036 - a Rust panic surfaces as a BaseException
                    message = f"case ran past {case_timeout_s} s" if isinstance(exc, CaseTimeout) else str(exc)
                    sha = hashlib.sha256(data).hexdigest()
                    failures.append(Failure(type(exc).__name__, message[:300], _raised_at(exc), sha, case))
                slowest = max(slowest, time.perf_counter() - t0)
    finally:
        if timed:
            signal.signal(signal.SIGALRM, previous)
    return FuzzResult(target.name, cases, tuple(failures), time.perf_counter() - began, slowest)


def check_seeds(target: FuzzTarget) -> None:
    """Load every seed of `target`: a seed the reader rejects would make its mutations test nothing."""
    for seed in target.seeds():
        target.load(seed)


_SCRATCH: dict[str, Path] = {}


def scratch_dir(name: str) -> Path:
    """A per-process folder for readers that need a path (in /dev/shm when there is one: cases write a file each)."""
    if name not in _SCRATCH:
        base = "/dev/shm" if Path("/dev/shm").is_dir() else None
        _SCRATCH[name] = Path(tempfile.mkdtemp(prefix=f"dif-fuzz-{name}-", dir=base))
        atexit.register(shutil.rmtree, _SCRATCH[name], ignore_errors=True)
    return _SCRATCH[name]


def write_case(folder: Path, file_name: str, data: bytes) -> Path:
    """`data` as `folder/file_name`, on a new inode (an earlier case's file may still be memory-mapped)."""
    path = folder / file_name
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    return path

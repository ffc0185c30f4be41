"""Progress on stderr while a pipeline loads and denoises: weight bytes and GB/s while programs are
prepared, then a step counter with the denoising rate.

Where it sits: a CLI opens a `ProgressBar` around a pipeline's run and hands `ProgressBar.step` to it as
its `on_step`. While the bar is open it is also the process's load listener: `dif.runtime` wraps each
program's prepare in `loading(name, nbytes)`, a backend that copies weights reports each chunk through
`byte_callback()` (the CUDA uploader), and the image pipeline calls `stage_starting(name)` as each stage
begins. The rate on the step line covers the denoising steps only (from the start of the "denoise"
stage to the latest step; decode and save come after it and never count). Nothing is drawn in --json
mode or when stderr is not a TTY, and nothing is listening then, so the hooks cost a lookup.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

_LISTENER: ContextVar[ProgressBar | None] = ContextVar("dif_progress_listener", default=None)
MIN_INTERVAL_S = 0.1
"""Load lines are redrawn at most this often (10 Hz): chunks arrive far faster."""


def byte_callback() -> Callable[[int], None] | None:
    """The open bar's `add_bytes` (callable from any thread), None when nothing is listening."""
    bar = _LISTENER.get()
    return bar.add_bytes if bar is not None else None


@contextmanager
def loading(what: str, nbytes: int) -> Iterator[None]:
    """One program's prepare, `nbytes` of its weights placed on the device; the open bar, if any, shows
    the bytes its backend reports meanwhile, or `nbytes` as mapped when the backend reports none (a CPU
    backend reads weights when they are first used)."""
    bar = _LISTENER.get()
    if bar is None:
        yield
        return
    bar.begin_load(what, nbytes)
    try:
        yield
    finally:
        bar.end_load()


def stage_starting(name: str) -> None:
    """Tell the open bar, if any, that the pipeline's stage `name` begins now."""
    bar = _LISTENER.get()
    if bar is not None:
        bar.stage_starting(name)


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:02d}:{s:02d}"


class ProgressBar:
    """Draws on `stream` (default stderr) unless `quiet`; use as a context manager (which makes it the
    load listener) or call `close`. `clock` is for tests."""

    def __init__(
        self,
        desc: str = "denoise",
        *,
        quiet: bool = False,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet or not self.stream.isatty()
        self.clock = clock
        self._lock = threading.Lock()
        self._line = ""  # the kind of line drawn and not yet ended ("load", "step"), "" for none
        self._token: object = None
        # loading
        self._what = ""
        self._load_bytes = 0  # this program's expected weight bytes
        self._copied = 0  # bytes the backend reported, this program
        self._load_start = 0.0
        self._drawn_at = float("-inf")
        self.copied_bytes = 0  # all programs
        self.mapped_bytes = 0
        # denoising
        self._denoise_start: float | None = None
        self._first_step: float | None = None
        self.rate: float | None = None  # steps per second of the latest step line

    # -- load ------------------------------------------------------------------------------------------
    def begin_load(self, what: str, nbytes: int) -> None:
        with self._lock:
            self._what, self._load_bytes, self._copied = what, nbytes, 0
            self._load_start = self.clock()
            self._draw_load(force=True)

    def add_bytes(self, n: int) -> None:
        """`n` more weight bytes copied to the device (called from upload threads)."""
        with self._lock:
            self._copied += n
            self.copied_bytes += n
            self._draw_load(force=False)

    def end_load(self) -> None:
        with self._lock:
            if self._copied == 0:
                self.mapped_bytes += self._load_bytes
            self._draw_load(force=True)

    def _draw_load(self, *, force: bool) -> None:
        now = self.clock()
        if self.quiet or (not force and now - self._drawn_at < MIN_INTERVAL_S):
            return
        self._drawn_at = now
        if self._copied:
            seconds = max(now - self._load_start, 1e-9)
            text = (
                f"load {self._what}: {_size(self._copied)} of {_size(self._load_bytes)} "
                f"at {self._copied / seconds / 1e9:.2f} GB/s (all programs: {_size(self.copied_bytes)})"
            )
        else:
            text = f"load {self._what}: {_size(self._load_bytes)} of weights (read from the file when first used)"
        self._write(text, "load")

    # -- denoise ---------------------------------------------------------------------------------------
    def stage_starting(self, name: str) -> None:
        if name == self.desc:
            self._denoise_start = self.clock()
            self._first_step = None

    def step(self, done: int, total: int) -> None:
        """One more step finished (`done` of `total`). The rate: steps since the denoise stage began over
        the time they took; without that start, steps after the first over the time since it."""
        now = self.clock()
        if self._denoise_start is not None:
            elapsed, counted = now - self._denoise_start, done
        else:
            if self._first_step is None:
                self._first_step = now
            elapsed, counted = now - self._first_step, done - 1
        self.rate = counted / elapsed if counted > 0 and elapsed > 0 else None
        if self.quiet:
            return
        speed = ""
        if self.rate is not None:
            left = (total - done) / self.rate
            per = f"{self.rate:.2f}it/s" if self.rate >= 1 else f"{1 / self.rate:.2f}s/it"
            speed = f" [{_clock(elapsed)}<{_clock(left)}, {per}]"
        with self._lock:
            self._write(f"{self.desc} {done}/{total}{speed}", "step")
            if done >= total:
                self._end_line()  # the final rate is the steps', drawn now: decode comes after

    # -- drawing ---------------------------------------------------------------------------------------
    def _write(self, text: str, kind: str) -> None:
        """Redraw the current line, or end it first when it shows the other kind (keeping the last
        load line above the steps)."""
        if self._line and self._line != kind:
            self._end_line()
        self.stream.write(f"\r{text}\x1b[K")
        self.stream.flush()
        self._line = kind

    def _end_line(self) -> None:
        if self._line:
            self.stream.write("\n")
            self.stream.flush()
            self._line = ""

    def close(self) -> None:
        with self._lock:
            self._end_line()
        if self._token is not None:
            _LISTENER.reset(self._token)  # type: ignore[arg-type]
            self._token = None

    def __enter__(self) -> ProgressBar:
        if not self.quiet:
            self._token = _LISTENER.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

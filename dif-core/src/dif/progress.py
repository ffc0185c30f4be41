"""A step counter on stderr for host-side sampling loops (`on_step(done, total)` callbacks).

Where it sits: a CLI hands `ProgressBar.step` to a pipeline as its `on_step`. With tqdm installed
(the frontends depend on it) the bar is tqdm's `N/M [mm:ss<mm:ss, X.XXit/s]`; without it, a plain
`desc N/M` line rewritten in place. Nothing is drawn in --json mode or when stderr is not a TTY,
so stdout/stderr stay clean for tools.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


class ProgressBar:
    """Draws on `stream` (default stderr) unless `quiet`; use as a context manager or call `close`."""

    def __init__(self, desc: str = "denoise", *, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet or not self.stream.isatty()
        self._bar: Any = None
        self._plain = False

    def step(self, done: int, total: int) -> None:
        """One more step finished (`done` of `total`)."""
        if self.quiet:
            return
        if self._bar is None and not self._plain:
            try:
                from tqdm import tqdm  # type: ignore[import-untyped]
            except ImportError:
                self._plain = True
            else:
                self._bar = tqdm(total=total, desc=self.desc, unit="it", file=self.stream, dynamic_ncols=True)
        if self._bar is not None:
            self._bar.update(1)
        else:
            self.stream.write(f"\r{self.desc} {done}/{total}")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._plain:
            self.stream.write("\n")
            self._plain = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

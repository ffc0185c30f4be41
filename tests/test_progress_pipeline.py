"""Through a real pipeline run (the embedded FLUX.2 demo on the CPU backend): the progress bar's rate
covers the denoising steps only, so it agrees with the summary's steps per second even when the decode
after the last step is slow. Cross-distribution (dif-core + the flux2 frontend), hence here."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest

from dif.progress import ProgressBar


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_of_a_pipeline_run_agrees_with_its_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dif
    from dif.plugins import isolated_plugins

    with isolated_plugins(None):
        pipe = dif.load(family="flux2", backend="cpu", dtype="f32")
        decode = type(pipe.pipeline).decode

        def slow_decode(self, latents: np.ndarray, h: int, w: int) -> np.ndarray:  # noqa: ANN001
            time.sleep(0.5)  # longer than the whole denoise: counted in the rate, it would halve it or worse
            return decode(self, latents, h, w)

        monkeypatch.setattr(type(pipe.pipeline), "decode", slow_decode)
        with ProgressBar(stream=_Tty()) as bar:
            result = pipe("a fox", width=128, height=128, steps=3, seed=1, on_step=lambda d, n, _x: bar.step(d, n))
    summary_rate = 3 / result.run.timings["denoise"]
    assert bar.rate == pytest.approx(summary_rate, rel=0.3)  # counting the decode would halve it or worse

"""Issue 14 through the Python API: `dif.load(...)(..., check_finite=...)` stops at the first non-finite
stage output by default and runs on when asked, like the CLI's --check-finite / --no-check-finite."""

from __future__ import annotations

import numpy as np
import pytest

import dif
from dif.errors import NonFiniteError, UsageError

pytest.importorskip("dif_frontend_flux2", reason="the embedded checkpoint comes with the FLUX.2 frontend")


def test_nan_noise_stops_the_run_unless_checks_are_off() -> None:
    pipe = dif.load(family="flux2", backend="cpu")
    noise = np.full((1, 128, 2, 2), np.nan, np.float32)
    with pytest.raises(NonFiniteError, match=r"initial latents has non-finite values: 512 NaN of 512"):
        pipe("x", width=32, height=32, steps=1, seed=0, init_noise=noise)
    with np.errstate(invalid="ignore"):  # NaN pixels cast to uint8: numpy's warning, expected here
        out = pipe("x", width=32, height=32, steps=1, seed=0, init_noise=noise, check_finite=False)
    assert out.run.pixels.shape == (32, 32, 3) and np.isnan(out.run.latents).all()  # garbage, as asked


def test_absurd_sizes_are_refused_before_any_work() -> None:
    pipe = dif.load(family="flux2", backend="cpu")
    with pytest.raises(UsageError, match=r"image size 65536x65536 \(16777216 latent tokens\) is beyond"):
        pipe("x", width=65536, height=65536, seed=0)

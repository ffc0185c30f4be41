"""The t2va loop and the video decode of the embedded tiny checkpoint on the CUDA backend against the
reference interpreter (fp32), and one bf16 loop against the fp32 one. Skips with the reason where the CUDA
backend cannot run (no GPU on the machine these tests were written on: tolerances not measured here)."""

from __future__ import annotations

import numpy as np
import pytest

from dif.dtypes import DType
from dif.testing.backends import backend_skip_reason
from dif_frontend_h3 import DEFAULT_CHECKPOINT
from dif_frontend_h3.pipeline import H3Pipeline, VideoRequest
from dif_frontend_h3.weights import open_checkpoint

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if (why := backend_skip_reason("cuda")) is not None:
        pytest.skip(f"CUDA backend unavailable: {why}")


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _run(backend: str, dtype: DType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pipe = H3Pipeline(open_checkpoint(DEFAULT_CHECKPOINT), backend=backend, dtype=dtype)
    req = VideoRequest("a lantern swinging in the wind", frames=22, width=128, height=96, steps=4, seed=1)
    layout = pipe.check(req, decode=False)
    noise = pipe.initial_noise(req, layout)
    latents, audio_rows = pipe.sample(pipe.encode(req.prompt), layout, noise.video, noise.audio, req.steps)
    return latents, audio_rows, pipe.decode_video(latents)


def test_cuda_matches_reference() -> None:
    ref = _run("interp", DType.F32)
    got = _run("cuda", DType.F32)
    assert _rel(got[0], ref[0]) <= 1e-4 and _rel(got[1], ref[1]) <= 1e-4
    assert np.abs(got[2].astype(int) - ref[2]).max() <= 2  # uint8 frames


def test_cuda_bf16_close_to_fp32() -> None:
    ref = _run("cuda", DType.F32)
    got = _run("cuda", DType.BF16)
    for g, r in zip(got[:2], ref[:2], strict=True):
        cos = float(np.vdot(g.ravel(), r.ravel()) / (np.linalg.norm(g) * np.linalg.norm(r)))
        assert cos >= 0.99

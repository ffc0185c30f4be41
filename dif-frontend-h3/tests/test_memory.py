"""One memory budget for the whole H3 pipeline (CPU backend, embedded tiny checkpoint): below text encoder +
DiT together, the text encoder is released before the DiT is prepared, and the latents are the same."""

from __future__ import annotations

import numpy as np
import pytest

from dif_frontend_h3 import DEFAULT_CHECKPOINT
from dif_frontend_h3.pipeline import H3Pipeline, VideoRequest
from dif_frontend_h3.weights import open_checkpoint


def test_text_encoder_released_before_the_dit() -> None:
    pytest.importorskip("dif_backend_cpu", reason="needs dif-backend-cpu")
    req = VideoRequest("a bell rings twice", 22, 128, 96, 3, seed=1)
    roomy = H3Pipeline(open_checkpoint(DEFAULT_CHECKPOINT), backend="cpu")
    want = roomy.generate(req, decode=False)
    need = roomy.memory_report()["pipeline"]["cpu"]["allowance_bytes"]
    assert roomy.memory_report()["pipeline"]["cpu"]["strategy"] == "all-resident"
    tight = H3Pipeline(open_checkpoint(DEFAULT_CHECKPOINT), backend="cpu", vram_budget=max(need.values()) + 1024)
    got = tight.generate(req, decode=False)
    report = tight.memory_report()
    assert report["pipeline"]["cpu"]["strategy"] == "release-text-encoder"
    assert report["releases"] == ["h3_text_encoder before denoise"]
    np.testing.assert_array_equal(got.video_latents, want.video_latents)
    np.testing.assert_array_equal(got.audio_latents, want.audio_latents)

"""`H3Pipeline.video_request` (plain values -> a checked `VideoRequest`, the checkpoint's defaults for what is
left out: what `dif serve` calls, since dif-tools imports no frontend), `save_mp4` (the MP4 `dif h3 generate`
writes) and the decode-chunk refusal: 5 frames (2 latent frames, fewer than one chunk of the video VAE) are
refused by `check`, before any program is built, naming the fewest frames that decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dif.errors import UsageError
from dif_frontend_h3 import DEFAULT_CHECKPOINT, plugin


@pytest.fixture(scope="module")
def pipe() -> Any:
    pytest.importorskip("dif_backend_cpu", reason="needs dif-backend-cpu")
    assert plugin.INFO.pipeline is not None
    return plugin.INFO.pipeline(DEFAULT_CHECKPOINT, backend="cpu")


def test_video_request_takes_the_checkpoints_defaults(pipe: Any) -> None:
    req = pipe.video_request("a cat")
    assert (req.frames, req.width, req.height, req.steps, req.seed, req.keyframes) == (22, 128, 96, 6, 0, ())
    first = np.zeros((32, 64, 3), np.uint8)
    req = pipe.video_request("a cat", frames=39, width=64, height=32, steps=2, seed=5, first_frame=first)
    assert (req.frames, req.width, req.height, req.steps, req.seed) == (39, 64, 32, 2, 5)
    assert [(k.anchor, k.name) for k in req.keyframes] == [("first", "first_frame")]
    pipe.check(req)


def test_too_few_frames_for_one_decode_chunk_is_refused_by_check(pipe: Any) -> None:
    with pytest.raises(UsageError, match="the fewest frames it decodes is 22"):
        pipe.check(pipe.video_request("a cat", frames=5, width=32, height=32, steps=2))
    pipe.check(pipe.video_request("a cat", frames=5, width=32, height=32, steps=2), decode=False)


def test_save_mp4_writes_the_run(pipe: Any, tmp_path: Path) -> None:
    pytest.importorskip("av", reason="MP4 through PyAV")
    from dif.media.mp4 import read_mp4

    result = pipe.generate(pipe.video_request("waves", frames=22, width=32, height=32, steps=2, seed=3))
    path = pipe.save_mp4(result, tmp_path / "v.mp4", version="test")
    got = read_mp4(path)
    assert got["frames"].shape == (22, 32, 32, 3) and got["audio"].shape == (2, round(22 * 32000 / 24))
    assert got["dif"]["dif"]["version"] == "test" and got["dif"]["dif"]["seed"] == 3
    assert got["parameters"].startswith("waves\nSteps: 2, Seed: 3, Size: 32x32, Frames: 22, FPS: 24")

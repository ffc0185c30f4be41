"""dif.media.mp4: H.264 yuv420p + AAC stereo written atomically, read back with both streams; metadata in the
container; bad input refused with nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.errors import UsageError

av = pytest.importorskip("av", reason="MP4 tests need PyAV")

from dif.media.mp4 import read_mp4, read_mp4_metadata, write_mp4  # noqa: E402

FPS, RATE = 24, 32000


def _clip(frames: int = 22, h: int = 64, w: int = 96) -> tuple[np.ndarray, np.ndarray]:
    y, x = np.mgrid[0:h, 0:w]
    video = np.stack(
        [np.stack([(x * 2 + i * 5) % 256, (y * 3) % 256, np.full_like(x, 40 + 8 * i)], -1) for i in range(frames)]
    ).astype(np.uint8)
    t = np.arange(round(frames * RATE / FPS)) / RATE
    audio = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 660 * t)])
    return video, audio


def test_round_trip_has_both_streams(tmp_path: Path) -> None:
    video, audio = _clip()
    out = write_mp4(tmp_path / "a.mp4", video, FPS, audio=audio, sample_rate=RATE,
                    parameters="a fox\nSteps: 4", metadata={"prompt": "a fox, 狐", "seed": 7})  # fmt: skip
    got = read_mp4(out)
    assert got["frames"].shape == video.shape
    assert got["fps"] == FPS
    assert abs(got["duration"] - len(video) / FPS) <= 1 / FPS
    assert got["sample_rate"] == RATE
    assert got["audio"].shape == (2, round(len(video) * RATE / FPS))  # exact: trimmed as the metadata says
    psnr = 10 * np.log10(255**2 / np.mean((got["frames"].astype(float) - video) ** 2))
    assert psnr > 30
    for ch in range(2):  # AAC is lossy: the tones survive, aligned (priming skipped)
        corr = np.corrcoef(got["audio"][ch, 2048:-2048], audio[ch, 2048:-2048])[0, 1]
        assert corr > 0.99
    meta = read_mp4_metadata(out)
    assert meta["parameters"] == "a fox\nSteps: 4"
    assert meta["dif"]["prompt"] == "a fox, 狐" and meta["dif"]["seed"] == 7
    assert meta["dif"]["media"]["audio_samples"] == audio.shape[1]
    assert [p.name for p in tmp_path.iterdir()] == ["a.mp4"]  # no temporary left


@pytest.mark.parametrize(
    "video, audio, match",
    [
        (np.zeros((3, 63, 64, 3), np.uint8), None, "even frame size"),
        (np.zeros((3, 64, 64), np.uint8), None, "uint8"),
        (np.zeros((3, 64, 64, 3), np.float32), None, "uint8"),
        (np.zeros((3, 64, 64, 3), np.uint8), np.zeros((3, 100), np.float32), "channels 1 or 2"),
        (np.zeros((3, 64, 64, 3), np.uint8), np.full((2, 100), np.nan, np.float32), "NaN"),
    ],
)
def test_bad_input_refused_nothing_written(
    tmp_path: Path, video: np.ndarray, audio: np.ndarray | None, match: str
) -> None:
    with pytest.raises(UsageError, match=match):
        write_mp4(tmp_path / "b.mp4", video, FPS, audio=audio)
    assert list(tmp_path.iterdir()) == []


def test_existing_file_kept_when_encode_fails(tmp_path: Path) -> None:
    target = tmp_path / "c.mp4"
    target.write_bytes(b"old")
    with pytest.raises(UsageError):
        write_mp4(target, np.zeros((1, 3, 4, 3), np.uint8), FPS)
    assert target.read_bytes() == b"old" and len(list(tmp_path.iterdir())) == 1

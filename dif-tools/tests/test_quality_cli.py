"""`dif quality`: metrics checked against torch computations of the same definitions (PSNR, 8x8 uniform-window
SSIM on BT.601 luma), sanity failures, the review protocol (PASS needs a current accepting review), bad
files refused as FAIL without a traceback, and MP4 frames + audio decoded with PyAV."""

from __future__ import annotations

import json
import math
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dif.quality.metrics import psnr, snr, ssim
from dif.telemetry import validate_document
from dif_tools.cli import build_cli


def invoke(args: list[str]) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(build_cli(), [*args, "--json"])
    assert "Traceback" not in result.output
    doc = json.loads(result.output)
    validate_document(doc)
    return result.exit_code, doc["data"]


def picture(seed: int, h: int = 48, w: int = 64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 4, yy * 5, (xx + yy) * 2], axis=-1).astype(np.float64)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def save_png(arr: np.ndarray, path: Path) -> Path:
    from PIL import Image

    Image.fromarray(arr).save(path)
    return path


def test_metrics_match_torch_definitions() -> None:
    torch = pytest.importorskip("torch", reason="torch is the oracle for the metric definitions")
    ref = picture(0)
    rng = np.random.default_rng(1)
    cand = np.clip(ref.astype(np.int16) + rng.integers(-6, 7, ref.shape), 0, 255).astype(np.uint8)
    r, c = torch.tensor(ref, dtype=torch.float64), torch.tensor(cand, dtype=torch.float64)
    mse = torch.mean((r - c) ** 2).item()
    assert psnr(cand, ref) == pytest.approx(10 * math.log10(255**2 / mse), abs=1e-9)

    wts = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)
    a, b = (c * wts).sum(-1)[None, None], (r * wts).sum(-1)[None, None]

    def pool(x: Any) -> Any:
        return torch.nn.functional.avg_pool2d(x, 8, stride=1)

    ma, mb = pool(a), pool(b)
    va, vb, cov = pool(a * a) - ma**2, pool(b * b) - mb**2, pool(a * b) - ma * mb
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    want = (((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma**2 + mb**2 + c1) * (va + vb + c2))).mean().item()
    assert ssim(cand, ref) == pytest.approx(want, abs=1e-9)
    assert ssim(ref, ref) == pytest.approx(1.0, abs=1e-12) and psnr(ref, ref) is None

    t = np.arange(4000) / 8000.0
    sig = np.sin(2 * np.pi * 440 * t)[:, None]
    noise = 0.01 * np.random.default_rng(2).standard_normal(sig.shape)
    want_snr = 10 * math.log10(float((torch.tensor(sig) ** 2).sum()) / float((torch.tensor(noise) ** 2).sum()))
    assert snr(sig + noise, sig) == pytest.approx(want_snr, abs=1e-9)


def test_image_verdicts_and_review(tmp_path: Path) -> None:
    ref = save_png(picture(0), tmp_path / "ref.png")
    noisy = np.clip(picture(0).astype(np.int16) + 2, 0, 255).astype(np.uint8)
    cand = save_png(noisy, tmp_path / "cand.png")
    code, data = invoke(["quality", str(cand), "--reference", str(ref)])
    assert code == 0 and data["verdict"] == "MANUAL REVIEW REQUIRED" and data["review"] is None
    assert data["metrics"]["frames"][0]["psnr_db"] > 40
    code, data = invoke(
        ["quality", str(cand), "--reference", str(ref), "--record-review", "accept", "--reviewer", "qa"]
    )
    assert code == 0 and data["verdict"] == "PASS" and data["review"]["current"]
    save_png(picture(5), cand)  # new bytes: the review no longer applies, and the numbers now fail
    code, data = invoke(["quality", str(cand), "--reference", str(ref)])
    assert code == 1 and data["verdict"] == "FAIL" and data["review"]["current"] is False
    code, data = invoke(["quality", str(ref), "--record-review", "reject", "--reviewer", "qa", "--notes", "hands"])
    assert code == 1 and data["verdict"] == "FAIL" and "hands" in data["reasons"][0]


def test_sanity_and_bad_files(tmp_path: Path) -> None:
    flat = save_png(np.full((16, 16, 3), 7, np.uint8), tmp_path / "flat.png")
    code, data = invoke(["quality", str(flat)])
    assert code == 1 and data["verdict"] == "FAIL" and "constant" in data["sanity"][0]
    broken = tmp_path / "broken.png"
    broken.write_bytes(save_png(picture(0), tmp_path / "ok.png").read_bytes()[:60])
    code, data = invoke(["quality", str(broken)])
    assert code == 1 and data["decodable"] is False and "broken.png" in data["reasons"][0]
    silent = tmp_path / "silent.wav"
    with wave.open(str(silent), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(8000)
        w.writeframes(np.zeros(800, np.int16).tobytes())
    code, data = invoke(["quality", str(silent)])
    assert code == 1 and "silent" in data["sanity"][0]
    result = CliRunner().invoke(build_cli(), ["quality", str(flat), "--reference", str(tmp_path / "absent.png")])
    assert result.exit_code == 1 and "absent.png" in result.output and "Traceback" not in result.output


def write_mp4(path: Path, frames: list[np.ndarray], tone: np.ndarray) -> Path:
    av = pytest.importorskip("av", reason="MP4 tests need PyAV")
    with av.open(str(path), "w") as out:
        codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
        vs = out.add_stream(codec, rate=8)
        vs.width, vs.height, vs.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        aus = out.add_stream("aac", rate=16000)
        for f in frames:
            out.mux(vs.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        out.mux(vs.encode())
        frame = av.AudioFrame.from_ndarray(tone.astype(np.float32)[None, :], format="fltp", layout="mono")
        frame.sample_rate = 16000
        out.mux(aus.encode(frame))
        out.mux(aus.encode())
    return path


def test_mp4_frames_and_audio(tmp_path: Path) -> None:
    frames = [np.roll(picture(0), 3 * i, axis=1) for i in range(4)]
    tone = 0.3 * np.sin(2 * np.pi * 330 * np.arange(16000) / 16000)
    a = write_mp4(tmp_path / "a.mp4", frames, tone)
    code, data = invoke(["quality", str(a), "--reference", str(a)])
    assert code == 0 and data["media"]["kind"] == "video" and data["media"]["frames"] == 4
    assert data["verdict"] == "MANUAL REVIEW REQUIRED" and data["metrics"]["audio"]["snr_db"] is None
    dark = write_mp4(tmp_path / "b.mp4", [f // 3 for f in frames], tone * 0.2)
    code, data = invoke(["quality", str(dark), "--reference", str(a)])
    assert code == 1 and any("PSNR" in r for r in data["reasons"]) and any("SNR" in r for r in data["reasons"])

"""The gate `dif quality` applies to a media file (after a pipeline wrote it): decode, sanity, numbers
against a reference, a recorded human review, and one verdict.

Verdict: FAIL when the file does not decode, fails sanity (constant image, silent audio, non-finite
samples), misses a numeric bar against the reference, or a review rejected it; PASS only when the
numbers admit it (sanity alone when there is no reference) AND a review of these exact bytes accepted
it; otherwise MANUAL REVIEW REQUIRED. A review is `CANDIDATE.review.json`:
    {"schema": "dif-review/1", "verdict": "accept" | "reject", "reviewer": "...", "sha256": "...",
     "time": ISO 8601, "notes": "..."}
Images: PNG / JPEG / WebP (Pillow); audio: WAV (PCM 16/32-bit or float); video: MP4 (PyAV, when installed).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import wave
from pathlib import Path
from typing import Any

import numpy as np
from attrs import asdict, frozen

from dif.errors import FormatError, UsageError
from dif.quality.metrics import psnr, snr, ssim

PASS = "PASS"
FAIL = "FAIL"
MANUAL = "MANUAL REVIEW REQUIRED"
REVIEW_SCHEMA = "dif-review/1"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
SILENT_RMS = 1e-4
MAX_FRAMES = 8


@frozen
class Bars:
    min_psnr_db: float = 30.0
    min_ssim: float = 0.95
    min_snr_db: float = 20.0


@frozen
class Media:
    """Decoded content: frames (uint8 [H, W, C], one for an image) and audio (float [samples, channels])."""

    kind: str
    frames: tuple[np.ndarray, ...]
    frame_count: int
    audio: np.ndarray | None
    sample_rate: int | None


def _image(path: Path) -> Media:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            arr = np.asarray(im.convert("RGBA" if "A" in im.getbands() else "RGB"))
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise FormatError(f"{path}: does not decode as an image ({type(exc).__name__}: {exc})"[:300]) from None
    return Media("image", (arr,), 1, None, None)


def _wav(path: Path) -> Media:
    try:
        with wave.open(str(path), "rb") as w:
            width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError, OSError) as exc:
        raise FormatError(f"{path}: does not decode as WAV ({exc})"[:300]) from None
    dtype = {1: np.uint8, 2: np.int16, 4: np.int32}.get(width)
    if dtype is None:
        raise FormatError(f"{path}: {8 * width}-bit WAV samples are not supported (8, 16 or 32-bit PCM)")
    samples = np.frombuffer(raw, dtype=dtype).reshape(-1, channels).astype(np.float64)
    scale = {1: 128.0, 2: 32768.0, 4: 2147483648.0}[width]
    audio = (samples - 128.0) / scale if width == 1 else samples / scale
    return Media("audio", (), 0, audio, rate)


def _mp4(path: Path) -> Media:
    try:
        import av
    except ImportError:
        raise UsageError(f"{path}: decoding MP4 needs PyAV", hint="pip install av") from None
    frames: list[np.ndarray] = []
    chunks: list[np.ndarray] = []
    rate = None
    try:
        with av.open(str(path)) as container:
            video = container.streams.video[0] if container.streams.video else None
            audio = container.streams.audio[0] if container.streams.audio else None
            streams = [s for s in (video, audio) if s is not None]
            for packet in container.demux(*streams):
                for frame in packet.decode():
                    if isinstance(frame, av.VideoFrame):
                        frames.append(frame.to_ndarray(format="rgb24"))
                    elif isinstance(frame, av.AudioFrame):
                        rate = frame.sample_rate
                        data = frame.to_ndarray().astype(np.float64)
                        channels = len(frame.layout.channels)
                        chunks.append(data.T if frame.format.is_planar else data.reshape(-1, channels))
    except av.FFmpegError as exc:
        raise FormatError(f"{path}: does not decode as MP4 ({exc})"[:300]) from None
    if not frames and not chunks:
        raise FormatError(f"{path}: the MP4 has no decodable video or audio")
    pcm = np.concatenate(chunks, axis=0) if chunks else None
    return Media("video", tuple(frames), len(frames), pcm, rate)


def decode(path: str | Path) -> Media:
    """Decode `path` by its suffix; `FormatError` naming the file when it does not decode."""
    path = Path(path)
    if not path.is_file():
        raise FormatError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return _image(path)
    if suffix == ".wav":
        return _wav(path)
    if suffix in (".mp4", ".mov", ".m4v"):
        return _mp4(path)
    raise UsageError(f"{path}: unknown media type '{suffix}'", hint="png, jpg, webp, wav or mp4")


def sanity(media: Media) -> list[str]:
    """What makes the content unusable regardless of any reference (empty: sane)."""
    problems = []
    for i, frame in enumerate(media.frames):
        if int(frame.max()) == int(frame.min()):
            problems.append(f"frame {i} is one constant value ({int(frame.max())})")
            break
    if media.audio is not None:
        if not np.isfinite(media.audio).all():
            problems.append(f"audio has {int((~np.isfinite(media.audio)).sum())} non-finite samples")
        elif media.audio.size == 0 or float(np.sqrt(np.mean(media.audio**2))) < SILENT_RMS:
            problems.append(f"audio is silent (RMS below {SILENT_RMS})")
    return problems


def _sampled(n: int) -> list[int]:
    return sorted({round(i * (n - 1) / max(1, MAX_FRAMES - 1)) for i in range(min(n, MAX_FRAMES))}) if n else []


def compare_media(cand: Media, ref: Media, bars: Bars) -> tuple[dict[str, Any], list[str]]:
    """(metrics, broken bars) of `cand` against `ref`."""
    metrics: dict[str, Any] = {}
    broken: list[str] = []
    if cand.frames or ref.frames:
        if cand.frame_count != ref.frame_count:
            broken.append(f"{cand.frame_count} frames, reference has {ref.frame_count}")
        shapes = {f.shape for f in cand.frames} | {f.shape for f in ref.frames}
        if len(shapes) > 1:
            broken.append(f"frame shapes differ: {sorted(str(s) for s in shapes)}")
        else:
            rows = []
            for i in _sampled(min(cand.frame_count, ref.frame_count)):
                p, s = psnr(cand.frames[i], ref.frames[i]), ssim(cand.frames[i], ref.frames[i])
                rows.append({"frame": i, "psnr_db": p, "ssim": s})
                if p is not None and p < bars.min_psnr_db:
                    broken.append(f"frame {i}: PSNR {p:.2f} dB < {bars.min_psnr_db}")
                if s < bars.min_ssim:
                    broken.append(f"frame {i}: SSIM {s:.4f} < {bars.min_ssim}")
            metrics["frames"] = rows
    if cand.audio is not None or ref.audio is not None:
        if cand.audio is None or ref.audio is None:
            broken.append("only one of the files has audio")
        elif cand.sample_rate != ref.sample_rate or cand.audio.shape[1:] != ref.audio.shape[1:]:
            broken.append(
                f"audio {cand.sample_rate} Hz x {cand.audio.shape[1:]} vs {ref.sample_rate} Hz x {ref.audio.shape[1:]}"
            )
        else:
            value = snr(cand.audio, ref.audio)
            finite = value is None or math.isfinite(value)
            metrics["audio"] = {
                "snr_db": value if finite else None,
                "samples": [len(cand.audio), len(ref.audio)],
                "sample_rate": cand.sample_rate,
            }
            if not finite:
                broken.append("the reference audio is silent: SNR undefined")
            elif value is not None and value < bars.min_snr_db:
                broken.append(f"audio SNR {value:.2f} dB < {bars.min_snr_db}")
            if len(cand.audio) != len(ref.audio):
                broken.append(f"audio has {len(cand.audio)} samples, reference {len(ref.audio)}")
    return metrics, broken


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def review_path(candidate: Path) -> Path:
    return candidate.with_name(candidate.name + ".review.json")


def read_review(candidate: Path) -> dict[str, Any] | None:
    """The review of `candidate`, or None; `FormatError` when the file exists but is malformed."""
    path = review_path(candidate)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FormatError(f"{path}: the review is not JSON ({type(exc).__name__})") from None
    if (
        not isinstance(doc, dict)
        or doc.get("schema") != REVIEW_SCHEMA
        or doc.get("verdict") not in ("accept", "reject")
    ):
        raise FormatError(f"{path}: not a {REVIEW_SCHEMA} review with verdict accept or reject")
    if not isinstance(doc.get("sha256"), str) or not isinstance(doc.get("reviewer"), str) or not doc["reviewer"]:
        raise FormatError(f"{path}: a review needs the reviewer and the sha256 of the file reviewed")
    return doc


def write_review(candidate: Path, verdict: str, reviewer: str, notes: str = "") -> dict[str, Any]:
    """Record a human's verdict on these exact bytes of `candidate`."""
    from dif.serialize.container import write_atomic

    if verdict not in ("accept", "reject"):
        raise UsageError(f"review verdict {verdict!r} must be accept or reject")
    if not reviewer.strip():
        raise UsageError("a review needs --reviewer")
    doc = {
        "schema": REVIEW_SCHEMA,
        "verdict": verdict,
        "reviewer": reviewer,
        "sha256": sha256(candidate),
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "notes": notes,
    }
    write_atomic(review_path(candidate), (json.dumps(doc, indent=1) + "\n").encode())
    return doc


def assess(candidate: str | Path, reference: str | Path | None = None, bars: Bars | None = None) -> dict[str, Any]:
    """The full report: decode, sanity, metrics against `reference`, review, verdict and reasons."""
    bars = bars or Bars()
    candidate = Path(candidate)
    report: dict[str, Any] = {"candidate": str(candidate), "reference": str(reference) if reference else None}
    report["bars"] = asdict(bars)
    reasons: list[str] = []
    try:
        media = decode(candidate)
    except FormatError as exc:
        report.update(decodable=False, verdict=FAIL, reasons=[str(exc)], review=None)
        return report
    report["decodable"] = True
    report["media"] = {
        "kind": media.kind,
        "frames": media.frame_count,
        "size": list(media.frames[0].shape) if media.frames else None,
        "audio_samples": len(media.audio) if media.audio is not None else None,
        "sample_rate": media.sample_rate,
    }
    problems = sanity(media)
    report["sanity"] = problems
    reasons += problems
    if reference is not None:
        ref = decode(reference)  # a reference that does not decode is bad input, not a candidate failure
        metrics, broken = compare_media(media, ref, bars)
        report["metrics"] = metrics
        reasons += broken
    review = read_review(candidate)
    if review is not None:
        review = {**review, "current": review["sha256"] == sha256(candidate)}
    report["review"] = review
    if reasons:
        verdict = FAIL
    elif review is not None and review["current"] and review["verdict"] == "reject":
        verdict, reasons = FAIL, [f"rejected by {review['reviewer']}: {review.get('notes', '')}".strip(": ")]
    elif review is not None and review["current"] and review["verdict"] == "accept":
        verdict = PASS
    else:
        verdict = MANUAL
        reasons = ["numbers admit it, but no review of this file is recorded" if review is None else
                   "the recorded review is of other bytes (the file changed since)"]  # fmt: skip
    report.update(verdict=verdict, reasons=reasons)
    return report

"""MP4 output: (F, H, W, 3) uint8 frames + (C, N) float audio -> H.264 yuv420p + AAC in one MP4, atomically.

Where it sits: the last stage of a video pipeline (MiniMax-H3), the video counterpart of `dif.media.png`.
Encoding goes through PyAV (`av`, FFmpeg's libraries; imported on use, so `import dif.media` stays light
and a machine without it fails only here, with the fix named). Metadata (prompt, seed, settings) is stored
in the container's tags: `comment` holds the A1111-style parameters line, `description` the JSON of
everything (`use_metadata_tags`, so any reader of MP4 tags sees them; `read_mp4_metadata` reads them
back). The file is written to a temporary name in the same folder and renamed when complete, so a
failed or interrupted encode leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from dif.errors import DifError, UsageError

JSON_TAG = "description"
PARAMETERS_TAG = "comment"
AUDIO_FRAME = 1024  # AAC frame size: audio is fed in frames of this many samples per channel
MEDIA_KEY = "media"  # in the JSON tag: frame count, fps, exact audio length (AAC pads to whole frames)


def media_facts(frames: np.ndarray, fps: int, audio: np.ndarray | None, sample_rate: int) -> dict[str, Any]:
    """What a reader needs to recover the exact streams: AAC decodes whole 1024-sample frames, so the
    true audio length per channel is stored (`read_mp4` trims to it)."""
    facts: dict[str, Any] = {"frames": int(frames.shape[0]), "fps": fps, "width": int(frames.shape[2]),
                             "height": int(frames.shape[1])}  # fmt: skip
    if audio is not None:
        facts.update(audio_samples=int(audio.shape[1]), audio_channels=int(audio.shape[0]), sample_rate=sample_rate)
    return facts


def _av() -> Any:
    try:
        import av
    except ImportError as exc:
        raise DifError("writing MP4 needs PyAV", hint="pip install av") from exc
    return av


def check_video(frames: np.ndarray) -> np.ndarray:
    """frames (F, H, W, 3) uint8 with even H and W (yuv420p halves the chroma planes); `UsageError` otherwise."""
    arr = np.asarray(frames)
    if arr.ndim != 4 or arr.shape[-1] != 3 or arr.dtype != np.uint8 or arr.shape[0] == 0:
        raise UsageError(f"MP4 video must be (frames >= 1, H, W, 3) uint8, got {arr.shape} {arr.dtype}")
    if arr.shape[1] % 2 or arr.shape[2] % 2:
        raise UsageError(f"MP4 (H.264 yuv420p) needs an even frame size, got {arr.shape[2]}x{arr.shape[1]}")
    return arr


def check_audio(audio: np.ndarray) -> np.ndarray:
    """audio (C, N) float in [-1, 1] (C = 1 or 2) as float32 planes; `UsageError` for another shape or NaN."""
    arr = np.asarray(audio)
    if arr.ndim != 2 or arr.shape[0] not in (1, 2) or arr.shape[1] == 0 or not np.issubdtype(arr.dtype, np.floating):
        raise UsageError(f"MP4 audio must be (channels 1 or 2, samples >= 1) float, got {arr.shape} {arr.dtype}")
    if not np.isfinite(arr).all():
        raise UsageError("MP4 audio has NaN or infinite samples")
    return np.ascontiguousarray(np.clip(arr, -1.0, 1.0), dtype=np.float32)


def encode_mp4(
    path: str | Path,
    frames: np.ndarray,
    fps: int,
    *,
    audio: np.ndarray | None = None,
    sample_rate: int = 32000,
    parameters: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    crf: int = 18,
) -> None:
    """Encode into `path` directly (no atomic rename: `write_mp4` wraps this). H.264 (libx264, `crf`,
    yuv420p) at `fps` frames per second; AAC at `sample_rate`, mono or stereo."""
    av = _av()
    video = check_video(frames)
    sound = None if audio is None else check_audio(audio)
    if fps <= 0 or sample_rate <= 0:
        raise UsageError(f"fps {fps} and sample rate {sample_rate} must be positive")
    with av.open(str(path), mode="w", format="mp4", options={"movflags": "+use_metadata_tags+faststart"}) as out:
        if parameters is not None:
            out.metadata[PARAMETERS_TAG] = parameters
        stored = {**dict(metadata or {}), MEDIA_KEY: media_facts(video, fps, sound, sample_rate)}
        out.metadata[JSON_TAG] = json.dumps(stored, ensure_ascii=False, sort_keys=True)
        vs = out.add_stream("libx264", rate=fps, options={"crf": str(crf), "preset": "medium"})
        vs.width, vs.height, vs.pix_fmt = video.shape[2], video.shape[1], "yuv420p"
        vs.time_base = Fraction(1, fps)
        as_ = None
        if sound is not None:
            as_ = out.add_stream("aac", rate=sample_rate, layout="stereo" if sound.shape[0] == 2 else "mono")
            as_.time_base = Fraction(1, sample_rate)
        for i, rgb in enumerate(video):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = i
            out.mux(vs.encode(frame))
        out.mux(vs.encode(None))
        if as_ is not None and sound is not None:
            layout = "stereo" if sound.shape[0] == 2 else "mono"
            for start in range(0, sound.shape[1], AUDIO_FRAME):
                chunk = np.ascontiguousarray(sound[:, start : start + AUDIO_FRAME])
                frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
                frame.sample_rate, frame.pts = sample_rate, start
                out.mux(as_.encode(frame))
            out.mux(as_.encode(None))


def write_mp4(
    path: str | Path,
    frames: np.ndarray,
    fps: int,
    *,
    audio: np.ndarray | None = None,
    sample_rate: int = 32000,
    parameters: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Encode (`encode_mp4`) to a temporary file beside `path`, then rename it to `path`; returns the path.
    Nothing is left behind on failure. The folder must exist (no surprise mkdirs)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise DifError(f"cannot write {path}: folder {path.parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp.mp4", dir=path.parent)
    os.close(fd)
    try:
        encode_mp4(tmp, frames, fps, audio=audio, sample_rate=sample_rate, parameters=parameters, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_mp4(path: str | Path) -> dict[str, Any]:
    """Decode a whole MP4 (tests, `dif` inspection): {'frames': (F, H, W, 3) uint8 | None, 'audio': (C, N)
    float32 | None, 'fps': float | None, 'sample_rate': int | None, 'duration': seconds | None,
    'parameters': str | None, 'dif': dict | None}. Audio is trimmed to the length the metadata states."""
    av = _av()
    with av.open(str(path)) as src:
        tags = dict(src.metadata)
        duration = None if src.duration is None else src.duration / 1_000_000
        frames, fps, audio, rate = None, None, None, None
        if src.streams.video:
            vs = src.streams.video[0]
            fps = float(vs.average_rate) if vs.average_rate else None
            frames = np.stack([f.to_ndarray(format="rgb24") for f in src.decode(vs)])
        src.seek(0)
        if src.streams.audio:
            stream = src.streams.audio[0]
            rate = stream.rate
            chunks = [f.to_ndarray() for f in src.decode(stream)]
            audio = np.concatenate(chunks, axis=1).astype(np.float32) if chunks else None
    raw = tags.get(JSON_TAG)
    info = json.loads(raw) if raw else None
    samples = (info or {}).get(MEDIA_KEY, {}).get("audio_samples")
    if audio is not None and isinstance(samples, int) and 0 < samples <= audio.shape[1]:
        audio = audio[:, :samples]  # the AAC tail padding off, as the metadata says
    return {"frames": frames, "audio": audio, "fps": fps, "sample_rate": rate, "duration": duration,
            "parameters": tags.get(PARAMETERS_TAG), "dif": info}  # fmt: skip


def read_mp4_metadata(path: str | Path) -> dict[str, Any]:
    """{'parameters': str | None, 'dif': dict | None} from an MP4's tags, nothing decoded."""
    av = _av()
    with av.open(str(path)) as src:
        tags = dict(src.metadata)
    raw = tags.get(JSON_TAG)
    return {"parameters": tags.get(PARAMETERS_TAG), "dif": json.loads(raw) if raw else None}

"""MiniMax-H3 geometry and the packed sequence: request size -> latent shapes -> `[text | conditions | audio |
video]` rows with their float64 (t, h, w) rotary grid, modality tags and timestep slots.

Frontend stage between tokenization and the DiT (model.py builds a program for one `PackedLayout`). The
rules are the reference's (diffusers modular_pipelines/minimax_h3/before_denoise.py `build_packed_sequence`,
modular_pipeline.py `video_latent_num_frames` / `audio_latent_num_frames`): frames `17n + 5` give `5n + 2`
latent frames, sizes are multiples of 32, audio has `round(frames / 24 * 40)` latents per stereo channel.
Rows of one run of equal (timestep slot, tag) share one AdaLN table row, so the DiT indexes its tables per
run (`segments`) instead of gathering a per-row table.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from attrs import frozen

from dif.errors import DifError, UsageError
from dif.media.frame_counts import nearest_frame_counts
from dif_frontend_h3.config import AUDIO_CHANNELS, FPS, TAGS, H3Configs

ROPE_FRAME_RESCALE = 5.0 / 3.0
ROPE_FRAMES_PER_LATENT = (1, 4, 4, 4, 4)
ROPE_SPATIAL_SCALE = 32
SLOT_VIDEO, SLOT_AUDIO, SLOT_CONDITION = 0, 1, 2  # timestep slots: text and target video share the video t


# -- request geometry ----------------------------------------------------------------------------


def check_frames(frames: int, clip: int = 17, keep: int = 5) -> int:
    """`frames` itself when it is `clip * n + keep` (n >= 0); `UsageError` naming the neighbours otherwise."""
    near = nearest_frame_counts(frames, clip, keep)
    if near is None:
        return frames
    raise UsageError(
        f"--frames {frames}: MiniMax-H3 generates {clip}n + {keep} frames (the video VAE decodes {clip}-frame "
        f"clips); try {near}"
    )


def check_size(width: int, height: int, multiple: int = 32) -> tuple[int, int]:
    """(width, height) when both are positive multiples of `multiple`; `UsageError` otherwise."""
    bad = [f"{n} {v}" for n, v in (("width", width), ("height", height)) if v <= 0 or v % multiple]
    if bad:
        raise UsageError(
            f"{' and '.join(bad)}: MiniMax-H3 sizes must be positive multiples of {multiple} "
            f"(VAE 16x, patch 2); e.g. {max(multiple, -(-width // multiple) * multiple)}x"
            f"{max(multiple, -(-height // multiple) * multiple)}"
        )
    return width, height


def latent_frames(frames: int, clip: int = 17, keep: int = 5) -> int:
    """Latent frames of a `clip n + keep` frame video: `keep n + 2` (5n + 2)."""
    return (frames - keep) // clip * keep + 2


def audio_latents(frames: int, latents_per_second: float = 40.0, fps: int = FPS) -> int:
    """Audio latents per stereo channel covering `frames` frames (Python's round, as the reference)."""
    return int(round(frames / fps * latents_per_second))


def audio_samples(frames: int, sampling_rate: int = 32000, fps: int = FPS) -> int:
    """Samples per channel of the soundtrack the MP4 carries: round(frames * rate / fps)."""
    return int(round(frames * sampling_rate / fps))


# -- rotary grid ---------------------------------------------------------------------------------


def spatial_grid(dim: int, patch: int, sqrt_area: float) -> np.ndarray:
    """One aspect-normalised spatial axis: `dim // patch` coordinates centred on the unit interval, x 32
    (numpy's endpoint-free linspace, as the reference builds it), float64."""
    ratio = dim / sqrt_area
    left = (1.0 - ratio) / 2.0
    return np.linspace(left, left + ratio, dim // patch, endpoint=False) * ROPE_SPATIAL_SCALE


def temporal_grid(num_latent_frames: int, origin: float) -> np.ndarray:
    """Rotary time of every latent frame from `origin`: spans 5/3 x (1, 4, 4, 4, 4, ...) summed in order."""
    spans = np.array(
        [
            ROPE_FRAME_RESCALE * ROPE_FRAMES_PER_LATENT[i % len(ROPE_FRAMES_PER_LATENT)]
            for i in range(num_latent_frames)
        ],
        dtype=np.float64,
    )
    return origin + np.concatenate([np.zeros(1), np.cumsum(spans[:-1])])


def _last_anchor_time(num_latent_frames: int, text_len: int) -> float:
    # numpy's pairwise sum, as the reference computes this anchor (differs from cumsum in the last ulp)
    spans = np.ones(num_latent_frames, dtype=np.float64) * ROPE_FRAME_RESCALE
    for offset, mult in enumerate(ROPE_FRAMES_PER_LATENT):
        spans[offset :: len(ROPE_FRAMES_PER_LATENT)] *= mult
    return float(text_len) + float(spans.sum()) - ROPE_FRAME_RESCALE


# -- the packed sequence -------------------------------------------------------------------------


@frozen(eq=False)
class Segment:
    """Rows [start, stop) of the packed sequence sharing one AdaLN row: timestep slot and modality tag."""

    start: int
    stop: int
    slot: int
    tag: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@frozen(eq=False)
class PackedLayout:
    """One request's packed sequence `[text L | condition C | audio 2A | video N]`.

    position_ids (S, 3) float64; tags (S,) int64 (video 0, text 1, audio 2); slots (S,) int64 timestep slot
    of each row (`SLOT_*`); the counts give every block's extent (rows in sequence order)."""

    text_len: int
    condition_rows: int
    audio_rows: int
    video_rows: int
    num_latent_frames: int
    latent_height: int
    latent_width: int
    num_audio_latents: int
    rows_per_frame: int
    position_ids: np.ndarray
    tags: np.ndarray
    slots: np.ndarray

    @property
    def seq_len(self) -> int:
        return self.text_len + self.condition_rows + self.audio_rows + self.video_rows

    @property
    def num_slots(self) -> int:
        return int(self.slots.max()) + 1

    @property
    def video_indices(self) -> np.ndarray:
        """Sequence positions of the video rows, conditioning rows first (the DiT's video output order)."""
        c0 = self.text_len
        v0 = c0 + self.condition_rows + self.audio_rows
        return np.concatenate([np.arange(c0, c0 + self.condition_rows), np.arange(v0, self.seq_len)])

    @property
    def audio_indices(self) -> np.ndarray:
        a0 = self.text_len + self.condition_rows
        return np.arange(a0, a0 + self.audio_rows)

    @property
    def text_indices(self) -> np.ndarray:
        return np.arange(self.text_len)

    def segments(self) -> list[Segment]:
        """Maximal runs of rows with equal (slot, tag), in sequence order."""
        key = self.slots * 8 + self.tags
        cuts = np.flatnonzero(np.diff(key)) + 1
        starts = np.concatenate([[0], cuts])
        stops = np.concatenate([cuts, [len(key)]])
        return [
            Segment(int(a), int(z), int(self.slots[a]), int(self.tags[a])) for a, z in zip(starts, stops, strict=True)
        ]

    def row_timesteps(self, t_video: float, t_audio: float, t_condition: float | None = None) -> np.ndarray:
        """(num_slots,) float32 timesteps of the slots: video (text rows too), audio, condition video
        (`max(t_video, 0.999)` in the reference)."""
        t_cond = max(t_video, 0.999) if t_condition is None else t_condition
        values = [t_video, t_audio, t_cond]
        return np.asarray(values[: self.num_slots], dtype=np.float32)


def build_layout(
    text_tags: Sequence[int] | np.ndarray,
    num_latent_frames: int,
    latent_height: int,
    latent_width: int,
    num_audio_latents: int,
    *,
    patch: int = 2,
    anchors: Sequence[str] = (),
) -> PackedLayout:
    """The t2va / fl2va packed layout. `text_tags` (L,) per text row (1 for text; 0 for vision-block rows);
    `anchors`: one "first" / "last" per keyframe conditioning block, in packed order."""
    tt = np.asarray(text_tags, dtype=np.int64).reshape(-1)
    L = len(tt)
    rpf = (latent_height // patch) * (latent_width // patch)
    C, A, N = len(anchors) * rpf, num_audio_latents * AUDIO_CHANNELS, num_latent_frames * rpf
    S = L + C + A + N
    pos = np.zeros((S, 3), dtype=np.float64)
    pos[:L, 0] = np.arange(L, dtype=np.float64)
    sqrt_area = np.sqrt(latent_height * latent_width)
    hg, wg = spatial_grid(latent_height, patch, sqrt_area), spatial_grid(latent_width, patch, sqrt_area)
    frame = np.stack([g.reshape(-1) for g in np.meshgrid(hg, wg, indexing="ij")], axis=-1)
    for i, anchor in enumerate(anchors):
        if anchor not in ("first", "last"):
            raise UsageError(f"keyframe anchor must be 'first' or 'last', got {anchor!r}")
        rows = slice(L + i * rpf, L + (i + 1) * rpf)
        pos[rows, 0] = float(L) if anchor == "first" else _last_anchor_time(num_latent_frames, L)
        pos[rows, 1:] = frame
    a0, v0 = L + C, L + C + A
    pos[a0:v0, 0] = np.tile(float(L) + np.arange(num_audio_latents, dtype=np.float64), AUDIO_CHANNELS)
    pos[a0:v0, 2] = np.concatenate([np.full(num_audio_latents, wg[0]), np.full(A - num_audio_latents, wg[-1])])
    video = np.empty((num_latent_frames, rpf, 3), dtype=np.float64)
    video[:, :, 0] = temporal_grid(num_latent_frames, float(L))[:, None]
    video[:, :, 1:] = frame[None]
    pos[v0:] = video.reshape(-1, 3)
    tags = np.empty(S, dtype=np.int64)
    tags[:L] = tt
    tags[L:a0] = TAGS["video"]
    tags[a0:v0] = TAGS["audio"]
    tags[v0:] = TAGS["video"]
    slots = np.full(S, SLOT_VIDEO, dtype=np.int64)
    slots[L:a0] = SLOT_CONDITION
    slots[a0:v0] = SLOT_AUDIO
    return PackedLayout(L, C, A, N, num_latent_frames, latent_height, latent_width, num_audio_latents, rpf,
                        pos, tags, slots)  # fmt: skip


def layout_for(
    configs: H3Configs,
    text_len: int,
    frames: int,
    width: int,
    height: int,
    anchors: Sequence[str] = (),
    text_tags: Sequence[int] | np.ndarray | None = None,
) -> PackedLayout:
    """The layout of a (checked) request: `frames` pixel frames at width x height, `text_len` text rows
    (tagged `text_tags`, all text by default; fl2va's picture blocks are tagged video)."""
    v = configs.video_vae
    check_frames(frames, v.clip_length, v.latents_per_clip)
    check_size(width, height, configs.canvas_multiple)
    tags = np.full(text_len, TAGS["text"]) if text_tags is None else np.asarray(text_tags, dtype=np.int64)
    if len(tags) != text_len:
        raise DifError(f"{len(tags)} text tags for {text_len} text rows")
    return build_layout(
        tags,
        latent_frames(frames, v.clip_length, v.latents_per_clip),
        height // v.spatial_ratio,
        width // v.spatial_ratio,
        audio_latents(frames, configs.audio_vae.latents_per_second),
        patch=configs.transformer.patch_size[2],
        anchors=anchors,
    )


# -- latent rows ---------------------------------------------------------------------------------


def patchify(latents: np.ndarray, patch: int = 2) -> np.ndarray:
    """(1, C, T, H, W) -> (T * H/p * W/p, C * p * p) rows ordered (t, h, w), features (c, ph, pw)."""
    b, c, t, h, w = latents.shape
    x = latents.reshape(b, c, t, 1, h // patch, patch, w // patch, patch).transpose(0, 2, 4, 6, 1, 3, 5, 7)
    return np.ascontiguousarray(x.reshape(-1, c * patch * patch))


def unpatchify(rows: np.ndarray, channels: int, frames: int, height: int, width: int, patch: int = 2) -> np.ndarray:
    """Inverse of `patchify`: (T * h * w, C p p) -> (1, C, T, H, W) with H = h p, W = w p."""
    x = rows.reshape(1, frames, height // patch, width // patch, channels, 1, patch, patch)
    x = x.transpose(0, 4, 1, 5, 2, 6, 3, 7)
    return np.ascontiguousarray(x.reshape(1, channels, frames, height, width))


def audio_rows_to_latents(rows: np.ndarray, num_audio_latents: int) -> np.ndarray:
    """Channel-major audio rows (2A, C) -> (2, C, A): one batch item per stereo channel, as the mono VAE takes."""
    return np.ascontiguousarray(rows.reshape(AUDIO_CHANNELS, num_audio_latents, rows.shape[-1]).transpose(0, 2, 1))

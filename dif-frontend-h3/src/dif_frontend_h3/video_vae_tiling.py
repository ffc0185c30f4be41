"""MiniMax-H3 video VAE decode and keyframe encode as the reference lays them out: temporal chunks of
latent frames cross-faded over their overlap, spatial tiles blended over theirs (host-side float32).

Frontend stage 4 (decode) and the fl2va conditioning (encode). The reference decodes with tiling ON
and the released frames are the blended ones, so this is the decode, not an option: chunks of
`tokens_chunk_size + token_overlap` latent frames (5 + 2) start every 5; each decodes to 28 frames of
which frames [3, 20) are emitted and [23, 28) kept as the overlap cross-faded into the next chunk's
first 5 (autoencoder_kl_minimax_h3.py `_decode`). Every chunk is cut into tiles of 256 px with overlaps
of at least 64 px widened in 16 px steps so the tiles cover the frame exactly (`_split_tiles`); a tile
is blended with the raw tile above and the raw tile to its left, then cropped (`_stitch_tiles`).

Tiles are decoded by the caller's `run_tile(inputs) -> pixels`: `inputs` is the complete input dict of
`build_video_decoder`'s program for that tile (`video_decoder_inputs`), so the caller picks the program
by `inputs["latent"].shape` (one shape for a whole video: every chunk has 7 latent frames and the tiles
are all 256 px or the whole axis).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from attrs import frozen

from dif.errors import DifError
from dif.rng import standard_normal
from dif_frontend_h3.vae_config import KEYFRAME_ENCODE_SEED, PIXEL_MEAN, PIXEL_STD, VideoVaeConfig
from dif_frontend_h3.video_vae import video_decoder_inputs

RunTile = Callable[[dict[str, np.ndarray]], np.ndarray]
Progress = Callable[[int, int], None]  # (tiles done, tiles in all)


@frozen
class VideoTiling:
    """Tile geometry in pixels (the reference's `tile_sample_min_*`; `enable_tiling` changes them)."""

    tile_height: int = 256
    tile_width: int = 256
    min_overlap_height: int = 64
    min_overlap_width: int = 64


def split_tiles(length: int, tile: int, min_overlap: int, step: int) -> tuple[list[int], list[int], list[int]]:
    """(starts, sizes, overlaps) of tiles covering `length` pixels: the fewest `tile`-wide tiles whose
    overlaps are all >= `min_overlap`, the slack given round-robin to the overlaps in `step` px units
    (the compression ratio, so every boundary is latent-aligned). One tile of `length` if it fits."""
    if tile >= length:
        return [0], [length], []
    n = -(-length // tile)
    while tile * n - min_overlap * (n - 1) - length < 0:
        n += 1
    overlaps = [min_overlap] * (n - 1)
    remaining = tile * n - sum(overlaps) - length
    for i in range(remaining // step):
        overlaps[i % (n - 1)] += step
    starts = [0]
    for i in range(n - 1):
        starts.append(starts[-1] + tile - overlaps[i])
    return starts, [tile] * n, overlaps


def blend(a: np.ndarray, b: np.ndarray, extent: int, axis: int) -> np.ndarray:
    """b with its first `extent` entries along `axis` faded in from a's last ones: a * (1 - k/e) + b * k/e."""
    extent = min(a.shape[axis], b.shape[axis], extent)
    if extent <= 0:
        return b
    k = np.arange(extent, dtype=np.float32)
    shape = [1] * a.ndim
    shape[axis] = extent
    wa = (1 - k / extent).reshape(shape)
    wb = (k / extent).reshape(shape)
    tail = np.take(a, range(a.shape[axis] - extent, a.shape[axis]), axis=axis)
    head = np.take(b, range(extent), axis=axis)
    blended = tail * wa + head * wb
    if extent == b.shape[axis]:
        return blended
    return np.concatenate([blended, np.take(b, range(extent, b.shape[axis]), axis=axis)], axis=axis)


def stitch_tiles(tiles: list[list[np.ndarray]], h_overlaps: list[int], w_overlaps: list[int]) -> np.ndarray:
    """Rows of tiles [..., H_t, W_t] into one [..., H, W]: each tile blended with the raw tile above and
    the raw tile to its left, then its bottom / right overlap cut (the next tile carries it)."""
    rows = []
    for i, row in enumerate(tiles):
        parts = []
        for j, tile in enumerate(row):
            if i > 0:
                tile = blend(tiles[i - 1][j], tile, h_overlaps[i - 1], axis=-2)
            if j > 0:
                tile = blend(row[j - 1], tile, w_overlaps[j - 1], axis=-1)
            if i < len(tiles) - 1:
                tile = tile[..., : tile.shape[-2] - h_overlaps[i], :]
            if j < len(row) - 1:
                tile = tile[..., : tile.shape[-1] - w_overlaps[j]]
            parts.append(tile)
        rows.append(np.concatenate(parts, axis=-1))
    return np.concatenate(rows, axis=-2)


@frozen
class ChunkPlan:
    """The temporal chunking of T latent frames: `pad` repeated last frames, `chunks` decoder calls of
    `clip` latent frames each starting every `step`, and `cut` trailing pixel frames dropped at the end."""

    pad: int
    chunks: int
    step: int
    clip: int
    cut: int


def chunk_plan(cfg: VideoVaeConfig, latent_frames: int) -> ChunkPlan:
    """The reference's `_decode` arithmetic (5n + 2 latent frames: no pad, n chunks of 7, no cut)."""
    size, drop, ratio = cfg.tokens_chunk_size, cfg.token_drop, cfg.temporal_ratio
    tokens = latent_frames + drop
    pad = (-tokens) % size
    chunks = (tokens + pad) // size - int(drop > 0)
    if chunks < 1:
        raise DifError(f"video VAE decode: {latent_frames} latent frames are fewer than one chunk")
    cut = 0
    if pad:
        tail = cfg.clip_length % ratio
        before = latent_frames  # the frames before the repeated ones (z is padded after this)
        cut = sum(tail if tail and (before + k) % size == 0 else ratio for k in range(pad))
    return ChunkPlan(pad, chunks, size, size + cfg.token_overlap, cut)


def tile_grid(cfg: VideoVaeConfig, height: int, width: int, tiling: VideoTiling) -> tuple[list, list]:
    """((starts, sizes, overlaps) over the height, the same over the width), in pixels, of a latent
    height x width canvas."""
    r = cfg.spatial_ratio
    ys = split_tiles(height * r, tiling.tile_height, tiling.min_overlap_height, r)
    xs = split_tiles(width * r, tiling.tile_width, tiling.min_overlap_width, r)
    return list(ys), list(xs)


def decode_tile_count(cfg: VideoVaeConfig, latent_shape: tuple[int, ...], tiling: VideoTiling = VideoTiling()) -> int:
    """Decoder calls of a whole decode of a (B, C, T, h, w) latent (for progress bars)."""
    ys, xs = tile_grid(cfg, latent_shape[3], latent_shape[4], tiling)
    return chunk_plan(cfg, latent_shape[2]).chunks * len(ys[0]) * len(xs[0])


def decode_tile_shape(
    cfg: VideoVaeConfig, latent_shape: tuple[int, ...], tiling: VideoTiling = VideoTiling()
) -> tuple[int, int, int]:
    """(frames, height, width) of the latent tiles a decode runs: the one decoder program it needs."""
    ys, xs = tile_grid(cfg, latent_shape[3], latent_shape[4], tiling)
    r = cfg.spatial_ratio
    return chunk_plan(cfg, latent_shape[2]).clip, ys[1][0] // r, xs[1][0] // r


def decode_clip(
    cfg: VideoVaeConfig,
    z: np.ndarray,
    run_tile: RunTile,
    tiling: VideoTiling = VideoTiling(),
    progress: Callable[[], None] | None = None,
) -> np.ndarray:
    """One temporal chunk (B, C, t, h, w) of denormalized latents -> ImageNet-normalized pixels
    (B, 3, 4t, 16h, 16w), decoded tile by tile and stitched."""
    r = cfg.spatial_ratio
    (y0, yn, yo), (x0, xn, xo) = tile_grid(cfg, z.shape[3], z.shape[4], tiling)
    rows = []
    for i_pos, i_len in zip(y0, yn, strict=True):
        row = []
        for j_pos, j_len in zip(x0, xn, strict=True):
            tile = z[..., i_pos // r : (i_pos + i_len) // r, j_pos // r : (j_pos + j_len) // r]
            row.append(np.asarray(run_tile(video_decoder_inputs(cfg, tile)), dtype=np.float32))
            if progress is not None:
                progress()
        rows.append(row)
    return stitch_tiles(rows, yo, xo)


def denormalize_video_latents(cfg: VideoVaeConfig, latents: np.ndarray) -> np.ndarray:
    """z * latents_std + latents_mean per channel of (B, C, T, h, w), float32 (the decode step's first line)."""
    shape = (1, -1, 1, 1, 1)
    std = np.asarray(cfg.latents_std, np.float32).reshape(shape)
    mean = np.asarray(cfg.latents_mean, np.float32).reshape(shape)
    return np.asarray(latents, np.float32) * std + mean


def decode_video(
    cfg: VideoVaeConfig,
    latents: np.ndarray,
    run_tile: RunTile,
    *,
    tiling: VideoTiling = VideoTiling(),
    normalized: bool = True,
    progress: Progress | None = None,
) -> np.ndarray:
    """Video latents (B, C, T, h, w) -> RGB frames (B, 3, F, H, W) float32 in [0, 1], as the H3 decode
    step does: denormalize (unless `normalized=False`), chunked + tiled decode, ImageNet pixel convention
    reverted, clamped. F = 17n + 5 for T = 5n + 2. `progress(done, total)` after every tile."""
    if latents.ndim != 5 or latents.shape[1] != cfg.latent_channels:
        raise DifError(f"video VAE decode: latents must be (B, {cfg.latent_channels}, T, h, w), got {latents.shape}")
    z = denormalize_video_latents(cfg, latents) if normalized else np.asarray(latents, np.float32)
    plan = chunk_plan(cfg, z.shape[2])
    if plan.pad:
        z = np.concatenate([z, np.repeat(z[:, :, -1:], plan.pad, axis=2)], axis=2)
    total, done = decode_tile_count(cfg, latents.shape, tiling), [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    frames_per_chunk = plan.step * cfg.temporal_ratio
    emitted: list[np.ndarray] = []
    overlap: np.ndarray | None = None
    for i in range(plan.chunks):
        start = i * plan.step
        clip = decode_clip(cfg, z[:, :, start : start + plan.clip], run_tile, tiling, tick)
        for j in range(int(cfg.token_drop > 0) + 1):
            part = clip[:, :, j * frames_per_chunk : (j + 1) * frames_per_chunk][:, :, cfg.frame_pre_padding :]
            if j == 0:
                if overlap is not None:
                    part = blend(overlap, part, cfg.frame_overlap, axis=-3)
                emitted.append(part)
            else:
                overlap = part
    if overlap is not None:
        emitted.append(overlap)
    video = np.concatenate(emitted, axis=2)
    if plan.cut:
        video = video[:, :, : video.shape[2] - plan.cut]
    std = np.asarray(PIXEL_STD, np.float32).reshape(1, -1, 1, 1, 1)
    mean = np.asarray(PIXEL_MEAN, np.float32).reshape(1, -1, 1, 1, 1)
    return np.clip(video * std + mean, 0, 1)


# -- keyframe encode (fl2va) ----------------------------------------------------------------------


def normalize_pixels(pixels: np.ndarray) -> np.ndarray:
    """uint8 RGB (B, 3, F, H, W) -> float32 (x / 255 - ImageNet mean) / ImageNet std."""
    x = np.asarray(pixels).astype(np.float32) / 255.0
    mean = np.asarray(PIXEL_MEAN, np.float32).reshape(1, -1, 1, 1, 1)
    std = np.asarray(PIXEL_STD, np.float32).reshape(1, -1, 1, 1, 1)
    return (x - mean) / std


def encode_moments(
    cfg: VideoVaeConfig,
    pixels: np.ndarray,
    run_tile: Callable[[np.ndarray], np.ndarray],
    tiling: VideoTiling = VideoTiling(),
) -> np.ndarray:
    """Normalized pixels (B, 3, F, H, W) of one clip (or one frame) -> posterior moments (B, 2C, F', h, w),
    encoded in spatial tiles (`run_tile`: a pixel tile -> its moments, the encoder program) stitched in
    latent space with the pixel overlaps / spatial ratio (`_encode_clip`)."""
    r = cfg.spatial_ratio
    height, width = pixels.shape[-2:]
    if height % r or width % r:
        raise DifError(f"video VAE encode: {height}x{width} pixels is not a multiple of {r}")
    y0, yn, yo = split_tiles(height, tiling.tile_height, tiling.min_overlap_height, r)
    x0, xn, xo = split_tiles(width, tiling.tile_width, tiling.min_overlap_width, r)
    rows = [
        [
            np.asarray(run_tile(np.ascontiguousarray(pixels[..., i : i + ih, j : j + jw])), dtype=np.float32)
            for j, jw in zip(x0, xn, strict=True)
        ]
        for i, ih in zip(y0, yn, strict=True)
    ]
    return stitch_tiles(rows, [o // r for o in yo], [o // r for o in xo])


def encode_video_moments(
    cfg: VideoVaeConfig,
    pixels: np.ndarray,
    run_tile: Callable[[np.ndarray], np.ndarray],
    tiling: VideoTiling = VideoTiling(),
) -> np.ndarray:
    """Normalized pixels (B, 3, F, H, W) -> moments as `AutoencoderKLMiniMaxH3._encode` makes them: one frame
    through `encode_moments` alone; otherwise F padded with repeats of its last frame to whole 17-frame
    clips, each clip encoded (tiled), the clips' latent frames concatenated and the last `token_drop`
    dropped. `run_tile` gets (B, 3, 1 or 17, th, tw) tiles (one encoder program per tile shape)."""
    frames = pixels.shape[2]
    if frames == 1:
        return encode_moments(cfg, pixels, run_tile, tiling)
    clip = cfg.clip_length
    if frames % clip:
        pixels = np.concatenate([pixels, np.repeat(pixels[:, :, -1:], (-frames) % clip, axis=2)], axis=2)
    moments = np.concatenate(
        [encode_moments(cfg, pixels[:, :, i : i + clip], run_tile, tiling) for i in range(0, pixels.shape[2], clip)],
        axis=2,
    )
    return moments[:, :, : moments.shape[2] - cfg.token_drop] if cfg.token_drop else moments


def sample_keyframe_latents(cfg: VideoVaeConfig, moments: np.ndarray, seed: int = KEYFRAME_ENCODE_SEED) -> np.ndarray:
    """The conditioning latent of encoded moments, as `encode_vae_condition` makes it: the posterior
    sampled with torch's CPU generator seeded `seed` (logvar clamped to [-30, 20]), rounded to float16,
    then normalized (z - latents_mean) / latents_std. float32 (B, C, F', h, w)."""
    c = cfg.latent_channels
    mean, logvar = moments[:, :c], np.clip(moments[:, c:], -30.0, 20.0)
    std = np.exp(np.float32(0.5) * logvar)
    noise = standard_normal(mean.shape, seed, "torch-cpu", "float32")
    z = (mean + std * noise).astype(np.float16).astype(np.float32)
    shape = (1, -1, 1, 1, 1)
    return (z - np.asarray(cfg.latents_mean, np.float32).reshape(shape)) / np.asarray(
        cfg.latents_std, np.float32
    ).reshape(shape)

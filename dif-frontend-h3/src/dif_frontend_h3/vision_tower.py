"""The Qwen3-VL vision tower as a DiffIR program: pixel_values -> image embeddings + deepstack features.

Frontend stage 1 of fl2va's picture blocks (transformers Qwen3VLVisionModel). Parameter names are the
checkpoint's `visual.*` (`bind_vision_tower` adds `model.` for a Qwen3VLForConditionalGeneration save).
  patch embed: the Conv3d with kernel = stride = (T, p, p) over rows already flattened as (C, T, p, p) is
               a linear with the kernel reshaped (out, C T p p)
  + the learned (side x side) position table resampled bilinearly (align_corners) to the picture's patch
    grid: four taps per patch, gathered by index and weighted (indices / weights are host-side inputs)
  blocks: LayerNorm -> qkv -> 2-D rope (h and w angles, half-split over the whole head) -> attention within
          one picture -> proj; LayerNorm -> fc1 -> gelu(tanh) -> fc2; residuals
  merger: LayerNorm, then each merge block of m*m rows (consecutive: the rows are in merge-block order)
          as one row -> fc1 -> gelu(erf) -> fc2; a deepstack merger after each configured block normalises
          after the shuffle instead.
The reference attends within each picture through cu_seqlens; dif's keyframes all have the canvas's size,
so the pictures are a batch axis and attention per picture is plain batched attention.
"""

from __future__ import annotations

import numpy as np

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers.attention import apply_rope, attention
from dif.layers.basic import activation, layer_norm, linear, split
from dif_frontend_h3 import __version__
from dif_frontend_h3.vision_config import H3VisionConfig

REVISION = f"dif-frontend-h3 {__version__}"
PREFIX = "visual"
EPS = 1e-6


def block_order_hw(grid_h: int, grid_w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of every patch of one picture in merge-block order, as the processor emits them."""
    r, c = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    shape = (grid_h // merge, merge, grid_w // merge, merge)
    return r.reshape(shape).transpose(0, 2, 1, 3).reshape(-1), c.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)


def _axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear (align_corners) taps into a `side`-long table for `index` on an axis of `size`: float32 as
    transformers' `_interpolation_axis_taps_weights`."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2, dtype=np.float32)
    taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
    weights = np.maximum(np.float32(1) - np.abs(src[:, None] - floor[:, None] - offsets), np.float32(0))
    return taps, weights.astype(np.float32)


def vision_inputs(cfg: H3VisionConfig, pixel_values: np.ndarray, grid_h: int, grid_w: int, images: int,
                  *, dtype: DType | str = "f32") -> dict[str, np.ndarray]:  # fmt: skip
    """The program inputs for `images` pictures of one (grid_h, grid_w) patch grid: the pixel rows as
    (images, P, patch_dim), the position table's taps (P, 4) / weights (P, 4, 1), the rope tables (P, hd)."""
    store = DType(dtype).np
    side = round(cfg.num_position_embeddings**0.5)
    row, col = block_order_hw(grid_h, grid_w, cfg.spatial_merge_size)
    ht, hw = _axis_taps(row, grid_h, side)
    wt, ww = _axis_taps(col, grid_w, side)
    taps = (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4)
    weights = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4, 1).astype(np.float32)
    # 2-D rope: inv_freq over head_dim / 2 (fp32, transformers' axial init), angles [h f | w f], then [a | a]
    half = cfg.head_dim // 2
    inv = np.float32(1) / (np.float32(cfg.rope_theta) ** (np.arange(0, half, 2, dtype=np.float32) / np.float32(half)))
    ang = np.concatenate([row.astype(np.float32)[:, None] * inv, col.astype(np.float32)[:, None] * inv], axis=1)
    ang = np.concatenate([ang, ang], axis=1).astype(np.float32)
    patches = grid_h * grid_w
    px = np.asarray(pixel_values, np.float32).reshape(images, patches, cfg.patch_dim).astype(store)
    return {"pixel_values": px, "pos_taps": taps, "pos_weights": weights.astype(store),
            "rope_cos": np.cos(ang).astype(np.float32), "rope_sin": np.sin(ang).astype(np.float32)}  # fmt: skip


def _merger(b: ProgramBuilder, cfg: H3VisionConfig, name: str, h: Var, *, postshuffle: bool) -> Var:
    n, p, d = h.shape
    wide = d * cfg.merge_unit
    if not postshuffle:
        h = layer_norm(b, h, f"{name}.norm", eps=EPS)
    h = b.emit("reshape", h, shape=(n, p // cfg.merge_unit, wide))
    if postshuffle:
        h = layer_norm(b, h, f"{name}.norm", eps=EPS)
    h = activation(b, linear(b, h, f"{name}.linear_fc1", wide, bias=True), "gelu")
    return linear(b, h, f"{name}.linear_fc2", cfg.out_hidden_size, bias=True)


def _block(b: ProgramBuilder, cfg: H3VisionConfig, name: str, h: Var, cos: Var, sin: Var) -> Var:
    n, p, d = h.shape
    with b.scope(block=name, section="attn"):
        a = layer_norm(b, h, f"{name}.norm1", eps=EPS)
        qkv = b.emit("reshape", linear(b, a, f"{name}.attn.qkv", 3 * d, bias=True),
                     shape=(n, p, 3, cfg.num_heads, cfg.head_dim))  # fmt: skip
        q, k, v = (b.emit("reshape", t, shape=(n, p, cfg.num_heads, cfg.head_dim)) for t in split(b, qkv, [1, 1, 1],
                                                                                                  axis=2))  # fmt: skip
        q = apply_rope(b, q, cos, sin, mode="half")
        k = apply_rope(b, k, cos, sin, mode="half")
        h = b.emit("add", h, linear(b, attention(b, q, k, v), f"{name}.attn.proj", d, bias=True))
    with b.scope(block=name, section="mlp"):
        m = layer_norm(b, h, f"{name}.norm2", eps=EPS)
        m = activation(b, linear(b, m, f"{name}.mlp.linear_fc1", cfg.intermediate_size, bias=True), "gelu_tanh")
        h = b.emit("add", h, linear(b, m, f"{name}.mlp.linear_fc2", d, bias=True))
    return h


def build_vision_tower(cfg: H3VisionConfig, *, images: int, grid_h: int, grid_w: int,
                       dtype: DType | str = "f32") -> Program:  # fmt: skip
    """`images` pictures of one (grid_h, grid_w) patch grid. Inputs as `vision_inputs`; outputs
    (meta["outputs"]) `image_embeds` (images * P / m^2, out_hidden) and `deepstack_i` of the same shape per
    configured deepstack layer, rows in the order the picture blocks' pad tokens take them."""
    dt = DType(dtype)
    p, d = grid_h * grid_w, cfg.hidden_size
    b = ProgramBuilder("h3_vision_tower", frontend_revision=REVISION)
    b.meta.update({"family": "h3", "component": "vision_tower", "dtype": dt.value})
    px = b.input("pixel_values", (images, p, cfg.patch_dim), dt)
    taps = b.input("pos_taps", (p, 4), DType.I64)
    weights = b.input("pos_weights", (p, 4, 1), dt)
    cos = b.input("rope_cos", (p, cfg.head_dim), DType.F32)
    sin = b.input("rope_sin", (p, cfg.head_dim), DType.F32)
    outputs: list[Var] = []
    with b.scope(module="vision_tower"):
        with b.scope(block=f"{PREFIX}.patch_embed", section="embed"):
            name = f"{PREFIX}.patch_embed.proj"
            t, ps = cfg.temporal_patch_size, cfg.patch_size
            kernel = b.param(f"{name}.weight", (d, cfg.in_channels, t, ps, ps), dt)
            bias = b.param(f"{name}.bias", (d,), dt)
            with b.scope(tensors=(kernel.name, bias.name)):
                h = b.emit("linear", px, b.emit("reshape", kernel, shape=(d, cfg.patch_dim)), bias)
            table = b.param(f"{PREFIX}.pos_embed.weight", (cfg.num_position_embeddings, d), dt)
            with b.scope(tensors=(table.name,)):
                pos = b.emit("reduce_sum", b.emit("mul", b.emit("take", table, taps, axis=0), weights), axes=(1,),
                             keepdims=False)  # fmt: skip
            h = b.emit("add", h, b.emit("reshape", pos, shape=(1, p, d)))
        deep: list[Var] = []
        for i in range(cfg.depth):
            h = _block(b, cfg, f"{PREFIX}.blocks.{i}", h, cos, sin)
            if i in cfg.deepstack_visual_indexes:
                j = cfg.deepstack_visual_indexes.index(i)
                with b.scope(block=f"{PREFIX}.deepstack_merger_list.{j}", section="merger"):
                    deep.append(_merger(b, cfg, f"{PREFIX}.deepstack_merger_list.{j}", h, postshuffle=True))
        with b.scope(block=f"{PREFIX}.merger", section="merger"):
            outputs.append(_merger(b, cfg, f"{PREFIX}.merger", h, postshuffle=False))
        outputs += deep
    rows = images * p // cfg.merge_unit
    for o in outputs:
        b.output(b.emit("reshape", o, shape=(rows, cfg.out_hidden_size)))
    b.meta["outputs"] = ",".join(["image_embeds", *(f"deepstack_{j}" for j in range(len(deep)))])
    return b.build()

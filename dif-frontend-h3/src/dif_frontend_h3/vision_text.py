"""The Qwen3-VL text stack over a presentation with picture blocks: token ids + the vision tower's outputs
-> hidden_states[tap].

Frontend stage 1 of fl2va's text (transformers Qwen3VLModel.forward with pixel_values): the embeddings of
the image pad tokens are replaced by the vision tower's `image_embeds`, row for row in order; after each of
the first k decoder layers (k = the deepstack features) the k-th feature is added to those rows; positions
are Qwen3-VL's 3-D mRoPE (`mrope_positions`) and the rope table interleaves the t / h / w angles
(`mrope_tables`). The tap is transformers' `hidden_states[tap]`: the output of layer tap - 1 as its hook
records it, before that layer's deepstack addition. Parameter names as `text_encoder.build_text_encoder`.
The scatter is a gather: `vision_index` (1, L) holds 1 + j on the j-th pad token and 0 elsewhere, into the
features with a zero row put in front; text rows keep their embedding (`where`) and get + 0 from deepstack.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.dtypes import DType
from dif.errors import UsageError
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers.basic import embedding
from dif.layers.causal_lm import DecoderLayerSpec, decoder_layer
from dif_frontend_h3.config import H3TextConfig
from dif_frontend_h3.text_encoder import PREFIX, REVISION
from dif_frontend_h3.vision_config import H3VisionConfig


def mrope_positions(ids: Sequence[int], image_token_id: int, grids: np.ndarray, merge: int) -> np.ndarray:
    """(3, L) int64 (t, h, w) positions as transformers' `get_rope_index`: a text run counts on from the
    current position on all three axes; a run of image pad tokens takes its picture's merged grid (t, h, w)
    offset by the current position, which then moves on by max(h, w) / merge."""
    ids = np.asarray(ids, dtype=np.int64)
    is_image = ids == image_token_id
    parts, pos, picture = [], 0, 0
    starts = np.flatnonzero(np.diff(np.concatenate([[-1], is_image.astype(np.int64)])) != 0)
    for a, z in zip(starts, [*starts[1:], len(ids)], strict=True):
        if not is_image[a]:
            parts.append(np.broadcast_to(np.arange(z - a) + pos, (3, z - a)))
            pos += z - a
            continue
        if picture >= len(grids):
            raise UsageError(f"the prompt holds more picture blocks than the {len(grids)} pictures given")
        t, gh, gw = (int(g) for g in grids[picture])
        lt, lh, lw = t, gh // merge, gw // merge
        if lt * lh * lw != z - a:
            raise UsageError(f"picture {picture + 1} has {lt * lh * lw} rows but its block {z - a} pad tokens")
        grid = np.stack(np.meshgrid(np.arange(lt), np.arange(lh), np.arange(lw), indexing="ij")).reshape(3, -1)
        parts.append(grid + pos)
        pos += max(gh, gw) // merge
        picture += 1
    return np.concatenate(parts, axis=1).astype(np.int64)


def mrope_tables(cfg: H3TextConfig, positions: np.ndarray, section: Sequence[int],
                 *, dtype: DType | str = "f32") -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """`rope_cos` / `rope_sin` (L, head_dim) for (3, L) positions: fp32 angles per axis, the frequency index
    j taken from h where j = 1 mod 3 (j < 3 section[1]), from w where j = 2 mod 3 (j < 3 section[2]), else
    from t (transformers' interleaved `recomposition_frequencies`); [a | a]; rounded to `dtype`."""
    hd = cfg.head_dim
    inv = np.float32(1) / (np.float32(cfg.rope_theta) ** (np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)))
    freqs = np.asarray(positions, np.float32)[:, :, None] * inv  # (3, L, hd / 2) fp32
    angles = freqs[0].copy()
    for axis, offset in ((1, 1), (2, 2)):
        idx = slice(offset, section[axis] * 3, 3)
        angles[:, idx] = freqs[axis][:, idx]
    angles = np.concatenate([angles, angles], axis=1)
    store = DType(dtype).np
    return np.cos(angles).astype(np.float32).astype(store), np.sin(angles).astype(np.float32).astype(store)


def deepstack_used(vcfg: H3VisionConfig, tap: int) -> int:
    """How many deepstack features the program reads: one after each of layers 0 .. tap - 2 at most (the
    addition after layer tap - 1 comes after the tap)."""
    return min(len(vcfg.deepstack_visual_indexes), tap - 1)


def picture_inputs(cfg: H3TextConfig, vcfg: H3VisionConfig, ids: Sequence[int], grids: np.ndarray,
                   *, dtype: DType | str = "f32") -> dict[str, np.ndarray]:  # fmt: skip
    """The token-side program inputs for ids (a presentation with picture blocks) and the pictures' grids:
    input_ids, attention_mask, the mRoPE tables, vision_index / vision_mask. The vision tower's outputs are
    added by the caller under their names (`image_embeds`, `deepstack_j`)."""
    arr = np.asarray([ids], dtype=np.int64)
    is_image = arr == vcfg.image_token_id
    index = np.where(is_image, np.cumsum(is_image, axis=1), 0).astype(np.int64)
    cos, sin = mrope_tables(cfg, mrope_positions(ids, vcfg.image_token_id, grids, vcfg.spatial_merge_size),
                            vcfg.mrope_section, dtype=dtype)  # fmt: skip
    return {"input_ids": arr, "attention_mask": np.ones(arr.shape, dtype=bool), "rope_cos": cos, "rope_sin": sin,
            "vision_index": index, "vision_mask": is_image[:, :, None]}  # fmt: skip


def _scatter(b: ProgramBuilder, rows: Var, index: Var) -> Var:
    """(V, D) features -> (1, L, D): row j at the token with index 1 + j, zeros where the index is 0."""
    zero = b.emit("full", shape=(1, rows.shape[1]), value=0.0, dtype=rows.dtype.value)
    return b.emit("take", b.emit("concat", zero, rows, axis=0), index, axis=0)


def build_vision_text_encoder(cfg: H3TextConfig, vcfg: H3VisionConfig, *, seq_len: int, vision_rows: int,
                              tap: int, dtype: DType | str = "f32") -> Program:  # fmt: skip
    """Decoder layers 0..tap-1 over seq_len tokens of which vision_rows are image pad tokens; output
    (meta["outputs"] = "text_embeds") hidden_states[tap] (1, L, hidden). Inputs as `picture_inputs` plus
    image_embeds (V, hidden) and deepstack_j (V, hidden) for j < `deepstack_used`."""
    if not 0 < tap < cfg.num_hidden_layers:
        raise UsageError(f"text encoder tap {tap} must lie in 1..{cfg.num_hidden_layers - 1} (an inner layer)")
    if vcfg.out_hidden_size != cfg.hidden_size:
        raise UsageError(f"vision out_hidden_size {vcfg.out_hidden_size} != text hidden_size {cfg.hidden_size}")
    dt = DType(dtype)
    b = ProgramBuilder("h3_vision_text_encoder", frontend_revision=REVISION)
    b.meta.update({"family": "h3", "component": "text_encoder", "dtype": dt.value, "taps": str(tap)})
    ids = b.input("input_ids", (1, seq_len), DType.I64)
    mask = b.input("attention_mask", (1, seq_len), DType.BOOL)
    cos = b.input("rope_cos", (seq_len, cfg.head_dim), dt)
    sin = b.input("rope_sin", (seq_len, cfg.head_dim), dt)
    index = b.input("vision_index", (1, seq_len), DType.I64)
    is_image = b.input("vision_mask", (1, seq_len, 1), DType.BOOL)
    image = b.input("image_embeds", (vision_rows, cfg.hidden_size), dt)
    deep = [b.input(f"deepstack_{j}", (vision_rows, cfg.hidden_size), dt) for j in range(deepstack_used(vcfg, tap))]
    spec = DecoderLayerSpec.qwen3(cfg)
    with b.scope(module="text_encoder"):
        with b.scope(block=f"{PREFIX}.embed_tokens", section="embed"):
            text = embedding(b, ids, f"{PREFIX}.embed_tokens", cfg.vocab_size, cfg.hidden_size, dt)
            h = b.emit("where", is_image, _scatter(b, image, index), text)
        for i in range(tap):
            h = decoder_layer(b, spec, f"{PREFIX}.layers.{i}", h, key_mask=mask, cos=cos, sin=sin)
            if i < len(deep) and i < tap - 1:
                with b.scope(block=f"{PREFIX}.layers.{i}", section="deepstack"):
                    h = b.emit("add", h, _scatter(b, deep[i], index))
    b.output(h)
    b.meta["outputs"] = "text_embeds"
    return b.build()

"""MiniMax-H3 DiT (MiniMaxH3Transformer3DModel) as a DiffIR program for one packed layout, plus its host inputs.

Frontend stage 2. One forward over the single packed sequence `[text | conditions | audio | video]`
(layout.py): per-modality input projections, the text refiner, 50 AdaLN blocks with full self-attention
and partial RoPE (the first 6 x rope_freq_dim channels of every head, `rope(mode="half")`), the shared
output norm and the two fp32 heads. Parameter names are the diffusers state-dict names.

Per-row AdaLN: the block's table `(K, 18D)` is `(3K, 6D)` rows addressed by `slot * 3 + tag`. Rows of a
`Segment` (a run of equal slot and tag; three or four runs per request) share a row, so the residual
stream is kept as one tensor per segment and each is modulated and gated by its own `(1, 1, D)` slices of
the table: the math of the reference's per-row `index_select`, without a gathered `(S, D)` table per
chunk (6 x 408 MB per block at the default canvas). Attention and the linears run on the concatenated
sequence. Precision islands follow the reference: `proj_in`, `audio_proj_in`, the time MLP, `silu(temb)`
and both heads are fp32; the text stream, the residual stream, every block linear and the AdaLN
projections run in the program dtype; RoPE tables are fed in the program dtype (the reference casts
cos/sin down before rotating).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers.attention import attention, project_heads
from dif.layers.basic import linear
from dif.layers.tables import sinusoidal_embedding
from dif_frontend_h3 import __version__
from dif_frontend_h3.config import H3TransformerConfig
from dif_frontend_h3.layout import PackedLayout, Segment

REVISION = f"dif-frontend-h3 {__version__}"
MODULE = "transformer"
MODALITIES = 3


# -- host-side inputs ----------------------------------------------------------------------------


def time_proj(timesteps: Sequence[float] | np.ndarray, dim: int = 256) -> np.ndarray:
    """(K, dim) float32 `[cos | sin]` sinusoid of the unscaled timesteps t = 1 - sigma (t = 1 is clean)."""
    return sinusoidal_embedding(np.asarray(timesteps, dtype=np.float32), dim, flip_sin_to_cos=True)


def rope_tables(
    cfg: H3TransformerConfig, position_ids: np.ndarray, *, dtype: DType | str = "f32"
) -> tuple[np.ndarray, np.ndarray]:
    """`rope_cos` / `rope_sin` (S, 6 rope_freq_dim) for the float64 grid (S, 3): positions cast to fp32,
    angles `pos * inv_freq` in fp32 per axis, (t | h | w) concatenated then duplicated, cos/sin in fp32 and
    rounded to `dtype` (the reference rotates with tables cast to the activation dtype)."""
    pos = np.asarray(position_ids, dtype=np.float64).astype(np.float32)
    n = cfg.rope_freq_dim
    exponent = (np.arange(0, 2 * n, 2, dtype=np.float32) / np.float32(2 * n)).astype(np.float32)
    inv_freq = (np.float32(1.0) / (np.float32(cfg.rope_theta) ** exponent)).astype(np.float32)
    angles = (pos[:, :, None] * inv_freq[None, None, :]).astype(np.float32)  # (S, 3, n)
    angles = angles.reshape(len(pos), 3 * n)
    angles = np.concatenate([angles, angles], axis=1)
    store = DType(dtype).np
    return np.cos(angles).astype(store), np.sin(angles).astype(store)


# -- pieces --------------------------------------------------------------------------------------


def _rms(b: ProgramBuilder, x: Var, weight: Var | None, eps: float) -> Var:
    """torch.nn.RMSNorm: fp32 inside, weight multiplied in fp32, one rounding."""
    with b.scope(tensors=(weight.name,) if weight is not None else ()):
        return b.emit("rms_norm", x, weight, eps=eps)


def _norm_param(b: ProgramBuilder, name: str, dim: int, dt: DType) -> Var:
    return b.param(f"{name}.weight", (dim,), dt)


def _attention(b: ProgramBuilder, cfg: H3TransformerConfig, name: str, x: Var, cos: Var | None, sin: Var | None) -> Var:
    """MiniMaxH3Attention on x (B, S, D): q/k/v (no bias) -> heads -> per-head RMS q/k norms -> partial
    half-split RoPE -> sdpa (one unmasked document) -> to_out.0."""
    heads, hd = cfg.num_attention_heads, cfg.attention_head_dim
    q = project_heads(b, x, f"{name}.to_q", heads, hd)
    k = project_heads(b, x, f"{name}.to_k", heads, hd)
    v = project_heads(b, x, f"{name}.to_v", heads, hd)
    q = _rms(b, q, _norm_param(b, f"{name}.norm_q", hd, x.dtype), cfg.qk_norm_eps)
    k = _rms(b, k, _norm_param(b, f"{name}.norm_k", hd, x.dtype), cfg.qk_norm_eps)
    if cos is not None and sin is not None:
        q = b.emit("rope", q, cos, sin, mode="half")
        k = b.emit("rope", k, cos, sin, mode="half")
    return linear(b, attention(b, q, k, v), f"{name}.to_out.0", cfg.hidden_size)


def _feed_forward(b: ProgramBuilder, cfg: H3TransformerConfig, name: str, x: Var) -> Var:
    """diffusers FeedForward(activation_fn="swiglu"): net.0.proj (D -> 2F), `a * silu(b)`, net.2 (F -> D)."""
    y = linear(b, x, f"{name}.net.0.proj", 2 * cfg.ffn_dim)
    return linear(b, b.emit("glu", y, act="silu", gated_half="second"), f"{name}.net.2", cfg.hidden_size)


def _concat(b: ProgramBuilder, parts: Sequence[Var]) -> Var:
    return parts[0] if len(parts) == 1 else b.emit("concat", *parts, axis=1)


def _split_like(b: ProgramBuilder, x: Var, segments: Sequence[Segment]) -> list[Var]:
    if len(segments) == 1:
        return [x]
    return list(b.emit_multi("split", x, axis=1, sizes=tuple(s.rows for s in segments)))


def _rows(b: ProgramBuilder, table: Var, row: int) -> tuple[Var, ...]:
    """table (R, n, D) -> its row `row` as n tensors (1, 1, D) (one slice, one split)."""
    r = b.emit("slice", table, axis=0, start=row, stop=row + 1, step=1)
    return b.emit_multi("split", r, axis=1, sizes=(1,) * table.shape[1])


def _refiner(b: ProgramBuilder, cfg: H3TransformerConfig, c: Var) -> Var:
    """token_refiner: pre-norm attention (no RoPE) and SwiGLU blocks, then the final RMS norm."""
    d, eps = cfg.hidden_size, cfg.norm_eps
    for i in range(cfg.num_refiner_layers):
        name = f"token_refiner.refiner_blocks.{i}"
        with b.scope(block=name, section="attn"):
            n = _rms(b, c, _norm_param(b, f"{name}.norm1", d, c.dtype), eps)
            c = b.emit("add", c, _attention(b, cfg, f"{name}.attn", n, None, None))
        with b.scope(block=name, section="ff"):
            n = _rms(b, c, _norm_param(b, f"{name}.norm2", d, c.dtype), eps)
            c = b.emit("add", c, _feed_forward(b, cfg, f"{name}.ff", n))
    with b.scope(block="token_refiner.final_norm", section="norm"):
        return _rms(b, c, _norm_param(b, "token_refiner.final_norm", d, c.dtype), cfg.final_norm_eps)


def _block(
    b: ProgramBuilder,
    cfg: H3TransformerConfig,
    name: str,
    hs: list[Var],
    segments: Sequence[Segment],
    act_temb: Var,
    cos: Var,
    sin: Var,
) -> list[Var]:
    """MiniMaxH3TransformerBlock on the per-segment residual stream `hs` (each (B, rows, D)). The AdaLN
    table M = adaln_proj.linear(silu(temb)) (K, 18D): segment (slot k, tag g) reads chunk j (shift, scale,
    gate, shift, scale, gate) of row 3k + g of its `(3K, 6, D)` view."""
    d, eps = cfg.hidden_size, cfg.norm_eps
    with b.scope(block=name, section="adaln"):
        table = linear(b, act_temb, f"{name}.adaln_proj.linear", 6 * MODALITIES * d, bias=True)
        table = b.emit("reshape", table, shape=(table.shape[0] * MODALITIES, 6, d))  # row slot * 3 + tag
        mods = {}
        for s in segments:
            if (s.slot, s.tag) not in mods:
                mods[(s.slot, s.tag)] = _rows(b, table, s.slot * MODALITIES + s.tag)
    w1 = _norm_param(b, f"{name}.norm1", d, hs[0].dtype)
    w2 = _norm_param(b, f"{name}.norm2", d, hs[0].dtype)
    with b.scope(block=name, section="attn"):
        xs = []
        for h, s in zip(hs, segments, strict=True):
            sh, sc, _ = mods[(s.slot, s.tag)][:3]
            xs.append(b.emit("modulate", _rms(b, h, w1, eps), sc, sh))
        o = _attention(b, cfg, f"{name}.attn", _concat(b, xs), cos, sin)
        hs = [b.emit("add", h, b.emit("mul", mods[(s.slot, s.tag)][2], oi))
              for h, s, oi in zip(hs, segments, _split_like(b, o, segments), strict=True)]  # fmt: skip
    with b.scope(block=name, section="ff"):
        xs = []
        for h, s in zip(hs, segments, strict=True):
            sh, sc = mods[(s.slot, s.tag)][3:5]
            xs.append(b.emit("modulate", _rms(b, h, w2, eps), sc, sh))
        y = _feed_forward(b, cfg, f"{name}.ff", _concat(b, xs))
        hs = [b.emit("add", h, b.emit("mul", mods[(s.slot, s.tag)][5], yi))
              for h, s, yi in zip(hs, segments, _split_like(b, y, segments), strict=True)]  # fmt: skip
    return hs


def _sequence_segments(layout: PackedLayout) -> list[Segment]:
    """`layout.segments()` also cut at the block boundaries (text | conditions | audio | video), so every
    segment lies inside one input block."""
    bounds = {0, layout.text_len, layout.text_len + layout.condition_rows,
              layout.text_len + layout.condition_rows + layout.audio_rows, layout.seq_len}  # fmt: skip
    out = []
    for s in layout.segments():
        cuts = sorted(x for x in bounds if s.start < x < s.stop)
        edges = [s.start, *cuts, s.stop]
        out += [Segment(a, z, s.slot, s.tag) for a, z in zip(edges, edges[1:], strict=False)]
    return out


def denoise(
    b: ProgramBuilder,
    cfg: H3TransformerConfig,
    layout: PackedLayout,
    video: Var,
    audio: Var,
    text: Var,
    t_proj: Var,
    cos: Var,
    sin: Var,
) -> tuple[Var, Var]:
    """video (B, Nv, 96) f32 [conditions | target], audio (B, 2A, 32) f32, text (B, L, text_dim), t_proj (K, 256)
    f32 -> data-ward velocities (B, Nv, 96) and (B, 2A, 32), f32."""
    dt = text.dtype
    d = cfg.hidden_size
    f32 = DType.F32
    L, C, A = layout.text_len, layout.condition_rows, layout.audio_rows
    with b.scope(module=MODULE):
        with b.scope(block="time_embedder", section="time"):
            temb = linear(b, t_proj, "time_embedder.linear_1", cfg.time_embed_hidden_dim, bias=True)
            temb = linear(b, b.emit("silu", temb), "time_embedder.linear_2", cfg.time_embed_dim, bias=True)
            act = b.emit("silu", temb)  # fp32, rounded once for the projections that read it
            act = act if dt == f32 else b.emit("cast", act, dtype=dt.value)
        with b.scope(block="proj_in", section="in"):
            v = linear(b, video, "proj_in", d, bias=True)
            a = linear(b, audio, "audio_proj_in", d, bias=True)
            if dt != f32:
                v, a = b.emit("cast", v, dtype=dt.value), b.emit("cast", a, dtype=dt.value)
        with b.scope(block="context_embedder", section="in"):
            c = _refiner(b, cfg, linear(b, text, "context_embedder", d, bias=True))
        segments = _sequence_segments(layout)
        hs = []
        for s in segments:  # each segment's rows from its input block: text, conditions, audio, target video
            if s.start < L:
                src, lo = c, s.start
            elif s.start < L + C:
                src, lo = v, s.start - L
            elif s.start < L + C + A:
                src, lo = a, s.start - L - C
            else:
                src, lo = v, s.start - L - A
            whole = src.shape[1] == s.rows
            hs.append(src if whole else b.emit("slice", src, axis=1, start=lo, stop=lo + s.rows, step=1))
        for i in range(cfg.num_layers):
            hs = _block(b, cfg, f"transformer_blocks.{i}", hs, segments, act, cos, sin)
        with b.scope(block="norm_out", section="out"):
            table = linear(b, act, "norm_out.linear", 2 * d, bias=True)  # shift | scale, per timestep slot
            table = b.emit("reshape", table, shape=(table.shape[0], 2, d))
            wn = _norm_param(b, "norm_out.norm", d, dt)
            out_rows = {slot: _rows(b, table, slot) for slot in sorted({s.slot for s in segments})}
            ys = []
            for h, s in zip(hs, segments, strict=True):
                shift, scale = out_rows[s.slot]
                y = b.emit("modulate", _rms(b, h, wn, cfg.final_norm_eps), scale, shift)
                ys.append(y if dt == f32 else b.emit("cast", y, dtype=f32.value))
        with b.scope(block="proj_out", section="out"):
            v0 = L + C + A
            vids = [y for y, s in zip(ys, segments, strict=True) if L <= s.start < L + C] + [
                y for y, s in zip(ys, segments, strict=True) if s.start >= v0
            ]
            auds = [y for y, s in zip(ys, segments, strict=True) if L + C <= s.start < v0]
            v_out = linear(b, _concat(b, vids), "proj_out", cfg.video_patch_dim, bias=True)
            a_out = linear(b, _concat(b, auds), "audio_proj_out", cfg.audio_in_channels, bias=True)
    return v_out, a_out


def build_denoiser(cfg: H3TransformerConfig, layout: PackedLayout, *, dtype: DType | str = "f32") -> Program:
    """One DiT forward for `layout` (batch 1).

    Inputs: video_latents (1, Nv, 96) f32 (conditioning rows first, then the target rows, `layout.patchify`
    order); audio_latents (1, 2A, 32) f32 channel-major; text_embeds (1, L, text_dim) in `dtype` (the text
    encoder's hidden_states[50]); time_proj (K, freq_dim) f32 from `time_proj(layout.row_timesteps(...))`;
    rope_cos / rope_sin (S, 6 rope_freq_dim) in `dtype` from `rope_tables(layout.position_ids)`.
    Outputs (meta["outputs"] = "video_velocity,audio_velocity"): (1, Nv, 96) and (1, 2A, 32) f32, the
    data-ward `x0 - eps` velocity."""
    dt = DType(dtype)
    b = ProgramBuilder("h3_denoiser", frontend_revision=REVISION)
    b.meta.update({"family": "h3", "component": "transformer", "dtype": dt.value})
    nv = layout.condition_rows + layout.video_rows
    video = b.input("video_latents", (1, nv, cfg.video_patch_dim), DType.F32)
    audio = b.input("audio_latents", (1, layout.audio_rows, cfg.audio_in_channels), DType.F32)
    text = b.input("text_embeds", (1, layout.text_len, cfg.text_dim), dt)
    t = b.input("time_proj", (layout.num_slots, cfg.freq_dim), DType.F32)
    cos = b.input("rope_cos", (layout.seq_len, cfg.rotary_dim), dt)
    sin = b.input("rope_sin", (layout.seq_len, cfg.rotary_dim), dt)
    b.output(*denoise(b, cfg, layout, video, audio, text, t, cos, sin))
    b.meta["outputs"] = "video_velocity,audio_velocity"
    return b.build()

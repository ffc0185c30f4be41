"""Krea 2 transformer (Krea2Transformer2DModel) as DiffIR programs, plus their host-side inputs.

Frontend stage 2. The model splits into a timestep-independent part, text fusion + `txt_in`
(`build_text_fusion`, run once per prompt), and the per-step denoiser (`build_denoiser`);
`build_transformer` is the whole forward in one program (parity tests, `dif inspect`). Parameter
names are the diffusers state-dict names, so a diffusers checkpoint binds by identity.

Numerics follow the reference: every zero-centred RMS norm (`x * rsqrt(mean x^2 + eps) * (1 + w)`)
runs in fp32 with fp32 weights; RoPE tables are fp64-derived fp32 and rotate in fp32; the
timestep sinusoid is fp32, then rounded to the model dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.dtypes import DType
from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers.attention import apply_rope, attention, project_heads
from dif.layers.basic import activation, linear, split
from dif.layers.ffn import glu_ffn_split
from dif.layers.modulation import gated_residual, timestep_mlp
from dif.layers.tables import grid_ids, rope_pairs_tables, sinusoidal_embedding
from dif_frontend_krea2 import __version__
from dif_frontend_krea2.config import Krea2TransformerConfig

REVISION = f"dif-frontend-krea2 {__version__}"
MODULE = "transformer"
NORM_DTYPE = DType.F32  # the reference keeps every norm weight in fp32 (`_keep_in_fp32_modules`)


# -- host-side inputs ----------------------------------------------------------------------------


def timestep_proj(times: Sequence[float] | np.ndarray, *, dtype: DType | str = "f32", dim: int = 256) -> np.ndarray:
    """The `timestep_proj` input (B, dim) for flow times in [0, 1] (1 = pure noise) given in fp32.

    The pipeline hands the model `dtype(time)`; the model takes the sinusoid ([cos | sin], max
    period 1e4) of `float32(that) * 1000` in fp32 and casts it to `dtype`, the returned storage type.
    """
    t = np.asarray(times, dtype=np.float32).reshape(-1)
    store = DType(dtype).np
    t_model = t.astype(store).astype(np.float32) * np.float32(1000.0)
    return sinusoidal_embedding(t_model, dim, flip_sin_to_cos=True).astype(store)


def timestep_proj_from_timesteps(
    timesteps: Sequence[float] | np.ndarray, *, dtype: DType | str = "f32", dim: int = 256
) -> np.ndarray:
    """`timestep_proj` for scheduler timesteps t in [0, 1000] (the pipeline divides by 1000 in fp32)."""
    t = np.asarray(timesteps, dtype=np.float32).reshape(-1)
    return timestep_proj(t / np.float32(1000.0), dtype=dtype, dim=dim)


def position_ids(text_len: int, grid_h: int, grid_w: int) -> np.ndarray:
    """(text_len + grid_h * grid_w, 3) rotary coordinates: text rows at the origin, image rows (0, h, w)."""
    text = np.zeros((text_len, 3), dtype=np.int64)
    return np.concatenate([text, grid_ids([0], np.arange(grid_h), np.arange(grid_w))], axis=0)


def rope_tables(cfg: Krea2TransformerConfig, text_len: int, grid_h: int, grid_w: int) -> tuple[np.ndarray, np.ndarray]:
    """`rope_cos` / `rope_sin` (text_len + grid_h*grid_w, attention_head_dim) float32, interleaved pairs."""
    return rope_pairs_tables(position_ids(text_len, grid_h, grid_w), cfg.axes_dims_rope, cfg.rope_theta)


def attention_mask(text_mask: np.ndarray, image_len: int) -> np.ndarray:
    """(B, text_len + image_len) bool key mask of the joint sequence: the text mask, then all image keys."""
    tm = np.asarray(text_mask).astype(bool)
    return np.concatenate([tm, np.ones((tm.shape[0], image_len), dtype=bool)], axis=1)


# -- shared pieces -------------------------------------------------------------------------------


def rms0(b: ProgramBuilder, x: Var, name: str, *, eps: float) -> Var:
    """Zero-centred RMS norm over the last axis with an fp32 weight `{name}.weight`: x * rsqrt(...) * (1 + w)."""
    w = b.param(f"{name}.weight", (x.shape[-1],), NORM_DTYPE)
    with b.scope(tensors=(w.name,)):
        return b.emit("rms_norm", x, w, eps=eps, offset=1.0)


def gated_attention(
    b: ProgramBuilder,
    name: str,
    x: Var,
    *,
    heads: int,
    kv_heads: int,
    eps: float,
    key_mask: Var | None = None,
    cos: Var | None = None,
    sin: Var | None = None,
) -> Var:
    """Krea2Attention on x [B, S, D]: GQA projections, zero-centred q/k norms, pair RoPE (when tables
    are given), masked sdpa, output gated by sigmoid(to_gate x), then `to_out.0`."""
    d = x.shape[-1]
    hd = d // heads
    q = project_heads(b, x, f"{name}.to_q", heads, hd)
    k = project_heads(b, x, f"{name}.to_k", kv_heads, hd)
    v = project_heads(b, x, f"{name}.to_v", kv_heads, hd)
    gate = linear(b, x, f"{name}.to_gate", d)
    q = apply_rope(b, rms0(b, q, f"{name}.norm_q", eps=eps), cos, sin, mode="pairs")
    k = apply_rope(b, rms0(b, k, f"{name}.norm_k", eps=eps), cos, sin, mode="pairs")
    o = attention(b, q, k, v, key_mask=key_mask)
    o = b.emit("mul", o, b.emit("sigmoid", gate))
    return linear(b, o, f"{name}.to_out.0", d)


def _fusion_block(
    b: ProgramBuilder, cfg: Krea2TransformerConfig, name: str, x: Var, key_mask: Var | None
) -> Var:
    """Krea2TextFusionBlock: pre-norm attention (no RoPE, no modulation) and SwiGLU, both residual."""
    eps = cfg.norm_eps
    with b.scope(block=name, section="attn"):
        a = gated_attention(
            b, f"{name}.attn", rms0(b, x, f"{name}.norm1", eps=eps), heads=cfg.text_num_attention_heads,
            kv_heads=cfg.text_num_key_value_heads, eps=eps, key_mask=key_mask,
        )
        x = b.emit("add", x, a)
    with b.scope(block=name, section="ff"):
        y = glu_ffn_split(b, rms0(b, x, f"{name}.norm2", eps=eps), f"{name}.ff.gate", f"{name}.ff.up",
                          f"{name}.ff.down", cfg.text_intermediate_size)
        x = b.emit("add", x, y)
    return x


def text_conditioning(b: ProgramBuilder, cfg: Krea2TransformerConfig, taps: Var, text_mask: Var | None) -> Var:
    """Text fusion + `txt_in`: taps (B, L, T, Dt) -> (B, L, D).

    The layerwise blocks attend across the T tapped layers of each token (B*L sequences of length
    T, unmasked); `text_fusion.projector` (Linear T -> 1) collapses that axis; the refiner blocks
    attend across tokens with the key mask; `txt_in` = rms0 -> linear -> gelu_tanh -> linear."""
    bsz, seq, n_taps, dt_w = taps.shape
    if n_taps != cfg.num_text_layers or dt_w != cfg.text_hidden_dim:
        raise DifError(f"text taps {taps.type} do not match num_text_layers/text_hidden_dim of the config")
    with b.scope(module=MODULE):
        x = b.emit("reshape", taps, shape=(bsz * seq, n_taps, dt_w))
        for i in range(cfg.num_layerwise_text_blocks):
            x = _fusion_block(b, cfg, f"text_fusion.layerwise_blocks.{i}", x, None)
        with b.scope(block="text_fusion.projector", section="collapse_layers"):
            x = b.emit("transpose", b.emit("reshape", x, shape=(bsz, seq, n_taps, dt_w)), perm=(0, 1, 3, 2))
            x = b.emit("reshape", linear(b, x, "text_fusion.projector", 1), shape=(bsz, seq, dt_w))
        for i in range(cfg.num_refiner_text_blocks):
            x = _fusion_block(b, cfg, f"text_fusion.refiner_blocks.{i}", x, text_mask)
        with b.scope(block="txt_in", section="project"):
            x = linear(b, rms0(b, x, "txt_in.norm", eps=cfg.norm_eps), "txt_in.linear_1", cfg.hidden_size, bias=True)
            x = linear(b, activation(b, x, "gelu_tanh"), "txt_in.linear_2", cfg.hidden_size, bias=True)
    return x


def _block(
    b: ProgramBuilder,
    cfg: Krea2TransformerConfig,
    name: str,
    h: Var,
    temb_mod: Var,
    cos: Var,
    sin: Var,
    key_mask: Var | None,
) -> Var:
    """Krea2TransformerBlock: the shared modulation (B, 6, D) plus this block's `scale_shift_table`,
    chunked scale, shift, gate (attention) then scale, shift, gate (MLP)."""
    bsz, _, d = h.shape
    eps = cfg.norm_eps
    with b.scope(block=name, section="modulation"):
        table = b.param(f"{name}.scale_shift_table", (6, d), h.dtype)
        with b.scope(tensors=(table.name,)):
            mod = b.emit("add", temb_mod, table)
        sc1, sh1, g1, sc2, sh2, g2 = split(b, mod, [1] * 6, axis=1)
    with b.scope(block=name, section="attn"):
        n = b.emit("modulate", rms0(b, h, f"{name}.norm1", eps=eps), sc1, sh1)
        a = gated_attention(b, f"{name}.attn", n, heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
                            eps=eps, key_mask=key_mask, cos=cos, sin=sin)
        h = gated_residual(b, h, g1, a)
    with b.scope(block=name, section="ff"):
        n = b.emit("modulate", rms0(b, h, f"{name}.norm2", eps=eps), sc2, sh2)
        y = glu_ffn_split(b, n, f"{name}.ff.gate", f"{name}.ff.up", f"{name}.ff.down", cfg.intermediate_size)
        h = gated_residual(b, h, g2, y)
    return h


def denoise(
    b: ProgramBuilder,
    cfg: Krea2TransformerConfig,
    latents: Var,
    text_embeds: Var,
    t_proj: Var,
    cos: Var,
    sin: Var,
    key_mask: Var | None,
) -> Var:
    """latents (B, N, in_channels), text_embeds (B, L, D) -> velocity (B, N, in_channels)."""
    bsz, n_img, _ = latents.shape
    n_txt = text_embeds.shape[1]
    d = cfg.hidden_size
    with b.scope(module=MODULE):
        with b.scope(block="time_embed", section="time"):
            temb = timestep_mlp(b, t_proj, "time_embed", d, act="gelu_tanh", bias=True)
            temb = b.emit("reshape", temb, shape=(bsz, 1, d))
        with b.scope(block="time_mod_proj", section="adaln"):
            temb_mod = linear(b, activation(b, temb, "gelu_tanh"), "time_mod_proj", 6 * d, bias=True)
            temb_mod = b.emit("reshape", temb_mod, shape=(bsz, 6, d))
        with b.scope(block="img_in", section="in"):
            x = linear(b, latents, "img_in", d, bias=True)
            h = b.emit("concat", text_embeds, x, axis=1)
        for i in range(cfg.num_layers):
            h = _block(b, cfg, f"transformer_blocks.{i}", h, temb_mod, cos, sin, key_mask)
        with b.scope(block="final_layer", section="out"):
            x = b.emit("slice", h, axis=1, start=n_txt, stop=n_txt + n_img)
            table = b.param("final_layer.scale_shift_table", (2, d), x.dtype)
            with b.scope(tensors=(table.name,)):
                scale, shift = split(b, b.emit("add", temb, table), [1, 1], axis=1)  # raw temb, scale first
            x = b.emit("modulate", rms0(b, x, "final_layer.norm", eps=cfg.norm_eps), scale, shift)
            out = linear(b, x, "final_layer.linear", cfg.in_channels, bias=True)
    return out


# -- programs ------------------------------------------------------------------------------------


def _rope_inputs(b: ProgramBuilder, cfg: Krea2TransformerConfig, seq: int) -> tuple[Var, Var]:
    return (b.input("rope_cos", (seq, cfg.attention_head_dim), DType.F32),
            b.input("rope_sin", (seq, cfg.attention_head_dim), DType.F32))


def _start(name: str, component: str, dt: DType) -> ProgramBuilder:
    b = ProgramBuilder(name, frontend_revision=REVISION)
    b.meta.update({"family": "krea2", "component": component, "dtype": dt.value})
    return b


def build_text_fusion(
    cfg: Krea2TransformerConfig, *, text_len: int = 512, batch: int = 1, dtype: DType | str = "f32",
    masked: bool = True,
) -> Program:
    """The timestep-independent head of the transformer, run once per prompt.

    Inputs: text_hidden_states (B, L, num_text_layers, text_hidden_dim); text_mask (B, L) bool
    (only when `masked`). Output (meta["outputs"] = "text_embeds"): (B, L, hidden_size)."""
    dt = DType(dtype)
    b = _start("krea2_text_fusion", "transformer.text_fusion", dt)
    taps = b.input("text_hidden_states", (batch, text_len, cfg.num_text_layers, cfg.text_hidden_dim), dt)
    mask = b.input("text_mask", (batch, text_len), DType.BOOL) if masked else None
    b.output(text_conditioning(b, cfg, taps, mask))
    b.meta["outputs"] = "text_embeds"
    return b.build()


def build_denoiser(
    cfg: Krea2TransformerConfig, *, image_len: int, text_len: int = 512, batch: int = 1,
    dtype: DType | str = "f32", masked: bool = True,
) -> Program:
    """One denoiser forward on precomputed text embeddings.

    Inputs: latents (B, N, in_channels) packed; text_embeds (B, L, hidden_size) from
    `build_text_fusion`; timestep_proj (B, timestep_embed_dim) from `timestep_proj`; rope_cos,
    rope_sin (L+N, head_dim) f32 from `rope_tables`; attention_mask (B, L+N) bool from
    `attention_mask` (only when `masked`). Output (meta["outputs"] = "velocity"): (B, N, in_channels),
    the `noise - x0` prediction."""
    dt = DType(dtype)
    b = _start("krea2_denoiser", "transformer", dt)
    x = b.input("latents", (batch, image_len, cfg.in_channels), dt)
    c = b.input("text_embeds", (batch, text_len, cfg.hidden_size), dt)
    t = b.input("timestep_proj", (batch, cfg.timestep_embed_dim), dt)
    cos, sin = _rope_inputs(b, cfg, text_len + image_len)
    mask = b.input("attention_mask", (batch, text_len + image_len), DType.BOOL) if masked else None
    b.output(denoise(b, cfg, x, c, t, cos, sin, mask))
    b.meta["outputs"] = "velocity"
    return b.build()


def build_transformer(
    cfg: Krea2TransformerConfig, *, image_len: int, text_len: int = 512, batch: int = 1,
    dtype: DType | str = "f32", masked: bool = True,
) -> Program:
    """The whole Krea2Transformer2DModel forward in one program (text fusion included).

    Inputs as `build_denoiser`, with text_hidden_states (B, L, num_text_layers, text_hidden_dim) in
    place of text_embeds; the text fusion's key mask is the first L columns of attention_mask."""
    dt = DType(dtype)
    b = _start("krea2_transformer", "transformer", dt)
    x = b.input("latents", (batch, image_len, cfg.in_channels), dt)
    taps = b.input("text_hidden_states", (batch, text_len, cfg.num_text_layers, cfg.text_hidden_dim), dt)
    t = b.input("timestep_proj", (batch, cfg.timestep_embed_dim), dt)
    cos, sin = _rope_inputs(b, cfg, text_len + image_len)
    mask = b.input("attention_mask", (batch, text_len + image_len), DType.BOOL) if masked else None
    text_mask = None if mask is None else b.emit("slice", mask, axis=1, start=0, stop=text_len)
    c = text_conditioning(b, cfg, taps, text_mask)
    b.output(denoise(b, cfg, x, c, t, cos, sin, mask))
    b.meta["outputs"] = "velocity"
    return b.build()

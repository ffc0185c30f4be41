"""FLUX.2 [klein] denoiser (Flux2Transformer2DModel) as a DiffIR program, plus its host inputs.

Frontend stage: config -> `build_transformer` -> Program whose parameter names are the diffusers
state-dict names, so a diffusers checkpoint binds by identity. The per-step host inputs (timestep
sinusoid, RoPE tables) come from `flux2_timestep_proj` and `flux2_rope_tables` below. For klein KV's
reference cache, `build_reference_kv` computes the reference tokens' keys/values once and
`build_transformer(n_ref_cached=...)` attends to them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers import (
    apply_rope,
    attention,
    gated_residual,
    glu_ffn_fused,
    head_rms_norm,
    linear,
    modulated_layer_norm,
    modulation_chunks,
    qkv_heads,
    split,
    split_heads,
    split_tokens,
    timestep_mlp,
)
from dif.layers.tables import grid_ids, rope_pairs_tables, sinusoidal_embedding
from dif_frontend_flux2.config import Flux2TransformerConfig

MODULE = "transformer"
_FP16_MAX = 65504.0


# -- host-side inputs ----------------------------------------------------------------------------


def flux2_model_timestep(timesteps: Sequence[float] | np.ndarray, *, dtype: DType | str = "f32") -> np.ndarray:
    """The timestep value the model's sinusoid sees, float32 (B,), for scheduler timesteps (0..1000).

    The pipeline passes `dtype(t) / 1000` computed in `dtype` and the model multiplies by 1000 in
    `dtype` again, so for bf16 t lands on the bf16 grid (e.g. 967.4 -> 968)."""
    dt = DType(dtype)
    t = np.asarray(timesteps, dtype=np.float32).reshape(-1)
    if dt == DType.F32:
        return (t / np.float32(1000.0)).astype(np.float32) * np.float32(1000.0)
    store = dt.np
    t_in = (t.astype(store).astype(np.float32) / np.float32(1000.0)).astype(store)
    return (t_in.astype(np.float32) * np.float32(1000.0)).astype(store).astype(np.float32)


def flux2_timestep_proj(
    timesteps: Sequence[float] | np.ndarray, *, dtype: DType | str = "f32", channels: int = 256
) -> np.ndarray:
    """The `timestep_proj` input (B, channels) in `dtype` storage, for scheduler timesteps (0..1000).

    fp32 sinusoid ([cos | sin], max period 1e4) of `flux2_model_timestep(t, dtype)`, then cast to
    `dtype` as the reference does before the time MLP. For the `guidance_proj` input (only models
    with guidance_embeds) pass guidance * 1000: the model scales guidance like the timestep."""
    t_model = flux2_model_timestep(timesteps, dtype=dtype)
    return sinusoidal_embedding(t_model, channels, flip_sin_to_cos=True).astype(DType(dtype).np)


def flux2_text_ids(n_txt: int) -> np.ndarray:
    """Text position ids (n_txt, 4): (0, 0, 0, l) — text sits on the fourth axis."""
    return grid_ids([0], [0], [0], np.arange(n_txt))


def flux2_image_ids(h: int, w: int, *, t: int = 0) -> np.ndarray:
    """Image token ids (h*w, 4): (t, row, col, 0), row-major; reference image i uses t = 10 + 10 i."""
    return grid_ids([t], np.arange(h), np.arange(w), [0])


def flux2_rope_tables(
    n_txt: int,
    h: int,
    w: int,
    *,
    ref_shapes: Sequence[tuple[int, int]] = (),
    axes_dims: Sequence[int] = (32, 32, 32, 32),
    theta: float = 2000.0,
) -> tuple[np.ndarray, np.ndarray]:
    """`rope_cos`/`rope_sin` inputs (S, sum(axes_dims)) float32, S = n_txt + h*w + sum(ref h*w).

    Rows are text first, then the h x w latent grid, then each reference image grid (h_i, w_i)
    at time coordinate 10, 20, ... (as the pipeline orders the tokens)."""
    ids = [flux2_text_ids(n_txt), flux2_image_ids(h, w)]
    ids += [flux2_image_ids(rh, rw, t=10 + 10 * i) for i, (rh, rw) in enumerate(ref_shapes)]
    return rope_pairs_tables(np.concatenate(ids, axis=0), axes_dims, theta)


def flux2_reference_rope_tables(
    ref_shapes: Sequence[tuple[int, int]], *, axes_dims: Sequence[int] = (32, 32, 32, 32), theta: float = 2000.0
) -> tuple[np.ndarray, np.ndarray]:
    """`rope_cos`/`rope_sin` (sum h_i*w_i, sum(axes_dims)) float32 of the reference grids alone (time
    10, 20, ...), for `build_reference_kv`."""
    ids = [flux2_image_ids(rh, rw, t=10 + 10 * i) for i, (rh, rw) in enumerate(ref_shapes)]
    return rope_pairs_tables(np.concatenate(ids, axis=0), axes_dims, theta)


def reference_kv_names(cfg: Flux2TransformerConfig) -> list[str]:
    """Names of the cached reference keys/values, block by block (double blocks, then single blocks),
    k before v: the outputs of `build_reference_kv` in order, the `ref_kv` inputs of `build_transformer`."""
    blocks = [f"double.{i}" for i in range(cfg.num_layers)] + [f"single.{i}" for i in range(cfg.num_single_layers)]
    return [f"ref_{kv}.{blk}" for blk in blocks for kv in ("k", "v")]


def reference_kv_unused(cfg: Flux2TransformerConfig) -> tuple[str, ...]:
    """Regexes of transformer tensors `build_reference_kv` does not read: the text stream, the output
    layers, and the last single block's output projection (only its keys/values are needed)."""
    last = cfg.num_single_layers - 1
    return (
        r"context_embedder\..*", r"double_stream_modulation_txt\..*", r"norm_out\..*", r"proj_out\..*",
        r"time_guidance_embed\.guidance_embedder\..*",
        r"transformer_blocks\.\d+\.attn\.(add_[qkv]_proj|norm_added_[qk]|to_add_out)\..*",
        r"transformer_blocks\.\d+\.ff_context\..*", rf"single_transformer_blocks\.{last}\.attn\.to_out\..*",
    )  # fmt: skip


# -- program -------------------------------------------------------------------------------------


def build_transformer(
    cfg: Flux2TransformerConfig,
    *,
    batch: int,
    n_img: int,
    n_txt: int,
    dtype: DType | str = "f32",
    n_ref_cached: int = 0,
) -> Program:
    """One denoiser forward of Flux2Transformer2DModel.

    With `n_ref_cached` > 0 the attention of every block also sees that many reference tokens through
    their cached keys/values (inputs `ref_k.BLOCK` / `ref_v.BLOCK` (1, n_ref_cached, heads, head_dim),
    post-norm, post-RoPE, from `build_reference_kv`; `reference_kv_names`), placed between the text and
    image keys as diffusers' Flux2KleinKVPipeline does after its first step.

    Inputs:
      latents        (B, n_img, in_channels)  packed noisy latents (incl. any reference-image tokens)
      text_features  (B, n_txt, joint_attention_dim)  Qwen3 taps, pad rows included, no mask
      timestep_proj  (B, timestep_guidance_channels)  `flux2_timestep_proj(t)` (host sinusoid)
      guidance_proj  (B, timestep_guidance_channels)  only when cfg.guidance_embeds
      rope_cos, rope_sin  (n_txt + n_img, sum(axes_dims_rope)) float32, `flux2_rope_tables`
    Output (the program's single output; meta["outputs"] names it): velocity (B, n_img, out_channels),
    the model's `eps - x0` prediction.
    All parameters and activations are `dtype`; the RoPE tables stay float32 (the reference
    rotates in fp32).
    """
    dt = DType(dtype)
    d = cfg.inner_dim
    s_total = n_txt + n_img
    b = ProgramBuilder("flux2_transformer")
    b.meta.update({"family": "flux2", "component": "transformer", "dtype": dt.value})

    x = b.input("latents", (batch, n_img, cfg.in_channels), dt)
    ctx = b.input("text_features", (batch, n_txt, cfg.joint_attention_dim), dt)
    t_proj = b.input("timestep_proj", (batch, cfg.timestep_guidance_channels), dt)
    g_proj = b.input("guidance_proj", (batch, cfg.timestep_guidance_channels), dt) if cfg.guidance_embeds else None
    rope_w = sum(cfg.axes_dims_rope)
    cos = b.input("rope_cos", (s_total, rope_w), DType.F32)
    sin = b.input("rope_sin", (s_total, rope_w), DType.F32)
    heads, hd = cfg.num_attention_heads, cfg.attention_head_dim
    cached = [b.input(n, (1, n_ref_cached, heads, hd), dt) for n in reference_kv_names(cfg)] if n_ref_cached else []
    if batch > 1:  # the same references for every image: one copy in, repeated on the device
        cached = [b.emit("broadcast_to", c, shape=(batch, n_ref_cached, heads, hd)) for c in cached]
    kv = iter(zip(cached[0::2], cached[1::2], strict=True)) if cached else None

    with b.scope(module=MODULE, block="time_guidance_embed", section="time"):
        temb = timestep_mlp(b, t_proj, "time_guidance_embed.timestep_embedder", d, bias=False)
        if g_proj is not None:
            gemb = timestep_mlp(b, g_proj, "time_guidance_embed.guidance_embedder", d, bias=False)
            temb = b.emit("add", temb, gemb)
        temb_act = b.emit("silu", temb)
    with b.scope(module=MODULE, block="modulation", section="adaln"):
        mod_img = modulation_chunks(b, temb_act, "double_stream_modulation_img.linear", 6)
        mod_txt = modulation_chunks(b, temb_act, "double_stream_modulation_txt.linear", 6)
        mod_single = modulation_chunks(b, temb_act, "single_stream_modulation.linear", 3)
    with b.scope(module=MODULE, block="embedders", section="in"):
        x = linear(b, x, "x_embedder", d)
        ctx = linear(b, ctx, "context_embedder", d)

    for i in range(cfg.num_layers):
        ref = next(kv) if kv is not None else None
        x, ctx = _double_block(b, cfg, f"transformer_blocks.{i}", x, ctx, mod_img, mod_txt, cos, sin, ref)
    with b.scope(module=MODULE, block="single_stream_input", section="concat"):  # the forward joins the streams
        h = b.emit("concat", ctx, x, axis=1)
    for i in range(cfg.num_single_layers):
        ref = next(kv) if kv is not None else None
        h = _single_block(b, cfg, f"single_transformer_blocks.{i}", h, mod_single, cos, sin, n_txt, ref)

    with b.scope(module=MODULE, block="norm_out", section="out"):
        x = b.emit("slice", h, axis=1, start=n_txt, stop=s_total)
        emb = linear(b, temb_act, "norm_out.linear", 2 * d)
        scale, shift = (b.emit("reshape", p, shape=(batch, 1, d)) for p in split(b, emb, [d, d]))
        x = modulated_layer_norm(b, x, shift, scale, eps=cfg.eps)
        out = linear(b, x, "proj_out", cfg.out_dim)
    b.output(out)
    b.meta["outputs"] = "velocity"
    return b.build()


def _double_block(
    b: ProgramBuilder,
    cfg: Flux2TransformerConfig,
    name: str,
    x: Var,
    ctx: Var,
    mod_img: Sequence[Var],
    mod_txt: Sequence[Var],
    cos: Var,
    sin: Var,
    ref: tuple[Var, Var] | None = None,
) -> tuple[Var, Var]:
    """Double-stream block: image stream x (B,N,D) and text stream ctx (B,L,D) attend jointly
    (text first); each stream has its own projections, norms, FFN and shift/scale/gate sets. `ref`:
    cached reference (k, v) joining the keys between text and image."""
    shift, scale, gate, shift2, scale2, gate2 = mod_img
    c_shift, c_scale, c_gate, c_shift2, c_scale2, c_gate2 = mod_txt
    heads, hd, eps = cfg.num_attention_heads, cfg.attention_head_dim, cfg.eps
    n_txt = ctx.shape[1]
    attn = f"{name}.attn"
    with b.scope(module=MODULE, block=name, section="attn"):
        nx = modulated_layer_norm(b, x, shift, scale, eps=eps)
        nc = modulated_layer_norm(b, ctx, c_shift, c_scale, eps=eps)
        q, k, v = qkv_heads(
            b,
            nx,
            (f"{attn}.to_q", f"{attn}.to_k", f"{attn}.to_v"),
            heads=heads,
            kv_heads=heads,
            head_dim=hd,
            norm_names=(f"{attn}.norm_q", f"{attn}.norm_k"),
            eps=eps,
        )
        qc, kc, vc = qkv_heads(
            b,
            nc,
            (f"{attn}.add_q_proj", f"{attn}.add_k_proj", f"{attn}.add_v_proj"),
            heads=heads,
            kv_heads=heads,
            head_dim=hd,
            norm_names=(f"{attn}.norm_added_q", f"{attn}.norm_added_k"),
            eps=eps,
        )
        q_all = apply_rope(b, b.emit("concat", qc, q, axis=1), cos, sin, mode="pairs")
        k_all = apply_rope(b, b.emit("concat", kc, k, axis=1), cos, sin, mode="pairs")
        v_all = b.emit("concat", vc, v, axis=1)
        if ref is not None:
            k_all, v_all = _with_cached(b, k_all, v_all, ref, n_txt)
        o = attention(b, q_all, k_all, v_all)
        oc, ox = split_tokens(b, o, [n_txt, o.shape[1] - n_txt])
        x = gated_residual(b, x, gate, linear(b, ox, f"{attn}.to_out.0", x.shape[-1]))
        ctx = gated_residual(b, ctx, c_gate, linear(b, oc, f"{attn}.to_add_out", ctx.shape[-1]))
    with b.scope(module=MODULE, block=name, section="ff"):
        y = glu_ffn_fused(
            b,
            modulated_layer_norm(b, x, shift2, scale2, eps=eps),
            f"{name}.ff.linear_in",
            f"{name}.ff.linear_out",
            cfg.mlp_hidden,
        )
        x = gated_residual(b, x, gate2, y)
    with b.scope(module=MODULE, block=name, section="ff_context"):
        y = glu_ffn_fused(
            b,
            modulated_layer_norm(b, ctx, c_shift2, c_scale2, eps=eps),
            f"{name}.ff_context.linear_in",
            f"{name}.ff_context.linear_out",
            cfg.mlp_hidden,
        )
        ctx = gated_residual(b, ctx, c_gate2, y)
        if ctx.dtype == DType.F16:  # the reference guards the text stream against fp16 overflow
            ctx = b.emit("clamp", ctx, lo=-_FP16_MAX, hi=_FP16_MAX)
    return x, ctx


def _with_cached(b: ProgramBuilder, k: Var, v: Var, ref: tuple[Var, Var], n_txt: int) -> tuple[Var, Var]:
    """Keys/values [text | image] -> [text | cached reference | image] along the sequence."""
    out = []
    for t, cached in ((k, ref[0]), (v, ref[1])):
        txt, img = split_tokens(b, t, [n_txt, t.shape[1] - n_txt])
        out.append(b.emit("concat", txt, cached, img, axis=1))
    return out[0], out[1]


def _single_block(
    b: ProgramBuilder,
    cfg: Flux2TransformerConfig,
    name: str,
    h: Var,
    mod: Sequence[Var],
    cos: Var,
    sin: Var,
    n_txt: int = 0,
    ref: tuple[Var, Var] | None = None,
) -> Var:
    """Parallel single-stream block: one fused projection feeds attention (q,k,v) and the SwiGLU
    MLP (gate, up); one fused output projection maps [attn | mlp] back to D. `ref`: cached reference
    (k, v) joining the keys after the first `n_txt` (text) tokens."""
    shift, scale, gate = mod
    d, hd, eps, f = cfg.inner_dim, cfg.attention_head_dim, cfg.eps, cfg.mlp_hidden
    attn = f"{name}.attn"
    with b.scope(module=MODULE, block=name, section="attn_mlp"):
        n = modulated_layer_norm(b, h, shift, scale, eps=eps)
        proj = linear(b, n, f"{attn}.to_qkv_mlp_proj", 3 * d + 2 * f)
        q, k, v, mlp = split(b, proj, [d, d, d, 2 * f])
        q = head_rms_norm(b, split_heads(b, q, hd), f"{attn}.norm_q", eps=eps)
        k = head_rms_norm(b, split_heads(b, k, hd), f"{attn}.norm_k", eps=eps)
        q = apply_rope(b, q, cos, sin, mode="pairs")
        k = apply_rope(b, k, cos, sin, mode="pairs")
        v = split_heads(b, v, hd)
        if ref is not None:
            k, v = _with_cached(b, k, v, ref, n_txt)
        o = attention(b, q, k, v)
        mlp = b.emit("glu", mlp, act="silu", gated_half="first")
        y = linear(b, b.emit("concat", o, mlp, axis=-1), f"{attn}.to_out", d)
        h = gated_residual(b, h, gate, y)
        if h.dtype == DType.F16:
            h = b.emit("clamp", h, lo=-_FP16_MAX, hi=_FP16_MAX)
    return h


def build_reference_kv(cfg: Flux2TransformerConfig, *, n_ref: int, dtype: DType | str = "f32") -> Program:
    """The reference tokens' keys and values in every block, as Flux2KleinKVPipeline computes them at its
    first step: the reference stream alone (its tokens attend only to each other), modulated with the
    fixed timestep 0, so the result holds for every step (and every image of a batch).

    Inputs: ref_latents (1, n_ref, in_channels) packed reference latents; timestep_proj (1, channels),
    `flux2_timestep_proj([0.0])`; rope_cos, rope_sin (n_ref, sum(axes_dims_rope)) float32,
    `flux2_reference_rope_tables`. Outputs, in `reference_kv_names` order: k and v (1, n_ref, heads,
    head_dim) of each double block, then of each single block (after the q/k norm and RoPE)."""
    dt = DType(dtype)
    d, heads, hd, eps, f = cfg.inner_dim, cfg.num_attention_heads, cfg.attention_head_dim, cfg.eps, cfg.mlp_hidden
    b = ProgramBuilder("flux2_reference_kv")
    b.meta.update({"family": "flux2", "component": "transformer", "dtype": dt.value})
    x = b.input("ref_latents", (1, n_ref, cfg.in_channels), dt)
    t_proj = b.input("timestep_proj", (1, cfg.timestep_guidance_channels), dt)
    rope_w = sum(cfg.axes_dims_rope)
    cos = b.input("rope_cos", (n_ref, rope_w), DType.F32)
    sin = b.input("rope_sin", (n_ref, rope_w), DType.F32)
    with b.scope(module=MODULE, block="time_guidance_embed", section="time"):
        temb_act = b.emit("silu", timestep_mlp(b, t_proj, "time_guidance_embed.timestep_embedder", d, bias=False))
    with b.scope(module=MODULE, block="modulation", section="adaln"):
        mod_img = modulation_chunks(b, temb_act, "double_stream_modulation_img.linear", 6)
        mod_single = modulation_chunks(b, temb_act, "single_stream_modulation.linear", 3)
    with b.scope(module=MODULE, block="embedders", section="in"):
        x = linear(b, x, "x_embedder", d)
    outputs: list[Var] = []
    for i in range(cfg.num_layers):
        name = f"transformer_blocks.{i}"
        attn = f"{name}.attn"
        shift, scale, gate, shift2, scale2, gate2 = mod_img
        with b.scope(module=MODULE, block=name, section="attn"):
            nx = modulated_layer_norm(b, x, shift, scale, eps=eps)
            q, k, v = qkv_heads(
                b, nx, (f"{attn}.to_q", f"{attn}.to_k", f"{attn}.to_v"), heads=heads, kv_heads=heads, head_dim=hd,
                norm_names=(f"{attn}.norm_q", f"{attn}.norm_k"), eps=eps,
            )  # fmt: skip
            q, k = (apply_rope(b, t, cos, sin, mode="pairs") for t in (q, k))
            outputs += [k, v]
            x = gated_residual(b, x, gate, linear(b, attention(b, q, k, v), f"{attn}.to_out.0", d))
        with b.scope(module=MODULE, block=name, section="ff"):
            y = glu_ffn_fused(
                b, modulated_layer_norm(b, x, shift2, scale2, eps=eps), f"{name}.ff.linear_in",
                f"{name}.ff.linear_out", f,
            )  # fmt: skip
            x = gated_residual(b, x, gate2, y)
    h = x
    for i in range(cfg.num_single_layers):
        name = f"single_transformer_blocks.{i}"
        attn = f"{name}.attn"
        shift, scale, gate = mod_single
        with b.scope(module=MODULE, block=name, section="attn_mlp"):
            n = modulated_layer_norm(b, h, shift, scale, eps=eps)
            q, k, v, mlp = split(b, linear(b, n, f"{attn}.to_qkv_mlp_proj", 3 * d + 2 * f), [d, d, d, 2 * f])
            q = apply_rope(
                b, head_rms_norm(b, split_heads(b, q, hd), f"{attn}.norm_q", eps=eps), cos, sin, mode="pairs"
            )
            k = apply_rope(
                b, head_rms_norm(b, split_heads(b, k, hd), f"{attn}.norm_k", eps=eps), cos, sin, mode="pairs"
            )
            v = split_heads(b, v, hd)
            outputs += [k, v]
            if i == cfg.num_single_layers - 1:
                break  # the last block's keys/values are all that is needed
            mlp = b.emit("glu", mlp, act="silu", gated_half="first")
            y = linear(b, b.emit("concat", attention(b, q, k, v), mlp, axis=-1), f"{attn}.to_out", d)
            h = gated_residual(b, h, gate, y)
            if h.dtype == DType.F16:
                h = b.emit("clamp", h, lo=-_FP16_MAX, hi=_FP16_MAX)
    b.output(*outputs)
    b.meta["outputs"] = ",".join(reference_kv_names(cfg))
    return b.build()

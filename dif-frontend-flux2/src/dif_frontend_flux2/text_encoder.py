"""Qwen3 text encoder of FLUX.2 [klein] as a DiffIR program (decoder stack truncated to the taps).

Frontend stage: token ids + mask (from the tokenizer) -> `build_text_encoder` program -> per-token
features [h_9 | h_18 | h_27] that the denoiser consumes. Parameter names are the transformers
Qwen3ForCausalLM state-dict names (`model.layers.3.self_attn.q_proj.weight` ...).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.dtypes import DType
from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers import apply_rope, attention, embedding, glu_ffn_split, linear, qkv_heads, rms_norm
from dif.layers.tables import rope_half_tables
from dif_frontend_flux2.config import Qwen3Config

MODULE = "text_encoder"
KLEIN_TAPS = (9, 18, 27)


def qwen3_rope_tables(cfg: Qwen3Config, seq_len: int, *, dtype: DType | str = "f32") -> tuple[np.ndarray, np.ndarray]:
    """`rope_cos`/`rope_sin` inputs (seq_len, head_dim) for positions 0..seq_len-1 (pads included),
    computed in fp32 and rounded to `dtype` as the reference does before applying them."""
    cos, sin = rope_half_tables(np.arange(seq_len), cfg.head_dim, cfg.rope_theta)
    store = DType(dtype).np
    return cos.astype(store), sin.astype(store)


def build_text_encoder(
    cfg: Qwen3Config,
    *,
    batch: int,
    seq_len: int = 512,
    taps: Sequence[int] = KLEIN_TAPS,
    dtype: DType | str = "f32",
) -> Program:
    """Qwen3 decoder layers 0..max(taps)-1 and the stacked hidden states at `taps`.

    Tap k is `hidden_states[k]` of transformers: the output of layer k-1 (k=0: the embeddings),
    before any final norm. Layers past max(taps) are not built (their weights are not params).
    Inputs:
      input_ids       (B, L) i64
      attention_mask  (B, L) bool, True for real tokens; attention is causal AND key-valid
      rope_cos, rope_sin  (L, head_dim) in `dtype`, from `qwen3_rope_tables` (positions 0..L-1)
    Output (meta["outputs"] = "features"): (B, L, len(taps) * hidden_size), channel blocks in tap
    order; pad rows are computed like every other row.
    """
    taps = tuple(taps)
    if not taps or any(t < 0 or t > cfg.num_hidden_layers for t in taps):
        raise DifError(f"text encoder taps {taps} must lie in 0..{cfg.num_hidden_layers}")
    dt = DType(dtype)
    n_layers = max(taps)
    b = ProgramBuilder("qwen3_text_encoder")
    b.meta.update({"family": "flux2", "component": "text_encoder", "dtype": dt.value, "taps": ",".join(map(str, taps))})
    ids = b.input("input_ids", (batch, seq_len), DType.I64)
    mask = b.input("attention_mask", (batch, seq_len), DType.BOOL)
    cos = b.input("rope_cos", (seq_len, cfg.head_dim), dt)
    sin = b.input("rope_sin", (seq_len, cfg.head_dim), dt)

    with b.scope(module=MODULE, block="model.embed_tokens", section="embed"):
        h = embedding(b, ids, "model.embed_tokens", cfg.vocab_size, cfg.hidden_size, dt)
    hidden = [h]
    for i in range(n_layers):
        h = _decoder_layer(b, cfg, f"model.layers.{i}", h, mask, cos, sin)
        hidden.append(h)
    with b.scope(module=MODULE, block="taps", section="stack"):
        picked = [hidden[t] for t in taps]
        out = picked[0] if len(picked) == 1 else b.emit("concat", *picked, axis=-1)
    b.output(out)
    b.meta["outputs"] = "features"
    return b.build()


def _decoder_layer(b: ProgramBuilder, cfg: Qwen3Config, name: str, h: Var, mask: Var, cos: Var, sin: Var) -> Var:
    """Pre-norm decoder layer: GQA self-attention with per-head q/k RMS norm and half RoPE, then a
    split-weight SwiGLU MLP. Qwen's RMS norm rounds to the activation dtype before the weight."""
    eps = cfg.rms_norm_eps
    attn = f"{name}.self_attn"
    with b.scope(module=MODULE, block=name, section="self_attn"):
        a = rms_norm(b, h, f"{name}.input_layernorm", eps=eps, round_before_weight=True)
        q, k, v = qkv_heads(
            b,
            a,
            (f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"),
            heads=cfg.num_attention_heads,
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            norm_names=(f"{attn}.q_norm", f"{attn}.k_norm"),
            eps=eps,
            round_before_weight=True,
            bias=cfg.attention_bias,
        )
        q = apply_rope(b, q, cos, sin, mode="half")
        k = apply_rope(b, k, cos, sin, mode="half")
        o = attention(b, q, k, v, key_mask=mask, causal=True)
        h = b.emit("add", h, linear(b, o, f"{attn}.o_proj", cfg.hidden_size, bias=cfg.attention_bias))
    with b.scope(module=MODULE, block=name, section="mlp"):
        m = rms_norm(b, h, f"{name}.post_attention_layernorm", eps=eps, round_before_weight=True)
        y = glu_ffn_split(
            b, m, f"{name}.mlp.gate_proj", f"{name}.mlp.up_proj", f"{name}.mlp.down_proj", cfg.intermediate_size
        )
        h = b.emit("add", h, y)
    return h

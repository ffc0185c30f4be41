"""Decoder-only language-model layers (the Llama / Qwen weight layout) as DiffIR compositions.

Text encoders of diffusion models are often the hidden states of such a decoder. The layer here
is the pre-norm form shared by that family: RMS norm -> GQA self-attention (optional per-head q/k
RMS norm, rotary embedding, causal + key-padding mask) -> residual, then RMS norm -> split-weight
gated MLP -> residual. Weight names are relative to `name` and follow the Hugging Face layout:
`input_layernorm`, `self_attn.{q,k,v,o}_proj`, `self_attn.{q,k}_norm`, `post_attention_layernorm`,
`mlp.{gate,up,down}_proj`.
"""

from __future__ import annotations

from attrs import frozen

from dif.ir.builder import ProgramBuilder, Var
from dif.layers.attention import apply_rope, attention, qkv_heads
from dif.layers.basic import linear, rms_norm
from dif.layers.ffn import glu_ffn_split


@frozen
class DecoderLayerSpec:
    """Sizes and numerics of one decoder layer.

    round_before_weight: the RMS norms round the normalized value to the activation dtype before
    the weight multiply (Qwen's order; torch.nn.RMSNorm multiplies in fp32 instead).
    """

    hidden_size: int
    intermediate_size: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float = 1e-6
    qk_norm: bool = True
    attention_bias: bool = False
    rope_mode: str = "half"
    act: str = "silu"
    round_before_weight: bool = True


def decoder_layer(
    b: ProgramBuilder,
    spec: DecoderLayerSpec,
    name: str,
    h: Var,
    *,
    key_mask: Var | None,
    cos: Var | None,
    sin: Var | None,
    causal: bool = True,
) -> Var:
    """One pre-norm decoder layer on h [B, S, hidden]; returns [B, S, hidden].

    key_mask [B, S] bool (True = real token) is combined with the causal mask; cos/sin [S, R]
    rotate q and k (`spec.rope_mode`), or nothing when they are None. Provenance: block `name`,
    sections `self_attn` and `mlp`."""
    attn = f"{name}.self_attn"
    rbw = spec.round_before_weight
    with b.scope(block=name, section="self_attn"):
        a = rms_norm(b, h, f"{name}.input_layernorm", eps=spec.eps, round_before_weight=rbw)
        q, k, v = qkv_heads(
            b,
            a,
            (f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"),
            heads=spec.heads,
            kv_heads=spec.kv_heads,
            head_dim=spec.head_dim,
            norm_names=(f"{attn}.q_norm", f"{attn}.k_norm") if spec.qk_norm else None,
            eps=spec.eps,
            round_before_weight=rbw,
            bias=spec.attention_bias,
        )
        q = apply_rope(b, q, cos, sin, mode=spec.rope_mode)
        k = apply_rope(b, k, cos, sin, mode=spec.rope_mode)
        o = attention(b, q, k, v, key_mask=key_mask, causal=causal)
        h = b.emit("add", h, linear(b, o, f"{attn}.o_proj", spec.hidden_size, bias=spec.attention_bias))
    with b.scope(block=name, section="mlp"):
        m = rms_norm(b, h, f"{name}.post_attention_layernorm", eps=spec.eps, round_before_weight=rbw)
        y = glu_ffn_split(
            b,
            m,
            f"{name}.mlp.gate_proj",
            f"{name}.mlp.up_proj",
            f"{name}.mlp.down_proj",
            spec.intermediate_size,
            act=spec.act,
        )
        h = b.emit("add", h, y)
    return h

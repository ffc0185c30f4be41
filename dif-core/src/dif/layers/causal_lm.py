"""Decoder-only language-model layers (the Llama / Qwen weight layout) as DiffIR compositions.

Text encoders of diffusion models are often the hidden states of such a decoder. The layer here
is the pre-norm form shared by that family: RMS norm -> GQA self-attention (optional per-head q/k
RMS norm, rotary embedding, causal + key-padding mask) -> residual, then RMS norm -> split-weight
gated MLP -> residual. Weight names are relative to `name` and follow the Hugging Face layout:
`input_layernorm`, `self_attn.{q,k,v,o}_proj`, `self_attn.{q,k}_norm`, `post_attention_layernorm`,
`mlp.{gate,up,down}_proj`. `tapped_hidden_states` builds the stack up to the deepest hidden state a
diffusion model reads ("taps"), numbered as transformers' `output_hidden_states` numbers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
from attrs import frozen

from dif.dtypes import DType
from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var
from dif.layers.attention import apply_rope, attention, qkv_heads
from dif.layers.basic import embedding, linear, rms_norm
from dif.layers.ffn import glu_ffn_split
from dif.layers.tables import rope_half_tables


class DecoderConfig(Protocol):
    """The fields of a Hugging Face Llama / Qwen text config that size the decoder stack."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def rms_norm_eps(self) -> float: ...
    @property
    def rope_theta(self) -> float: ...
    @property
    def attention_bias(self) -> bool: ...


@frozen
class BaseDecoderConfig:
    """The `DecoderConfig` fields as a frozen attrs class, for a frontend's text-encoder config to
    extend (it parses and validates its own config.json and sets its model's defaults)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    attention_bias: bool = False


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

    @classmethod
    def qwen3(cls, cfg: DecoderConfig) -> DecoderLayerSpec:
        """The Qwen3 layer (also the Qwen3-VL text layer): GQA with per-head q/k RMS norm, half-split
        RoPE, SwiGLU MLP, RMS norms that round to the activation dtype before the weight multiply."""
        return cls(
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            heads=cfg.num_attention_heads,
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            eps=cfg.rms_norm_eps,
            qk_norm=True,
            attention_bias=cfg.attention_bias,
            rope_mode="half",
            act="silu",
            round_before_weight=True,
        )


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


def decoder_rope_tables(
    cfg: DecoderConfig, positions: Sequence[int] | np.ndarray, *, dtype: DType | str = "f32"
) -> tuple[np.ndarray, np.ndarray]:
    """`rope_cos` / `rope_sin` inputs (S, head_dim) for per-token `positions` (S,): half-split tables
    computed in fp32 and rounded to `dtype`, as the reference does before rotating."""
    cos, sin = rope_half_tables(np.asarray(positions), cfg.head_dim, cfg.rope_theta)
    store = DType(dtype).np
    return cos.astype(store), sin.astype(store)


def tapped_hidden_states(
    b: ProgramBuilder,
    cfg: DecoderConfig,
    spec: DecoderLayerSpec,
    prefix: str,
    ids: Var,
    taps: Sequence[int],
    *,
    key_mask: Var | None,
    cos: Var | None,
    sin: Var | None,
    dtype: DType | str,
) -> list[Var]:
    """Hidden states [B, S, hidden] at `taps` of the decoder whose weights live under `prefix`.

    Tap k is transformers' `hidden_states[k]`: the token embeddings for k = 0, the output of layer
    k-1 for 0 < k < num_hidden_layers, and the final-normed output of the last layer (`{prefix}.norm`)
    for k = num_hidden_layers. Only layers 0..max(taps)-1 are built, so later layers (and the final
    norm, unless tapped) are not parameters. ids [B, S] int; key_mask / cos / sin as `decoder_layer`.
    Provenance: block `{prefix}.embed_tokens` (section embed), `{prefix}.layers.i`, `{prefix}.norm`.
    """
    n_total = cfg.num_hidden_layers
    taps = tuple(int(t) for t in taps)
    if not taps or min(taps) < 0 or max(taps) > n_total:
        raise DifError(f"text encoder taps {taps} must lie in 0..{n_total}")
    with b.scope(block=f"{prefix}.embed_tokens", section="embed"):
        h = embedding(b, ids, f"{prefix}.embed_tokens", cfg.vocab_size, cfg.hidden_size, DType(dtype))
    hidden = [h]
    for i in range(max(taps)):
        h = decoder_layer(b, spec, f"{prefix}.layers.{i}", h, key_mask=key_mask, cos=cos, sin=sin)
        hidden.append(h)
    if max(taps) == n_total:  # the last hidden state transformers reports is the normed one
        with b.scope(block=f"{prefix}.norm", section="final_norm"):
            hidden[n_total] = rms_norm(
                b, h, f"{prefix}.norm", eps=spec.eps, round_before_weight=spec.round_before_weight
            )
    return [hidden[t] for t in taps]


def tapped_text_encoder(
    b: ProgramBuilder,
    cfg: DecoderConfig,
    spec: DecoderLayerSpec,
    prefix: str,
    taps: Sequence[int],
    *,
    batch: int,
    seq_len: int,
    dtype: DType,
    family: str,
    module: str = "text_encoder",
) -> list[Var]:
    """The inputs and the decoder stack of a text-encoder program that reads `tapped_hidden_states`
    (one [B, L, hidden] per tap; the caller arranges and outputs them). Declares
      input_ids       (B, L) i64
      attention_mask  (B, L) bool, True on real tokens; attention is causal AND key-valid
      rope_cos, rope_sin  (L, head_dim) in `dtype`, from `decoder_rope_tables`
    records meta family / component / dtype / taps, and builds the stack in scope module=`module`."""
    taps = tuple(int(t) for t in taps)
    meta = {"family": family, "component": module, "dtype": dtype.value, "taps": ",".join(map(str, taps))}
    b.meta.update(meta)
    ids = b.input("input_ids", (batch, seq_len), DType.I64)
    mask = b.input("attention_mask", (batch, seq_len), DType.BOOL)
    cos = b.input("rope_cos", (seq_len, cfg.head_dim), dtype)
    sin = b.input("rope_sin", (seq_len, cfg.head_dim), dtype)
    with b.scope(module=module):
        return tapped_hidden_states(b, cfg, spec, prefix, ids, taps, key_mask=mask, cos=cos, sin=sin, dtype=dtype)

"""Krea 2 text encoder: the Qwen3-VL text stack as a DiffIR program, truncated to the tapped layers.

Frontend stage 1. Token ids in the Krea 2 layout (`tokenize.py`) -> decoder layers -> the hidden
states at the 12 taps, stacked per token -> the prefix rows dropped. Parameter names are the
transformers Qwen3VLModel state-dict names (`language_model.layers.3.self_attn.q_proj.weight` ...).
Only text is encoded, so the three mRoPE axes carry the same position and the interleaved mRoPE
is plain half-split RoPE with the `positions` the tokenizer computed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.dtypes import DType
from dif.errors import DifError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.layers.causal_lm import DecoderLayerSpec, decoder_rope_tables, tapped_text_encoder
from dif_frontend_krea2 import __version__
from dif_frontend_krea2.config import DEFAULT_TAPS, QwenVLTextConfig

REVISION = f"dif-frontend-krea2 {__version__}"
MODULE = "text_encoder"
PREFIX = "language_model"


def text_rope_tables(
    cfg: QwenVLTextConfig, positions: Sequence[int] | np.ndarray, *, dtype: DType | str = "f32"
) -> tuple[np.ndarray, np.ndarray]:
    """`rope_cos` / `rope_sin` inputs (S, head_dim) for per-token `positions` (S,), computed in fp32
    and rounded to `dtype`, as the reference does before rotating."""
    return decoder_rope_tables(cfg, positions, dtype=dtype)


def build_text_encoder(
    cfg: QwenVLTextConfig,
    *,
    seq_len: int,
    taps: Sequence[int] = DEFAULT_TAPS,
    drop_prefix: int = 0,
    batch: int = 1,
    dtype: DType | str = "f32",
) -> Program:
    """Decoder layers up to the deepest tap; output the taps stacked on a new axis.

    Tap k is transformers' `hidden_states[k]`: the embeddings for k = 0, the output of layer k-1
    for 0 < k < num_layers, and the final-normed output of the last layer for k = num_layers.
    Inputs:
      input_ids       (B, S) i64
      attention_mask  (B, S) bool, True on real tokens (attention: causal AND key valid)
      rope_cos, rope_sin  (S, head_dim) in `dtype`, from `text_rope_tables(positions)`; all rows of
                      the batch share them, so batch rows must have the same positions (batch 1 is
                      the usual case: Krea 2 prompts differ in length)
    Output (meta["outputs"] = "text_hidden_states"): (B, S - drop_prefix, len(taps), hidden_size).
    """
    if not 0 <= drop_prefix < seq_len:
        raise DifError(f"cannot drop {drop_prefix} prefix rows of a {seq_len}-token sequence")
    b = ProgramBuilder("krea2_text_encoder", frontend_revision=REVISION)
    spec = DecoderLayerSpec.qwen3(cfg)
    hidden = tapped_text_encoder(
        b, cfg, spec, PREFIX, taps, batch=batch, seq_len=seq_len, dtype=DType(dtype), family="krea2", module=MODULE
    )
    with b.scope(module=MODULE, block="taps", section="stack"):
        rows = [b.emit("reshape", h, shape=(batch, seq_len, 1, cfg.hidden_size)) for h in hidden]
        out = rows[0] if len(rows) == 1 else b.emit("concat", *rows, axis=2)
        if drop_prefix:
            out = b.emit("slice", out, axis=1, start=drop_prefix, stop=seq_len)
    b.output(out)
    b.meta["outputs"] = "text_hidden_states"
    return b.build()

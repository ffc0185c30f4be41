"""Qwen3 text encoder of FLUX.2 [klein] as a DiffIR program (decoder stack truncated to the taps).

Frontend stage: token ids + mask (from the tokenizer) -> `build_text_encoder` program -> per-token
features [h_9 | h_18 | h_27] that the denoiser consumes. Parameter names are the transformers
Qwen3ForCausalLM state-dict names (`model.layers.3.self_attn.q_proj.weight` ...).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.layers.causal_lm import DecoderLayerSpec, decoder_rope_tables, tapped_text_encoder
from dif_frontend_flux2.config import Qwen3Config

MODULE = "text_encoder"
PREFIX = "model"
KLEIN_TAPS = (9, 18, 27)


def qwen3_rope_tables(cfg: Qwen3Config, seq_len: int, *, dtype: DType | str = "f32") -> tuple[np.ndarray, np.ndarray]:
    """`rope_cos`/`rope_sin` inputs (seq_len, head_dim) for positions 0..seq_len-1 (pads included),
    computed in fp32 and rounded to `dtype` as the reference does before applying them."""
    return decoder_rope_tables(cfg, np.arange(seq_len), dtype=dtype)


def build_text_encoder(
    cfg: Qwen3Config,
    *,
    batch: int,
    seq_len: int = 512,
    taps: Sequence[int] = KLEIN_TAPS,
    dtype: DType | str = "f32",
) -> Program:
    """Qwen3 decoder layers 0..max(taps)-1 and the stacked hidden states at `taps`.

    Tap k is `hidden_states[k]` of transformers: the embeddings for k = 0, the output of layer k-1
    for 0 < k < num_hidden_layers, and the final-normed output of the last layer (`model.norm`) for
    k = num_hidden_layers. Layers past max(taps) are not built (their weights are not params).
    Inputs:
      input_ids       (B, L) i64
      attention_mask  (B, L) bool, True for real tokens; attention is causal AND key-valid
      rope_cos, rope_sin  (L, head_dim) in `dtype`, from `qwen3_rope_tables` (positions 0..L-1)
    Output (meta["outputs"] = "features"): (B, L, len(taps) * hidden_size), channel blocks in tap
    order; pad rows are computed like every other row.
    """
    b = ProgramBuilder("qwen3_text_encoder")
    spec = DecoderLayerSpec.qwen3(cfg)
    picked = tapped_text_encoder(
        b, cfg, spec, PREFIX, taps, batch=batch, seq_len=seq_len, dtype=DType(dtype), family="flux2", module=MODULE
    )
    with b.scope(module=MODULE, block="taps", section="stack"):
        out = picked[0] if len(picked) == 1 else b.emit("concat", *picked, axis=-1)
    b.output(out)
    b.meta["outputs"] = "features"
    return b.build()

"""MiniMax-H3 text conditioning: prompt -> token ids (no chat template, no special tokens) -> the Qwen3-VL
text stack truncated at the tap -> hidden_states[tap] (50 at full size: the output of layer 49, unnormed).

Frontend stage 1. Parameter names are the transformers Qwen3VLModel text names (`language_model.layers.3
.self_attn.q_proj.weight` ...; `bind_text_encoder` adds `model.` for a Qwen3VLForConditionalGeneration
save). Text only: the three mRoPE axes carry the same position (arange), so interleaved mRoPE is plain
half-split RoPE; batch 1, every key valid (the reference passes a mask of ones).
"""

from __future__ import annotations

import numpy as np

from dif.dtypes import DType
from dif.errors import UsageError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.layers.causal_lm import DecoderLayerSpec, decoder_rope_tables, tapped_text_encoder
from dif.text import TextTokenizer
from dif_frontend_h3 import __version__
from dif_frontend_h3.config import H3TextConfig

REVISION = f"dif-frontend-h3 {__version__}"
PREFIX = "language_model"


def prompt_ids(tokenizer: TextTokenizer, prompt: str) -> np.ndarray:
    """(1, L) int64 ids of the prompt verbatim (`add_special_tokens=False`, no template, no BOS). An empty
    prompt is refused: MiniMax-H3 packs no padding, so the sequence needs at least one text row."""
    ids = tokenizer.encode(prompt)
    if not ids:
        raise UsageError("the prompt is empty: MiniMax-H3 needs at least one text token")
    return np.asarray([ids], dtype=np.int64)


def text_inputs(cfg: H3TextConfig, ids: np.ndarray, *, dtype: DType | str = "f32") -> dict[str, np.ndarray]:
    """The program inputs for ids (1, L): ids, an all-true mask and the rope tables of positions 0..L-1."""
    cos, sin = decoder_rope_tables(cfg, np.arange(ids.shape[1]), dtype=dtype)
    return {"input_ids": ids, "attention_mask": np.ones(ids.shape, dtype=bool), "rope_cos": cos, "rope_sin": sin}


def build_text_encoder(cfg: H3TextConfig, *, seq_len: int, tap: int, dtype: DType | str = "f32") -> Program:
    """Decoder layers 0..tap-1; output (meta["outputs"] = "text_embeds") hidden_states[tap] (1, L, hidden).
    Inputs as `text_inputs`. `tap` must be an inner layer (< num_hidden_layers), as the reference requires."""
    if not 0 < tap < cfg.num_hidden_layers:
        raise UsageError(f"text encoder tap {tap} must lie in 1..{cfg.num_hidden_layers - 1} (an inner layer)")
    b = ProgramBuilder("h3_text_encoder", frontend_revision=REVISION)
    (hidden,) = tapped_text_encoder(
        b, cfg, DecoderLayerSpec.qwen3(cfg), PREFIX, (tap,), batch=1, seq_len=seq_len, dtype=DType(dtype),
        family="h3", module="text_encoder",
    )  # fmt: skip
    b.output(hidden)
    b.meta["outputs"] = "text_embeds"
    return b.build()

"""Krea 2 LoRA: which transformer weight each adapted module names, in every naming LoRA files use.

Frontend stage, at checkpoint open (`weights.open_checkpoint`). The files' conventions (dialects,
alpha, LoKr / LoHa) and the merged / unmerged machinery are `dif.lora`'s; this module holds the
Krea 2 facts only: the diffusers module names (`transformer_blocks.0.attn.to_q`, as diffusers'
`load_lora_weights` and PEFT write them) and the original Krea 2 names the Krea trainer, ComfyUI and
ai-toolkit files use (`blocks.0.attn.wq`, `txtfusion.refiner_blocks.0.mlp.up`, `first`, `last.linear`,
flattened with underscores under kohya's `lora_unet_`). Krea 2 has no fused projections, so each
module feeds exactly one weight. The text encoder (Qwen3-VL's language model) is adapted too: its
decoder linears under the names transformers gives them (`text_encoder_lora_table`), always merged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from dif.lora import (
    DEFAULT_SLOT_RANK,
    LoraApplication,
    LoraComponent,
    LoraSpec,
    Target,
    apply_loras,
    merge_loras,
    text_encoder_table,
)
from dif.weights import TensorSource

FAMILY, MODEL = "krea2", "Krea 2"

_ORIGINAL_ATTN = {"wq": "to_q", "wk": "to_k", "wv": "to_v", "wo": "to_out.0", "gate": "to_gate"}
_ORIGINAL_MLP = {"gate": "ff.gate", "up": "ff.up", "down": "ff.down"}
_ORIGINAL_TOP = {
    "first": "img_in",
    "last.linear": "final_layer.linear",
    "tmlp.0": "time_embed.linear_1",
    "tmlp.2": "time_embed.linear_2",
    "tproj.1": "time_mod_proj",
    "txtmlp.1": "txt_in.linear_1",
    "txtmlp.3": "txt_in.linear_2",
    "txtfusion.projector": "text_fusion.projector",
}


def lora_table(source: TensorSource) -> dict[str, tuple[Target, ...]]:
    """The transformer's adaptable modules under the diffusers names (`transformer_blocks.0.attn.to_q`)
    and the original Krea 2 / ComfyUI / ai-toolkit names (`blocks.0.attn.wq`, `txtfusion.refiner_blocks.0.mlp.up`,
    `first`, `last.linear` ...). Only 2-D weights of `source` are targets."""
    weights = {n for n in source.names() if n.endswith(".weight") and len(source.info(n).shape) == 2}
    table: dict[str, tuple[Target, ...]] = {n[: -len(".weight")]: (Target(n),) for n in weights}
    for module in list(table):
        original = original_name(module)
        if original is not None:
            table[original] = table[module]
    return table


def original_name(module: str) -> str | None:
    """The original Krea 2 name of a diffusers module name (None for a module it does not name)."""
    for original, diffusers in _ORIGINAL_TOP.items():
        if module == diffusers:
            return original
    m = re.fullmatch(r"(transformer_blocks|text_fusion\.(?:layerwise|refiner)_blocks)\.(\d+)\.(.+)", module)
    if m is None:
        return None
    prefix = "blocks" if m[1] == "transformer_blocks" else m[1].replace("text_fusion.", "txtfusion.")
    for original, diffusers in _ORIGINAL_ATTN.items():
        if m[3] == f"attn.{diffusers}":
            return f"{prefix}.{m[2]}.attn.{original}"
    for original, diffusers in _ORIGINAL_MLP.items():
        if m[3] == diffusers:
            return f"{prefix}.{m[2]}.mlp.{original}"
    return None


def merge_transformer_loras(
    transformer: TensorSource, loras: Sequence[LoraSpec | str | Path], *, allow_unmatched: bool = False
) -> TensorSource:
    """The transformer source with `loras` merged into its weights (`dif.lora.merge_loras`)."""
    return merge_loras(
        transformer, loras, lora_table(transformer), family=FAMILY, model=MODEL, allow_unmatched=allow_unmatched
    )


def text_encoder_lora_table(source: TensorSource, prefix: str = "") -> dict[str, tuple[Target, ...]]:
    """The text encoder's decoder linears (`language_model.layers.N.self_attn.q_proj` ... `mlp.down_proj`;
    `prefix` "model." for a Qwen3VLForConditionalGeneration checkpoint) as LoRA files name them: under a
    Qwen3VLModel (`language_model.layers.N...`), a Qwen3VLForConditionalGeneration
    (`model.language_model.layers.N...`) or the bare text model (`layers.N...`); kohya's flattened names
    match through these. The vision tower is not a target: Krea 2 encodes text only."""
    return text_encoder_table(source, f"{prefix}language_model.", ("language_model.", "model.language_model.", ""))


def apply_checkpoint_loras(
    transformer: TensorSource,
    text_encoder: TensorSource,
    text_prefix: str,
    loras: Sequence[LoraSpec | str | Path],
    *,
    mode: str = "auto",
    swappable: bool = False,
    rank: int = DEFAULT_SLOT_RANK,
    allow_unmatched: bool = False,
) -> LoraApplication:
    """`loras` on the transformer, merged or as side GEMMs of slots of `rank` on every linear (text
    fusion, embedders and blocks), as `mode` says or `dif.lora.mode` decides ("auto"); their
    text-encoder adapters merged into `text_encoder` (naming `text_prefix`) in either mode."""
    te = LoraComponent(text_encoder, text_encoder_lora_table(text_encoder, text_prefix))
    return apply_loras(
        transformer, loras, lora_table(transformer), family=FAMILY, model=MODEL, mode=mode, swappable=swappable,
        rank=rank, allow_unmatched=allow_unmatched, text_encoder=te,
    )  # fmt: skip

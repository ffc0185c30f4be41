"""LoRA files, step 2: which model family an adapter was trained for, from its key names alone.

Used when an adapter does not fit the model it is given to: "this LoRA is for FLUX.1" is a better
answer than a list of 300 unmatched keys. The signatures are module names that only that family's
checkpoints have (in any dialect: dots or underscores between the parts). Only families whose LoRAs
users commonly have are listed; an adapter matching none is reported by its unmatched keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_SEP = r"[._]"
FAMILY_SIGNATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "flux1": (
        "FLUX.1",
        (
            rf"double_blocks{_SEP}\d+{_SEP}(img|txt)_mod{_SEP}lin",
            rf"single_blocks{_SEP}\d+{_SEP}modulation{_SEP}lin",
            rf"transformer_blocks{_SEP}\d+{_SEP}norm1(_context)?{_SEP}linear",
            rf"single_transformer_blocks{_SEP}\d+{_SEP}proj_mlp",
        ),
    ),
    "flux2": (
        "FLUX.2",
        (
            r"(double|single)_stream_modulation",
            r"to_qkv_mlp_proj",
            rf"transformer_blocks{_SEP}\d+{_SEP}ff(_context)?{_SEP}linear_(in|out)",
        ),
    ),
    "krea2": (
        "Krea 2",
        (
            rf"txtfusion|text_fusion{_SEP}(layerwise|refiner)_blocks",
            rf"(^|{_SEP})blocks{_SEP}\d+{_SEP}attn{_SEP}w[qkvo]",
        ),
    ),
    "sd": (
        "Stable Diffusion 1.x / 2.x / XL",
        (
            rf"(down|up)_blocks{_SEP}\d+{_SEP}(attentions|resnets)",
            rf"(input|output)_blocks{_SEP}\d+",
            r"lora_te[12]?_text_model_",  # CLIP's module path: other models' text-encoder LoRAs use lora_te_ too
        ),
    ),
    "sd3": ("Stable Diffusion 3", (rf"joint_blocks{_SEP}\d+",)),
    "qwen-image": ("Qwen-Image", (rf"transformer_blocks{_SEP}\d+{_SEP}(img|txt)_mlp{_SEP}net",)),
    "wan": ("Wan", (rf"blocks{_SEP}\d+{_SEP}(self_attn|cross_attn){_SEP}[qkvo]({_SEP}|$)",)),
    "z-image": ("Z-Image", (rf"(noise|context)_refiner{_SEP}\d+", rf"layers{_SEP}\d+{_SEP}attention{_SEP}to_q")),
}


def families_of(keys: Iterable[str]) -> list[str]:
    """The family keys (of `FAMILY_SIGNATURES`) whose signatures some key matches, most hits first."""
    keys = list(keys)
    hits: dict[str, int] = {}
    for family, (_, patterns) in FAMILY_SIGNATURES.items():
        compiled = [re.compile(p) for p in patterns]
        count = sum(1 for k in keys if any(p.search(k) for p in compiled))
        if count:
            hits[family] = count
    return sorted(hits, key=lambda f: -hits[f])


def family_label(family: str) -> str:
    return FAMILY_SIGNATURES[family][0] if family in FAMILY_SIGNATURES else family

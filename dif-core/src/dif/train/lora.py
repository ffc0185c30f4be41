"""LoRA adapters to train: which linears get one (patterns over the model's linear weight names),
their initial factors (PEFT's: A Kaiming-uniform, B zero) and the file diffusers' `load_lora_weights`
reads (diffusers / PEFT key layout, the scale folded into B so no alpha is needed to apply it)."""

from __future__ import annotations

import fnmatch
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from dif.errors import UsageError
from dif.lora.slots import slot_inputs
from dif.serialize.diftensor import save_tensors


def match_targets(linears: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """Module names (linear weight names without `.weight`) matching any pattern: an fnmatch glob
    over the whole name, or, as PEFT's `target_modules`, a name suffix (`to_q` matches `*.to_q`)."""
    names = sorted({n[: -len(".weight")] if n.endswith(".weight") else n for n in linears})
    out = []
    for name in names:
        for p in patterns:
            if fnmatch.fnmatchcase(name, p) or name == p or name.endswith("." + p) or _regex(p, name):
                out.append(name)
                break
    if not out:
        raise UsageError(f"no linear matches the LoRA target modules {list(patterns)}", hint=f"e.g. {names[:4]}")
    return out


def _regex(pattern: str, name: str) -> bool:
    if not pattern.startswith("re:"):
        return False
    return re.fullmatch(pattern[3:], name) is not None


def init_factors(rng: np.random.Generator, shapes: Mapping[str, tuple[int, int]], rank: int) -> dict[str, np.ndarray]:
    """Slot inputs -> f32 arrays for modules of weight shape (out, in): down (A) [rank, in] uniform in
    +-1/sqrt(in) (kaiming_uniform with a=sqrt(5), PEFT's default), up (B) [out, rank] zero."""
    out = {}
    for module, (o, i) in sorted(shapes.items()):
        down, up = slot_inputs(module)
        bound = 1.0 / math.sqrt(i)
        out[down] = rng.uniform(-bound, bound, (rank, i)).astype(np.float32)
        out[up] = np.zeros((o, rank), np.float32)
    return out


def write_diffusers_lora(
    path: str | Path, factors: Mapping[str, np.ndarray], modules: Sequence[str], *, rank: int, alpha: float,
    prefix: str = "transformer",
) -> Path:  # fmt: skip
    """`<prefix>.<module>.lora_A.weight` = A, `.lora_B.weight` = (alpha / rank) B, f32, with PEFT
    adapter metadata (r = lora_alpha = rank: the scale is already in B)."""
    scale = alpha / rank
    tensors = {}
    for module in modules:
        down, up = slot_inputs(module)
        tensors[f"{prefix}.{module}.lora_A.weight"] = np.ascontiguousarray(factors[down], np.float32)
        tensors[f"{prefix}.{module}.lora_B.weight"] = np.ascontiguousarray(factors[up] * np.float32(scale), np.float32)
    # diffusers reads `lora_adapter_metadata` as LoraConfig keywords packed with the component prefix
    config = {f"{prefix}.r": rank, f"{prefix}.lora_alpha": rank, f"{prefix}.target_modules": sorted(modules)}
    meta = {"lora_adapter_metadata": json.dumps(config, sort_keys=True), "format": "pt", "dif.lora_alpha": str(alpha)}
    path = Path(path)
    save_tensors(path, tensors, meta, dif_metadata=False)
    return path

"""Text-encoder LoRA oracles for the frontends' tests: a PEFT LoRA on a transformers text encoder,
and the same deltas written in each dialect `dif.lora.file` reads.

Where it sits: outside the pipeline (tests only). `peft_lora` adapts a copy of a torch model with
random A and nonzero B (a fresh PEFT init has B = 0, so no delta would be checked);
`text_encoder_lora_tensors` writes those factors as a file's tensors. torch and peft are imported
by the caller's objects only: nothing here imports them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

TEXT_ENCODER_DIALECTS = ("diffusers", "diffusers-no-alpha", "kohya", "kohya-te1", "lokr", "loha")
"""The layouts `text_encoder_lora_tensors` writes: diffusers `text_encoder.<mod>.lora_A/B` with the
alpha in `lora_adapter_metadata` (or none: alpha / rank folded into B), kohya `lora_te_` / `lora_te1_`
+ flattened names with `.alpha`, and LyCORIS LoKr / LoHa factors of the same deltas."""

Factors = Mapping[str, tuple[np.ndarray, np.ndarray]]
"""Module name -> (A [rank, in], B [out, rank]) of a PEFT LoRA."""


def peft_lora(
    model: Any, torch: Any, targets: list[str], *, rank: int, alpha: int, seed: int
) -> tuple[Any, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """(a copy of the torch `model` with a PEFT LoRA of `rank` / `alpha` on the linears named `targets`,
    A ~ N(0, 1/in) and B ~ 0.3 N(0, 1/rank) drawn from `seed`; module name -> (A, B) as numpy)."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets)
    adapted = inject_adapter_in_model(config, copy.deepcopy(model)).eval()
    rng = np.random.default_rng(seed)
    factors = {}
    for name, module in adapted.named_modules():
        if "default" not in getattr(module, "lora_A", {}):
            continue
        out, inp = module.base_layer.weight.shape
        a = (rng.standard_normal((rank, inp)) / np.sqrt(inp)).astype(np.float32)
        b = (0.3 * rng.standard_normal((out, rank)) / np.sqrt(rank)).astype(np.float32)
        module.lora_A["default"].weight.copy_(torch.from_numpy(a))
        module.lora_B["default"].weight.copy_(torch.from_numpy(b))
        factors[name] = (a, b)
    return adapted, factors


def text_encoder_lora_tensors(
    factors: Factors,
    dialect: str,
    *,
    alpha: float,
    scale: float = 1.0,
    rename: Callable[[str], str] = lambda module: module,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, safetensors metadata) of `factors` in `dialect` (`TEXT_ENCODER_DIALECTS`), module
    names through `rename`: each adapter's delta is `scale * alpha / rank * B @ A`, with alpha stored
    or folded back into the factors as the dialect does."""
    t: dict[str, np.ndarray] = {}
    metadata: dict[str, str] = {}
    for module, (a, b) in factors.items():
        rank = a.shape[0]
        k = np.float32(scale * alpha / rank)
        name = rename(module)
        flat = ("lora_te1_" if dialect == "kohya-te1" else "lora_te_") + name.replace(".", "_")
        if dialect == "diffusers":  # a pipeline's save: alpha in the metadata, per component
            t[f"text_encoder.{name}.lora_A.weight"], t[f"text_encoder.{name}.lora_B.weight"] = a, b * np.float32(scale)
            metadata["lora_adapter_metadata"] = json.dumps({"text_encoder.r": rank, "text_encoder.lora_alpha": alpha})
        elif dialect == "diffusers-no-alpha":  # no alpha anywhere: scale 1, so alpha / rank is in B
            t[f"text_encoder.{name}.lora_A.weight"], t[f"text_encoder.{name}.lora_B.weight"] = a, b * k
        elif dialect in ("kohya", "kohya-te1"):  # alpha = 2: alpha / rank compensated in lora_up
            t[f"{flat}.lora_down.weight"], t[f"{flat}.lora_up.weight"] = a, b * (k * np.float32(rank / 2))
            t[f"{flat}.alpha"] = np.array(2.0, np.float32)
        elif dialect == "lokr":  # kron([[1]], w2) = w2: two full factors, so no alpha
            t[f"{flat}.lokr_w1"] = np.ones((1, 1), np.float32)
            t[f"{flat}.lokr_w2"] = (b @ a) * k
        elif dialect == "loha":  # (w1a @ w1b) * (w2a @ w2b), the second product all ones, alpha = rank
            t[f"{flat}.hada_w1_a"], t[f"{flat}.hada_w1_b"] = b * k, a
            t[f"{flat}.hada_w2_a"] = np.ones((b.shape[0], 1), np.float32)
            t[f"{flat}.hada_w2_b"] = np.ones((1, a.shape[1]), np.float32)
            t[f"{flat}.alpha"] = np.array(float(rank), np.float32)
        else:
            raise ValueError(f"dialect {dialect!r}: one of {', '.join(TEXT_ENCODER_DIALECTS)}")
    return t, metadata

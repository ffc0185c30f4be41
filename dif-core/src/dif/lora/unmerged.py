"""Unmerged LoRA, step 2: the adapter factors as the inputs of a program built with slots.

Where it sits: between `dif.lora.merge.match_loras` (which adapter feeds which weight, checked) and
running a program built inside `dif.lora.slots.lora_slots`. For each slot weight W [out, in]:

    down = [A_1; A_2; ...; 0]          [rank, in]    the adapters' lora_down, stacked, zero-padded
    up   = [s_1 P(B_1), s_2 P(B_2), ..., 0]   [out, rank]   lora_up, its row piece P of a fused
                                                     projection, times scale * alpha / r
so that (x @ down^T) @ up^T = x @ (sum_i s_i P(B_i) A_i)^T: the merged delta, computed as two thin
GEMMs per step instead of folded into W. Swapping LoRAs or scales is new values for these inputs.
Only LoRA (down / up) adapters are low-rank factors; LoKr and LoHa are refused here (merge them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dif.errors import WeightError
from dif.ir.program import Program
from dif.lora.merge import Patch
from dif.lora.slots import slot_inputs


def _factors(patch: Patch) -> tuple[np.ndarray, np.ndarray]:
    """(down [r, in], up [piece rows, r] with scale and alpha / r folded in) of one patch."""
    lora, adapter = patch.lora, patch.adapter
    if adapter.kind != "lora":
        raise WeightError(
            f"{lora.path}: module '{adapter.module}' is a {adapter.kind} adapter, not low-rank factors: "
            "unmerged (side GEMM) mode takes LoRA adapters only; merge this one"
        )
    down = lora.tensor(adapter, "down")
    up = lora.tensor(adapter, "up")
    down = down.reshape(down.shape[:2]) if down.ndim > 2 else down
    up = up.reshape(up.shape[:2]) if up.ndim > 2 else up
    alpha = lora.alpha(adapter)
    rank = down.shape[0]
    factor = patch.scale * (1.0 if alpha is None else alpha / rank)
    piece = up if patch.transform is None else patch.transform.apply(up)
    return down, piece * np.float32(factor)


def slot_ranks(patches: Mapping[str, Sequence[Patch]], rank: int | None = None) -> dict[str, int]:
    """Weight name -> the slot rank its adapters need (their ranks added); with `rank`, every slot
    is padded to it (`WeightError` when the adapters of one weight need more)."""
    need = {param: sum(_factors(p)[0].shape[0] for p in ps) for param, ps in patches.items()}
    if rank is None:
        return need
    for param, r in need.items():
        if r > rank:
            raise WeightError(f"'{param}': its adapters have rank {r} together, more than the slot rank {rank}")
    return dict.fromkeys(need, rank)


def adapter_inputs(program: Program, patches: Mapping[str, Sequence[Patch]]) -> dict[str, np.ndarray]:
    """The values of every LoRA slot input of `program` (built with `lora_slots`): each weight's
    patches stacked and zero-padded to the slot's rank, zeros for a slot no adapter targets.
    `WeightError` when an adapter does not fit its slot (rank or shape) or targets a weight with no slot."""
    inputs = {v.name: v for v in program.inputs}
    out: dict[str, np.ndarray] = {}
    slots = [n[len("lora.") : -len(".down")] for n in inputs if n.startswith("lora.") and n.endswith(".down")]
    for module in slots:
        down_name, up_name = slot_inputs(module)
        down_t, up_t = inputs[down_name].type, inputs[up_name].type
        rank, width = down_t.shape
        rows = up_t.shape[0]
        down = np.zeros((rank, width), np.float32)
        up = np.zeros((rows, rank), np.float32)
        at = 0
        for patch in patches.get(f"{module}.weight", ()):
            a, b = _factors(patch)
            r = a.shape[0]
            if at + r > rank:
                raise WeightError(
                    f"{patch.label}: rank {r} does not fit the slot of '{module}' (rank {rank}, {at} taken)",
                    hint="build the program with a larger slot rank",
                )
            if a.shape[1] != width or b.shape[0] != rows:
                raise WeightError(f"{patch.label}: factors {list(b.shape)} x {list(a.shape)} do not fit '{module}'")
            down[at : at + r], up[:, at : at + r] = a, b
            at += r
        out[down_name], out[up_name] = down.astype(down_t.dtype.np), up.astype(up_t.dtype.np)
    extra = sorted(set(patches) - {f"{m}.weight" for m in slots})
    if extra:
        raise WeightError(
            f"program '{program.name}' has no LoRA slot for {', '.join(extra[:6])}"
            + (f" and {len(extra) - 6} more" if len(extra) > 6 else ""),
            hint="build it inside lora_slots(...) naming those weights",
        )
    return out

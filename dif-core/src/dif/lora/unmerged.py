"""Unmerged LoRA, step 2: the adapter factors as the inputs of a program built with slots.

Where it sits: between `dif.lora.merge.match_loras` (which adapter feeds which weight, checked) and
running a program built inside `dif.lora.slots.lora_slots`. For each slot weight W [out, in]:

    down = [A_1; A_2; ...; 0]          [rank, in]    the adapters' lora_down, stacked, zero-padded
    up   = [s_1 P(B_1), s_2 P(B_2), ..., 0]   [out, rank]   lora_up, its row piece P of a fused
                                                     projection, times scale * alpha / r
so that (x @ down^T) @ up^T = x @ (sum_i s_i P(B_i) A_i)^T: the merged delta, computed as two thin
GEMMs per step instead of folded into W. Swapping LoRAs or scales is new values for these inputs.
Only LoRA (down / up) adapters are low-rank factors; LoKr and LoHa are refused here (merge them).
A file's text-encoder adapters are merged at load (`dif.lora.mode.TEXT_ENCODER_WHY`): a swap to a
set whose text-encoder part differs (another file or scale adapting it, or it dropped) is refused,
naming both sets, and the adapters in use are kept; the denoiser part of any set swaps as before.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from attrs import define, field

from dif.dtypes import DType
from dif.errors import UsageError, WeightError
from dif.ir.program import Program
from dif.lora.file import LoraSpec
from dif.lora.merge import (
    AppliedLora,
    LoraComponent,
    ModuleTable,
    Patch,
    lora_components,
    match_lora_parts,
    text_encoder_set,
)
from dif.lora.slots import lora_slots, slot_inputs
from dif.weights.source import TensorSource


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


def fill_slots(
    slots: Mapping[str, tuple[int, int, int]], patches: Mapping[str, Sequence[Patch]], dtype: DType
) -> dict[str, np.ndarray]:
    """The input values of LoRA slots (module -> (rank, in, out)): each weight's patches stacked and
    zero-padded to the slot's rank, zeros for a slot no adapter targets, in `dtype`. `WeightError`
    when an adapter does not fit its slot (rank or shape) or targets a weight with no slot."""
    out: dict[str, np.ndarray] = {}
    for module, (rank, width, rows) in slots.items():
        down_name, up_name = slot_inputs(module)
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
        out[down_name], out[up_name] = down.astype(dtype.np), up.astype(dtype.np)
    extra = sorted(set(patches) - {f"{m}.weight" for m in slots})
    if extra:
        raise WeightError(
            f"no LoRA slot for {', '.join(extra[:6])}" + (f" and {len(extra) - 6} more" if len(extra) > 6 else ""),
            hint="build the program inside lora_slots(...) naming those weights",
        )
    return out


def adapter_inputs(program: Program, patches: Mapping[str, Sequence[Patch]]) -> dict[str, np.ndarray]:
    """The values of every LoRA slot input of `program` (built with `lora_slots`): `fill_slots` over
    the slots its inputs declare, in their dtype."""
    inputs = {v.name: v for v in program.inputs}
    slots: dict[str, tuple[int, int, int]] = {}
    dtype: DType | None = None
    for name, value in inputs.items():
        if name.startswith("lora.") and name.endswith(".down"):
            module = name[len("lora.") : -len(".down")]
            rank, width = value.type.shape
            slots[module] = (rank, width, inputs[slot_inputs(module)[1]].type.shape[0])
            dtype = value.type.dtype
    try:
        return fill_slots(slots, patches, dtype or DType.F32)
    except WeightError as exc:
        if "no LoRA slot" in str(exc):
            raise WeightError(f"program '{program.name}' has {exc}") from None
        raise


@define
class UnmergedLoras:
    """A checkpoint's adapters kept out of its weights: every weight of `table` has a slot of `rank`,
    `slots` is what to build the programs with (`lora_slots`), `inputs(dtype)` the values to run them
    with, and `set(specs)` swaps the adapters or their scales (the programs stay as prepared).
    `text_encoder`: the text encoder's weights and table, whose adapters were merged at load; the
    first `use` fixes that set (`text_encoder_set`), later swaps must keep it."""

    base: TensorSource
    table: ModuleTable
    family: str
    model: str
    rank: int = 64
    text_encoder: LoraComponent | None = None
    applied: list[AppliedLora] = field(factory=list)
    _text_encoder_set: tuple[tuple[str, float], ...] | None = None
    _patches: dict[str, list[Patch]] = field(factory=dict)
    _inputs: dict[DType, dict[str, np.ndarray]] = field(factory=dict)
    _programs: dict[Hashable, tuple[str, ...]] = field(factory=dict)

    @property
    def slots(self) -> dict[str, int]:
        return {t.param: self.rank for targets in self.table.values() for t in targets}

    def set(self, specs: Sequence[LoraSpec | str | Path], *, allow_unmatched: bool = False) -> None:
        """Use `specs` from now on (empty: no adapter); refused, keeping the old ones, when they do not
        fit, or (`UsageError`) when their text-encoder adapters are not those merged at load."""
        components = lora_components(self.base, self.table, self.text_encoder)
        by_part, applied = match_lora_parts(
            specs, components, family=self.family, model=self.model, allow_unmatched=allow_unmatched
        ) if specs else ({}, [])  # fmt: skip
        self.use(by_part.get("transformer", {}), applied)

    def use(self, patches: Mapping[str, Sequence[Patch]], applied: Sequence[AppliedLora]) -> None:
        """Use adapters already matched (`match_loras`); `WeightError` when one weight's need more than
        the slot rank, `UsageError` when they change the text encoder's merged adapters (the old ones
        are kept either way)."""
        slot_ranks(patches, self.rank)
        wanted = text_encoder_set(applied)
        if self._text_encoder_set is not None and wanted != self._text_encoder_set:
            said = lambda s: ", ".join(f"{Path(f).name}@{x:g}" for f, x in s) or "none"  # noqa: E731
            raise UsageError(
                f"these LoRAs adapt the text encoder with {said(wanted)}, but it was loaded with "
                f"{said(self._text_encoder_set)}: text-encoder adapters are merged into its weights at load "
                "and do not swap",
                hint="load the pipeline again with these LoRAs, or swap sets whose text-encoder part (file and "
                "scale) is the loaded one's",
            )
        self._text_encoder_set = wanted
        self._patches, self.applied, self._inputs = {k: list(v) for k, v in patches.items()}, list(applied), {}

    def build(self, key: Hashable, build: Callable[[], Program]) -> Program:
        """`build()` inside `lora_slots(self.slots)`, remembering which slot inputs program `key` takes."""
        with lora_slots(self.slots):
            program = build()
        self._programs[key] = tuple(v.name for v in program.inputs if v.name.startswith("lora."))
        return program

    def feed(self, key: Hashable, run: Callable[[Mapping[str, np.ndarray]], Any], dtype: DType) -> Any:
        """`run` with program `key`'s slot inputs added to every call (the adapters current then)."""

        def run_with_adapters(inputs: Mapping[str, np.ndarray]) -> Any:
            values = self.inputs(dtype)
            return run({**inputs, **{name: values[name] for name in self._programs.get(key, ())}})

        return run_with_adapters

    def inputs(self, dtype: DType) -> dict[str, np.ndarray]:
        if dtype not in self._inputs:
            shapes = {}
            for param in self.slots:
                rows, width = self.base.info(param).shape
                shapes[param[: -len(".weight")]] = (self.rank, width, rows)
            self._inputs[dtype] = fill_slots(shapes, self._patches, dtype)
        return self._inputs[dtype]

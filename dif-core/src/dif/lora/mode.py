"""LoRA files, step 4: merged or unmerged, decided once per pipeline and recorded with the reason.

Where it sits: a frontend's `open_checkpoint` calls `apply_loras(base, specs, table, mode=...)`
instead of `merge_loras`; it matches and checks the adapters once (`match_loras`), then
`decide_lora_mode` picks how they run, and the result (`LoraApplication`) says what the programs
bind (`source`), what feeds their side-GEMM inputs (`unmerged`) and the decision (`mode`), which
`record` writes into every program built on that source: `meta["lora"]` (shown by `dif inspect`)
and `meta["decisions"]`, which the planner records first in the program's plan (`dif plan`).

The rule for `mode="auto"`, the first that applies wins:
  swapping asked for (`swappable`)        unmerged: adapters are program inputs, so a new LoRA or scale
                                          is new input values for the same prepared program / CUDA graph
  a LoKr / LoHa adapter                   merged: only LoRA (down, up) factors run as side GEMMs
  the adapters of one weight need more    merged: a slot holds at most `rank` adapter rows
  rank than a slot holds
  the merged weights do not fit the host  unmerged: merged weights are computed arrays the host holds
  memory available                        (not pages of the mapped file); side GEMMs need no copy
  otherwise                               merged: the set is fixed for the pipeline's life, folded into
                                          the weights at load: no per-step cost

That rule is the denoiser's. A file's text-encoder adapters (`apply_loras(..., text_encoder=)`) are
always merged, whatever the denoiser's mode (`TEXT_ENCODER_WHY`), and recorded in the same decision
(`LoraMode.text_encoder`); a swap that would change them is refused (`dif.lora.unmerged`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from attrs import evolve, frozen

from dif.dtypes import DType
from dif.errors import UsageError
from dif.host import available_memory_bytes
from dif.ir.program import Program
from dif.lora.file import LoraSpec
from dif.lora.merge import LoraComponent, LoraMergedSource, ModuleTable, lora_components, match_lora_parts
from dif.lora.unmerged import UnmergedLoras
from dif.weights.source import TensorSource

MODES = ("auto", "merged", "unmerged")
"""`--lora-mode` / `lora_mode=`: "auto" lets `decide_lora_mode` choose."""

DEFAULT_SLOT_RANK = 64
"""Adapter rows each side-GEMM slot holds (zero-padded): any LoRA up to this rank swaps in."""

TEXT_ENCODER_WHY = (
    "the text encoder runs once per prompt, not once per denoiser step: folded into its weights at load, "
    "its adapters cost nothing per run, where side GEMMs would add work to every encode; a LoRA set with "
    "other text-encoder adapters needs the pipeline loaded again (a swap refuses it)"
)
"""Why a LoRA's text-encoder adapters are merged in every mode (recorded with the decision)."""


@frozen
class LoraMode:
    """The decision: `mode` "merged" | "unmerged" as `requested` ("auto" | "merged" | "unmerged")
    resolved, `why`, the adapters it covered (`spec.describe()` each), the slot rank when unmerged,
    the bytes of the weights the adapters change (`merge_bytes`) and the host bytes judged against;
    `text_encoder`: the adapters (`spec.describe()`) whose text-encoder part is merged (`TEXT_ENCODER_WHY`)."""

    mode: str
    requested: str
    why: str
    adapters: tuple[str, ...] = ()
    slot_rank: int | None = None
    merge_bytes: int = 0
    host_free_bytes: int | None = None
    text_encoder: tuple[str, ...] = ()

    @property
    def what(self) -> str:
        head = f"lora: {self.mode}" + (" (auto)" if self.requested == "auto" else " (as asked)")
        slots = f", side-GEMM slots of rank {self.slot_rank}" if self.mode == "unmerged" else ""
        return f"{head}, {len(self.adapters)} adapter(s){slots}"

    @property
    def text_encoder_what(self) -> str:
        return f"lora text encoder: merged, {len(self.text_encoder)} adapter(s)"

    def to_dict(self) -> dict[str, Any]:
        te = {"mode": "merged", "why": TEXT_ENCODER_WHY, "adapters": list(self.text_encoder)}
        return {
            "mode": self.mode,
            "requested": self.requested,
            "why": self.why,
            "adapters": list(self.adapters),
            "slot_rank": self.slot_rank,
            "merge_bytes": self.merge_bytes,
            "host_free_bytes": self.host_free_bytes,
            "text_encoder": te if self.text_encoder else None,
        }

    def record(self, program: Program) -> Program:
        """`program` with this decision in its meta: "lora" (the dict, JSON) and appended to
        "decisions" (a JSON list of [what, why] the planner records first in the plan), the text
        encoder's line after the denoiser's when a LoRA adapts it."""
        meta = dict(program.meta)
        recorded = json.loads(meta.get("decisions", "[]"))
        recorded.append([self.what, self.why])
        if self.text_encoder:
            recorded.append([self.text_encoder_what, TEXT_ENCODER_WHY])
        meta["decisions"] = json.dumps(recorded)
        meta["lora"] = json.dumps(self.to_dict(), sort_keys=True)
        return evolve(program, meta=meta)


def decide_lora_mode(
    requested: str,
    *,
    adapters: Sequence[str],
    kinds: Sequence[str],
    need_rank: int,
    slot_rank: int,
    swappable: bool,
    merge_bytes: int,
    host_free_bytes: int | None,
) -> LoraMode:
    """The mode the adapters run in (the rule of this module's docstring for "auto").

    adapters: their descriptions; kinds: "lora" | "lokr" | "loha" of every adapted module; need_rank:
    the most rows one weight's adapters need together; merge_bytes: bytes of the weights they change;
    host_free_bytes: host memory available (None: not judged). `UsageError` for "merged" with
    `swappable` (merged adapters are part of the weights: they cannot swap)."""
    if requested not in MODES:
        raise UsageError(f"--lora-mode {requested!r}: choose {', '.join(MODES)}")
    names = tuple(adapters)
    said = lambda mode, why: LoraMode(  # noqa: E731
        mode, requested, why, names, slot_rank if mode == "unmerged" else None, merge_bytes, host_free_bytes
    )
    if requested == "merged":
        if swappable:
            raise UsageError(
                "--lora-mode merged cannot swap adapters: merged LoRAs are part of the weights",
                hint="use --lora-mode unmerged or auto with --lora-swappable",
            )
        return said("merged", "asked for (--lora-mode merged): folded into the weights at load, no per-step cost")
    if requested == "unmerged":
        return said("unmerged", "asked for (--lora-mode unmerged): adapters are program inputs, swappable")
    if swappable:
        return said(
            "unmerged",
            "swapping asked for (--lora-swappable): adapters are program inputs padded to the slot rank, so "
            "another LoRA or scale is new input values for the same prepared program (and CUDA graph)",
        )
    odd = sorted(set(kinds) - {"lora"})
    if odd:
        return said("merged", f"{'/'.join(odd)} adapters are not low-rank factors a side GEMM can take")
    if need_rank > slot_rank:
        return said("merged", f"one weight's adapters need rank {need_rank}, more than a slot's {slot_rank}")
    if host_free_bytes is not None and merge_bytes > host_free_bytes:
        return said(
            "unmerged",
            f"merging would hold a computed copy of the {merge_bytes} B of adapted weights on the host, more "
            f"than the {host_free_bytes} B available; side GEMMs read the adapters as inputs instead",
        )
    return said(
        "merged",
        "the LoRA set is fixed for the pipeline's life (no swapping asked for): folded into the weights at "
        f"load, no per-step cost ({merge_bytes} B of adapted weights fit the host's {host_free_bytes} B)"
        if host_free_bytes is not None
        else "the LoRA set is fixed for the pipeline's life (no swapping asked for): folded into the weights at "
        "load, no per-step cost",
    )


@frozen(eq=False)
class LoraApplication:
    """How a checkpoint's adapters run: `source` is what the programs bind (the merged weights, or the
    base), `unmerged` feeds the side-GEMM inputs (None when merged), `mode` the decision (None with no
    adapter and no swapping asked for: nothing was decided); `text_encoder` the text encoder's weights
    with its adapters merged (its base when none adapts it; None when no text encoder was given)."""

    source: TensorSource
    unmerged: UnmergedLoras | None = None
    mode: LoraMode | None = None
    text_encoder: TensorSource | None = None

    def build(self, key: Hashable, build: Callable[[], Program]) -> Program:
        """`build()` (inside the slots when unmerged), the decision recorded in the program's meta."""
        program = build() if self.unmerged is None else self.unmerged.build(key, build)
        return program if self.mode is None else self.mode.record(program)

    def feed(self, key: Hashable, run: Callable[[Mapping[str, np.ndarray]], Any], dtype: DType) -> Any:
        """`run`, with program `key`'s side-GEMM inputs added to every call when unmerged."""
        return run if self.unmerged is None else self.unmerged.feed(key, run, dtype)

    def current(self) -> LoraMode | None:
        """The decision with the adapters in use now (`unmerged.set` may have swapped them since)."""
        if self.mode is None or self.unmerged is None:
            return self.mode
        return evolve(self.mode, adapters=tuple(a.spec.describe() for a in self.unmerged.applied))

    def describe(self) -> str:
        """The LoRA part of a checkpoint's name: ` + LoRA a.safetensors@0.8` merged, ` + LoRA (unmerged) ...`
        as side GEMMs ('' for none; the reason is in `mode`)."""
        if self.mode is None:
            return ""
        how = " (unmerged)" if self.mode.mode == "unmerged" else ""
        return f" + LoRA{how} " + (", ".join(self.mode.adapters) or "none yet")


def apply_loras(
    base: TensorSource,
    specs: Sequence[LoraSpec | str | Path],
    table: ModuleTable,
    *,
    family: str,
    model: str,
    mode: str = "auto",
    swappable: bool = False,
    rank: int = DEFAULT_SLOT_RANK,
    allow_unmatched: bool = False,
    host_free_bytes: int | None = None,
    text_encoder: LoraComponent | None = None,
) -> LoraApplication:
    """The adapters of `specs` matched to `base` through `table` (errors as `merge_loras`), the mode
    decided (`decide_lora_mode`; `host_free_bytes` None: the host's available memory now) and applied:
    merged into the source, or kept as side-GEMM inputs of slots of `rank` on every weight of `table`.
    `text_encoder`: the text encoder's weights and table; the files' text-encoder adapters are merged
    into them (`LoraApplication.text_encoder`) in either mode. Without it, text-encoder keys are unmatched."""
    parsed = [LoraSpec.parse(s) for s in specs]
    if mode not in MODES:
        raise UsageError(f"--lora-mode {mode!r}: choose {', '.join(MODES)}")
    te_base = None if text_encoder is None else text_encoder.base
    if not parsed and not swappable and mode != "unmerged":
        return LoraApplication(base, text_encoder=te_base)
    components = lora_components(base, table, text_encoder)
    by_part, applied = (
        match_lora_parts(parsed, components, family=family, model=model, allow_unmatched=allow_unmatched)
        if parsed
        else ({}, [])
    )
    patches = by_part.get("transformer", {})
    te_patches = by_part.get("text_encoder", {})
    if te_base is not None and te_patches:
        te_base = LoraMergedSource(te_base, te_patches, applied)
    kinds = sorted({p.adapter.kind for ps in patches.values() for p in ps})
    # rows each weight's adapters need together, from the headers (nothing is read before the decision)
    need = max((sum(p.lora.rank(p.adapter) or 0 for p in ps) for ps in patches.values()), default=0)
    merge_bytes = sum(base.info(param).nbytes for param in patches)
    free = available_memory_bytes() if host_free_bytes is None else host_free_bytes
    decided = decide_lora_mode(
        mode,
        adapters=[s.describe() for s in parsed],
        kinds=kinds,
        need_rank=need,
        slot_rank=rank,
        swappable=swappable,
        merge_bytes=merge_bytes,
        host_free_bytes=free,
    )
    decided = evolve(decided, text_encoder=tuple(a.spec.describe() for a in applied if a.text_encoder_targets))
    if decided.mode == "merged":
        source = LoraMergedSource(base, patches, applied) if patches else base
        return LoraApplication(source, None, decided, te_base)
    unmerged = UnmergedLoras(base, table, family, model, rank=rank, text_encoder=text_encoder)
    unmerged.use(patches, applied)
    return LoraApplication(base, unmerged, decided, te_base)

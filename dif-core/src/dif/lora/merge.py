"""LoRA files, step 3: merge adapters into a checkpoint's weights (the "merged at prepare" mode).

Where it sits: between a frontend's `TensorSource` and `bind_weights`. `merge_loras(base, specs,
table)` matches every adapter of every file to the model's modules through the frontend's
`ModuleTable` (module name, in any naming the frontend accepts -> the program weights it feeds,
with the row piece of a fused projection), checks every shape before a byte is read, and returns a
`LoraMergedSource`: the base source whose adapted weights read as

    W' = W + sum_i scale_i * delta_i          delta = up @ down * alpha / rank   (LoRA)
                                              delta = kron(w1, w2) * alpha / rank (LoKr)
                                              delta = (w1a @ w1b) * (w2a @ w2b) * alpha / rank (LoHa)

computed in float32 and stored in the base tensor's dtype, once per tensor (cached). Nothing else
changes: the programs, plans and backends see ordinary weights, so there is no per-step cost.
Unmatched adapters are one `WeightError` listing them (or a warning with `allow_unmatched`); an
adapter for another model family is refused naming the family (`dif.lora.families`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from attrs import frozen

from dif.errors import DifWarning, WeightError
from dif.lora.families import families_of, family_label
from dif.lora.file import Adapter, LoraFile, LoraSpec, read_lora
from dif.weights.remap import Chunk, SwapHalves
from dif.weights.safetensors_file import TensorInfo
from dif.weights.source import TensorSource

MAX_LISTED = 12


@frozen
class Target:
    """A program weight fed by an adapted module: `param` (its name in the base source) and the
    piece of the module's delta it takes (`Chunk` for one projection of a fused qkv, `SwapHalves`
    for a (shift, scale) layer stored (scale, shift))."""

    param: str
    transform: Chunk | SwapHalves | None = None


ModuleTable = Mapping[str, tuple[Target, ...]]
"""Module name (dotted, in every naming a frontend accepts) -> the program weights it feeds."""


@frozen
class AppliedLora:
    """What one file contributed: spec, dialect, adapters matched, their ranks and the weights touched."""

    spec: LoraSpec
    dialect: str
    kinds: tuple[str, ...]
    modules: int
    ranks: tuple[int, ...]
    targets: tuple[str, ...]
    unmatched: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "file": str(self.spec.path),
            "scale": self.spec.scale,
            "dialect": self.dialect,
            "kinds": list(self.kinds),
            "modules": self.modules,
            "ranks": sorted(set(self.ranks)),
            "weights": len(self.targets),
            "unmatched": list(self.unmatched),
        }


@frozen(eq=False)
class Patch:
    """One adapter's contribution to one weight: the file, its adapter, the strength and the piece
    of the adapter's delta the weight takes."""

    lora: LoraFile
    adapter: Adapter
    scale: float
    transform: Chunk | SwapHalves | None
    label: str


def delta_shape(lora: LoraFile, adapter: Adapter) -> tuple[int, int]:
    """(out, in) of the adapter's full delta, from the headers; `WeightError` naming the keys when
    its parts disagree (a rank mismatch) or are not matrices."""
    info = {part: lora.source.info(key) for part, key in adapter.parts.items() if part != "alpha"}
    where = f"{lora.path}: module '{adapter.module}'"

    def matrix(part: str) -> tuple[int, int]:
        shape = info[part].shape
        if len(shape) > 2 and all(d == 1 for d in shape[2:]):
            shape = shape[:2]  # a 1x1 conv kernel stored for a linear
        if len(shape) != 2:
            raise WeightError(
                f"{where}: '{adapter.parts[part]}' has shape {list(info[part].shape)}; only linear (2-D) adapters "
                "are supported"
            )
        return int(shape[0]), int(shape[1])

    def product(a: str, b: str) -> tuple[int, int]:
        (m, r), (r2, n) = matrix(a), matrix(b)
        if r != r2:
            raise WeightError(
                f"{where}: rank mismatch: '{adapter.parts[a]}' is [{m}, {r}] but '{adapter.parts[b]}' is [{r2}, {n}]",
                hint="the file is damaged or its parts come from different adapters",
            )
        return m, n

    if adapter.kind == "lora":
        return product("up", "down")
    if adapter.kind == "loha":
        first, second = product("hada_w1_a", "hada_w1_b"), product("hada_w2_a", "hada_w2_b")
        if first != second:
            raise WeightError(f"{where}: LoHa factors give {list(first)} and {list(second)}; they must agree")
        return first
    w1 = matrix("lokr_w1") if "lokr_w1" in info else product("lokr_w1_a", "lokr_w1_b")
    w2 = matrix("lokr_w2") if "lokr_w2" in info else product("lokr_w2_a", "lokr_w2_b")
    return w1[0] * w2[0], w1[1] * w2[1]


def adapter_delta(lora: LoraFile, adapter: Adapter) -> np.ndarray:
    """The adapter's full delta (out, in) in float32, alpha / rank folded in."""
    t = lambda part: _as_matrix(lora.tensor(adapter, part))  # noqa: E731
    alpha = lora.alpha(adapter)
    if adapter.kind == "lora":
        rank = t("down").shape[0]
        scale = 1.0 if alpha is None else alpha / rank
        return (t("up") @ t("down")) * np.float32(scale)
    if adapter.kind == "loha":
        rank = t("hada_w1_b").shape[0]
        scale = 1.0 if alpha is None else alpha / rank
        return ((t("hada_w1_a") @ t("hada_w1_b")) * (t("hada_w2_a") @ t("hada_w2_b"))) * np.float32(scale)
    parts = adapter.parts
    w1 = t("lokr_w1") if "lokr_w1" in parts else t("lokr_w1_a") @ t("lokr_w1_b")
    w2 = t("lokr_w2") if "lokr_w2" in parts else t("lokr_w2_a") @ t("lokr_w2_b")
    # LyCORIS scales by alpha / rank only when a factor is low-rank; two full factors take no alpha.
    rank = lora.rank(adapter)
    scale = 1.0 if alpha is None or rank is None else alpha / rank
    return np.kron(w1, w2) * np.float32(scale)


def _as_matrix(arr: np.ndarray) -> np.ndarray:
    return arr.reshape(arr.shape[:2]) if arr.ndim > 2 else arr


def _piece_shape(shape: tuple[int, int], transform: Chunk | SwapHalves | None) -> tuple[int, ...]:
    return shape if transform is None else transform.shape(shape)


class LoraMergedSource(TensorSource):
    """`base` with the adapted weights merged (W + sum scale * delta), computed when read."""

    def __init__(self, base: TensorSource, patches: Mapping[str, Sequence[Patch]], applied: Sequence[AppliedLora]):
        self.base = base
        self._patches = {k: tuple(v) for k, v in patches.items()}
        self.applied = tuple(applied)
        self.label = f"{base.label} + LoRA {', '.join(a.spec.describe() for a in applied)}"

    def names(self) -> list[str]:
        return self.base.names()

    def __contains__(self, name: object) -> bool:
        return name in self.base

    def info(self, name: str) -> TensorInfo:
        return self.base.info(name)

    def file_of(self, name: str) -> str:
        where = self.base.file_of(name)
        patches = self._patches.get(name)
        if not patches:
            return where
        return f"{where} + LoRA {', '.join(p.label for p in patches)}"

    @property
    def merged(self) -> tuple[str, ...]:
        """The weights an adapter changes."""
        return tuple(self._patches)

    def _load(self, name: str) -> np.ndarray:
        # Computed on every access, never cached: a merged 9B model held twice on the host would
        # cost more than the few low-rank products of a re-read (the load scan reads each once).
        patches = self._patches.get(name)
        if not patches:
            return self.base[name]
        weight = self.base[name]
        merged = np.array(weight, dtype=np.float32)
        for patch in patches:
            delta = adapter_delta(patch.lora, patch.adapter)
            if patch.transform is not None:
                delta = patch.transform.apply(delta)
            merged += np.float32(patch.scale) * delta.reshape(merged.shape)
        out = merged.astype(weight.dtype)
        out.setflags(write=False)
        return out


def _lookup(table: ModuleTable, flat: Mapping[str, str], lora: LoraFile, module: str) -> tuple[Target, ...] | None:
    if lora.flattened:
        dotted = flat.get(module)
        return None if dotted is None else table[dotted]
    found = table.get(module)
    if found is None and "." not in module:  # a flattened name under a dotted dialect's prefix
        dotted = flat.get(module)
        found = None if dotted is None else table[dotted]
    return found


def merge_loras(
    base: TensorSource,
    specs: Sequence[LoraSpec | str | Path],
    table: ModuleTable,
    *,
    family: str,
    model: str,
    allow_unmatched: bool = False,
) -> TensorSource:
    """`base` with the adapters of `specs` merged (the base itself when `specs` is empty).

    table:   the frontend's modules (`ModuleTable`); every target must be a weight of `base`.
    family:  this model's key in `dif.lora.families` ("flux2"); `model` its name for messages.
    allow_unmatched: adapters that match no module become one `DifWarning` instead of an error.

    Raises `WeightError` naming the file and keys: a LoRA for another family, unmatched adapters,
    rank mismatches, a delta whose shape does not fit its weight (a LoRA for another model size)."""
    if not specs:
        return base
    patches, applied = match_loras(base, specs, table, family=family, model=model, allow_unmatched=allow_unmatched)
    return LoraMergedSource(base, patches, applied)


def match_loras(
    base: TensorSource,
    specs: Sequence[LoraSpec | str | Path],
    table: ModuleTable,
    *,
    family: str,
    model: str,
    allow_unmatched: bool = False,
) -> tuple[dict[str, list[Patch]], list[AppliedLora]]:
    """Every adapter of `specs` matched to the weights of `base` and checked (what `merge_loras`
    merges and `dif.lora.unmerged` feeds as side GEMMs): weight name -> its patches, and per file
    what it contributed. The errors are `merge_loras`'."""
    flat = {name.replace(".", "_"): name for name in table}
    patches: dict[str, list[Patch]] = {}
    applied: list[AppliedLora] = []
    for given in specs:
        spec = LoraSpec.parse(given) if not isinstance(given, LoraSpec) else given
        lora = read_lora(spec.path)
        matched: list[tuple[Adapter, tuple[Target, ...]]] = []
        unmatched: list[str] = []
        for module, adapter in lora.adapters.items():
            targets = _lookup(table, flat, lora, module)
            if targets is None:
                unmatched.extend(sorted(adapter.parts.values()))
            else:
                matched.append((adapter, targets))
        unmatched += [*lora.unknown, *lora.text_encoder]
        _refuse_other_family(lora, family, model, matched, unmatched)
        if unmatched:
            listed = "\n".join(f"  {k}" for k in unmatched[:MAX_LISTED])
            more = f"\n  ... and {len(unmatched) - MAX_LISTED} more" if len(unmatched) > MAX_LISTED else ""
            what = (
                f"{lora.path}: {len(unmatched)} of {len(lora.source)} LoRA keys match no module of {model} "
                f"({lora.dialect} dialect):\n{listed}{more}"
            )
            if not allow_unmatched:
                raise WeightError(
                    what, hint="a LoRA for another model or a part dif does not adapt; --lora-allow-unmatched "
                    "merges the rest and warns"
                )  # fmt: skip
            note = f"{what}\nmerging the {len(matched)} matched modules (--lora-allow-unmatched)"
            warnings.warn(note, DifWarning, stacklevel=2)
        touched: list[str] = []
        for adapter, targets in matched:
            shape = delta_shape(lora, adapter)
            for target in targets:
                if target.param not in base:
                    raise WeightError(
                        f"{lora.path}: module '{adapter.module}' targets '{target.param}', which {base.label} lacks"
                    )
                want = base.info(target.param).shape
                try:
                    piece = _piece_shape(shape, target.transform)
                except WeightError as exc:
                    raise WeightError(f"{lora.path}: module '{adapter.module}': {exc}") from None
                if tuple(piece) != tuple(want[:2]) or len(want) != 2:
                    raise WeightError(
                        f"{lora.path}: module '{adapter.module}' ({adapter.kind}) gives a delta of "
                        f"{list(piece)} for '{target.param}', which is {list(want)} in {base.file_of(target.param)}",
                        hint="the LoRA was trained for another model size or variant",
                    )
                label = f"{spec.describe()} '{adapter.module}'"
                patches.setdefault(target.param, []).append(Patch(lora, adapter, spec.scale, target.transform, label))
                touched.append(target.param)
        if not matched:
            raise WeightError(f"{lora.path}: no adapter in this file matches a module of {model}")
        ranks = tuple(r for a, _ in matched if (r := lora.rank(a)) is not None)
        kinds = tuple(sorted({a.kind for a, _ in matched}))
        applied.append(AppliedLora(spec, lora.dialect, kinds, len(matched), ranks, tuple(touched), tuple(unmatched)))
    return patches, applied


def _refuse_other_family(
    lora: LoraFile, family: str, model: str, matched: Sequence[object], unmatched: Sequence[str]
) -> None:
    """A LoRA whose keys carry another family's signature (and not this one's) is refused naming it."""
    keys = lora.source.names()
    found = families_of(keys)
    if not found or family in found:
        return
    if matched and not unmatched:
        return  # every key fits this model: a shared naming, not another family
    raise WeightError(
        f"{lora.path}: this LoRA is for {family_label(found[0])} (keys like '{_example(keys, found[0])}'), not {model}",
        hint=f"use a LoRA trained for {model}",
    )


def _example(keys: Sequence[str], family: str) -> str:
    import re

    from dif.lora.families import FAMILY_SIGNATURES

    patterns = [re.compile(p) for p in FAMILY_SIGNATURES[family][1]]
    return next((k for k in keys if any(p.search(k) for p in patterns)), keys[0])

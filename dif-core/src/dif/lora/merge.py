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

A file may adapt two parts of the model (`dif.lora.file.PARTS`): the denoiser and the text encoder.
`match_lora_parts` matches each part present against its own `LoraComponent` (weights + table) with
the file's one scale; a part the caller gives no component for is unmatched, like any other key.
`text_encoder_table` is the table of a transformers decoder stack (the text encoders of FLUX.2 and Krea 2).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from attrs import frozen

from dif.errors import DifWarning, WeightError
from dif.lora.families import families_of, family_label
from dif.lora.file import PARTS, Adapter, LoraFile, LoraSpec, read_lora
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


@frozen(eq=False)
class LoraComponent:
    """A part of the model LoRA files adapt: its weights (`base`) and its modules (`table`)."""

    base: TensorSource
    table: ModuleTable


def lora_components(
    base: TensorSource, table: ModuleTable, text_encoder: LoraComponent | None = None
) -> dict[str, LoraComponent]:
    """The parts a pipeline's LoRAs are matched against: the denoiser's, and the text encoder's if given."""
    parts = {"transformer": LoraComponent(base, table)}
    return parts if text_encoder is None else parts | {"text_encoder": text_encoder}


def text_encoder_table(source: TensorSource, stack: str, spellings: Sequence[str]) -> dict[str, tuple[Target, ...]]:
    """The linears of a transformers decoder stack in `source` (2-D weights `{stack}layers.N.<module>.weight`:
    q/k/v/o and gate/up/down projections) under every spelling LoRA files put before `layers.`:
    `spellings` are those heads, e.g. ("model.", "") for a Qwen3ForCausalLM saved in full or as its
    inner Qwen3Model. Embeddings and `lm_head` are not linears of the stack (PEFT adapts embeddings
    with other keys), so they are not targets; kohya's flattened names match through these too."""
    layer = re.compile(re.escape(stack) + r"layers\.\d+\.")
    table: dict[str, tuple[Target, ...]] = {}
    for name in source.names():
        if name.endswith(".weight") and layer.match(name) and len(source.info(name).shape) == 2:
            inner = name[len(stack) : -len(".weight")]
            for head in spellings:
                table[head + inner] = (Target(name),)
    return table


@frozen
class AppliedLora:
    """What one file contributed: spec, dialect, adapters matched (both parts), their kinds and ranks,
    the denoiser weights touched (`targets`) and the text encoder's (`text_encoder_targets`)."""

    spec: LoraSpec
    dialect: str
    kinds: tuple[str, ...]
    modules: int
    ranks: tuple[int, ...]
    targets: tuple[str, ...]
    unmatched: tuple[str, ...]
    text_encoder_targets: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "file": str(self.spec.path),
            "scale": self.spec.scale,
            "dialect": self.dialect,
            "kinds": list(self.kinds),
            "modules": self.modules,
            "ranks": sorted(set(self.ranks)),
            "weights": len(self.targets),
            "text_encoder_weights": len(self.text_encoder_targets),
            "unmatched": list(self.unmatched),
        }


def text_encoder_set(applied: Sequence[AppliedLora]) -> tuple[tuple[str, float], ...]:
    """(file, scale) of each LoRA that adapts the text encoder: what its merged weights depend on."""
    return tuple((str(a.spec.path.resolve()), a.spec.scale) for a in applied if a.text_encoder_targets)


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
    part: str = "transformer",
) -> TensorSource:
    """`base` with the adapters of `specs` merged (the base itself when `specs` is empty).

    table:   the frontend's modules (`ModuleTable`); every target must be a weight of `base`.
    family:  this model's key in `dif.lora.families` ("flux2"); `model` its name for messages.
    allow_unmatched: adapters that match no module become one `DifWarning` instead of an error.
    part:    which part of the files `base` is ("transformer" or "text_encoder"); the other's keys
             are unmatched.

    Raises `WeightError` naming the file and keys: a LoRA for another family, unmatched adapters,
    rank mismatches, a delta whose shape does not fit its weight (a LoRA for another model size)."""
    if not specs:
        return base
    patches, applied = match_loras(
        base, specs, table, family=family, model=model, allow_unmatched=allow_unmatched, part=part
    )
    return LoraMergedSource(base, patches, applied)


def match_loras(
    base: TensorSource,
    specs: Sequence[LoraSpec | str | Path],
    table: ModuleTable,
    *,
    family: str,
    model: str,
    allow_unmatched: bool = False,
    part: str = "transformer",
) -> tuple[dict[str, list[Patch]], list[AppliedLora]]:
    """Every adapter of `specs` matched to the weights of `base` and checked (what `merge_loras`
    merges and `dif.lora.unmerged` feeds as side GEMMs): weight name -> its patches, and per file
    what it contributed. `match_lora_parts` with one component, `part`; the errors are `merge_loras`'."""
    by_part, applied = match_lora_parts(
        specs, {part: LoraComponent(base, table)}, family=family, model=model, allow_unmatched=allow_unmatched
    )
    return by_part[part], applied


def match_lora_parts(
    specs: Sequence[LoraSpec | str | Path],
    components: Mapping[str, LoraComponent],
    *,
    family: str,
    model: str,
    allow_unmatched: bool = False,
) -> tuple[dict[str, dict[str, list[Patch]]], list[AppliedLora]]:
    """Every adapter of `specs` matched to the component of its part (`dif.lora.file.PARTS` ->
    `LoraComponent`) and checked: part -> weight name -> its patches (every part of `components`
    present), and per file what it contributed. A file's unmatched keys, in every part (those of a
    part with no component included), are one error; a file matching nothing in any part is refused."""
    patches: dict[str, dict[str, list[Patch]]] = {name: {} for name in components}
    flats = {name: {m.replace(".", "_"): m for m in c.table} for name, c in components.items()}
    applied: list[AppliedLora] = []
    for given in specs:
        spec = LoraSpec.parse(given) if not isinstance(given, LoraSpec) else given
        lora = read_lora(spec.path)
        matched: list[tuple[str, LoraFile, Adapter, tuple[Target, ...]]] = []
        unmatched: list[str] = []
        for name in PARTS:
            piece = lora.part(name)
            if piece is None:
                continue
            if name not in components:  # a part this model's caller does not adapt: all its keys
                unmatched += lora.text_encoder if name == "text_encoder" else _own_keys(piece)
                continue
            for module, adapter in piece.adapters.items():
                targets = _lookup(components[name].table, flats[name], piece, module)
                if targets is None:
                    unmatched.extend(sorted(adapter.parts.values()))
                else:
                    matched.append((name, piece, adapter, targets))
            unmatched += piece.unknown
        _refuse_other_family(lora, family, model, matched, unmatched)
        dialect = _dialects(lora)
        if unmatched:
            listed = "\n".join(f"  {k}" for k in unmatched[:MAX_LISTED])
            more = f"\n  ... and {len(unmatched) - MAX_LISTED} more" if len(unmatched) > MAX_LISTED else ""
            what = (
                f"{lora.path}: {len(unmatched)} of {len(lora.source)} LoRA keys match no module of {model} "
                f"({dialect} dialect):\n{listed}{more}"
            )
            if not allow_unmatched:
                raise WeightError(
                    what, hint="a LoRA for another model or a part dif does not adapt; --lora-allow-unmatched "
                    "merges the rest and warns"
                )  # fmt: skip
            note = f"{what}\nmerging the {len(matched)} matched modules (--lora-allow-unmatched)"
            warnings.warn(note, DifWarning, stacklevel=2)
        if not matched:
            raise WeightError(f"{lora.path}: no adapter in this file matches a module of {model}")
        touched: dict[str, list[str]] = {name: [] for name in PARTS}
        for name, piece, adapter, targets in matched:
            for target in _checked(piece, adapter, targets, components[name].base):
                label = f"{spec.describe()} '{adapter.module}'"
                patch = Patch(piece, adapter, spec.scale, target.transform, label)
                patches[name].setdefault(target.param, []).append(patch)
                touched[name].append(target.param)
        ranks = tuple(r for _, piece, a, _ in matched if (r := piece.rank(a)) is not None)
        kinds = tuple(sorted({a.kind for _, _, a, _ in matched}))
        applied.append(
            AppliedLora(
                spec, dialect, kinds, len(matched), ranks, tuple(touched["transformer"]), tuple(unmatched),
                tuple(touched["text_encoder"]),
            )
        )  # fmt: skip
    return patches, applied


def _own_keys(lora: LoraFile) -> list[str]:
    """The file keys of one part: its adapters' and its unknown ones."""
    return [k for a in lora.adapters.values() for k in sorted(a.parts.values())] + list(lora.unknown)


def _dialects(lora: LoraFile) -> str:
    """The file's dialect, and its text encoder's when it has one ("kohya; text encoder kohya")."""
    te = lora.text_encoder_part
    if te is None:
        return lora.dialect
    if not lora.adapters and not lora.unknown:
        return f"text encoder {te.dialect}"
    return f"{lora.dialect}; text encoder {te.dialect}"


def _checked(lora: LoraFile, adapter: Adapter, targets: Sequence[Target], base: TensorSource) -> Sequence[Target]:
    """`targets`, each checked to be a weight of `base` the adapter's delta (or its piece) fits."""
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
    return targets


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
    from dif.lora.families import FAMILY_SIGNATURES

    patterns = [re.compile(p) for p in FAMILY_SIGNATURES[family][1]]
    return next((k for k in keys if any(p.search(k) for p in patterns)), keys[0])

"""LoRA files, step 1: read an adapter file and sort its tensors into per-module adapters.

Where it sits: before binding. `read_lora(path)` opens a safetensors adapter (headers only), names
its dialect from the key spelling, strips the dialect's prefix and groups the keys by module:

  dialect      keys                                                    module names
  diffusers    transformer.<mod>.lora_A.weight / lora_B.weight         dotted, the model's diffusers names
  peft         base_model.model.<mod>.lora_A[.default].weight          dotted (diffusers or original names)
  kohya        lora_unet_<mod_with_underscores>.lora_down/lora_up/.alpha  flattened
  ai-toolkit   diffusion_model.<mod>.lora_A / lora_down (+ .alpha)     dotted, original (BFL / ComfyUI) names
  onetrainer   lora_transformer_<flat>.lora_down/up/.alpha, or
               transformer.<mod>.lora_down / lora_up / .alpha          flattened or dotted
  lycoris      lycoris_<flat>.lokr_* / .hada_* (+ .alpha)              flattened
and LoKr (`lokr_w1[_a,_b]`, `lokr_w2[_a,_b]`) / LoHa (`hada_w1_a` ... `hada_w2_b`) adapters under
any of those prefixes. A text encoder's keys (`TEXT_ENCODER_DIALECTS`: diffusers `text_encoder.<mod>`,
kohya `lora_te_` / `lora_te1_<flat>`) are sorted the same way into a part of their own
(`LoraFile.text_encoder_part`), with their own metadata alpha. Which model module a name means is the
frontend's business (`dif.lora.merge.ModuleTable`); this module knows only file conventions. DoRA
(`dora_scale`), Tucker cores (`lora_mid`, `lokr_t2`, `hada_t1`) and conv kernels are refused by name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from attrs import frozen

from dif.errors import CheckpointError, UsageError, WeightError
from dif.weights.safetensors_file import SafetensorsFile
from dif.weights.source import FileSource

# (prefix, dialect, flattened) in match order: the longest prefixes first.
PREFIXES: tuple[tuple[str, str, bool], ...] = (
    ("base_model.model.", "peft", False),
    ("model.diffusion_model.", "ai-toolkit", False),
    ("diffusion_model.", "ai-toolkit", False),
    ("lora_unet_", "kohya", True),
    ("lora_transformer_", "onetrainer", True),
    ("lycoris_", "lycoris", True),
    ("transformer.", "diffusers", False),
    ("unet.", "diffusers", False),
)
# (prefix, which text encoder, dialect) of a text encoder's keys. kohya numbers the encoders (te1 is
# the first or only one; sd-scripts calls FLUX.1's T5 te3), diffusers names the pipeline component.
# The models dif runs have one text encoder: the keys of a second or third are never matched.
TEXT_ENCODER_DIALECTS: tuple[tuple[str, int, str], ...] = (
    ("lora_te1_", 1, "kohya"),
    ("lora_te2_", 2, "kohya"),
    ("lora_te3_", 3, "kohya"),
    ("lora_te_", 1, "kohya"),
    ("text_encoder_2.", 2, "diffusers"),
    ("text_encoder.", 1, "diffusers"),
)
TEXT_ENCODER_PREFIXES = tuple(prefix for prefix, _, _ in TEXT_ENCODER_DIALECTS)
PARTS = ("transformer", "text_encoder")
"""The parts of a model a LoRA file adapts: the denoiser ("transformer", every dialect of `PREFIXES`)
and the (first) text encoder (`TEXT_ENCODER_DIALECTS`)."""
# the metadata keys of each part when a pipeline saved them (`lora_adapter_metadata`: "transformer.lora_alpha")
_METADATA_PREFIXES = {"transformer": ("transformer.", "unet."), "text_encoder": ("text_encoder.",)}

# Suffix -> part name, longest first. ".default" is PEFT's adapter name inside the key.
_PARTS: tuple[tuple[str, str], ...] = (
    (".lora_A.default.weight", "down"),
    (".lora_B.default.weight", "up"),
    (".lora_A.weight", "down"),
    (".lora_B.weight", "up"),
    (".lora_down.weight", "down"),
    (".lora_up.weight", "up"),
    (".lora_mid.weight", "mid"),
    (".lora_B.bias", "up_bias"),
    (".alpha", "alpha"),
    (".dora_scale", "dora_scale"),
    (".lora_magnitude_vector.default.weight", "dora_scale"),
    (".lora_magnitude_vector.weight", "dora_scale"),
    (".lora_magnitude_vector", "dora_scale"),
    (".lokr_w1_a", "lokr_w1_a"),
    (".lokr_w1_b", "lokr_w1_b"),
    (".lokr_w2_a", "lokr_w2_a"),
    (".lokr_w2_b", "lokr_w2_b"),
    (".lokr_w1", "lokr_w1"),
    (".lokr_w2", "lokr_w2"),
    (".lokr_t2", "lokr_t2"),
    (".hada_w1_a", "hada_w1_a"),
    (".hada_w1_b", "hada_w1_b"),
    (".hada_w2_a", "hada_w2_a"),
    (".hada_w2_b", "hada_w2_b"),
    (".hada_t1", "hada_t1"),
    (".hada_t2", "hada_t2"),
)
_REFUSED = {
    "dora_scale": "DoRA (weight-decomposed LoRA: 'dora_scale' / 'lora_magnitude_vector' tensors) is not supported; "
    "merge it into the checkpoint with the tool that trained it, or use a plain LoRA",
    "mid": "LoCon Tucker cores ('lora_mid') are for conv layers; this model's adapters target linears",
    "lokr_t2": "LoKr Tucker cores ('lokr_t2') are for conv layers; this model's adapters target linears",
    "hada_t1": "LoHa Tucker cores ('hada_t1') are for conv layers; this model's adapters target linears",
    "hada_t2": "LoHa Tucker cores ('hada_t2') are for conv layers; this model's adapters target linears",
    "up_bias": "LoRA bias terms ('lora_B.bias') are not supported",
}


@frozen
class LoraSpec:
    """One `--lora FILE[:SCALE]`: the file and the strength it is merged with (default 1.0)."""

    path: Path
    scale: float = 1.0

    @classmethod
    def parse(cls, text: str | Path | LoraSpec | tuple[str | Path, float]) -> LoraSpec:
        """`FILE`, `FILE:SCALE` (a trailing `:number` is the scale), a (path, scale) pair or a spec."""
        if isinstance(text, LoraSpec):
            return text
        if isinstance(text, tuple):
            path, scale = text
            return cls(Path(path), _scale(str(scale), str(path)))
        if isinstance(text, Path):
            return cls(text)
        head, sep, tail = text.rpartition(":")
        if sep and head and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", tail.strip()):
            return cls(Path(head), _scale(tail, text))
        return cls(Path(text))

    def describe(self) -> str:
        return f"{self.path.name}@{self.scale:g}"


def _scale(value: str, given: str) -> float:
    try:
        scale = float(value)
    except ValueError:
        raise UsageError(f"--lora {given}: scale {value!r} is not a number", hint="write FILE or FILE:0.8") from None
    if not np.isfinite(scale):
        raise UsageError(f"--lora {given}: scale {value!r} is not finite", hint="write FILE or FILE:0.8")
    return scale


@frozen(eq=False)
class Adapter:
    """The tensors of one adapted module, by part name ("down", "up", "alpha", "lokr_w1", ...)
    and the file keys they came from (for messages)."""

    module: str
    parts: Mapping[str, str]  # part -> key in the file
    kind: str  # "lora" | "lokr" | "loha"


@frozen(eq=False)
class LoraFile:
    """An adapter file read and grouped: `adapters` by module name (dialect prefix stripped; for a
    flattened dialect the name has underscores for dots), `unknown` keys no convention explains,
    `text_encoder` keys (adapters of a text encoder), PEFT `alpha` from the file's metadata.

    `text_encoder_part` is the same for the first text encoder's keys (None when the file has
    none): its adapters (prefix stripped, kohya's flattened and diffusers' dotted names side by side,
    so `flattened` is False), as unknown the keys of other encoders and of no convention, and the
    text encoder's own metadata alpha. Adapters of one part read their alpha from that part."""

    path: Path
    source: FileSource
    dialect: str
    flattened: bool
    adapters: Mapping[str, Adapter]
    unknown: tuple[str, ...]
    text_encoder: tuple[str, ...]
    metadata_alpha: float | None
    text_encoder_part: LoraFile | None = None

    def part(self, name: str) -> LoraFile | None:
        """The part `name` of `PARTS` ("transformer": this file's denoiser adapters; "text_encoder":
        `text_encoder_part`)."""
        if name not in PARTS:
            raise ValueError(f"LoRA part {name!r}: one of {', '.join(PARTS)}")
        return self if name == "transformer" else self.text_encoder_part

    def tensor(self, adapter: Adapter, part: str) -> np.ndarray:
        return np.asarray(self.source[adapter.parts[part]], dtype=np.float32)

    def rank(self, adapter: Adapter) -> int | None:
        """The adapter's rank: rows of lora_down / columns of hada_w1_a / of a decomposed LoKr factor."""
        parts = adapter.parts
        for part, axis in (("down", 0), ("hada_w1_b", 0), ("lokr_w2_b", 0), ("lokr_w1_b", 0)):
            if part in parts:
                return int(self.source.info(parts[part]).shape[axis])
        return None

    def alpha(self, adapter: Adapter) -> float | None:
        if "alpha" in adapter.parts:
            value = np.asarray(self.source[adapter.parts["alpha"]], dtype=np.float64).reshape(-1)
            if value.size != 1 or not np.isfinite(value[0]):
                raise WeightError(f"{self.path}: '{adapter.parts['alpha']}' is not one finite number")
            return float(value[0])
        return self.metadata_alpha


def _dialect(keys: list[str]) -> tuple[str, str, bool]:
    """(prefix, dialect, flattened) of the most keys; OneTrainer's dotted form is `transformer.` with
    `lora_down`, not `lora_A`."""
    counts: dict[tuple[str, str, bool], int] = {}
    for key in keys:
        for entry in PREFIXES:
            if key.startswith(entry[0]):
                counts[entry] = counts.get(entry, 0) + 1
                break
    if not counts:
        return "", "bare", False
    best = max(counts, key=lambda e: counts[e])
    if best[1] == "diffusers" and any(".lora_down." in k for k in keys):
        return best[0], "onetrainer", False
    return best


def _metadata_alpha(metadata: Mapping[str, str], path: Path, part: str = "transformer") -> float | None:
    """PEFT / diffusers adapters store `lora_alpha` and `r` in the `lora_adapter_metadata` JSON: a
    pipeline's save per component (`_METADATA_PREFIXES` of `part`), a model's save unprefixed."""
    text = metadata.get("lora_adapter_metadata")
    if text is None:
        return None
    try:
        meta = json.loads(text)
    except (TypeError, ValueError):
        raise WeightError(f"{path}: metadata 'lora_adapter_metadata' is not JSON") from None
    if not isinstance(meta, dict):
        return None
    # a pipeline's save prefixes the component ("transformer.lora_alpha"), a model's does not
    prefixed = {k.split(".", 1)[1]: v for k, v in meta.items() if k.startswith(_METADATA_PREFIXES[part])}
    every = tuple(p for prefixes in _METADATA_PREFIXES.values() for p in prefixes)
    meta = prefixed or {k: v for k, v in meta.items() if not k.startswith(every)}
    if meta.get("use_dora"):
        raise WeightError(f"{path}: 'lora_adapter_metadata' says use_dora: DoRA adapters are not supported")
    if meta.get("alpha_pattern") or meta.get("rank_pattern"):
        raise WeightError(
            f"{path}: per-module alpha_pattern / rank_pattern in 'lora_adapter_metadata' is not supported"
        )
    alpha = meta.get("lora_alpha")
    return float(alpha) if isinstance(alpha, (int, float)) else None


def read_lora(path: str | Path) -> LoraFile:
    """Open and sort an adapter file (headers only; tensors are read when merged).

    Raises `CheckpointError` / `FormatError` for a missing or corrupt file, `WeightError` naming the
    key for a refused kind (DoRA, Tucker cores, bias) and for a module with a part missing."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such LoRA file")
    if path.suffix.lower() == ".gguf":
        raise WeightError(f"{path}: a GGUF LoRA is not supported; give the adapter as .safetensors")
    handle = SafetensorsFile(path)
    source = FileSource({name: handle for name in handle.tensors}, str(path))
    keys = source.names()
    if not keys:
        raise WeightError(f"{path}: the LoRA file holds no tensors")
    prefix, dialect, flattened = _dialect(keys)
    text_encoder = [k for k in keys if k.startswith(TEXT_ENCODER_PREFIXES)]
    model_keys = [k for k in keys if not k.startswith(TEXT_ENCODER_PREFIXES)]
    adapters, unknown = _group(path, model_keys, lambda k: k[len(prefix) :] if prefix and k.startswith(prefix) else k)
    metadata = handle.metadata
    part = _text_encoder_part(path, source, text_encoder, metadata) if text_encoder else None
    return LoraFile(
        path, source, dialect, flattened, adapters, tuple(unknown), tuple(text_encoder),
        _metadata_alpha(metadata, path), part,
    )  # fmt: skip


def _group(path: Path, keys: list[str], strip: Callable[[str], str | None]) -> tuple[dict[str, Adapter], list[str]]:
    """`keys` grouped into adapters by module (`strip(key)`: the name after the dialect's prefix, None
    for a key that is not this part's), and the keys no part suffix explains; refused kinds raise."""
    groups: dict[str, dict[str, str]] = {}
    unknown: list[str] = []
    for key in keys:
        name = strip(key)
        found = None if name is None else next(((name[: -len(s)], p) for s, p in _PARTS if name.endswith(s)), None)
        if found is None:
            unknown.append(key)
            continue
        module, part = found
        if part in _REFUSED:
            raise WeightError(f"{path}: '{key}': {_REFUSED[part]}")
        groups.setdefault(module, {})[part] = key
    return {module: _adapter(path, module, parts) for module, parts in groups.items()}, unknown


def _text_encoder_part(path: Path, source: FileSource, keys: list[str], metadata: Mapping[str, str]) -> LoraFile:
    """The first text encoder's keys as a `LoraFile` (`LoraFile.text_encoder_part`)."""
    first = {prefix: dialect for prefix, encoder, dialect in TEXT_ENCODER_DIALECTS if encoder == 1}

    def strip(key: str) -> str | None:
        prefix = next((p for p in first if key.startswith(p)), None)
        return None if prefix is None else key[len(prefix) :]

    adapters, unknown = _group(path, keys, strip)
    dialects = sorted({d for p, d in first.items() if any(k.startswith(p) for k in keys)})
    return LoraFile(
        path, source, "+".join(dialects) or "other text encoders", False, adapters, tuple(unknown), (),
        _metadata_alpha(metadata, path, "text_encoder"),
    )  # fmt: skip


def _adapter(path: Path, module: str, parts: Mapping[str, str]) -> Adapter:
    names = set(parts) - {"alpha"}
    if names == {"down", "up"}:
        return Adapter(module, parts, "lora")
    if names and names <= {"lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b"}:
        for factor in ("lokr_w1", "lokr_w2"):
            if factor not in names and {f"{factor}_a", f"{factor}_b"} - names:
                raise WeightError(f"{path}: LoKr module '{module}' has neither '{factor}' nor '{factor}_a' + '_b'")
        return Adapter(module, parts, "lokr")
    if names == {"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"}:
        return Adapter(module, parts, "loha")
    some = next(iter(parts.values()))
    raise WeightError(
        f"{path}: module '{module}' has parts {sorted(names) or ['alpha only']} (e.g. '{some}'): "
        "not a LoRA (lora_down + lora_up), LoKr or LoHa adapter",
        hint="the file is incomplete or of a kind dif does not read",
    )

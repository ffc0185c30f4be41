"""Facts about a checkpoint that commands show and use as defaults: storage dtype, native image size,
tensor counts per component.

Where it sits: beside `dif.weights`, for a frontend's `generate` (--dtype auto, default size) and
`info` commands. Only configs and safetensors headers are read, never tensor data.
"""

from __future__ import annotations

import importlib.resources
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dif.dtypes import DType
from dif.errors import ConfigError, UsageError
from dif.weights.source import TensorSource

if TYPE_CHECKING:
    from dif.layers.causal_lm import DecoderConfig

RUN_DTYPES = {"BF16": DType.BF16, "F16": DType.F16, "F32": DType.F32, "F8_E4M3": DType.BF16, "F8_E5M2": DType.BF16}
"""Storage dtype -> the `--dtype auto` run dtype; fp8 runs in bf16, which holds every fp8 value exactly."""


def read_json_object(path: str | Path, *, hint: str | None = None) -> dict[str, Any]:
    """The JSON object in `path` (a config.json, model_index.json, ...); `ConfigError` naming the file
    when it is missing, unreadable, not JSON or not an object."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p}: file not found", hint=hint) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{p}: not readable JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{p}: not readable JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object, got {type(data).__name__}")
    try:  # JSON may escape a lone surrogate ("\ud800"): not text, and every consumer would choke on it
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{p}: holds a string that is not valid Unicode (a lone surrogate escape)") from None
    return data


def storage_dtype(source: TensorSource, *, by: Literal["majority", "first"] = "majority") -> DType:
    """The run dtype for `--dtype auto`: how `source`'s float tensors are stored (bf16 | f16 | f32).

    by="majority": the dtype most tensors have (checkpoints that keep norm gains in fp32 next to
    bf16 matrices are bf16 checkpoints); by="first": the first float tensor's, in `names()` order.
    f32 when no tensor is bf16, f16 or f32; bf16 when any is fp8 (it holds every fp8 value exactly)."""
    kinds = [source.info(n).dtype for n in source.names()]
    if any(k in ("F8_E4M3", "F8_E5M2") for k in kinds):  # fp8 weights, whatever the norms are stored in
        return DType.BF16
    order = [kind for kind, _ in Counter(kinds).most_common()] if by == "majority" else kinds
    return next((RUN_DTYPES[k] for k in order if k in RUN_DTYPES), DType.F32)


def native_size(root: Path, *, multiple: int = 16, default: int = 1024) -> int:
    """Default image width/height: `sample_size` of the diffusers folder's vae/config.json when it is
    a positive multiple of `multiple`, else `default`."""
    try:
        size = json.loads((root / "vae" / "config.json").read_text()).get("sample_size", default)
    except (OSError, ValueError, AttributeError):
        return default
    return size if isinstance(size, int) and size > 0 and size % multiple == 0 else default


def source_summary(source: TensorSource) -> dict[str, Any]:
    """{"tensors": count, "bytes": total, "dtypes": sorted safetensors names, "from": label}."""
    infos = [source.info(n) for n in source.names()]
    dtypes = sorted({i.dtype for i in infos})
    return {"tensors": len(infos), "bytes": sum(i.nbytes for i in infos), "dtypes": dtypes, "from": source.label}


def decoder_summary(cfg: DecoderConfig) -> dict[str, Any]:
    """{"layers", "hidden", "heads", "kv_heads"} of a decoder text encoder, for an `info` command."""
    return {
        "layers": cfg.num_hidden_layers,
        "hidden": cfg.hidden_size,
        "heads": cfg.num_attention_heads,
        "kv_heads": cfg.num_key_value_heads,
    }


def component_line(name: str, description: dict[str, Any]) -> str:
    """`  name: key value, ...; N tensors, X MB DTYPES` for an `info` command: the component's own
    keys first, then the `source_summary` keys it was merged with."""
    summary_keys = ("tensors", "bytes", "dtypes", "from")
    shape = ", ".join(f"{k} {v}" for k, v in description.items() if k not in summary_keys)
    d = description
    return f"  {name}: {shape}; {d['tensors']} tensors, {d['bytes'] / 1e6:.1f} MB {'/'.join(d['dtypes'])}"


def published_configs(package: str, variant: str) -> Path:
    """The published configs of `variant` that `package` ships as package data in `<package>.configs/<variant>/`,
    a diffusers folder without weights (model_index.json, transformer/config.json, ...), for full-size
    architecture checks and `info --variant`. `UsageError` naming the known variants for an unknown one."""
    root = Path(str(importlib.resources.files(f"{package}.configs")))
    known = sorted(p.name for p in root.iterdir() if (p / "model_index.json").is_file())
    if variant not in known:
        raise UsageError(
            f"{package}: no published configs for variant {variant!r}", hint=f"known variants: {', '.join(known)}"
        )
    return root / variant

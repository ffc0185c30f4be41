"""`dif weights stats MODEL`: per tensor of a checkpoint, its count, min, max, mean and how many
values are NaN or infinite (the load-time scan `dif.weights.bind.check_finite_weights` refuses
those; this command shows where they are), then what the file is: the model family its names say
(`dif.lora.families`), dtypes, bytes, the largest tensors, repeated shape patterns; for a LoRA its
dialect, kinds, ranks, alphas and targeted modules, for the denoiser and the text encoder
(`dif.lora.read_lora`); for a GGUF its architecture and the ggml type of every tensor.

MODEL is a .safetensors or .gguf file, a sharded index (.json), a component folder (transformer/)
or a diffusers folder, whose component folders are read in name order.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document, table


def open_sources(model: Path, variant: str | None) -> list[tuple[str, Any]]:
    """(component name or "", tensor source) of each weights file set under `model`."""
    from dif.errors import CheckpointError
    from dif.weights import open_component, open_index, open_safetensors
    from dif.weights.gguf import is_gguf, open_gguf

    if model.is_file():
        if is_gguf(model):
            return [("", open_gguf(model))]
        return [("", open_index(model) if model.suffix == ".json" else open_safetensors(model))]
    try:
        return [("", open_component(model, variant=variant))]
    except CheckpointError as direct:
        found = []
        for sub in sorted(p for p in model.iterdir() if p.is_dir()):
            try:
                found.append((sub.name, open_component(sub, variant=variant)))
            except CheckpointError:
                continue  # a folder without weights (tokenizer/, scheduler/)
        if not found:
            raise direct from None
        return found


LORA_SUFFIXES = (".lora_down.weight", ".lora_A.weight", ".lokr_w1", ".lokr_w1_a", ".hada_w1_a")


def describe_file(model: Path, sources: list[tuple[str, Any]]) -> dict[str, Any]:
    """What MODEL is, beyond its tensors: family, dtypes, bytes, largest tensors, shape patterns,
    and the LoRA / GGUF facts when it is one."""
    import re
    from collections import Counter

    from dif.lora import families_of, family_label, read_lora
    from dif.weights.gguf import GGUFFile

    names = [n for _, src in sources for n in src.names()]
    infos = [src.info(n) for _, src in sources for n in src.names()]
    families = families_of(names)
    patterns = Counter(re.sub(r"\.\d+\.", ".N.", i.name) + f" {list(i.shape)}" for i in infos)
    out: dict[str, Any] = {
        "family": family_label(families[0]) if families else None,
        "families": [family_label(f) for f in families],
        "dtypes": dict(Counter(i.dtype for i in infos).most_common()),
        "bytes": sum(i.nbytes for i in infos),
        "largest": [{"name": i.name, "shape": list(i.shape), "bytes": i.nbytes} for i in
                    sorted(infos, key=lambda i: -i.nbytes)[:5]],
        "repeated_shapes": {p: n for p, n in patterns.most_common(8) if n > 1},
    }  # fmt: skip
    if len(sources) == 1 and isinstance(sources[0][1], GGUFFile):
        g = sources[0][1]
        out["gguf"] = {
            "version": g.version,
            "architecture": g.architecture,
            "types": dict(Counter(g.stored_type(n) for n in g.names()).most_common()),
        }
    if model.is_file() and model.suffix == ".safetensors" and any(n.endswith(LORA_SUFFIXES) for n in names):
        lora = read_lora(model)
        out["lora"] = _lora_part(lora) | {"text_encoder_keys": len(lora.text_encoder)}
        te = lora.text_encoder_part
        out["lora"]["text_encoder"] = None if te is None else _lora_part(te)
    return out


def _lora_part(lora: Any) -> dict[str, Any]:
    """Dialect, kinds, module count, ranks, alphas, targeted modules and unknown keys of one part of a
    LoRA file (a `dif.lora.LoraFile`: the denoiser's, or its `text_encoder_part`)."""
    adapters = lora.adapters.values()
    return {
        "dialect": lora.dialect,
        "kinds": sorted({a.kind for a in adapters}),
        "modules": len(lora.adapters),
        "ranks": sorted({r for a in adapters if (r := lora.rank(a)) is not None}),
        "alphas": sorted({a for ad in adapters if (a := lora.alpha(ad)) is not None}),
        "targets": sorted(lora.adapters),
        "unknown_keys": list(lora.unknown),
    }


def _summary_lines(info: dict[str, Any]) -> list[str]:
    lines = [f"family: {info['family'] or 'not recognised'}; dtypes: "
             + ", ".join(f"{k} x{v}" for k, v in info["dtypes"].items()) + f"; {info['bytes']} bytes"]  # fmt: skip
    if "gguf" in info:
        g = info["gguf"]
        lines.append(f"GGUF v{g['version']} ({g['architecture'] or 'no architecture'}): "
                     + ", ".join(f"{k} x{v}" for k, v in g["types"].items()))  # fmt: skip
    if "lora" in info:
        parts = [("LoRA", info["lora"]), ("text-encoder LoRA", info["lora"]["text_encoder"])]
        for what, lo in parts:
            if lo is None or (what == "LoRA" and not lo["modules"] and info["lora"]["text_encoder"]):
                continue  # a file with text-encoder adapters only: no empty denoiser line
            targets = ", ".join(lo["targets"][:6]) + (" ..." if len(lo["targets"]) > 6 else "")
            lines.append(
                f"{what} ({lo['dialect']} dialect, {'/'.join(lo['kinds'])}): {lo['modules']} modules, rank "
                f"{'/'.join(map(str, lo['ranks'])) or '-'}, alpha {'/'.join(f'{a:g}' for a in lo['alphas']) or '-'}; "
                f"targets {targets}"
            )
    for pattern, n in list(info["repeated_shapes"].items())[:3]:
        lines.append(f"  x{n}  {pattern}")
    return lines


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


@click.group("weights")
def weights() -> None:
    """Look at a checkpoint's tensors."""


@weights.command("stats")
@click.argument("model", type=click.Path(exists=True, path_type=Path))
@click.option("--variant", help="Weight files to read, e.g. fp16 (diffusion_pytorch_model.fp16.safetensors).")
@click.option("--threads", type=click.IntRange(1, None), help="Scan threads (default: one per CPU core).")
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def stats(model: Path, variant: str | None, threads: int | None, as_json: bool) -> None:
    """Count, min, max, mean and non-finite values of every tensor in MODEL; its family, dtypes,
    bytes, largest tensors and repeated shapes; a LoRA's dialect, ranks, alphas and targets; a GGUF's
    tensor types."""
    from dif.weights.scan import tensor_stats

    start = time.perf_counter()
    rows = []
    sources = open_sources(model, variant)
    summary = describe_file(model, sources)
    for component, source in sources:
        for s in tensor_stats(source, threads=threads):
            rows.append((f"{component}/{s.name}" if component else s.name, s))
    seconds = time.perf_counter() - start
    bad = [(name, s) for name, s in rows if s.nonfinite]
    if as_json:
        tensors = [
            {
                "name": name,
                "file": s.file,
                "dtype": s.dtype,
                "shape": list(s.shape),
                "count": s.count,
                "min": s.min,
                "max": s.max,
                "mean": s.mean,
                "nan": s.nan,
                "inf": s.inf,
            }
            for name, s in rows
        ]
        data = {
            "model": str(model),
            "tensors": tensors,
            "nonfinite_tensors": len(bad),
            "summary": summary,
            "seconds": round(seconds, 4),
        }
        emit_document("weights.stats", data)
        return
    headers = ("tensor", "dtype", "shape", "count", "min", "max", "mean", "nan", "inf")
    cells = [
        (name, s.dtype, "x".join(map(str, s.shape)) or "scalar", s.count, _number(s.min), _number(s.max))
        + (_number(s.mean), s.nan, s.inf)
        for name, s in rows
    ]
    click.echo(table(headers, cells))
    verdict = f"{len(bad)} hold NaN / infinite values" if bad else "all finite"
    for line in _summary_lines(summary):
        click.echo(line)
    click.echo(f"{len(rows)} tensors, {sum(s.count for _, s in rows)} values: {verdict} ({seconds:.2f} s)")

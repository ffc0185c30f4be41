"""Tiny random-weight checkpoints in diffusers folder layout, as frontends embed them for demos and tests.

Where it sits: outside the pipeline; a frontend's scripts/make_default_checkpoint.py makes its
`default/` folder with it. The frontend supplies what is model-specific: the configs, the tensor
names and shapes (from its own program builders, `param_shapes`) and how each tensor is drawn
(`name_rng`, its own scales, `random_weight` for the rest). Everything is reproducible from numpy alone, byte for byte.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dif.ir.program import Program
from dif.serialize.diftensor import save_tensors

TensorFor = Callable[[str, tuple[int, ...]], np.ndarray]

WEIGHT_FILES = {"diffusers": "diffusion_pytorch_model.safetensors", "transformers": "model.safetensors"}
"""The weights file of a component, by the library model_index.json names for it."""


def param_shapes(*programs: Program) -> dict[str, tuple[int, ...]]:
    """Every parameter of `programs` by name with its shape (a later program wins on a shared name)."""
    out: dict[str, tuple[int, ...]] = {}
    for program in programs:
        out.update({p.name: p.type.shape for p in program.params})
    return out


def name_rng(name: str) -> np.random.Generator:
    """PCG64 seeded by the CRC-32 of a tensor's name: its values do not depend on the other tensors."""
    return np.random.Generator(np.random.PCG64(zlib.crc32(name.encode())))


def random_weight(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Float64 values for a tensor with no special role: unit normal for an embedding table
    (`*embed_tokens.weight`), else standard normal / sqrt(fan in) (the product of all axes but the
    first; a vector's length), so matrix products keep activations near unit scale."""
    if name.endswith("embed_tokens.weight"):
        return rng.standard_normal(shape)
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return rng.standard_normal(shape) / np.sqrt(fan_in)


def _write_json(path: Path, data: Any, *, ensure_ascii: bool = True) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=ensure_ascii) + "\n")


def write_diffusers_folder(
    out: Path,
    model_index: Mapping[str, Any],
    components: Mapping[str, tuple[Mapping[str, Any], Mapping[str, tuple[int, ...]]]],
    tensor_for: TensorFor,
    *,
    scheduler: Mapping[str, Any],
    tokenizer: Path,
    tokenizer_files: Sequence[str] = ("vocab.json", "merges.txt", "tokenizer_config.json"),
    tokenizer_config: Mapping[str, Any] | None = None,
) -> str:
    """Replace `out` with a diffusers folder: model_index.json; per component NAME -> (config,
    shapes), NAME/config.json and the weights file its library names in `model_index`
    (`WEIGHT_FILES`), each tensor `tensor_for(name, shape)`; scheduler/scheduler_config.json; and
    tokenizer/ with `tokenizer_files` copied from `tokenizer`, then, when `tokenizer_config` is
    given, tokenizer_config.json read from there and updated with it. Returns the line to print."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _write_json(out / "model_index.json", model_index)
    sizes = {}
    for name, (config, shapes) in components.items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        _write_json(folder / "config.json", config)
        tensors = {t: tensor_for(t, shape) for t, shape in sorted(shapes.items())}
        save_tensors(folder / WEIGHT_FILES[model_index[name][0]], tensors, {"format": "pt"}, dif_metadata=False)
        sizes[name] = sum(t.nbytes for t in tensors.values())
    (out / "scheduler").mkdir()
    _write_json(out / "scheduler" / "scheduler_config.json", scheduler)
    tok = out / "tokenizer"
    tok.mkdir()
    for file in tokenizer_files:
        shutil.copyfile(tokenizer / file, tok / file)
    if tokenizer_config is not None:
        config = json.loads((tokenizer / "tokenizer_config.json").read_text())
        _write_json(tok / "tokenizer_config.json", {**config, **tokenizer_config}, ensure_ascii=False)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return f"wrote {out}: {total / 1e6:.2f} MB ({', '.join(f'{k} {v / 1e6:.2f} MB' for k, v in sizes.items())})"


def script_main(
    argv: list[str] | None,
    *,
    description: str,
    default_out: Path,
    default_tokenizer: Path,
    make: Callable[[Path, Path], None],
) -> int:
    """The command line of a make_default_checkpoint.py script: `[OUT_DIR] [--tokenizer DIR]`, then
    `make(out, tokenizer)`; exit status 2 when DIR holds no Qwen tokenizer files."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out", nargs="?", type=Path, default=default_out)
    parser.add_argument("--tokenizer", type=Path, default=default_tokenizer)
    args = parser.parse_args(argv)
    if not (args.tokenizer / "vocab.json").is_file():
        print(f"no Qwen tokenizer files in {args.tokenizer} (pass --tokenizer DIR)", file=sys.stderr)
        return 2
    make(args.out, args.tokenizer)
    return 0

"""The setup stage of the full-size `dif bench` recipes: a random-weight diffusers folder of a published
architecture, written once (a folder that is already complete is left alone).

    python perf/reference/make_random_checkpoint.py --configs <dif_frontend_flux2>/configs/klein-9b \
        --tokenizer <dif_frontend_flux2>/default/tokenizer --out WORKDIR/models/klein-9b --device cuda

`--configs` holds the published model_index.json and each component's config (the frontends ship them as
package data, `configs/`, with their sources). Every model component is built by the class
model_index.json names (diffusers or transformers) with the library's own
random init, in bf16 on `--device`, and saved with `save_pretrained` (sharded safetensors + index: the real
layout dif and diffusers load). The tokenizer files are the real Qwen ones the frontend embeds. The folder
is written as OUT.partial and renamed when complete, so an interrupted run never leaves a folder that passes
for a checkpoint. Timing values from random weights are the same as from trained ones; images are noise.
torch, diffusers and transformers are needed here only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

COMPLETE = ".dif-random-checkpoint"  # marker file written last


def build_component(library: str, class_name: str, config: dict[str, Any], device: str) -> Any:
    """The model of one component, randomly initialised in bf16 on `device`."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 directly: no fp32 copy of a 9B model on the way
    try:
        with torch.device(device):
            if library == "diffusers":
                import diffusers

                return getattr(diffusers, class_name).from_config(config)
            import transformers

            cfg = transformers.AutoConfig.for_model(**config)
            return getattr(transformers, class_name)._from_config(cfg)
    finally:
        torch.set_default_dtype(previous)


def write_checkpoint(configs: Path, tokenizer: Path, out: Path, device: str) -> None:
    import torch

    index = json.loads((configs / "model_index.json").read_text())
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    shutil.copyfile(configs / "model_index.json", partial / "model_index.json")
    for name, spec in index.items():
        if name.startswith("_") or not (
            isinstance(spec, list) and len(spec) == 2 and all(isinstance(x, str) for x in spec)
        ):
            continue  # pipeline settings (is_distilled, text_encoder_select_layers, ...), not components
        library, class_name = spec
        t0 = time.perf_counter()
        if name == "tokenizer":
            shutil.copytree(tokenizer, partial / name)
        elif name == "scheduler":
            (partial / name).mkdir()
            shutil.copyfile(configs / name / "scheduler_config.json", partial / name / "scheduler_config.json")
        else:
            config = json.loads((configs / name / "config.json").read_text())
            model = build_component(library, class_name, config, device)
            model.save_pretrained(partial / name)
            params = sum(p.numel() for p in model.parameters())
            del model
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            print(f"{name}: {class_name}, {params / 1e9:.2f} B params", file=sys.stderr)
        print(f"{name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    (partial / COMPLETE).write_text(json.dumps({"configs": str(configs), "device": device}) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=Path, required=True, help="folder with model_index.json and configs")
    parser.add_argument("--tokenizer", type=Path, required=True, help="folder with the Qwen tokenizer files")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="where the random init runs (cuda is much faster)")
    args = parser.parse_args(argv)
    if (args.out / COMPLETE).is_file():
        print(f"{args.out}: present, left as it is", file=sys.stderr)
        return 0
    if not (args.tokenizer / "vocab.json").is_file():
        print(f"{args.tokenizer}: no Qwen tokenizer files (vocab.json)", file=sys.stderr)
        return 2
    write_checkpoint(args.configs, args.tokenizer, args.out, args.device)
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {args.out}: {total / 1e9:.2f} GB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The reference side of a `dif bench` recipe: what a diffusers user runs, prompt to saved PNG, in one process.

    python perf/reference/diffusers_generate.py --model DIR --prompt "..." --steps 4 --width 1024 --height 1024 \
        --device cuda --dtype bf16 --out out.png

Import, `DiffusionPipeline.from_pretrained` (the class model_index.json names: Flux2KleinPipeline,
Krea2Pipeline, ...), one generation, `Image.save`: nothing warmed, nothing cached between runs, so the wall
`dif bench` measures around this process compares with `dif flux2 generate` in a fresh process. torch and
diffusers are needed here only (perf/ is outside every dif distribution).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="diffusers folder")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guidance", type=float, default=None, help="guidance_scale (default: the pipeline's)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--image", type=Path, action="append", default=[], help="reference image (repeatable)")
    args = parser.parse_args(argv)

    import torch
    from diffusers import DiffusionPipeline

    dtype = getattr(torch, DTYPES[args.dtype])
    pipe = DiffusionPipeline.from_pretrained(args.model, torch_dtype=dtype).to(args.device)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {} if args.guidance is None else {"guidance_scale": args.guidance}
    if args.image:  # reference images (Flux2KleinPipeline / Flux2KleinKVPipeline `image=[...]`)
        from PIL import Image

        kwargs["image"] = [Image.open(p) for p in args.image]
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    image = pipe(
        prompt=args.prompt,
        num_inference_steps=args.steps,
        width=args.width,
        height=args.height,
        generator=generator,
        **kwargs,
    ).images[0]
    image.save(args.out)
    print(f"wrote {args.out} ({image.size[0]}x{image.size[1]})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

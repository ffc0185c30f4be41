"""Where a model loses its squares: each held-back square prompt drawn from a clean render of itself.

A diagnostic of the recipe (outside the package). For each of `shapes.held_out_prompts()`' square prompts,
the clean render (`shapes.draw_scene`, item i with random.Random(i)) is the init image of an img2img run at
`steps` and `strength` (the schedule's last `strength` share: at 4 steps, 0.25 starts from the render's
latent noised to the sampler's last sigma, 0.704, and runs one step; 0.5 from 0.877, two steps), and the
judge's shape classifier reads the result. If the squares survive a start at a low sigma but not at a high
one, the model finishes a square it is given and loses it in its own high-noise steps.

    python probe_squares.py [--model DIR] [--runs 4:0.25,4:0.5,16:0.25,16:0.5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import judge  # noqa: E402
import shapes  # noqa: E402


def probe(model: str | None, runs: list[tuple[int, float]], backend: str = "cpu") -> dict[str, Any]:
    """{"model", "runs": [{steps, strength, squares, of, fills}]}: how many square prompts stay squares."""
    from PIL import Image

    import dif

    pipe = dif.load(model, backend=backend)
    squares = [(i, item) for i, item in enumerate(shapes.held_out_prompts()) if item["shape"] == "square"]
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        inits = []
        for i, item in squares:
            path = Path(tmp) / f"{i:02d}.png"
            Image.fromarray(shapes.draw_scene(item, random.Random(i))).save(path)
            inits.append(path)
        for steps, strength in runs:
            fills, right = [], 0
            for (i, item), init in zip(squares, inits, strict=True):
                image = pipe(item["prompt"], seed=i, steps=steps, init_image=init, strength=strength).image
                verdict = judge.judge_item(np.asarray(image.convert("RGB")), item)
                right += verdict["shape"]
                fills.append(verdict["measured"].get("features", [0.0])[0])
            out.append({"steps": steps, "strength": strength, "squares": right, "of": len(squares),
                        "fills": [round(float(f), 3) for f in fills]})  # fmt: skip
            print(f"{steps} steps, strength {strength}: {right} of {len(squares)} squares", flush=True)
    return {"model": model or "embedded default", "backend": backend, "runs": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the embedded default)")
    ap.add_argument("--runs", default="4:0.25,4:0.5,16:0.25,16:0.5", help="steps:strength, comma-separated")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--out", type=Path, default=None, help="JSON report")
    a = ap.parse_args(argv)
    runs = [(int(s), float(t)) for s, t in (r.split(":") for r in a.runs.split(","))]
    report = probe(a.model, runs, a.backend)
    if a.out is not None:
        a.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

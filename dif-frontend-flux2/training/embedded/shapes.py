"""The synthetic data of the embedded demo model: flat coloured shapes on a plain background.

Training recipe stage 1 (outside the package): `images(...)` draws one shape of a colour in the left,
centre or right third; `caption(...)` phrases it with one of the training templates. Some
(colour, shape, position) combinations and some phrasings are held back: `held_out_prompts()` is what
the judge (`judge.py`) asks the trained model for, and none of it is in the training captions.

    python shapes.py OUT_DIR [--per-combo 30] [--size 256] [--seed 0]   # OUT_DIR/NNNN.png + .txt
"""

from __future__ import annotations

import argparse
import itertools
import random
from pathlib import Path

import numpy as np

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 200, 30),
}
SHAPES = ("circle", "square", "triangle")
POSITIONS = ("left", "centre", "right")
BACKGROUND = (255, 255, 255)

# "where" phrases by position; the judge's templates use other words around the same content words
WHERE = {"left": "on the left", "centre": "in the centre", "right": "on the right"}
WHERE_SIDE = {"left": "on the left side", "centre": "in the middle", "right": "on the right side"}
AT = {"left": "left", "centre": "middle", "right": "right"}

TRAIN_TEMPLATES = (
    "a {c} {s} {where}",
    "{Where}, a {c} {s}",
    "a {s} that is {c}, {where}",
    "a picture of a {c} {s} {where}",
    "one {c} {s}, placed {side}",
    "a {c} {s} at the {at} of the image",
    "the {s} is {c} and sits {where}",
)
HELD_OUT_TEMPLATES = (
    "there is a {c} {s} {side}",
    "draw a {c} {s} {where}",
    "{Where} there is a {c} {s}",
    "an image with a {c} {s} {side}",
    "please show a {s} in {c}, {where}",
    "a simple flat {c} {s}, {at}",
)


def held_out(colour: str, shape: str, position: str) -> bool:
    """Combinations kept out of training: one colour per (shape, position) pair, so every pair of
    attributes is still seen in training (9 of the 36)."""
    i, j, k = list(COLOURS).index(colour), SHAPES.index(shape), POSITIONS.index(position)
    return (i + j + k) % len(COLOURS) == 0


def combos(*, training: bool) -> list[tuple[str, str, str]]:
    """(colour, shape, position) of the training split (training=True) or the held-back one."""
    every = itertools.product(COLOURS, SHAPES, POSITIONS)
    return [c for c in every if held_out(*c) != training]


def caption(template: str, colour: str, shape: str, position: str) -> str:
    return template.format(
        c=colour, s=shape, where=WHERE[position], Where=WHERE[position].capitalize(), side=WHERE_SIDE[position],
        at=AT[position],
    )  # fmt: skip


def held_out_prompts() -> list[dict[str, str]]:
    """The judge's prompts: every held-back combination in every held-back phrasing (54)."""
    return [
        {"prompt": caption(t, *c), "colour": c[0], "shape": c[1], "position": c[2]}
        for c in combos(training=False)
        for t in HELD_OUT_TEMPLATES
    ]


def draw(colour: str, shape: str, position: str, rng: random.Random, size: int = 256) -> np.ndarray:
    """(size, size, 3) uint8: one flat shape about 0.28*size across, centred in its third (jittered)."""
    from PIL import Image, ImageDraw

    third = size / 3
    cx = third * (POSITIONS.index(position) + 0.5) + rng.uniform(-0.03, 0.03) * size
    cy = size / 2 + rng.uniform(-0.08, 0.08) * size
    r = size * 0.14 * rng.uniform(0.9, 1.1)
    im = Image.new("RGB", (size, size), BACKGROUND)
    pen = ImageDraw.Draw(im)
    fill = COLOURS[colour]
    if shape == "circle":
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif shape == "square":
        h = r * 0.9
        pen.rectangle((cx - h, cy - h, cx + h, cy + h), fill=fill)
    else:
        pen.polygon([(cx, cy - r), (cx + r, cy + 0.8 * r), (cx - r, cy + 0.8 * r)], fill=fill)
    return np.asarray(im)


def write_dataset(out: Path, *, per_combo: int = 30, size: int = 256, seed: int = 0) -> int:
    """OUT/NNNN.png + NNNN.txt for `per_combo` images of every training combination; returns the count."""
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    n = 0
    for c in combos(training=True):
        for _ in range(per_combo):
            Image.fromarray(draw(*c, rng, size)).save(out / f"{n:04d}.png")
            (out / f"{n:04d}.txt").write_text(caption(rng.choice(TRAIN_TEMPLATES), *c) + "\n")
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--per-combo", type=int, default=30)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(write_dataset(a.out, per_combo=a.per_combo, size=a.size, seed=a.seed), "images in", a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

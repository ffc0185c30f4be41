"""The synthetic data of the embedded demo model: one flat coloured shape on a plain background.

Training recipe stage 1 (outside the package). A scene is a colour (8), a shape (3), a position (the cell of
a 3x3 grid its centroid lies in: 9), a size (small / medium / large; medium is what a caption without a size
word means) and a background (white unless the caption names one; a named background is white, gray or one
of the eight colours, never the shape's own, so a white shape always has a named one). `draw` renders a
scene, `caption` phrases it: a sentence frame of `TRAIN_TEMPLATES` with one of several phrases for the
position and the background. Held back from training: 27 of the 216 (colour, shape, position) combinations
(one colour per (shape, position) pair, so every pair of attributes is still trained) and the sentence frames
of `HELD_OUT_TEMPLATES`; `held_out_prompts()` = the 27 in two held-back frames each = 54 judge prompts, none
a training caption. `held_out_prompts(vocabulary="v1")` is the first recipe's 54 (4 colours, 3 thirds, white),
the vocabulary the installed default was trained on.

    python shapes.py OUT_DIR [--per-combo 30] [--size 256] [--seed 0]   # OUT_DIR/NNNN.png + .txt (189 x N)
"""

from __future__ import annotations

import argparse
import itertools
import random
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

# the first four as in the first recipe (the installed default draws these); orange sits between red and yellow
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 200, 30),
    "orange": (240, 120, 25),
    "purple": (130, 50, 170),
    "white": (255, 255, 255),
    "black": (20, 20, 20),
}
GRAY = (128, 128, 128)  # a background colour only
PALETTE: dict[str, tuple[int, int, int]] = {**COLOURS, "gray": GRAY}  # every colour a pixel can be judged as
BACKGROUND = COLOURS["white"]  # the background when the caption names none
SHAPES = ("circle", "square", "triangle")
# row-major over the 3x3 grid; "left" is the middle-left cell, "top" the top-middle one
POSITIONS = ("top left", "top", "top right", "left", "centre", "right", "bottom left", "bottom", "bottom right")
CELL: dict[str, tuple[int, int]] = {p: divmod(i, 3) for i, p in enumerate(POSITIONS)}  # (row, column)
# radius (half the width of circles and triangles; squares are 1.8 r wide) as a share of the image side;
# medium is the first recipe's 0.14 +- 10 %; the ranges are apart so the judge can tell them by extent
SIZES: dict[str, tuple[float, float]] = {"small": (0.07, 0.09), "medium": (0.126, 0.154), "large": (0.18, 0.2)}
# how far (a share of the side) a centroid strays from its cell's centre. A few-step sampler of a flow model
# draws close to the mean of what a caption may show, and the decoded mean latent of squares spread over
# +-5 % of the side is a rounded blob (stop 24, probe_squares.py: from a true sigma-0.704 latent the stop-23
# model drew 13 of 18 held-back squares, from a true 0.877 one 2): 1 % keeps that mean a square
JITTER = 0.01

WHERE: dict[str, tuple[str, ...]] = {
    "top left": ("at the top left", "in the top left corner", "in the upper left corner"),
    "top": ("at the top", "at the top of the image", "near the top edge"),
    "top right": ("at the top right", "in the top right corner", "in the upper right corner"),
    "left": ("on the left", "on the left side", "at the left"),
    "centre": ("in the middle", "in the centre", "in the center", "at the centre"),
    "right": ("on the right", "on the right side", "at the right"),
    "bottom left": ("at the bottom left", "in the bottom left corner", "in the lower left corner"),
    "bottom": ("at the bottom", "at the bottom of the image", "near the bottom edge"),
    "bottom right": ("at the bottom right", "in the bottom right corner", "in the lower right corner"),
}
# how a named background is said: after the shape, or (the last) before the whole sentence
BACKGROUND_PHRASES = (
    " on {a} {b} background",
    " against {a} {b} background",
    ", with {a} {b} background",
    ", {b} background",
    "On {a} {b} background, ",
)
# {thing}: "a large orange circle"; {sz}: "small " / "large " / ""; {where}: a WHERE phrase; {bg}: "" or a
# background phrase (the last of BACKGROUND_PHRASES goes before the sentence instead)
TRAIN_TEMPLATES = (
    "{thing} {where}{bg}",
    "{Where}, {thing}{bg}",
    "a {sz}{s} that is {c}, {where}{bg}",
    "a picture of {thing} {where}{bg}",
    "one {sz}{c} {s}, placed {where}{bg}",
    "the {sz}{s} is {c} and sits {where}{bg}",
    "{thing}{bg}, {where}",
    "a {sz}{s}, coloured {c}, {where}{bg}",
    "an image of {thing} {where}{bg}",
    "{where}: {thing}{bg}",
    "a single {sz}{c} {s} {where}{bg}",
    "{thing}, drawn {where}{bg}",
    "a flat {sz}{c} {s} {where}{bg}",
    "{thing} is {where}{bg}",
)
HELD_OUT_TEMPLATES = (
    "there is {thing} {where}{bg}",
    "draw {thing} {where}{bg}",
    "{Where} there is {thing}{bg}",
    "an image with {thing} {where}{bg}",
    "please show a {sz}{s} in {c}, {where}{bg}",
    "a simple flat {sz}{c} {s}, {where}{bg}",
)


class Scene(NamedTuple):
    """What one image shows; `background_said`: whether its caption names the background (always when it
    is not white)."""

    colour: str
    shape: str
    position: str
    size: str = "medium"
    background: str = "white"
    background_said: bool = False


def held_out(colour: str, shape: str, position: str) -> bool:
    """Combinations kept out of training: one colour per (shape, position) pair (27 of the 216)."""
    i, j, k = list(COLOURS).index(colour), SHAPES.index(shape), POSITIONS.index(position)
    return (i + j + k) % len(COLOURS) == 0


def combos(*, training: bool) -> list[tuple[str, str, str]]:
    """(colour, shape, position) of the training split (training=True, 189) or the held-back one (27)."""
    every = itertools.product(COLOURS, SHAPES, POSITIONS)
    return [c for c in every if held_out(*c) != training]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def caption(template: str, scene: Scene, where: int = 0, phrase: int = 0) -> str:
    """`template` filled for `scene` with WHERE[position][where] and BACKGROUND_PHRASES[phrase] (when the
    background is said)."""
    c, s = scene.colour, scene.shape
    sz = "" if scene.size == "medium" else scene.size + " "
    spot = WHERE[scene.position][where % len(WHERE[scene.position])]
    bg = ""
    if scene.background_said or scene.background != "white":
        bg = BACKGROUND_PHRASES[phrase % len(BACKGROUND_PHRASES)].format(
            a=_article(scene.background), b=scene.background
        )
    before = bg.endswith(", ")
    text = template.format(
        thing=f"{_article(sz or c)} {sz}{c} {s}", sz=sz, c=c, s=s, where=spot, Where=spot.capitalize(),
        bg="" if before else bg,
    )  # fmt: skip
    return bg + text[0].lower() + text[1:] if before else text


def describe(text: str) -> Scene:
    """The scene a caption names (the inverse of `caption`; a missing colour, shape or position is "")."""
    words = re.findall(r"[a-z]+", text.lower())
    named_bg = [w for w, nxt in itertools.pairwise(words) if nxt == "background" and w in PALETTE]
    colour = next((w for i, w in enumerate(words) if w in COLOURS and words[i + 1 : i + 2] != ["background"]), "")
    shape = next((w for w in words if w in SHAPES), "")
    row = "top" if {"top", "upper"} & set(words) else "bottom" if {"bottom", "lower"} & set(words) else ""
    col = "left" if "left" in words else "right" if "right" in words else ""
    middle = {"middle", "centre", "center"} & set(words)
    position = f"{row} {col}".strip() or ("centre" if middle else "")
    size = "small" if "small" in words else "large" if "large" in words else "medium"
    return Scene(colour, shape, position, size, named_bg[0] if named_bg else "white", bool(named_bg))


def held_out_prompts(vocabulary: str = "v2") -> list[dict[str, str]]:
    """The judge's prompts: each held-back combination in two held-back frames (54), the k-th prompt with
    size small / medium / large by k % 3 and a named background (gray, black, blue, white, green, ...: never
    the shape's colour) when k is odd or the shape white. Each: prompt, colour, shape, position, size,
    background, vocabulary. vocabulary="v1": the first recipe's 54 prompts (the installed default's)."""
    if vocabulary == "v1":
        return _v1_held_out_prompts()
    named = ("gray", "black", "blue", "white", "green", "red", "purple", "orange", "yellow")
    out = []
    for n, (colour, shape, position) in enumerate(combos(training=False)):
        for t in range(2):
            k = 2 * n + t
            size = ("small", "medium", "large")[k % 3]
            if k % 2 or colour == "white":
                background = next(b for j in range(k // 2, k // 2 + 3) if (b := named[j % len(named)]) != colour)
                scene = Scene(colour, shape, position, size, background, True)
            else:
                scene = Scene(colour, shape, position, size)
            template = HELD_OUT_TEMPLATES[k % len(HELD_OUT_TEMPLATES)]
            text = caption(template, scene, where=k // 2, phrase=k // 3)
            out.append({"prompt": text, **{f: getattr(scene, f) for f in Scene._fields[:5]}, "vocabulary": "v2"})
    return out


def training_scenes(*, per_combo: int = 30, seed: int = 0) -> list[tuple[Scene, str]]:
    """(scene, caption) for `per_combo` images of every training combination, deterministic by `seed`: size
    uniform; background white unsaid 40 %, gray 15 %, else one of the other allowed backgrounds, named (a
    white shape: gray 30 %, else one of the seven colours); a random training frame and phrases."""
    rng = random.Random(seed)
    out = []
    for colour, shape, position in combos(training=True):
        for _ in range(per_combo):
            size = rng.choice(tuple(SIZES))
            u = rng.random()
            if colour != "white" and u < 0.4:
                scene = Scene(colour, shape, position, size)
            else:
                gray = u < (0.55 if colour != "white" else 0.3)
                background = "gray" if gray else rng.choice([b for b in PALETTE if b not in (colour, "gray")])
                scene = Scene(colour, shape, position, size, background, True)
            where, phrase = rng.randrange(len(WHERE[position])), rng.randrange(len(BACKGROUND_PHRASES))
            text = caption(rng.choice(TRAIN_TEMPLATES), scene, where, phrase)
            out.append((scene, text))
    return out


def layout(scene: Scene, rng: random.Random, side: int = 256) -> tuple[float, float, float]:
    """(x, y, r) in pixels: the shape's centroid (its cell's centre jittered by JITTER of the side, then moved
    inwards until the shape lies 2 % of the side inside the image, which keeps it in its cell) and radius."""
    row, col = CELL[scene.position]
    r = rng.uniform(*SIZES[scene.size])
    x = (col + 0.5) / 3 + rng.uniform(-JITTER, JITTER)
    y = (row + 0.5) / 3 + rng.uniform(-JITTER, JITTER)
    half_x = 0.9 * r if scene.shape == "square" else r
    up, down = {"square": (0.9 * r, 0.9 * r), "triangle": (1.2 * r, 0.6 * r)}.get(scene.shape, (r, r))
    m = 0.02
    x = min(max(x, m + half_x), 1 - m - half_x)
    y = min(max(y, m + up), 1 - m - down)
    return x * side, y * side, r * side


def draw(colour: str, shape: str, position: str, rng: random.Random, side: int = 256, *, size: str = "medium",
         background: str = "white") -> np.ndarray:  # fmt: skip
    """(side, side, 3) uint8: one flat shape of `colour` (its centroid in `position`'s cell) on `background`."""
    from PIL import Image, ImageDraw

    if colour == background:
        raise ValueError(f"a {colour} shape on a {background} background is invisible: name another background")
    cx, cy, r = layout(Scene(colour, shape, position, size, background), rng, side)
    im = Image.new("RGB", (side, side), PALETTE[background])
    pen = ImageDraw.Draw(im)
    fill = COLOURS[colour]
    if shape == "circle":
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif shape == "square":
        h = r * 0.9
        pen.rectangle((cx - h, cy - h, cx + h, cy + h), fill=fill)
    else:  # the vertices' mean (the centroid) at (cx, cy)
        top = cy - 0.2 * r
        pen.polygon([(cx, top - r), (cx + r, top + 0.8 * r), (cx - r, top + 0.8 * r)], fill=fill)
    return np.asarray(im)


def draw_scene(scene: Scene | dict, rng: random.Random, side: int = 256) -> np.ndarray:
    """`draw` of a Scene or of a prompt item of `held_out_prompts`."""
    s = scene if isinstance(scene, Scene) else Scene(*(scene[f] for f in Scene._fields[:5]))
    return draw(s.colour, s.shape, s.position, rng, side, size=s.size, background=s.background)


def write_dataset(out: Path, *, per_combo: int = 30, size: int = 256, seed: int = 0) -> int:
    """OUT/NNNN.png + NNNN.txt for `per_combo` images of every training combination (`size`: the image side);
    returns the count (189 x per_combo)."""
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + 1)  # the drawing jitter; training_scenes draws the scenes from `seed`
    items = training_scenes(per_combo=per_combo, seed=seed)
    for n, (scene, text) in enumerate(items):
        Image.fromarray(draw_scene(scene, rng, size)).save(out / f"{n:04d}.png")
        (out / f"{n:04d}.txt").write_text(text + "\n")
    return len(items)


# The first recipe's held-back prompts (4 colours, left / centre / right thirds, white): what the installed
# default was trained to read, kept so that it can still be judged.
V1_COLOURS = ("red", "green", "blue", "yellow")
V1_POSITIONS = ("left", "centre", "right")
V1_PALETTE = {**{c: COLOURS[c] for c in V1_COLOURS}, "white": COLOURS["white"]}  # what its judge labelled
_V1_WHERE = {"left": "on the left", "centre": "in the centre", "right": "on the right"}
_V1_SIDE = {"left": "on the left side", "centre": "in the middle", "right": "on the right side"}
_V1_AT = {"left": "left", "centre": "middle", "right": "right"}
_V1_HELD_OUT_TEMPLATES = (
    "there is a {c} {s} {side}",
    "draw a {c} {s} {where}",
    "{Where} there is a {c} {s}",
    "an image with a {c} {s} {side}",
    "please show a {s} in {c}, {where}",
    "a simple flat {c} {s}, {at}",
)


def _v1_held_out_prompts() -> list[dict[str, str]]:
    every = itertools.product(enumerate(V1_COLOURS), enumerate(SHAPES), enumerate(V1_POSITIONS))
    held = [(c, s, p) for (i, c), (j, s), (k, p) in every if (i + j + k) % len(V1_COLOURS) == 0]
    return [
        {"prompt": t.format(c=c, s=s, where=_V1_WHERE[p], Where=_V1_WHERE[p].capitalize(), side=_V1_SIDE[p],
                            at=_V1_AT[p]),
         "colour": c, "shape": s, "position": p, "size": "medium", "background": "white", "vocabulary": "v1"}
        for c, s, p in held
        for t in _V1_HELD_OUT_TEMPLATES
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--per-combo", type=int, default=30, help="images per training combination (189 of them)")
    ap.add_argument("--size", type=int, default=256, help="image side in pixels")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(write_dataset(a.out, per_combo=a.per_combo, size=a.size, seed=a.seed), "images in", a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

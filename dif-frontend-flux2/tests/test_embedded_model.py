"""The embedded demo model draws what it is told: the judge of `training/embedded/` on synthetic images
(it must reject a wrong colour, third or shape) and on held-back prompts drawn by the embedded default."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import numpy as np

RECIPE = Path(__file__).resolve().parents[1] / "training" / "embedded"


def _module(name: str):  # type: ignore[no-untyped-def]
    if str(RECIPE) not in sys.path:
        sys.path.insert(0, str(RECIPE))
    spec = importlib.util.spec_from_file_location(f"embedded_{name}", RECIPE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


judge = _module("judge")
shapes = _module("shapes")


def test_held_out_prompts_are_not_training_captions() -> None:
    prompts = shapes.held_out_prompts()
    assert len(prompts) >= 50
    train = {shapes.caption(t, *c) for t in shapes.TRAIN_TEMPLATES for c in shapes.combos(training=True)}
    assert not train & {p["prompt"] for p in prompts}
    assert not set(shapes.combos(training=True)) & {(p["colour"], p["shape"], p["position"]) for p in prompts}


def test_judge_accepts_clean_renders_and_rejects_wrong_attributes() -> None:
    rng = random.Random(7)
    for colour, shape, position in shapes.combos(training=False):
        img = shapes.draw(colour, shape, position, rng)
        v = judge.judge_image(img, colour, shape, position)
        assert v["colour"] and v["position"] and v["shape"], (colour, shape, position, v)
        other_colour = next(c for c in shapes.COLOURS if c != colour)
        assert not judge.judge_image(img, other_colour, shape, position)["colour"]
        other_third = next(p for p in shapes.POSITIONS if p != position)
        assert not judge.judge_image(img, colour, shape, other_third)["position"]
        for other_shape in (s for s in shapes.SHAPES if s != shape):
            assert not judge.judge_image(img, colour, other_shape, position)["shape"]


def test_judge_rejects_noise_blank_and_scattered_colour() -> None:
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    blank = np.full((256, 256, 3), 255, np.uint8)
    speckle = blank.copy()
    speckle[rng.random((256, 256)) < 0.08] = shapes.COLOURS["red"]  # red everywhere, no region
    for img in (noise, blank, speckle):
        v = judge.judge_image(img, "red", "circle", "left")
        assert not v["colour"] and not v["position"] and not v["shape"]


def test_judge_rejects_a_blurred_out_shape_of_the_wrong_kind() -> None:
    img = shapes.draw("green", "square", "right", random.Random(3))
    assert judge.classify_shape(judge.largest_region(judge.label_pixels(img) == 1)) == "square"
    assert not judge.judge_image(img, "green", "triangle", "right")["shape"]


SAMPLE = (0, 9, 16, 23, 30, 41, 47, 52)


def test_embedded_default_draws_most_held_back_prompts() -> None:
    """A sample of the judge's prompts (held-back combinations and phrasings) at the default size and
    settings, each at its judge seed: the trained default draws the named colour in the named third on most
    of them (random weights: none). The issue's bar (>= 90 % over all 54) is `judge.py`'s to measure."""
    import dif

    prompts = shapes.held_out_prompts()
    right = []
    for index in SAMPLE:
        item = prompts[index]
        image = np.asarray(_pipe(dif)(item["prompt"], seed=index).image.convert("RGB"))
        v = judge.judge_image(image, item["colour"], item["shape"], item["position"])
        right.append(bool(v["colour"] and v["position"]))
    assert sum(right) > len(SAMPLE) // 2, dict(zip(SAMPLE, right, strict=True))


_PIPE: list = []


def _pipe(dif):  # type: ignore[no-untyped-def]
    if not _PIPE:
        _PIPE.append(dif.load(backend="cpu"))
    return _PIPE[0]

"""The embedded demo model draws what it is told: the data and judge of `training/embedded/` on synthetic
images (the judge must accept clean renders of every kind of scene and reject a wrong colour, position,
shape, noise and blanks; the held-back prompts are new phrasings of new combinations) and held-back prompts
of the vocabulary it was trained on drawn by the embedded default."""

from __future__ import annotations

import importlib.util
import itertools
import random
import sys
from pathlib import Path

import numpy as np
import pytest

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
SCENE_FIELDS = ("colour", "shape", "position", "size", "background")


def _covering_scenes():  # type: ignore[no-untyped-def]
    """Every (colour, shape, position) once, sizes and backgrounds cycled (never the shape's colour): every
    colour, position, size and background, and every colour at every position."""
    for k, (c, s, p) in enumerate(itertools.product(shapes.COLOURS, shapes.SHAPES, shapes.POSITIONS)):
        backgrounds = [b for b in shapes.PALETTE if b != c]
        yield shapes.Scene(c, s, p, tuple(shapes.SIZES)[k % 3], backgrounds[k % len(backgrounds)], True)


def test_held_out_prompts_are_not_training_captions() -> None:
    prompts = shapes.held_out_prompts()
    assert len(prompts) >= 54
    assert not set(shapes.HELD_OUT_TEMPLATES) & set(shapes.TRAIN_TEMPLATES)
    train = shapes.training_scenes(per_combo=30, seed=0)
    assert not {p["prompt"] for p in prompts} & {text for _, text in train}
    held = {(p["colour"], p["shape"], p["position"]) for p in prompts}
    assert held == set(shapes.combos(training=False))
    assert not held & {scene[:3] for scene, _ in train}
    for p in prompts:  # a new phrasing too: no training frame with any phrase variant says the same
        scene = shapes.Scene(*(p[f] for f in SCENE_FIELDS), True)
        for variant in (scene, scene._replace(background_said=False)):
            said = {
                shapes.caption(t, variant, w, b) for t in shapes.TRAIN_TEMPLATES for w in range(4) for b in range(5)
            }
            assert p["prompt"] not in said


def test_held_out_prompts_cover_the_vocabulary() -> None:
    prompts = shapes.held_out_prompts()
    assert {p["colour"] for p in prompts} == set(shapes.COLOURS)
    assert {p["position"] for p in prompts} == set(shapes.POSITIONS)
    assert {p["size"] for p in prompts} == {"small", "medium", "large"}
    assert {"white", "gray", "black", "blue"} <= {p["background"] for p in prompts}
    assert any("background" not in p["prompt"] for p in prompts)  # the background is optional to say
    assert all(p["background"] != p["colour"] for p in prompts)
    for p in prompts:  # each prompt says what the judge asks for
        assert tuple(shapes.describe(p["prompt"]))[:5] == tuple(p[f] for f in SCENE_FIELDS), p


def test_v1_prompts_are_the_first_recipe() -> None:
    v1 = shapes.held_out_prompts(vocabulary="v1")
    assert len(v1) == 54
    assert v1[0]["prompt"] == "there is a red circle on the left side"
    assert v1[-1]["prompt"] == "a simple flat yellow square, left"
    assert {p["colour"] for p in v1} == set(shapes.V1_COLOURS)
    assert {p["position"] for p in v1} == set(shapes.V1_POSITIONS)


def test_training_captions_name_their_scene_and_the_dataset_is_deterministic(tmp_path: Path) -> None:
    scenes = shapes.training_scenes(per_combo=30, seed=0)
    assert len(scenes) == 189 * 30
    assert {t for _, t in scenes} != {t for _, t in shapes.training_scenes(per_combo=30, seed=1)}
    for scene, text in scenes:
        assert shapes.describe(text) == scene, text
        assert scene.background != scene.colour and (scene.background_said or scene.background == "white")
    assert {s.size for s, _ in scenes} == set(shapes.SIZES)
    assert {s.background for s, _ in scenes} == set(shapes.PALETTE)
    assert len({t for _, t in scenes}) > 0.9 * len(scenes)  # free phrasing: captions rarely repeat
    a, b = tmp_path / "a", tmp_path / "b"
    assert shapes.main([str(a), "--per-combo", "1", "--size", "64", "--seed", "3"]) == 0
    assert shapes.write_dataset(b, per_combo=1, size=64, seed=3) == 189
    for f in sorted(a.iterdir()):
        assert f.read_bytes() == (b / f.name).read_bytes(), f.name


def test_judge_accepts_clean_renders_of_every_kind_of_scene() -> None:
    rng = random.Random(7)
    for scene in _covering_scenes():
        img = shapes.draw_scene(scene, rng)
        v = judge.judge_image(img, *scene[:3], size=scene.size, background=scene.background)
        assert all(v[k] for k in ("colour", "position", "shape", "size", "background")), (scene, v)
        assert v["measured"]["cell"] == scene.position, (scene, v)  # the centroid is in the scene's own cell


def test_judge_rejects_a_wrong_colour_position_shape_or_size() -> None:
    rng = random.Random(8)
    for k, scene in enumerate(_covering_scenes()):
        img = shapes.draw_scene(scene, rng)
        c, s, p, size, bg = scene[:5]
        wrong_colour = next(x for x in itertools.islice(itertools.cycle(shapes.COLOURS), k, None) if x not in (c, bg))
        assert not judge.judge_image(img, wrong_colour, s, p, size=size, background=bg)["colour"]
        wrong_shape = shapes.SHAPES[(shapes.SHAPES.index(s) + 1 + k % 2) % 3]
        assert not judge.judge_image(img, c, wrong_shape, p, size=size, background=bg)["shape"]
        wrong_size = next(x for x in shapes.SIZES if x != size)
        assert not judge.judge_image(img, c, s, p, size=wrong_size, background=bg)["size"]
        wrong_place = [q for q in shapes.POSITIONS if not judge.position_ok(q, *shapes.CELL[p])]
        q = wrong_place[k % len(wrong_place)]
        assert not judge.judge_image(img, c, s, q, size=size, background=bg)["position"], (scene, q)


def test_judge_positions_are_cells_corners_and_thirds() -> None:
    ok = {q: {p for p in shapes.POSITIONS if judge.position_ok(q, *shapes.CELL[p])} for q in shapes.POSITIONS}
    assert ok["left"] == {"top left", "left", "bottom left"}  # one word: its third, any row
    assert ok["top"] == {"top left", "top", "top right"}
    assert ok["top left"] == {"top left"} and ok["bottom right"] == {"bottom right"}  # a corner: its cell
    assert ok["centre"] == {"centre"}
    img = shapes.draw("blue", "circle", "top left", random.Random(1), background="gray")
    for corner in ("top right", "bottom left", "bottom right"):
        assert not judge.judge_image(img, "blue", "circle", corner, background="gray")["position"]
    assert judge.judge_image(img, "blue", "circle", "left", background="gray")["position"]


def test_judge_rejects_noise_blank_and_scattered_colour() -> None:
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    for background in ("white", "gray", "black"):
        blank = np.full((256, 256, 3), shapes.PALETTE[background], np.uint8)
        speckle = blank.copy()
        speckle[rng.random((256, 256)) < 0.08] = shapes.COLOURS["red"]  # red everywhere, no region
        for img in (noise, blank, speckle):
            v = judge.judge_image(img, "red", "circle", "left", background=background)
            assert not v["colour"] and not v["position"] and not v["shape"] and not v["size"]
    filled = np.full((256, 256, 3), shapes.COLOURS["red"], np.uint8)  # the colour as the background
    assert not judge.judge_image(filled, "red", "circle", "centre")["colour"]
    with pytest.raises(ValueError, match="one colour"):
        judge.judge_image(filled, "red", "circle", "centre", background="red")


def test_judge_tells_small_shapes_apart() -> None:
    rng = random.Random(3)
    for shape in shapes.SHAPES:
        for position in ("top left", "bottom", "right"):
            img = shapes.draw("purple", shape, position, rng, size="small", background="white")
            region = judge.largest_region(judge.label_pixels(img) == list(shapes.PALETTE).index("purple"))
            assert judge.classify_shape(region) == shape and judge.size_of(region) == "small"


def test_the_transformer_recipe_reads_the_new_captions() -> None:
    train_transformer = _module("train_transformer")  # its held right / wrong / colour caption evaluation
    text = "On a blue background, a small red circle in the upper left corner"
    assert train_transformer.content(text) == ("red", "top left", "circle")


SAMPLE = (0, 9, 16, 23, 30, 41, 47, 52)


def test_embedded_default_draws_most_held_back_prompts() -> None:
    """A sample of the first recipe's judge prompts (held-back combinations and phrasings of the vocabulary
    the installed default was trained on: 4 colours, 3 thirds) at the default size and settings, each at its
    judge seed: the trained default draws the named colour in the named third on most of them (random
    weights: none). The issue's bar over the full vocabulary is `judge.py`'s to measure."""
    import dif

    prompts = shapes.held_out_prompts(vocabulary="v1")
    right = []
    for index in SAMPLE:
        item = prompts[index]
        image = np.asarray(_pipe(dif)(item["prompt"], seed=index).image.convert("RGB"))
        v = judge.judge_item(image, item)
        right.append(bool(v["colour"] and v["position"]))
    assert sum(right) > len(SAMPLE) // 2, dict(zip(SAMPLE, right, strict=True))


_PIPE: list = []


def _pipe(dif):  # type: ignore[no-untyped-def]
    if not _PIPE:
        _PIPE.append(dif.load(backend="cpu"))
    return _PIPE[0]

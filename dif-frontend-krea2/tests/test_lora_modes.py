"""Krea 2 LoRA through the product path, both modes, on a tiny fp32 checkpoint (in bf16 merging rounds
W + delta to bf16 and the side GEMM does not, so the two differ by that rounding):
`dif krea2 generate --lora FILE[:SCALE]` with
--lora-mode merged, unmerged and auto draws the same image (up to the last rounding), the mode and
its reason are in the `--json` document and in the denoiser's plan decisions; `dif.load(...,
lora=..., lora_swappable=True)` runs unmerged and `set_loras` swaps adapters and scales with no
program built again, each swap matching a fresh merged load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.errors import UsageError
from dif.serialize.diftensor import save_tensors
from dif.weights import open_component

pytestmark = pytest.mark.oracle  # the tiny fp32 checkpoint is made with diffusers
cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
COMMON = ["-p", "a fox", "-W", "32", "-H", "32", "--seed", "5", "--steps", "2"]
SETTINGS = dict(width=32, height=32, seed=5, steps=2)


def make_lora(root: Path, path: Path, seed: int, rank: int = 4) -> Path:
    """A kohya-style LoRA (flattened diffusers names, alpha = rank) on every linear of the model at `root`."""
    source = open_component(root / "transformer")
    rng = np.random.default_rng(seed)
    t = {}
    for name in source.names():
        if name.endswith(".weight") and len(source.info(name).shape) == 2:
            out, inp = source.info(name).shape
            key = "lora_unet_" + name[: -len(".weight")].replace(".", "_")
            t[f"{key}.lora_down.weight"] = rng.standard_normal((rank, inp)).astype(np.float32)
            t[f"{key}.lora_up.weight"] = rng.standard_normal((out, rank)).astype(np.float32)
            t[f"{key}.alpha"] = np.array(float(rank), np.float32)
    save_tensors(path, t, dif_metadata=False)
    return path


def pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int16)


def generate(root: Path, tmp_path: Path, tag: str, *extra: str) -> tuple[np.ndarray, dict]:  # type: ignore[type-arg]
    out = tmp_path / f"{tag}.png"
    args = ["krea2", "generate", "-m", str(root), *COMMON, *extra, "-o", str(out), "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return pixels(out), json.loads(result.output)["data"]


def test_cli_modes_draw_the_same_image_and_say_why(tiny_checkpoints, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tiny_checkpoints["turbo"]
    lora = make_lora(root, tmp_path / "a.safetensors", 1)
    plain, plain_doc = generate(root, tmp_path, "plain")
    assert "lora" not in plain_doc["settings"]  # no adapter: nothing decided
    images, docs = {}, {}
    for tag, extra in (
        ("merged", ["--lora-mode", "merged"]),
        ("unmerged", ["--lora-mode", "unmerged"]),
        ("auto", []),
        ("swappable", ["--lora-swappable"]),
    ):
        images[tag], docs[tag] = generate(root, tmp_path, tag, "--lora", f"{lora}:0.05", *extra)
    assert np.abs(images["merged"] - plain).max() > 2  # the LoRA matters
    for tag in ("unmerged", "auto", "swappable"):
        assert np.abs(images[tag] - images["merged"]).max() <= 1, tag  # the same image up to the last rounding
    modes = {tag: (d["settings"]["lora"]["requested"], d["settings"]["lora"]["mode"]) for tag, d in docs.items()}
    assert modes == {
        "merged": ("merged", "merged"),
        "unmerged": ("unmerged", "unmerged"),
        "auto": ("auto", "merged"),
        "swappable": ("auto", "unmerged"),
    }
    assert "fixed for the pipeline's life" in docs["auto"]["settings"]["lora"]["why"]
    assert "swapping asked for" in docs["swappable"]["settings"]["lora"]["why"]
    assert docs["auto"]["settings"]["model"].endswith("+ LoRA a.safetensors@0.05")
    assert docs["swappable"]["settings"]["model"].endswith("+ LoRA (unmerged) a.safetensors@0.05")


def test_cli_refuses_merged_and_swappable(tiny_checkpoints, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tiny_checkpoints["turbo"]
    lora = make_lora(root, tmp_path / "a.safetensors", 1)
    out = tmp_path / "o.png"
    args = [
        "krea2",
        "generate",
        "-m",
        str(root),
        *COMMON,
        "--lora",
        str(lora),
        "--lora-mode",
        "merged",
        "--lora-swappable",
    ]
    result = CliRunner().invoke(cli, [*args, "-o", str(out)])
    assert result.exit_code != 0 and not out.exists()
    assert "cannot swap" in result.output and "Traceback" not in result.output


def test_set_loras_swaps_without_rebuilding(tiny_checkpoints, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import dif
    import dif_frontend_krea2.pipeline as pipeline_module

    root = tiny_checkpoints["turbo"]
    a, b = make_lora(root, tmp_path / "a.safetensors", 1), make_lora(root, tmp_path / "b.safetensors", 2, rank=8)
    builds: list[str] = []
    for name in ("build_denoiser", "build_text_fusion"):
        real = getattr(pipeline_module, name)
        monkeypatch.setattr(pipeline_module, name, lambda *a_, _r=real, _n=name, **k: builds.append(_n) or _r(*a_, **k))
    pipe = dif.load(root, lora=[(a, 0.05)], lora_swappable=True)
    first = pipe("a fox", **SETTINGS).run.pixels.astype(np.int16)
    assert sorted(builds) == ["build_denoiser", "build_text_fusion"]
    # the decision is the first of the denoiser's plan decisions (pipeline internals: no public plan view)
    plans = {e.name: e.plan for e in pipe.pipeline._programs._entries.values()}
    assert plans["krea2_denoiser"].decisions[0].what.startswith("lora: unmerged (auto)")
    assert plans["krea2_text_fusion"].decisions[0].what.startswith("lora: unmerged (auto)")
    for swap in ([(b, -0.04)], [], [(a, 0.05), (b, 0.02)]):
        pipe.set_loras(swap)
        before = len(builds)
        run = pipe("a fox", **SETTINGS).run
        got = run.pixels.astype(np.int16)
        assert len(builds) == before, f"a swap built a program again: {builds[before:]}"
        assert run.settings["lora"]["adapters"] == [f"{Path(f).name}@{w:g}" for f, w in swap]  # the set now
        merged = dif.load(root, lora=swap, lora_mode="merged")("a fox", **SETTINGS).run.pixels
        assert np.abs(got - merged.astype(np.int16)).max() <= 1, swap
        if swap:
            assert np.abs(got - first).max() > 2
    with pytest.raises(UsageError, match="lora_mode='unmerged'"):
        dif.load(root, lora=[(a, 0.05)]).set_loras([(b, 1.0)])  # auto with a fixed set: merged

"""Krea 2 components as single files: the tiny checkpoint's transformer (under ComfyUI's
`diffusion_model.` prefix, and as a GGUF), VAE and text encoder, each one file, render the same
pixels as the folder; a transformer file with no folder needs the other two and configs that fit
(the published ones are checked against the file's shapes, on full-size meta programs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.errors import CheckpointError
from dif.serialize.diftensor import save_tensors
from dif.weights import TensorInfo, TensorSource, open_component
from dif_frontend_krea2.weights import _check_transformer_shapes, open_checkpoint

pytestmark = pytest.mark.oracle
cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
COMMON = ["-p", "a red kite", "-W", "32", "-H", "32", "--seed", "3", "--steps", "2"]


def write(folder: Path, component: str, path: Path, prefix: str = "", config: bool = False) -> Path:
    src = open_component(folder / component)
    meta = {"config": json.dumps(json.loads((folder / component / "config.json").read_text()))} if config else None
    save_tensors(path, {prefix + n: np.array(src[n]) for n in src.names()}, meta, dif_metadata=False)
    return path


def write_gguf(folder: Path, path: Path) -> Path:
    gguf = pytest.importorskip("gguf")
    src = open_component(folder / "transformer")
    writer = gguf.GGUFWriter(str(path), arch="krea2")
    for n in src.names():
        writer.add_tensor(n, np.array(src[n], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def render(args: list[str], out: Path) -> np.ndarray:
    from PIL import Image

    result = CliRunner().invoke(cli, ["krea2", "generate", *args, *COMMON, "-o", str(out)])
    assert result.exit_code == 0, result.output
    with Image.open(out) as im:
        return np.asarray(im.convert("RGB"))


def test_single_files_render_like_the_folder(tiny_checkpoints, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = tiny_checkpoints["turbo"]
    loose = tmp_path / "loose"
    loose.mkdir()
    t = write(folder, "transformer", loose / "krea2.safetensors", prefix="diffusion_model.")
    v = write(folder, "vae", loose / "vae.safetensors")
    te = write(folder, "text_encoder", loose / "te.safetensors")
    reference = render(["-m", str(folder)], tmp_path / "ref.png")
    swapped = ["-m", str(folder), "--transformer", str(t), "--vae", str(v), "--text-encoder", str(te)]
    assert np.array_equal(render(swapped, tmp_path / "a.png"), reference)
    g = write_gguf(folder, loose / "krea2-f32.gguf")
    assert np.array_equal(render(["-m", str(folder), "--transformer", str(g)], tmp_path / "b.png"), reference)
    # a transformer file inside a copy of the folder: the folder supplies the rest
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    inside = shutil.copy(t, copy / "krea2.safetensors")
    assert np.array_equal(render(["-m", str(inside)], tmp_path / "c.png"), reference)


def test_transformer_file_alone_is_refused(tiny_checkpoints, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    t = write(tiny_checkpoints["turbo"], "transformer", tmp_path / "krea2.safetensors")
    out = tmp_path / "o.png"
    result = CliRunner().invoke(cli, ["krea2", "generate", "-m", str(t), *COMMON, "-o", str(out)])
    assert result.exit_code != 0 and not out.exists() and "Traceback" not in result.output
    assert "needs --text-encoder FILE and --vae FILE" in result.output
    # with the others, but no config: the tiny transformer does not fit the published Turbo configs
    v = write(tiny_checkpoints["turbo"], "vae", tmp_path / "vae.safetensors")
    te = write(tiny_checkpoints["turbo"], "text_encoder", tmp_path / "te.safetensors")
    with pytest.raises(CheckpointError, match="krea2.safetensors: the transformer .* does not fit the configs"):
        open_checkpoint(t, vae_file=v, text_encoder_file=te)


def test_original_naming_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "orig.safetensors"
    save_tensors(path, {"diffusion_model.blocks.0.attn.wq.weight": np.zeros((4, 4), np.float32)}, dif_metadata=False)
    from dif_frontend_krea2.weights import open_single_file

    with pytest.raises(CheckpointError, match="original \\(non-diffusers\\) naming"):
        open_single_file(path, "transformer")


class ShapesOnly(TensorSource):
    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self._shapes, self.label = shapes, "<meta>"

    def names(self) -> list[str]:
        return list(self._shapes)

    def __contains__(self, name: object) -> bool:
        return name in self._shapes

    def info(self, name: str) -> TensorInfo:
        return TensorInfo(name, "BF16", self._shapes[name], 0, 0, Path(self.label))


def test_published_configs_fit_full_size_shapes(model_configs) -> None:  # type: ignore[no-untyped-def]
    from dif_frontend_krea2.config import load_configs
    from dif_frontend_krea2.model import build_transformer

    root = model_configs("turbo")
    cfg = load_configs(root).transformer
    prog = build_transformer(cfg, image_len=4, text_len=3, batch=1, dtype="bf16")
    source = ShapesOnly({p.name: p.type.shape for p in prog.params})
    _check_transformer_shapes(source, cfg, root)  # fits
    narrow = ShapesOnly({**source._shapes, "img_in.weight": (3072, 64)})
    with pytest.raises(CheckpointError, match="width=3072"):
        _check_transformer_shapes(narrow, cfg, root)

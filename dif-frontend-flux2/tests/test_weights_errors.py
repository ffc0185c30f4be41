"""Broken checkpoints fail with one clear error naming what is wrong (file, tensor, shapes), both from
the Python API and from `dif flux2 generate` (exit status 1, one line, no output file)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dif.dtypes import DType
from dif.errors import CheckpointError, FormatError, WeightError
from dif.serialize.diftensor import save_tensors
from dif.weights import open_component
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.pipeline import Flux2Pipeline
from dif_frontend_flux2.weights import open_checkpoint

SIZE = 32  # 2 x 2 tokens: loading is what is under test


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A writable copy of the embedded checkpoint, text encoder resharded into two files + index."""
    root = tmp_path / "klein"
    shutil.copytree(DEFAULT_CHECKPOINT, root)
    te = root / "text_encoder"
    tensors = {k: np.array(v) for k, v in open_component(te).items()}
    (te / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    for shard, keys in shards.items():
        save_tensors(te / shard, {k: tensors[k] for k in keys}, {"format": "pt"}, dif_metadata=False)
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (te / "model.safetensors.index.json").write_text(json.dumps(index))
    return root


def _load(root: Path) -> None:
    """Open and bind everything the way `generate` does before sampling."""
    Flux2Pipeline(open_checkpoint(root), dtype=DType.BF16).prepare_all(SIZE, SIZE)


def _rewrite(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    tensors = {k: np.array(v) for k, v in open_component(path.parent).items()}
    edit(tensors)
    path.unlink()
    save_tensors(path, tensors, dif_metadata=False)


def test_resharded_copy_loads(ckpt: Path) -> None:
    _load(ckpt)  # the fixture itself is a valid checkpoint


def test_truncated_shard(ckpt: Path) -> None:
    shard = ckpt / "text_encoder" / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(FormatError) as info:
        _load(ckpt)
    msg = str(info.value)
    assert "model-00002-of-00002.safetensors" in msg and "tensor '" in msg and "truncated" in msg


def test_garbage_header(ckpt: Path) -> None:
    path = ckpt / "vae" / "diffusion_pytorch_model.safetensors"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(FormatError, match=r"vae/diffusion_pytorch_model\.safetensors: header length field"):
        _load(ckpt)


def test_shape_mismatch(ckpt: Path) -> None:
    path = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
    _rewrite(path, lambda t: t.update({"x_embedder.weight": t["x_embedder.weight"][:, :100]}))
    with pytest.raises(WeightError) as info:
        _load(ckpt)
    msg = str(info.value)
    cfg = json.loads((ckpt / "transformer" / "config.json").read_text())
    width = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    assert "mis-shaped: 'x_embedder.weight' in " in msg and str(path) in msg
    assert f"checkpoint has F32[{width},100], program expects bf16[{width},128]" in msg
    assert msg.count("\n  ") == 1  # exactly one problem listed


def test_missing_tensor(ckpt: Path) -> None:
    path = ckpt / "vae" / "diffusion_pytorch_model.safetensors"
    width = json.loads((ckpt / "vae" / "config.json").read_text())["block_out_channels"][0]
    _rewrite(path, lambda t: t.pop("decoder.conv_out.weight"))
    with pytest.raises(
        WeightError, match=rf"missing: 'decoder.conv_out.weight': expected bf16\[3,{width},3,3\], not found in"
    ):
        _load(ckpt)


def test_index_pointing_outside_folder(ckpt: Path) -> None:
    index_path = ckpt / "text_encoder" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../transformer/diffusion_pytorch_model.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="points outside the folder"):
        _load(ckpt)


def test_missing_shard(ckpt: Path) -> None:
    (ckpt / "text_encoder" / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard 'model-00001-of-00002.safetensors' does not exist"):
        _load(ckpt)


def test_not_a_klein_folder(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a FLUX.2 \\[klein\\] diffusers folder"):
        open_checkpoint(tmp_path)


def test_cli_reports_one_line_and_writes_nothing(ckpt: Path, tmp_path: Path) -> None:
    click_testing = pytest.importorskip("click.testing")
    cli = pytest.importorskip("dif_tools.cli").cli
    path = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
    _rewrite(path, lambda t: t.pop("proj_out.weight"))
    out = tmp_path / "never.png"
    result = click_testing.CliRunner().invoke(
        cli, ["flux2", "generate", "-m", str(ckpt), "-p", "x", "-W", "32", "-H", "32", "-o", str(out)]
    )
    assert result.exit_code == 1, result.output
    assert "missing: 'proj_out.weight'" in result.output
    assert len(result.output.strip().splitlines()) == 1  # the whole error on one line
    assert not out.exists() and not any(p.name.startswith(".never") for p in tmp_path.iterdir())


def test_unsupported_scheduler_option(ckpt: Path) -> None:
    from dif_frontend_flux2.pipeline import GenerationRequest

    path = ckpt / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "use_karras_sigmas": True}))
    pipe = Flux2Pipeline(open_checkpoint(ckpt), dtype=DType.BF16)
    with pytest.raises(CheckpointError, match=r"scheduler_config\.json: .use_karras_sigmas. = True is not supported"):
        pipe.generate(GenerationRequest("x", width=SIZE, height=SIZE, steps=1))

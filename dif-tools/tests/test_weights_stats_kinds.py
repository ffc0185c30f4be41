"""`dif weights stats` says what a file is: the family its tensor names belong to, a LoRA's dialect,
ranks, alphas and targets, a GGUF's version, architecture and per-tensor ggml types."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.serialize.diftensor import save_tensors
from dif_tools.cli import build_cli


def stats(path: Path) -> dict:  # type: ignore[type-arg]
    result = CliRunner().invoke(build_cli(), ["weights", "stats", str(path), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["data"]["summary"]


def test_kohya_lora(tmp_path: Path) -> None:
    path = tmp_path / "style.safetensors"
    t = {}
    for i in range(3):
        key = f"lora_unet_double_blocks_{i}_img_attn_qkv"
        t[f"{key}.lora_down.weight"] = np.zeros((8, 64), np.float32)
        t[f"{key}.lora_up.weight"] = np.zeros((192, 8), np.float32)
        t[f"{key}.alpha"] = np.array(4.0, np.float32)
    t["lora_unet_single_stream_modulation_lin.lora_down.weight"] = np.zeros((8, 64), np.float32)
    t["lora_unet_single_stream_modulation_lin.lora_up.weight"] = np.zeros((192, 8), np.float32)
    save_tensors(path, t, dif_metadata=False)
    s = stats(path)
    assert s["family"] == "FLUX.2"
    lora = s["lora"]
    assert lora["dialect"] == "kohya" and lora["kinds"] == ["lora"] and lora["modules"] == 4
    assert lora["ranks"] == [8] and lora["alphas"] == [4.0]
    assert "double_blocks_0_img_attn_qkv" in lora["targets"]
    result = CliRunner().invoke(build_cli(), ["weights", "stats", str(path)])
    assert "LoRA (kohya dialect, lora): 4 modules, rank 8, alpha 4" in result.output
    assert "family: FLUX.2" in result.output


def test_gguf_file(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    from gguf.quants import quantize

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), arch="flux")
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    for i in range(2):
        writer.add_tensor(f"double_blocks.{i}.img_mod.lin.weight", quantize(x, gguf.GGMLQuantizationType.Q8_0),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)  # fmt: skip
    writer.add_tensor("img_in.bias", x[0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    s = stats(path)
    assert s["gguf"] == {"version": 3, "architecture": "flux", "types": {"Q8_0": 2, "F32": 1}}
    assert s["family"] == "FLUX.1"  # img_mod: FLUX.1's per-block modulation
    assert s["repeated_shapes"] == {"double_blocks.N.img_mod.lin.weight [64, 64]": 2}

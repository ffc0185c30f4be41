"""A LoRA file's two parts (`dif.lora`): the denoiser's and the text encoder's keys sorted apart, each
with its own metadata alpha; a text-encoder table over a decoder stack under several spellings; both
parts matched at the file's one scale by `apply_loras`, the text encoder merged in either mode with
the decision recorded (settings and program meta); a swap changing the text encoder refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dif.dtypes import DType
from dif.errors import UsageError, WeightError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.lora import LoraComponent, Target, apply_loras, read_lora, text_encoder_table
from dif.serialize.diftensor import save_tensors
from dif.weights import open_safetensors

TABLE = {"blk": (Target("blk.weight"),)}
RNG = np.random.default_rng(0)


def matrix(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture
def sources(tmp_path: Path):  # type: ignore[no-untyped-def]
    save_tensors(tmp_path / "dit.safetensors", {"blk.weight": matrix(6, 8)}, dif_metadata=False)
    te = {
        "model.embed_tokens.weight": matrix(10, 4),
        "model.layers.0.self_attn.q_proj.weight": matrix(4, 4),
        "model.layers.0.input_layernorm.weight": matrix(4),
        "model.layers.1.mlp.down_proj.weight": matrix(4, 6),
        "lm_head.weight": matrix(10, 4),
    }
    save_tensors(tmp_path / "te.safetensors", te, dif_metadata=False)
    return open_safetensors(tmp_path / "dit.safetensors"), open_safetensors(tmp_path / "te.safetensors")


def both_parts(path: Path, *, second_encoder: bool = False) -> Path:
    t = {
        "transformer.blk.lora_A.weight": matrix(2, 8),
        "transformer.blk.lora_B.weight": matrix(6, 2),
        "text_encoder.model.layers.0.self_attn.q_proj.lora_A.weight": matrix(2, 4),
        "text_encoder.model.layers.0.self_attn.q_proj.lora_B.weight": matrix(4, 2),
        "lora_te_layers_1_mlp_down_proj.lora_down.weight": matrix(2, 6),
        "lora_te_layers_1_mlp_down_proj.lora_up.weight": matrix(4, 2),
        "lora_te_layers_1_mlp_down_proj.alpha": np.array(1.0, np.float32),
    }
    if second_encoder:
        t["lora_te2_encoder_block_0_q.lora_down.weight"] = matrix(2, 4)
        t["lora_te2_encoder_block_0_q.lora_up.weight"] = matrix(4, 2)
    meta = {"lora_adapter_metadata": json.dumps({"transformer.lora_alpha": 4, "text_encoder.lora_alpha": 8})}
    save_tensors(path, t, meta, dif_metadata=False)
    return path


def test_parts_are_sorted_apart_with_their_own_alpha(tmp_path: Path) -> None:
    lora = read_lora(both_parts(tmp_path / "x.safetensors", second_encoder=True))
    te = lora.text_encoder_part
    assert te is not None and lora.part("text_encoder") is te and lora.part("transformer") is lora
    assert sorted(lora.adapters) == ["blk"] and lora.unknown == ()
    assert sorted(te.adapters) == ["layers_1_mlp_down_proj", "model.layers.0.self_attn.q_proj"]
    assert te.dialect == "diffusers+kohya" and not te.flattened
    assert te.unknown == ("lora_te2_encoder_block_0_q.lora_down.weight", "lora_te2_encoder_block_0_q.lora_up.weight")
    assert lora.alpha(lora.adapters["blk"]) == 4.0  # transformer.lora_alpha
    assert te.alpha(te.adapters["model.layers.0.self_attn.q_proj"]) == 8.0  # text_encoder.lora_alpha
    assert te.alpha(te.adapters["layers_1_mlp_down_proj"]) == 1.0  # its own .alpha wins
    with pytest.raises(ValueError, match="one of transformer, text_encoder"):
        lora.part("unet")


def test_text_encoder_table_spellings(sources) -> None:  # type: ignore[no-untyped-def]
    _, te = sources
    table = text_encoder_table(te, "model.", ("model.", ""))
    assert sorted(table) == [
        "layers.0.self_attn.q_proj", "layers.1.mlp.down_proj",
        "model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj",
    ]  # fmt: skip
    assert table["layers.1.mlp.down_proj"] == (Target("model.layers.1.mlp.down_proj.weight"),)


def program() -> Program:
    b = ProgramBuilder("p")
    b.output(b.input("x", (1,), DType.F32))
    return b.build()


@pytest.mark.parametrize("mode", ["merged", "unmerged"])
def test_both_parts_applied_text_encoder_merged(sources, tmp_path: Path, mode: str) -> None:  # type: ignore[no-untyped-def]
    dit, te = sources
    path = both_parts(tmp_path / "x.safetensors")
    component = LoraComponent(te, text_encoder_table(te, "model.", ("model.", "")))
    applied = apply_loras(dit, [f"{path}:0.5"], TABLE, family="t", model="M", mode=mode, text_encoder=component)
    assert applied.text_encoder is not None and applied.text_encoder is not te
    lora = read_lora(path)
    a, b = (np.asarray(lora.source[f"lora_te_layers_1_mlp_down_proj.{p}.weight"]) for p in ("lora_down", "lora_up"))
    want = te["model.layers.1.mlp.down_proj.weight"] + 0.5 * (b @ a) * (1.0 / 2)  # scale * up @ down * alpha / rank
    np.testing.assert_allclose(applied.text_encoder["model.layers.1.mlp.down_proj.weight"], want, rtol=1e-6)
    np.testing.assert_array_equal(applied.text_encoder["lm_head.weight"], te["lm_head.weight"])
    assert (
        applied.mode is not None and applied.mode.mode == mode and applied.mode.text_encoder == ("x.safetensors@0.5",)
    )
    meta = applied.build("k", program).meta
    decisions = json.loads(meta["decisions"])
    assert decisions[-1][0] == "lora text encoder: merged, 1 adapter(s)" and "once per prompt" in decisions[-1][1]
    assert json.loads(meta["lora"])["text_encoder"]["adapters"] == ["x.safetensors@0.5"]
    if mode == "unmerged":
        assert applied.unmerged is not None
        applied.unmerged.set([f"{path}:0.5"])  # the same text-encoder part: allowed
        with pytest.raises(UsageError, match=r"adapt the text encoder with x.safetensors@0.7, but it was loaded"):
            applied.unmerged.set([f"{path}:0.7"])
        assert applied.unmerged.applied[0].spec.scale == 0.5  # kept


def test_without_a_text_encoder_component_its_keys_are_unmatched(sources, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dit, _ = sources
    path = both_parts(tmp_path / "x.safetensors")
    with pytest.raises(WeightError, match=r"(?s)5 of 7 LoRA keys match no module of M.*text_encoder\.model\.layers"):
        apply_loras(dit, [path], TABLE, family="t", model="M")

"""Text-encoder LoRA, Krea 2: the Qwen3-VL language model's adapters merged at load.

Oracle: diffusers' `Krea2Pipeline.get_text_hidden_states` with a PEFT LoRA (`LoraConfig` on
q/k/v/o/gate/up/down, random A and B) injected into its Qwen3VLModel text encoder, fp32 on CPU;
dif's text features from `open_checkpoint(root, loras=[file])` with the same matrices in each
dialect (diffusers `text_encoder.` + metadata alpha under the Qwen3VLModel and the
Qwen3VLForConditionalGeneration namings, kohya `lora_te_` / `lora_te1_` with the bare text model's
names, LoKr, LoHa) must match: rel-L2 <= 1e-5. A file with transformer and text-encoder adapters
merges both (one scale) and records the text encoder's decision; unmatched text-encoder keys (the
vision tower's, which Krea 2 does not run) are refused with their list, exit != 0, nothing written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.errors import WeightError
from dif.interp import interpret
from dif.serialize.diftensor import save_tensors
from dif.testing.lora import peft_lora, text_encoder_lora_tensors
from dif.text import TextTokenizer
from dif.weights import open_component
from dif_frontend_krea2.text_encoder import build_text_encoder, text_rope_tables
from dif_frontend_krea2.tokenize import encode_prompt
from dif_frontend_krea2.weights import bind_text_encoder, open_checkpoint

pytestmark = pytest.mark.oracle
GATE = 1e-5
RANK, ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = "a red fox, sitting in snow"
NAMINGS: dict[str, Callable[[str], str]] = {
    "qwen3vl-model": lambda m: m,  # language_model.layers.N ...
    "for-conditional-generation": lambda m: f"model.{m}",  # model.language_model.layers.N ...
    "text-model": lambda m: m.removeprefix("language_model."),  # layers.N ...
}
CASES = [
    ("diffusers", "qwen3vl-model"),
    ("diffusers", "for-conditional-generation"),
    ("kohya", "qwen3vl-model"),
    ("kohya-te1", "text-model"),
    ("lokr", "qwen3vl-model"),
    ("loha", "qwen3vl-model"),
]


@pytest.fixture(scope="module")
def oracle(torch, tiny_checkpoints):  # type: ignore[no-untyped-def]
    """(module name -> (A, B) of a PEFT LoRA on the tiny text encoder, the text hidden states diffusers'
    pipeline computes with it, those without it)."""
    diffusers = pytest.importorskip("diffusers")
    pytest.importorskip("peft", reason="the oracle LoRA is PEFT's")
    pipe = diffusers.Krea2Pipeline.from_pretrained(tiny_checkpoints["turbo"])
    plain = pipe.get_text_hidden_states(PROMPT, max_sequence_length=16, device="cpu")[0].numpy()
    pipe.text_encoder, factors = peft_lora(pipe.text_encoder, torch, TARGETS, rank=RANK, alpha=ALPHA, seed=5)
    assert len(factors) == len(TARGETS) * pipe.text_encoder.config.text_config.num_hidden_layers
    assert all(m.startswith("language_model.layers.") for m in factors)  # the vision tower has no such linears
    expected = pipe.get_text_hidden_states(PROMPT, max_sequence_length=16, device="cpu")[0].numpy()
    return factors, expected, plain


def write(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> Path:
    save_tensors(path, tensors, metadata or None, dif_metadata=False)
    return path


def text_features(ck) -> np.ndarray:  # type: ignore[no-untyped-def]
    tokens = encode_prompt(TextTokenizer.from_folder(ck.tokenizer_dir), PROMPT, max_sequence_length=16)
    taps = ck.configs.pipeline.text_encoder_select_layers
    prog = build_text_encoder(
        ck.configs.text_encoder, seq_len=tokens.seq_len, taps=taps, drop_prefix=tokens.drop_prefix
    )
    cos, sin = text_rope_tables(ck.configs.text_encoder, tokens.positions)
    inputs = {"input_ids": tokens.ids, "attention_mask": tokens.mask, "rope_cos": cos, "rope_sin": sin}
    return interpret(prog, inputs, bind_text_encoder(prog, ck.text_encoder, ck.text_prefix))[prog.outputs[0]]


@pytest.mark.parametrize("dialect, naming", CASES, ids=[f"{d}-{n}" for d, n in CASES])
def test_text_features_match_peft(oracle, tiny_checkpoints, tmp_path, rel_l2_fn, dialect, naming) -> None:  # type: ignore[no-untyped-def]
    factors, expected, plain = oracle
    assert rel_l2_fn(plain, expected) > 0.05  # the adapters matter
    t, metadata = text_encoder_lora_tensors(factors, dialect, alpha=ALPHA, rename=NAMINGS[naming])
    ck = open_checkpoint(tiny_checkpoints["turbo"], loras=[write(tmp_path / "te.safetensors", t, metadata)])
    assert len(ck.text_encoder.merged) == len(factors)  # type: ignore[attr-defined]
    err = rel_l2_fn(text_features(ck), expected)
    assert err <= GATE, f"{dialect}/{naming}: rel-L2 {err:.3e}"  # measured 4.4e-7 in every case


def transformer_keys(root: Path) -> dict[str, np.ndarray]:
    """kohya adapters (diffusers names flattened, alpha = rank) on the tiny transformer's attention projections."""
    source = open_component(root / "transformer")
    rng = np.random.default_rng(2)
    t = {}
    for name in source.names():
        if name.endswith(("attn.to_q.weight", "attn.to_out.0.weight")):
            out, inp = source.info(name).shape
            key = "lora_unet_" + name[: -len(".weight")].replace(".", "_")
            t[f"{key}.lora_down.weight"] = rng.standard_normal((2, inp)).astype(np.float32)
            t[f"{key}.lora_up.weight"] = rng.standard_normal((out, 2)).astype(np.float32)
            t[f"{key}.alpha"] = np.array(2.0, np.float32)
    return t


def test_combined_lora_merges_both_parts_at_one_scale(oracle, tiny_checkpoints, tmp_path, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    factors, _, plain = oracle
    root = tiny_checkpoints["turbo"]
    te, _ = text_encoder_lora_tensors(factors, "kohya", alpha=ALPHA)
    both = write(tmp_path / "both.safetensors", te | transformer_keys(root))
    half, metadata = text_encoder_lora_tensors(factors, "diffusers", alpha=ALPHA, scale=0.5)
    ck = open_checkpoint(root, loras=[f"{both}:0.5"])
    ref = open_checkpoint(root, loras=[write(tmp_path / "half.safetensors", half, metadata)])
    assert rel_l2_fn(text_features(ck), text_features(ref)) <= GATE  # the file's scale reaches the text encoder
    assert rel_l2_fn(text_features(ck), plain) > 0.01
    assert ck.transformer.merged  # type: ignore[attr-defined]
    mode = ck.loras.mode  # type: ignore[union-attr]
    assert mode is not None
    assert mode.text_encoder == ("both.safetensors@0.5",) and mode.to_dict()["text_encoder"]["mode"] == "merged"
    unmerged = open_checkpoint(root, loras=[both], lora_mode="unmerged")
    assert unmerged.unmerged is not None and unmerged.text_encoder.merged  # type: ignore[attr-defined]


def test_unmatched_text_encoder_keys_are_refused(oracle, tiny_checkpoints, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
    factors, _, _ = oracle
    root = tiny_checkpoints["turbo"]
    te, metadata = text_encoder_lora_tensors(factors, "diffusers", alpha=ALPHA)
    te["text_encoder.visual.blocks.0.attn.qkv.lora_A.weight"] = np.zeros((RANK, 16), np.float32)
    te["text_encoder.visual.blocks.0.attn.qkv.lora_B.weight"] = np.zeros((48, RANK), np.float32)
    bad = write(tmp_path / "bad.safetensors", te | transformer_keys(root), metadata)
    with pytest.raises(WeightError, match=r"(?s)2 of .* match no module of Krea 2.*visual\.blocks\.0\.attn\.qkv"):
        open_checkpoint(root, loras=[bad])
    out = tmp_path / "out.png"
    args = ["krea2", "generate", "-m", str(root), "-p", "a fox", "-W", "32", "-H", "32", "--steps", "1"]
    result = CliRunner().invoke(cli, [*args, "--lora", str(bad), "-o", str(out), "--json"])
    assert result.exit_code != 0 and not out.exists()
    assert "text_encoder.visual.blocks.0.attn.qkv.lora_A.weight" in result.output and "Traceback" not in result.output

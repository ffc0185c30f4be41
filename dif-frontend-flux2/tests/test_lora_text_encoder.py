"""Text-encoder LoRA, FLUX.2 [klein]: the Qwen3 text encoder's adapters merged at load.

Oracle: a PEFT LoRA (`LoraConfig` on q/k/v/o/gate/up/down, random A and B) on a transformers Qwen3
text encoder, fp32 on CPU; dif's text features with the same matrices written in each dialect
(diffusers `text_encoder.` + metadata alpha, kohya `lora_te_` / `lora_te1_` with `.alpha`, both
module namings, and the same deltas as LyCORIS LoKr / LoHa factors) must match: rel-L2 <= 1e-5.
Then the product path on the embedded checkpoint: a file holding transformer and text-encoder
adapters through `open_checkpoint` (both parts merged, one scale, the decision recorded), in unmerged
mode (the text encoder merged; a swap that changes it refused), `dif flux2 generate --lora` equal
to the Python API, unmatched text-encoder keys refused with their list, and `dif weights stats`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.errors import UsageError, WeightError
from dif.interp import interpret
from dif.serialize.diftensor import save_tensors
from dif.testing import lora as testing_lora
from dif.testing.lora import TEXT_ENCODER_DIALECTS
from dif.weights import bind_weights, open_component, open_safetensors
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.config import Qwen3Config
from dif_frontend_flux2.text_encoder import build_text_encoder, qwen3_rope_tables
from dif_frontend_flux2.weights import merge_text_encoder_loras, open_checkpoint, text_encoder_unused

pytestmark = pytest.mark.oracle

RANK, ALPHA = 4, 8  # PEFT scales B @ A by alpha / rank = 2
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GATE = 1e-5
COMMON = ["-p", "a fox", "-W", "32", "-H", "32", "--seed", "5", "--steps", "2"]


def peft_lora(model, torch, seed: int = 7):  # type: ignore[no-untyped-def]
    """(a copy of `model` with a PEFT LoRA on every TARGETS linear; module name -> (A, B))."""
    pytest.importorskip("peft", reason="the oracle LoRA is PEFT's")
    adapted, factors = testing_lora.peft_lora(model, torch, TARGETS, rank=RANK, alpha=ALPHA, seed=seed)
    assert len(factors) == len(TARGETS) * model.config.num_hidden_layers
    return adapted, factors


QWEN3MODEL = {"rename": lambda m: m.removeprefix("model.")}  # a Qwen3Model's names of the same modules


def write_text_encoder_lora(factors, dialect: str, path: Path, scale: float = 1.0, **how) -> Path:  # type: ignore[no-untyped-def]
    """The adapters of `peft_lora` (times `scale`) in one dialect's layout (`dif.testing.lora`)."""
    t, metadata = testing_lora.text_encoder_lora_tensors(factors, dialect, alpha=ALPHA, scale=scale, **how)
    save_tensors(path, t, metadata or None, dif_metadata=False)
    return path


def torch_features(model, torch, ids: np.ndarray, mask: np.ndarray, taps) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = model(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(mask.astype(np.int64)),
        output_hidden_states=True,
        use_cache=False,
    )
    return torch.cat([out.hidden_states[k] for k in taps], dim=-1).numpy()


def dif_features(cfg: Qwen3Config, source, ids: np.ndarray, mask: np.ndarray, taps) -> np.ndarray:  # type: ignore[no-untyped-def]
    prog = build_text_encoder(cfg, batch=ids.shape[0], seq_len=ids.shape[1], taps=taps)
    cos, sin = qwen3_rope_tables(cfg, ids.shape[1])
    inputs = {"input_ids": ids, "attention_mask": mask, "rope_cos": cos, "rope_sin": sin}
    weights = bind_weights(prog, source, ignore=text_encoder_unused(max(taps), cfg.num_hidden_layers))
    return interpret(prog, inputs, weights)[prog.outputs[0]]


def prompt_ids(vocab: int, batch: int = 2, seq: int = 9) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
    mask = np.arange(seq)[None, :] < np.array([seq, 5])[:batch, None]
    return ids, mask


@pytest.mark.parametrize(
    "dialect, how",
    [(d, {}) for d in TEXT_ENCODER_DIALECTS] + [("diffusers-no-alpha", QWEN3MODEL), ("kohya", QWEN3MODEL)],
    ids=[*TEXT_ENCODER_DIALECTS, "diffusers-qwen3model", "kohya-qwen3model"],
)
def test_text_features_match_peft(torch, tmp_path, tiny_qwen3, rel_l2_fn, dialect, how):  # type: ignore[no-untyped-def]
    tiny_qwen3.save_pretrained(tmp_path / "te")
    cfg = Qwen3Config.from_json(tmp_path / "te" / "config.json")
    adapted, factors = peft_lora(tiny_qwen3, torch)
    taps = (1, 3, 6)  # the last one the final-normed state: every layer adapted and used
    ids, mask = prompt_ids(cfg.vocab_size)
    expected = torch_features(adapted, torch, ids, mask, taps)
    plain = torch_features(tiny_qwen3, torch, ids, mask, taps)
    assert rel_l2_fn(plain, expected) > 0.05  # the adapters matter

    path = write_text_encoder_lora(factors, dialect, tmp_path / "te.safetensors", **how)
    merged = merge_text_encoder_loras(open_component(tmp_path / "te"), [path])
    assert len(merged.merged) == len(factors)  # type: ignore[attr-defined]
    got = dif_features(cfg, merged, ids, mask, taps)
    err = rel_l2_fn(got, expected)
    assert err <= GATE, f"{dialect}: rel-L2 {err:.3e}"  # measured 5.5e-7 in every dialect


# -- the product path, on the embedded checkpoint ---------------------------------------------------


def transformer_keys(rank: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """kohya adapters on the embedded transformer's fused single-block projections and attention outputs."""
    source = open_component(DEFAULT_CHECKPOINT / "transformer")
    rng = np.random.default_rng(seed)
    t = {}
    for name in source.names():
        if name.endswith(("attn.to_qkv_mlp_proj.weight", "attn.to_out.0.weight")):
            out, inp = source.info(name).shape
            key = "lora_unet_" + name[: -len(".weight")].replace(".", "_")
            t[f"{key}.lora_down.weight"] = rng.standard_normal((rank, inp)).astype(np.float32)
            t[f"{key}.lora_up.weight"] = rng.standard_normal((out, rank)).astype(np.float32)
            t[f"{key}.alpha"] = np.array(float(rank), np.float32)
    return t


@pytest.fixture
def embedded_lora(torch, tmp_path):  # type: ignore[no-untyped-def]
    """(the embedded text encoder as transformers loads it, its PEFT-adapted copy, and a kohya file with
    both the transformer's and the text encoder's adapters)."""
    transformers = pytest.importorskip("transformers", reason="the oracle is transformers' Qwen3")
    model = transformers.Qwen3ForCausalLM.from_pretrained(DEFAULT_CHECKPOINT / "text_encoder").eval()
    adapted, factors = peft_lora(model, torch, seed=11)
    te = write_text_encoder_lora(factors, "kohya", tmp_path / "te.safetensors")
    t = {k: np.array(v) for k, v in open_safetensors(te).items()} | transformer_keys()
    save_tensors(tmp_path / "both.safetensors", t, dif_metadata=False)
    return model, adapted, factors, tmp_path / "both.safetensors"


def test_open_checkpoint_merges_both_parts_and_records_it(torch, embedded_lora, rel_l2_fn, tmp_path):  # type: ignore[no-untyped-def]
    model, _, factors, both = embedded_lora
    half = write_text_encoder_lora(factors, "diffusers", tmp_path / "half.safetensors", scale=0.5)
    peft_half, _ = peft_lora(model, torch, seed=11)
    for module in peft_half.modules():  # the oracle at scale 0.5: B halved
        if hasattr(module, "lora_B") and "default" in module.lora_B:
            module.lora_B["default"].weight.mul_(0.5)
    ck = open_checkpoint(DEFAULT_CHECKPOINT, loras=[f"{both}:0.5"])
    cfg = ck.configs.text_encoder
    ids, mask = prompt_ids(cfg.vocab_size)
    taps = (9, 18, 27)
    got = dif_features(cfg, ck.text_encoder, ids, mask, taps)
    assert rel_l2_fn(got, torch_features(peft_half, torch, ids, mask, taps)) <= GATE  # one scale, both parts
    ref = dif_features(cfg, merge_text_encoder_loras(open_component(DEFAULT_CHECKPOINT / "text_encoder"), [half]),
                       ids, mask, taps)  # fmt: skip
    assert rel_l2_fn(got, ref) <= GATE
    assert ck.transformer.merged and len(ck.text_encoder.merged) == len(factors)  # type: ignore[attr-defined]
    mode = ck.loras.mode  # type: ignore[union-attr]
    assert mode is not None
    assert mode.mode == "merged" and mode.text_encoder == ("both.safetensors@0.5",)
    recorded = mode.to_dict()["text_encoder"]
    assert recorded["mode"] == "merged" and "once per prompt" in recorded["why"]


def test_unmerged_transformer_keeps_the_text_encoder_merged(torch, embedded_lora, rel_l2_fn, tmp_path):  # type: ignore[no-untyped-def]
    _, adapted, _, both = embedded_lora
    ck = open_checkpoint(DEFAULT_CHECKPOINT, loras=[both], lora_mode="unmerged")
    assert ck.unmerged is not None and ck.loras.mode.mode == "unmerged"  # type: ignore[union-attr]
    assert ck.loras.mode.text_encoder == ("both.safetensors@1",)  # type: ignore[union-attr]
    cfg = ck.configs.text_encoder
    ids, mask = prompt_ids(cfg.vocab_size)
    got = dif_features(cfg, ck.text_encoder, ids, mask, (9, 18, 27))
    assert rel_l2_fn(got, torch_features(adapted, torch, ids, mask, (9, 18, 27))) <= GATE
    only = tmp_path / "transformer_only.safetensors"
    save_tensors(only, transformer_keys(seed=3), dif_metadata=False)
    ck.unmerged.set([both, f"{only}:0.3"])  # the text-encoder part unchanged: the denoiser part swaps
    assert [a.spec.path.name for a in ck.unmerged.applied] == ["both.safetensors", "transformer_only.safetensors"]
    for specs in ([f"{both}:0.5"], [only], []):
        with pytest.raises(UsageError, match="text-encoder adapters are merged into its weights at load"):
            ck.unmerged.set(specs)
        assert len(ck.unmerged.applied) == 2  # refused: the set in use is kept


def pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int16)


def test_cli_with_a_combined_lora_matches_the_python_api(embedded_lora, tmp_path):  # type: ignore[no-untyped-def]
    import dif

    cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
    _, _, _, both = embedded_lora
    only = tmp_path / "transformer_only.safetensors"
    save_tensors(only, transformer_keys(), dif_metadata=False)  # the same file without its text-encoder part
    runner, docs, images = CliRunner(), {}, {}
    for tag, lora in (("both", both), ("only", only)):
        out = tmp_path / f"{tag}.png"
        result = runner.invoke(cli, ["flux2", "generate", *COMMON, "--lora", f"{lora}:0.05", "-o", str(out), "--json"])
        assert result.exit_code == 0, result.output
        docs[tag], images[tag] = json.loads(result.output)["data"], pixels(out)
    assert np.abs(images["both"] - images["only"]).max() > 0  # the text-encoder part changes the image
    api = dif.load(family="flux2", lora=[(both, 0.05)])("a fox", width=32, height=32, seed=5, steps=2)
    assert np.array_equal(api.run.pixels.astype(np.int16), images["both"])
    lora = docs["both"]["settings"]["lora"]
    assert lora["mode"] == "merged" and lora["text_encoder"]["adapters"] == ["both.safetensors@0.05"]
    assert api.settings["lora"]["text_encoder"] == lora["text_encoder"]
    assert docs["only"]["settings"]["lora"]["text_encoder"] is None


def test_unmatched_text_encoder_keys_are_refused_with_their_list(tmp_path):  # type: ignore[no-untyped-def]
    cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
    z = np.zeros
    t = transformer_keys() | {
        "text_encoder.model.layers.0.self_attn.q_proj.lora_A.weight": z((2, 8), np.float32),
        "text_encoder.model.layers.0.self_attn.q_proj.lora_B.weight": z((16, 2), np.float32),
        "text_encoder.model.layers.0.self_attn.nothing.lora_A.weight": z((2, 8), np.float32),
        "text_encoder.model.layers.0.self_attn.nothing.lora_B.weight": z((16, 2), np.float32),
        "lora_te2_encoder_block_0_layer_0_SelfAttention_q.lora_down.weight": z((2, 8), np.float32),  # a 2nd encoder
        "lora_te2_encoder_block_0_layer_0_SelfAttention_q.lora_up.weight": z((8, 2), np.float32),
    }
    bad = tmp_path / "bad.safetensors"
    save_tensors(bad, t, dif_metadata=False)
    out = tmp_path / "out.png"
    result = CliRunner().invoke(cli, ["flux2", "generate", *COMMON, "--lora", str(bad), "-o", str(out)])
    assert result.exit_code != 0 and not out.exists()
    assert "4 of" in result.output and "match no module" in result.output and "bad.safetensors" in result.output
    for key in ("self_attn.nothing.lora_A.weight", "self_attn.nothing.lora_B.weight", "lora_te2_encoder_block_0"):
        assert key in result.output
    assert "Traceback" not in result.output
    with pytest.raises(WeightError, match="match no module"):  # the same through the Python API
        open_checkpoint(DEFAULT_CHECKPOINT, loras=[bad])


def test_weights_stats_reports_the_text_encoder_targets(embedded_lora):  # type: ignore[no-untyped-def]
    tools = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools")
    _, _, factors, both = embedded_lora
    result = CliRunner().invoke(tools.build_cli(), ["weights", "stats", str(both), "--json"])
    assert result.exit_code == 0, result.output
    lora = json.loads(result.stdout)["data"]["summary"]["lora"]
    te = lora["text_encoder"]
    assert lora["dialect"] == "kohya" and lora["modules"] == len(transformer_keys()) // 3
    assert te["dialect"] == "kohya" and te["modules"] == len(factors) and te["ranks"] == [RANK]
    assert "model_layers_0_self_attn_q_proj" in te["targets"] and te["alphas"] == [2.0]
    text = CliRunner().invoke(tools.build_cli(), ["weights", "stats", str(both)]).output
    assert f"text-encoder LoRA (kohya dialect, lora): {len(factors)} modules, rank {RANK}, alpha 2" in text

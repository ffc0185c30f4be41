"""A complete FLUX.2 [klein] run from three single files and no diffusers folder: the embedded
checkpoint's transformer (BFL names), text encoder (transformers names, or a llama.cpp GGUF) and
VAE, each written as one file, render the same pixels as the folder they came from. Also: configs
from the published package data when a file has none (variant inferred from the transformer's
shapes, checked on full-size meta programs), and the refusals when a component is missing or does
not fit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.errors import CheckpointError
from dif.serialize.diftensor import save_tensors
from dif.weights import TensorInfo, TensorSource, open_component
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.single_files import infer_variant

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
COMMON = ["-p", "a lighthouse", "-W", "32", "-H", "32", "--seed", "8", "--steps", "2"]


def config_of(component: str) -> str:
    return json.dumps(json.loads((DEFAULT_CHECKPOINT / component / "config.json").read_text()))


def write_component(component: str, path: Path, rename=lambda n: n) -> Path:  # type: ignore[no-untyped-def]
    src = open_component(DEFAULT_CHECKPOINT / component)
    tensors = {rename(n): np.array(src[n]) for n in src.names()}
    save_tensors(path, tensors, {"config": config_of(component)}, dif_metadata=False)
    return path


def write_bfl_transformer(path: Path, bfl_tensors) -> Path:  # type: ignore[no-untyped-def]
    """The embedded transformer under BFL names (conftest's `bfl_tensors`), its config in the metadata."""
    save_tensors(
        path, bfl_tensors(DEFAULT_CHECKPOINT / "transformer"), {"config": config_of("transformer")}, dif_metadata=False
    )
    return path


def write_gguf_text_encoder(path: Path) -> Path:
    """The embedded Qwen3 text encoder as llama.cpp writes one: `blk.N.*` names, `qwen3.*` metadata."""
    gguf = pytest.importorskip("gguf")
    cfg = json.loads((DEFAULT_CHECKPOINT / "text_encoder" / "config.json").read_text())
    src = open_component(DEFAULT_CHECKPOINT / "text_encoder")
    layer = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }  # fmt: skip
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    top["lm_head.weight"] = "output.weight"
    writer = gguf.GGUFWriter(str(path), arch="qwen3")
    writer.add_uint32("qwen3.block_count", cfg["num_hidden_layers"])
    writer.add_uint32("qwen3.embedding_length", cfg["hidden_size"])
    writer.add_uint32("qwen3.feed_forward_length", cfg["intermediate_size"])
    writer.add_uint32("qwen3.attention.head_count", cfg["num_attention_heads"])
    writer.add_uint32("qwen3.attention.head_count_kv", cfg["num_key_value_heads"])
    writer.add_uint32("qwen3.attention.key_length", cfg["head_dim"])
    writer.add_float32("qwen3.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    writer.add_float32("qwen3.rope.freq_base", cfg["rope_theta"])
    for name in src.names():
        if name in top:
            gname = top[name]
        else:
            _, _, i, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            gname = f"blk.{i}.{layer[module]}.{kind}"
        writer.add_tensor(gname, np.array(src[name], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def render(args: list[str], out: Path) -> np.ndarray:
    from PIL import Image

    result = CliRunner().invoke(cli, ["flux2", "generate", *args, *COMMON, "-o", str(out)])
    assert result.exit_code == 0, result.output
    with Image.open(out) as im:
        return np.asarray(im.convert("RGB"))


@pytest.fixture
def files(tmp_path: Path, bfl_tensors) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    loose = tmp_path / "downloads"  # not a diffusers folder
    loose.mkdir()
    return {
        "transformer": write_bfl_transformer(loose / "flux2-klein-tiny.safetensors", bfl_tensors),
        "text_encoder": write_component("text_encoder", loose / "qwen3-tiny.safetensors"),
        "vae": write_component("vae", loose / "flux2-vae.safetensors"),
    }


def _folder_at_klein_text_rows(tmp_path: Path) -> Path:
    """The embedded folder without its model_index.json's max_sequence_length: single files carry no
    model_index, so they run at klein's 512 text rows and are compared with the folder at the same."""
    folder = tmp_path / "embedded-512"
    folder.mkdir()
    for part in DEFAULT_CHECKPOINT.iterdir():
        if part.name != "model_index.json":
            (folder / part.name).symlink_to(part)
    index = json.loads((DEFAULT_CHECKPOINT / "model_index.json").read_text())
    index.pop("max_sequence_length", None)
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def test_three_single_files_render_like_the_folder(files: dict[str, Path], tmp_path: Path) -> None:
    checkpoint = _folder_at_klein_text_rows(tmp_path)
    folder = render(["-m", str(checkpoint)], tmp_path / "folder.png")
    single = ["-m", str(files["transformer"]), "--text-encoder", str(files["text_encoder"]), "--vae", str(files["vae"])]
    assert np.array_equal(render(single, tmp_path / "single.png"), folder)
    gguf_te = write_gguf_text_encoder(tmp_path / "qwen3-tiny-f32.gguf")
    single[3] = str(gguf_te)
    assert np.array_equal(render(single, tmp_path / "single-gguf.png"), folder)
    # the text encoder alone swapped in a folder run
    with_folder = ["-m", str(checkpoint), "--text-encoder", str(gguf_te)]
    assert np.array_equal(render(with_folder, tmp_path / "folder-gguf.png"), folder)


def test_missing_components_are_named(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o.png"
    result = CliRunner().invoke(cli, ["flux2", "generate", "-m", str(files["transformer"]), *COMMON, "-o", str(out)])
    assert result.exit_code != 0 and not out.exists() and "Traceback" not in result.output
    assert (
        "needs --text-encoder FILE and --vae FILE" in result.output and "flux2-klein-tiny.safetensors" in result.output
    )


def test_text_encoder_that_does_not_fit(files: dict[str, Path], tmp_path: Path, bfl_tensors) -> None:  # type: ignore[no-untyped-def]
    cfg = json.loads(config_of("transformer"))
    cfg["joint_attention_dim"] = 48  # a transformer expecting a wider text encoder
    path = tmp_path / "t.safetensors"
    save_tensors(path, bfl_tensors(DEFAULT_CHECKPOINT / "transformer"), {"config": json.dumps(cfg)}, dif_metadata=False)
    out = tmp_path / "o.png"
    args = ["-m", str(path), "--text-encoder", str(files["text_encoder"]), "--vae", str(files["vae"])]
    result = CliRunner().invoke(cli, ["flux2", "generate", *args, *COMMON, "-o", str(out)])
    assert result.exit_code != 0 and not out.exists()
    assert "does not fit the transformer" in result.output and "qwen3-tiny.safetensors" in result.output


class ShapesOnly(TensorSource):
    """A source with names and shapes but no data (a full-size program's parameters)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self._shapes, self.label = shapes, "<meta>"

    def names(self) -> list[str]:
        return list(self._shapes)

    def __contains__(self, name: object) -> bool:
        return name in self._shapes

    def info(self, name: str) -> TensorInfo:
        return TensorInfo(name, "BF16", self._shapes[name], 0, 0, Path(self.label))


@pytest.mark.parametrize("variant", ["klein-4b", "klein-9b"])
def test_variant_inferred_from_full_size_shapes(model_configs, variant: str) -> None:  # type: ignore[no-untyped-def]
    from dif_frontend_flux2.config import load_configs
    from dif_frontend_flux2.model import build_transformer

    cfg = load_configs(model_configs(variant)).transformer
    prog = build_transformer(cfg, batch=1, n_img=4, n_txt=3, dtype="bf16")
    source = ShapesOnly({p.name: p.type.shape for p in prog.params})
    assert infer_variant(source) == variant
    base = variant.replace("klein-", "klein-base-")
    assert infer_variant(source, base) == base  # weights cannot tell; the caller can
    other = "klein-9b" if variant == "klein-4b" else "klein-4b"
    with pytest.raises(CheckpointError, match=rf"is not FLUX.2 \[{other}\]"):
        infer_variant(source, other)


def test_unknown_shapes_without_config_are_refused() -> None:
    source = open_component(DEFAULT_CHECKPOINT / "transformer")  # tiny: no published variant
    with pytest.raises(CheckpointError, match="matches no published FLUX.2 \\[klein\\] variant"):
        infer_variant(source)

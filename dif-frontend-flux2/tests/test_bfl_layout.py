"""Original BFL single files load to the same programs and the same weights as the diffusers folder.

The BFL files are made here from a diffusers save by inverting diffusers' conversion (fused qkv,
(shift, scale) order of the final adaLN, `.scale` norms, ldm VAE names with reversed up blocks);
diffusers' own converters then confirm that those files really are the original layout.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from dif.errors import WeightError
from dif.serialize.diftensor import save_tensors
from dif.weights import bind_weights, open_component
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.model import build_transformer
from dif_frontend_flux2.vae import build_vae_decoder
from dif_frontend_flux2.weights import (
    VAE_DECODER_UNUSED,
    bfl_transformer_rules,
    detect,
    open_checkpoint,
    safetensors_kind,
)

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def folder(tmp_path_factory, torch, randomize):  # type: ignore[no-untyped-def]
    """The embedded checkpoint with transformer/ and vae/ replaced by randomized diffusers saves
    (two blocks of each kind; a VAE with shortcut convs and mid-block attention)."""
    diffusers = pytest.importorskip("diffusers")
    root = tmp_path_factory.mktemp("klein")
    shutil.copytree(DEFAULT_CHECKPOINT, root, dirs_exist_ok=True)
    torch.manual_seed(0)
    transformer = diffusers.Flux2Transformer2DModel(
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=24,
        in_channels=128,
        timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=False,
    )
    vae = diffusers.AutoencoderKLFlux2(
        block_out_channels=(8, 16, 16, 16),
        layers_per_block=1,
        latent_channels=32,
        norm_num_groups=4,
        mid_block_add_attention=True,
        sample_size=64,
    )
    for i, module in enumerate((transformer, vae)):
        randomize(module, torch, seed=i)
        name = ("transformer", "vae")[i]
        shutil.rmtree(root / name)
        module.save_pretrained(root / name)
    return root


def _state(folder: Path, component: str) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in open_component(folder / component).items()}


def bfl_transformer_from_diffusers(sd: dict[str, np.ndarray], prefix: str = "") -> dict[str, np.ndarray]:
    """The inverse of diffusers' BFL -> diffusers transformer conversion, written out by hand."""
    top = {
        "x_embedder": "img_in",
        "context_embedder": "txt_in",
        "proj_out": "final_layer.linear",
        "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
        "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
        "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
        "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin",
        "single_stream_modulation.linear": "single_stream_modulation.lin",
    }
    double = {
        "attn.norm_q.weight": "img_attn.norm.query_norm.scale",
        "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
        "attn.to_out.0.weight": "img_attn.proj.weight",
        "ff.linear_in.weight": "img_mlp.0.weight",
        "ff.linear_out.weight": "img_mlp.2.weight",
        "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
        "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
        "attn.to_add_out.weight": "txt_attn.proj.weight",
        "ff_context.linear_in.weight": "txt_mlp.0.weight",
        "ff_context.linear_out.weight": "txt_mlp.2.weight",
    }
    single = {
        "attn.to_qkv_mlp_proj.weight": "linear1.weight",
        "attn.to_out.weight": "linear2.weight",
        "attn.norm_q.weight": "norm.query_norm.scale",
        "attn.norm_k.weight": "norm.key_norm.scale",
    }
    out: dict[str, np.ndarray] = {}
    blocks = {int(k.split(".")[1]) for k in sd if k.startswith("transformer_blocks.")}
    for i in blocks:
        p = f"transformer_blocks.{i}"
        out[f"double_blocks.{i}.img_attn.qkv.weight"] = np.concatenate([sd[f"{p}.attn.to_{c}.weight"] for c in "qkv"])
        out[f"double_blocks.{i}.txt_attn.qkv.weight"] = np.concatenate(
            [sd[f"{p}.attn.add_{c}_proj.weight"] for c in "qkv"]
        )
        out.update({f"double_blocks.{i}.{v}": sd[f"{p}.{k}"] for k, v in double.items()})
    for i in {int(k.split(".")[1]) for k in sd if k.startswith("single_transformer_blocks.")}:
        out.update({f"single_blocks.{i}.{v}": sd[f"single_transformer_blocks.{i}.{k}"] for k, v in single.items()})
    for k, v in top.items():
        out[f"{v}.weight"] = sd[f"{k}.weight"]
    scale, shift = np.split(sd["norm_out.linear.weight"], 2)
    out["final_layer.adaLN_modulation.1.weight"] = np.concatenate([shift, scale])
    return {prefix + k: v for k, v in out.items()}


def ldm_vae_from_diffusers(sd: dict[str, np.ndarray], n_up: int) -> dict[str, np.ndarray]:
    """The original (ldm) names of a FLUX.2 VAE, written out by hand (quant convs as BFL names them)."""
    out: dict[str, np.ndarray] = {}
    for name, arr in sd.items():
        if name == "bn.num_batches_tracked":
            continue
        new = name.replace("conv_norm_out", "norm_out").replace("conv_shortcut", "nin_shortcut")
        new = new.replace("mid_block.resnets.0", "mid.block_1").replace("mid_block.resnets.1", "mid.block_2")
        if ".mid_block.attentions.0." in new:
            new = new.replace("mid_block.attentions.0.", "mid.attn_1.")
            for a, b in (("group_norm", "norm"), ("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "proj_out")):
                new = new.replace(f"attn_1.{a}.", f"attn_1.{b}.")
            if new.endswith("weight") and ".norm." not in new:
                arr = arr[:, :, None, None]  # ldm attention projections are 1x1 convs
        if new.startswith("encoder.down_blocks."):
            new = new.replace("encoder.down_blocks.", "encoder.down.").replace(".resnets.", ".block.")
            new = new.replace(".downsamplers.0.conv.", ".downsample.conv.")
        if new.startswith("decoder.up_blocks."):
            i = int(new.split(".")[2])
            rest = (
                ".".join(new.split(".")[3:]).replace("resnets.", "block.").replace("upsamplers.0.conv", "upsample.conv")
            )
            new = f"decoder.up.{n_up - 1 - i}.{rest}"
        new = {
            "quant_conv.weight": "encoder.quant_conv.weight",
            "quant_conv.bias": "encoder.quant_conv.bias",
            "post_quant_conv.weight": "decoder.post_quant_conv.weight",
            "post_quant_conv.bias": "decoder.post_quant_conv.bias",
        }.get(new, new)
        out[new] = arr
    return out


def test_bfl_transformer_file_is_what_diffusers_converts(folder, torch) -> None:  # type: ignore[no-untyped-def]
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    sd = _state(folder, "transformer")
    bfl = bfl_transformer_from_diffusers(sd)
    back = convert_flux2_transformer_checkpoint_to_diffusers({k: torch.from_numpy(v.copy()) for k, v in bfl.items()})
    assert sorted(back) == sorted(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(back[k].numpy(), v)
    # and our rules are a full, exact inverse
    rules = bfl_transformer_rules(bfl)
    assert sorted(rules) == sorted(sd)


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_bfl_transformer_loads_same_program_and_weights(folder, tmp_path, prefix) -> None:  # type: ignore[no-untyped-def]
    sd = _state(folder, "transformer")
    path = tmp_path / "flux-2-klein-tiny.safetensors"
    save_tensors(path, bfl_transformer_from_diffusers(sd, prefix), dif_metadata=False)
    assert safetensors_kind(path) == "bfl-transformer" and detect(path)

    ref = open_checkpoint(folder)
    bfl = open_checkpoint(path, base=folder)
    assert (ref.layout, bfl.layout) == ("diffusers", "bfl")
    assert bfl.configs == ref.configs and bfl.name == "flux-2-klein-tiny"
    cfg = ref.configs.transformer
    program = build_transformer(cfg, batch=1, n_img=6, n_txt=8)
    assert build_transformer(bfl.configs.transformer, batch=1, n_img=6, n_txt=8) == program
    a = bind_weights(program, ref.transformer).materialize()
    b = bind_weights(program, bfl.transformer).materialize()
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert "chunk 1 of 3" in bfl.transformer.file_of("transformer_blocks.0.attn.to_k.weight")


def test_bfl_file_inside_the_folder_needs_no_base(folder, tmp_path) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    shutil.copytree(folder, repo)
    save_tensors(
        repo / "flux-2-klein-tiny.safetensors", bfl_transformer_from_diffusers(_state(folder, "transformer"))
    , dif_metadata=False)
    ck = open_checkpoint(repo / "flux-2-klein-tiny.safetensors")
    assert ck.layout == "bfl" and ck.root == repo


def test_bfl_vae_file_loads_same_decoder_weights(folder, tmp_path, torch) -> None:  # type: ignore[no-untyped-def]
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    sd = _state(folder, "vae")
    ref = open_checkpoint(folder)
    vcfg = ref.configs.vae
    ldm = ldm_vae_from_diffusers(sd, len(vcfg.decoder_channels))
    # diffusers' generic ldm converter agrees (it names the quant convs at top level)
    generic = {
        k.replace("encoder.quant_conv", "quant_conv").replace("decoder.post_quant_conv", "post_quant_conv"): v
        for k, v in ldm.items()
        if not k.startswith("bn.")
    }
    back = convert_ldm_vae_checkpoint(
        {k: torch.from_numpy(v.copy()) for k, v in generic.items()},
        {
            "down_block_types": vcfg.down_block_types,
            "up_block_types": vcfg.up_block_types,
            "layers_per_block": vcfg.layers_per_block,
        },
    )
    expected = {k: v for k, v in sd.items() if not k.startswith("bn.")}
    assert sorted(back) == sorted(expected)
    for k, v in expected.items():
        np.testing.assert_array_equal(back[k].numpy().reshape(v.shape), v, err_msg=k)

    path = tmp_path / "flux2-vae.safetensors"
    save_tensors(path, ldm, dif_metadata=False)
    assert safetensors_kind(path) == "bfl-vae"
    bfl = open_checkpoint(folder, vae_file=path)
    program = build_vae_decoder(vcfg, batch=1, latent_h=4, latent_w=6, from_packed=True)
    a = bind_weights(program, ref.vae, ignore=VAE_DECODER_UNUSED).materialize()
    b = bind_weights(program, bfl.vae, ignore=VAE_DECODER_UNUSED).materialize()
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_bfl_extra_and_missing_tensors_are_named(folder, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bfl = bfl_transformer_from_diffusers(_state(folder, "transformer"))
    bfl["double_blocks.0.img_attn.lora_down.weight"] = np.zeros((2, 2), np.float32)
    del bfl["single_blocks.1.linear2.weight"]
    path = tmp_path / "odd.safetensors"
    save_tensors(path, bfl, dif_metadata=False)
    ck = open_checkpoint(path, base=folder)
    program = build_transformer(ck.configs.transformer, batch=1, n_img=2, n_txt=2)
    with pytest.raises(WeightError) as info:
        bind_weights(program, ck.transformer)
    msg = str(info.value)
    assert "missing: 'single_transformer_blocks.1.attn.to_out.weight'" in msg
    assert "unexpected (not used by the program): 'double_blocks.0.img_attn.lora_down.weight' in " in msg
    assert "odd.safetensors" in msg

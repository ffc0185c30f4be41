"""Full-size architectures from the published SD-Turbo / TAESD configs (package data): every parameter
name and shape of dif's programs equals diffusers' / transformers' modules built on the meta device
(no allocation), and the programs read every tensor those modules hold (the VAE's and TAESD's encoder
halves and quant_conv, and CLIP's position_ids buffer, excepted). Counts equal SOURCES.md's.
"""

from __future__ import annotations

import json
import re

import pytest

from dif_frontend_sdturbo.config import TaesdConfig, load_configs
from dif_frontend_sdturbo.configs import published, taesd_config
from dif_frontend_sdturbo.taesd import build_taesd_decoder
from dif_frontend_sdturbo.text_encoder import build_text_encoder
from dif_frontend_sdturbo.unet import build_unet
from dif_frontend_sdturbo.vae import build_vae_decoder

pytestmark = pytest.mark.oracle


def _ours(program) -> dict[str, tuple[int, ...]]:  # type: ignore[no-untyped-def]
    return {p.name: tuple(p.type.shape) for p in program.params}


def _theirs(module, drop: tuple[str, ...] = ()) -> dict[str, tuple[int, ...]]:  # type: ignore[no-untyped-def]
    out = {n: tuple(t.shape) for n, t in module.state_dict().items()}
    return {n: s for n, s in out.items() if not any(re.fullmatch(d, n) for d in drop)}


def _count(module) -> int:  # type: ignore[no-untyped-def]
    return sum(p.numel() for p in module.parameters())


def test_unet(torch) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    root = published("sd-turbo")
    with torch.device("meta"):
        ref = diffusers.UNet2DConditionModel.from_config(json.loads((root / "unet" / "config.json").read_text()))
    assert _count(ref) == 865_910_724
    ours = _ours(build_unet(load_configs(root).unet, latent_h=64, latent_w=64))
    assert ours == _theirs(ref)


def test_text_encoder(torch) -> None:  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    root = published("sd-turbo")
    config = transformers.CLIPTextConfig(**json.loads((root / "text_encoder" / "config.json").read_text()))
    with torch.device("meta"):
        ref = transformers.CLIPTextModel(config)
    assert _count(ref) == 340_387_840
    cfg = load_configs(root).text_encoder
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.hidden_act) == (23, 1024, "gelu")  # OpenCLIP-H, penultimate
    theirs = {n.removeprefix("text_model."): s for n, s in _theirs(ref, (r".*position_ids",)).items()}
    ours = {n.removeprefix("text_model."): s for n, s in _ours(build_text_encoder(cfg, seq_len=77)).items()}
    assert ours == theirs


def test_vae_decoder(torch) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    root = published("sd-turbo")
    with torch.device("meta"):
        ref = diffusers.AutoencoderKL.from_config(json.loads((root / "vae" / "config.json").read_text()))
    assert _count(ref) == 83_653_863
    ours = _ours(build_vae_decoder(load_configs(root).vae, latent_h=64, latent_w=64))
    assert ours == _theirs(ref, (r"encoder\..*", r"quant_conv\..*"))


def test_taesd_decoder(torch) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    data = json.loads(taesd_config().read_text())
    with torch.device("meta"):
        ref = diffusers.AutoencoderTiny.from_config(data)
    assert _count(ref) == 2_445_063
    ours = _ours(build_taesd_decoder(TaesdConfig.from_dict(data), latent_h=64, latent_w=64))
    assert ours == _theirs(ref, (r"encoder\..*",))


def test_original_single_file_rules_cover_the_full_size_models(torch) -> None:  # type: ignore[no-untyped-def]
    """At SD-Turbo's full size, dif's original-file names (single_file.py) for every UNet / VAE decoder tensor
    are the ones diffusers' single-file converter maps back to that tensor (meta tensors: names only)."""
    diffusers = pytest.importorskip("diffusers")
    from diffusers.loaders import single_file_utils as sfu

    from dif_frontend_sdturbo.single_file import ldm_names

    root = published("sd-turbo")
    cfgs = load_configs(root)
    for sub, cls, convert, keep in (
        ("unet", diffusers.UNet2DConditionModel, sfu.convert_ldm_unet_checkpoint, lambda n: True),
        ("vae", diffusers.AutoencoderKL, sfu.convert_ldm_vae_checkpoint,
         lambda n: n.startswith(("decoder.", "post_quant_conv."))),
    ):  # fmt: skip
        config = json.loads((root / sub / "config.json").read_text())
        with torch.device("meta"):
            model = cls.from_config(config)
        names = [n for n in model.state_dict() if keep(n)]
        rules = ldm_names(names, sub, getattr(cfgs, sub))
        # each original tensor gets a distinct marker shape, so the converter's output says which one it moved
        marked = {r.source: torch.empty((i + 1,), device="meta") for i, r in enumerate(rules.values())}
        back = convert(marked, dict(model.config))
        for i, n in enumerate(names):
            assert tuple(back[n].shape) == (i + 1,), n

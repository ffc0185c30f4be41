"""Original (LDM / Stability) whole-checkpoint single files, as stabilityai/sd-turbo ships `sd_turbo.safetensors`:
the tiny diffusers models are written in the original naming by inverting dif's own rules, diffusers' own
single-file converters must map that file back to exactly the diffusers state dicts (so the rules are the
real layout, not just self-consistent), and dif's pipeline on the file gives the folder's image."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from dif.image_pipeline import ImageRequest
from dif.serialize.diftensor import save_tensors
from dif_frontend_sdturbo.plugin import INFO
from dif_frontend_sdturbo.single_file import CLIP_PREFIXES, clip_rules, ldm_names
from dif_frontend_sdturbo.weights import open_checkpoint

pytestmark = pytest.mark.oracle


def _state(module) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    return {k: v.detach().numpy() for k, v in module.state_dict().items()}


def _invert(rules, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """The original-naming tensors that `rules` (diffusers name -> Rule) read back as `state`."""
    parts: dict[str, dict[int, np.ndarray]] = {}
    out: dict[str, np.ndarray] = {}
    for name, rule in rules.items():
        arr = state[name]
        t = rule.transform
        if t is None:
            out[rule.source] = arr
        elif type(t).__name__ == "Chunk":
            parts.setdefault(rule.source, {})[t.index] = arr
        else:  # DropUnitAxes: a linear [O, I] stored as a 1x1 conv
            out[rule.source] = arr.reshape(*arr.shape, 1, 1)
    for source, chunks in parts.items():
        out[source] = np.concatenate([chunks[i] for i in sorted(chunks)], axis=0)
    return out


@pytest.fixture(scope="module")
def original_file(tiny_checkpoint: Path, tmp_path_factory, torch) -> tuple[Path, dict]:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    transformers = pytest.importorskip("transformers")
    ck = open_checkpoint(tiny_checkpoint)
    unet = diffusers.UNet2DConditionModel.from_pretrained(tiny_checkpoint / "unet")
    vae = diffusers.AutoencoderKL.from_pretrained(tiny_checkpoint / "vae")
    text = transformers.CLIPTextModel.from_pretrained(tiny_checkpoint / "text_encoder")
    us, vs = _state(unet), _state(vae)
    ts = {("text_model." + k if not k.startswith("text_model.") else k): v for k, v in _state(text).items()}
    decoder = [n for n in vs if n.startswith(("decoder.", "post_quant_conv."))]
    tensors = {
        **_invert(ldm_names(list(us), "unet", ck.configs.unet), us),
        **_invert(ldm_names(decoder, "vae", ck.configs.vae), vs),
        **_invert(clip_rules(ck.configs.text_encoder, CLIP_PREFIXES[0]), ts),
    }
    # the configs beside the file: the tiny folder's, its weight files removed (the file holds them all)
    folder = tmp_path_factory.mktemp("original") / "sd-turbo-tiny"
    shutil.copytree(tiny_checkpoint, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    path = folder / "sd_turbo_tiny.safetensors"
    save_tensors(path, tensors, {"format": "pt"}, dif_metadata=False)
    return path, {"tensors": tensors, "unet": (unet, us), "vae": (vae, vs), "text": (text, ts), "decoder": decoder}


def test_diffusers_converters_read_the_file_back(original_file, torch) -> None:  # type: ignore[no-untyped-def]
    from diffusers.loaders import single_file_utils as sfu

    _, d = original_file
    ckpt = {k: torch.from_numpy(v) for k, v in d["tensors"].items()}
    unet, us = d["unet"]
    got = sfu.convert_ldm_unet_checkpoint(ckpt, dict(unet.config))
    assert set(got) == set(us) and all(np.array_equal(got[k].numpy(), us[k]) for k in us)
    vae, vs = d["vae"]
    got = sfu.convert_ldm_vae_checkpoint(ckpt, dict(vae.config))
    for k in d["decoder"]:
        assert np.array_equal(got[k].numpy(), vs[k]), k  # shapes too: the 1x1 convs come back as linears
    text, ts = d["text"]
    got = sfu.convert_open_clip_checkpoint(text, ckpt, prefix=CLIP_PREFIXES[0])
    got = {("text_model." + k if not k.startswith("text_model.") else k): v for k, v in got.items()}
    for k, v in ts.items():
        if not k.endswith("position_ids"):
            assert np.array_equal(got[k].numpy(), v), k


def test_pipeline_on_the_file_equals_the_folder(original_file, tiny_checkpoint: Path) -> None:  # type: ignore[no-untyped-def]
    path, _ = original_file
    assert INFO.detect(path)
    req = ImageRequest("a red fox in the snow", seed=4, width=128, height=64)
    from_file = INFO.pipeline(path, dtype="f32", backend="cpu").generate(req)
    from_folder = INFO.pipeline(tiny_checkpoint, dtype="f32", backend="cpu").generate(req)
    assert from_file.settings["steps"] == 1  # "turbo" in the file name
    np.testing.assert_array_equal(from_file.latents, from_folder.latents)
    np.testing.assert_array_equal(from_file.pixels, from_folder.pixels)


def test_file_without_tokenizer_refused(original_file, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from dif.errors import CheckpointError

    path, _ = original_file
    alone = tmp_path / path.name  # no folder, no tokenizer beside it
    shutil.copyfile(path, alone)
    with pytest.raises(CheckpointError, match="holds no tokenizer"):
        open_checkpoint(alone)

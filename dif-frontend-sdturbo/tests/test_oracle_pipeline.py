"""Oracle parity of the whole product path (fp32, dif's CPU backend) against diffusers'
StableDiffusionPipeline from the same initial noise: SD-Turbo's 1 step (t = 999, no CFG) with the KL VAE
and with TAESD, and a "base" checkpoint (leading spacing, 3 Euler steps, CFG 7.5). Also the schedule
itself against EulerDiscreteScheduler, and the tokenizer against transformers' CLIPTokenizer.
Gate: rel-L2 1e-5 on latents and on the decoded float image.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dif.image_pipeline import ImageRequest
from dif_frontend_sdturbo.config import SchedulerConfig
from dif_frontend_sdturbo.pipeline import unpack_latents
from dif_frontend_sdturbo.plugin import INFO
from dif_frontend_sdturbo.sampling import discrete_schedule
from dif_frontend_sdturbo.tokenize import ClipTokenizer

pytestmark = pytest.mark.oracle
GATE = 1e-5
PROMPT = "a photo of a red fox sitting in the snow, cinematic lighting"


def _reference(root: Path, torch, **kw):  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(root, safety_checker=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    for key, value in kw.items():
        setattr(pipe, key, value) if key != "vae" else pipe.register_modules(vae=value)
    return pipe


def _noise(torch, shape):  # type: ignore[no-untyped-def]
    return torch.randn(shape, generator=torch.Generator().manual_seed(7))


def _dif_run(root: Path, noise, *, fast_vae=False, steps=1, guidance=0.0, taesd=None, negative=""):  # type: ignore[no-untyped-def]
    pipe = INFO.pipeline(root, dtype="f32", backend="cpu", fast_vae=fast_vae, taesd=taesd)
    h, w = (8 * d for d in noise.shape[2:])
    req = ImageRequest(
        PROMPT, negative, steps=steps, guidance=guidance, seed=0, width=w, height=h, init_noise=noise.numpy()
    )
    run = pipe.generate(req)
    return pipe, unpack_latents(run.latents, *noise.shape[2:]), run


def test_schedule_matches_euler_discrete(torch) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    for spacing, offset in (("trailing", 1), ("leading", 1), ("linspace", 0)):
        kw = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", timestep_spacing=spacing,
                  steps_offset=offset)  # fmt: skip
        ref = diffusers.EulerDiscreteScheduler(**kw)
        ours_cfg = SchedulerConfig.from_dict(kw)
        for steps in (1, 2, 4, 25):
            ref.set_timesteps(steps)
            ours = discrete_schedule(ours_cfg, steps)
            np.testing.assert_array_equal(ours.timesteps, ref.timesteps.numpy())
            np.testing.assert_allclose(ours.sigmas, ref.sigmas.numpy(), rtol=1e-6, atol=0)
    ref = diffusers.EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                           timestep_spacing="trailing")  # fmt: skip
    ref.set_timesteps(1)
    assert float(ref.timesteps[0]) == 999.0 and abs(float(ref.sigmas[0]) - 14.6146) < 1e-4


def test_tokenizer_matches_clip_tokenizer(tiny_checkpoint: Path) -> None:
    transformers = pytest.importorskip("transformers")
    ref = transformers.CLIPTokenizer.from_pretrained(tiny_checkpoint / "tokenizer")
    ours = ClipTokenizer.from_folder(tiny_checkpoint / "tokenizer")
    texts = [PROMPT, "", "A  Dragon\tflying   over 4 CASTLES!!", "über café, naïve — 8k hdr", "x " * 100]
    for text in texts:
        want = ref(text, padding="max_length", max_length=77, truncation=True, return_tensors="np").input_ids
        np.testing.assert_array_equal(ours.encode_padded(text, 77), want)
    assert ours.pad_id == ref.pad_token_id == 0  # SD 2.x pads with "!"


def test_turbo_one_step_kl_vae(torch, tiny_checkpoint: Path, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    ref = _reference(tiny_checkpoint, torch)
    noise = _noise(torch, (1, 4, 16, 16))
    kw = dict(num_inference_steps=1, guidance_scale=0.0, latents=noise)
    want_latents = ref(PROMPT, output_type="latent", **kw).images.numpy()
    want_image = ref(PROMPT, output_type="np", **kw).images[0]
    pipe, latents, run = _dif_run(tiny_checkpoint, noise)
    assert run.settings["steps"] == 1 and not run.settings["cfg"]
    assert rel_l2_fn(latents, want_latents) <= GATE
    image = np.clip(pipe.decode_image(latents)[0].transpose(1, 2, 0) / 2 + 0.5, 0, 1)
    assert rel_l2_fn(image, want_image) <= GATE
    assert np.abs(run.pixels.astype(int) - np.round(want_image * 255).astype(int)).max() <= 1


def test_turbo_one_step_taesd(torch, tiny_checkpoint: Path, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    folder = tiny_checkpoint.parent / f"{tiny_checkpoint.name}-taesd"
    ref = _reference(tiny_checkpoint, torch, vae=diffusers.AutoencoderTiny.from_pretrained(folder))
    noise = _noise(torch, (1, 4, 16, 16))
    want_image = ref(PROMPT, output_type="np", num_inference_steps=1, guidance_scale=0.0, latents=noise).images[0]
    pipe, latents, run = _dif_run(tiny_checkpoint, noise, fast_vae=True, taesd=folder)
    assert run.settings["vae"].startswith("taesd")
    image = np.clip(pipe.decode_image(latents)[0].transpose(1, 2, 0), 0, 1)
    assert rel_l2_fn(image, want_image) <= GATE


def test_base_checkpoint_three_steps_cfg(torch, tiny_checkpoint: Path, tmp_path: Path, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "sd-base-tiny"
    shutil.copytree(tiny_checkpoint, root)
    sched = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
    sched["timestep_spacing"] = "leading"
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(sched))
    ref = _reference(root, torch)
    noise = _noise(torch, (1, 4, 16, 8))
    kw = dict(num_inference_steps=3, guidance_scale=7.5, latents=noise, negative_prompt="blurry")
    want = ref(PROMPT, output_type="latent", **kw).images.numpy()
    pipe, latents, run = _dif_run(root, noise, steps=3, guidance=7.5, negative="blurry")
    assert pipe.checkpoint.kind == "base" and run.settings["cfg"]
    assert rel_l2_fn(latents, want) <= GATE

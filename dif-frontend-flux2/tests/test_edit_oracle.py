"""Oracle parity of FLUX.2 [klein] editing, img2img, inpainting and batches against diffusers (fp32).

The tiny random pipeline of test_pipeline_oracle is saved with `save_pretrained` and loaded by dif.
Reference images (1 and 3, non-square, different sizes, some cropped to the token grid) go to
`Flux2KleinPipeline(image=[...])`; img2img and inpainting to `Flux2KleinInpaintPipeline` (img2img is
its all-white mask: diffusers has no klein img2img pipeline), whose seeded noise is replaced by ours
(given explicit `latents` that pipeline would skip the noising); a batch of 3 to `Flux2KleinPipeline`
with `num_images_per_prompt=3` and the three noises as `latents`. Final latents and decoded images must
agree to rel-L2 <= 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dif.dtypes import DType
from dif.image_pipeline import image_request
from dif_frontend_flux2.pipeline import Flux2Pipeline
from dif_frontend_flux2.weights import open_checkpoint

from .conftest import randomize_, rel_l2
from .test_pipeline_oracle import PROMPT, build_reference

pytestmark = pytest.mark.oracle

TOL = 1e-5
STEPS = 4


def write_image(path: Path, width: int, height: int, seed: int, mode: str = "RGB") -> Path:
    """A PNG of smooth content plus noise (resizing and cropping change its numbers visibly)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    yy, xx = np.mgrid[0:height, 0:width]
    base = (xx * 200 // max(width - 1, 1) + yy * 55 // max(height - 1, 1))[..., None]
    pixels = np.clip(base + rng.integers(-40, 40, (height, width, channels)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels[..., 0] if mode == "L" else pixels, mode).save(path)
    return path


def final_latents(seen: list[np.ndarray]):  # type: ignore[no-untyped-def]
    """A diffusers step-end callback recording the latents after each step into `seen`."""

    def capture(_pipe, _i, _t, kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["latents"].float().numpy().copy())
        return {}

    return capture


@pytest.fixture(scope="module")
def klein(tmp_path_factory):  # type: ignore[no-untyped-def]
    """(checkpoint folder, diffusers Flux2KleinPipeline) of the tiny distilled klein."""
    torch = pytest.importorskip("torch", reason="oracle tests need torch")
    torch.set_grad_enabled(False)
    from dif_frontend_flux2.configs import published

    pipe = build_reference(torch, randomize_, published, distilled=True)
    folder = tmp_path_factory.mktemp("klein")
    pipe.save_pretrained(folder)
    return folder, pipe


@pytest.fixture(scope="module")
def ours(klein):  # type: ignore[no-untyped-def]
    return Flux2Pipeline(open_checkpoint(klein[0]), dtype=DType.F32)


def _decoded(ours: Flux2Pipeline, latents: np.ndarray, h: int, w: int) -> np.ndarray:
    """(H, W, 3) float image in [0, 1] as diffusers' postprocess(output_type="np") gives it."""
    raw = next(iter(ours._vae_runner(h, w, pixels=False)({"latents": latents}).values()))[0]
    return np.clip(raw.transpose(1, 2, 0) * np.float32(0.5) + np.float32(0.5), 0.0, 1.0)


def _compare(ours: Flux2Pipeline, runs: list[Any], ref_latents: np.ndarray, ref_images: np.ndarray) -> list[float]:
    """rel-L2 of latents and decoded image per image of a batch; asserts each is within TOL."""
    errors = []
    for i, run in enumerate(runs):
        h, w = run.settings["height"] // 16, run.settings["width"] // 16
        assert run.latents.shape == (1, h * w, 128)
        e_lat = rel_l2(run.latents, ref_latents[i : i + 1])
        e_img = rel_l2(_decoded(ours, run.latents, h, w), ref_images[i])
        errors += [e_lat, e_img]
        assert e_lat <= TOL and e_img <= TOL, (i, e_lat, e_img)
    return errors


# -- reference images ----------------------------------------------------------------------------

REFS_ONE = [(96, 64, "RGB")]  # 6 x 4 tokens, landscape
REFS_THREE = [(70, 90, "RGB"), (112, 64, "RGBA"), (64, 64, "RGB")]  # 70x90 is cropped to 64x80


@pytest.mark.parametrize(
    "refs, size",
    [
        # measured (fp32, CPU backend): latents 2.5e-07, image 5.7e-07
        (REFS_ONE, None),  # the output takes the reference's size (96x64)
        # measured (fp32, CPU backend): latents 2.5e-07, image 6.1e-07
        (REFS_THREE, (64, 48)),
    ],
)
def test_reference_images_match_flux2_klein_pipeline(klein, ours, tmp_path, refs, size) -> None:  # type: ignore[no-untyped-def]
    import torch
    from PIL import Image

    folder, pipe = klein
    paths = [write_image(tmp_path / f"ref{i}.png", w, h, 30 + i, mode) for i, (w, h, mode) in enumerate(refs)]
    width, height = size or (refs[0][0] // 16 * 16, refs[0][1] // 16 * 16)
    h, w = height // 16, width // 16
    noise = np.random.default_rng(3).standard_normal((1, 128, h, w)).astype(np.float32)
    seen: list[np.ndarray] = []
    out = pipe(
        prompt=PROMPT, image=[Image.open(p) for p in paths], height=height, width=width,
        num_inference_steps=STEPS, latents=torch.from_numpy(noise), output_type="np",
        callback_on_step_end=final_latents(seen),
    )  # fmt: skip
    given = {} if size is None else {"width": width, "height": height}
    req = image_request(PROMPT, {"steps": STEPS, "seed": 0, **given}, init_noise=noise, ref_images=paths)
    run = ours.generate(req)
    assert (run.settings["width"], run.settings["height"]) == (width, height)
    assert run.settings["reference_images"] == [str(p) for p in paths]
    _compare(ours, [run], seen[-1], out.images)


def test_reference_preprocessing_matches_the_image_processor(klein, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Sizes diffusers scales (over 1 MP), crops (off the grid) or keeps, and modes it converts."""
    from PIL import Image

    from dif.media.image_input import read_image
    from dif_frontend_flux2.image_inputs import reference_pixels

    _, pipe = klein
    processor = pipe.image_processor
    for i, (w, h, mode) in enumerate([(1100, 1000, "RGB"), (1500, 700, "RGBA"), (83, 77, "L"), (64, 512, "RGB")]):
        path = write_image(tmp_path / f"p{i}.png", w, h, i, mode)
        img = Image.open(path)
        if img.width * img.height > 1024 * 1024:
            img = processor._resize_to_target_area(img, 1024 * 1024)
        rw, rh = img.width // 16 * 16, img.height // 16 * 16
        expected = processor.preprocess(img, height=rh, width=rw, resize_mode="crop").numpy()
        got = reference_pixels(read_image(path, what="reference image"), 16)
        assert got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


# -- img2img and inpainting ----------------------------------------------------------------------


def _inpaint_reference(klein, monkeypatch, noise, **call):  # type: ignore[no-untyped-def]
    """Flux2KleinInpaintPipeline on the same modules, its seeded noise replaced by `noise`."""
    import diffusers
    import torch
    from diffusers.pipelines.flux2 import pipeline_flux2_klein_inpaint as module

    _, base = klein
    pipe = diffusers.Flux2KleinInpaintPipeline(
        scheduler=base.scheduler, vae=base.vae, text_encoder=base.text_encoder, tokenizer=base.tokenizer,
        transformer=base.transformer, is_distilled=True,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    monkeypatch.setattr(module, "randn_tensor", lambda shape, **_: torch.from_numpy(noise).reshape(shape))
    seen: list[np.ndarray] = []
    out = pipe(
        prompt=PROMPT, num_inference_steps=STEPS, output_type="np", callback_on_step_end=final_latents(seen), **call
    )
    return seen, out.images


@pytest.mark.parametrize(
    "strength, masked",
    [
        # measured (fp32, CPU backend): latents 2.6e-07, image 5.7e-07; 3 of 4 steps run
        (0.6, False),
        # measured (fp32, CPU backend): latents 7.8e-07, image 6.8e-07
        (0.8, True),
    ],
)
def test_img2img_and_inpainting_match_flux2_klein_inpaint_pipeline(
    klein, ours, tmp_path, monkeypatch, strength, masked
) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    source = write_image(tmp_path / "source.png", 100, 70, 5)  # resized (not cropped) to 96x64
    if masked:
        m = np.zeros((70, 100), np.uint8)
        m[10:50, 30:90] = 255
        m[55:, :20] = 140  # >= 0.5 after /255: repainted
        Image.fromarray(m, "L").save(mask_path := tmp_path / "mask.png")
    else:
        Image.new("L", (100, 70), 255).save(mask_path := tmp_path / "white.png")
    h, w = 4, 6
    noise = np.random.default_rng(11).standard_normal((1, 128, h, w)).astype(np.float32)
    seen, images = _inpaint_reference(
        klein, monkeypatch, noise, image=Image.open(source), mask_image=Image.open(mask_path), strength=strength
    )
    inputs: dict[str, Any] = {"init_image": source, "strength": strength}
    if masked:
        inputs["mask"] = mask_path
    req = image_request(PROMPT, {"steps": STEPS, "seed": 0}, init_noise=noise, **inputs)
    run = ours.generate(req)
    assert run.settings["denoised_steps"] == len(seen) == STEPS - int(STEPS - STEPS * strength)
    assert run.settings["steps"] == STEPS and run.settings["strength"] == strength
    _compare(ours, [run], seen[-1], images)


def test_init_image_and_mask_preprocessing_match_the_processors(klein, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import diffusers
    import torch
    from PIL import Image

    from dif.media.image_input import read_image
    from dif_frontend_flux2.image_inputs import init_pixels, mask_tokens

    _, base = klein
    pipe = diffusers.Flux2KleinInpaintPipeline(
        scheduler=base.scheduler, vae=base.vae, text_encoder=base.text_encoder, tokenizer=base.tokenizer,
        transformer=base.transformer,
    )  # fmt: skip
    source = write_image(tmp_path / "s.png", 131, 75, 1, "RGBA")
    rng = np.random.default_rng(2)
    Image.fromarray(rng.integers(0, 256, (75, 131, 3), dtype=np.uint8), "RGB").save(mask := tmp_path / "m.png")
    expected = pipe.image_processor.preprocess(Image.open(source), 64, 128, resize_mode="default").numpy()
    np.testing.assert_array_equal(init_pixels(read_image(source, what="init image"), 16), expected)
    cond = pipe.mask_processor.preprocess(Image.open(mask), height=64, width=128, resize_mode="default")
    ref_mask = pipe.prepare_mask_latents(cond, 1, 1, 64, 128, torch.float32, "cpu").numpy()
    np.testing.assert_array_equal(mask_tokens(read_image(mask, what="mask"), 128, 64, 16), ref_mask)


# -- batches -------------------------------------------------------------------------------------


def test_a_batch_of_three_matches_num_images_per_prompt(klein, ours) -> None:  # type: ignore[no-untyped-def]
    """One denoiser program of batch 3 vs diffusers' batch of 3 from the same three noises; then the
    seeded batch: image i is the image a single run with seed + i makes."""
    import torch

    _, pipe = klein
    width, height = 64, 48
    h, w = height // 16, width // 16
    noise = np.random.default_rng(5).standard_normal((3, 128, h, w)).astype(np.float32)
    seen: list[np.ndarray] = []
    out = pipe(
        prompt=PROMPT, height=height, width=width, num_inference_steps=STEPS, num_images_per_prompt=3,
        latents=torch.from_numpy(noise), output_type="np", callback_on_step_end=final_latents(seen),
    )  # fmt: skip
    settings = {"steps": STEPS, "seed": 40, "width": width, "height": height}
    runs = ours.generate_batch(image_request(PROMPT, settings, init_noise=noise, batch=3))
    assert len(runs) == 3
    # measured (fp32, CPU backend): latents <= 3.1e-07, images <= 7.6e-07
    _compare(ours, runs, seen[-1], out.images)

    seeded = ours.generate_batch(image_request(PROMPT, settings, batch=3))
    assert [r.settings["seed"] for r in seeded] == [40, 41, 42]
    assert [r.settings["batch_index"] for r in seeded] == [0, 1, 2]
    single = ours.generate(image_request(PROMPT, {**settings, "seed": 41}))
    np.testing.assert_array_equal(single.noise, seeded[1].noise)
    assert rel_l2(seeded[1].latents, single.latents) <= TOL


# -- the reference K/V cache (klein KV) ----------------------------------------------------------


@pytest.fixture(scope="module")
def klein_kv(klein, tmp_path_factory):  # type: ignore[no-untyped-def]
    """(folder, Flux2KleinKVPipeline) on a copy of the tiny modules (the KV pipeline swaps the
    transformer's attention processors), saved as a KV checkpoint (model_index `Flux2KleinKVPipeline`)."""
    import copy

    import diffusers

    _, base = klein
    pipe = diffusers.Flux2KleinKVPipeline(
        scheduler=base.scheduler, vae=base.vae, text_encoder=base.text_encoder, tokenizer=base.tokenizer,
        transformer=copy.deepcopy(base.transformer),
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    folder = tmp_path_factory.mktemp("klein_kv")
    pipe.save_pretrained(folder)
    return folder, pipe


@pytest.mark.parametrize(
    "refs, batch",
    [
        # measured (fp32, CPU backend): latents 2.4e-07, image 5.4e-07
        (REFS_ONE, 1),
        # measured (fp32, CPU backend): latents <= 2.6e-07, images <= 6.7e-07
        (REFS_THREE, 2),
    ],
)
def test_the_kv_cache_matches_flux2_klein_kv_pipeline(klein_kv, tmp_path, refs, batch) -> None:  # type: ignore[no-untyped-def]
    """A KV checkpoint runs with the cache by default: the references' keys/values from one program,
    then every step attends to them (diffusers: step 0 extracts them, steps 1+ reuse them)."""
    import torch
    from PIL import Image

    folder, pipe = klein_kv
    ours = Flux2Pipeline(open_checkpoint(folder), dtype=DType.F32)
    assert ours.checkpoint.configs.pipeline.kv_cache and ours.checkpoint.is_distilled
    paths = [write_image(tmp_path / f"ref{i}.png", w, h, 50 + i, mode) for i, (w, h, mode) in enumerate(refs)]
    width, height = 64, 48
    noise = np.random.default_rng(8).standard_normal((batch, 128, height // 16, width // 16)).astype(np.float32)
    seen: list[np.ndarray] = []
    out = pipe(
        prompt=PROMPT, image=[Image.open(p) for p in paths], height=height, width=width,
        num_inference_steps=STEPS, num_images_per_prompt=batch, latents=torch.from_numpy(noise), output_type="np",
        callback_on_step_end=final_latents(seen),
    )  # fmt: skip
    settings = {"steps": STEPS, "seed": 0, "width": width, "height": height}
    req = image_request(PROMPT, settings, init_noise=noise, ref_images=paths, batch=batch)
    runs = ours.generate_batch(req)
    assert all(r.settings["kv_cache"] is True for r in runs) and not runs[0].warnings
    _compare(ours, runs, seen[-1], out.images)
    # the cached form is another model: full joint attention (--no-kv-cache) gives another image
    full = ours.generate_batch(
        image_request(PROMPT, settings, init_noise=noise, ref_images=paths, batch=batch, kv_cache=False)
    )
    assert rel_l2(full[0].latents, seen[-1][:1]) > 1e-3
    assert any("--no-kv-cache" in w for w in full[0].warnings)


@pytest.mark.parametrize("variant", ["klein-4b", "klein-9b"])
def test_full_size_reference_kv_reads_exactly_the_reference_stream(variant) -> None:  # type: ignore[no-untyped-def]
    """At the published sizes the reference K/V program's parameters plus `reference_kv_unused` cover the
    transformer's state dict exactly (every tensor is read or named unused, none twice), and the cached
    denoiser takes one (1, n, heads, head_dim) input per block and k/v."""
    import re

    from dif_frontend_flux2.config import load_configs
    from dif_frontend_flux2.configs import published
    from dif_frontend_flux2.model import build_reference_kv, build_transformer, reference_kv_unused

    cfg = load_configs(published(variant)).transformer
    full = {p.name: p.type.shape for p in build_transformer(cfg, batch=1, n_img=4, n_txt=3).params}
    ref = {p.name: p.type.shape for p in build_reference_kv(cfg, n_ref=4, dtype="bf16").params}
    unused = [n for n in full if any(re.fullmatch(r, n) for r in reference_kv_unused(cfg))]
    assert set(ref).isdisjoint(unused) and set(ref) | set(unused) == set(full)
    assert all(full[n] == shape for n, shape in ref.items())
    cached = build_transformer(cfg, batch=2, n_img=4, n_txt=3, n_ref_cached=6)
    kv_inputs = [i for i in cached.inputs if i.name.startswith("ref_")]
    assert len(kv_inputs) == 2 * (cfg.num_layers + cfg.num_single_layers)
    assert {i.type.shape for i in kv_inputs} == {(1, 6, cfg.num_attention_heads, cfg.attention_head_dim)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_noising_and_the_inpainting_blend_round_as_torch(dtype: str) -> None:
    """img2img's start (`scale_noise` at the strength's sigma) and the per-step blend, bit for bit with
    diffusers' scheduler and the pipeline's expression in the run dtype."""
    torch = pytest.importorskip("torch", reason="oracle tests need torch")
    import diffusers
    import ml_dtypes

    from dif.image_pipeline import inpaint_blend, noised

    np_dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    t_dt = getattr(torch, dtype)
    rng = np.random.default_rng(0)
    sample, noise, latents = (rng.standard_normal((2, 12, 128)).astype(np.float32).astype(np_dt) for _ in range(3))
    mask = np.floor(rng.uniform(0, 5, (1, 12, 1))).astype(np.float32) / 4  # multiples of 1/4, as per-token averages
    sched = diffusers.FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential")
    sched.set_timesteps(sigmas=np.linspace(1.0, 0.25, 4), mu=1.3)
    sched.set_begin_index(1)

    def t(a: np.ndarray):  # type: ignore[no-untyped-def]
        return torch.from_numpy(a.astype(np.float32)).to(t_dt)

    want = sched.scale_noise(t(sample), sched.timesteps[1:2], t(noise)).float().numpy()
    got = noised(sample, noise, sched.sigmas[1].numpy(), np_dt)
    assert got.dtype == np_dt
    np.testing.assert_array_equal(got.astype(np.float32), want)
    m = t(mask)
    want_blend = ((1 - m) * t(sample) + m * t(latents)).float().numpy()
    np.testing.assert_array_equal(inpaint_blend(latents, sample, mask, np_dt).astype(np.float32), want_blend)


def test_strength_skips_the_steps_get_timesteps_skips(klein) -> None:  # type: ignore[no-untyped-def]
    """For every step count 1..12 and strengths across (0, 1]: the same remaining timesteps as
    Flux2KleinInpaintPipeline.get_timesteps, or the refusal where it would raise (no step left)."""
    import copy
    import types

    import diffusers

    from dif.errors import UsageError
    from dif.image_pipeline import strength_schedule
    from dif_frontend_flux2.pipeline import klein_schedule

    _, base = klein
    scheduler = copy.deepcopy(base.scheduler)
    host = types.SimpleNamespace(scheduler=scheduler)
    for n in range(1, 13):
        for strength in (0.01, 0.1, 0.25, 1 / 3, 0.5, 0.6, 0.75, 0.8, 0.99, 1.0):
            schedule = klein_schedule(24, n)
            scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / n, n), mu=schedule.mu)
            want, left = diffusers.Flux2KleinInpaintPipeline.get_timesteps(host, n, strength, "cpu")
            if left < 1:
                with pytest.raises(UsageError, match="leaves no step"):
                    strength_schedule(schedule, strength)
                continue
            got = strength_schedule(schedule, strength)
            assert got.num_steps == left
            np.testing.assert_array_equal(got.timesteps, want.numpy())
            np.testing.assert_array_equal(got.sigmas, scheduler.sigmas.numpy()[n - left :])


def test_reference_images_with_cfg_on_a_base_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Base klein with CFG: the negative-prompt pass sees the reference tokens too (as diffusers' does)."""
    torch = pytest.importorskip("torch", reason="oracle tests need torch")
    from PIL import Image

    from dif_frontend_flux2.configs import published

    pipe = build_reference(torch, randomize_, published, distilled=False)
    pipe.save_pretrained(folder := tmp_path / "base")
    paths = [write_image(tmp_path / f"ref{i}.png", w, h, 70 + i) for i, (w, h) in enumerate([(64, 80), (96, 64)])]
    noise = np.random.default_rng(12).standard_normal((1, 128, 3, 4)).astype(np.float32)
    seen: list[np.ndarray] = []
    out = pipe(
        prompt=PROMPT, image=[Image.open(p) for p in paths], height=48, width=64, num_inference_steps=3,
        guidance_scale=4.0, latents=torch.from_numpy(noise), output_type="np", callback_on_step_end=final_latents(seen),
    )  # fmt: skip
    ours = Flux2Pipeline(open_checkpoint(folder), dtype=DType.F32)
    settings = {"steps": 3, "guidance": 4.0, "seed": 0, "width": 64, "height": 48}
    run = ours.generate(image_request(PROMPT, settings, init_noise=noise, ref_images=paths))
    assert run.settings["cfg"] is True
    # measured (fp32, CPU backend): latents 6.9e-07, image 7.6e-07
    _compare(ours, [run], seen[-1], out.images)

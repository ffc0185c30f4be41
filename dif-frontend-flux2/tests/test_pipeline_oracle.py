"""Oracle parity of the whole sampling path: dif's FLUX.2 [klein] pipeline vs diffusers' Flux2KleinPipeline.

A tiny pipeline (random weights, real Qwen tokenizer, published scheduler config) is built in torch,
saved with `save_pretrained`, and loaded by dif from that folder. Both run fp32 from the same
initial noise; final packed latents and the decoded image must agree to rel-L2 <= 1e-5, for the
distilled path (no CFG) and the base path (CFG with the empty negative prompt).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dif.dtypes import DType
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.pipeline import Flux2Pipeline, GenerationRequest, klein_schedule
from dif_frontend_flux2.weights import open_checkpoint

pytestmark = pytest.mark.oracle

QWEN = DEFAULT_CHECKPOINT / "tokenizer"  # the real Qwen3 tokenizer files FLUX.2 [klein] ships
PROMPT = "A tiny red fox, watercolor, 35mm"
HEIGHT, WIDTH = 48, 64  # 3 x 4 tokens: non-square catches h/w mix-ups
TOL = 1e-5
# Qwen3's template for the one case the pipeline renders (single user turn, thinking off).
QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def build_reference(torch, randomize, model_configs: Callable[[str], Path], *, distilled: bool):  # type: ignore[no-untyped-def]
    """A tiny Flux2KleinPipeline with randomized weights (fp32)."""
    diffusers = pytest.importorskip("diffusers")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    transformer = diffusers.Flux2Transformer2DModel(
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=3 * 32,
        in_channels=128,
        timestep_guidance_channels=64,
        axes_dims_rope=(4, 4, 4, 4),
        rope_theta=2000,
        mlp_ratio=3.0,
        guidance_embeds=False,
    )
    text_encoder = transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(
            vocab_size=151936,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=28,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            rms_norm_eps=1e-6,
            rope_theta=1_000_000.0,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
        )
    )
    vae = diffusers.AutoencoderKLFlux2(
        block_out_channels=(16, 32, 32, 32),
        layers_per_block=1,
        latent_channels=32,
        norm_num_groups=8,
        mid_block_add_attention=True,
        sample_size=64,
    )
    for i, module in enumerate((transformer, text_encoder, vae)):
        randomize(module, torch, seed=10 + i)
    scheduler_config = json.loads((model_configs("klein-4b") / "scheduler" / "scheduler_config.json").read_text())
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(scheduler_config)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(QWEN))
    tokenizer.chat_template = QWEN3_TEMPLATE
    pipe = diffusers.Flux2KleinPipeline(
        scheduler=scheduler,
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        transformer=transformer.eval(),
        is_distilled=distilled,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_reference(torch, pipe, noise: np.ndarray, steps: int, guidance: float, **call):  # type: ignore[no-untyped-def]
    """(final packed latents, image in [0, 1] (H, W, 3), prompt features) from diffusers (`call`: more
    arguments of the pipeline call, e.g. max_sequence_length)."""
    seen: list[np.ndarray] = []

    def capture(_pipe, _i, _t, kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["latents"].float().numpy().copy())
        return {}

    out = pipe(
        prompt=PROMPT,
        height=HEIGHT,
        width=WIDTH,
        num_inference_steps=steps,
        guidance_scale=guidance,
        latents=torch.from_numpy(noise),
        output_type="np",
        callback_on_step_end=capture,
        **call,
    )
    features, _ = pipe.encode_prompt(PROMPT, **call)
    assert len(seen) == steps
    return seen[-1], out.images[0], features.float().numpy()


@pytest.mark.parametrize(
    "distilled, steps, guidance",
    [
        # measured (fp32, CPU backend): features 3.9e-07, latents 1.5e-06, image 1.1e-06
        (True, 4, 1.0),
        # measured (fp32, CPU backend, CFG 4.0 with "" as negative): latents 2.7e-06, image 1.8e-06
        (False, 3, 4.0),
    ],
)
def test_sampling_loop_matches_diffusers(
    torch, randomize, model_configs, rel_l2_fn, tmp_path, distilled, steps, guidance
):  # type: ignore[no-untyped-def]
    pipe = build_reference(torch, randomize, model_configs, distilled=distilled)
    pipe.save_pretrained(tmp_path)
    h, w = HEIGHT // 16, WIDTH // 16
    noise = np.random.default_rng(7).standard_normal((1, 128, h, w)).astype(np.float32)
    ref_latents, ref_image, ref_features = run_reference(torch, pipe, noise, steps, guidance)

    ours = Flux2Pipeline(open_checkpoint(tmp_path), dtype=DType.F32)
    assert ours.checkpoint.is_distilled is distilled
    result = ours.generate(
        GenerationRequest(PROMPT, steps=steps, guidance=guidance, width=WIDTH, height=HEIGHT, init_noise=noise)
    )
    assert result.settings["cfg"] is (not distilled)
    # the schedule is the scheduler's, bit for bit
    np.testing.assert_array_equal(klein_schedule(h * w, steps).sigmas, pipe.scheduler.sigmas.numpy())

    assert rel_l2_fn(ours.encode(PROMPT), ref_features) <= TOL
    assert result.latents.shape == ref_latents.shape == (1, h * w, 128)
    assert rel_l2_fn(result.latents, ref_latents) <= TOL

    raw = next(iter(ours._vae_runner(h, w, pixels=False)({"latents": result.latents}).values()))[0]
    image = np.clip(raw.transpose(1, 2, 0) * np.float32(0.5) + np.float32(0.5), 0.0, 1.0)
    assert image.shape == ref_image.shape == (HEIGHT, WIDTH, 3)
    assert rel_l2_fn(image, ref_image) <= TOL
    ref_pixels = (ref_image * 255).round().astype(np.uint8)
    assert np.abs(result.pixels.astype(int) - ref_pixels.astype(int)).max() <= 1
    # a second image at this size reuses the first one's RoPE tables (made once, frozen) and gets its latents
    again = ours.generate(
        GenerationRequest(PROMPT, steps=steps, guidance=guidance, width=WIDTH, height=HEIGHT, init_noise=noise)
    )
    np.testing.assert_array_equal(again.latents, result.latents)
    (tables,) = ours._rope.values()
    assert not any(t.flags.writeable for t in tables)


def test_checkpoint_max_sequence_length_is_the_call_argument(torch, randomize, model_configs, rel_l2_fn, tmp_path):  # type: ignore[no-untyped-def]
    """A model_index.json `max_sequence_length` (the embedded demo model's 32) runs as diffusers called with
    max_sequence_length=32: features (1, 32, D), the same latents and image; without it, 512."""
    pipe = build_reference(torch, randomize, model_configs, distilled=True)
    pipe.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    (tmp_path / "model_index.json").write_text(json.dumps({**index, "max_sequence_length": 32}))
    h, w = HEIGHT // 16, WIDTH // 16
    noise = np.random.default_rng(7).standard_normal((1, 128, h, w)).astype(np.float32)
    ref_latents, ref_image, ref_features = run_reference(torch, pipe, noise, 4, 1.0, max_sequence_length=32)

    ours = Flux2Pipeline(open_checkpoint(tmp_path), dtype=DType.F32)
    assert ours.text_length == 32
    result = ours.generate(GenerationRequest(PROMPT, width=WIDTH, height=HEIGHT, init_noise=noise))
    features = ours.encode(PROMPT)
    assert features.shape == ref_features.shape == (1, 32, 96)
    assert rel_l2_fn(features, ref_features) <= TOL
    assert rel_l2_fn(result.latents, ref_latents) <= TOL
    assert np.abs(result.pixels.astype(int) - (ref_image * 255).round().astype(int)).max() <= 1
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    assert Flux2Pipeline(open_checkpoint(tmp_path)).text_length == 512


def test_default_steps_and_guidance_follow_is_distilled(torch, randomize, model_configs, tmp_path):  # type: ignore[no-untyped-def]
    """Base: 50 steps, CFG 4.0 by default; distilled: 4 steps, guidance ignored with a warning."""
    for distilled in (False, True):
        folder = tmp_path / str(distilled)
        build_reference(torch, randomize, model_configs, distilled=distilled).save_pretrained(folder)
        pipe = Flux2Pipeline(open_checkpoint(folder))
        steps, guidance, use_cfg, warnings = pipe.resolve(GenerationRequest("x"))
        assert (steps, guidance, use_cfg) == ((4, 1.0, False) if distilled else (50, 4.0, True))
        assert warnings == []
        warned = pipe.resolve(GenerationRequest("x", guidance=3.0))[3]
        assert bool(warned) is distilled and (not warned or "ignored" in warned[0])


@pytest.mark.parametrize(
    "config",
    [
        {"use_dynamic_shifting": True, "time_shift_type": "exponential"},
        {"use_dynamic_shifting": True, "time_shift_type": "linear"},
        {"use_dynamic_shifting": False, "shift": 3.0},
    ],
)
def test_schedule_follows_the_checkpoint_scheduler_config(tmp_path, config) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    from dif.kit.scheduler import load_scheduler_config
    from dif_frontend_flux2.pipeline import empirical_mu

    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(config))
    ref = diffusers.FlowMatchEulerDiscreteScheduler(**config)
    for n_img, steps in ((4096, 4), (300, 50), (12, 3)):
        ref.set_timesteps(steps, sigmas=np.linspace(1.0, 1 / steps, steps), mu=empirical_mu(n_img, steps))
        ours = klein_schedule(n_img, steps, load_scheduler_config(tmp_path))
        np.testing.assert_array_equal(ours.sigmas, ref.sigmas.numpy())
        np.testing.assert_array_equal(ours.timesteps, ref.timesteps.numpy())

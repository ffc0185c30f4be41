"""The whole t2va sampling loop (fp32, CPU) against the diffusers modular pipeline's core denoise step
(layout, noise packing, per-row timestep plan, denoise loop, unpacking) from the same initial noise and
text features, on the embedded tiny default's DiT read by diffusers from the same files. 124 frames (the
reference refuses clips under 5 s) at 64x96, 5 grid points (4 forwards). Gate: rel-L2 <= 1e-5 on the
final video and audio latents."""

from __future__ import annotations

import numpy as np
import pytest

from dif_frontend_h3 import DEFAULT_CHECKPOINT
from dif_frontend_h3.pipeline import H3Pipeline, VideoRequest
from dif_frontend_h3.weights import open_checkpoint

pytestmark = pytest.mark.oracle


def test_loop_matches_modular_pipeline(torch, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3CoreDenoiseStep

    pipe = H3Pipeline(open_checkpoint(DEFAULT_CHECKPOINT), backend="interp")
    req = VideoRequest("a paper boat drifts down a rainy street", frames=124, width=96, height=64, steps=5)
    layout = pipe.check(req, decode=False)
    text = pipe.encode(req.prompt)
    rng = np.random.default_rng(5)
    video = rng.standard_normal((1, 24, layout.num_latent_frames, 4, 6), dtype=np.float32)
    audio = rng.standard_normal((2, 32, layout.num_audio_latents), dtype=np.float32)
    audio_rows = audio.transpose(0, 2, 1).reshape(-1, 32)  # channel-major rows, as the reference packs them
    got_v, got_a = pipe.sample(text, layout, video, audio_rows, req.steps)

    blocks = MiniMaxH3CoreDenoiseStep()
    ref = blocks.init_pipeline()
    transformer = diffusers.MiniMaxH3Transformer3DModel.from_pretrained(DEFAULT_CHECKPOINT / "transformer").eval()
    ref.update_components(
        transformer=transformer,
        scheduler=diffusers.MiniMaxH3Scheduler.from_pretrained(DEFAULT_CHECKPOINT / "scheduler"),
        audio_scheduler=diffusers.MiniMaxH3Scheduler.from_pretrained(DEFAULT_CHECKPOINT / "audio_scheduler"),
    )
    out = ref(
        prompt_embeds=torch.from_numpy(text), text_token_tags=torch.ones(text.shape[1], dtype=torch.long),
        height=req.height, width=req.width, num_frames=req.frames, num_inference_steps=req.steps,
        latents=torch.from_numpy(video), audio_latents=torch.from_numpy(audio), output=["latents", "audio_latents"],
    )  # fmt: skip
    want_v, want_a = out["latents"].numpy(), out["audio_latents"].numpy()
    errors = rel_l2_fn(got_v, want_v), rel_l2_fn(got_a.reshape(2, -1, 32).transpose(0, 2, 1), want_a)
    print(f"loop rel-L2 video {errors[0]:.2e} audio {errors[1]:.2e}")
    assert max(errors) <= 1e-5
    assert rel_l2_fn(got_v, video) > 0.05  # the loop moved the latents


def test_fl2va_loop_matches_modular_pipeline(torch, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    """The fl2va core denoise step (first + last keyframe rows noised to t = 0.999, held through the loop) from
    the same keyframe latents, conditioning noise (the request generator's first draws) and initial noise."""
    diffusers = pytest.importorskip("diffusers")
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3FL2VACoreDenoiseStep

    from dif_frontend_h3.layout import layout_for

    pipe = H3Pipeline(open_checkpoint(DEFAULT_CHECKPOINT), backend="interp")
    prompt, frames, width, height, steps = "a kite rises over the dunes", 124, 96, 64, 4
    text = pipe.encode(prompt)
    anchors = ("first", "last")
    layout = layout_for(pipe.configs, text.shape[1], frames, width, height, anchors=anchors)
    rng = np.random.default_rng(9)
    keyframes = [rng.standard_normal((1, 24, 1, 4, 6), dtype=np.float32) for _ in anchors]
    gen = torch.Generator().manual_seed(11)
    cond_noise = [torch.randn(k.shape, generator=gen, dtype=torch.float32).numpy() for k in keyframes]
    video = rng.standard_normal((1, 24, layout.num_latent_frames, 4, 6), dtype=np.float32)
    audio = rng.standard_normal((2, 32, layout.num_audio_latents), dtype=np.float32)
    rows = pipe.condition_rows(keyframes, cond_noise)
    got_v, got_a = pipe.sample(text, layout, video, audio.transpose(0, 2, 1).reshape(-1, 32), steps, rows)

    ref = MiniMaxH3FL2VACoreDenoiseStep().init_pipeline()
    ref.update_components(
        transformer=diffusers.MiniMaxH3Transformer3DModel.from_pretrained(DEFAULT_CHECKPOINT / "transformer").eval(),
        scheduler=diffusers.MiniMaxH3Scheduler.from_pretrained(DEFAULT_CHECKPOINT / "scheduler"),
        audio_scheduler=diffusers.MiniMaxH3Scheduler.from_pretrained(DEFAULT_CHECKPOINT / "audio_scheduler"),
    )
    out = ref(
        prompt_embeds=torch.from_numpy(text), text_token_tags=torch.ones(text.shape[1], dtype=torch.long),
        height=height, width=width, num_frames=frames, num_inference_steps=steps, keyframe_anchors=anchors,
        condition_latents=[torch.from_numpy(k) for k in keyframes], generator=torch.Generator().manual_seed(11),
        latents=torch.from_numpy(video), audio_latents=torch.from_numpy(audio), output=["latents", "audio_latents"],
    )  # fmt: skip
    errors = (
        rel_l2_fn(got_v, out["latents"].numpy()),
        rel_l2_fn(got_a.reshape(2, -1, 32).transpose(0, 2, 1), out["audio_latents"].numpy()),
    )
    print(f"fl2va loop rel-L2 video {errors[0]:.2e} audio {errors[1]:.2e}")
    assert max(errors) <= 1e-5
    t2va_v, _ = pipe.sample(text, pipe.check(_request(prompt, frames, width, height, steps), decode=False), video,
                            audio.transpose(0, 2, 1).reshape(-1, 32), steps)  # fmt: skip
    assert rel_l2_fn(got_v, t2va_v) > 1e-3  # the keyframes condition the result


def _request(prompt: str, frames: int, width: int, height: int, steps: int) -> VideoRequest:
    return VideoRequest(prompt, frames=frames, width=width, height=height, steps=steps)


def test_torch_cpu_seed_draws_the_modular_pipelines_noise(torch, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    """`--rng torch-cpu --seed S` draws the noise the modular pipeline draws from
    `torch.Generator().manual_seed(S)`: t2va (video, then audio) and fl2va (each keyframe's conditioning
    noise first, then video, then audio), each whole loop run by both from nothing but the seed (and, for
    fl2va, the same keyframe latents); rel-L2 <= 1e-5 on the final latents."""
    diffusers = pytest.importorskip("diffusers")
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import (
        MiniMaxH3CoreDenoiseStep,
        MiniMaxH3FL2VACoreDenoiseStep,
    )

    from dif_frontend_h3.layout import layout_for
    from dif_frontend_h3.pipeline import Keyframe

    pipe = H3Pipeline(open_checkpoint(DEFAULT_CHECKPOINT), backend="interp")
    prompt, frames, width, height, steps, seed = "a lighthouse blinks at dusk", 124, 96, 64, 3, 21
    text = pipe.encode(prompt)
    components = {
        "transformer": diffusers.MiniMaxH3Transformer3DModel.from_pretrained(DEFAULT_CHECKPOINT / "transformer").eval(),
        "scheduler": diffusers.MiniMaxH3Scheduler.from_pretrained(DEFAULT_CHECKPOINT / "scheduler"),
        "audio_scheduler": diffusers.MiniMaxH3Scheduler.from_pretrained(DEFAULT_CHECKPOINT / "audio_scheduler"),
    }
    keyframe_latents = [np.random.default_rng(3).standard_normal((1, 24, 1, 4, 6), dtype=np.float32) for _ in "ab"]
    pixels = np.zeros((height, width, 3), np.uint8)
    for anchors, core in (((), MiniMaxH3CoreDenoiseStep), (("first", "last"), MiniMaxH3FL2VACoreDenoiseStep)):
        keyframes = tuple(Keyframe(anchor, pixels, anchor) for anchor in anchors)
        req = VideoRequest(prompt, frames, width, height, steps, seed, keyframes=keyframes, rng="torch-cpu")
        layout = layout_for(pipe.configs, text.shape[1], frames, width, height, anchors=anchors)  # the plain text
        noise = pipe.initial_noise(req, layout)
        rows = pipe.condition_rows(keyframe_latents, noise.keyframes) if anchors else None
        got_v, got_a = pipe.sample(text, layout, noise.video, noise.audio, steps, rows)

        ref = core().init_pipeline()
        ref.update_components(**components)
        extra = {"keyframe_anchors": anchors, "condition_latents": [torch.from_numpy(k) for k in keyframe_latents]}
        out = ref(
            prompt_embeds=torch.from_numpy(text), text_token_tags=torch.ones(text.shape[1], dtype=torch.long),
            height=height, width=width, num_frames=frames, num_inference_steps=steps,
            generator=torch.Generator().manual_seed(seed), output=["latents", "audio_latents"],
            **(extra if anchors else {}),
        )  # fmt: skip
        errors = (
            rel_l2_fn(got_v, out["latents"].numpy()),
            rel_l2_fn(got_a.reshape(2, -1, 32).transpose(0, 2, 1), out["audio_latents"].numpy()),
        )
        print(f"{anchors or 't2va'} from the seed: rel-L2 video {errors[0]:.2e} audio {errors[1]:.2e}")
        assert max(errors) <= 1e-5, anchors
    numpy_noise = pipe.initial_noise(VideoRequest(prompt, frames, width, height, steps, seed), layout)
    assert not np.allclose(numpy_noise.video, noise.video)  # the default generator is another stream

"""`--rng torch-cpu --seed 7` (and `--sampling-method` / `--scheduler` with a diffusers counterpart)
through the whole Krea 2 pipeline against diffusers' Krea2Pipeline with
`generator=torch.Generator("cpu").manual_seed(7)` and no `latents`: diffusers draws its own noise, dif
reproduces it from the seed alone. fp32, the tiny random checkpoints of conftest; the final latents must
agree to max abs <= 1e-5."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif_frontend_krea2.pipeline import GenerationRequest, Krea2Pipeline
from dif_frontend_krea2.weights import open_checkpoint

pytestmark = pytest.mark.oracle
SEQ = 16
PROMPT = "a red fox in the snow"
SEED = 7


@pytest.mark.parametrize(("variant", "scheduler"), [("turbo", "simple"), ("raw", "beta")])
def test_torch_cpu_seed_reproduces_the_diffusers_image(
    torch, tiny_checkpoints: dict[str, Path], rel_l2_fn, variant: str, scheduler: str
) -> None:  # type: ignore[no-untyped-def]
    import diffusers

    pytest.importorskip("scipy")  # diffusers' beta sigmas
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("dif's torch-cpu stream models torch's AVX2 kernels (this torch runs another build)")
    root = tiny_checkpoints[variant]
    steps = 4
    ref = diffusers.Krea2Pipeline.from_pretrained(root)
    if scheduler != "simple":
        ref.scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
            ref.scheduler.config, **{f"use_{scheduler}_sigmas": True}
        )
    seen: dict[str, np.ndarray] = {}

    def keep(_pipe, _i, _t, kw):  # type: ignore[no-untyped-def]
        seen["latents"] = kw["latents"].numpy().copy()
        return {}

    pipe = Krea2Pipeline(open_checkpoint(root), backend="interp", max_sequence_length=SEQ)
    req = GenerationRequest(PROMPT, steps=steps, width=48, height=32, seed=SEED, rng="torch-cpu", scheduler=scheduler)
    res = pipe.generate(req)
    generator = torch.Generator("cpu").manual_seed(SEED)
    ref(PROMPT, height=32, width=48, num_inference_steps=steps, guidance_scale=res.settings["guidance"],
        generator=generator, max_sequence_length=SEQ, output_type="latent", callback_on_step_end=keep)  # fmt: skip
    assert res.settings["rng"] == "torch-cpu" and res.settings["scheduler"] == scheduler
    assert res.latents.shape == seen["latents"].shape
    # measured: max abs 6.0e-7 (turbo, no CFG) and 4.1e-6 (raw, CFG 4.5, beta sigmas)
    assert np.abs(res.latents - seen["latents"]).max() <= 1e-5
    assert rel_l2_fn(res.latents, seen["latents"]) <= 1e-5

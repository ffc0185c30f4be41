"""`--rng torch-cpu --seed 7` (and `--scheduler karras`) through the whole FLUX.2 [klein] pipeline against
diffusers' Flux2KleinPipeline with `generator=torch.Generator("cpu").manual_seed(7)` and no `latents`:
diffusers draws its own noise, dif reproduces it from the seed alone. fp32, tiny random weights (the
reference of test_pipeline_oracle); the final latents must agree to max abs <= 1e-5."""

from __future__ import annotations

import numpy as np
import pytest

from dif.dtypes import DType
from dif_frontend_flux2.pipeline import Flux2Pipeline, GenerationRequest
from dif_frontend_flux2.weights import open_checkpoint

from .test_pipeline_oracle import HEIGHT, PROMPT, WIDTH, build_reference

pytestmark = pytest.mark.oracle
SEED = 7


@pytest.mark.parametrize("scheduler", ["simple", "karras"])
def test_torch_cpu_seed_reproduces_the_diffusers_image(torch, randomize, model_configs, rel_l2_fn, tmp_path, scheduler):  # type: ignore[no-untyped-def]
    import diffusers

    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("dif's torch-cpu stream models torch's AVX2 kernels (this torch runs another build)")
    pipe = build_reference(torch, randomize, model_configs, distilled=True)
    pipe.save_pretrained(tmp_path)
    if scheduler == "karras":
        pipe.scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
            pipe.scheduler.config, use_karras_sigmas=True
        )
    seen: list[np.ndarray] = []

    def capture(_pipe, _i, _t, kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["latents"].float().numpy().copy())
        return {}

    pipe(
        prompt=PROMPT,
        height=HEIGHT,
        width=WIDTH,
        num_inference_steps=4,
        generator=torch.Generator("cpu").manual_seed(SEED),
        output_type="latent",
        callback_on_step_end=capture,
    )
    ours = Flux2Pipeline(open_checkpoint(tmp_path), dtype=DType.F32)
    req = GenerationRequest(
        PROMPT, steps=4, width=WIDTH, height=HEIGHT, seed=SEED, rng="torch-cpu", scheduler=scheduler
    )
    result = ours.generate(req)
    assert result.settings["rng"] == "torch-cpu" and result.settings["scheduler"] == scheduler
    assert result.latents.shape == seen[-1].shape
    # measured: max abs 1.1e-6, rel-L2 2.5e-7 (simple) / 2.2e-7 (karras) over the final latents
    assert np.abs(result.latents - seen[-1]).max() <= 1e-5
    assert rel_l2_fn(result.latents, seen[-1]) <= 1e-5

"""Oracle parity of a Krea 2 batch: one denoiser program of batch 3 vs diffusers' Krea2Pipeline with
`num_images_per_prompt=3` from the same three noises (fp32, CPU), with CFG on (Raw) so the negative
prompt's batch is exercised too; and the seeded batch draws image i from seed + i."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dif.image_pipeline import image_request
from dif_frontend_krea2.pipeline import Krea2Pipeline, pack_latents
from dif_frontend_krea2.weights import open_checkpoint

pytestmark = pytest.mark.oracle
GATE = 1e-5
SEQ = 16
PROMPT = "a red fox in the snow"


def test_a_batch_of_three_matches_num_images_per_prompt(
    torch, tiny_checkpoints: dict[str, Path], rel_l2_fn: Callable[[np.ndarray, np.ndarray], float]
) -> None:  # type: ignore[no-untyped-def]
    import diffusers

    root = tiny_checkpoints["raw"]
    noise = np.random.default_rng(9).standard_normal((3, 4, 4, 6)).astype(np.float32)  # (B, z, H/8, W/8)
    ref = diffusers.Krea2Pipeline.from_pretrained(root)
    seen: dict[str, np.ndarray] = {}

    def keep(_pipe, _i, _t, kw):  # type: ignore[no-untyped-def]
        seen["latents"] = kw["latents"].numpy().copy()
        return {}

    out = ref(
        PROMPT, height=32, width=48, num_inference_steps=3, num_images_per_prompt=3,
        latents=torch.from_numpy(pack_latents(noise)), max_sequence_length=SEQ, output_type="np",
        callback_on_step_end=keep,
    )  # fmt: skip
    pipe = Krea2Pipeline(open_checkpoint(root), max_sequence_length=SEQ)
    settings = {"steps": 3, "seed": 7, "width": 48, "height": 32}
    runs = pipe.generate_batch(image_request(PROMPT, settings, init_noise=noise, batch=3))
    assert len(runs) == 3 and runs[0].settings["cfg"] is True
    for i, run in enumerate(runs):
        # measured (fp32, CPU backend): latents <= 1.2e-06, images <= 3.3e-07
        assert rel_l2_fn(run.latents, seen["latents"][i : i + 1]) <= GATE
        image = np.clip(pipe.decode_image(run.latents, 2, 3)[0].transpose(1, 2, 0) * 0.5 + 0.5, 0, 1)
        assert rel_l2_fn(image, out.images[i]) <= GATE
    seeded = pipe.generate_batch(image_request(PROMPT, settings, batch=2))
    single = pipe.generate(image_request(PROMPT, {**settings, "seed": 8}))
    np.testing.assert_array_equal(seeded[1].noise, single.noise)
    assert rel_l2_fn(seeded[1].latents, single.latents) <= GATE

"""LoRA training of the embedded tiny Krea 2 denoiser on the CPU backend: the held-out loss falls,
stop + resume is bit-identical, and a sample without pre-encoded latents is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dif.serialize.diftensor import save_tensors
from dif.train.data import DataError
from dif.train.tasks import LoraSettings
from dif_frontend_krea2 import DEFAULT_CHECKPOINT
from dif_frontend_krea2.train import LATENTS_SUFFIX, lora_session


def make_folder(root: Path, *, latents: bool = True) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(np.full((64, 64, 3), 60 + 90 * i, np.uint8)).save(root / f"img{i}.png")
        (root / f"img{i}.txt").write_text(f"a flat {'dark' if i == 0 else 'light'} picture")
        if latents:  # 64x64 px = 4x4 tokens of 64 channels (structured, so a LoRA can learn something)
            lat = np.linspace(-1, 1, 16 * 64).reshape(1, 16, 64) * (1 + i) + 0.1 * rng.standard_normal((1, 16, 64))
            save_tensors(root / f"img{i}{LATENTS_SUFFIX}", {"latents": lat.astype(np.float32)})
    return root


SETTINGS = dict(rank=4, alpha=4.0, lr=3e-2, resolution=64, seed=3, warmup=2, weight_decay=0.0, max_text_tokens=16)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    return make_folder(tmp_path_factory.mktemp("krea2") / "data")


def test_krea2_lora_lowers_the_held_out_loss(data: Path) -> None:
    session = lora_session(DEFAULT_CHECKPOINT, data, LoraSettings(steps=60, **SETTINGS), backend="cpu")
    session.encode_all()
    tr = session.trainer
    assert list(session.modules)[:2] == ["transformer_blocks.0.attn.to_k", "transformer_blocks.0.attn.to_out.0"]
    held_rng = np.random.default_rng(9)
    held = [tr.task.micro_batch(held_rng, {"epoch": 0, "position": i % 2}) for i in range(6)]
    before = tr.evaluate(held)
    tr.run(60)
    after = tr.evaluate(held)
    assert after < 0.8 * before, (before, after)  # measured: 3.50 -> 2.51


def test_krea2_resume_is_bit_identical(data: Path, tmp_path: Path) -> None:
    def session():  # type: ignore[no-untyped-def]
        return lora_session(DEFAULT_CHECKPOINT, data, LoraSettings(steps=4, accumulate=2, **SETTINGS), backend="cpu")

    straight = session().trainer
    straight.run(4)
    first = session().trainer
    first.run(2)
    path = first.save(tmp_path / "k.diftrain")
    resumed = session().trainer
    resumed.resume(path)
    resumed.run(4)
    for name, value in straight.params.items():
        np.testing.assert_array_equal(resumed.params[name], value, err_msg=name)


def test_missing_latents_are_named(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "nolat", latents=False)
    session = lora_session(DEFAULT_CHECKPOINT, folder, LoraSettings(steps=2, **SETTINGS), backend="cpu")
    with pytest.raises(DataError, match=r"img0\.png: no pre-encoded latents img0\.latents\.safetensors"):
        session.encode_all()


def test_a_shared_caption_runs_the_text_encoder_once(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "data")
    for i in range(2, 4):  # two more images with the first two's captions
        (folder / f"img{i}.png").write_bytes((folder / f"img{i - 2}.png").read_bytes())
        (folder / f"img{i}.txt").write_text((folder / f"img{i - 2}.txt").read_text())
        (folder / f"img{i}{LATENTS_SUFFIX}").write_bytes((folder / f"img{i - 2}{LATENTS_SUFFIX}").read_bytes())
    session = lora_session(DEFAULT_CHECKPOINT, folder, LoraSettings(steps=2, **SETTINGS), backend="cpu")
    pipeline = session.trainer.task.pipeline
    encode, calls = pipeline.encode, []

    def counting(caption: str):  # type: ignore[no-untyped-def]
        calls.append(caption)
        return encode(caption)

    pipeline.encode = counting
    session.encode_all()
    assert sorted(calls) == ["a flat dark picture", "a flat light picture"]
    encoded = session.trainer.task._encoded
    assert len(encoded) == 4
    for i, sample in enumerate(session.trainer.task.samples):
        np.testing.assert_array_equal(encoded[i][1], np.asarray(encode(sample.caption).embeds))

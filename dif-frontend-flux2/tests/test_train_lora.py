"""LoRA training of the embedded tiny klein on the CPU backend: the loss on held batches falls, a run
stopped and resumed from its `.diftrain` ends bit-identical to an uninterrupted one (with gradient
accumulation and clipping), bad data / resume files are refused by name, and the exported file is
one diffusers' `load_lora_weights` applies exactly as dif's program does. The timestep shift moves the
drawn sigmas as the scheduler's formula says; a caption shared by several images is encoded once; a
micro-batch of two images is one program whose loss is the mean of theirs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dif.errors import CheckpointError, DifError
from dif.train import AdamW, LrSchedule, Trainer
from dif.train.data import DataError, DataOrder, scan_folder
from dif.train.lora import init_factors, match_targets, write_diffusers_lora
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.train import ATTENTION_TARGETS, KleinLoraTask, linear_shapes, training_sigma_shift

RANK, ALPHA = 4, 8.0


def make_folder(root: Path, n: int = 2) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        a = np.zeros((64, 64 + 32 * i, 3), np.uint8)
        a[..., i % 3] = 200
        a[16:48, 16:48] = 255
        Image.fromarray(a).save(root / f"img{i}.png")
        (root / f"img{i}.txt").write_text(f"a white square on a {('red', 'green', 'blue')[i % 3]} background")
    return root


@pytest.fixture(scope="module")
def pipeline():  # type: ignore[no-untyped-def]
    from dif_frontend_flux2.plugin import _pipeline

    return _pipeline(DEFAULT_CHECKPOINT, dtype="f32", backend="cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    return make_folder(tmp_path_factory.mktemp("data"))


def _trainer(pipeline, data: Path, *, accumulate: int = 1, rank: int = RANK, steps: int = 40, lr: float = 1e-2):  # type: ignore[no-untyped-def]
    shapes = linear_shapes(pipeline)
    modules = match_targets(shapes, ATTENTION_TARGETS)
    opt = AdamW(lr=lr, weight_decay=1e-2)
    task = KleinLoraTask(pipeline, scan_folder(data), modules, rank, ALPHA, opt, resolution=64, accumulate=accumulate)
    params = init_factors(np.random.default_rng(1), {m: shapes[m] for m in modules}, rank)
    return Trainer(task, task.frozen_weights(), params, opt, LrSchedule(lr, steps, warmup=2), accumulate=accumulate,
                   backend="cpu", seed=7)  # fmt: skip


def test_lora_training_lowers_the_held_out_loss(pipeline, data: Path) -> None:  # type: ignore[no-untyped-def]
    tr = _trainer(pipeline, data, steps=60)
    held_rng = np.random.default_rng(123)
    held = [tr.task.micro_batch(held_rng, {"epoch": 0, "position": i % 2}) for i in range(8)]
    before = tr.evaluate(held)
    tr.run(60)
    after = tr.evaluate(held)
    assert after < 0.75 * before, (before, after)  # measured: 43.0 -> 21.5
    # the running loss too, by medians: a step's sigma is random, and one near 1 costs ~3x the typical loss
    assert len(tr.losses) == 60 and np.median(tr.losses[-20:]) < np.median(tr.losses[:20])


def test_stop_and_resume_is_bit_identical(pipeline, data: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    straight = _trainer(pipeline, data, accumulate=2, steps=6)
    straight.run(6)
    first = _trainer(pipeline, data, accumulate=2, steps=6)
    first.run(3)
    ckpt = first.save(tmp_path / "run.diftrain")
    resumed = _trainer(pipeline, data, accumulate=2, steps=6)
    resumed.resume(ckpt)
    assert resumed.step == 3
    resumed.run(6)
    for name, value in straight.params.items():
        np.testing.assert_array_equal(resumed.params[name], value, err_msg=name)
    for name, value in straight.moments.items():
        np.testing.assert_array_equal(resumed.moments[name], value, err_msg=name)
    assert resumed.losses == straight.losses
    assert any(np.any(v != 0) for n, v in straight.params.items() if n.endswith(".up"))  # training moved B


def _task(pipeline, data: Path, **kwargs) -> KleinLoraTask:  # type: ignore[no-untyped-def]
    modules = match_targets(linear_shapes(pipeline), ATTENTION_TARGETS)
    return KleinLoraTask(pipeline, scan_folder(data), modules, RANK, ALPHA, AdamW(lr=1e-2), resolution=64, **kwargs)


def _drawn_sigma(task: KleinLoraTask, seed: int) -> float:
    """The sigma of a micro-batch, read off its inputs: noisy = (1 - s) x0 + s noise and target = noise - x0,
    so noisy - noise = -(1 - s) target (the noise is the generator's draw after the sigma's)."""
    rng = np.random.default_rng(seed)
    _, inputs = task.micro_batch(rng, {"epoch": 0, "position": 0})
    replay = np.random.default_rng(seed)
    replay.random(1)
    noise = replay.standard_normal(inputs["target"].shape).astype(np.float32)
    t = inputs["target"].astype(np.float64)
    return float(1 + np.sum((inputs["latents"] - noise) * t) / np.sum(t * t))


def test_timestep_shift_moves_the_sigmas_as_the_scheduler_formula(pipeline, data: Path) -> None:  # type: ignore[no-untyped-def]
    default, shifted = _task(pipeline, data), _task(pipeline, data, timestep_shift=3.0)
    today = training_sigma_shift(pipeline.checkpoint.root)  # the default before the option existed
    assert default.shift == today == 1.0 and shifted.shift == 3.0
    for seed in range(4):
        sigma = 1.0 - int(np.random.default_rng(seed).random() * 1000) / 1000  # the uniform training grid
        expected = 3.0 * sigma / (1 + 2.0 * sigma)
        assert abs(expected - sigma) > 1e-2  # the seeds draw sigmas the shift moves
        assert _drawn_sigma(default, seed) == pytest.approx(sigma, abs=1e-4)
        assert _drawn_sigma(shifted, seed) == pytest.approx(expected, abs=1e-4)


def test_a_shared_caption_runs_the_text_encoder_once(pipeline, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    folder, captions = make_folder(tmp_path / "data", n=4), ["a white square", "a white square, small"]
    for i in range(4):
        (folder / f"img{i}.txt").write_text(captions[i % 2])
    encode, calls = pipeline.encode, []

    def counting(caption: str) -> np.ndarray:
        calls.append(caption)
        return encode(caption)

    monkeypatch.setattr(pipeline, "encode", counting)
    for cache_dir, encoded in [(None, captions), (tmp_path / "cache", captions), (tmp_path / "cache", [])]:
        calls.clear()  # the last pass reads every sample's features from the disk cache the second wrote
        task = _task(pipeline, folder, cache_dir=cache_dir)
        task.encode_all()
        assert sorted(calls) == encoded, cache_dir
        for position in range(4):
            _, inputs = task.micro_batch(np.random.default_rng(0), {"epoch": 0, "position": position})
            caption = task.samples[DataOrder(task.seed, 4).index(0, position)].caption
            np.testing.assert_array_equal(inputs["text_features"], encode(caption))
        assert len(calls) == len(encoded)  # micro-batches read the encoded features


def test_bad_data_is_reported_by_name(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "unreadable")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (folder / "broken.txt").write_text("a caption")
    with pytest.raises(DataError, match=r"broken\.png: image cannot be read"):
        scan_folder(folder)
    folder = make_folder(tmp_path / "captionless")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / "lonely.png")
    with pytest.raises(DataError, match=r"lonely\.png: image has no caption file lonely\.txt"):
        scan_folder(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: no images"):
        scan_folder(tmp_path / "empty")


def test_bad_resume_files_are_refused_by_name(pipeline, data: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    other = _trainer(pipeline, data, rank=2, steps=2)
    other.run(1)
    foreign = other.save(tmp_path / "rank2.diftrain")
    tr = _trainer(pipeline, data, steps=2)
    with pytest.raises(CheckpointError, match=r"rank2\.diftrain: written for another model or LoRA layout"):
        tr.resume(foreign)
    tr.run(1)
    good = tr.save(tmp_path / "good.diftrain")
    corrupt = tmp_path / "corrupt.diftrain"
    raw = good.read_bytes()
    corrupt.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DifError, match=r"corrupt\.diftrain"):
        _trainer(pipeline, data, steps=2).resume(corrupt)
    assert tr.step == 1  # nothing restarted
    shared = _trainer(pipeline, data, steps=2)
    shared.settings["sampler_share"] = 0.5
    other_share = shared.save(tmp_path / "share.diftrain")
    fresh = _trainer(pipeline, data, steps=2)
    fresh.settings["sampler_share"] = 0.0  # as the recipe records its --sampler-share
    with pytest.raises(CheckpointError, match=r"share\.diftrain: trained with sampler share 0\.5, this run has 0"):
        fresh.resume(other_share)


@pytest.mark.oracle
def test_exported_lora_loads_in_diffusers_and_matches(pipeline, data: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft", reason="diffusers' LoRA loader needs peft")
    import diffusers
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    from dif.interp import interpret
    from dif.lora.slots import lora_slots
    from dif_frontend_flux2.model import build_transformer, flux2_rope_tables

    tr = _trainer(pipeline, data, steps=4)
    tr.run(4)
    modules = tr.task.modules
    path = write_diffusers_lora(tmp_path / "lora.safetensors", tr.params, modules, rank=RANK, alpha=ALPHA)

    model = diffusers.Flux2Transformer2DModel.from_pretrained(DEFAULT_CHECKPOINT / "transformer").eval()
    pipe = Flux2KleinPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=model)
    pipe.load_lora_weights(str(path), adapter_name="trained")
    loaded = {n for n, m in pipe.transformer.named_modules() if hasattr(m, "lora_A") and "trained" in m.lora_A}
    assert loaded == set(modules)

    cfg = pipeline.checkpoint.configs.transformer
    gh, gw, n_txt = 2, 2, 6
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, gh * gw, cfg.in_channels)).astype(np.float32)
    text = rng.standard_normal((1, n_txt, cfg.joint_attention_dim)).astype(np.float32)
    t = torch.tensor([0.6])
    with torch.no_grad():
        want = pipe.transformer(
            hidden_states=torch.from_numpy(latents), encoder_hidden_states=torch.from_numpy(text), timestep=t,
            img_ids=Flux2KleinPipeline._prepare_latent_ids(torch.zeros(1, cfg.in_channels, gh, gw)),
            txt_ids=Flux2KleinPipeline._prepare_text_ids(torch.zeros(1, n_txt, 1)), return_dict=False,
        )[0].numpy()  # fmt: skip
        tproj = pipe.transformer.time_guidance_embed.time_proj(t * 1000).numpy()
    with lora_slots({f"{m}.weight": RANK for m in modules}):
        prog = build_transformer(cfg, batch=1, n_img=gh * gw, n_txt=n_txt)
    cos, sin = flux2_rope_tables(n_txt, gh, gw, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    slots = {n: v * (ALPHA / RANK if n.endswith(".up") else 1.0) for n, v in tr.params.items()}
    inputs = {"latents": latents, "text_features": text, "timestep_proj": tproj, "rope_cos": cos, "rope_sin": sin}
    from dif.weights import bind_weights

    got = interpret(prog, {**inputs, **slots}, bind_weights(prog, pipeline.checkpoint.transformer))[prog.outputs[0]]
    plain = interpret(prog, {**inputs, **{n: np.zeros_like(v) for n, v in slots.items()}},
                      bind_weights(prog, pipeline.checkpoint.transformer))[prog.outputs[0]]  # fmt: skip
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    moved = float(np.linalg.norm(plain - want) / np.linalg.norm(want))
    assert moved > 1e-4, "the trained LoRA must change the output for the comparison to mean anything"
    assert rel <= 1e-5, rel


def test_a_micro_batch_of_two_is_the_mean_of_its_images(pipeline, data: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`batch=2`: one step program of batch 2 (the samples' latents, captions and sigmas stacked) whose loss
    is the mean of the two one-image losses on the same sigmas and noise; images of two buckets are refused."""
    from dif.errors import UsageError

    square = tmp_path / "square"
    square.mkdir()
    for i, colour in enumerate(("red", "blue")):
        a = np.full((64, 64, 3), 255, np.uint8)
        a[8 + 16 * i : 40 + 16 * i, 16:48, i * 2] = 0
        Image.fromarray(a).save(square / f"img{i}.png")
        (square / f"img{i}.txt").write_text(f"a {colour} square")
    shapes = linear_shapes(pipeline)
    params = init_factors(np.random.default_rng(1), {m: shapes[m] for m in _task(pipeline, square).modules}, RANK)
    params = {n: (v + 0.01 if n.endswith(".up") else v) for n, v in params.items()}  # B != 0: LoRA acts

    def trainer(batch: int) -> Trainer:
        task = _task(pipeline, square, batch=batch)
        return Trainer(task, task.frozen_weights(), dict(params), AdamW(lr=1e-2), LrSchedule(1e-2, 4), backend="cpu")

    one, two = trainer(1), trainer(2)
    sigmas = np.array([0.9, 0.4], np.float32)
    pair = two.task.batch_inputs([0, 1], np.random.default_rng(3), sigmas=sigmas)
    assert pair[1]["latents"].shape[0] == pair[1]["text_features"].shape[0] == pair[1]["timestep_proj"].shape[0] == 2
    rng = np.random.default_rng(3)  # the pair's noise is the two images' draws in order
    singles = [one.task.batch_inputs([i], rng, sigmas=sigmas[i : i + 1]) for i in range(2)]
    assert two.evaluate([pair]) == pytest.approx(np.mean([one.evaluate([b]) for b in singles]), rel=1e-5)
    two.run(2)  # the batch-2 step program trains
    assert np.isfinite(two.losses).all()
    with pytest.raises(UsageError, match="one bucket"):
        _task(pipeline, data, batch=2).encode_all()  # 64x64 and 96x64 images


def test_a_sigma_draw_replaces_the_schemes_draw(pipeline, data: Path) -> None:  # type: ignore[no-untyped-def]
    """`sigma_draw` (a recipe's own mix) gives a micro-batch's sigmas in place of the shifted uniform draw;
    sigmas passed in (the held batches) still win over it."""
    asked: list[int] = []

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        asked.append(n)
        return np.full(n, 0.25, np.float32)

    task = _task(pipeline, data, sigma_draw=draw)
    drawn = task.batch_inputs([0], np.random.default_rng(5))[1]
    given = task.batch_inputs([0], np.random.default_rng(5), sigmas=np.array([0.25], np.float32))[1]
    assert asked == [1]  # the given sigmas did not ask it
    for name in ("latents", "timestep_proj", "target"):
        np.testing.assert_array_equal(drawn[name], given[name])
    plain = _task(pipeline, data).batch_inputs([0], np.random.default_rng(5))[1]
    assert not np.array_equal(plain["timestep_proj"], drawn["timestep_proj"])


def test_full_fine_tune_lowers_the_loss_and_exports_a_loadable_model(data: Path, tmp_path: Path) -> None:
    from dif.serialize.diftensor import open_safetensors
    from dif.train.tasks import LoraSettings
    from dif_frontend_flux2.plugin import _pipeline
    from dif_frontend_flux2.train import full_session

    settings = LoraSettings(steps=30, lr=2e-3, warmup=2, resolution=64, weight_decay=0.0, seed=5)
    session = full_session(DEFAULT_CHECKPOINT, data, settings, backend="cpu")
    session.encode_all()
    tr = session.trainer
    step = tr.task.programs((4, 4)).step
    assert tr.weights == {} and not step.params  # every transformer weight is a trainable input
    assert {f"adam.m.{n}" for n in tr.params} <= {v.name for v in step.inputs}
    held_rng = np.random.default_rng(11)
    held = [tr.task.micro_batch(held_rng, {"epoch": 0, "position": i % 2}) for i in range(6)]
    before = tr.evaluate(held)
    tr.run(30)
    after = tr.evaluate(held)
    assert after < 0.75 * before, (before, after)  # measured: 53.5 -> 1.50
    folder = session.export(tmp_path / "model")
    stored = open_safetensors(folder / "transformer" / "diffusion_pytorch_model.safetensors")
    assert set(stored) == set(tr.params)
    for name, value in tr.params.items():
        np.testing.assert_array_equal(stored[name], value)  # the embedded model stores f32
    reopened = _pipeline(folder, dtype="f32", backend="cpu")  # a diffusers folder dif opens again
    assert reopened.checkpoint.configs.transformer == session.task.pipeline.checkpoint.configs.transformer

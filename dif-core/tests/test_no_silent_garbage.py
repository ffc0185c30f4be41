"""Issue 14 in dif-core: finite checks at stage boundaries, the load-time weight scan, NaN noise
files, admission of absurd sizes, config values past any model, and out-of-memory errors."""

from __future__ import annotations

import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from dif.config_fields import MAX_CONFIG_INT, non_negative_int, positive_int, width_product
from dif.dtypes import DType
from dif.errors import ConfigError, DeviceMemoryError, DifError, DifWarning, NonFiniteError, UsageError, WeightError
from dif.ir import ProgramBuilder
from dif.kit.admission import admit_image, host_bytes, largest_schedulable
from dif.kit.finite import current_checks, require_finite, run_checks
from dif.kit.sampling import sample
from dif.noise import load_noise_file
from dif.sched import flow_match_schedule
from dif.serialize.diftensor import save_tensors
from dif.weights import ArraySource, bind_weights, open_safetensors
from dif.weights.scan import nonfinite_counts, tensor_stats

# -- stage checks ----------------------------------------------------------------------------------


def test_require_finite_passes_finite_values_and_names_stage_and_step() -> None:
    x = np.ones((1, 4, 8), np.float32)
    assert require_finite("latents", x) is x
    x[0, 1, 2], x[0, 3, 0] = np.nan, np.inf
    with pytest.raises(NonFiniteError, match=r"latents at step 3 of 8 has non-finite values: 1 NaN, 1 infinite of 32"):
        require_finite("latents", x, step=(3, 8))
    with run_checks(finite=False):
        assert require_finite("latents", x) is x  # --no-check-finite
    assert current_checks().finite  # the default comes back after the block


def test_require_finite_reads_the_float_arrays_of_an_object_and_bf16() -> None:
    from attrs import frozen

    @frozen
    class Encoded:
        embeds: np.ndarray
        mask: np.ndarray

    ok = Encoded(np.zeros((1, 3), ml_dtypes.bfloat16), np.ones((1, 3), bool))
    assert require_finite("text features", ok) is ok
    bad = Encoded(np.array([[0, np.nan, 1]], ml_dtypes.bfloat16), np.ones((1, 3), bool))
    with pytest.raises(NonFiniteError, match=r"text features \(embeds\) has non-finite values: 1 NaN of 3"):
        require_finite("text features", bad)


def _schedule(steps: int = 4):  # type: ignore[no-untyped-def]
    return flow_match_schedule(steps, shift=3.0)


def test_sampling_stops_at_the_first_step_with_a_non_finite_velocity() -> None:
    seen: list[int] = []

    def predict(x: np.ndarray, t: float, cond: object) -> np.ndarray:
        seen.append(len(seen) + 1)
        return np.full_like(x, np.nan) if len(seen) == 3 else np.zeros_like(x)

    with pytest.raises(NonFiniteError, match=r"denoiser output at step 3 of 4 has non-finite values: 6 NaN of 6"):
        sample(np.zeros((1, 2, 3), np.float32), _schedule(), predict, None)
    assert seen == [1, 2, 3]  # nothing ran after the first bad step
    seen.clear()
    with run_checks(finite=False):
        out = sample(np.zeros((1, 2, 3), np.float32), _schedule(), predict, None)
    assert np.isnan(out).all() and seen == [1, 2, 3, 4]


def test_sampling_refuses_non_finite_initial_latents_and_overflowing_latents() -> None:
    zero = lambda x, t, c: np.zeros_like(x)  # noqa: E731
    with pytest.raises(NonFiniteError, match="initial latents has non-finite values"):
        sample(np.array([[[np.nan]]], np.float32), _schedule(), zero, None)
    big = lambda x, t, c: np.full_like(x, 3e38)  # noqa: E731  x + dt * v overflows float32 at step 1
    with pytest.raises(NonFiniteError, match="latents at step 2 of 4"), np.errstate(over="ignore"):
        sample(np.full((1, 1, 1), -3e38, np.float32), _schedule(), big, None)


def test_cfg_branch_is_checked_too() -> None:
    def predict(x: np.ndarray, t: float, cond: str) -> np.ndarray:
        return np.full_like(x, np.inf) if cond == "uncond" else np.zeros_like(x)

    with pytest.raises(NonFiniteError, match=r"denoiser output \(negative prompt\) at step 1 of 4"):
        sample(np.zeros((1, 1, 2), np.float32), _schedule(), predict, "cond", uncond="uncond", guidance=4.0)


# -- --init-noise files ------------------------------------------------------------------------------


def test_a_nan_noise_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "noise.safetensors"
    noise = np.zeros((1, 4, 2, 2), np.float32)
    save_tensors(path, {"noise": noise}, dif_metadata=False)
    np.testing.assert_array_equal(load_noise_file(path), noise)
    noise[0, 0, 0, 0] = np.nan
    save_tensors(path, {"noise": noise}, dif_metadata=False)
    with pytest.raises(UsageError, match=rf"{path}: tensor 'noise' has 1 NaN / infinite values of 16"):
        load_noise_file(path)


# -- weights -----------------------------------------------------------------------------------------


def _program(name: str = "toy") -> object:
    b = ProgramBuilder(name)
    x = b.input("x", (2, 3), "f32")
    w = b.param("w", (2, 3), "f32")
    b.output(b.emit("add", x, w))
    return b.build()


def test_bind_refuses_nan_weights_naming_the_tensor_or_warns_when_allowed() -> None:
    program = _program()
    good = ArraySource({"w": np.ones((2, 3), np.float32)}, label="good.safetensors")
    assert set(bind_weights(program, good)) == {"w"}  # type: ignore[arg-type]
    bad_w = np.ones((2, 3), np.float32)
    bad_w[1, 1] = np.nan
    bad = ArraySource({"w": bad_w}, label="bad.safetensors")
    with pytest.raises(WeightError, match=r"program 'toy': 1 weight tensor\(s\) hold NaN / infinite values: 'w' in .*"
                       r"\(1 of 6 values\)(.|\n)*--allow-nonfinite-weights"):  # fmt: skip
        bind_weights(program, bad)  # type: ignore[arg-type]
    with run_checks(allow_nonfinite_weights=True), pytest.warns(DifWarning, match="'w' in .*1 of 6 values"):
        assert set(bind_weights(program, bad)) == {"w"}  # type: ignore[arg-type]
    assert set(bind_weights(program, bad, scan=False)) == {"w"}  # type: ignore[arg-type]


def test_a_clean_tensor_is_scanned_once_per_source(monkeypatch: pytest.MonkeyPatch) -> None:
    import dif.weights.scan as scan

    asked: list[list[str]] = []
    real = scan.nonfinite_counts
    monkeypatch.setattr(scan, "nonfinite_counts", lambda src, names: asked.append(list(names)) or real(src, names))
    source = ArraySource({"w": np.ones((2, 3), np.float32)})
    bind_weights(_program(), source)  # type: ignore[arg-type]
    bind_weights(_program("toy_at_another_size"), source)  # type: ignore[arg-type]
    assert asked == [["w"], []]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64])
def test_scan_counts_nan_and_inf_on_the_bits(dtype: type) -> None:
    x = np.linspace(-5, 5, 1000).astype(dtype)
    x[[3, 500]] = np.nan
    x[7] = np.inf
    x[9] = -np.inf
    source = ArraySource({"a": x, "b": np.ones(4, dtype), "i": np.arange(5, dtype=np.int32)})
    assert nonfinite_counts(source, ["a", "b", "i"], threads=2) == {"a": 4}


def test_scan_counts_float8_nan_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    import dif.weights.scan as scan

    monkeypatch.setattr(scan, "CHUNK", 100)  # several chunks per tensor, added up
    x = np.zeros(1000, ml_dtypes.float8_e4m3fn)
    x[[1, 150, 999]] = np.nan
    assert nonfinite_counts(ArraySource({"q": x}), ["q"], threads=3) == {"q": 3}


@pytest.mark.parametrize(
    "dtype", [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2], ids=str
)
def test_the_two_reductions_agree_with_isfinite_on_every_bit_pattern(dtype: type) -> None:
    """`has_nonfinite` (maxima of the signed and unsigned views) against numpy's own isfinite, value by value
    over every 8- and 16-bit pattern, and over blocks that hold just one non-finite value."""
    from dif.weights.scan import SCAN_BLOCK, has_nonfinite

    size = np.dtype(dtype).itemsize
    every = np.arange(1 << (8 * size), dtype=np.uint64).astype(f"u{size}").view(dtype)
    finite = np.isfinite(every.astype(np.float32))
    assert not finite.all()
    for value, ok in zip(every, finite, strict=True):
        assert has_nonfinite(np.array([value])) is (not ok), value
    clean = every[finite]
    assert not has_nonfinite(clean)
    big = np.resize(clean, 3 * SCAN_BLOCK + 5)
    assert not has_nonfinite(big)
    for at in (0, SCAN_BLOCK - 1, SCAN_BLOCK, big.size - 1):
        for bad in every[~finite][[0, -1]]:  # the smallest and largest non-finite patterns (+ and - signs)
            damaged = big.copy()
            damaged[at] = bad
            assert has_nonfinite(damaged)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_two_reductions_find_wide_float_nan_and_inf(dtype: type) -> None:
    from dif.weights.scan import has_nonfinite

    top = np.finfo(dtype).max
    x = np.concatenate([np.linspace(-1e30, 1e30, 4001), [-top, top, np.finfo(dtype).tiny, -0.0]]).astype(dtype)
    assert not has_nonfinite(x) and not has_nonfinite(np.zeros(0, dtype))
    for bad in (np.nan, -np.nan, np.inf, -np.inf):
        y = x.copy()
        y[1234] = bad
        assert has_nonfinite(y)


def test_tensor_stats_match_numpy(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((30, 7)).astype(np.float32)
    v = w.copy()
    v[0, 0], v[2, 3] = np.nan, -np.inf
    path = tmp_path / "m.safetensors"
    save_tensors(path, {"w": w, "v": v, "empty_nan": np.full(3, np.nan, np.float32)}, dif_metadata=False)
    stats = {s.name: s for s in tensor_stats(open_safetensors(path), threads=2)}
    s = stats["w"]
    assert (s.count, s.nan, s.inf, s.dtype, s.shape) == (210, 0, 0, "F32", (30, 7))
    assert s.min == pytest.approx(float(w.min())) and s.max == pytest.approx(float(w.max()))
    assert s.mean == pytest.approx(float(w.astype(np.float64).mean()), rel=1e-6)
    finite = v[np.isfinite(v)]
    t = stats["v"]
    assert (t.nan, t.inf, t.nonfinite) == (1, 1, 2) and t.min == pytest.approx(float(finite.min()))
    assert t.mean == pytest.approx(float(finite.astype(np.float64).mean()), rel=1e-6)
    e = stats["empty_nan"]
    assert (e.min, e.max, e.mean, e.nan) == (None, None, None, 3)


# -- schedule and admission ----------------------------------------------------------------------------


def test_an_overflowing_time_shift_is_a_dif_error_without_numpy_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "overflow encountered in cast" on the way
        with pytest.raises(DifError, match=r"time shift mu=1000.0 is out of range"):
            flow_match_schedule(4, mu=1000.0)
        with pytest.raises(DifError, match=r"mu=89.0 is out of range \(e\^mu overflows float32\)"):
            flow_match_schedule(4, mu=89.0)  # math.exp is fine; float32 is not
        assert np.isfinite(flow_match_schedule(4, mu=88.0).sigmas).all()


def _mu_schedule(tokens: int, steps: int):  # type: ignore[no-untyped-def]
    return flow_match_schedule(steps, mu=tokens / 1000.0)  # overflows above 88722 tokens


def test_admission_names_the_size_and_the_schedules_limit() -> None:
    assert largest_schedulable(_mu_schedule, 4, 10**6) == 88722
    admit_image(256, 256, pixels_per_token=1, channels=4, steps=4, cfg=False, dtype=DType.F32,
                schedule=_mu_schedule, free_host_bytes=0)  # fmt: skip
    refused = r"image size 512x512 \(262144 latent tokens\) is beyond .* above 88722 tokens"
    with pytest.raises(UsageError, match=refused):
        admit_image(512, 512, pixels_per_token=1, channels=4, steps=4, cfg=False, dtype=DType.F32,
                    schedule=_mu_schedule, free_host_bytes=0)  # fmt: skip


def test_admission_refuses_what_host_memory_cannot_hold() -> None:
    need = host_bytes(64 * 64, 128, 1024 * 1024, DType.BF16, cfg=True)
    assert need == 64 * 64 * 128 * (8 + 2 * 4) + 1024 * 1024 * 15
    kw = {"pixels_per_token": 16, "channels": 128, "steps": 4, "cfg": True, "dtype": DType.BF16}
    admit_image(1024, 1024, schedule=lambda n, s: flow_match_schedule(s), free_host_bytes=need, **kw)  # type: ignore[arg-type]
    refused = r"image size 1024x1024 needs at least 0.02 GiB of host memory .* is available"
    with pytest.raises(UsageError, match=refused):
        admit_image(1024, 1024, schedule=lambda n, s: flow_match_schedule(s), free_host_bytes=need - 1, **kw)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"image size 1024x1024 x 3 images needs at least .* each"):  # a batch holds 3
        admit_image(
            1024, 1024, schedule=lambda n, s: flow_match_schedule(s), free_host_bytes=3 * need - 1, batch=3, **kw
        )  # type: ignore[arg-type]  # noqa: E501


def test_a_config_error_of_the_schedule_is_not_a_size_error() -> None:
    def broken(tokens: int, steps: int):  # type: ignore[no-untyped-def]
        raise ConfigError("scheduler_config.json: bad")

    with pytest.raises(ConfigError, match="scheduler_config.json: bad"):
        admit_image(64, 64, pixels_per_token=16, channels=4, steps=1, cfg=False, dtype=DType.F32, schedule=broken)


# -- config values ---------------------------------------------------------------------------------------


def test_config_integers_past_any_model_name_the_key() -> None:
    assert positive_int("t/config.json", "num_attention_heads", MAX_CONFIG_INT) == MAX_CONFIG_INT
    with pytest.raises(ConfigError, match=r"t/config.json: num_attention_heads=16000000000 is more than 16777216"):
        positive_int("t/config.json", "num_attention_heads", 16_000_000_000)
    with pytest.raises(ConfigError, match=r"num_layers=100000000 is more than"):
        non_negative_int("t", "num_layers", 10**8)
    assert width_product("t", {"heads": 32, "head_dim": 128}) == 4096
    with pytest.raises(ConfigError, match=r"t: heads=65536 x head_dim=65536 = 4294967296 is more than 16777216"):
        width_product("t", {"heads": 65536, "head_dim": 65536})


# -- out of memory -----------------------------------------------------------------------------------------


def test_device_memory_error_names_program_bytes_free_and_the_budget_hint() -> None:
    err = DeviceMemoryError("cuda", "flux2_transformer", 1 << 34, "plan arena", 1 << 30, "out of memory")
    text = str(err)
    assert "cuda backend: program 'flux2_transformer' could not allocate 17179869184 B for its plan arena" in text
    assert "(1073741824 B free): out of memory" in text and "--vram-budget" in text
    assert "free memory unknown" in str(DeviceMemoryError("opencl", "p", 1, "buffer", None))


def test_admission_caps_the_steps_before_drawing_a_schedule() -> None:
    from dif.kit.admission import MAX_STEPS

    drawn: list[int] = []

    def schedule(tokens: int, steps: int):  # type: ignore[no-untyped-def]
        drawn.append(steps)
        return flow_match_schedule(steps)

    kw = {"pixels_per_token": 16, "channels": 4, "cfg": False, "dtype": DType.F32, "free_host_bytes": 0}
    admit_image(64, 64, steps=MAX_STEPS, schedule=schedule, **kw)  # type: ignore[arg-type]
    drawn.clear()
    with pytest.raises(UsageError, match=r"^steps 1000000000 is more than 10000"):
        admit_image(64, 64, steps=10**9, schedule=schedule, **kw)  # type: ignore[arg-type]
    assert drawn == []  # refused before a 4 GB linspace


@pytest.mark.parametrize("guidance", [float("nan"), float("inf")])
def test_admission_refuses_a_guidance_that_is_not_a_number(guidance: float) -> None:
    kw = {"pixels_per_token": 16, "channels": 4, "cfg": True, "dtype": DType.F32, "free_host_bytes": 0}
    admit_image(64, 64, steps=2, schedule=lambda n, s: flow_match_schedule(s), guidance=4.0, **kw)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=rf"^guidance {guidance} is not a finite number"):
        admit_image(64, 64, steps=2, schedule=lambda n, s: flow_match_schedule(s), guidance=guidance, **kw)  # type: ignore[arg-type]

"""fp8 checkpoints: ComfyUI scaled fp8 (weights x `scale_weight` / `weight_scale`, scalar or per row)
read dequantized to bf16 with the scale tensors hidden; plain fp8 left for bind to widen, and `--dtype auto`
picks bf16 for an fp8 file (it holds every fp8 value exactly). Where the quantize_fp8 pass converts a linear
whose weight is stored as e4m3, its derived weights are the stored bytes and scale, and `choose_fp8` decides
per program and target whether that pass runs for them, or they run dequantized with a note."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from attrs import evolve

from dif.checkpoint import storage_dtype
from dif.dtypes import DType
from dif.errors import WeightError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.ops.elementwise import gelu
from dif.ops.fused import norm_modulate
from dif.ops.quant import quantize_rows
from dif.passes import optimize
from dif.serialize.diftensor import save_tensors
from dif.target import TargetProfile
from dif.weights import open_safetensors
from dif.weights.bind import bind_weights
from dif.weights.fp8 import ScaledFp8Source, choose_fp8, locate_fp8, scaled_fp8
from dif.weights.quantized import derive, derived_name, parse_derived, with_quantized_weights
from dif.weights.remap import Chunk, MappedSource, Rule, SwapHalves

E4M3 = ml_dtypes.float8_e4m3fn


def test_scaled_fp8_dequantizes_and_hides_scales(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, 4)).astype(E4M3)
    w2 = rng.standard_normal((6, 4)).astype(E4M3)
    s1 = np.array(0.0123, np.float32)
    s2 = (rng.random(6) + 0.5).astype(np.float32)
    norm = rng.standard_normal(4).astype(np.float32)
    path = tmp_path / "m.safetensors"
    tensors = {
        "scaled_fp8": np.zeros(0, E4M3),
        "a.weight": w1,
        "a.scale_weight": s1,
        "a.scale_input": np.array(1.0, np.float32),
        "b.weight": w2,
        "b.weight_scale": s2,
        "n.weight": norm,
    }
    save_tensors(path, tensors, dif_metadata=False)
    src = scaled_fp8(open_safetensors(path))
    assert isinstance(src, ScaledFp8Source)
    assert sorted(src.names()) == ["a.weight", "b.weight", "n.weight"]
    assert src.info("a.weight").dtype == "BF16" and src.info("n.weight").dtype == "F32"
    want1 = (w1.astype(np.float32) * s1).astype(ml_dtypes.bfloat16)
    want2 = (w2.astype(np.float32) * s2[:, None]).astype(ml_dtypes.bfloat16)
    assert np.array_equal(src["a.weight"].view(np.uint16), want1.view(np.uint16))
    assert np.array_equal(src["b.weight"].view(np.uint16), want2.view(np.uint16))
    assert np.array_equal(src["n.weight"], norm)
    assert "x 'a.scale_weight'" in src.file_of("a.weight")
    assert storage_dtype(src) == DType.BF16


def test_scale_of_the_wrong_size(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_tensors(
        path,
        {"a.weight": np.ones((4, 4), E4M3), "a.scale_weight": np.ones(3, np.float32)},
        dif_metadata=False,
    )
    src = scaled_fp8(open_safetensors(path))
    with pytest.raises(WeightError, match=r"'a.scale_weight' in .*m.safetensors has 3 values"):
        src["a.weight"]


def test_plain_fp8_runs_in_bf16(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    tensors = {"a.weight": np.ones((4, 4), E4M3), "b.weight": np.ones((4, 4), E4M3), "n.weight": np.ones(4, np.float32)}
    save_tensors(path, tensors, dif_metadata=False)
    src = scaled_fp8(open_safetensors(path))
    assert src is not None and src.info("a.weight").dtype == "F8_E4M3"
    assert storage_dtype(src) == DType.BF16  # was f32: fp8 was not a run dtype


# -- kept as stored: the derived fp8-e4m3 pair of a weight the checkpoint stores as e4m3 --------------------

FP8_TARGET = TargetProfile(
    backend="fp8-units",
    device="unit",
    dtypes=("f32", "bf16", "f8e4m3"),
    tensor_core_formats=("fp8-e4m3",),
    capabilities=("op:*", "format:fp8-e4m3"),
)
NO_UNITS = evolve(FP8_TARGET, backend="no-units", tensor_core_formats=())  # implements it, emulated
D, F = 64, 32


def modulated_linear() -> Program:
    """x -> layer_norm -> modulate -> linear over 'lin.weight' [F, D] -> gelu: quantize_fp8 converts the linear."""
    b = ProgramBuilder("blk")
    x = b.input("x", (2, 8, D), "f32")  # 16 rows: quantize_fp8 leaves fewer (matrix-vector) as they are
    scale, shift = b.input("scale", (2, 1, D), "f32"), b.input("shift", (2, 1, D), "f32")
    n = b.emit("modulate", b.emit("layer_norm", x, eps=1e-6), scale, shift)
    b.output(b.emit("gelu", b.emit("linear", n, b.param("lin.weight", (F, D), "f32"))))  # not an output: quantized
    return b.build()


def fp8_file(tmp_path: Path, scale: str) -> tuple[Path, np.ndarray, np.ndarray]:
    """A file with 'lin.weight' stored as e4m3: plain (scale "none") or ComfyUI scaled by one value ("scalar")
    or one per row ("rows"). Its rows' amax is far from 448, so per-row re-quantization rounds them anew."""
    rng = np.random.default_rng(3)
    q = (rng.standard_normal((F, D)) * 2).astype(E4M3)
    s = {"none": np.float32(1), "scalar": np.array(0.0173, np.float32), "rows": (rng.random(F) + 0.01)}[scale]
    tensors: dict[str, np.ndarray] = {"lin.weight": q}
    if scale != "none":
        tensors["scaled_fp8"] = np.zeros(0, E4M3)
        tensors["lin.weight_scale" if scale == "rows" else "lin.scale_weight"] = np.asarray(s, np.float32)
    path = tmp_path / f"{scale}.safetensors"
    save_tensors(path, tensors, dif_metadata=False)
    return path, q, np.broadcast_to(np.asarray(s, np.float32), (F,))


@pytest.mark.parametrize("scale", ["none", "scalar", "rows"])
def test_quantize_fp8_takes_the_stored_bytes_and_scale(tmp_path: Path, scale: str) -> None:
    path, q, s = fp8_file(tmp_path, scale)
    program = modulated_linear()
    bound = bind_weights(program, scaled_fp8(open_safetensors(path)))
    optimized, _ = optimize(program, target=FP8_TARGET, passes=("fuse_norm_modulate", "quantize_fp8"))
    assert optimized.op_histogram().get("scaled_linear") == 1
    view = with_quantized_weights(optimized, bound)
    wq, ws = view[derived_name("lin.weight", "fp8-e4m3", "q")], view[derived_name("lin.weight", "fp8-e4m3", "scale")]
    assert wq.dtype == E4M3 and np.array_equal(wq.view(np.uint8), q.view(np.uint8))
    assert ws.dtype == np.float32 and ws.shape == (F,) and np.array_equal(ws, s)

    # the interpreter's result is scaled_linear over the stored values, by hand
    rng = np.random.default_rng(4)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in program.inputs}
    (got,) = interpret(optimized, inputs, view).values()
    xq, xs = quantize_rows(
        norm_modulate(inputs["x"], inputs["scale"], inputs["shift"], kind="layer", eps=1e-6), dtype="f8e4m3"
    )
    linear = (xq.astype(np.float64) @ q.astype(np.float64).T) * xs * s.astype(np.float64)
    want = gelu(linear.astype(np.float32), approximate="none")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

    # quantizing the dequantized weights again (what a checkpoint without fp8 gets) rounds them anew
    requantized = derive(np.asarray(bound["lin.weight"]), "fp8-e4m3", 0)
    assert not np.array_equal(requantized["q"].view(np.uint8), q.view(np.uint8))
    again = {
        n: requantized[parse_derived(n)[3]] if parse_derived(n) else view[n] for n in (p.name for p in optimized.params)
    }
    (other,) = interpret(optimized, inputs, again).values()
    assert not np.allclose(other, want, rtol=1e-4, atol=1e-4)


def test_a_chunk_of_a_fused_weight_keeps_its_rows_of_bytes_and_scales(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    qkv = rng.standard_normal((3 * F, D)).astype(E4M3)
    s = (rng.random(3 * F) + 0.5).astype(np.float32)
    path = tmp_path / "fused.safetensors"
    save_tensors(path, {"qkv.weight": qkv, "qkv.weight_scale": s}, dif_metadata=False)
    source = MappedSource(scaled_fp8(open_safetensors(path)), {"k.weight": Rule("qkv.weight", Chunk(1, 3))})
    stored = locate_fp8(source, "k.weight")
    assert stored is not None and stored.dtype == "F8_E4M3"
    got_q, got_s = stored.load()
    assert np.array_equal(got_q.view(np.uint8), qkv[F : 2 * F].view(np.uint8)) and np.array_equal(got_s, s[F : 2 * F])
    swapped = MappedSource(scaled_fp8(open_safetensors(path)), {"k.weight": Rule("qkv.weight", SwapHalves())})
    assert locate_fp8(swapped, "k.weight") is None  # a transform that moves values across rows: derived again


def test_choose_fp8_by_target_frontend_setting_and_dtype(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program = modulated_linear()
    bound = bind_weights(program, scaled_fp8(open_safetensors(fp8_file(tmp_path, "rows")[0])))
    kept = choose_fp8(program, bound, FP8_TARGET, keep=True)
    assert kept is not None and kept.why_not is None and kept.passes == ("quantize_fp8",)
    optimized, _ = optimize(program, target=FP8_TARGET, passes=("fuse_norm_modulate", *kept.passes))
    summary, why, note = kept.outcome(optimized)
    assert summary == "1 kept as stored (fp8-e4m3)" and "stored bytes and scales" in why and note is None

    emulated = choose_fp8(program, bound, NO_UNITS, keep=True)
    assert emulated is not None and emulated.passes == ()
    summary, _, note = emulated.outcome(program)
    assert summary == "1 dequantized to f32"
    assert note is not None and "backend 'no-units' does not execute fp8-e4m3 (emulated:" in note
    assert "no tensor-core format 'fp8-e4m3'" in note  # what it lacks, from dif.formats

    assert "frontend runs program 'blk'" in str(choose_fp8(program, bound, FP8_TARGET, keep=False).why_not)  # type: ignore[union-attr]
    assert "reference interpreter" in str(choose_fp8(program, bound, None, keep=True).why_not)  # type: ignore[union-attr]
    monkeypatch.setenv("DIF_FP8_WEIGHTS", "dequantize")
    assert choose_fp8(program, bound, FP8_TARGET, keep=True).why_not == "DIF_FP8_WEIGHTS=dequantize"  # type: ignore[union-attr]
    monkeypatch.delenv("DIF_FP8_WEIGHTS")

    e5m2 = tmp_path / "e5m2.safetensors"
    save_tensors(e5m2, {"lin.weight": np.ones((F, D), ml_dtypes.float8_e5m2)}, dif_metadata=False)
    choice = choose_fp8(program, bind_weights(program, open_safetensors(e5m2)), FP8_TARGET, keep=True)
    assert choice is not None and "fp8-e5m2" in str(choice.why_not) and choice.passes == ()

    bf16 = tmp_path / "bf16.safetensors"
    save_tensors(bf16, {"lin.weight": np.ones((F, D), ml_dtypes.bfloat16)}, dif_metadata=False)
    assert choose_fp8(program, bind_weights(program, open_safetensors(bf16)), FP8_TARGET, keep=True) is None


def test_a_merged_lora_hides_only_the_weights_it_adapts(tmp_path: Path) -> None:
    """Under a merged LoRA the weights it adapts are the merge's values (derived again from them); the others
    are still found as stored."""
    from dif.lora.merge import LoraMergedSource

    rng = np.random.default_rng(6)
    path = tmp_path / "two.safetensors"
    save_tensors(
        path, {n: rng.standard_normal((F, D)).astype(E4M3) for n in ("a.weight", "b.weight")}, dif_metadata=False
    )
    merged = LoraMergedSource(
        open_safetensors(path), {"a.weight": ()}, ()
    )  # which weights it adapts is all that counts
    assert locate_fp8(merged, "a.weight") is None
    stored = locate_fp8(merged, "b.weight")
    assert stored is not None and stored.dtype == "F8_E4M3"

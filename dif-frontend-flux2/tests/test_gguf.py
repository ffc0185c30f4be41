"""FLUX.2 [klein] transformers from GGUF files, in ComfyUI-GGUF's layout (city96: the original BFL
tensor names, prefix stripped, 1-D tensors kept F32) and stable-diffusion.cpp's (the same names
under `model.diffusion_model.`), quantized Q8_0 (gguf's own quantizer) and Q4_K (a small test
quantizer; gguf has no Python Q4_K quantizer, its dequantizer is the reference), rendered end to end
by `dif flux2 generate`. The image equals the one from the same dequantized weights stored as a
plain BFL safetensors file (the GGUF path adds nothing but the dequantization, which
dif-core/tests/test_gguf.py checks bit-exact), and stays near the unquantized model's image."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.serialize.diftensor import save_tensors
from dif_frontend_flux2 import DEFAULT_CHECKPOINT

gguf = pytest.importorskip("gguf", reason="GGUF files are written with the gguf package")
cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize as ref_dequantize  # noqa: E402
from gguf.quants import quantize as ref_quantize  # noqa: E402


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """(rows, cols) float32, cols % 256 == 0 -> Q4_K blocks (rows, cols / 256 * 144) uint8."""
    blocks = x.reshape(-1, 8, 32).astype(np.float32)
    lo, hi = blocks.min(axis=2), blocks.max(axis=2)
    mins = np.maximum(-lo, 0.0)
    scales = (hi + mins) / 15.0
    d = (scales.max(axis=1) / 63.0).astype(np.float16)
    dmin = (mins.max(axis=1) / 63.0).astype(np.float16)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.round(np.divide(scales, df, out=np.zeros_like(scales), where=df > 0)), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(np.divide(mins, dminf, out=np.zeros_like(mins), where=dminf > 0)), 0, 63).astype(np.uint8)
    step = (df * sc)[:, :, None]
    q = np.round(np.divide(blocks + (dminf * mn)[:, :, None], step, out=np.zeros_like(blocks), where=step > 0))
    q = np.clip(q, 0, 15).astype(np.uint8)  # (n, 8, 32)
    packed = np.empty((len(blocks), 12), np.uint8)
    packed[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), packed, qs], axis=1)
    return out.reshape(x.shape[0], -1)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """The embedded checkpoint with a wider transformer (256 wide: every matrix Q4_K-quantizable)."""
    diffusers = pytest.importorskip("diffusers", reason="the tiny transformer is made by diffusers")
    torch = pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("klein") / "klein"
    shutil.copytree(DEFAULT_CHECKPOINT, root)
    shutil.rmtree(root / "transformer")
    torch.manual_seed(0)
    model = diffusers.Flux2Transformer2DModel(
        num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=2, joint_attention_dim=24,
        in_channels=128, timestep_guidance_channels=256, axes_dims_rope=(32, 32, 32, 32), rope_theta=2000,
        mlp_ratio=3.0, eps=1e-6, guidance_embeds=False,
    ).eval()  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.2 * noise if p.ndim == 1 else noise / p.shape[-1] ** 0.5)
    model.save_pretrained(root / "transformer")
    return root


def write_gguf(path: Path, tensors: dict[str, np.ndarray], qtype: str, prefix: str) -> dict[str, np.ndarray]:
    """Write `tensors` as a GGUF the way the converters do (2-D matrices quantized where the row
    length allows, everything else F32); returns the dequantized values each tensor now holds."""
    writer = gguf.GGUFWriter(str(path), arch="flux")
    held: dict[str, np.ndarray] = {}
    quantized = 0
    for name, value in tensors.items():
        value = value.astype(np.float32)
        block = 256 if qtype == "Q4_K" else 32
        if value.ndim == 2 and value.shape[1] % block == 0:
            raw = quantize_q4_k(value) if qtype == "Q4_K" else ref_quantize(value, getattr(Q, qtype))
            kind = getattr(Q, qtype)
            quantized += 1
        else:
            raw, kind = value, Q.F32
        writer.add_tensor(prefix + name, raw, raw_dtype=kind)
        held[name] = np.asarray(ref_dequantize(raw, kind), np.float32).reshape(value.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert quantized >= 8, f"only {quantized} tensors quantized: the test would prove little"
    return held


COMMON = ["-p", "a fox", "-W", "32", "-H", "32", "--seed", "4", "--steps", "2"]


def render(model: Path, base: Path, out: Path, *extra: str) -> np.ndarray:
    from PIL import Image

    result = CliRunner().invoke(
        cli, ["flux2", "generate", "-m", str(model), "--base", str(base), *COMMON, *extra, "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    with Image.open(out) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int16)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
@pytest.mark.parametrize("layout, prefix", [("city96", ""), ("sd.cpp", "model.diffusion_model.")])
def test_gguf_renders_like_its_dequantized_weights(tiny_folder, tmp_path, bfl_tensors, qtype, layout, prefix) -> None:  # type: ignore[no-untyped-def]
    bfl = bfl_tensors(tiny_folder / "transformer")
    path = tmp_path / f"klein-{layout}-{qtype}.gguf"
    held = write_gguf(path, bfl, qtype, prefix)
    reference = tmp_path / "dequantized.safetensors"
    save_tensors(reference, held, dif_metadata=False)
    image = render(path, tiny_folder, tmp_path / "gguf.png")
    assert np.array_equal(image, render(reference, tiny_folder, tmp_path / "ref.png"))
    plain = tmp_path / "plain.safetensors"
    save_tensors(plain, bfl, dif_metadata=False)
    unquantized = render(plain, tiny_folder, tmp_path / "plain.png")
    err = np.abs(image - unquantized).mean()
    print(f"{layout} {qtype}: mean abs pixel difference to the unquantized model {err:.3f}")
    # measured (0-255 scale): Q8_0 0.31, Q4_K 3.6 in both layouts
    assert err < (1.0 if qtype == "Q8_0" else 10.0), f"{qtype}: mean abs pixel error {err:.2f} vs unquantized"


def test_gguf_is_detected_and_bad_gguf_refused(tiny_folder, tmp_path, bfl_tensors) -> None:  # type: ignore[no-untyped-def]
    from dif_frontend_flux2.weights import detect

    path = tmp_path / "k.gguf"
    write_gguf(path, bfl_tensors(tiny_folder / "transformer"), "Q8_0", "")
    assert detect(path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-1000])
    out = tmp_path / "o.png"
    args = ["flux2", "generate", "--transformer", str(cut), "-m", str(tiny_folder), *COMMON, "-o", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and "truncated GGUF" in result.output and "cut.gguf" in result.output
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.parametrize("backend", ["cpu", "opencl", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_q4_0_gguf_runs_its_blocks_as_4_bit_groups(tiny_folder, tmp_path, bfl_tensors, backend) -> None:  # type: ignore[no-untyped-def]
    """A Q4_0 GGUF's matrices stay 4-bit on every backend: every linear over one is `int4_linear` in groups of
    32 reading the file's blocks (the plan says how many were kept; the transformer's resident weights are
    under half those of the same model from a Q8_0 file, which runs dequantized: measured 2.65 MB against
    15.5 MB), and the fp32 image is the one its dequantized weights draw (`int4_linear` and linear may differ
    in how they sum: within 2 of 255, mean < 0.1; measured identical on the CPU and OpenCL)."""
    import json

    from dif.testing.backends import backend_skip_reason

    if (why := backend_skip_reason(backend)) is not None:
        pytest.skip(f"{backend} backend unavailable: {why}")

    bfl = bfl_tensors(tiny_folder / "transformer")
    path = tmp_path / "klein-Q4_0.gguf"
    held = write_gguf(path, bfl, "Q4_0", "")
    reference = tmp_path / "dequantized.safetensors"
    save_tensors(reference, held, dif_metadata=False)

    def generate(model: Path, out: Path) -> dict:
        args = ["flux2", "generate", "-m", str(model), "--base", str(tiny_folder), *COMMON, "--dtype", "f32"]
        args += ["--backend", backend]
        result = CliRunner().invoke(cli, [*args, "-o", str(out), "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["data"]

    q4 = generate(path, tmp_path / "q4.png")
    kept = q4["settings"]["q4_0_weights"]["flux2_transformer"]
    quantized = sum(1 for v in bfl.values() if v.ndim == 2 and v.shape[1] % 32 == 0)
    # every Q4_0 matrix is a linear's weight (a fused qkv is three: one per chunk of its rows)
    assert kept.endswith("kept as stored (Q4_0 as int4-group32)") and int(kept.split()[0]) >= quantized, kept
    ref = generate(reference, tmp_path / "ref.png")
    assert "q4_0_weights" not in ref["settings"]
    from PIL import Image

    with Image.open(tmp_path / "q4.png") as a, Image.open(tmp_path / "ref.png") as b:
        diff = np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16))
    assert diff.max() <= 2 and diff.mean() < 0.1, (diff.max(), diff.mean())
    q8 = tmp_path / "klein-Q8_0.gguf"
    write_gguf(q8, bfl, "Q8_0", "")
    weights = {name: doc["memory"]["programs"]["flux2_transformer"]["resident_bytes"] for name, doc in
               (("q4", q4), ("q8", generate(q8, tmp_path / "q8.png")))}  # fmt: skip
    print(f"Q4_0 kept 4-bit: {kept}; pixels vs dequantized max {diff.max()} mean {diff.mean():.4f}; resident {weights}")
    assert weights["q4"] < 0.5 * weights["q8"], weights

"""The W8A8 pass over the published DiTs at 1024x1024 (programs built from the packaged configs, no weights):
every block's gated residual goes into its fp8 GEMM's epilogue, and the quantizing producers take the place of
the passes over the activations that Krea 2's and FLUX.2's blocks would otherwise need."""

from __future__ import annotations

import pytest

from dif.dtypes import DType
from dif.ir.program import Program
from dif.passes import DEFAULT_PASSES, optimize
from dif.target import TargetProfile

FP8 = TargetProfile(
    backend="fp8-unit",
    device="unit",
    dtypes=("f32", "bf16", "f8e4m3"),
    capabilities=("op:*", "format:fp8-e4m3"),
)


def klein(variant: str) -> Program:
    from dif_frontend_flux2.config import load_configs
    from dif_frontend_flux2.configs import published
    from dif_frontend_flux2.model import build_transformer

    cfg = load_configs(published(variant)).transformer
    return build_transformer(cfg, batch=1, n_img=4096, n_txt=512, dtype=DType.BF16)


def krea2() -> Program:
    from dif_frontend_krea2.config import load_configs
    from dif_frontend_krea2.configs import published
    from dif_frontend_krea2.model import build_transformer

    cfg = load_configs(published("turbo")).transformer
    return build_transformer(cfg, image_len=4096, text_len=512, dtype=DType.BF16, masked=True)


# the gated residuals: klein's double blocks 4 each (two streams, attention and MLP), its single blocks 1 each;
# Krea 2's blocks 2 each
@pytest.mark.parametrize(
    ("build", "blocks"),
    [(lambda: klein("klein-4b"), 5 * 4 + 20), (lambda: klein("klein-9b"), 8 * 4 + 24), (krea2, 28 * 2)],
    ids=["klein-4b", "klein-9b", "krea2"],
)
def test_every_block_gated_residual_goes_into_its_fp8_gemm(build, blocks: int) -> None:  # type: ignore[no-untyped-def]
    bf16, _ = optimize(build(), target=FP8, passes=DEFAULT_PASSES)
    fp8, decisions = optimize(build(), target=FP8, passes=(*DEFAULT_PASSES, "quantize_fp8"))
    assert bf16.op_histogram()["gated_residual"] == blocks
    ops = fp8.op_histogram()
    assert ops.get("scaled_linear_gated_residual") == blocks and "gated_residual" not in ops
    fused = [d for d in decisions if d.reason == "scaled_linear + gated_residual -> scaled_linear_gated_residual"]
    assert len(fused) == blocks and all(d.verdict == "applied" for d in fused)


# klein's 8 + 24 (4B: 5 + 20) attentions read q and k from rms_norm_rope (the double blocks' two streams
# concatenated); Krea 2's 28 image attentions do, its 4 text-fusion attentions (q, k without RoPE) do not
@pytest.mark.parametrize(
    ("build", "normed", "plain"),
    [(lambda: klein("klein-4b"), 25, 0), (lambda: klein("klein-9b"), 32, 0), (krea2, 28, 4)],
    ids=["klein-4b", "klein-9b", "krea2"],
)
def test_every_normed_attention_reads_q_and_k_quantized_by_their_norms(build, normed: int, plain: int) -> None:  # type: ignore[no-untyped-def]
    fp8, decisions = optimize(build(), target=FP8, passes=(*DEFAULT_PASSES, "quantize_fp8", "quantize_fp8_attention"))
    ops = fp8.op_histogram()
    assert ops.get("sdpa_fp8_qk") == normed and ops.get("sdpa_fp8", 0) == plain and "sdpa" not in ops
    assert ops.get("rms_norm_rope_quant", 0) >= 2 * normed and "rms_norm_rope" not in ops
    for node in (n for n in fp8.nodes if n.op == "sdpa_fp8_qk"):  # e4m3 in, and one f32 scale for each
        assert [fp8.types[o].dtype.value for o in node.operands[:4]] == ["f8e4m3", "f32", "f8e4m3", "f32"]
    attention = [d for d in decisions if d.pass_name == "quantize_fp8_attention"]
    assert len(attention) == normed + plain and all(d.verdict == "applied" for d in attention)

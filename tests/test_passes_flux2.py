"""The optimizer on a real model: the tiny FLUX.2 [klein] transformer shipped as the demo checkpoint
(its own config, random weights) loses nodes to the fusions and gives bit-identical outputs on the
CPU backend, in f32 and in bf16, with and without passes, through `dif.runtime.prepare`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.interp import interpret
from dif.ir.program import Program
from dif.passes import DEFAULT_PASSES, optimize
from dif.runtime import prepare

flux2 = pytest.importorskip("dif_frontend_flux2", reason="needs the FLUX.2 frontend (dif-frontend-flux2)")
cpu = pytest.importorskip("dif_backend_cpu", reason="needs dif-backend-cpu")

from dif_frontend_flux2.config import Flux2TransformerConfig  # noqa: E402
from dif_frontend_flux2.model import build_transformer  # noqa: E402

CONFIG = Path(flux2.__file__).parent / "default" / "transformer" / "config.json"


def tiny_transformer(dtype: str) -> Program:
    return build_transformer(Flux2TransformerConfig.from_json(CONFIG), batch=1, n_img=16, n_txt=6, dtype=dtype)


def bindings(program: Program) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in program.inputs}
    weights = {v.name: (0.2 * rng.standard_normal(v.type.shape)).astype(v.type.dtype.np) for v in program.params}
    return inputs, weights


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_flux2_transformer_fuses_and_stays_bit_identical_on_cpu(dtype: str) -> None:
    program = tiny_transformer(dtype)
    backend = cpu.CpuBackend()
    optimized, decisions = optimize(program, target=backend.profile())
    before, after = program.op_histogram(), optimized.op_histogram()
    # each double-stream block: 4 adaLN norms, 4 gated residuals, and 4 q/k norm + ropes once
    # rope_before_concat has moved its two ropes (over text|image concats) onto the four parts; each single
    # block: 1 norm, 1 gated residual, 2 q/k norm + ropes; and the output norm. The tables are sliced once
    # for all double blocks (4 slices)
    cfg = Flux2TransformerConfig.from_json(CONFIG)
    doubles, singles = cfg.num_layers, cfg.num_single_layers
    fused = (after["norm_modulate"], after["gated_residual"], after["rms_norm_rope"])
    assert fused == (4 * doubles + singles + 1, 4 * doubles + singles, 4 * doubles + 2 * singles)
    assert "layer_norm" not in after and "modulate" not in after and "rope" not in after
    assert before["rope"] == 2 * doubles + 2 * singles
    assert after["slice"] == before.get("slice", 0) + 4 and after["concat"] == before["concat"]
    # the fusions of a double block remove 10 nodes, of a single block 4, of the output norm 1; the 4 slices add
    assert len(optimized.nodes) == len(program.nodes) - (10 * doubles + 4 * singles + 1 - 4)
    # every default pass but the GroupNorm + SiLU fusion (the transformer has no GroupNorm), the residual one
    # (every residual add of a FLUX.2 block is gated: a gated_residual), the training one (no backward here) and
    # the activation-times-value one (its SwiGLUs halve one projection: glu)
    unused = {"fuse_group_norm_silu", "fuse_linear_residual", "reuse_attention_stats", "fuse_act_mul"}
    assert {d.pass_name for d in decisions} == set(DEFAULT_PASSES) - unused
    assert all(d.verdict == "applied" for d in decisions)

    inputs, weights = bindings(program)
    fused_exe, fused_plan = prepare(program, weights, backend, passes=DEFAULT_PASSES)
    plain_exe, plain_plan = prepare(program, weights, backend, passes=())
    assert len(fused_plan.schedule) == len(optimized.nodes) and len(plain_plan.schedule) == len(program.nodes)
    assert fused_plan.decisions[0].what == f"passes: {', '.join(DEFAULT_PASSES)}"
    assert plain_plan.decisions[0].what == "passes: none"
    got, plain = fused_exe.run(inputs), plain_exe.run(inputs)
    want = interpret(program, inputs, weights)
    for name in program.outputs:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_array_equal(got[name].view(np.uint8), want[name].view(np.uint8))
        np.testing.assert_array_equal(plain[name].view(np.uint8), want[name].view(np.uint8))

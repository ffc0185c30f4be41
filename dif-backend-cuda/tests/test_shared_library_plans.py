"""Library plans shared across nodes on the GPU (marker `cuda`): three identical blocks build one cuDNN
SDPA graph and ask cuBLASLt's heuristic once per distinct GEMM problem, and each node still computes
what the reference interpreter does (every node runs the shared graph with its own pointers). A second
backend (a later process) deserializes the stored plan instead of building it and reads the heuristic's
results instead of asking it, with the same output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.passes import optimize
from dif.plan.planner import plan_program

from .conftest import cuda_skip_reason

pytestmark = pytest.mark.cuda

BLOCKS, TOKENS, HEADS, HD = 3, 64, 4, 64


def stacked_attention(dtype: str = "bf16") -> Program:
    """`BLOCKS` residual attention blocks of one shape: q, k, v and output projections around an sdpa."""
    d = HEADS * HD
    b = ProgramBuilder("stacked_attention")
    x = b.input("x", (1, TOKENS, d), dtype)
    for i in range(BLOCKS):
        q, k, v = (
            b.emit("reshape", b.emit("linear", x, b.param(f"w{i}_{n}", (d, d), dtype)), shape=(1, TOKENS, HEADS, HD))
            for n in "qkv"
        )
        o = b.emit("reshape", b.emit("sdpa", q, k, v), shape=(1, TOKENS, d))
        x = b.emit("add", x, b.emit("linear", o, b.param(f"w{i}_o", (d, d), dtype)))
    b.output(x)
    return b.build()


def test_identical_nodes_share_one_cudnn_graph_and_one_heuristic_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
    from dif_backend_cuda.device import CudaBackend

    monkeypatch.setenv("DIF_CACHE_DIR", str(tmp_path))
    backend = CudaBackend(sdpa="cudnn", gemm="cublaslt")
    program, _ = optimize(stacked_attention(), target=backend.profile())
    rng = np.random.default_rng(0)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in program.inputs}
    weights = {p.name: (rng.standard_normal(p.type.shape) * 0.05).astype(p.type.dtype.np) for p in program.params}
    plan = plan_program(program, backend.profile(), backend.budget())
    exe = backend.prepare(program, plan, weights)
    sdpa = [exe.choices[n.id] for n in program.nodes if n.op == "sdpa"]
    assert len(sdpa) == BLOCKS and all(c.startswith("cudnn-sdpa") for c in sdpa), sdpa
    assert "graph shared" not in sdpa[0] and all("graph shared" in c for c in sdpa[1:]), sdpa
    linears = sum(1 for n in program.nodes if n.op == "linear")
    # one problem per distinct (shape, layout, alignment): q/k/v (or their fused projection) and out
    assert len(backend.lt().heuristics) <= 3 < linears, (linears, list(backend.lt().heuristics))
    want = interpret(program, inputs, weights)[program.outputs[0]].astype(np.float64)
    got = exe.run(inputs)[program.outputs[0]].astype(np.float64)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel <= 2e-2, f"rel-L2 {rel:.2e} ({exe.describe()})"
    assert "from the plan cache" not in sdpa[0]
    cudnn_steps = [step for step in exe.steps if getattr(step, "kind", "") == "cudnn"]
    assert cudnn_steps and all(step.built.workspace is backend.cudnn()._workspace for step in cudnn_steps)

    from dif_backend_cuda.gemm import LtMatmul

    asked: list[object] = []
    real = LtMatmul._heuristic
    monkeypatch.setattr(LtMatmul, "_heuristic", lambda self: asked.append(self.key) or real(self))
    later = CudaBackend(sdpa="cudnn", gemm="cublaslt")  # a later process: a fresh cuDNN context, same store
    again = later.prepare(program, plan, weights)
    assert asked == [] and later.lt().heuristics.keys() == backend.lt().heuristics.keys()  # read, not asked
    first = [again.choices[n.id] for n in program.nodes if n.op == "sdpa"][0]
    assert "from the plan cache" in first, first
    np.testing.assert_array_equal(again.run(inputs)[program.outputs[0]], exe.run(inputs)[program.outputs[0]])

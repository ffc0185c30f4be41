"""Views on the GPU (marker `cuda`): a single-stream block planned with pitched views (split parts and
concat parts as rows of wider buffers, dif.plan.views) computes what the reference interpreter does, as
does the same program planned without views, on cuBLASLt/cuDNN and on the portable kernels, for head
dims that take the vectorized and the generic RMS-norm+RoPE kernels."""

from __future__ import annotations

import numpy as np
import pytest

from dif.interp import interpret
from dif.passes import optimize
from dif.plan.planner import plan_program

from .conftest import cuda_skip_reason
from .programs import single_block

pytestmark = pytest.mark.cuda

TOL = {"bf16": 2e-2, "f32": 1e-4}  # relative L2 against the interpreter (fp32 references, bf16 storage)


def _backend(options: dict[str, str]):  # type: ignore[no-untyped-def]
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
    from dif_backend_cuda.device import CudaBackend

    return CudaBackend(**options)


@pytest.mark.parametrize("options", [{}, {"gemm": "nvrtc", "sdpa": "flash"}], ids=["libraries", "portable"])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize(("hd", "mode"), [(128, "pairs"), (128, "half"), (64, "pairs")])
def test_single_block_with_views_matches_the_interpreter(
    options: dict[str, str], dtype: str, hd: int, mode: str
) -> None:
    backend = _backend(options)
    program, _ = optimize(single_block(dtype, hd=hd, mode=mode), target=backend.profile())
    assert any(n.op == "rms_norm_rope" for n in program.nodes)
    rng = np.random.default_rng(hd)
    np_dtype = {t.name: t.type.dtype.np for t in (*program.inputs, *program.params)}
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np_dtype[v.name]) for v in program.inputs}
    weights = {p.name: (rng.standard_normal(p.type.shape) * 0.05).astype(np_dtype[p.name]) for p in program.params}
    want = interpret(program, inputs, weights)[program.outputs[0]].astype(np.float64)
    viewed = plan_program(program, backend.profile(), backend.budget())
    assert sum(1 for b in viewed.buffers if b.pitch_bytes) >= 6
    for plan in (viewed, plan_program(program, backend.profile(), backend.budget(), alias=False)):
        exe = backend.prepare(program, plan, weights)
        got = exe.run(inputs)[program.outputs[0]].astype(np.float64)
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel <= TOL[dtype], f"rel-L2 {rel:.2e} ({exe.describe()})"
    copies = [
        s
        for s in backend.prepare(program, viewed, weights).steps
        if s.kind == "copy" or "strided_copy" in getattr(s, "name", "")
    ]
    assert copies == []  # split and concat cost nothing

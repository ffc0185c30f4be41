"""The fused AdamW step (`adamw_update`): its decomposition gives the same f32 bits as its reference, and the
reference is torch.optim.AdamW's step."""

from __future__ import annotations

import numpy as np
import pytest

from dif.dtypes import DType
from dif.interp import interpret
from dif.ops.optim import adamw_update
from dif.passes.legalize import legalize
from dif.target import TargetProfile
from dif.testing.conformance import ConformanceCase, case_inputs, case_program, conformance_cases

CASES = conformance_cases(dtypes=(DType.F32,), ops=["adamw_update"])
BARE = TargetProfile(backend="bare", device="test", dtypes=("f32",))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_decomposition_gives_the_reference_bits(case: ConformanceCase) -> None:
    program = case_program(case)
    chain, _ = legalize(program, BARE)
    assert "adamw_update" not in chain.op_histogram()
    got = interpret(chain, case_inputs(case), {})
    want = adamw_update(*case.case.operands, beta1=0.9, beta2=0.999, eps=1e-8)
    for name, w in zip(chain.outputs, want, strict=True):
        np.testing.assert_array_equal(got[name], w)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_reference_is_a_torch_adamw_step(weight_decay: float) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    p0, g = (rng.standard_normal(64).astype(np.float32) for _ in range(2))
    lr, b1, b2, eps, steps = 1e-2, 0.9, 0.999, 1e-8, 3
    param = torch.nn.Parameter(torch.tensor(p0))
    opt = torch.optim.AdamW([param], lr=lr, betas=(b1, b2), eps=eps, weight_decay=weight_decay)
    p, m, v = p0, np.zeros_like(p0), np.zeros_like(p0)
    for t in range(1, steps + 1):
        param.grad = torch.tensor(g * t)
        opt.step()
        scalars = [np.full((1,), x, np.float32) for x in (lr / (1 - b1**t), np.sqrt(1 - b2**t), 1 - lr * weight_decay)]
        p, m, v = adamw_update(p, g * t, m, v, *scalars, beta1=b1, beta2=b2, eps=eps)
    np.testing.assert_allclose(p, param.detach().numpy(), rtol=1e-6, atol=1e-7)

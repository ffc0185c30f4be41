"""The backward half of the conformance kit: every op case with a VJP rule becomes a VJP program
(`dif.autodiff.grad_program` of the case's one-node program, cotangents as inputs) that

- is checked in float64 against central finite differences of the op's own reference
  (`check_vjp_float64`: the rule is right), and
- runs on any backend against the reference interpreter like a forward case (`run_backward_case`:
  the backend runs the backward ops right).

A backend's test file needs only:

    @pytest.mark.parametrize("case", backward_params("mine"))
    def test_backward(case):
        assert_backward_case(BACKEND, case)
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from attrs import frozen

from dif.backend import Backend
from dif.dtypes import DType, dtype_of
from dif.errors import DifError
from dif.interp import interpret
from dif.ir.program import Program
from dif.ops.registry import OPS, OpTable
from dif.testing.conformance import (
    DEFAULT_DTYPES,
    ERROR,
    FAIL,
    PASS,
    CaseResult,
    ConformanceCase,
    _judge,
    case_inputs,
    case_program,
    conformance_cases,
    run_on_backend,
)

FD_STEP = 1e-6
"""Central-difference step, relative to max(1, |x|); the truncation error is ~step^2, rounding ~1e-16/step."""
FD_TOLERANCE = 1e-6
"""|autodiff - finite difference| <= FD_TOLERANCE * (1 + max |gradient|), per element, in float64."""


@frozen
class BackwardCase:
    """A conformance case, its VJP program and the values to feed it (operands + cotangents)."""

    case: ConformanceCase
    program: Program
    wrt: tuple[str, ...]
    gradients: dict[str, str]
    inputs: dict[str, np.ndarray]

    @property
    def id(self) -> str:
        return self.case.id


def differentiable_cases(
    table: OpTable = OPS, dtypes: Sequence[DType] = DEFAULT_DTYPES, *, ops: Iterable[str] | None = None
) -> list[ConformanceCase]:
    """The conformance cases of ops that have a VJP rule and at least one float operand."""
    from dif.autodiff.registry import NON_DIFFERENTIABLE, has_vjp

    return [
        c
        for c in conformance_cases(table, dtypes, ops=ops)
        if has_vjp(c.op) and c.op not in NON_DIFFERENTIABLE and any(dtype_of(a).is_float for a in c.case.operands)
    ]


def backward_case(case: ConformanceCase, *, table: OpTable = OPS) -> BackwardCase:
    """The VJP program of one case: inputs x0..xn (as the forward case) and cotangent.<k>; random
    cotangents drawn from a generator seeded by the case id."""
    from dif.autodiff.registry import constant_operands
    from dif.autodiff.transform import grad_program

    forward = case_program(case, table)
    fixed = constant_operands(case.op)
    wrt = tuple(v.name for i, v in enumerate(forward.inputs) if v.type.dtype.is_float and i not in fixed)
    grad = grad_program(forward, wrt, keep_outputs=False)
    rng = np.random.default_rng(zlib.crc32(f"vjp/{case.id}".encode()))
    inputs = case_inputs(case)
    types = forward.types
    for out, cname in grad.cotangents.items():
        t = types[out]
        inputs[cname] = rng.standard_normal(t.shape).astype(t.dtype.np)
    return BackwardCase(case, grad.program, wrt, grad.gradients, inputs)


# -- float64 -----------------------------------------------------------------------------------


def interpret_float64(
    program: Program, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray] | None = None,
    *, table: OpTable = OPS,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The reference interpreter with every float value kept in float64 (float->float casts are the
    identity), so gradients can be compared with finite differences without storage rounding."""
    weights = dict(weights or {})
    for v in (*program.inputs, *program.params):  # float64 arrays stand for float values of any dtype
        given = inputs.get(v.name, weights.get(v.name))
        if given is None or tuple(np.shape(given)) != v.type.shape:
            raise DifError(f"'{v.name}' ({v.type}) was not provided with that shape")
    env = {k: _up(np.asarray(v)) for k, v in {**inputs, **weights}.items()}
    for node in program.nodes:
        ops = [env[o] for o in node.operands]
        if node.op == "cast" and ops[0].dtype.kind == "f" and DType(str(node.attrs["dtype"])).is_float:
            outs: Sequence[np.ndarray] = (ops[0],)
        else:
            outs = table.get(node.op).run_reference(ops, node.attrs)
        for r, arr in zip(node.results, outs, strict=True):
            a = np.asarray(arr)
            env[r.name] = (
                a.astype(np.float64).reshape(r.type.shape) if r.type.dtype.is_float else a.astype(r.type.dtype.np)
            )
    return {name: env[name] for name in program.outputs}


def _up(a: np.ndarray) -> np.ndarray:
    """Float arrays (f16/bf16/f32/f64) in float64; integer and bool arrays unchanged."""
    return a if a.dtype.kind in "iub" else a.astype(np.float64)


def check_vjp_float64(
    case: ConformanceCase, *, table: OpTable = OPS, elements: int = 48, directions: int = 3
) -> CaseResult:
    """The case's VJP (float64 interpreter) vs central differences of the op's reference: `elements`
    random entries of each operand's gradient, and `directions` random directional derivatives of all."""
    try:
        bc = backward_case(case, table=table)
        got = interpret_float64(bc.program, bc.inputs, table=table)
        forward = case_program(case, table)
        operands = [_up(np.asarray(a)) for a in case.case.operands]
        cots = {out: _up(bc.inputs[k]) for out, k in _cotangent_inputs(bc).items()}

        def loss(xs: list[np.ndarray]) -> float:
            outs = interpret_float64(forward, {f"x{i}": a for i, a in enumerate(xs)}, table=table)
            return float(sum(np.sum(outs[name] * c) for name, c in cots.items()))

        rng = np.random.default_rng(zlib.crc32(f"fd/{case.id}".encode()))
        worst = 0.0
        details = []
        grads = {w: got[bc.gradients[w]] for w in bc.wrt}
        scale = 1.0 + max((float(np.abs(g).max(initial=0)) for g in grads.values()), default=0.0)
        for w in bc.wrt:
            j = int(w[1:])
            g = grads[w]
            x = operands[j]
            flat = rng.choice(x.size, size=min(elements, x.size), replace=False) if x.size else []
            for e in flat:
                h = FD_STEP * max(1.0, abs(float(x.flat[e])))
                fd = _central(loss, operands, j, lambda a, e=e, h=h: _bump(a, e, h), h)
                err = abs(fd - float(g.flat[e]))
                worst = max(worst, err / scale)
                if err > FD_TOLERANCE * scale and len(details) < 3:
                    details.append(
                        f"d/d{w}[{np.unravel_index(e, x.shape)}]: autodiff {float(g.flat[e]):.9g}, FD {fd:.9g}"
                    )
            for _ in range(directions if x.size else 0):
                v = rng.standard_normal(x.shape)
                fd = _central(loss, operands, j, lambda a, v=v: a + FD_STEP * v, FD_STEP)
                ad = float(np.sum(g * v))
                err = abs(fd - ad) / max(1.0, float(np.sqrt(x.size)))
                worst = max(worst, err / scale)
                if err > FD_TOLERANCE * scale and len(details) < 3:
                    details.append(f"direction of {w}: autodiff {ad:.9g}, FD {fd:.9g}")
        status = PASS if not details else FAIL
        return CaseResult(case.op, case.case.name, case.dtype, "vjp-fd64", status, worst, worst, "; ".join(details))
    except (DifError, ValueError, TypeError, FloatingPointError) as exc:
        return CaseResult(case.op, case.case.name, case.dtype, "vjp-fd64", ERROR, detail=f"{type(exc).__name__}: {exc}")


def _cotangent_inputs(bc: BackwardCase) -> dict[str, str]:
    """forward output name -> its cotangent input, read back from the program's inputs."""
    from dif.autodiff.transform import COTANGENT_PREFIX

    forward_outputs = case_program(bc.case).outputs
    return {
        forward_outputs[int(v.name[len(COTANGENT_PREFIX) :])]: v.name
        for v in bc.program.inputs
        if v.name.startswith(COTANGENT_PREFIX)
    }


def _bump(a: np.ndarray, e: int, h: float) -> np.ndarray:
    out = a.copy()
    out.flat[e] += h
    return out


def _central(loss: Any, xs: list[np.ndarray], j: int, move: Any, h: float) -> float:
    plus = list(xs)
    plus[j] = move(xs[j])
    minus = list(xs)
    minus[j] = 2 * xs[j] - plus[j]  # the mirrored point: x - (step)
    return (loss(plus) - loss(minus)) / (2 * h)


# -- backends ----------------------------------------------------------------------------------


def run_backward_case(backend: Backend, case: ConformanceCase, *, table: OpTable = OPS) -> CaseResult:
    """The case's VJP program on `backend` vs the reference interpreter, under the forward tolerances."""
    try:
        bc = backward_case(case, table=table)
        want = interpret(bc.program, bc.inputs, {}, table=table)
        got = run_on_backend(backend, bc.program, bc.inputs)
        names = bc.program.outputs
        return _judge(case, "backward", [got[n] for n in names], [want[n] for n in names], bc.program, table)
    except (DifError, ValueError, TypeError, FloatingPointError) as exc:
        status = FAIL if not isinstance(exc, DifError) else ERROR
        return CaseResult(
            case.op, case.case.name, case.dtype, "backward", status, detail=f"{type(exc).__name__}: {exc}"
        )


def backward_params(
    backend_name: str = "", *, ops: Iterable[str] | None = None, dtypes: Sequence[DType] = DEFAULT_DTYPES,
    table: OpTable = OPS,
) -> list[Any]:  # fmt: skip
    """`pytest.param(case, id=...)` for every differentiable conformance case."""
    import pytest

    prefix = f"{backend_name}:bwd:" if backend_name else "bwd:"
    return [pytest.param(c, id=prefix + c.id) for c in differentiable_cases(table, dtypes, ops=ops)]


def assert_backward_case(backend: Backend, case: ConformanceCase, *, table: OpTable = OPS) -> None:
    result = run_backward_case(backend, case, table=table)
    assert result.status == PASS, result.line()


def assert_vjp_float64(case: ConformanceCase, *, table: OpTable = OPS) -> None:
    result = check_vjp_float64(case, table=table)
    assert result.status == PASS, result.line()

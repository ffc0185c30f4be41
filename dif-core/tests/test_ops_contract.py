"""Contract: every op in the table is complete (type rule, reference, doc, conformance cases) and documented."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.dtypes import DType, dtype_of
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ops.registry import OPS, OpDef
from dif.testing.conformance import HALF_ONLY_OPS

OPS_LIST = list(OPS)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "ir.md"


@pytest.mark.parametrize("op", OPS_LIST, ids=lambda o: o.name)
def test_op_is_complete(op: OpDef) -> None:
    assert callable(op.infer), f"{op.name} lacks a type rule"
    assert callable(op.reference), f"{op.name} lacks a reference implementation"
    assert len(op.doc) >= 10, f"{op.name} lacks a docstring"
    assert op.cases is not None, f"{op.name} lacks conformance cases"
    rng = np.random.default_rng(0)
    dtype = DType.BF16 if op.name in HALF_ONLY_OPS else DType.F32
    cases = op.cases(rng, dtype)
    assert cases, f"{op.name} has no {dtype.value} conformance case"


@pytest.mark.parametrize("op", OPS_LIST, ids=lambda o: o.name)
def test_op_cases_type_check_and_run(op: OpDef) -> None:
    """The type rule's result types are exactly what the reference produces for every case."""
    rng = np.random.default_rng(1)
    for dtype in (DType.F32, DType.BF16):
        assert op.cases is not None
        for case in op.cases(rng, dtype):
            b = ProgramBuilder(op.name)
            ins = [b.input(f"in{i}", a.shape, dtype_of(a)) for i, a in enumerate(case.operands)]
            outs = b.emit_multi(op.name, *ins, **case.attrs)
            b.output(*outs)
            program = b.build()
            raw = op.run_reference(list(case.operands), case.attrs)
            assert len(raw) == len(outs)
            for var, arr in zip(outs, raw, strict=True):
                assert tuple(arr.shape) == var.shape, (
                    f"{op.name}/{case.name}: reference shape {arr.shape} != {var.type}"
                )
            got = interpret(program, {f"in{i}": a for i, a in enumerate(case.operands)}, {})
            for var in outs:
                assert got[var.name].dtype == var.dtype.np


def test_every_op_is_documented() -> None:
    text = DOCS.read_text()
    missing = [op.name for op in OPS_LIST if f"`{op.name}`" not in text]
    assert not missing, f"docs/ir.md lacks entries for {missing}; run `python docs/gen_ir_md.py`"


def test_an_attribute_of_unknown_kind_is_refused_when_declared() -> None:
    from dif.errors import PluginError
    from dif.ops.registry import AttrSpec

    with pytest.raises(PluginError, match="unknown kind 'intt'"):
        AttrSpec("n", "intt")

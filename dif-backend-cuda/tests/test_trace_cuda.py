"""The cuda backend's trace points (dif_backend_cuda/trace.py): step grouping without a GPU; on a GPU, one op
event per node timed by CUDA events with the kernels that ran it, attribution inside the measured wall,
DIF_CAPTURE results equal to the graph replay's, and DIF_NVTX leaving the outputs unchanged."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

from dif_backend_cuda.executor import STREAM_STEP
from dif_backend_cuda.trace import _groups

from .conftest import cuda_skip_reason
from .programs import single_block


def test_groups_follow_the_schedule_and_keep_viewed_nodes() -> None:
    # nodes 0..4; node 1 is a view (no steps); a stream step sits between node 2 and node 3
    exe = types.SimpleNamespace(
        plan=types.SimpleNamespace(schedule=(0, 1, 2, 3, 4)),
        step_nodes=[0, 0, 2, STREAM_STEP, 3, 3, 3],
    )
    got = _groups(exe)  # type: ignore[arg-type]
    assert got == [
        ("node", 0, [0, 1]),
        ("node", 1, []),
        ("node", 2, [2]),
        ("stream", -1, [3]),
        ("node", 3, [4, 5, 6]),
        ("node", 4, []),
    ]


def _skip() -> None:
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(f"no usable CUDA device: {reason}")


@pytest.fixture
def single(monkeypatch: pytest.MonkeyPatch) -> Any:
    _skip()
    from dif.runtime import prepare

    program = single_block("bf16")
    rng = np.random.default_rng(0)
    weights = {p.name: (rng.standard_normal(p.type.shape) * 0.05).astype(p.type.dtype.np) for p in program.params}
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in program.inputs}
    monkeypatch.delenv("DIF_TRACE_FILE", raising=False)
    exe, _plan = prepare(program, weights, "cuda")
    return exe, inputs


@pytest.mark.cuda
def test_cuda_trace_events(single: Any) -> None:
    from dif import trace
    from dif.trace.attribute import attribute

    exe, inputs = single
    want = exe.run(inputs)
    with trace.collecting() as docs:
        got = exe.run(inputs)
    (doc,) = docs
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])  # eager steps compute what the graph does
    ops = [e for e in doc["events"] if e["name"] == "op"]
    assert sorted(e["op_id"] for e in ops) == sorted(n.id for n in exe.program.nodes)
    gemm = [e for e in ops if e["kind"] == "gemm"]
    assert gemm and all(e["impl"] and e["ms"] > 0 for e in gemm)
    a = attribute(docs)
    assert 0 < a["attributed_ms"] <= a["wall_ms"]
    assert {"gemm", "attention", "copy.h2d", "copy.d2h"} <= {r["name"] for r in a["by_kind"]}


@pytest.mark.cuda
def test_cuda_capture_and_nvtx(single: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from dif.bisect.fixtures import load_capture

    exe, inputs = single
    want = exe.run(inputs)
    monkeypatch.setenv("DIF_CAPTURE", "ops")
    monkeypatch.setenv("DIF_CAPTURE_DIR", str(tmp_path))
    exe.run(inputs)
    monkeypatch.delenv("DIF_CAPTURE")
    (path,) = tmp_path.glob("*.diftensor")
    cap = load_capture(path)
    assert set(cap.order) == {r.name for n in exe.program.nodes for r in n.results}
    for name in want:
        np.testing.assert_array_equal(cap.tensors[name], want[name])
    monkeypatch.setenv("DIF_NVTX", "1")
    again = exe.run(inputs)
    for name in want:
        np.testing.assert_array_equal(again[name], want[name])

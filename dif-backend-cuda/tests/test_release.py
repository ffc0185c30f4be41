"""`CudaExecutable.release` without a GPU: it waits for the backend's stream, then drops the graph, the steps,
the streamer, the host mirrors and every allocation it holds, and gives CuPy's unused pinned blocks back."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from dif_backend_cuda.executor import CudaExecutable


def test_release_frees_everything_the_executable_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    pool = types.SimpleNamespace(free_all_blocks=lambda: calls.append("free pinned blocks"))
    cupy = types.ModuleType("cupy")
    cupy.get_default_pinned_memory_pool = lambda: pool  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    memory = {name: object() for name in ("arena", "weights", "inputs", "staging", "pinned", "meta")}
    stream = types.SimpleNamespace(synchronize=lambda: calls.append(f"synchronize, {len(memory)} allocations held"))
    exe = CudaExecutable(
        program=None,
        plan=None,
        backend=types.SimpleNamespace(stream=stream),
        steps=[lambda s: None],
        tensors={"x": object()},
        memory=memory,
        in_host={"x": np.zeros(1)},
        out_host={"y": np.zeros(1)},
        choices={},
        step_nodes=[0],
        graph=object(),
        streamer=object(),  # type: ignore[arg-type]
    )
    exe.release()
    assert calls == ["synchronize, 6 allocations held", "free pinned blocks"]  # none freed while work may read it
    assert exe.graph is None and exe.streamer is None
    assert exe.memory == {} and exe.tensors == {} and exe.steps == [] and exe.step_nodes == []
    assert exe.in_host == {} and exe.out_host == {}

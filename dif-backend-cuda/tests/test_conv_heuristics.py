"""Which cuDNN heuristics a convolution's graph takes its plans from, without a GPU (a recording stand-in for the
cudnn frontend): `conv.HEURISTICS` in order, then the fallback engines; mode A's list alone where a mode before
it lists none for the problem; and the modes are part of the problem's key, so a choice stored as an index into
one list of plans is never read as an index into another."""

from __future__ import annotations

from typing import Any

import pytest

from dif.dtypes import DType
from dif_backend_cuda import conv


class FakeTensor:
    """The output tensor: every `set_*` returns it, as the frontend's chained setters do."""

    def __getattr__(self, name: str) -> Any:
        assert name.startswith("set_"), name
        return lambda *_args: self


class FakeGraph:
    def __init__(self, lib: FakeCudnn) -> None:
        self.lib = lib

    def tensor(self, **_kw: Any) -> FakeTensor:
        return FakeTensor()

    def conv_fprop(self, **_kw: Any) -> FakeTensor:
        return FakeTensor()

    def validate(self) -> None: ...

    def build_operation_graph(self) -> None: ...

    def create_execution_plans(self, modes: list[str]) -> None:
        self.lib.asked.append(modes)
        if any(m in self.lib.refusing for m in modes):
            raise RuntimeError("CUDNN_STATUS_NOT_SUPPORTED: no engine config from this heuristic")

    def deselect_workspace_greater_than(self, _limit: int) -> None: ...

    def check_support(self) -> None: ...


class FakeCudnn:
    class heur_mode:  # noqa: N801 - the frontend's spelling
        A, B, FALLBACK = "A", "B", "FALLBACK"

    class data_type:  # noqa: N801
        BFLOAT16, HALF, FLOAT = "bf16", "f16", "f32"

    def __init__(self, refusing: tuple[str, ...] = ()) -> None:
        self.asked: list[list[str]] = []
        self.refusing = refusing

    def pygraph(self, **_kw: Any) -> FakeGraph:
        return FakeGraph(self)


class FakeContext:
    """What `GraphStep.bind` reads: `shared_graph` builds the problem's graph (within the shared workspace)."""

    def __init__(self, lib: FakeCudnn) -> None:
        self.lib, self.handle = lib, None
        self.keys: list[tuple[Any, ...]] = []

    def shared_graph(self, key: tuple[Any, ...], build: Any, _pointers: Any) -> tuple[Any, bool]:
        self.keys.append(key)
        build(256 << 20)

        class Built:
            choice = "heuristic's first plan"

        return Built(), False


def make(lib: FakeCudnn) -> FakeContext:
    ctx = FakeContext(lib)
    conv.CudnnConv(ctx, DType.BF16, (1, 128, 64, 64), (128, 128, 3, 3), (1, 128, 64, 64), 1, 2, 3,
                   (1, 1), (1, 1), (1, 1))  # type: ignore[arg-type]  # fmt: skip
    return ctx


def test_plans_come_from_the_heuristics_in_order_then_the_fallback_engines() -> None:
    lib = FakeCudnn()
    make(lib)
    assert lib.asked == [[*conv.HEURISTICS, "FALLBACK"]]
    assert conv.HEURISTICS[0] == "B" and "A" in conv.HEURISTICS


def test_a_mode_that_lists_no_plan_leaves_mode_a() -> None:
    lib = FakeCudnn(refusing=("B",))
    make(lib)
    assert lib.asked == [[*conv.HEURISTICS, "FALLBACK"], ["A", "FALLBACK"]]


def test_mode_a_refusing_is_the_problems_refusal() -> None:
    with pytest.raises(RuntimeError, match="NOT_SUPPORTED"):
        make(FakeCudnn(refusing=("A",)))


def test_the_modes_are_part_of_the_problem_key(monkeypatch: pytest.MonkeyPatch) -> None:
    first = make(FakeCudnn()).keys[0]
    monkeypatch.setattr(conv, "HEURISTICS", ("A",))
    second = make(FakeCudnn()).keys[0]
    assert first[:7] == second[:7] and first != second
    assert second[7:] == ("A",)

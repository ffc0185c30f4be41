"""One backend shape (docs/backends.md): every backend has the same top-level files; the GPU backends put
their lowerings in `lower/<group>.py` and their kernel sources in `kernels/<group>.{cu,cl}`, one group per
`dif/ops/<group>.py` module, with the same stems in both; each lowering sits in the module of its op's
group; and what a backend declares (`supported_ops`, the fused ops in its capabilities) comes from its
lowering table."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import dif.ops
from dif.lowering import LoweringTable
from dif.ops.registry import OPS
from dif.passes.legalize import decomposable
from dif.plugins import backends

REPO = Path(__file__).resolve().parents[1]
BACKENDS = {"cpu": "dif_backend_cpu", "cuda": "dif_backend_cuda", "opencl": "dif_backend_opencl"}
GPU_BACKENDS = {"cuda": ("dif_backend_cuda", ".cu"), "opencl": ("dif_backend_opencl", ".cl")}
TOP_LEVEL = ("plugin.py", "device.py", "executor.py")
LOWER_SHARED = {"__init__", "base"}  # the registry and the backend's LowerCtx / tensor types
KERNEL_PRELUDE = "common"  # prepended to every kernel module


def _package_dir(backend: str) -> Path:
    module = BACKENDS[backend]
    return REPO / f"dif-backend-{backend}" / "src" / module


def op_groups() -> set[str]:
    """The stems of dif/ops/*.py that define ops (one per op group)."""
    return {d.reference.__module__.rpartition(".")[2] for d in OPS}


def _stems(folder: Path, suffix: str) -> set[str]:
    return {p.stem for p in folder.iterdir() if p.suffix == suffix}


def _table(backend: str) -> LoweringTable:
    table = importlib.import_module(f"{GPU_BACKENDS[backend][0]}.lower").LOWERINGS
    assert isinstance(table, LoweringTable) and table.backend == backend
    return table


def test_op_groups_are_the_dif_ops_modules() -> None:
    modules = _stems(Path(dif.ops.__file__).parent, ".py") - {"__init__", "registry", "_rules"}
    assert op_groups() == modules  # every op module defines ops, every op lives in one
    # an op's group is its module's name; fused ops of one family may have a module of their own
    # (norm_act, quant) and stay in the group "fused", which the fused capabilities are read from
    assert all(d.category in (d.reference.__module__.rpartition(".")[2], "fused") for d in OPS)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_has_the_same_top_level_files(backend: str) -> None:
    folder = _package_dir(backend)
    missing = [f for f in TOP_LEVEL if not (folder / f).is_file()]
    assert not missing, f"{backend} backend lacks {missing} in {folder}"


@pytest.mark.parametrize("backend", sorted(GPU_BACKENDS))
def test_lowerings_and_kernels_are_named_after_the_op_groups(backend: str) -> None:
    folder = _package_dir(backend)
    assert not list(folder.glob("lower_*.py")) and not (folder / "lower.py").exists(), "lowerings live in lower/"
    lower = _stems(folder / "lower", ".py")
    assert lower >= LOWER_SHARED and lower - LOWER_SHARED <= op_groups(), sorted(lower - LOWER_SHARED - op_groups())
    kernels = _stems(folder / "kernels", GPU_BACKENDS[backend][1]) - {KERNEL_PRELUDE}
    assert kernels and kernels <= op_groups(), sorted(kernels - op_groups())


def test_cuda_and_opencl_share_their_stems() -> None:
    def stems(backend: str) -> tuple[set[str], set[str]]:
        folder = _package_dir(backend)
        return _stems(folder / "lower", ".py"), _stems(folder / "kernels", GPU_BACKENDS[backend][1])

    (cuda_lower, cuda_kernels), (ocl_lower, ocl_kernels) = stems("cuda"), stems("opencl")
    assert cuda_lower == ocl_lower  # the same op groups, quant included: one shape for every backend
    assert cuda_kernels - {KERNEL_PRELUDE} == ocl_kernels - {KERNEL_PRELUDE}


def test_cuda_kernel_loader_knows_exactly_the_kernel_files() -> None:
    from dif_backend_cuda.kernels import MODULES, PRELUDES, module_source

    folder = _package_dir("cuda") / "kernels"
    assert set(MODULES) == _stems(folder, ".cu")
    assert {h for hs in PRELUDES.values() for h in hs} | {"common.cuh"} == {p.name for p in folder.glob("*.cuh")}
    for name in MODULES:
        assert (folder / f"{name}.cu").read_text() in module_source(name)


@pytest.mark.parametrize("backend", sorted(GPU_BACKENDS))
def test_each_lowering_sits_in_the_module_of_its_op_group(backend: str) -> None:
    table = _table(backend)
    package = GPU_BACKENDS[backend][0]
    misplaced = {
        op: fn.__module__
        for op, fn in table.items()
        if fn.__module__ != f"{package}.lower.{OPS.get(op).reference.__module__.rpartition('.')[2]}"
    }
    assert not misplaced, f"{backend}: lowerings outside lower/<op group>.py: {misplaced}"
    assert set(table) <= {d.name for d in OPS}


@pytest.mark.parametrize("backend", sorted(GPU_BACKENDS))
def test_supported_ops_and_fused_capabilities_come_from_the_lowering_table(backend: str) -> None:
    table = _table(backend)
    info = backends()[backend]
    assert info.declared_ops() == table.ops == frozenset(table)
    # both GPU backends lower the whole op table, but for ops with a decomposition (dif.passes.legalize)
    assert table.ops | decomposable() == {d.name for d in OPS}
    fused = {d.name for d in OPS if d.category == "fused"} & table.ops
    assert set(table.fused_ops()) == fused
    assert sorted(table.op_capabilities()) == sorted(f"op:{op}" for op in fused)


def test_a_lowering_table_refuses_a_second_lowering_and_names_a_missing_op() -> None:
    from dif.errors import NotImplementedOnBackend, PluginError
    from dif.ir.builder import ProgramBuilder

    table = LoweringTable("toy")

    @table.register("add", "gated_residual")
    def lower_add(ctx: object, node: object, attrs: object, ins: list[object], outs: list[object]) -> list[object]:
        return []

    with pytest.raises(PluginError, match="'add' lowered twice"):
        table.register("add")(lower_add)
    assert table.ops == {"add", "gated_residual"} and table.fused_ops() == ("gated_residual",)
    assert table.op_capabilities() == ["op:gated_residual"]
    b = ProgramBuilder("p")
    x = b.input("x", (2,), "f32")
    b.output(b.emit("mul", b.emit("add", x, x), x))
    added, multiplied = b.build().nodes
    assert table.lookup(added) is lower_add
    with pytest.raises(NotImplementedOnBackend, match="'mul' on backend 'toy'"):
        table.lookup(multiplied)

"""Lowering without a GPU: every conformance case lowers to launches of kernels that exist in the CUDA
sources, with exactly the argument count and widths their signatures declare (a mismatch there would
silently corrupt memory on the device). Needs a C preprocessor (`cpp`) to expand the instantiation
macros; skipped without one."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import numpy as np
import pytest

from dif.dtypes import DType
from dif.errors import NotImplementedOnBackend
from dif.ops.registry import OPS
from dif.testing.conformance import case_program, conformance_cases
from dif_backend_cuda.kernels import MODULES, module_source
from dif_backend_cuda.lower import (
    Copy,
    DevTensor,
    Launch,
    LowerCtx,
    MetaRef,
    broadcast_strides,
    collapse,
    lower_node,
    strided_meta,
)

_SIG = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)')


def _signatures() -> dict[str, dict[str, list[str]]]:
    cpp = shutil.which("cpp")
    if cpp is None:
        pytest.skip("no C preprocessor (cpp) to expand the kernel instantiation macros")
    out: dict[str, dict[str, list[str]]] = {}
    for mod in MODULES:
        text = subprocess.run(
            [cpp, "-P", "-x", "c++"], input=module_source(mod), capture_output=True, text=True, check=True
        ).stdout
        out[mod] = {m.group(1): [p.strip() for p in m.group(2).split(",")] for m in _SIG.finditer(text)}
    return out


def _width(param: str) -> tuple[str, int]:
    """('int'|'uint'|'float', bytes) of a kernel parameter declaration (pointers pass as uint64)."""
    decl = param.replace("__restrict__", "").replace("const", "").split()
    if "*" in param:
        return "uint", 8
    base = " ".join(decl[:-1])
    return {
        "i64": ("int", 8),
        "int": ("int", 4),
        "float": ("float", 4),
        "unsigned char": ("uint", 1),
        "unsigned short": ("uint", 2),
        "unsigned int": ("uint", 4),
        "u64": ("uint", 8),
    }[base]


def _arg_width(arg: Any) -> tuple[str, int]:
    if isinstance(arg, MetaRef):
        return "uint", 8
    assert isinstance(arg, np.generic), f"kernel argument {arg!r} is not a numpy scalar"
    kind = {"i": "int", "u": "uint", "f": "float"}[arg.dtype.kind]
    return kind, arg.dtype.itemsize


class _FakeFunction:
    def __init__(self, module: str, name: str, params: list[str]) -> None:
        self.module, self.name, self.params = module, name, params
        self.max_dynamic_shared_size_bytes = 0
        self.shared_size_bytes = 128  # static shared memory, as a block reduction's scratch


@pytest.mark.parametrize(
    ("dynamic", "opted_in"), [(16 * 1024, 0), (48 * 1024 - 128, 0), (48 * 1024, 48 * 1024), (96 * 1024, 96 * 1024)]
)
def test_dynamic_shared_memory_is_opted_into_with_the_static_part(dynamic: int, opted_in: int) -> None:
    # 48 KiB dynamic beside 128 B static exceeds the default: without the opt-in the launch is refused
    # (CUDA_ERROR_INVALID_VALUE; klein 9B's fp8 glu_quant row of 12,288 floats)
    launch = Launch(_FakeFunction("quant", "glu_quant", []), "glu_quant", (1,), (1024,), [], dynamic)
    launch.resolve(0)
    assert launch.fn.max_dynamic_shared_size_bytes == opted_in


class _FakeKernels:
    def __init__(self, sigs: dict[str, dict[str, list[str]]]) -> None:
        self.sigs = sigs

    def function(self, module: str, name: str) -> _FakeFunction:
        assert name in self.sigs[module], f"kernel {name} is not in module {module}"
        return _FakeFunction(module, name, self.sigs[module][name])


class _FakeBackend:
    def __init__(self, sigs: dict[str, dict[str, list[str]]]) -> None:
        self.kernels = _FakeKernels(sigs)
        self.props = {"sm_count": 132, "major": 9, "minor": 0, "smem_optin": 232448}
        self.options = {"gemm": "nvrtc", "sdpa": "flash", "graph": True, "tune": "off"}
        self._lt_error = self._cudnn_error = "not on this machine"

    def lt(self) -> None:
        return None

    def cudnn(self) -> None:
        return None


@pytest.fixture(scope="module")
def sigs() -> dict[str, dict[str, list[str]]]:
    return _signatures()


def _check_args(step: Launch, label: str = "") -> None:
    """The launch passes exactly the arguments, of exactly the widths, that the kernel's signature declares."""
    params = step.fn.params
    assert len(params) == len(step.args), f"{label}{step.name} takes {params}, got {step.args}"
    for p, a in zip(params, step.args, strict=True):
        assert _width(p) == _arg_width(a), f"{label}{step.name} param '{p}' given {a!r}"


def _tensors(program: Any) -> dict[str, DevTensor]:
    base = 1 << 32
    out = {}
    for name, t in program.types.items():
        out[name] = DevTensor(base, t.shape, t.dtype)
        base += (t.nbytes + 255) // 256 * 256 + 256
    return out


def _fake_scratch(key: Any, nbytes: int) -> Any:
    """`LowerCtx.shared_scratch` without a device: an address the launches record, never dereferenced here."""
    from types import SimpleNamespace

    return SimpleNamespace(ptr=1 << 40, size=nbytes)


LIBRARY_ONLY_OPS = {"sdpa_backward", "sdpa_stats"}
"""Ops whose only lowering is a library's (cuDNN's flash-attention backward): the fake backend has none;
`test_conformance_cuda.py` runs them on the GPU."""


def test_every_conformance_case_lowers_to_matching_kernels(sigs: dict[str, dict[str, list[str]]]) -> None:
    backend = _FakeBackend(sigs)
    lowered_ops: set[str] = set()
    for case in conformance_cases(OPS):
        if case.op in LIBRARY_ONLY_OPS:
            continue
        program = case_program(case)
        ctx = LowerCtx(backend, OPS)
        ctx.shared_scratch = _fake_scratch  # type: ignore[method-assign]
        tensors = _tensors(program)
        for node in program.nodes:
            steps = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
            assert steps, f"{case.id}: no steps"
            for step in steps:
                assert isinstance(step, Launch | Copy)
                if isinstance(step, Launch):
                    _check_args(step, f"{case.id}: ")
                    assert all(g >= 1 for g in step.grid) and step.block[0] % 32 == 0
        lowered_ops.add(case.op)
    assert lowered_ops == {op.name for op in OPS if op.cases is not None} - LIBRARY_ONLY_OPS


def test_unsupported_dtype_names_op_and_backend(sigs: dict[str, dict[str, list[str]]]) -> None:
    from dif.ir.builder import ProgramBuilder

    b = ProgramBuilder("int-div")
    x = b.input("x", (4,), "i32")
    b.output(b.emit("div", x, x))
    program = b.build()
    ctx = LowerCtx(_FakeBackend(sigs), OPS)
    t = _tensors(program)
    node = program.nodes[0]
    with pytest.raises(NotImplementedOnBackend, match="'div' on backend 'cuda'"):
        lower_node(ctx, node, [t[o] for o in node.operands], [t[r.name] for r in node.results])


def test_broadcast_strides_and_collapse() -> None:
    assert broadcast_strides((4,), (2, 3, 4)) == [0, 0, 1]
    assert broadcast_strides((3, 1), (2, 3, 4)) == [0, 1, 0]
    shape, (a, b) = collapse([2, 3, 4], [[12, 4, 1], [0, 0, 1]])
    assert shape == [6, 4] and a == [4, 1] and b == [0, 1]
    shape, (a,) = collapse([1, 5, 1], [[5, 1, 1]])
    assert shape == [5] and a == [1]
    assert strided_meta([2, 3], [[3, 1], [3, 1]]) == [1, 6, 1, 1]


def test_widen_moves_aligned_contiguous_runs_as_wider_words() -> None:
    from dif_backend_cuda.lower.layout import widen

    assert widen([4, 8], [8, 1], [8, 1], 16, 0, 256) == ([4], [1], [1], 128)  # 32 bf16 = 4 x 16 bytes
    assert widen([3, 6], [6, 1], [12, 1], 16, 0, 0) == ([3, 3], [3, 1], [6, 1], 32)  # concat half of a row
    assert widen([4, 8], [8, 1], [8, 1], 16, 0, 2)[3] == 16  # destination only 2-byte aligned
    assert widen([4, 8], [1, 4], [8, 1], 16, 0, 0)[3] == 16  # transposed source: not contiguous


def test_planned_views_lower_to_matching_kernels_without_copies(sigs: dict[str, dict[str, list[str]]]) -> None:
    """A single-stream block planned for this backend's capabilities: q/k/v/mlp are pitched rows of the
    projection and attention/GLU write pitched rows of the concat, so split and concat lower to nothing,
    and every kernel still gets the arguments its signature declares."""
    from dif.passes import optimize
    from dif.plan.planner import plan_program
    from dif.plan.views import CONCAT_CAPABILITY, SPLIT_CAPABILITY, view_capability
    from dif.target import RuntimeBudget, TargetProfile
    from dif_backend_cuda.lower import LOWERINGS, PITCHED_ROWS, arena_tensor

    from .programs import single_block

    caps = ("alias:reshape", SPLIT_CAPABILITY, CONCAT_CAPABILITY, *LOWERINGS.op_capabilities())
    caps += tuple(view_capability(op, axes) for op, axes in PITCHED_ROWS.items())
    target = TargetProfile(backend="cuda", device="fake", memory_bytes=1 << 34, capabilities=caps)
    program, _ = optimize(single_block("bf16"), target=target)
    plan = plan_program(program, target, RuntimeBudget(free_memory_bytes=1 << 34))
    assert sum(1 for buf in plan.buffers if buf.pitch_bytes) >= 6
    base = 1 << 32
    tensors = {v.name: DevTensor(base + (i << 24), v.type.shape, v.type.dtype) for i, v in enumerate(
        (*program.inputs, *program.params))}  # fmt: skip
    tensors.update(
        (r.name, arena_tensor(base << 4, plan.buffer_by_name[r.name], r.type)) for n in program for r in n.results
    )
    ctx = LowerCtx(_FakeBackend(sigs), OPS)
    kernels = []
    for node in program.nodes:
        steps = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
        if node.op in ("split", "concat", "reshape"):
            assert steps == [], f"{node.op} node {node.id} should be in place"
        for step in steps:
            assert isinstance(step, Launch)
            _check_args(step)
            kernels.append(step.name)
    assert "rms_norm_rope_vec4_bf16_bf16_f32" in kernels and "glu_vec_silu_bf16" in kernels


def test_a_fused_projection_feeds_concat_glu_quant_through_pitched_views(sigs: dict[str, dict[str, list[str]]]) -> None:
    """A parallel block's fp8 output projection input, concat(attention part, glu(MLP part)) of one fused
    projection: the split's parts stay pitched views of the projection (no copy: klein 9B's split took 3.8 ms of
    its fp8 forward, 159 us a block, copying the MLP part out) and `concat_glu_quant` gets their row pitches."""
    from dif.passes import DEFAULT_PASSES, optimize
    from dif.plan.planner import plan_program
    from dif.plan.views import CONCAT_CAPABILITY, SPLIT_CAPABILITY, view_capability
    from dif.target import RuntimeBudget, TargetProfile
    from dif_backend_cuda.lower import LOWERINGS, PITCHED_ROWS, arena_tensor

    from .programs import PARALLEL, parallel_projection_input

    caps = ("alias:reshape", SPLIT_CAPABILITY, CONCAT_CAPABILITY, "format:fp8-e4m3", *LOWERINGS.op_capabilities())
    caps += tuple(view_capability(op, axes) for op, axes in PITCHED_ROWS.items())
    target = TargetProfile(backend="cuda", device="fake", memory_bytes=1 << 34, capabilities=caps,
                           dtypes=("f32", "bf16", "f16", "f8e4m3", "i8", "u8"))  # fmt: skip
    program, _ = optimize(parallel_projection_input(), target=target, passes=(*DEFAULT_PASSES, "quantize_fp8"))
    assert program.op_histogram()["concat_glu_quant"] == 1
    plan = plan_program(program, target, RuntimeBudget(free_memory_bytes=1 << 34))
    base = 1 << 32
    tensors = {v.name: DevTensor(base + (i << 24), v.type.shape, v.type.dtype) for i, v in enumerate(
        (*program.inputs, *program.params))}  # fmt: skip
    tensors.update(
        (r.name, arena_tensor(base << 4, plan.buffer_by_name[r.name], r.type)) for n in program for r in n.results
    )
    backend = _FakeBackend(sigs)
    backend.options["rows"] = "registers"  # DIF_CUDA_ROWS' default
    ctx = LowerCtx(backend, OPS)
    for node in program.nodes:
        steps = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
        if node.op in ("split", "reshape"):
            assert steps == [], f"{node.op} node {node.id} should be in place"
        if node.op == "concat_glu_quant":
            (step,) = steps
            _check_args(step)
            assert step.name == "glu_quant_vec_silu_bf16_f8e4m3"
            row = PARALLEL["a"] + 2 * PARALLEL["f"]  # both parts are rows of the projection
            assert [int(v) for v in step.args[-2:]] == [row, row]


def _lower_one(sigs: dict[str, dict[str, list[str]]], op: str, shapes: list[tuple[int, ...]], dtype: str,
               **attrs: Any) -> Launch:  # fmt: skip
    """The single launch one `op` node over inputs of `shapes` lowers to (argument widths checked)."""
    from dif.ir.builder import ProgramBuilder

    b = ProgramBuilder(op)
    ins = [b.input(f"in{i}", shape, dtype) for i, shape in enumerate(shapes)]
    b.output(b.emit(op, *ins, **attrs))
    program = b.build()
    tensors = _tensors(program)
    node = program.nodes[0]
    (step,) = lower_node(LowerCtx(_FakeBackend(sigs), OPS), node, [tensors[o] for o in node.operands],
                         [tensors[r.name] for r in node.results])  # fmt: skip
    _check_args(step)
    return step


@pytest.mark.parametrize(
    ("dtype", "length", "kernel"),
    [
        ("bf16", 4096, "norm_modulate_warp16_bf16"),
        ("f16", 6144, "norm_modulate_warp24_f16"),
        ("f32", 512, "norm_modulate_warp4_f32"),
        ("bf16", 4352, "norm_modulate_vec16_bf16"),  # 17 chunks of 16 bytes per lane: no warp kernel
        ("bf16", 1000, "norm_modulate_vec_bf16"),
    ],
)
def test_norm_modulate_picks_the_warp_kernel_by_row_length(
    sigs: dict[str, dict[str, list[str]]], dtype: str, length: int, kernel: str
) -> None:
    shapes = [(2, 40, length), (2, 1, length), (2, 1, length)]
    step = _lower_one(sigs, "norm_modulate", shapes, dtype, kind="layer", eps=1e-6)
    assert step.name == kernel
    if "warp" in kernel:  # one warp per row: 8 rows per 256-thread block
        assert step.grid == (-(-80 // 8),) and step.block == (256,)


@pytest.mark.parametrize(
    ("op", "shapes", "dtype", "attrs", "kernel"),
    [
        ("silu", [(2, 40, 1536)], "bf16", {}, "unary_vec_silu_bf16"),
        ("silu", [(3, 5)], "bf16", {}, "unary_silu_bf16"),  # 15 values: not whole 16-byte chunks
        ("mul", [(2, 40, 1536), (2, 40, 1536)], "bf16", {}, "binary_vec_mul_bf16"),
        ("mul", [(2, 40, 1536), (1, 1, 1536)], "bf16", {}, "binary_bvec_mul_bf16"),  # broadcast rows: chunks
        ("mul", [(2, 40, 1536), (2, 40, 1)], "bf16", {}, "binary_bvec_mul_bf16"),  # a scalar per row, splat
        ("mul", [(2, 40, 100), (1, 1, 100)], "bf16", {}, "binary_mul_bf16"),  # rows of part chunks: scalar walk
        ("add", [(4, 64), (4, 64)], "f32", {}, "binary_vec_add_f32"),
        ("modulate", [(2, 40, 6144), (2, 1, 6144), (2, 1, 6144)], "bf16", {}, "modulate_rows_bf16"),
        ("modulate", [(2, 40, 6144), (6144,), (6144,)], "bf16", {}, "modulate_rows_bf16"),
        ("modulate", [(2, 40, 6144), (2, 40, 1), (2, 40, 1)], "bf16", {}, "modulate_bf16"),
    ],
)
def test_elementwise_fast_paths_are_chosen_by_shape(
    sigs: dict[str, dict[str, list[str]]], op: str, shapes: list[tuple[int, ...]], dtype: str, attrs: dict[str, Any],
    kernel: str,
) -> None:  # fmt: skip
    assert _lower_one(sigs, op, shapes, dtype, **attrs).name == kernel


def test_one_kernel_mode_makes_every_kernel_a_template(sigs: dict[str, dict[str, list[str]]]) -> None:
    """Under ONE_KERNEL_MODE (how kernels/__init__.py compiles), no kernel is an entry point of its own:
    each is a template NVRTC instantiates only when named, so a compile generates code for one kernel."""
    cpp = shutil.which("cpp")
    assert cpp is not None  # `sigs` skipped otherwise
    for mod in MODULES:
        text = subprocess.run(
            [cpp, "-P", "-x", "c++", "-DONE_KERNEL_MODE"], input=module_source(mod), capture_output=True, text=True,
            check=True,
        ).stdout  # fmt: skip
        assert 'extern "C"' not in text, mod
        templated = re.findall(
            r"template\s*<\s*int\s*>\s*__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)", text
        )
        assert sorted(templated) == sorted(sigs[mod]), mod


def test_a_weight_gradient_convolution_splits_its_reduction_with_matching_kernels(
    sigs: dict[str, dict[str, list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weight-gradient shape (3x3 outputs of a 16 x 128 x 128 reduction, 8 images as channels) lowers to
    the split-K pair with the arguments their signatures declare; a convolution with many output tiles does
    not split."""
    from types import SimpleNamespace

    from dif.ir.builder import ProgramBuilder
    from dif_backend_cuda.lower.conv import split_k

    def conv(x: tuple[int, ...], w: tuple[int, ...], padding: tuple[int, ...]) -> Any:
        b = ProgramBuilder("conv")
        out = b.emit("conv2d", b.input("x", x, "f32"), b.input("w", w, "f32"), b.input("b", (w[0],), "f32"),
                     padding=padding, stride=(1, 1), dilation=(1, 1), groups=1)  # fmt: skip
        b.output(out)
        return b.build()

    asked: list[int] = []

    def scratch(key: Any, nbytes: int) -> Any:
        asked.append(nbytes)
        return SimpleNamespace(ptr=1 << 40)

    for program, kernels in [
        (conv((8, 16, 130, 130), (8, 16, 128, 128), (0, 0, 0, 0)), ["conv2d_split_f32", "conv2d_finish_f32"]),
        (conv((2, 8, 128, 128), (8, 8, 3, 3), (1, 1, 1, 1)), ["conv2d_f32"]),
    ]:
        ctx = LowerCtx(_FakeBackend(sigs), OPS)
        monkeypatch.setattr(ctx, "shared_scratch", scratch)
        t = _tensors(program)
        node = program.nodes[0]
        steps = lower_node(ctx, node, [t[o] for o in node.operands], [t[r.name] for r in node.results])
        assert [s.name for s in steps] == kernels
        for step in steps:
            _check_args(step)
            assert all(1 <= g <= 65535 for g in step.grid[1:])
    splits, chunk = split_k(2, 16 * 128 * 128, 8 * 8 * 9, 1, 132)
    assert (splits, chunk) == (132, 1986 // 16 * 16 + 16) and splits * chunk >= 16 * 128 * 128
    assert asked == [4 * splits * 8 * 8 * 9]  # fp32 partials [split, O, N * Ho * Wo]
    assert split_k(200, 1 << 20, 1, 1, 132) == (1, 1 << 20) and split_k(2, 3000, 1, 1, 132) == (1, 3000)


def _chunked(cb: Any, ctx: LowerCtx, operands: list[np.ndarray], out_shape: tuple[int, ...], fn: Any) -> np.ndarray:
    """What the chunked-broadcast kernels compute (kernels/common.cuh `BIdx` offsets, `load_chunk`), in
    numpy: for every output chunk, each operand's chunk (or scalar, splatted) at the offset the metadata
    gives, combined by `fn`."""
    meta = np.concatenate(ctx.meta_chunks)[cb.meta.offset :]
    rank = int(meta[0])
    shape = meta[1 : 1 + rank]
    strides = [meta[1 + rank * (1 + k) : 1 + rank * (2 + k)] for k in range(len(operands))]
    flat = [a.reshape(-1) for a in operands]
    out = np.empty((cb.chunks, cb.per), np.float64)
    for c in range(cb.chunks):
        digits = np.unravel_index(c, tuple(shape))
        parts = []
        for k, a in enumerate(flat):
            off = int(sum(int(d) * int(s) for d, s in zip(digits, strides[k], strict=True)))
            parts.append(np.full(cb.per, a[off]) if cb.scalars >> k & 1 else a[off * cb.per : (off + 1) * cb.per])
        out[c] = fn(*parts)
    return out.reshape(out_shape)


@pytest.mark.parametrize("shapes", [
    [(1, 8, 4, 32), (8, 1, 32)],  # a rotary table against heads
    [(1, 8, 4, 32), (1, 8, 4, 1)],  # a statistic per row
    [(2, 1, 1), (2, 5, 16)],  # a scalar per batch, first
    [(3, 5, 16), (16,), (3, 5, 1)],  # three operands (gated_residual's)
])  # fmt: skip
def test_chunked_broadcast_metadata_addresses_numpy_broadcasting(sigs: Any, shapes: list[tuple[int, ...]]) -> None:
    from dif_backend_cuda.lower.base import chunk_broadcast

    rng = np.random.default_rng(0)
    out_shape = np.broadcast_shapes(*shapes)
    arrays = [rng.standard_normal(s) for s in shapes]
    base = 1 << 32
    tensors = []
    for s in (*shapes, out_shape):
        tensors.append(DevTensor(base, tuple(s), DType.BF16))
        base += 1 << 20
    ctx = LowerCtx(_FakeBackend(sigs), OPS)
    cb = chunk_broadcast(ctx, tensors[:-1], tensors[-1])
    assert cb is not None and cb.per == 8
    fn = (lambda a, b: a * b) if len(shapes) == 2 else (lambda x, g, u: x + g * u)
    want = fn(*np.broadcast_arrays(*arrays))
    np.testing.assert_array_equal(_chunked(cb, ctx, arrays, out_shape, fn), want)


def test_chunked_broadcast_refuses_what_it_cannot_address(sigs: Any) -> None:
    from dif_backend_cuda.lower.base import chunk_broadcast

    ctx = LowerCtx(_FakeBackend(sigs), OPS)
    y = DevTensor(1 << 32, (4, 24), DType.BF16)
    odd = DevTensor(1 << 34, (4, 3), DType.BF16)  # an innermost axis neither spanning the output's nor of size 1
    assert chunk_broadcast(ctx, [DevTensor(1 << 33, (4, 24), DType.BF16), odd], y) is None
    assert chunk_broadcast(ctx, [DevTensor((1 << 33) + 2, (4, 24), DType.BF16)], y) is None  # off a 16-byte boundary
    assert (
        chunk_broadcast(ctx, [DevTensor(1 << 33, (4, 20), DType.BF16)], DevTensor(1 << 32, (4, 20), DType.BF16)) is None
    )


@pytest.mark.parametrize(
    ("dtype", "group", "option", "major", "kernel", "reason"),
    [
        ("bf16", 128, "mma", 9, "int4_mma_bf16", None),
        ("f16", 32, "mma", 8, "int4_mma_f16", None),
        ("bf16", 128, "tile", 9, "int4_gemm_bf16", "DIF_CUDA_INT4=tile"),
        ("f32", 128, "mma", 9, "int4_gemm_f32", "takes bf16 / f16 activations, not f32"),
        ("bf16", 128, "mma", 7, "int4_gemm_bf16", "needs sm_80, this GPU is sm_70"),
    ],
)
def test_int4_linear_takes_the_tensor_core_kernel_or_says_why_not(
    sigs: dict[str, dict[str, list[str]]], dtype: str, group: int, option: str, major: int, kernel: str,
    reason: str | None,
) -> None:  # fmt: skip
    from dif.ir.builder import ProgramBuilder
    from dif_backend_cuda.lower.quant import MMA_TILE

    rows, k, out = 300, 256, 808
    b = ProgramBuilder("int4")
    x = b.input("x", (rows, k), dtype)
    wq = b.input("wq", (out, k // 2), "u8")
    ws = b.input("ws", (out, k // group), "f16")
    b.output(b.emit("int4_linear", x, wq, ws, group_size=group))
    program = b.build()
    backend = _FakeBackend(sigs)
    backend.options["int4"] = option
    backend.props["major"] = major
    ctx = LowerCtx(backend, OPS)
    tensors = _tensors(program)
    node = program.nodes[0]
    (step,) = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
    _check_args(step)
    assert step.name == kernel
    choice = ctx.choices[node.id]
    if reason is None:
        assert "tensor-core" in choice and step.grid == (-(-out // MMA_TILE), -(-rows // MMA_TILE))
    else:
        assert "tile GEMM" in choice and reason in choice, choice


def test_a_misaligned_int4_operand_keeps_the_tile_gemm(sigs: dict[str, dict[str, list[str]]]) -> None:
    from dif.ir.builder import ProgramBuilder

    b = ProgramBuilder("int4")
    x = b.input("x", (64, 256), "bf16")
    wq = b.input("wq", (128, 128), "u8")
    ws = b.input("ws", (128, 2), "f16")
    b.output(b.emit("int4_linear", x, wq, ws, group_size=128))
    program = b.build()
    backend = _FakeBackend(sigs)
    backend.options["int4"] = "mma"
    ctx = LowerCtx(backend, OPS)
    tensors = _tensors(program)
    tensors["x"] = DevTensor(tensors["x"].ptr + 8, tensors["x"].shape, tensors["x"].dtype)  # 8-byte aligned only
    node = program.nodes[0]
    (step,) = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
    assert step.name == "int4_gemm_bf16" and "misaligned" in ctx.choices[node.id]


class FakeFp8Graph:
    """sdpa.py `CudnnSdpaFp8` without cuDNN: the graph's arguments, as the lowering built them."""

    def __init__(self, *args: Any, seq_lens: int = 0) -> None:
        self.args, self.seq_lens, self.choice = args, seq_lens, "heuristic's first plan"


@pytest.fixture
def fake_fp8_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN's fp8 attention faked, and cupy's allocator and copy for the key lengths' buffer."""
    import sys
    from types import SimpleNamespace

    from dif_backend_cuda import sdpa

    monkeypatch.setattr(sdpa, "CudnnSdpaFp8", FakeFp8Graph)
    memory = SimpleNamespace(Memory=lambda n: SimpleNamespace(ptr=1 << 41, size=n),
                             runtime=SimpleNamespace(memcpy=lambda *args: None))  # fmt: skip
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=memory))


@pytest.mark.parametrize(("mask", "d", "major", "reason"), [
    (False, 128, 9, None),
    (True, 128, 9, None),
    (False, 72, 9, "head dims q/k 72"),
    (False, 128, 8, "no fp8 matrix units"),
])  # fmt: skip
@pytest.mark.usefixtures("fake_fp8_graph")
def test_sdpa_fp8_quantizes_around_cudnn_or_runs_in_the_run_dtype_saying_why(
    sigs: dict[str, dict[str, list[str]]], mask: bool, d: int, major: int, reason: str | None
) -> None:
    """q/k/v are views with rows wider than their heads (pitched, as a fused projection's output): the
    quantization kernels get the views' strides and exactly the arguments their signatures declare; a key mask
    adds the key order, the gather of the e4m3 keys and values, and the zeroing of fully masked rows."""
    from dif.ir.builder import ProgramBuilder

    b = ProgramBuilder("fp8-attention")
    q, k, v = (b.input(n, (1, 80, 4, d), "bf16") for n in "qkv")
    key_mask = b.input("mask", (1, 80), "bool") if mask else None
    b.output(b.emit("sdpa_fp8", q, k, v, key_mask, scale=0.0, causal=False))
    program = b.build()
    backend = _FakeBackend(sigs)
    backend.props["major"] = major
    backend.cudnn = lambda: object()  # type: ignore[method-assign]
    ctx = LowerCtx(backend, OPS)
    ctx.shared_scratch = _fake_scratch  # type: ignore[method-assign]
    tensors = _tensors(program)
    for n in "qkv":  # rows of 3 heads' width: every fourth head of a fused projection
        t = tensors[n]
        tensors[n] = DevTensor(t.ptr, t.shape, t.dtype, row=4 * d, pitch=3 * 4 * d)
    node = program.nodes[0]
    steps = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
    choice = ctx.choices[node.id]
    if reason is not None:
        assert reason in choice and "not fp8" in choice, choice
        return
    if mask:
        order, amax, quantize, gather, graph, dequantize, zero_rows = steps
        launches = [order, amax, quantize, gather, dequantize, zero_rows]
        assert gather.name == "sdpa_gather_keys_16b" and "attended keys gathered first" in choice
    else:
        amax, quantize, graph, dequantize = steps
        launches = [amax, quantize, dequantize]
    assert isinstance(graph, FakeFp8Graph) and "fp8-e4m3" in choice and bool(graph.seq_lens) == mask
    for step in launches:
        _check_args(step)
    assert [a for a in amax.args[3:12]] == [80] * 3 + [4 * d] * 3 + [3 * 4 * d] * 3  # rows, widths, strides
    assert amax.grid == quantize.grid == (132 * 2, 3)


@pytest.mark.parametrize(("length", "weight_offset", "kernel"), [
    (6144, 0, "rms_norm_modulate_warp24_bf16_f32"),  # Krea 2's rows, a warp each
    (6144, 16, "rms_norm_modulate_vec16_bf16_f32"),  # the weight 16- but not 32-byte aligned: a block per row
    (100, 0, "rms_norm_modulate_bf16_f32"),  # not a multiple of 8
])  # fmt: skip
def test_rms_norm_modulate_runs_norm_modulates_kernels_with_the_weight(
    sigs: dict[str, dict[str, list[str]]], length: int, weight_offset: int, kernel: str
) -> None:
    """Krea 2's adaptive norm with its f32 weight: norm_modulate's kernel for the shape, weighted, the weight and
    its offset last; the register and warp kernels load the weight in vectors, so its alignment picks one."""
    from dif.ir.builder import ProgramBuilder

    b = ProgramBuilder("adaptive")
    x = b.input("x", (1, 64, length), "bf16")
    w = b.input("w", (length,), "f32")
    s, t = (b.input(n, (1, 1, length), "bf16") for n in "st")
    b.output(b.emit("rms_norm_modulate", x, w, s, t, eps=1e-5, offset=1.0))
    program = b.build()
    ctx = LowerCtx(_FakeBackend(sigs), OPS)
    tensors = _tensors(program)
    tensors["w"] = DevTensor(tensors["w"].ptr + weight_offset, (length,), tensors["w"].dtype)
    node = program.nodes[0]
    (step,) = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
    _check_args(step)
    assert step.name == kernel and step.args[-2] == tensors["w"].ptr and step.args[-1] == np.float32(1.0)


@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.usefixtures("fake_fp8_graph")
def test_sdpa_fp8_qk_quantizes_v_alone_and_copies_the_given_scales(
    sigs: dict[str, dict[str, list[str]]], mask: bool
) -> None:
    """q and k come quantized (`rms_norm_rope_quant`): cuDNN's graph reads them where they are, the passes run
    one row of blocks (t0 = 2: v) in the 16-byte form, and the quantizing pass gets q's and k's scale pointers."""
    from dif.ir.builder import ProgramBuilder

    b = ProgramBuilder("fp8-attention-qk")
    q8, k8 = (b.input(n, (1, 80, heads, 128), "f8e4m3") for n, heads in (("q8", 8), ("k8", 2)))
    qs, ks = (b.input(n, (1,), "f32") for n in ("qs", "ks"))
    v = b.input("v", (1, 80, 2, 128), "bf16")
    key_mask = b.input("mask", (1, 80), "bool") if mask else None
    b.output(b.emit("sdpa_fp8_qk", q8, qs, k8, ks, v, key_mask, scale=0.0, causal=False))
    program = b.build()
    backend = _FakeBackend(sigs)
    backend.cudnn = lambda: object()  # type: ignore[method-assign]
    ctx = LowerCtx(backend, OPS)
    ctx.shared_scratch = _fake_scratch  # type: ignore[method-assign]
    tensors = _tensors(program)
    node = program.nodes[0]
    steps = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
    choice = ctx.choices[node.id]
    assert "q and k quantized by their norms" in choice and "one element a thread" not in choice, choice
    if mask:
        order, amax, quantize, gather, graph, dequantize, zero_rows = steps
        launches = [order, amax, quantize, gather, dequantize, zero_rows]
        assert gather.args[0] == tensors["k8"].ptr  # the given keys, gathered with v's e4m3 copy
    else:
        amax, quantize, graph, dequantize = steps
        launches = [amax, quantize, dequantize]
    for step in launches:
        _check_args(step)
    assert amax.name == "fp8_amax3_vec_bf16" and dequantize.name == "fp8_dequantize_vec_bf16"
    assert amax.grid == quantize.grid == (132 * 2, 1) and amax.args[12] == 2  # t0: v alone
    assert graph.args[7] == tensors["q8"].ptr and (mask or graph.args[8] == tensors["k8"].ptr)
    assert list(quantize.args[-2:]) == [tensors["qs"].ptr, tensors["ks"].ptr]


def test_sdpa_fp8_qk_without_cudnn_dequantizes_q_and_k_saying_why(sigs: dict[str, dict[str, list[str]]]) -> None:
    from dif.ir.builder import ProgramBuilder

    b = ProgramBuilder("fp8-attention-qk")
    q8, k8 = (b.input(n, (1, 80, 2, 64), "f8e4m3") for n in ("q8", "k8"))
    qs, ks = (b.input(n, (1,), "f32") for n in ("qs", "ks"))
    b.output(b.emit("sdpa_fp8_qk", q8, qs, k8, ks, b.input("v", (1, 80, 2, 64), "bf16"), scale=0.0, causal=False))
    program = b.build()
    ctx = LowerCtx(_FakeBackend(sigs), OPS)
    ctx.shared_scratch = _fake_scratch  # type: ignore[method-assign]
    tensors = _tensors(program)
    node = program.nodes[0]
    steps = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
    back_q, back_k, *attention = steps
    assert back_q.name == back_k.name == "fp8_dequantize_vec_bf16" and attention
    assert [back_q.args[1], back_k.args[1]] == [tensors["qs"].ptr, tensors["ks"].ptr]
    assert "not fp8: cuDNN unavailable" in ctx.choices[node.id], ctx.choices[node.id]


@pytest.mark.parametrize(("heads", "dim", "kernel"), [
    (8, 128, "rms_norm_rope_q8_vec8_bf16_bf16_f32"),
    (12, 128, "rms_norm_rope_q8_vec4_bf16_bf16_f32"),
    (3, 64, "rms_norm_rope_q8_bf16_bf16_f32"),  # the warp-per-row kernel
])  # fmt: skip
def test_rms_norm_rope_quant_takes_the_bound_weights_and_the_scale(
    sigs: dict[str, dict[str, list[str]]], heads: int, dim: int, kernel: str
) -> None:
    from dif.ir.builder import ProgramBuilder

    b = ProgramBuilder("norm-rope-quant")
    x = b.input("x", (1, 16, heads, dim), "bf16")
    w, other = (b.input(n, (dim,), "bf16") for n in ("w", "other"))
    cos, sin = (b.input(n, (16, dim), "f32") for n in ("cos", "sin"))
    q, s = b.emit_multi("rms_norm_rope_quant", x, w, cos, sin, other, mode="pairs", dtype="f8e4m3")
    b.output(q, s)
    program = b.build()
    ctx = LowerCtx(_FakeBackend(sigs), OPS)
    tensors = _tensors(program)
    node = program.nodes[0]
    (step,) = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
    _check_args(step)
    assert step.name == kernel
    # the tail: the bound weights (null past the one given), then the scale
    assert list(step.args[-4:]) == [tensors["other"].ptr, 0, 0, tensors[s.name].ptr]


@pytest.mark.parametrize(("op", "dtype", "length", "kernel", "threads"), [
    ("norm_modulate_quant", "bf16", 4096, "norm_modulate_quant_warp16_bf16_f8e4m3", 128),  # 4 rows a block
    ("norm_modulate_quant", "bf16", 3072, "norm_modulate_quant_warp12_bf16_f8e4m3", 128),
    ("norm_modulate_quant", "bf16", 4104, "norm_modulate_quant_vec_bf16_f8e4m3", 288),  # not 256 * N: a block
    ("norm_modulate_quant", "bf16", 8192, "norm_modulate_quant_vec_bf16_f8e4m3", 512),  # too long for a warp
    ("norm_modulate_quant", "bf16", -4096, "norm_modulate_quant_bf16_f8e4m3", None),  # rows="staged"
    ("norm_modulate_quant", "bf16", 100, "norm_modulate_quant_bf16_f8e4m3", None),  # not a multiple of 8
    ("norm_modulate_quant", "f32", 4096, "norm_modulate_quant_f32_f8e4m3", None),
    ("quantize_rows", "bf16", 16384, "quantize_rows_vec_bf16_f8e4m3", 1024),
    ("quantize_rows", "bf16", 40960, "quantize_rows_bf16_f8e4m3", None),  # more chunks than 1024 threads hold
    ("rms_norm_modulate_quant", "bf16", 6144, "rms_norm_modulate_quant_vec_bf16_f32_f8e4m3", 384),
    ("rms_norm_modulate_quant", "bf16", 4096, "rms_norm_modulate_quant_vec_bf16_f32_f8e4m3", 256),  # no warp
    ("rms_norm_modulate_quant", "bf16", -6144, "rms_norm_modulate_quant_bf16_f32_f8e4m3", None),
    ("act_mul_quant", "bf16", 16384, "act_mul_quant_vec_silu_bf16_f8e4m3", 512),
    ("act_mul_quant", "bf16", 6144, "act_mul_quant_vec_silu_bf16_f8e4m3", 384),
    ("act_mul_quant", "bf16", -6144, "act_mul_quant_silu_bf16_f8e4m3", None),
    ("act_mul_quant", "f32", 6144, "act_mul_quant_silu_f32_f8e4m3", None),
])  # fmt: skip
def test_row_quantization_keeps_rows_in_registers_where_asked_and_it_can(
    sigs: dict[str, dict[str, list[str]]], op: str, dtype: str, length: int, kernel: str, threads: int | None
) -> None:  # fmt: skip
    from dif.ir.builder import ProgramBuilder

    backend = _FakeBackend(sigs)
    backend.options["rows"] = "registers" if length > 0 else "staged"  # DIF_CUDA_ROWS
    length = abs(length)
    b = ProgramBuilder("rows")
    x = b.input("x", (1, 600, length), dtype)
    if op == "norm_modulate_quant":
        sc, sh = b.input("sc", (1, 1, length), dtype), b.input("sh", (1, 1, length), dtype)
        outs = b.emit_multi(op, x, sc, sh, kind="layer", eps=1e-6, dtype="f8e4m3")
    elif op == "rms_norm_modulate_quant":
        sc, sh = b.input("sc", (1, 1, length), dtype), b.input("sh", (1, 1, length), dtype)
        w = b.input("w", (length,), "f32")
        outs = b.emit_multi(op, x, w, sc, sh, eps=1e-5, offset=1.0, dtype="f8e4m3")
    elif op == "act_mul_quant":
        outs = b.emit_multi(op, x, b.input("u", (1, 600, length), dtype), act="silu", dtype="f8e4m3")
    else:
        outs = b.emit_multi(op, x, dtype="f8e4m3")
    b.output(*outs)
    program = b.build()
    ctx = LowerCtx(backend, OPS)
    tensors = _tensors(program)
    node = program.nodes[0]
    (step,) = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
    _check_args(step)
    assert step.name == kernel and step.grid == ((150,) if "_warp" in kernel else (600,))
    if threads is not None:
        assert step.block == (threads,) and step.shared == 0


@pytest.mark.parametrize("padding", [True, False])
def test_masked_sdpa_on_cudnn_launches_matching_kernels(
    sigs: dict[str, dict[str, list[str]]], monkeypatch: pytest.MonkeyPatch, padding: bool
) -> None:
    """A key mask reaches cuDNN over the attended keys gathered first (its padding mask), or, where cuDNN
    refuses that, as a score bias; either way the fully masked rows are zeroed after, and every kernel gets the
    arguments its signature declares."""
    import sys
    from types import SimpleNamespace

    from dif.ir.builder import ProgramBuilder
    from dif_backend_cuda import sdpa

    class FakeSdpa:
        def __init__(self, *args: Any, seq_lens: int = 0, key_bias: int = 0, bias_rows: int = 0) -> None:
            if seq_lens and not padding:
                raise RuntimeError("no padding mask here")
            self.choice = "heuristic's first plan"

    monkeypatch.setattr(sdpa, "CudnnSdpa", FakeSdpa)
    memory = SimpleNamespace(Memory=lambda n: SimpleNamespace(ptr=1 << 41, size=n),
                             runtime=SimpleNamespace(memcpy=lambda *args: None))  # fmt: skip
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=memory))
    b = ProgramBuilder("masked")
    q, k, v = (b.input(n, (2, 80, 4, 64), "bf16") for n in "qkv")
    b.output(b.emit("sdpa", q, k, v, b.input("mask", (2, 80), "bool"), scale=0.0, causal=False))
    program = b.build()
    backend = _FakeBackend(sigs)
    backend.options["sdpa"] = "auto"
    backend.cudnn = lambda: object()  # type: ignore[method-assign]
    ctx = LowerCtx(backend, OPS)
    ctx.shared_scratch = _fake_scratch  # type: ignore[method-assign]
    tensors = _tensors(program)
    node = program.nodes[0]
    steps = lower_node(ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results])
    launches = [s for s in steps if isinstance(s, Launch)]
    for step in launches:
        _check_args(step)
    names = [s.name for s in launches]
    if padding:
        assert names == ["sdpa_key_order", "sdpa_gather_keys_16b", "sdpa_zero_masked_rows_bf16"]
        assert "attended keys gathered first" in ctx.choices[node.id]
    else:
        assert names == ["sdpa_mask_bias_bf16", "sdpa_zero_masked_rows_bf16"]
        assert "key mask as a bias" in ctx.choices[node.id]

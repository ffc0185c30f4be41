"""cuBLASLt W8A8 GEMMs of `scaled_linear` (dif.ops.quant) through nvmath-python's low-level bindings, planned
once per node at prepare time, capturable in a CUDA graph; the handle and workspace are the backend's
`gemm.LtContext`.

Row-major y[rows, out] = xq[rows, k] @ wq[out, k]^T is column-major D[out, rows] = op(A) @ B with A = wq
transposed ("TN", the layout Hopper's fp8 GEMMs require), as `gemm.linear_problem` lays out a bf16 linear.

- fp8-e4m3: A, B e4m3, D (and C) in the output dtype, fp32 compute; the per-output-channel weight scales and
  the per-row activation scales are cuBLASLt "outer vector" scales (A_SCALE_MODE / B_SCALE_MODE =
  OUTER_VEC_32F: D[i, j] = scale_A[i] * scale_B[j] * sum_k A[i, k] B[k, j], cuBLAS 12.9+), the bias in the
  epilogue: one call, bf16 out, nothing else touches the output. A gated residual x + gate * y
  (`scaled_linear_gated_residual`) is the same call with x as C (beta 1) and the gate in scale_A and the bias.
- int8: cuBLASLt has no scaled epilogue for int8 (D must be int32 with int32 scales), so each block of rows
  runs an int32 GEMM into a fixed scratch buffer and `kernels/quant.cu`'s `scaled_epilogue` turns it into the
  output (scales and bias applied there): a pass over the output, never over the inputs. An fp8 GEMM whose
  outer-vector scales this cuBLASLt refuses takes the same way with fp32 products.

A cuBLASLt that refuses a problem (no heuristic result, unknown attribute) raises; the lowering then takes the
next way (fp8: blocks, then the portable tile GEMM `scaled_gemm_*`) and records why.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dif.dtypes import DType
from dif.errors import BackendError
from dif_backend_cuda.gemm import CUDA_DTYPE, OP_N, OP_T, LtContext

CUDA_R_8I, CUDA_R_32I, CUDA_R_8F_E4M3 = 3, 10, 28  # cudaDataType_t
CUDA_R_32F = 0
COMPUTE_32F, COMPUTE_32I = 68, 72  # cublasComputeType_t
OUTER_VEC_32F = 3  # cublasLtMatmulMatrixScale_t CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
SCRATCH_BYTES = 64 << 20
"""4-byte raw products of one block of rows of a W8A8 GEMM without a scaled epilogue (the whole GEMM runs in as
many blocks as this needs)."""
CANDIDATES = 4
FP8_FAST_ACCUM = True
"""Hopper's fast fp8 accumulation (partial sums promoted to fp32 less often), as inference stacks run their
forward GEMMs; the format search's numerical gate judges what it costs in accuracy."""


def _alignment(addr: int) -> int:
    return min(256, addr & -addr) if addr else 256


class LtPlan:
    """One cuBLASLt matmul descriptor with its A / B / D layouts and the heuristic's first algorithm."""

    def __init__(self, ctx: LtContext, compute: int, scale: int, a_type: int, b_type: int, d_type: int,
                 m: int, n: int, k: int, addrs: tuple[int, int, int], c: int = 0) -> None:  # fmt: skip
        self.ctx, self.m, self.n, self.k = ctx, m, n, k
        lib = ctx.lib
        self._keep: list[np.ndarray] = []
        self.desc = lib.matmul_desc_create(compute, scale)
        attr = lib.MatmulDescAttribute
        self.set(attr.TRANSA, OP_T)
        self.set(attr.TRANSB, OP_N)
        self.adesc = lib.matrix_layout_create(a_type, k, m, k)  # wq [out, k] row-major = (k x out) col-major
        self.bdesc = lib.matrix_layout_create(b_type, k, n, k)  # xq [rows, k] = (k x rows)
        self.ddesc = lib.matrix_layout_create(d_type, m, n, m)  # y [rows, out] = (out x rows)
        self.addrs, self.c = addrs, c  # c: C's address where it is not D's (a residual read, D written)
        self.algo: np.ndarray | None = None

    def set(self, attr: Any, value: int) -> None:
        lib = self.ctx.lib
        buf = np.array(value, dtype=lib.get_matmul_desc_attribute_dtype(attr))
        self._keep.append(buf)
        lib.matmul_desc_set_attribute(self.desc, attr, buf.ctypes.data, buf.itemsize)

    def choose(self) -> None:
        """The heuristic's best algorithm for these layouts and alignments; BackendError when it has none."""
        ctx = self.ctx
        lib = ctx.lib
        pref = lib.matmul_preference_create()
        try:
            pattr = lib.MatmulPreferenceAttribute

            def pset(attr: Any, value: int) -> None:
                buf = np.array(value, dtype=lib.get_matmul_preference_attribute_dtype(attr))
                self._keep.append(buf)
                lib.matmul_preference_set_attribute(pref, attr, buf.ctypes.data, buf.itemsize)

            pset(pattr.MAX_WORKSPACE_BYTES, ctx.workspace_bytes)
            a, b, d = self.addrs
            for name, addr in (("A", a), ("B", b), ("C", self.c or d), ("D", d)):
                pset(getattr(pattr, f"MIN_ALIGNMENT_{name}_BYTES"), _alignment(addr))
            heuristic = np.zeros(CANDIDATES, dtype=lib.matmul_heuristic_result_dtype)
            count = np.zeros(1, dtype=np.int32)
            lib.matmul_algo_get_heuristic(ctx.handle, self.desc, self.adesc, self.bdesc, self.ddesc, self.ddesc,
                                          pref, CANDIDATES, heuristic.ctypes.data, count.ctypes.data)  # fmt: skip
        finally:
            lib.matmul_preference_destroy(pref)
        if count[0] < 1:
            raise BackendError(f"cuBLASLt found no algorithm for this W8A8 GEMM ({self.m}x{self.n}x{self.k})")
        self.algo = heuristic[:1]

    @property
    def algo_ptr(self) -> int:
        assert self.algo is not None
        fields: Any = self.algo.dtype.fields or {}
        return int(self.algo.ctypes.data + fields["algo"][1])

    def matmul(self, stream: Any, alpha: np.ndarray, beta: np.ndarray, a: int, b: int, d: int) -> None:
        ctx = self.ctx
        ctx.lib.matmul(ctx.handle, self.desc, alpha.ctypes.data, a, self.adesc, b, self.bdesc, beta.ctypes.data,
                       self.c or d, self.ddesc, d, self.ddesc, self.algo_ptr, ctx.workspace.ptr,
                       ctx.workspace_bytes, stream.ptr)  # fmt: skip

    def __del__(self) -> None:
        lib = getattr(getattr(self, "ctx", None), "lib", None)
        if lib is None:
            return
        for name in ("adesc", "bdesc", "ddesc"):
            if hasattr(self, name):
                lib.matrix_layout_destroy(getattr(self, name))
        if hasattr(self, "desc"):
            lib.matmul_desc_destroy(self.desc)


class Fp8ScaledMatmul:
    """y = (xq @ wq^T) * xs * ws (+ bias) (+ residual), fp8 e4m3 operands, scales and bias in cuBLASLt's epilogue;
    a `residual` (an address, y's shape and dtype) is C with beta 1."""

    kind = "cublaslt"

    def __init__(self, ctx: LtContext, out_dtype: DType, rows: int, k: int, out: int,
                 xq: int, xs: int, wq: int, ws: int, bias: int, y: int, residual: int = 0) -> None:  # fmt: skip
        d_type = CUDA_DTYPE.get(out_dtype)
        if d_type is None:
            raise BackendError(f"cuBLASLt fp8 path has no {out_dtype.value} output")
        lib = ctx.lib
        attr = lib.MatmulDescAttribute
        for name in ("A_SCALE_MODE", "B_SCALE_MODE", "A_SCALE_POINTER", "B_SCALE_POINTER"):
            if not hasattr(attr, name):
                raise BackendError(f"nvmath's cuBLASLt bindings lack MatmulDescAttribute.{name} (cuBLAS 12.9+)")
        self.plan = LtPlan(ctx, COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, d_type, out, rows, k,
                           (wq, xq, y), residual)  # fmt: skip
        self.plan.set(attr.A_SCALE_MODE, OUTER_VEC_32F)
        self.plan.set(attr.B_SCALE_MODE, OUTER_VEC_32F)
        self.plan.set(attr.A_SCALE_POINTER, ws)  # one scale per row of op(A): the output channels
        self.plan.set(attr.B_SCALE_POINTER, xs)  # one per column of B: the activation rows
        if FP8_FAST_ACCUM and hasattr(attr, "FAST_ACCUM"):
            self.plan.set(attr.FAST_ACCUM, 1)
        if bias:
            self.plan.set(attr.EPILOGUE, int(lib.Epilogue.BIAS))
            self.plan.set(attr.BIAS_POINTER, bias)
            self.plan.set(attr.BIAS_DATA_TYPE, d_type)
        self.plan.choose()
        self.xq, self.wq, self.y = xq, wq, y
        self.alpha = np.ones(1, dtype=np.float32)
        self.beta = np.full(1, 1.0 if residual else 0.0, dtype=np.float32)

    def __call__(self, stream: Any) -> None:
        self.plan.matmul(stream, self.alpha, self.beta, self.wq, self.xq, self.y)


class BlockMatmul:
    """One block of rows of a W8A8 GEMM without a scaled epilogue: raw products of rows [start, start + n) into
    the scratch buffer (int32 for int8, fp32 for fp8), which the `scaled_epilogue` launch that follows turns
    into the output."""

    kind = "cublaslt"

    def __init__(self, plan: LtPlan, wq: int, xq_block: int, scratch: int, integer: bool) -> None:
        self.plan, self.wq, self.xq, self.scratch = plan, wq, xq_block, scratch
        self.alpha = np.ones(1, dtype=np.int32 if integer else np.float32)
        self.beta = np.zeros(1, dtype=self.alpha.dtype)

    def __call__(self, stream: Any) -> None:
        self.plan.matmul(stream, self.alpha, self.beta, self.wq, self.xq, self.scratch)


def block_rows(rows: int, out: int) -> int:
    """Rows per block so that one block's 4-byte results fit `SCRATCH_BYTES` (a multiple of 16)."""
    fit = max(16, (SCRATCH_BYTES // (4 * out)) // 16 * 16)
    return min(rows, fit)


def block_plans(
    ctx: LtContext, qdtype: DType, rows: int, k: int, out: int, addrs: tuple[int, int, int]
) -> dict[int, LtPlan]:
    """By block height: the raw-product GEMM plans the blocks of a W8A8 GEMM of `rows` need (a full one and the
    last, shorter one): int8 -> int32 (int32 compute and scales), fp8 -> fp32."""
    block = block_rows(rows, out)
    heights = {block, rows - (rows // block) * block} - {0}
    if qdtype == DType.I8:
        types = (COMPUTE_32I, CUDA_R_32I, CUDA_R_8I, CUDA_R_8I, CUDA_R_32I)
    else:
        types = (COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F)
    plans = {}
    for n in sorted(heights):
        plan = LtPlan(ctx, *types, out, n, k, addrs)
        plan.choose()
        plans[n] = plan
    return plans

"""cuBLASLt GEMMs through nvmath-python's low-level bindings (raw device pointers, any float dtype incl.
bf16, bias epilogue, an addend C with beta 1 for `linear_add`'s residual), planned once per node at prepare
time and capturable in a CUDA graph.

cuBLASLt is column-major: a row-major product C[M,N] = A[M,K] @ B[K,N] is computed as
C^T[N,M] = B^T @ A^T, i.e. with the operands swapped and no data movement (see `linear_problem`
and `matmul_problem`). Only imported when a program has a matrix product and nvmath is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from attrs import frozen

from dif.dtypes import DType
from dif.errors import BackendError

if TYPE_CHECKING:
    from dif_backend_cuda.tuning import Choices

CUDA_DTYPE = {DType.F32: 0, DType.F16: 2, DType.BF16: 14}  # cudaDataType_t
CUDA_R_32F = 0
COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F: fp32 accumulation, no TF32
OP_N, OP_T = 0, 1


TUNE_CANDIDATES = 8  # heuristic results timed per distinct problem


def cublaslt_binding() -> Any:
    """nvmath's cuBLASLt binding (`nvmath.bindings.cublasLt`), without running nvmath's package __init__
    when nothing has imported nvmath yet: that __init__ imports its fft / linalg / sparse / tensor layers
    and dlopens cuBLAS, cuFFT, cuRAND, cuSOLVER, cuSPARSE and cuTENSOR up front, about a second of every
    fresh process on the H200, for a backend that calls one library. The package is registered with its
    __init__ skipped while the binding (which loads libcublasLt itself on first call) imports, then taken
    out of `sys.modules` again, so a later `import nvmath` elsewhere runs the real __init__ (which finds
    the already-imported `nvmath.bindings` submodules and reuses them)."""
    import importlib
    import importlib.util
    import sys

    if "nvmath" in sys.modules:
        from nvmath.bindings import cublasLt

        return cublasLt
    spec = importlib.util.find_spec("nvmath")
    if spec is None or spec.loader is None:
        raise ImportError("nvmath-python is not installed")
    sys.modules["nvmath"] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module("nvmath.bindings.cublasLt")
    finally:
        del sys.modules["nvmath"]


class LtContext:
    """One cuBLASLt handle and workspace shared by every GEMM of a backend (one stream), and the
    algorithm chosen for each distinct problem shape (`LtMatmul.tune`, through `tuning.Choices`)."""

    def __init__(self, workspace_bytes: int, choices: Callable[[str], Choices] | None = None) -> None:
        import cupy

        cublasLt = cublaslt_binding()
        self.lib = cublasLt
        self.handle = cublasLt.create()
        self.workspace = cupy.cuda.Memory(workspace_bytes)
        self.workspace_bytes = workspace_bytes
        self.version = int(cublasLt.get_version())
        # `choices(version)`: the backend's store of algorithm choices for this cuBLASLt version
        self.choices = choices(f"cublasLt {self.version}") if choices is not None else None
        # the heuristic's candidates per distinct problem (`problem_key`): asked once, not once per node
        self.heuristics: dict[tuple[Any, ...], np.ndarray] = {}


@frozen
class GemmProblem:
    """D[m, n] (column-major, ld ldd) = alpha * op(A) @ op(B) (+ beta * C[m, n]) (+ bias[m]), `batch` times with
    element strides. Without `c` (0) cuBLASLt is given C = D and beta 0 (C is not read); with it, C is a matrix
    of D's type and shape at its own address, rows `ldc` apart (0: ldd), batches `stride_d` apart (out of place:
    C must not overlap D)."""

    dtype: DType
    m: int
    n: int
    k: int
    a: int
    lda: int
    trans_a: int
    b: int
    ldb: int
    trans_b: int
    d: int
    ldd: int
    bias: int = 0
    batch: int = 1
    stride_a: int = 0
    stride_b: int = 0
    stride_d: int = 0
    alpha: float = 1.0
    c: int = 0
    ldc: int = 0
    beta: float = 0.0


def linear_problem(
    dtype: DType,
    x: int,
    w: int,
    y: int,
    bias: int,
    rows: int,
    k: int,
    out: int,
    lds: tuple[int, int, int] = (0, 0, 0),
    *,
    residual: int = 0,
    ldr: int = 0,
) -> GemmProblem:
    """y[rows, out] = x[rows, k] @ w[out, k]^T + bias[out] (+ residual[rows, out]) (all row-major). `lds`:
    element strides between rows of x, w and y when they are views inside wider buffers (0: contiguous); `ldr`
    the same for the residual, which cuBLASLt reads as C with beta 1 (`linear_add`)."""
    ldx, ldw, ldy = (ld or dim for ld, dim in zip(lds, (k, k, out), strict=True))
    c, ldc, beta = (residual, ldr or out, 1.0) if residual else (0, 0, 0.0)
    return GemmProblem(
        dtype, m=out, n=rows, k=k, a=w, lda=ldw, trans_a=OP_T, b=x, ldb=ldx, trans_b=OP_N, d=y, ldd=ldy, bias=bias,
        c=c, ldc=ldc, beta=beta,
    )  # fmt: skip


def matmul_problem(
    dtype: DType, a: int, b: int, c: int, m: int, k: int, n: int, batch: int, stride_a: int, stride_b: int
) -> GemmProblem:
    """c[z, m, n] = a[z, m, k] @ b[z, k, n] (row-major; batch strides in elements, 0 = broadcast)."""
    return GemmProblem(
        dtype,
        m=n,
        n=m,
        k=k,
        a=b,
        lda=n,
        trans_a=OP_N,
        b=a,
        ldb=k,
        trans_b=OP_N,
        d=c,
        ldd=n,
        batch=batch,
        stride_a=stride_b,
        stride_b=stride_a,
        stride_d=m * n,
    )


def _alignment(addr: int) -> int:
    return min(256, addr & -addr) if addr else 256


def problem_key(p: GemmProblem) -> tuple[Any, ...]:
    """What cuBLASLt's choice of algorithm depends on: everything but the addresses, of which only their
    alignment counts. A problem that reads C (beta != 0) adds beta, C's leading dimension and alignment, so it
    never shares a heuristic or a tuned choice with the same GEMM without it; one without C keeps the key it
    always had (stored choices stay valid)."""
    fields = (p.dtype, p.m, p.n, p.k, p.lda, p.ldb, p.ldd, p.trans_a, p.trans_b, p.alpha, p.batch, bool(p.bias))
    key = (*fields, p.stride_a, p.stride_b, p.stride_d, *(_alignment(a) for a in (p.a, p.b, p.d)))
    return (*key, "C", p.beta, p.ldc, _alignment(p.c)) if p.c else key


class LtMatmul:
    """A planned cuBLASLt matmul; `__call__(stream)` enqueues it (no allocation, graph-safe)."""

    kind = "cublaslt"

    def __init__(self, ctx: LtContext, p: GemmProblem) -> None:
        lib = ctx.lib
        self.ctx, self.p = ctx, p
        dt = CUDA_DTYPE.get(p.dtype)
        if dt is None:
            raise BackendError(f"cuBLASLt path has no {p.dtype.value} GEMM")
        self._keep: list[np.ndarray] = []
        self.desc = lib.matmul_desc_create(COMPUTE_32F, CUDA_R_32F)
        attr = lib.MatmulDescAttribute
        self._set_desc(attr.TRANSA, p.trans_a)
        self._set_desc(attr.TRANSB, p.trans_b)
        if p.bias:
            self._set_desc(attr.EPILOGUE, int(lib.Epilogue.BIAS))
            self._set_desc(attr.BIAS_POINTER, p.bias)
            self._set_desc(attr.BIAS_DATA_TYPE, dt)
        a_rows, a_cols = (p.m, p.k) if p.trans_a == OP_N else (p.k, p.m)
        b_rows, b_cols = (p.k, p.n) if p.trans_b == OP_N else (p.n, p.k)
        self.adesc = self._layout(dt, a_rows, a_cols, p.lda, p.stride_a)
        self.bdesc = self._layout(dt, b_rows, b_cols, p.ldb, p.stride_b)
        self.ddesc = self._layout(dt, p.m, p.n, p.ldd, p.stride_d)
        # C: D itself (beta 0, not read) or the addend, same type and shape as D (cuBLASLt's out-of-place rule)
        self.cdesc = self._layout(dt, p.m, p.n, p.ldc or p.ldd, p.stride_d) if p.c else self.ddesc
        self.key = problem_key(p)
        heuristic = ctx.heuristics.get(self.key)
        if heuristic is None:
            heuristic = ctx.heuristics[self.key] = self._stored_heuristic()
        self.heuristic = heuristic
        self.candidates = len(heuristic)
        self.choice = 0
        self.alpha = np.full(1, p.alpha, dtype=np.float32)
        self.beta = np.full(1, p.beta if p.c else 0.0, dtype=np.float32)

    def _stored_heuristic(self) -> np.ndarray:
        """The heuristic's candidates as the tuning store keeps them for this cuBLASLt version and device
        (a result is plain data, algorithms included, made to be reused), else asked now and stored: the first
        heuristic query of a process costs about 0.8 s (klein 9B's text encoder on the H200), which a warm
        cache no longer pays."""
        ctx = self.ctx
        if ctx.choices is None:
            return self._heuristic()
        key = ("heuristic", ctx.workspace_bytes, *self.key)
        dtype = np.dtype(ctx.lib.matmul_heuristic_result_dtype)
        stored = ctx.choices.read_artifact(key)
        if stored and len(stored) % dtype.itemsize == 0:
            return np.frombuffer(stored, dtype=dtype).copy()
        heuristic = self._heuristic()
        ctx.choices.write_artifact(key, heuristic.tobytes())
        return heuristic

    def _heuristic(self) -> np.ndarray:
        """The heuristic's candidates for this problem (at most `TUNE_CANDIDATES`, best first)."""
        ctx, p = self.ctx, self.p
        lib = ctx.lib
        pref = lib.matmul_preference_create()
        try:
            pattr = lib.MatmulPreferenceAttribute
            self._set(
                lib.matmul_preference_set_attribute,
                lib.get_matmul_preference_attribute_dtype,
                pref,
                pattr.MAX_WORKSPACE_BYTES,
                ctx.workspace_bytes,
            )
            for name, addr in (("A", p.a), ("B", p.b), ("C", p.c or p.d), ("D", p.d)):
                self._set(
                    lib.matmul_preference_set_attribute,
                    lib.get_matmul_preference_attribute_dtype,
                    pref,
                    getattr(pattr, f"MIN_ALIGNMENT_{name}_BYTES"),
                    _alignment(addr),
                )
            heuristic = np.zeros(TUNE_CANDIDATES, dtype=lib.matmul_heuristic_result_dtype)
            count = np.zeros(1, dtype=np.int32)
            lib.matmul_algo_get_heuristic(
                ctx.handle,
                self.desc,
                self.adesc,
                self.bdesc,
                self.cdesc,
                self.ddesc,
                pref,
                TUNE_CANDIDATES,
                heuristic.ctypes.data,
                count.ctypes.data,
            )
        finally:
            lib.matmul_preference_destroy(pref)
        if count[0] < 1:
            raise BackendError(f"cuBLASLt found no algorithm for {p}")
        return heuristic[: int(count[0])]

    @property
    def algo_ptr(self) -> int:
        names = self.heuristic.dtype.names or ()
        field = self.heuristic.dtype.fields["algo"][1] if "algo" in names else 0
        return int(self.heuristic.ctypes.data + self.choice * self.heuristic.dtype.itemsize + field)

    def tune(self, stream: Any) -> str:
        """Choose among the heuristic's candidates once per distinct shape/layout/alignment (`tuning.Choices`:
        a stored choice, else timed on this problem's own buffers when tuning is on, else the heuristic's
        first); returns a summary. Timing writes only the output buffer, which the forward overwrites anyway."""
        from dif_backend_cuda.tuning import fastest

        if self.ctx.choices is None:
            self.choice = 0
            return f"algorithm 1 of {self.candidates} (heuristic)"

        def measure() -> int:
            def run(choice: int) -> None:
                self.choice = choice
                self(stream)

            return fastest(run, self.candidates, stream)[0]

        self.choice, how = self.ctx.choices.choose(self.key, self.candidates, measure)
        return f"algorithm {self.choice + 1} of {self.candidates} ({how})"

    def _set(self, setter: Any, dtype_of: Any, obj: int, attr: Any, value: int) -> None:
        buf = np.array(value, dtype=dtype_of(attr))
        self._keep.append(buf)
        setter(obj, attr, buf.ctypes.data, buf.itemsize)

    def _set_desc(self, attr: Any, value: int) -> None:
        lib = self.ctx.lib
        self._set(lib.matmul_desc_set_attribute, lib.get_matmul_desc_attribute_dtype, self.desc, attr, value)

    def _layout(self, dt: int, rows: int, cols: int, ld: int, stride: int) -> int:
        lib = self.ctx.lib
        layout = lib.matrix_layout_create(dt, rows, cols, max(ld, 1))
        if self.p.batch > 1:
            lattr = lib.MatrixLayoutAttribute
            for attr, value in ((lattr.BATCH_COUNT, self.p.batch), (lattr.STRIDED_BATCH_OFFSET, stride)):
                self._set(lib.matrix_layout_set_attribute, lib.get_matrix_layout_attribute_dtype, layout, attr, value)
        return layout

    def __call__(self, stream: Any) -> None:
        p, ctx = self.p, self.ctx
        ctx.lib.matmul(
            ctx.handle,
            self.desc,
            self.alpha.ctypes.data,
            p.a,
            self.adesc,
            p.b,
            self.bdesc,
            self.beta.ctypes.data,
            p.c or p.d,
            self.cdesc,
            p.d,
            self.ddesc,
            self.algo_ptr,
            ctx.workspace.ptr,
            ctx.workspace_bytes,
            stream.ptr,
        )

    def __del__(self) -> None:
        lib = getattr(getattr(self, "ctx", None), "lib", None)
        if lib is None:
            return
        if hasattr(self, "cdesc") and self.cdesc != getattr(self, "ddesc", None):
            lib.matrix_layout_destroy(self.cdesc)
        for name in ("adesc", "bdesc", "ddesc"):
            if hasattr(self, name):
                lib.matrix_layout_destroy(getattr(self, name))
        if hasattr(self, "desc"):
            lib.matmul_desc_destroy(self.desc)

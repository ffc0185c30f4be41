"""CUDA C sources of the CUDA backend and their compilation: NVRTC -> cubin, ONE KERNEL per cubin, cached
on disk keyed by (source hash, kernel, arch, NVRTC version) under `dif.env.cache_dir()/cuda`, each sealed
with its checksum (a damaged one is recompiled), loaded as CuPy modules.

Each module is `common.cuh` + its preludes (`PRELUDES`) + one `.cu` file of this folder, named after the
`dif.ops` module whose lowerings (`lower/<name>.py`) launch most of its kernels; every kernel is declared
`KERNEL_ENTRY <op>_<dtype...>(...)` (see the instantiation macros at the bottom of each file).

Why one kernel at a time: a module instantiates hundreds of kernels (every op for every dtype) and a
program launches a few dozen; NVRTC's time goes into generating each kernel's code, so compiling whole
modules made a first run wait minutes. `KernelCache.function` starts the compile of the one kernel asked
for on a thread pool (NVRTC runs without the GIL) and returns at once; `PendingKernel.get` waits for it
when the step is resolved, after the whole program is lowered, so a program's kernels compile in parallel
with each other and with the rest of lowering. The cache key hashes the whole module source, so editing a
prelude recompiles every kernel that includes it. Nothing here imports cupy or NVRTC until a kernel is
first needed.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any

from dif.diskcache import read_entry, write_entry
from dif.errors import BackendError, DifWarning
from dif.serialize.container import write_atomic

MODULES = ("elementwise", "norm", "layout", "linalg", "conv", "attention", "fused", "quant")
PRELUDES: dict[str, tuple[str, ...]] = {
    "linalg": ("gemm_tile.cuh",),
    "conv": ("gemm_tile.cuh",),
    "quant": ("gemm_tile.cuh",),
}
"""Headers a module needs after `common.cuh` (the portable GEMM's tile loop serves linalg and conv)."""
OPTIONS = ("-std=c++17", "-default-device")
ONE_KERNEL = "-DONE_KERNEL_MODE"  # every kernel a template; only the named one is instantiated


@functools.cache
def module_source(name: str) -> str:
    """The full CUDA source of module `name` (common.cuh, its preludes, then `<name>.cu`)."""
    if name not in MODULES:
        raise BackendError(f"cuda backend: no kernel module '{name}' (known: {', '.join(MODULES)})")
    folder = resources.files(__name__)
    files = ("common.cuh", *PRELUDES.get(name, ()), f"{name}.cu")
    return "\n".join(folder.joinpath(f).read_text() for f in files)


def cache_key(source: str, arch: str, compiler: str, kernel: str = "") -> str:
    h = hashlib.sha256()
    for part in (source, kernel, arch, compiler, " ".join(OPTIONS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def name_expression(kernel: str) -> str:
    """What NVRTC is asked to instantiate for `kernel` under `ONE_KERNEL`."""
    return f"{kernel}<0>"


def nvrtc_version() -> str:
    """'nvrtc-13.0', or 'cupy-nvrtc' when only CuPy's own NVRTC wrapper is importable."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return "cupy-nvrtc"
    err, major, minor = nvrtc.nvrtcVersion()
    return f"nvrtc-{major}.{minor}"


def compile_cubin(source: str, arch: str, module: str, kernel: str) -> tuple[bytes, str]:
    """(cubin, lowered name) of the one kernel `kernel` of module `source`, compiled for `arch` ('sm_90') with
    NVRTC (cuda.bindings); BackendError with NVRTC's log when it does not compile."""
    from cuda.bindings import nvrtc

    def check(err: Any, what: str) -> None:
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise BackendError(f"cuda backend: NVRTC {what} failed for kernel '{kernel}' of module '{module}': {err}")

    expression = name_expression(kernel).encode()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{module}.cu".encode(), 0, [], [])
    check(err, "create")
    try:
        (err,) = nvrtc.nvrtcAddNameExpression(prog, expression)
        check(err, "name expression")
        opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in (*OPTIONS, ONE_KERNEL))]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise BackendError(
                f"cuda backend: NVRTC could not compile kernel '{kernel}' of module '{module}' for {arch}:\n"
                + log.decode(errors="replace")[-4000:]
            )
        err, lowered = nvrtc.nvrtcGetLoweredName(prog, expression)
        check(err, "lowered name")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        check(err, "cubin size")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        check(err, "cubin")
        return cubin, lowered.decode() if isinstance(lowered, bytes) else str(lowered)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The process's compile threads (one per CPU: NVRTC compiles are independent and release the GIL)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=os.cpu_count() or 4, thread_name_prefix="dif-nvrtc")
        return _POOL


class PendingKernel:
    """One kernel whose cubin is being found or compiled on the pool; `get()` waits for it and loads it
    (on the calling thread, whose CUDA context is the backend's)."""

    def __init__(self, cache: KernelCache, module: str, kernel: str, cubin: Future[tuple[Path, str]] | None) -> None:
        self.cache, self.module, self.kernel, self._cubin = cache, module, kernel, cubin

    def get(self) -> Any:
        return self.cache.load(self.module, self.kernel, self._cubin)


class KernelCache:
    """Compiled kernels for one device architecture, by (module, kernel name).

    `stats` says how each kernel ("module:kernel") was obtained: 'compiled', 'disk' (cubin cache hit) or
    'cupy' (CuPy compiled it itself because cuda.bindings' NVRTC is absent)."""

    def __init__(self, arch: str, cache_root: Path | None = None) -> None:
        from dif.env import cache_dir

        self.arch = arch
        self.root = (cache_root or cache_dir()) / "cuda"
        self.compiler = nvrtc_version()
        self._functions: dict[str, Any] = {}
        self._pending: dict[str, PendingKernel] = {}
        self._lock = threading.Lock()
        self.stats: dict[str, str] = {}

    def path_for(self, module: str, kernel: str) -> Path:
        key = cache_key(module_source(module), self.arch, self.compiler, kernel)
        return self.root / f"{module}-{kernel}-{self.arch}-{key}.cubin"

    def cubin(self, module: str, kernel: str) -> tuple[Path, str]:
        """(path, lowered name) of an intact cubin of `kernel` (compiled now when the cache has none). A cubin
        is trusted only when its seal (`dif.diskcache` entry beside it, for this source, kernel, arch and
        compiler) holds its SHA-256; a truncated or edited one is recompiled with a warning."""
        source = module_source(module)
        path = self.path_for(module, kernel)
        key = {"module": module, "kernel": kernel, "arch": self.arch, "compiler": self.compiler,
               "source": cache_key(source, "", "")}  # fmt: skip
        seal = path.with_name(path.name + ".seal")
        stored = read_entry(seal, key)
        name = f"{module}:{kernel}"
        if path.is_file():
            digest, _, lowered = (stored or b"").decode(errors="replace").partition(" ")
            if lowered and digest == hashlib.sha256(path.read_bytes()).hexdigest():
                self.stats[name] = "disk"
                return path, lowered
            warnings.warn(f"cached kernel {path} does not match its seal; recompiling it", DifWarning, stacklevel=2)
        cubin, lowered = compile_cubin(source, self.arch, module, kernel)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, cubin)
        write_entry(seal, f"{hashlib.sha256(cubin).hexdigest()} {lowered}".encode(), key)
        self.stats[name] = "compiled"
        return path, lowered

    def function(self, module: str, kernel: str) -> Any:
        """The loaded kernel when it is at hand, else a `PendingKernel` whose cubin is on its way."""
        name = f"{module}:{kernel}"
        with self._lock:
            fn = self._functions.get(name)
            if fn is not None:
                return fn
            pending = self._pending.get(name)
            if pending is None:
                module_source(module)  # an unknown module is refused here, not on a pool thread
                cubin = None if self.compiler == "cupy-nvrtc" else _pool().submit(self.cubin, module, kernel)
                pending = self._pending[name] = PendingKernel(self, module, kernel, cubin)
            return pending

    def load(self, module: str, kernel: str, cubin: Future[tuple[Path, str]] | None) -> Any:
        """The CuPy function of `kernel` once its cubin (`cubin`: the pool's result; None: CuPy compiles
        the kernel now) is there; loaded once."""
        import cupy as cp

        name = f"{module}:{kernel}"
        with self._lock:
            fn = self._functions.get(name)
        if fn is not None:
            return fn
        try:
            if cubin is None:
                self.stats[name] = "cupy"
                expression = name_expression(kernel)
                raw = cp.RawModule(code=module_source(module), options=(*OPTIONS, ONE_KERNEL),
                                   name_expressions=[expression], backend="nvrtc")  # fmt: skip
                fn = raw.get_function(expression)
            else:
                path, lowered = cubin.result()
                fn = cp.RawModule(path=str(path)).get_function(lowered)
        except BackendError:
            raise
        except Exception as exc:  # CuPy raises CUDADriverError / CompileException for an unknown name
            raise BackendError(f"cuda backend: kernel '{kernel}' of module '{module}' did not load: {exc}") from exc
        with self._lock:
            fn = self._functions.setdefault(name, fn)
            self._pending.pop(name, None)
        return fn

    def warm(self, kernels: list[tuple[str, str]]) -> None:
        """Compile (or find) these (module, kernel) pairs in parallel and load them."""
        for pending in [self.function(m, k) for m, k in kernels]:
            if isinstance(pending, PendingKernel):
                pending.get()

"""CUDA C sources of the CUDA backend and their compilation: NVRTC -> cubin, cached on disk keyed by
(source hash, arch, NVRTC version) under `dif.env.cache_dir()/cuda`, each sealed with its checksum (a
damaged one is recompiled), loaded as CuPy modules.

Each module is `common.cuh` + its preludes (`PRELUDES`) + one `.cu` file of this folder, named after the
`dif.ops` module whose lowerings (`lower/<name>.py`) launch most of its kernels; every kernel is an
`extern "C"` function named `<op>_<dtype...>` (see the instantiation macros at the bottom of each file).
The cache key hashes that whole source, so editing a prelude recompiles every module that includes it.
Nothing here imports cupy or NVRTC until a module is first needed.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any

from dif.diskcache import read_entry, write_entry
from dif.errors import BackendError, DifWarning
from dif.serialize.container import write_atomic

MODULES = ("elementwise", "norm", "layout", "linalg", "conv", "attention", "fused")
PRELUDES: dict[str, tuple[str, ...]] = {"linalg": ("gemm_tile.cuh",), "conv": ("gemm_tile.cuh",)}
"""Headers a module needs after `common.cuh` (the portable GEMM's tile loop serves linalg and conv)."""
OPTIONS = ("-std=c++17", "-default-device")


def module_source(name: str) -> str:
    """The full CUDA source of module `name` (common.cuh, its preludes, then `<name>.cu`)."""
    if name not in MODULES:
        raise BackendError(f"cuda backend: no kernel module '{name}' (known: {', '.join(MODULES)})")
    folder = resources.files(__name__)
    files = ("common.cuh", *PRELUDES.get(name, ()), f"{name}.cu")
    return "\n".join(folder.joinpath(f).read_text() for f in files)


def cache_key(source: str, arch: str, compiler: str) -> str:
    h = hashlib.sha256()
    for part in (source, arch, compiler, " ".join(OPTIONS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def nvrtc_version() -> str:
    """'nvrtc-13.0', or 'cupy-nvrtc' when only CuPy's own NVRTC wrapper is importable."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return "cupy-nvrtc"
    err, major, minor = nvrtc.nvrtcVersion()
    return f"nvrtc-{major}.{minor}"


def compile_cubin(source: str, arch: str, name: str) -> bytes:
    """Compile `source` for `arch` ('sm_90') with NVRTC (cuda.bindings); raises BackendError with the log."""
    from cuda.bindings import nvrtc

    def check(err: Any, what: str) -> None:
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise BackendError(f"cuda backend: NVRTC {what} failed for module '{name}': {err}")

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    check(err, "create")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in OPTIONS)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise BackendError(
                f"cuda backend: NVRTC could not compile module '{name}' for {arch}:\n"
                + log.decode(errors="replace")[-4000:]
            )
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        check(err, "cubin size")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        check(err, "cubin")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


class KernelCache:
    """Compiled modules for one device architecture; functions looked up by kernel name.

    `stats` counts how each module was obtained: 'compiled', 'disk' (cubin cache hit) or 'cupy'
    (CuPy compiled it itself because cuda.bindings' NVRTC is absent)."""

    def __init__(self, arch: str, cache_root: Path | None = None) -> None:
        from dif.env import cache_dir

        self.arch = arch
        self.root = (cache_root or cache_dir()) / "cuda"
        self.compiler = nvrtc_version()
        self._modules: dict[str, Any] = {}
        self._functions: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.stats: dict[str, str] = {}

    def path_for(self, name: str) -> Path:
        key = cache_key(module_source(name), self.arch, self.compiler)
        return self.root / f"{name}-{self.arch}-{key}.cubin"

    def _load(self, name: str) -> Any:
        import cupy as cp

        source = module_source(name)
        if self.compiler == "cupy-nvrtc":
            self.stats[name] = "cupy"
            return cp.RawModule(code=source, options=OPTIONS, backend="nvrtc")
        return cp.RawModule(path=str(self.cubin(name, source)))

    def cubin(self, name: str, source: str) -> Path:
        """The path of an intact cubin of module `name` (compiled now when the cache has none). A cubin is
        trusted only when its seal (`dif.diskcache` entry beside it, for this source, arch and compiler)
        holds its SHA-256; a truncated or edited one is recompiled with a warning."""
        path = self.path_for(name)
        key = {"module": name, "arch": self.arch, "compiler": self.compiler, "source": cache_key(source, "", "")}
        seal = path.with_name(path.name + ".seal")
        digest = read_entry(seal, key)
        if path.is_file():
            if digest is not None and digest == hashlib.sha256(path.read_bytes()).hexdigest().encode():
                self.stats[name] = "disk"
                return path
            warnings.warn(f"cached kernel {path} does not match its seal; recompiling it", DifWarning, stacklevel=2)
        cubin = compile_cubin(source, self.arch, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, cubin)
        write_entry(seal, hashlib.sha256(cubin).hexdigest().encode(), key)
        self.stats[name] = "compiled"
        return path

    def module(self, name: str) -> Any:
        with self._lock:
            mod = self._modules.get(name)
        if mod is None:
            mod = self._load(name)
            with self._lock:
                mod = self._modules.setdefault(name, mod)
        return mod

    def warm(self, names: tuple[str, ...] = MODULES) -> None:
        """Compile (or load) modules in parallel threads: NVRTC programs compile independently."""
        missing = [n for n in names if n not in self._modules]
        with ThreadPoolExecutor(max_workers=max(1, len(missing))) as pool:
            list(pool.map(self.module, missing))

    def function(self, module: str, kernel: str) -> Any:
        key = f"{module}:{kernel}"
        fn = self._functions.get(key)
        if fn is None:
            try:
                fn = self.module(module).get_function(kernel)
            except Exception as exc:  # CuPy raises CUDADriverError for an unknown name
                raise BackendError(f"cuda backend: kernel '{kernel}' missing from module '{module}': {exc}") from exc
            self._functions[key] = fn
        return fn

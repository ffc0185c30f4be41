"""Every `DIF_*` environment variable dif reads, declared in one place (documented in docs/env.md).

Code reads a variable through its `EnvVar` here (`DIF_BACKEND.get()`), never `os.environ`
directly, so the list below is complete by construction and a test checks the docs against it.
"""

from __future__ import annotations

import os
from pathlib import Path

from attrs import frozen

from dif.errors import UsageError


@frozen
class EnvVar:
    """One declared variable: its name, what it does, and the value used when it is unset."""

    name: str
    doc: str
    default: str | None = None

    def get(self) -> str | None:
        """The value, or the default when unset. An empty string is a value, not "unset"."""
        return os.environ.get(self.name, self.default)

    def get_list(self) -> list[str] | None:
        """Comma-separated names; `None` when unset, `[]` for an empty string."""
        value = self.get()
        if value is None:
            return None
        return [part.strip() for part in value.split(",") if part.strip()]

    def get_bool(self) -> bool:
        value = (self.get() or "").strip().lower()
        if value in ("", "0", "false", "no", "off"):
            return False
        if value in ("1", "true", "yes", "on"):
            return True
        raise UsageError(f"{self.name}={value!r} is not a boolean", hint="use 1 or 0")

    def get_choice(self, choices: tuple[str, ...]) -> str | None:
        """One of `choices` (case and surrounding spaces ignored), or the default when unset or empty.

        An empty value counts as unset here, as in `get_bool`: an exported-but-blank variable means "no preference".
        Anything else outside `choices` is a UsageError naming the variable and the allowed values,
        raised when the value is read (by whoever needs it), never at import.
        """
        value = (self.get() or "").strip().lower()
        if not value:
            return self.default
        if value not in choices:
            raise UsageError(f"{self.name}={value!r} is not a valid choice", hint=f"use one of {', '.join(choices)}")
        return value


ENV_VARS: dict[str, EnvVar] = {}


def declare(name: str, doc: str, default: str | None = None) -> EnvVar:
    """Declare a variable (module level, below). Names must start with `DIF_`."""
    if not name.startswith("DIF_"):
        raise ValueError(f"environment variable {name} must start with DIF_")
    if name in ENV_VARS:
        raise ValueError(f"environment variable {name} is declared twice")
    var = EnvVar(name, doc, default)
    ENV_VARS[name] = var
    return var


DIF_LOAD_PLUGINS = declare(
    "DIF_LOAD_PLUGINS",
    "Comma-separated entry-point names of the plugins to load; empty string loads none; unset loads all.",
)
DIF_BACKEND = declare(
    "DIF_BACKEND",
    "Backend used when a command or `dif.runtime.get_backend()` is given no name; unset picks, per program, "
    "the available backend with the highest priority that has every op and dtype of it.",
)
DIF_PASSES = declare(
    "DIF_PASSES",
    "Optimizer passes `dif.runtime.prepare` runs: unset or `default` for the core pipeline plus plugin passes, "
    "`none` for no pass, or comma-separated pass names in order (`default` expands in place).",
)
DIF_FORMAT_STAGES = declare(
    "DIF_FORMAT_STAGES",
    "The pipeline stages whose programs a format pass named in `DIF_PASSES` (quantize_fp8, quantize_int8, "
    "quantize_int4) converts: comma-separated stages (encode, denoise, decode) or `all`; the others run "
    "without it, recorded in their plans.",
    default="denoise",
)
DIF_FORMAT_KEEP = declare(
    "DIF_FORMAT_KEEP",
    "Comma-separated blocks (fnmatch patterns over the provenance block names, e.g. `transformer_blocks.0`, "
    "`single_transformer_blocks.*`) whose linears the format passes leave in the run dtype; unset or empty: none.",
)
DIF_FP8_WEIGHTS = declare(
    "DIF_FP8_WEIGHTS",
    "Linear weights a checkpoint stores as fp8-e4m3: `auto` keeps them in fp8 (the quantize_fp8 pass over the "
    "stored bytes and scales) in the programs a frontend marks (its denoiser) where the backend executes "
    "fp8-e4m3, else dequantizes them with a note; `dequantize` always dequantizes them to the run dtype.",
    default="auto",
)
DIF_CUDA_GEMM = declare(
    "DIF_CUDA_GEMM",
    "GEMM path of the cuda backend: `auto` (cuBLASLt when nvmath-python is installed, else NVRTC), "
    "`cublaslt` or `nvrtc`. A `gemm=` argument to `CudaBackend` wins over it.",
    default="auto",
)
DIF_CUDA_INT4 = declare(
    "DIF_CUDA_INT4",
    "int4_linear kernel of the cuda backend: `mma` (the tensor-core kernel, sm_80+ with bf16 / f16 activations) "
    "or `tile` (the portable fp32 tile GEMM, also what `mma` falls back to). An `int4=` argument to "
    "`CudaBackend` wins over it.",
    default="mma",
)
DIF_CUDA_ROWS = declare(
    "DIF_CUDA_ROWS",
    "Row kernels of the cuda backend's norm_modulate_quant and quantize_rows over half-precision rows: "
    "`registers` (the row held in registers, 16-byte loads, where the row and its operands allow it) or `staged` "
    "(each row staged in shared memory). A `rows=` argument to `CudaBackend` wins over it.",
    default="registers",
)
DIF_CUDA_SDPA = declare(
    "DIF_CUDA_SDPA",
    "Attention path of the cuda backend: `auto` (cuDNN for eligible fp16/bf16 attention, else the NVRTC flash "
    "kernel), `cudnn` or `flash`. An `sdpa=` argument to `CudaBackend` wins over it.",
    default="auto",
)
DIF_CUDA_TUNE = declare(
    "DIF_CUDA_TUNE",
    "Library algorithm choices of the cuda backend (cuBLASLt, cuDNN) per problem: `cached` reuses the choices "
    "stored in the cache and otherwise takes the library's first candidate (nothing is timed), `on` also times "
    "the candidates of a problem without a stored choice and stores the fastest, `off` always takes the "
    "library's first. A `tune=` argument to `CudaBackend` wins over it.",
    default="cached",
)
DIF_TRACE_FILE = declare(
    "DIF_TRACE_FILE",
    "Path of a file to which every execution (prepare, run) appends one dif-telemetry/1 trace document as "
    "one JSON line, with an event per op attributed to its DiffIR op id (`dif trace`). Unset: no tracing.",
)
DIF_NVTX = declare(
    "DIF_NVTX",
    "1 pushes NVTX ranges (`dif::prepare`, `dif::run`, `op<id> <opcode>`) on backends that have them (cuda).",
    default="0",
)
DIF_CAPTURE = declare(
    "DIF_CAPTURE",
    "`ops` writes every op result of each execution, `blocks` the last result of each provenance block, to a "
    "`.diftensor` capture in DIF_CAPTURE_DIR (`dif bisect`). Unset: nothing is captured.",
)
DIF_CAPTURE_DIR = declare(
    "DIF_CAPTURE_DIR",
    "Folder DIF_CAPTURE writes its captures to (created when missing).",
    default="dif-capture",
)
DIF_CACHE_DIR = declare(
    "DIF_CACHE_DIR",
    "Folder for on-disk caches (compiled kernels, tuned plans). Default: $XDG_CACHE_HOME/dif or ~/.cache/dif.",
)
DIF_TORCH_CUDA_GPU = declare(
    "DIF_TORCH_CUDA_GPU",
    "`SMS,THREADS_PER_SM` of the GPU whose torch.Generator('cuda') stream `--rng torch-cuda` reproduces (torch's "
    "launch, and so the stream of a large tensor, depends on them). Default: an H100 / H200.",
    default="132,2048",
)


def cache_dir() -> Path:
    """The cache folder (not created here; writers create the subfolder they own)."""
    explicit = DIF_CACHE_DIR.get()
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dif"

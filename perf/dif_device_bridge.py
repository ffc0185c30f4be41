"""Where the perf scripts run: torch + dif's CUDA backend on a GPU, or torch CPU + dif's CPU backend
(to check a script on a machine without a GPU). Timing, peak memory, and handing a torch model's
weights to dif by parameter name.

Benchmark support only. On CUDA the weights go device to device: `DeviceWeight` wraps a torch CUDA
tensor (shape and numpy dtype, which is all the backend checks), and inside `bridge()` the CUDA
executor's host upload copies such entries with cudaMemcpy device-to-device instead (host arrays
still take the normal path). This saves the host round trip of a 25 GB state dict; the values dif
receives are the same. Weights the plan streams must live in the executor's pinned host buffer:
those come down device to host, once, at prepare.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dif.errors import WeightError
from dif.ir.program import Program

D2H, D2D = 2, 3  # cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice


class DeviceWeight:
    """A contiguous torch CUDA tensor presented to dif's weight checks as (shape, numpy dtype)."""

    def __init__(self, tensor: Any, dtype: np.dtype) -> None:
        self.tensor = tensor.contiguous()
        self.shape = tuple(self.tensor.shape)
        self.dtype = dtype
        self.nbytes = self.tensor.numel() * self.tensor.element_size()
        self.ptr = self.tensor.data_ptr()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """The tensor downloaded, for a host-side check of a weight the backend did not scan on the device
        (`PendingScan.report`: a parameter the backend did not cover, say one replaced by a derived one)."""
        import torch

        host = self.tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().view(self.dtype).reshape(self.shape)
        return host if dtype is None else host.astype(dtype)


def _np_dtype(torch_dtype: Any) -> np.dtype:
    import ml_dtypes
    import torch

    table = {torch.bfloat16: np.dtype(ml_dtypes.bfloat16), torch.float32: np.dtype(np.float32),
             torch.float16: np.dtype(np.float16)}  # fmt: skip
    if torch_dtype not in table:
        raise WeightError(f"torch dtype {torch_dtype} has no dif equivalent here")
    return table[torch_dtype]


def cuda_event_times(exe: Any, iters: int, warm: int) -> list[float]:
    """Milliseconds of `iters` forwards of a prepared CUDA executable, each between two CUDA events
    on the backend's stream (graph replay with the inputs already in their slots), after `warm`."""
    import cupy

    stream = exe.backend.stream
    for _ in range(warm):
        exe.execute()
    stream.synchronize()
    times = []
    for _ in range(iters):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        exe.execute()
        stop.record(stream)
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return times


class Device:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.torch_device = "cuda" if kind == "cuda" else "cpu"
        self._backend: Any = None

    def name(self) -> str:
        import torch

        return torch.cuda.get_device_name() if self.kind == "cuda" else platform_cpu()

    def backend(self) -> Any:
        if self._backend is None:
            if self.kind == "cuda":
                from dif_backend_cuda.device import CudaBackend

                self._backend = CudaBackend()
            else:
                from dif_backend_cpu import CpuBackend

                self._backend = CpuBackend()
        return self._backend

    # -- torch side ---------------------------------------------------------------------------------
    def sync(self) -> None:
        if self.kind == "cuda":
            import torch

            torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.kind == "cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        if self.kind != "cuda":
            return None
        import torch

        torch.cuda.synchronize()
        return round(torch.cuda.max_memory_allocated() / 2**30, 2)

    def empty_cache(self) -> None:
        if self.kind == "cuda":
            import torch

            torch.cuda.empty_cache()

    def torch_median(self, fn: Callable[[], Any], iters: int, warm: int) -> tuple[float, list[float]]:
        """Median milliseconds of `fn` (CUDA events on torch's current stream, or wall clock on CPU)."""
        import torch

        for _ in range(warm):
            fn()
        self.sync()
        times = []
        for _ in range(iters):
            if self.kind == "cuda":
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(times)), times

    # -- dif side -----------------------------------------------------------------------------------
    def weights(self, program: Program, model: Any) -> dict[str, Any]:
        """The model's tensors for every program parameter, by name; shapes and dtypes must agree."""
        from denoiser_models import to_numpy

        state = model.state_dict()
        out: dict[str, Any] = {}
        for p in program.params:
            if p.name not in state:
                raise WeightError(f"dif parameter '{p.name}' is not in the diffusers state dict")
            t = state[p.name]
            dtype = _np_dtype(t.dtype)
            if tuple(t.shape) != p.type.shape or dtype != p.type.dtype.np:
                raise WeightError(f"'{p.name}': dif wants {p.type}, diffusers holds {t.dtype}{list(t.shape)}")
            out[p.name] = DeviceWeight(t, dtype) if self.kind == "cuda" else to_numpy(t)
        return out

    @contextlib.contextmanager
    def bridge(self) -> Iterator[None]:
        """While active, the CUDA executor copies `DeviceWeight` entries device to device (resident)
        or device to its pinned host buffer (streamed)."""
        if self.kind != "cuda":
            yield
            return
        import cupy

        from dif_backend_cuda import executor

        original = executor.upload
        original_fill = executor.fill_pinned

        def upload(dst_ptr: int, arrays: list[tuple[int, Any]], stream: Any) -> float:
            t0 = time.perf_counter()
            host = [(off, a) for off, a in arrays if not isinstance(a, DeviceWeight)]
            for off, a in arrays:
                if isinstance(a, DeviceWeight) and a.nbytes:
                    cupy.cuda.runtime.memcpyAsync(dst_ptr + off, a.ptr, a.nbytes, D2D, stream.ptr)
            stream.synchronize()
            spent = time.perf_counter() - t0
            return spent + (original(dst_ptr, host, stream) if host else 0.0)

        def fill_pinned(pinned: np.ndarray, arrays: list[tuple[int, Any]]) -> None:
            base = pinned.ctypes.data
            for off, a in arrays:
                if isinstance(a, DeviceWeight) and a.nbytes:
                    cupy.cuda.runtime.memcpy(base + off, a.ptr, a.nbytes, D2H)  # synchronous
            original_fill(pinned, [(off, a) for off, a in arrays if not isinstance(a, DeviceWeight)])

        self.sync()  # the torch kernels that wrote the weights have finished
        executor.upload, executor.fill_pinned = upload, fill_pinned
        try:
            yield
        finally:
            executor.upload, executor.fill_pinned = original, original_fill

    def free_bytes(self) -> int:
        if self.kind != "cuda":
            return 0
        import cupy

        return int(cupy.cuda.runtime.memGetInfo()[0])

    def dif_median(self, exe: Any, inputs: dict[str, np.ndarray], iters: int, warm: int) -> tuple[float, list[float]]:
        """Median milliseconds of one forward: CUDA graph replay between events on the backend's stream
        (inputs already in their slots), or `run(inputs)` wall clock on the CPU backend."""
        if self.kind != "cuda":
            for _ in range(warm):
                exe.run(inputs)
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                exe.run(inputs)
                times.append((time.perf_counter() - t0) * 1e3)
            return float(np.median(times)), times
        times = cuda_event_times(exe, iters, warm)
        return float(np.median(times)), times

    def describe(self, exe: Any) -> dict[str, Any]:
        if self.kind != "cuda":
            return {}
        return {
            "steps": len(exe.steps),
            "graph": exe.graph is not None,
            "graph_error": exe.graph_error,
            "timings_s": {k: round(v, 2) for k, v in exe.timings.items() if k.endswith("_s")},
            "weights": {k: int(v) for k, v in exe.timings.items() if not k.endswith("_s")},
            "paths": dict(Counter(exe.choices.values())),
        }

    def profile(self, exe: Any, iters: int, by: str = "op") -> dict[str, Any]:
        """Time by op (`by="op"`: {op: ms}) or by op, shapes and lowering ({key: {"ms", "steps"}})."""
        if self.kind != "cuda":
            return {}
        got = exe.profile(iters=iters, by=by)
        if by == "op":
            return {k: round(v["ms"], 2) for k, v in got.items()}
        return {k: {"ms": round(v["ms"], 3), "steps": int(v["steps"])} for k, v in got.items()}


def platform_cpu() -> str:
    import platform

    return platform.processor() or platform.machine()

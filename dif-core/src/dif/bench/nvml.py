"""Peak device memory and power of NVIDIA GPUs while a benchmark stage runs, sampled through NVML.

Where it sits: `dif.bench.runner` starts a `DeviceSampler` around each stage's child process. `pynvml`
(the nvidia-ml-py distribution, `pip install dif-core[gpu]`) is imported only when sampling starts; without
it, or without a GPU, the record says "not measured" and why, never a zero.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from attrs import define, field

INTERVAL_S = 0.05


@define
class _DeviceTrack:
    index: int
    name: str
    handle: Any
    used_before: int
    used_peak: int = 0
    process_peak: int | None = None
    power_peak_mw: int | None = None
    power_sum_mw: float = 0.0
    power_samples: int = 0
    energy_mj: float = 0.0
    last_power: tuple[float, int] | None = None  # (perf_counter, mW) for the trapezoid energy sum


@define
class DeviceSampler:
    """Start before the stage's process, `watch(pid)` once it exists, `stop()` for the record (a dict)."""

    interval_s: float = INTERVAL_S
    nvml: Any = None  # the pynvml module; tests pass a stand-in
    reason: str | None = None
    _tracks: list[_DeviceTrack] = field(factory=list)
    _pid: int | None = None
    _stop: threading.Event = field(factory=threading.Event)
    _thread: threading.Thread | None = None
    _samples: int = 0
    _errors: list[str] = field(factory=list)

    def start(self) -> None:
        if self.nvml is None:
            try:
                import pynvml  # type: ignore[import-not-found,unused-ignore]
            except ImportError:
                self.reason = "pynvml is not installed (pip install nvidia-ml-py, or dif-core[gpu])"
                return
            self.nvml = pynvml
        nv = self.nvml
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.reason = f"NVML unavailable: {exc}"
            self.nvml = None
            return
        if count == 0:
            self.reason = "NVML sees no GPU"
            return
        for i in range(count):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(handle)
            used = int(nv.nvmlDeviceGetMemoryInfo(handle).used)
            self._tracks.append(_DeviceTrack(i, name.decode() if isinstance(name, bytes) else str(name), handle, used))
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="dif-bench-nvml", daemon=True)
        self._thread.start()

    def watch(self, pid: int) -> None:
        """Also track the device memory NVML attributes to process `pid` (the stage's child)."""
        self._pid = pid

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        nv = self.nvml
        now = time.perf_counter()
        for t in self._tracks:
            # each query on its own: one unsupported query (power on some boards, process lists in a
            # container) must not hide the others; failures are reported, not fatal
            used = self._query(t, "memory", lambda h: int(nv.nvmlDeviceGetMemoryInfo(h).used))
            if used is not None:
                t.used_peak = max(t.used_peak, used)
            if self._pid is not None:
                procs = self._query(t, "processes", nv.nvmlDeviceGetComputeRunningProcesses) or []
                for proc in procs:
                    mem = getattr(proc, "usedGpuMemory", None)
                    if proc.pid == self._pid and isinstance(mem, int):
                        t.process_peak = max(t.process_peak or 0, mem)
            mw = self._query(t, "power", lambda h: int(nv.nvmlDeviceGetPowerUsage(h)))
            if mw is None:
                continue
            t.power_peak_mw = max(t.power_peak_mw or 0, mw)
            t.power_sum_mw += mw
            t.power_samples += 1
            if t.last_power is not None:
                then, before = t.last_power
                t.energy_mj += (now - then) * (before + mw) / 2.0
            t.last_power = (now, mw)
        self._samples += 1

    def _query(self, track: _DeviceTrack, what: str, fn: Any) -> Any:
        try:
            return fn(track.handle)
        except Exception as exc:  # NVMLError_NotSupported, NoPermission, ...
            message = f"device {track.index} {what}: {exc}"
            if message not in self._errors and len(self._errors) < 8:
                self._errors.append(message)
            return None

    def stop(self) -> dict[str, Any]:
        """End sampling (one last sample) and return the record."""
        if self.nvml is None or not self._tracks:
            return {"measured": False, "reason": self.reason or "not started"}
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        with contextlib.suppress(Exception):  # shutdown failing changes none of the numbers already taken
            self.nvml.nvmlShutdown()
        devices = []
        for t in self._tracks:
            devices.append(
                {
                    "index": t.index,
                    "name": t.name,
                    "memory_used_before_bytes": t.used_before,
                    "memory_used_peak_bytes": t.used_peak,
                    "memory_peak_increase_bytes": max(t.used_peak - t.used_before, 0),
                    "process_memory_peak_bytes": t.process_peak,
                    "power_peak_w": None if t.power_peak_mw is None else round(t.power_peak_mw / 1000, 1),
                    "power_mean_w": round(t.power_sum_mw / t.power_samples / 1000, 1) if t.power_samples else None,
                    "energy_j": round(t.energy_mj / 1000, 2) if t.power_samples > 1 else None,
                }
            )
        record: dict[str, Any] = {"measured": True, "interval_s": self.interval_s, "samples": self._samples}
        record["devices"] = devices
        if self._errors:
            record["errors"] = list(self._errors)
        return record

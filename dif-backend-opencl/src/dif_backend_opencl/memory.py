"""Device memory outside the plan's arena: a pool of `cl.Buffer`s keyed by (rounded) size.

Executables take their inputs, weights, scratch and (when the arena is larger than the device's
largest allocation) per-value buffers from the pool while preparing, and give them back when
closed, so the next program (another resolution, the VAE after the transformer) reuses them
instead of allocating. Reuse while lowering one program is safe without waiting on events
because every launch of an executable goes to one in-order queue.
"""

from __future__ import annotations

from typing import Any

from attrs import define, field

from dif.errors import BackendError, DeviceMemoryError

MIN_BUCKET = 256


def bucket(nbytes: int) -> int:
    """Size class of a request: at least 256 B, then rounded up to 1/8 of its power of two
    (so a pooled buffer wastes at most 12.5 %)."""
    n = max(int(nbytes), MIN_BUCKET)
    step = 1 << max(n.bit_length() - 4, 0)
    return -(-n // step) * step


@define
class BufferPool:
    """Free device buffers by size class. `idle_limit_bytes` caps what is kept when buffers come
    back; beyond it they are released to the driver at once."""

    context: Any
    max_alloc_bytes: int
    idle_limit_bytes: int
    _free: dict[int, list[Any]] = field(factory=dict)
    idle_bytes: int = 0
    live_bytes: int = 0  # handed out and not yet given back
    allocations: int = 0  # buffers created (for tests and telemetry)

    def acquire(self, nbytes: int) -> Any:
        import pyopencl as cl

        size = bucket(nbytes)
        if size > self.max_alloc_bytes:
            raise BackendError(
                f"OpenCL: one buffer of {nbytes} B exceeds the device's largest allocation ({self.max_alloc_bytes} B)",
                hint="use a smaller resolution or batch, or a device with a larger CL_DEVICE_MAX_MEM_ALLOC_SIZE",
            )
        free = self._free.get(size)
        if free:
            buf = free.pop()
            self.idle_bytes -= size
        else:
            try:
                buf = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size)
            except (cl.Error, MemoryError, RuntimeError) as exc:  # pyopencl's MemoryError is a cl.Error
                # the executable that asked re-raises this with its program and the device's free memory
                detail = str(exc) or type(exc).__name__
                raise DeviceMemoryError("opencl", "", size, "device buffer", None, detail) from exc
            self.allocations += 1
        self.live_bytes += size
        return buf

    def release(self, buf: Any) -> None:
        size = int(buf.size)
        self.live_bytes -= size
        if self.idle_bytes + size > self.idle_limit_bytes:
            buf.release()
            return
        self._free.setdefault(size, []).append(buf)
        self.idle_bytes += size

    def trim(self) -> int:
        """Release every idle buffer to the driver; returns the bytes freed."""
        freed = self.idle_bytes
        for bufs in self._free.values():
            for buf in bufs:
                buf.release()
        self._free.clear()
        self.idle_bytes = 0
        return freed

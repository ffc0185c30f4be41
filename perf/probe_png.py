"""Where the PNG stage's time goes on this machine: `dif.media.png_writer.png_bytes` on a 1024x1024 image with
the texture of a generated one (gradients, waves, noise), by thread count, and its two halves (the scanline
filters, zlib's deflate at several levels) on one core.

Usage: python3 perf/probe_png.py --out probe_png.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import zlib
from collections.abc import Callable

import numpy as np

SIZE = 1024


def image(size: int = SIZE) -> np.ndarray:
    """An (size, size, 3) uint8 image: smooth gradients and waves under Gaussian noise of sigma 6."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    noise = [rng.normal(0, 6, (size, size)) for _ in range(3)]
    planes = [x / 4 + noise[0], y / 4 + noise[1], 128 + 50 * np.sin(x / 30) * np.cos(y / 40) + noise[2]]
    return np.stack(planes, -1).clip(0, 255).astype(np.uint8)


def median_ms(fn: Callable[[], object], reps: int = 7) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(1000 * statistics.median(times), 2)


def main() -> int:
    from dif.media.png_writer import LEVEL, _usable_cores, filter_rows, png_bytes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="probe_png.json")
    args = ap.parse_args()
    pixels = image()
    raw = pixels.reshape(SIZE, -1)
    cores = _usable_cores()
    result: dict[str, object] = {"size": SIZE, "cores": cores, "cpu": os.uname().machine, "level": LEVEL}
    result["png_bytes_ms"] = {
        str(t): median_ms(lambda t=t: png_bytes(pixels, threads=t)) for t in sorted({1, 2, 4, 8, cores})
    }
    result["bytes"] = len(png_bytes(pixels))
    filtered = filter_rows(raw, np.zeros(raw.shape[1], np.uint8), 3).tobytes()
    result["filter_one_core_ms"] = median_ms(lambda: filter_rows(raw, np.zeros(raw.shape[1], np.uint8), 3))

    def deflate(level: int) -> bytes:
        comp = zlib.compressobj(level, zlib.DEFLATED, -15, 9, zlib.Z_FILTERED)
        return comp.compress(filtered) + comp.flush()

    result["deflate_one_core"] = {
        str(level): {"ms": median_ms(lambda level=level: deflate(level), 3), "bytes": len(deflate(level))}
        for level in (1, 3, 4, 6)
    }
    print(json.dumps(result))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Re-store a FLUX.2 transformer as a Q8_0 GGUF, for the GGUF load / step / memory measurement.

    python perf/gguf_q8.py KLEIN_FOLDER/transformer klein-9b-Q8_0.gguf
    dif flux2 generate -p "a fox" -m KLEIN_FOLDER --backend cuda --seed 1 --json -o bf16.png > bf16.json
    dif flux2 generate -p "a fox" -m klein-9b-Q8_0.gguf --base KLEIN_FOLDER --dtype bf16 --backend cuda \
        --seed 1 --json -o q8.png > q8.json
then compare `timings_s` (load, denoise), `steps_per_s` and `memory` of the two documents.

Every 2-D weight whose rows are a multiple of 32 values becomes Q8_0 (dif.weights.gguf.quantize_q8_0,
ggml's rounding), everything else F32, as ComfyUI-GGUF's converter keeps 1-D tensors; names stay the
source's (dif reads diffusers-named GGUFs like BFL-named ones). Tensors are converted on every core, a few
ahead of the writer (161 s for klein 9B one at a time on the H200).
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="transformer folder (diffusers) or single file")
    parser.add_argument("out", type=Path, help="the .gguf to write")
    args = parser.parse_args()

    from dif.weights import open_component
    from dif.weights.gguf import quantize_q8_0, write_gguf
    from dif_frontend_flux2.weights import open_single_file

    source = open_component(args.source) if args.source.is_dir() else open_single_file(args.source, "transformer")
    plan = []
    for name in source.names():
        shape = tuple(source.info(name).shape)
        plan.append((name, "Q8_0" if len(shape) == 2 and shape[1] % 32 == 0 else "F32", shape))

    kinds = {name: kind for name, kind, _ in plan}

    def convert(name: str) -> np.ndarray:
        values = np.asarray(source[name], dtype=np.float32)
        return quantize_q8_0(values) if kinds[name] == "Q8_0" else values.view(np.uint8)

    # write_gguf asks for one tensor after another; the conversions run ahead of it on every core (numpy
    # releases the GIL), a bounded window of them at a time so memory stays a few tensors deep
    workers = os.cpu_count() or 1
    pool = ThreadPoolExecutor(max_workers=workers)
    upcoming = iter(name for name, _, _ in plan)
    ahead: dict[str, Future[np.ndarray]] = {}

    def data(name: str) -> np.ndarray:
        while len(ahead) < 2 * workers and (following := next(upcoming, None)) is not None:
            ahead[following] = pool.submit(convert, following)
        return ahead.pop(name).result()

    start = time.perf_counter()
    with pool:
        write_gguf(args.out, plan, data, {"general.architecture": "flux", "general.name": args.out.stem})
    q8 = sum(1 for _, k, _ in plan if k == "Q8_0")
    print(f"wrote {args.out}: {q8} Q8_0 + {len(plan) - q8} F32 tensors, "
          f"{args.out.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - start:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()

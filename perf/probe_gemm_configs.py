"""Does any cuBLASLt configuration outside the heuristic's list run klein's GEMMs faster at the power limit?

cuBLASLt's heuristic proposes a handful of algorithms per problem, ranked by a model of an idle GPU; a long
forward runs at the board's power limit instead, where another tile or cluster shape might win. `configs`
walks the library's own configuration space for one planned problem: every algorithm id it offers for the
data types, with the tiles and stage counts it reports, a few cluster shapes and both CTA swizzles (no
split-K: these problems fill the GPU), keeping what `cublasLtMatmulAlgoCheck` accepts within the workspace.

For each distinct klein-9B GEMM shape (bf16, random data, weights scaled by 1/sqrt(k)): the heuristic's
candidates (dif's `LtMatmul`), then every configuration found, each timed on one call (in random order,
within a time budget); the fastest of those and the heuristic's candidates are then timed back to back
(warm clocks, interleaved rounds). Also: the double block's text GEMM on a second stream next to the image
GEMM, against running them one after the other.

Usage: python3 perf/probe_gemm_configs.py --out probe_gemm.json  (needs a GPU, cupy, nvmath)
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

SHAPES = (  # rows, k, n, calls per klein-9B forward
    (4608, 4096, 36864, 24),
    (4608, 16384, 4096, 24),
    (4096, 4096, 24576, 8),
    (4096, 4096, 4096, 32),
    (4096, 12288, 4096, 8),
    (512, 4096, 4096, 32),
    (512, 4096, 24576, 8),
)
FINALISTS = 12
CLUSTERS = ("SHAPE_AUTO", "SHAPE_1x1x1", "SHAPE_2x1x1", "SHAPE_1x2x1", "SHAPE_4x1x1", "SHAPE_1x4x1", "SHAPE_2x2x1")
MAX_IDS = 256


def _get(getter: Any, dtype_of: Any, obj: int, attr: Any) -> list[int]:
    """All values of one array- or scalar-valued attribute (cap or config) of the algorithm at `obj`."""
    dt = np.dtype(dtype_of(attr))
    written = np.zeros(1, dtype=np.uint64)
    getter(obj, attr, 0, 0, written.ctypes.data)  # size query
    buf = np.zeros(max(1, int(written[0]) // dt.itemsize), dtype=dt)
    getter(obj, attr, buf.ctypes.data, buf.nbytes, written.ctypes.data)
    return [int(v) for v in buf[: int(written[0]) // dt.itemsize]]


def _set(lib: Any, obj: int, attr: Any, value: int) -> None:
    buf = np.array([value], dtype=np.dtype(lib.get_matmul_algo_config_attribute_dtype(attr)))
    lib.matmul_algo_config_set_attribute(obj, attr, buf.ctypes.data, buf.itemsize)


def workspace_size(result: np.ndarray) -> int:
    """Workspace bytes of a `matmul_heuristic_result_dtype` record (field spelled as the binding does)."""
    names = result.dtype.names or ()
    field = next(n for n in names if n.replace("_", "").lower() == "workspacesize")
    return int(result[field][0])


def describe(lib: Any, algo_ptr: int) -> dict[str, int]:
    """The configuration of the algorithm struct at `algo_ptr` (id, tile, stages, cluster, swizzle, ...)."""
    cfg = lib.MatmulAlgoConfigAttribute
    names = ("ID", "TILE_ID", "STAGES_ID", "CLUSTER_SHAPE_ID", "CTA_SWIZZLING", "SPLITK_NUM", "CUSTOM_OPTION")
    out = {}
    for name in names:
        values = _get(lib.matmul_algo_config_get_attribute, lib.get_matmul_algo_config_attribute_dtype, algo_ptr,
                      getattr(cfg, name))  # fmt: skip
        out[name.lower()] = values[0] if values else -1
    return out


def configs(
    step: Any,
    cuda_dtype: int,
    compute: int,
    scale: int,
    *,
    first: Sequence[int] = (),
    limit: int = 4096,
    deadline_s: float = 30.0,
) -> np.ndarray:
    """The configurations of `step` (a planned `LtMatmul`) that cuBLASLt accepts, as an array of
    `matmul_algo_dtype` structs: at most `limit` of them, found within `deadline_s` seconds, walking
    the algorithm ids in `first` (those the heuristic proposed) before the others."""
    ctx = step.ctx
    lib = ctx.lib
    cap, cfg = lib.MatmulAlgoCapAttribute, lib.MatmulAlgoConfigAttribute
    clusters = [int(getattr(lib.ClusterShape, n)) for n in CLUSTERS if hasattr(lib.ClusterShape, n)]
    ids = lib.matmul_algo_get_ids(ctx.handle, compute, scale, cuda_dtype, cuda_dtype, cuda_dtype, cuda_dtype, MAX_IDS)
    ids = list(dict.fromkeys([*first, *(int(i) for i in ids)]))
    algo = np.zeros(1, dtype=lib.matmul_algo_dtype)
    result = np.zeros(1, dtype=lib.matmul_heuristic_result_dtype)
    ptr = algo.ctypes.data
    found: list[np.ndarray] = []
    seen: set[bytes] = set()

    def caps(attr: Any) -> list[int]:
        return _get(lib.matmul_algo_cap_get_attribute, lib.get_matmul_algo_cap_attribute_dtype, ptr, attr)

    stop = time.monotonic() + deadline_s
    for algo_id in ids:
        lib.matmul_algo_init(ctx.handle, compute, scale, cuda_dtype, cuda_dtype, cuda_dtype, cuda_dtype, int(algo_id),
                             ptr)  # fmt: skip
        tiles = caps(cap.TILE_IDS) or [0]
        stages = caps(cap.STAGES_IDS) or [0]
        swizzles = (0, 1) if (caps(cap.CTA_SWIZZLING_SUPPORT) or [0])[0] else (0,)
        for tile, stage, cluster, swizzle in itertools.product(tiles, stages, clusters, swizzles):
            if len(found) >= limit or time.monotonic() > stop:
                return _stack(found, lib)
            for attr, value in ((cfg.TILE_ID, tile), (cfg.STAGES_ID, stage), (cfg.CLUSTER_SHAPE_ID, cluster),
                                (cfg.CTA_SWIZZLING, swizzle), (cfg.SPLITK_NUM, 1)):  # fmt: skip
                _set(lib, ptr, attr, value)
            try:
                lib.matmul_algo_check(ctx.handle, step.desc, step.adesc, step.bdesc, step.ddesc, step.ddesc, ptr,
                                      result.ctypes.data)  # fmt: skip
            except Exception:  # noqa: BLE001 - the library declines this combination
                continue
            key = algo.tobytes()
            if workspace_size(result) <= ctx.workspace_bytes and key not in seen:
                seen.add(key)
                found.append(algo.copy())
    return _stack(found, lib)


def _stack(found: list[np.ndarray], lib: Any) -> np.ndarray:
    return np.concatenate(found) if found else np.zeros(0, dtype=lib.matmul_algo_dtype)


def bf16_buffer(cupy: Any, shape: tuple[int, ...], scale: float) -> Any:
    """Normal bf16 values (stored as uint16: CuPy has no bf16 dtype), truncated from fp32."""
    x = cupy.random.standard_normal(shape, dtype=cupy.float32) * scale
    return (x.view(cupy.uint32) >> 16).astype(cupy.uint16)


def probe_shape(rows: int, k: int, n: int, count: int, budget_s: float) -> dict[str, Any]:
    import cupy

    from dif.dtypes import DType
    from dif_backend_cuda import gemm
    from dif_backend_cuda.tuning import fastest

    stream = cupy.cuda.Stream(non_blocking=True)
    lt = gemm.LtContext(64 << 20)
    x = bf16_buffer(cupy, (rows, k), 1.0)
    w = bf16_buffer(cupy, (n, k), k**-0.5)
    y = cupy.empty((rows, n), dtype=cupy.uint16)
    step = gemm.LtMatmul(lt, gemm.linear_problem(DType.BF16, x.data.ptr, w.data.ptr, y.data.ptr, 0, rows, k, n))
    lib = lt.lib
    heuristic = np.frombuffer(step.heuristic["algo"][: step.candidates].tobytes(), dtype=lib.matmul_algo_dtype)
    t0 = time.perf_counter()
    first = [describe(lib, heuristic[i:].ctypes.data)["id"] for i in range(len(heuristic))]
    found = configs(step, gemm.CUDA_DTYPE[DType.BF16], gemm.COMPUTE_32F, gemm.CUDA_R_32F,
                                first=first, deadline_s=budget_s)  # fmt: skip
    search_s = time.perf_counter() - t0
    algos = np.concatenate([heuristic, found])
    start, end = cupy.cuda.Event(), cupy.cuda.Event()

    def run(i: int) -> None:
        p = step.p
        lib.matmul(lt.handle, step.desc, step.alpha.ctypes.data, p.a, step.adesc, p.b, step.bdesc,
                   step.beta.ctypes.data, p.d, step.ddesc, p.d, step.ddesc, algos[i:].ctypes.data,
                   lt.workspace.ptr, lt.workspace_bytes, stream.ptr)  # fmt: skip

    def once(i: int) -> float:
        run(i)
        start.record(stream)
        run(i)
        end.record(stream)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end)

    order = list(range(len(heuristic), len(algos)))
    random.Random(0).shuffle(order)
    single: dict[int, float] = {}
    t0 = time.perf_counter()
    for i in order:
        if time.perf_counter() - t0 > budget_s:
            break
        try:
            single[i] = once(i)
        except Exception:  # noqa: BLE001 - a configuration the check accepted but the launch refuses
            stream.synchronize()
    finalists = list(range(len(heuristic))) + sorted(single, key=single.__getitem__)[:FINALISTS]

    def sustained(pick: list[int]) -> list[float]:
        """Median ms per call of each candidate in `pick`, in interleaved rounds of 10 back-to-back calls."""
        for _ in range(40):
            run(pick[0])
        times: dict[int, list[float]] = {i: [] for i in pick}
        for _ in range(5):
            for i in pick:
                start.record(stream)
                for _ in range(10):
                    run(i)
                end.record(stream)
                end.synchronize()
                times[i].append(cupy.cuda.get_elapsed_time(start, end) / 10)
        return [statistics.median(times[i]) for i in pick]

    ms = sustained(finalists)
    best_h = min(range(len(heuristic)), key=lambda j: ms[j])
    best_s = min(range(len(finalists)), key=lambda j: ms[j])
    flop = 2 * rows * k * n

    def entry(j: int) -> dict[str, Any]:
        i = finalists[j]
        return {"ms": round(ms[j], 4), "tflops": round(flop / ms[j] / 1e9, 1),
                "config": describe(lib, algos[i:].ctypes.data)}  # fmt: skip

    tuned = fastest(run, len(finalists), stream)  # what LtMatmul.tune would pick among the finalists
    res = {
        "shape": f"{rows}x{k}->{n}",
        "count": count,
        "configs_found": int(len(found)),
        "search_s": round(search_s, 2),
        "timed_single": len(single),
        "heuristic_best": entry(best_h),
        "search_best": entry(best_s),
        "saving_ms_per_forward": round((ms[best_h] - ms[best_s]) * count, 3),
        "finalists": [entry(j) for j in range(len(finalists))],
        "tuning_fastest": {"index": tuned[0], "ms": round(tuned[1], 4)},
    }
    print(json.dumps({k: v for k, v in res.items() if k != "finalists"}), flush=True)
    return res


def probe_text_beside_image(calls: int = 40) -> dict[str, Any]:
    """A double block's image GEMM (4096 rows) and text GEMM (512 rows), k=n=4096: one after the other
    vs the text one on a second stream."""
    import cupy

    from dif.dtypes import DType
    from dif_backend_cuda import gemm

    lt = gemm.LtContext(64 << 20)
    lt2 = gemm.LtContext(64 << 20)
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    w = bf16_buffer(cupy, (4096, 4096), 4096**-0.5)
    steps = []
    for ctx, rows in ((lt, 4096), (lt2, 512)):
        x = bf16_buffer(cupy, (rows, 4096), 1.0)
        y = cupy.empty((rows, 4096), dtype=cupy.uint16)
        steps.append((gemm.LtMatmul(ctx, gemm.linear_problem(DType.BF16, x.data.ptr, w.data.ptr, y.data.ptr, 0,
                                                             rows, 4096, 4096)), x, y))  # fmt: skip
    img, txt = steps[0][0], steps[1][0]
    start, end, forked, joined = (cupy.cuda.Event() for _ in range(4))

    def both(concurrent: bool) -> float:
        start.record(s1)
        for _ in range(calls):
            img(s1)
            if concurrent:
                forked.record(s1)
                s2.wait_event(forked)
                txt(s2)
                joined.record(s2)
                s1.wait_event(joined)
            else:
                txt(s1)
        end.record(s1)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / calls

    both(False)
    seq = statistics.median(both(False) for _ in range(5))
    con = statistics.median(both(True) for _ in range(5))
    res = {"sequential_ms": round(seq, 4), "concurrent_ms": round(con, 4)}
    print(json.dumps(res), flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="probe_gemm_configs.json")
    ap.add_argument("--budget-s", type=float, default=20.0, help="single-call timing budget per shape")
    ap.add_argument("--shapes", type=int, default=len(SHAPES), help="probe the first N shapes")
    args = ap.parse_args()
    result: dict[str, Any] = {"text_beside_image": probe_text_beside_image(), "shapes": []}
    for rows, k, n, count in SHAPES[: args.shapes]:
        result["shapes"].append(probe_shape(rows, k, n, count, args.budget_s))
        result["saving_ms_per_forward"] = round(sum(s["saving_ms_per_forward"] for s in result["shapes"]), 3)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What tracing costs when it is off: the CPU executor's run (with its trace points, tracing off) against
the same loop with the trace points removed, on one program, interleaved rounds, medians.

    python perf/trace_overhead.py [--runs 400] [--rounds 7] [--out perf/results/trace_overhead_cpu.json]

The program is the tiny FLUX.2 [klein] transformer of the embedded demo checkpoint (102 nodes of tiny
ops, so per-op overhead weighs as much as it ever can: a real model's ops take far longer). Also reported:
tracing on (DIF_TRACE_FILE to a temp file), to show what turning it on costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def untraced_run(exe: Any, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`ArenaExecutable.run` exactly as it was before the trace points (commit fd8307f^), the A of the A/B."""
    from dif.backend_checks import check_inputs
    from dif.interp import cast_results
    from dif_backend_cpu.executor import _out_of_memory, _read_only

    env = dict(exe.weights)
    for name, arr in check_inputs(exe.program, inputs, exe.backend).items():
        env[name] = _read_only(arr)
    nodes = exe.program.node_by_id
    for node_id in exe.plan.schedule:
        if node_id in exe.aliased:
            continue
        node = nodes[node_id]
        operands = [env[o] if o in env else _read_only(exe.views[o]) for o in node.operands]
        try:
            outs = cast_results(node, exe.kernels[node_id](operands, node.attrs))
        except MemoryError as exc:
            raise _out_of_memory(exe.backend, exe.program.name, f"op '{node.op}' (node {node.id})", exc) from None
        for value, out in zip(node.results, outs, strict=True):
            np.copyto(exe.views[value.name], out, casting="no")
    return {name: np.array(env[name] if name in env else exe.views[name], copy=True) for name in exe.program.outputs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400, help="runs per timing")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians over them)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    os.environ.pop("DIF_TRACE_FILE", None)
    os.environ.pop("DIF_CAPTURE", None)

    from dif.runtime import prepare
    from dif.testing.random_checkpoint import name_rng, random_weight
    from dif_frontend_flux2 import DEFAULT_CHECKPOINT
    from dif_frontend_flux2.config import load_configs
    from dif_frontend_flux2.model import build_transformer

    program = build_transformer(load_configs(DEFAULT_CHECKPOINT).transformer, batch=1, n_img=4, n_txt=8)
    weights = {
        p.name: random_weight(name_rng(p.name), p.name, p.type.shape).astype(p.type.dtype.np) for p in program.params
    }
    rng = np.random.default_rng(0)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in program.inputs}
    exe, _plan = prepare(program, weights, "cpu")
    want = untraced_run(exe, inputs)
    got = exe.run(inputs)
    assert all(np.array_equal(want[k], got[k]) for k in want), "the two loops must compute the same outputs"

    def timed(fn: Any) -> float:
        start = time.perf_counter()
        for _ in range(args.runs):
            fn(exe, inputs)
        return (time.perf_counter() - start) / args.runs * 1e6  # microseconds per run

    trace_path = Path(tempfile.mkdtemp()) / "trace.jsonl"

    def traced(e: Any, x: dict[str, np.ndarray]) -> None:
        os.environ["DIF_TRACE_FILE"] = str(trace_path)
        try:
            e.run(x)
        finally:
            os.environ.pop("DIF_TRACE_FILE")

    samples: dict[str, list[float]] = {"without_trace_points": [], "tracing_off": [], "tracing_on": []}
    for fn in (untraced_run, type(exe).run):
        timed(fn)  # warm-up
    for _ in range(args.rounds):
        samples["without_trace_points"].append(timed(untraced_run))
        samples["tracing_off"].append(timed(type(exe).run))
        samples["tracing_on"].append(timed(traced))
    med = {k: statistics.median(v) for k, v in samples.items()}
    spread = {k: (min(v), max(v)) for k, v in samples.items()}
    off_vs_none = med["tracing_off"] / med["without_trace_points"] - 1.0
    # the fastest round is the least disturbed by other work on a shared machine
    off_vs_none_min = spread["tracing_off"][0] / spread["without_trace_points"][0] - 1.0
    noise = max((hi - lo) / statistics.median(v) for (lo, hi), v in zip(spread.values(), samples.values(), strict=True))
    # the off path's added work on its own (timeit, best of 7): one `begin` per run, two `is None` per op
    import timeit

    from dif import trace

    begin_us = min(timeit.repeat(lambda: trace.begin("run", program, "cpu"), number=2000, repeat=7)) / 2000 * 1e6
    n = len(program.nodes)
    rec = None
    checks = "for _ in r:\n    s = c() if rec is not None else 0.0\n    if rec is not None: pass"
    empty = "for _ in r:\n    pass"
    ns = {"r": range(n), "rec": rec, "c": time.perf_counter}
    per_run_checks = min(timeit.repeat(checks, number=2000, repeat=7, globals=ns)) / 2000
    per_run_empty = min(timeit.repeat(empty, number=2000, repeat=7, globals=ns)) / 2000
    added_us = begin_us + max(0.0, per_run_checks - per_run_empty) * 1e6
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {
        "program": program.name,
        "nodes": len(program.nodes),
        "runs_per_sample": args.runs,
        "rounds": args.rounds,
        "us_per_run_median": {k: round(v, 2) for k, v in med.items()},
        "us_per_run_range": {k: [round(lo, 2), round(hi, 2)] for k, (lo, hi) in spread.items()},
        "tracing_off_vs_no_trace_points": round(off_vs_none, 4),
        "tracing_off_vs_no_trace_points_fastest_rounds": round(off_vs_none_min, 4),
        "largest_relative_spread": round(noise, 4),
        "off_path_added_us_per_run": round(added_us, 3),
        "off_path_begin_us": round(begin_us, 3),
        "off_path_share_of_fastest_run": round(added_us / spread["tracing_off"][0], 5),
        "measurable": abs(off_vs_none) > noise,
        "commit": commit,
        "python": sys.version.split()[0],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

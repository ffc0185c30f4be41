"""One denoiser forward at full size: diffusers eager / torch.compile vs dif (CUDA backend).

Models (perf/denoiser_models.py): FLUX.2 [klein] 4B / 9B and Krea 2, 1024x1024 (4096 image + 512 text
tokens; Krea 2 with a text padding mask: 333 valid tokens, 179 masked keys), batch 1, bf16. Seeded
random weights (diffusers' init, constant tensors perturbed) are shared: dif binds the diffusers state
dict by name, copied device to device on the GPU. Reported per model: diffusers eager, diffusers +
torch.compile (with compile seconds) and dif times (CUDA-event medians after warm-up), peak device
memory of each, cosine and rel-L2 of dif vs diffusers eager, dif's time by op; plus each variant
(Krea 2: the prompt with its padding dropped).

Usage (GPU machine, repo root; diffusers + torch present):
    python3 perf/bench_denoiser.py --models klein-4b,klein-9b,krea2 [--compile] [--iters 10]
    python3 perf/bench_denoiser.py --models krea2 --device cpu --tiny     # check the script on a CPU
Writes perf/results/bench_<model>.json after every phase (and into --out-dir / $OUT); a table last.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from denoiser_models import Case, canonical, make_case, to_numpy  # noqa: E402
from dif_device_bridge import Device  # noqa: E402

from dif.passes import optimize  # noqa: E402
from dif.plan.planner import plan_program  # noqa: E402


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-30))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a64 @ b64 / max(np.linalg.norm(a64) * np.linalg.norm(b64), 1e-300))


def compare(got: np.ndarray, refs: dict[str, np.ndarray]) -> dict[str, float]:
    out: dict[str, float] = {"finite": bool(np.isfinite(got.astype(np.float32)).all())}
    for name, ref in refs.items():
        out[f"cosine_vs_{name}"] = cosine(got, ref)
        out[f"rel_l2_vs_{name}"] = rel_l2(got, ref)
    return out


def counts(first_s: float, iters: int, budget_s: float) -> tuple[int, int]:
    """(warm-up, timed) runs: `iters` timed after 3 warm-ups when that fits `budget_s`; else as many as
    fit (at least 3), the first run (after prepare's own eager run) being the only warm-up."""
    if first_s * (iters + 3) <= budget_s:
        return 3, iters
    return 0, max(3, min(iters, int(budget_s / max(first_s, 1e-9))))


class Recorder:
    """The result dict of one model, rewritten to every destination after each phase."""

    def __init__(self, model: str, dests: list[Path], env: dict[str, Any]) -> None:
        self.path = f"bench_{model}.json"
        self.dests = dests
        self.data: dict[str, Any] = {"environment": env}

    def save(self) -> None:
        for d in self.dests:
            d.mkdir(parents=True, exist_ok=True)
            (d / self.path).write_text(json.dumps(self.data, indent=1))


def run_dif(case: Case, program: Any, inputs: dict[str, np.ndarray], dev: Device, args: argparse.Namespace,
            refs: dict[str, np.ndarray]) -> dict[str, Any]:  # fmt: skip
    """Prepare `program` on dif's backend with the diffusers weights, run, compare, time."""
    backend = dev.backend()
    t0 = time.perf_counter()
    profile = backend.profile()
    nodes_before = len(program.nodes)
    if not args.no_passes:  # the compiler's fusions, as dif.runtime.prepare applies them
        program, _decisions = optimize(program, target=profile)
    plan = plan_program(program, profile, backend.budget())
    res: dict[str, Any] = {"nodes": len(program.nodes), "nodes_before_passes": nodes_before}
    res["plan_s"] = round(time.perf_counter() - t0, 2)
    res["arena_gib"] = round(plan.arena_bytes / 2**30, 3)
    res["params_gib"] = round(plan.param_bytes / 2**30, 3)
    weights = dev.weights(program, case.model)
    free0 = dev.free_bytes()
    t0 = time.perf_counter()
    with dev.bridge():
        exe = backend.prepare(program, plan, weights)
    res["prepare_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    got = exe.run(inputs)[program.outputs[0]]
    first = time.perf_counter() - t0
    res["first_run_s"] = round(first, 3)
    res.update(compare(got, refs))
    warm, iters = counts(first, args.iters, args.budget_s)
    ms, times = dev.dif_median(exe, inputs, iters, warm)
    res.update({"ms": round(ms, 2), "times_ms": [round(t, 2) for t in times], "warmup": warm})
    res["device_gib"] = round((free0 - dev.free_bytes()) / 2**30, 2) if free0 else None
    res.update(dev.describe(exe))
    if args.profile_iters and first * args.profile_iters <= args.profile_max_s:
        res["profile_eager_ms"] = dev.profile(exe, args.profile_iters)
    del exe, weights
    gc.collect()
    return res


def bench_model(name: str, args: argparse.Namespace, dev: Device, rec: Recorder) -> dict[str, Any]:
    import torch

    out = rec.data
    t0 = time.perf_counter()
    case = make_case(name, dev.torch_device, args.tiny)
    out.update({"model": case.name, "config": case.config, "tokens": case.tokens})
    out["setup_s"] = round(time.perf_counter() - t0, 1)
    out["params_billion"] = round(sum(p.numel() for p in case.model.parameters()) / 1e9, 3)
    rec.save()
    with torch.inference_mode():
        dev.reset_peak()
        ref = case.model(**case.kwargs)[0]
        out["diffusers_eager_peak_gib"] = dev.peak_gib()
        ms, times = dev.torch_median(lambda: case.model(**case.kwargs), args.iters, 3)
    ref_np = to_numpy(ref).astype(np.float32)
    out["diffusers_eager_ms"] = round(ms, 2)
    out["diffusers_eager_times_ms"] = [round(t, 2) for t in times]
    print(f"[{case.name}] diffusers eager {ms:.2f} ms, peak {out['diffusers_eager_peak_gib']} GiB", flush=True)
    rec.save()

    out["dif"] = run_dif(case, case.program, case.inputs, dev, args, {"diffusers_eager": ref_np})
    d = out["dif"]
    print(f"[{case.name}] dif {d['ms']:.2f} ms, cosine {d['cosine_vs_diffusers_eager']:.6f}, "
          f"rel-L2 {d['rel_l2_vs_diffusers_eager']:.3e}, device {d['device_gib']} GiB", flush=True)  # fmt: skip
    rec.save()

    if args.compile:
        cmodel = torch.compile(case.model)
        with torch.inference_mode():
            dev.reset_peak()
            t0 = time.perf_counter()
            got = cmodel(**case.kwargs)[0]
            dev.sync()
            out["compile_s"] = round(time.perf_counter() - t0, 1)
            out["diffusers_compile_peak_gib"] = dev.peak_gib()
            out["diffusers_compile_vs_eager_cosine"] = cosine(to_numpy(got).astype(np.float32), ref_np)
            ms, times = dev.torch_median(lambda: cmodel(**case.kwargs), args.iters, 3)
        out["diffusers_compile_ms"] = round(ms, 2)
        out["diffusers_compile_times_ms"] = [round(t, 2) for t in times]
        print(f"[{case.name}] diffusers compile {ms:.2f} ms (compile {out['compile_s']} s)", flush=True)
        rec.save()
        cmodel = None
    if not args.no_variants:
        for v in case.variants:
            res: dict[str, Any] = {"note": v.note}
            with torch.inference_mode():
                v_ref = to_numpy(case.model(**v.kwargs)[0]).astype(np.float32)
                ms, _ = dev.torch_median(lambda v=v: case.model(**v.kwargs), args.iters, 3)
            res["diffusers_eager_ms"] = round(ms, 2)
            res["diffusers_vs_main_reference_cosine"] = cosine(v_ref, ref_np)
            res["dif"] = run_dif(case, v.program, v.inputs, dev, args,
                                 {"diffusers_eager": v_ref, "main_reference": ref_np})  # fmt: skip
            out.setdefault("variants", {})[v.name] = res
            print(f"[{case.name}:{v.name}] diffusers eager {ms:.2f} ms, dif {res['dif']['ms']:.2f} ms, "
                  f"cosine {res['dif']['cosine_vs_diffusers_eager']:.6f} "
                  f"(vs main reference {res['dif']['cosine_vs_main_reference']:.6f})", flush=True)  # fmt: skip
            rec.save()

    case.model = None
    gc.collect()
    dev.empty_cache()
    return out


def table(rows: list[dict[str, Any]]) -> None:
    print(
        "\nmodel             diffusers eager  diffusers compile  dif (CUDA)   dif cosine  dif rel-L2"
        "   peak GiB eager/compile/dif"
    )
    for r in rows:
        d = r.get("dif", {})
        comp = r.get("diffusers_compile_ms", float("nan"))
        peaks = [r.get("diffusers_eager_peak_gib"), r.get("diffusers_compile_peak_gib"), d.get("device_gib")]
        print(
            f"{r['model']:17} {r.get('diffusers_eager_ms', float('nan')):>12.2f} ms {comp:>14.2f} ms"
            f" {d.get('ms', float('nan')):>9.2f} ms  {d.get('cosine_vs_diffusers_eager', float('nan')):.6f}"
            f"  {d.get('rel_l2_vs_diffusers_eager', float('nan')):.2e}   {peaks}"
        )
        for vname, v in r.get("variants", {}).items():
            vd = v["dif"]
            print(
                f"  {vname:15} {v['diffusers_eager_ms']:>12.2f} ms {'':>17} {vd['ms']:>9.2f} ms"
                f"  {vd['cosine_vs_diffusers_eager']:.6f}  {vd['rel_l2_vs_diffusers_eager']:.2e}"
                f"   (vs masked reference: cosine {vd['cosine_vs_main_reference']:.6f})"
            )


def main(argv: list[str] | None = None, default_models: str = "klein-4b") -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=default_models, help="comma-separated: klein-4b, klein-9b, krea2")
    ap.add_argument("--iters", type=int, default=10, help="timed runs (fewer for dif when one forward is slow)")
    ap.add_argument("--budget-s", type=float, default=30.0, help="seconds of timed dif runs per program, at most")
    ap.add_argument("--profile-iters", type=int, default=1, help="eager runs for dif's time by op (0: skip)")
    ap.add_argument("--profile-max-s", type=float, default=3.0, help="skip the time by op when it costs more")
    ap.add_argument("--compile", action="store_true", help="also time diffusers under torch.compile")
    ap.add_argument("--no-passes", action="store_true", help="skip dif's optimizer passes (fusions)")
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: torch CPU + dif CPU backend")
    ap.add_argument("--tiny", action="store_true", help="miniature configs (check the script, no timing value)")
    ap.add_argument("--out-dir", default=os.environ.get("OUT"), help="second destination of the JSON")
    args = ap.parse_args(argv)
    import diffusers
    import torch

    dev = Device(args.device)
    env = {"torch": torch.__version__, "diffusers": diffusers.__version__, "device": dev.name(),
           "python": platform.python_version(), "tiny": args.tiny}  # fmt: skip
    dests = [Path("perf/results")] + ([Path(args.out_dir)] if args.out_dir else [])
    if args.tiny:
        dests = [Path(args.out_dir or "/tmp/bench_denoiser")]
    rows = []
    for name in args.models.split(","):
        model = canonical(name)
        rec = Recorder(model, dests, env)
        try:
            rows.append(bench_model(model, args, dev, rec))
        except Exception as exc:
            rec.data["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            rec.save()
            raise
    table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

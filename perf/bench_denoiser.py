"""One denoiser forward at full size: diffusers eager / torch.compile vs dif (CUDA backend).

Models (perf/denoiser_models.py): FLUX.2 [klein] 4B / 9B and Krea 2, 1024x1024 (4096 image + 512 text
tokens; Krea 2 with a text padding mask: 333 valid tokens, 179 masked keys), batch 1, bf16. Seeded
random weights (diffusers' init, constant tensors perturbed) are shared: dif binds the diffusers state
dict by name, copied device to device on the GPU. Reported per model: diffusers eager, diffusers +
torch.compile (with compile seconds) and dif times (CUDA-event medians after warm-up), peak device
memory of each, cosine and rel-L2 of dif vs diffusers eager, dif's time by op; plus each variant
(Krea 2: the prompt with its padding dropped). Ratios dif/eager and dif/compile (below 1: dif is faster).

`--vram-budget 12GB` (klein 9B; `--vram-budget-models`): dif's optimized program planned again under a
RuntimeBudget of that much free memory, so the planner streams weight blocks; its time, device memory,
streamed parameters and output vs the unbudgeted dif output go into the JSON's `dif_budget`.
`--pipeline` (klein 9B; `--pipeline-models`): prompt -> PNG, 4 steps, 1024x1024, diffusers' pipeline (eager,
and compiled with --compile) vs dif's on the same random weights, per stage (perf/pipeline_wall.py), then one
`dif flux2 generate --json` run in a fresh process on the embedded demo model.

Usage (GPU machine, repo root; diffusers + torch present):
    python3 perf/bench_denoiser.py --models klein-9b,klein-4b --compile --iters 10 --vram-budget 12GB --pipeline
    python3 perf/bench_denoiser.py --models krea2 --device cpu --tiny     # check the script on a CPU
    python3 perf/bench_denoiser.py --models klein-9b --device cpu --tiny --vram-budget 12GB --pipeline \
        --compile --compile-backend eager                                 # every phase, on a CPU
Writes perf/results/bench_<model>.json after every phase (and into --out-dir / $OUT); a table last.
With --tiny the budget is scaled to the miniature (see `budget_cap`) and the JSON goes to --out-dir only.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from denoiser_models import Case, canonical, make_case, to_numpy  # noqa: E402
from dif_device_bridge import Device  # noqa: E402

from dif.errors import PlanError  # noqa: E402
from dif.passes import optimize  # noqa: E402
from dif.plan.plan import Plan  # noqa: E402
from dif.plan.planner import plan_program  # noqa: E402
from dif.target import RuntimeBudget  # noqa: E402

T_START = time.perf_counter()
# Rough seconds an optional phase needs on the H200 (klein 9B); with --deadline-s a phase that would end past
# the deadline is skipped and says so in the JSON, so the device call ends with every result it has.
NEED_S = {"budget": 45.0, "pipeline": 150.0, "cli": 60.0}


def time_left(args: argparse.Namespace) -> float:
    """Seconds until --deadline-s (counted from the script's start); infinite without one."""
    return args.deadline_s - (time.perf_counter() - T_START) if args.deadline_s > 0 else float("inf")


def skip_reason(args: argparse.Namespace, phase: str) -> str | None:
    """Why `phase` is skipped (too little time before --deadline-s), or None to run it."""
    left, need = time_left(args), NEED_S[phase]
    return None if left >= need else f"skipped: {left:.0f} s left before --deadline-s, {phase} needs ~{need:.0f} s"


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
            refs: dict[str, np.ndarray], cap: int | None = None) -> tuple[dict[str, Any], np.ndarray]:  # fmt: skip
    """Prepare `program` on dif's backend with the diffusers weights, run, compare, time; returns (the result,
    dif's output). `cap`: plan under a RuntimeBudget of that much free device memory (the backend's own
    workspace kept), so the planner streams the weight blocks that do not fit."""
    backend = dev.backend()
    t0 = time.perf_counter()
    profile = backend.profile()
    nodes_before = len(program.nodes)
    if not args.no_passes:  # the compiler's fusions, as dif.runtime.prepare applies them
        program, _decisions = optimize(program, target=profile)
    budget = backend.budget()
    if cap is not None:
        budget = attrs.evolve(budget, free_memory_bytes=cap)
    plan = plan_program(program, profile, budget)
    res: dict[str, Any] = {"nodes": len(program.nodes), "nodes_before_passes": nodes_before}
    res["plan_s"] = round(time.perf_counter() - t0, 2)
    res["arena_gib"] = round(plan.arena_bytes / 2**30, 3)
    res["params_gib"] = round(plan.param_bytes / 2**30, 3)
    res["arena_bytes"], res["param_bytes"] = plan.arena_bytes, plan.param_bytes
    if cap is not None:
        res["residency"] = residency(program, plan, budget)
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
    if cap is not None and free0:
        res["within_cap"] = free0 - dev.free_bytes() <= cap
    res.update(dev.describe(exe))
    if args.profile_iters and first * args.profile_iters <= args.profile_max_s:
        try:  # a by-op profile is a bonus: its failure must not lose the timing above
            res["profile_eager_ms"] = dev.profile(exe, args.profile_iters)
            res["profile_eager_by_shape"] = dev.profile(exe, args.profile_iters, by="shape")
        except Exception as exc:
            res["profile_error"] = f"{type(exc).__name__}: {exc}"[:1000]
    del exe, weights
    gc.collect()
    return res, np.asarray(got)


def residency(program: Any, plan: Plan, budget: RuntimeBudget) -> dict[str, Any]:
    """What the planner decided under a memory budget: streamed parameters and bytes, staging, and its
    admission arithmetic (the `residency:` decision) as text."""
    sizes = {p.name: p.type.nbytes for p in program.params}
    streamed = plan.streamed
    decision = next((d for d in plan.decisions if d.what.startswith("residency:")), None)
    return {
        "budget": budget.to_dict(),
        "params": len(sizes),
        "streamed_params": len(streamed),
        "streamed_bytes": sum(sizes[n] for n in streamed),
        "resident_bytes": plan.resident_bytes,
        "staging_bytes": plan.staging_bytes,
        "min_memory_bytes": plan.binding.min_memory_bytes,
        "decision": f"{decision.what}: {decision.why}" if decision else None,
    }


def budget_cap(args: argparse.Namespace, case: Case, dev: Device, dif: dict[str, Any]) -> tuple[int, str]:
    """(cap in bytes, how it was chosen). Full size: --vram-budget as given. --tiny: a miniature fits any real
    budget, so the cap is the smallest at which the planner still finds a plan that streams, searched over
    workspace + arena + 5 %, 10 %, ... of the weights (what the run is there to exercise)."""
    if not args.tiny:
        return args.vram_budget, f"--vram-budget {args.vram_budget_text}"
    backend = dev.backend()
    profile, budget = backend.profile(), backend.budget()
    program = case.program if args.no_passes else optimize(case.program, target=profile)[0]
    for pct in range(5, 100, 5):
        cap = budget.workspace_bytes + dif["arena_bytes"] + dif["param_bytes"] * pct // 100
        try:
            plan = plan_program(program, profile, attrs.evolve(budget, free_memory_bytes=cap))
        except PlanError:
            continue
        if plan.streamed:
            return cap, f"tiny: workspace + arena + {pct} % of the weights, the smallest cap that plans"
    return args.vram_budget, "tiny: no smaller cap plans; --vram-budget as given"


def run_budget(case: Case, dev: Device, args: argparse.Namespace, dif: dict[str, Any],
               unbudgeted: np.ndarray) -> dict[str, Any]:  # fmt: skip
    """The dif run again under --vram-budget (`dif`, `unbudgeted`: the result and output of the run without);
    failures are recorded, not raised (the rest still runs)."""
    cap, how = budget_cap(args, case, dev, dif)
    res: dict[str, Any] = {"vram_budget": args.vram_budget_text, "cap_bytes": cap, "cap_gib": round(cap / 2**30, 3),
                           "cap_rule": how}  # fmt: skip
    try:
        run, got = run_dif(case, case.program, case.inputs, dev, args, {"dif_unbudgeted": unbudgeted}, cap=cap)
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"[:3000]
        gc.collect()
        dev.empty_cache()
        return res
    res.update(run)
    diff = np.abs(got.astype(np.float32) - unbudgeted.astype(np.float32))
    res["max_abs_vs_dif_unbudgeted"] = float(diff.max())
    res["identical_to_dif_unbudgeted"] = bool(np.array_equal(got.view(np.uint8), unbudgeted.view(np.uint8)))
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

    out["dif"], dif_out = run_dif(case, case.program, case.inputs, dev, args, {"diffusers_eager": ref_np})
    d = out["dif"]
    print(f"[{case.name}] dif {d['ms']:.2f} ms, cosine {d['cosine_vs_diffusers_eager']:.6f}, "
          f"rel-L2 {d['rel_l2_vs_diffusers_eager']:.3e}, device {d['device_gib']} GiB", flush=True)  # fmt: skip
    out["ratios"] = ratios(out)
    rec.save()

    if args.vram_budget is not None and name in args.vram_budget_models:
        reason = skip_reason(args, "budget")
        out["dif_budget"] = {"skipped": reason} if reason else run_budget(case, dev, args, d, dif_out)
        print(f"[{case.name}] {budget_line(out['dif_budget'], d)}", flush=True)
        rec.save()
    del dif_out

    cmodel = None
    if args.compile:
        cmodel = torch.compile(case.model, backend=args.compile_backend)
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
        out["compile_backend"] = args.compile_backend
        out["ratios"] = ratios(out)
        print(f"[{case.name}] diffusers compile {ms:.2f} ms (compile {out['compile_s']} s)", flush=True)
        rec.save()
    if not args.no_variants:
        for v in case.variants:
            res: dict[str, Any] = {"note": v.note}
            with torch.inference_mode():
                v_ref = to_numpy(case.model(**v.kwargs)[0]).astype(np.float32)
                ms, _ = dev.torch_median(lambda v=v: case.model(**v.kwargs), args.iters, 3)
            res["diffusers_eager_ms"] = round(ms, 2)
            res["diffusers_vs_main_reference_cosine"] = cosine(v_ref, ref_np)
            res["dif"], _ = run_dif(case, v.program, v.inputs, dev, args,
                                    {"diffusers_eager": v_ref, "main_reference": ref_np})  # fmt: skip
            out.setdefault("variants", {})[v.name] = res
            print(f"[{case.name}:{v.name}] diffusers eager {ms:.2f} ms, dif {res['dif']['ms']:.2f} ms, "
                  f"cosine {res['dif']['cosine_vs_diffusers_eager']:.6f} "
                  f"(vs main reference {res['dif']['cosine_vs_main_reference']:.6f})", flush=True)  # fmt: skip
            rec.save()

    if args.pipeline and name in args.pipeline_models:
        reason = skip_reason(args, "pipeline")
        if reason:
            out["pipeline"] = {"skipped": reason}
        else:
            import pipeline_wall

            # the bench's transformer (and its compiled wrapper) when it is the pipeline's: full size only
            same = case.config == pipeline_wall.klein_configs(name, args.tiny)["transformer"]

            def save_pipeline(result: dict[str, Any]) -> None:
                out["pipeline"] = result
                rec.save()

            try:
                pipeline_wall.bench_pipeline(name, dev, args, case.model if same else None,
                                             cmodel if same else None, save_pipeline)  # fmt: skip
            except Exception as exc:  # the denoiser results stand; say what broke
                out.setdefault("pipeline", {})["error"] = f"{type(exc).__name__}: {exc}"[:3000]
                print(f"[{case.name}] pipeline failed: {out['pipeline']['error'][:500]}", flush=True)
        rec.save()

    cmodel = None
    case.model = None
    gc.collect()
    dev.empty_cache()
    return out


def ratios(out: dict[str, Any]) -> dict[str, float | None]:
    """dif time / diffusers time, eager and compiled (below 1: dif is faster)."""
    dif = out.get("dif", {}).get("ms")
    res: dict[str, float | None] = {}
    for kind in ("eager", "compile"):
        ref = out.get(f"diffusers_{kind}_ms")
        res[f"dif_over_{kind}"] = round(dif / ref, 3) if dif and ref else None
    return res


def budget_line(b: dict[str, Any], dif: dict[str, Any]) -> str:
    """One line for the --vram-budget run (`dif`: the unbudgeted run)."""
    head = f"vram budget {b.get('vram_budget')} (cap {_size(b.get('cap_bytes'))})"
    if "skipped" in b or "error" in b:
        return f"{head}: {b.get('skipped') or b.get('error', '')[:300]}"
    r = b.get("residency", {})
    slower = b["ms"] / dif["ms"] if dif.get("ms") else float("nan")
    return (
        f"{head}: {b['ms']:.2f} ms ({slower:.2f}x unbudgeted), device {b['device_gib']} GiB"
        f"{'' if b.get('within_cap', True) else ' OVER THE CAP'}, streamed {r.get('streamed_params')} of"
        f" {r.get('params')} params ({_size(r.get('streamed_bytes'))}), staging {_size(r.get('staging_bytes'))},"
        f" graph {b.get('graph')}; vs unbudgeted dif: max abs"
        f" {b['max_abs_vs_dif_unbudgeted']:.3g}, cosine {b['cosine_vs_dif_unbudgeted']:.6f}"
        f"{' (identical)' if b.get('identical_to_dif_unbudgeted') else ''}"
    )


def stage_text(run: dict[str, Any]) -> str:
    """'1.234 s [encode 0.050 | steps 0.17 0.17 0.17 0.17 | decode 0.090 | png 0.170]' of a pipeline run."""
    if "stages_s" not in run:
        return run.get("error", run.get("skipped", "not run"))[:300]
    st = run["stages_s"]
    steps = " ".join(f"{st[k]:.3f}" for k in sorted(st) if k.startswith("step_"))
    decode = st.get("decode", 0.0) + st.get("to_pixels", 0.0)  # diffusers: VAE, then to PIL pixels
    peak = run.get("peak_gib", run.get("device_gib"))
    return (
        f"{run['total_s']:.3f} s [encode {st['encode']:.3f} | steps {steps} | decode {decode:.3f} | png"
        f" {st['png']:.3f}], {peak} GiB"
    )


def pipeline_lines(p: dict[str, Any]) -> list[str]:
    if "skipped" in p or "diffusers_eager" not in p:
        return [f"  pipeline: {p.get('skipped') or p.get('error', 'not run')[:300]}"]
    lines = [f"  pipeline {p['size']}x{p['size']}, {p['steps']} steps, prompt -> PNG (warm, medians):"]
    for key in ("diffusers_eager", "diffusers_compile", "dif"):
        if key in p:
            lines.append(f"    {key.replace('_', ' '):17} {stage_text(p[key])}")
    r = p.get("ratios", {})
    px = p.get("dif", {}).get("vs_diffusers_eager_pixels", {})
    lines.append(
        f"    dif/eager {r.get('dif_over_eager')}, dif/compile {r.get('dif_over_compile')}; dif pixels vs"
        f" diffusers: max abs {px.get('max_abs')}, mean abs {px.get('mean_abs')}; token ids equal"
        f" {p.get('token_ids_equal')}"
    )
    if "error" in p:
        lines.append(f"    error: {p['error'][:300]}")
    return lines


def cli_line(c: dict[str, Any]) -> str:
    report = c.get("report", {})
    timings = report.get("data", {}).get("timings_s") if isinstance(report, dict) else None
    what = c.get("error") or c.get("skipped") or f"rc {c.get('rc')}, wall {c.get('wall_s')} s, stages {timings}"
    return f"cli  dif flux2 generate ({c.get('model', '?')}, {c.get('backend', '?')}): {what}"


def table(rows: list[dict[str, Any]], cli: dict[str, Any] | None = None) -> None:
    print(
        "\nmodel             diffusers eager  diffusers compile  dif (CUDA)  dif/eager dif/compile  dif cosine"
        "  dif rel-L2   peak GiB eager/compile/dif"
    )
    for r in rows:
        d = r.get("dif", {})
        comp = r.get("diffusers_compile_ms", float("nan"))
        peaks = [r.get("diffusers_eager_peak_gib"), r.get("diffusers_compile_peak_gib"), d.get("device_gib")]
        q = r.get("ratios", {})
        print(
            f"{r['model']:17} {r.get('diffusers_eager_ms', float('nan')):>12.2f} ms {comp:>14.2f} ms"
            f" {d.get('ms', float('nan')):>9.2f} ms {_num(q.get('dif_over_eager')):>9}"
            f" {_num(q.get('dif_over_compile')):>11}"
            f"  {d.get('cosine_vs_diffusers_eager', float('nan')):.6f}"
            f"  {d.get('rel_l2_vs_diffusers_eager', float('nan')):.2e}   {peaks}"
        )
        for vname, v in r.get("variants", {}).items():
            vd = v["dif"]
            print(
                f"  {vname:15} {v['diffusers_eager_ms']:>12.2f} ms {'':>17} {vd['ms']:>9.2f} ms"
                f" {_num(vd['ms'] / v['diffusers_eager_ms']):>9} {'-':>11}"
                f"  {vd['cosine_vs_diffusers_eager']:.6f}  {vd['rel_l2_vs_diffusers_eager']:.2e}"
                f"   (vs masked reference: cosine {vd['cosine_vs_main_reference']:.6f})"
            )
        if "dif_budget" in r:
            print(f"  {budget_line(r['dif_budget'], d)}")
        if "pipeline" in r:
            print("\n".join(pipeline_lines(r["pipeline"])))
    if cli is not None:
        print(cli_line(cli))


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _size(nbytes: int | None) -> str:
    """'11.18 GiB' / '412.5 KiB': byte counts of full-size and tiny runs alike."""
    if nbytes is None:
        return "?"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def run_cli_phase(args: argparse.Namespace, dev: Device, dests: list[Path]) -> dict[str, Any]:
    """`dif flux2 generate --json` once in a fresh process on the embedded demo model, at the pipeline's
    size; written to pipeline_cli.json."""
    import pipeline_wall

    backend = "cuda" if dev.kind == "cuda" else "cpu"
    reason = skip_reason(args, "cli")
    if reason:
        res: dict[str, Any] = {"skipped": reason}
    else:
        size = pipeline_wall.TINY_SIZE if args.tiny else pipeline_wall.FULL_SIZE
        res = pipeline_wall.run_cli(Path(tempfile.gettempdir()), backend, size, args.cli_timeout_s)
    res["backend"] = backend
    for d in dests:
        d.mkdir(parents=True, exist_ok=True)
        (d / "pipeline_cli.json").write_text(json.dumps(res, indent=1))
    print(cli_line(res), flush=True)
    return res


def print_saved_table(folder: Path) -> int:
    """The table of a finished (or cut-off) run, from its JSON files: bench_*.json in the order written."""
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("bench_*.json"), key=lambda p: p.stat().st_mtime)]
    rows = [r for r in rows if "model" in r]
    cli_path = folder / "pipeline_cli.json"
    table(rows, json.loads(cli_path.read_text()) if cli_path.is_file() else None)
    return 0


def main(argv: list[str] | None = None, default_models: str = "klein-4b") -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=default_models, help="comma-separated: klein-4b, klein-9b, krea2")
    ap.add_argument("--iters", type=int, default=10, help="timed runs (fewer for dif when one forward is slow)")
    ap.add_argument("--budget-s", type=float, default=30.0, help="timed seconds per program or pipeline, at most")
    ap.add_argument("--profile-iters", type=int, default=1, help="eager runs for dif's time by op (0: skip)")
    ap.add_argument("--profile-max-s", type=float, default=3.0, help="skip the time by op when it costs more")
    ap.add_argument("--compile", action="store_true", help="also time diffusers under torch.compile")
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile backend ('eager': check the path)")
    ap.add_argument("--no-passes", action="store_true", help="skip dif's optimizer passes (fusions)")
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--vram-budget", help="also run dif planned for this much device memory: 12GB (SI) or 12GiB")
    ap.add_argument("--vram-budget-models", default="klein-9b", help="models the --vram-budget run applies to")
    ap.add_argument("--pipeline", action="store_true", help="also time prompt -> PNG (perf/pipeline_wall.py)")
    ap.add_argument("--pipeline-models", default="klein-9b", help="models the --pipeline run applies to")
    ap.add_argument("--pipeline-iters", type=int, default=3, help="timed prompt -> PNG runs of each pipeline")
    ap.add_argument("--pipeline-cli-full", action="store_true", help="also run the CLI on the saved full-size pipeline")
    ap.add_argument("--cli-timeout-s", type=float, default=150.0, help="limit of each `dif flux2 generate` run")
    ap.add_argument("--deadline-s", type=float, default=0.0, help="skip optional phases that would end later (0: none)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: torch CPU + dif CPU backend")
    ap.add_argument("--tiny", action="store_true", help="miniature configs (check the script, no timing value)")
    ap.add_argument("--out-dir", default=os.environ.get("OUT"), help="second destination of the JSON")
    ap.add_argument("--table-from", metavar="DIR", help="only print the table of the JSON files in DIR")
    args = ap.parse_args(argv)
    if args.table_from:
        return print_saved_table(Path(args.table_from))
    args.vram_budget_text = args.vram_budget
    if args.vram_budget is not None:  # parsed as the product's `dif flux2 generate --vram-budget` parses it
        from dif.cli_support import parse_byte_size
        from dif.errors import DifError

        try:
            args.vram_budget = parse_byte_size(args.vram_budget)
        except DifError as exc:
            ap.error(f"--vram-budget: {exc}")
    args.vram_budget_models = [canonical(m) for m in args.vram_budget_models.split(",")]
    args.pipeline_models = [canonical(m) for m in args.pipeline_models.split(",")]
    if args.pipeline:  # before dif loads its plugins: the CLI and dif's pipeline find backends by entry point
        import pipeline_wall

        added = pipeline_wall.ensure_entry_points(Path(__file__).resolve().parents[1],
                                                  Path(tempfile.gettempdir()) / "dif_entry_points")  # fmt: skip
        if added:
            print(f"entry points made visible for this run: {', '.join(added)}", flush=True)
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
    cli = run_cli_phase(args, dev, dests) if args.pipeline else None
    table(rows, cli)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

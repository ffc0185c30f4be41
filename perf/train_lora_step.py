"""One LoRA training step of FLUX.2 [klein] 9B at 1024x1024: dif (CUDA backend, one step program:
forward + MSE flow-matching loss + backward + clipping + AdamW) vs torch/diffusers+peft on the same
random bf16 weights, LoRA factors and batch, in the same process.

LoRA: rank 16 (alpha 16) on every attention projection (double blocks: to_q/k/v, to_out.0, add_q/k/v_proj,
to_add_out; single blocks: to_qkv_mlp_proj, attn.to_out). Both sides keep fp32 LoRA factors (master
weights) and compute in bf16 (torch: autocast; dif: the factors cast to bf16 in the program); B starts
random (not zero) so every factor has a gradient at step one. Reported: median step time (CUDA events
after warm-up) and peak device memory of each side; the first step's LoRA gradients of dif vs torch
(cosine over all factors together and the worst single factor); the planned peak of dif's step program
with and without per-block recompute; the loss of both. The issue's goal: dif <= 0.8x torch's time at
<= its memory, gradient cosine >= 0.999.

Usage (GPU machine, repo root, after `source perf/h200_env.sh`; diffusers + peft wheels carried):
    python3 perf/train_lora_step.py --iters 5 --out-dir "$OUT"
    python3 perf/train_lora_step.py --device cpu --tiny          # check the script on a CPU (minutes)
Writes train_lora_step.json (into --out-dir, and perf/results/ unless --tiny); a table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from denoiser_models import make_case  # noqa: E402
from dif_device_bridge import Device  # noqa: E402

RANK, ALPHA = 16, 16.0
TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
           "to_qkv_mlp_proj", "attn.to_out")  # fmt: skip
LR = 1e-4


def lora_modules(model: Any) -> list[str]:
    from dif.train.lora import match_targets

    linears = [n for n, m in model.named_modules() if type(m).__name__ == "Linear"]
    return match_targets(linears, TARGETS)


def factors(model: Any, modules: list[str], seed: int) -> dict[str, np.ndarray]:
    from dif.lora.slots import slot_inputs

    rng = np.random.default_rng(seed)
    mods = dict(model.named_modules())
    out = {}
    for m in modules:
        o, i = mods[m].weight.shape
        down, up = slot_inputs(m)
        out[down] = (rng.uniform(-1, 1, (RANK, i)) / np.sqrt(i)).astype(np.float32)
        out[up] = (rng.standard_normal((o, RANK)) * 1e-3).astype(np.float32)
    return out


def torch_step(dev: Device, case: Any, modules: list[str], init: dict[str, np.ndarray], target: np.ndarray,
               iters: int, warm: int) -> dict[str, Any]:  # fmt: skip
    import peft
    import torch

    from dif.lora.slots import slot_inputs

    model = peft.get_peft_model(case.model, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=modules))
    named = dict(model.named_modules())
    params = []
    for m in modules:
        layer = named[f"base_model.model.{m}"]
        down, up = slot_inputs(m)
        a, b = layer.lora_A["default"], layer.lora_B["default"]
        a.weight.data = torch.from_numpy(init[down]).to(dev.torch_device)
        b.weight.data = torch.from_numpy(init[up]).to(dev.torch_device)
        params += [a.weight, b.weight]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=1e-2)
    tgt = torch.from_numpy(target).to(dev.torch_device)

    def step(first: list[Any] | None = None) -> float:
        opt.zero_grad(set_to_none=True)
        with torch.enable_grad(), torch.autocast(dev.torch_device, dtype=torch.bfloat16):
            pred = model(**case.kwargs)[0]
            loss = torch.mean((pred.float() - tgt) ** 2)
        loss.backward()
        if first is not None:
            first.extend(p.grad.detach().float().cpu().numpy().copy() for p in params)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return float(loss.detach())

    grads: list[Any] = []
    dev.reset_peak()
    loss = step(grads)
    ms, times = dev.torch_median(step, iters, warm)
    names = [n for m in modules for n in slot_inputs(m)]
    return {
        "ms": ms,
        "times_ms": times,
        "peak_gib": dev.peak_gib(),
        "loss": loss,
        "grads": dict(zip(names, grads, strict=True)),
    }


def dif_programs(case: Any, modules: list[str], checkpoint: bool) -> tuple[Any, Any, list[str]]:
    """(step programs, gradient program, trainable names) of the LoRA'd klein at the case's token counts."""
    from dif.autodiff import grad_program
    from dif.lora.slots import lora_slots, slot_inputs
    from dif.train import AdamW, build_step_programs, training_forward
    from dif_frontend_flux2.config import Flux2TransformerConfig
    from dif_frontend_flux2.model import build_transformer

    cfg = Flux2TransformerConfig.from_dict(case.config)
    with lora_slots({f"{m}.weight": RANK for m in modules}):
        fwd = build_transformer(cfg, batch=1, n_img=case.tokens["image"], n_txt=case.tokens["text"], dtype="bf16")
    trainable = [n for m in modules for n in slot_inputs(m)]
    scales = {slot_inputs(m)[1]: ALPHA / RANK for m in modules}
    blocks = ("transformer_blocks.*", "single_transformer_blocks.*") if checkpoint else ()
    step = build_step_programs(
        fwd, trainable, opt=AdamW(lr=LR, weight_decay=1e-2), max_grad_norm=1.0, scales=scales, checkpoint=blocks
    )
    train_fwd = training_forward(fwd, trainable, scales=scales)
    grads = grad_program(train_fwd, trainable, loss=train_fwd.outputs[0])
    return step, grads, trainable


def _base(model: Any) -> Any:
    return model.base_model.model if hasattr(model, "base_model") else model


def dif_step(dev: Device, case: Any, modules: list[str], init: dict[str, np.ndarray], target: np.ndarray,
             iters: int, warm: int, checkpoint: bool, profile: int = 0) -> dict[str, Any]:  # fmt: skip
    from dif.runtime import prepare
    from dif.train.optim import BC1, BC2, GRAD_SCALE, moment_names
    from dif.train.optim import LR as LR_INPUT
    from dif.train.schedule import AdamW, bias_corrections
    from dif.train.step import TARGET

    t0 = time.perf_counter()
    step, grad, trainable = dif_programs(case, modules, checkpoint)
    build_s = time.perf_counter() - t0
    backend = dev.backend()
    with dev.bridge():  # legalized and optimized as `dif train` runs it (dif.runtime.prepare)
        t1 = time.perf_counter()
        weights = dev.weights(step.step, _base(case.model))
        exe, plan = prepare(step.step, weights, backend, decisions=step.grad.decisions)
        prepare_s = time.perf_counter() - t1
    bc1, bc2 = bias_corrections(AdamW(lr=LR), 0)
    scalars = {LR_INPUT: LR, BC1: bc1, BC2: bc2, GRAD_SCALE: 1.0}
    feed = {**case.inputs, TARGET: target, **init, **{k: np.array([v], np.float32) for k, v in scalars.items()}}
    for n in trainable:
        for m in moment_names(n):
            feed[m] = np.zeros(init[n].shape, np.float32)
    dev.reset_peak()
    out = exe.run(feed)
    loss = float(out[step.outputs["loss"]])
    ms, times = dev.dif_median(exe, feed, iters, warm)
    result: dict[str, Any] = {
        "ms": ms, "times_ms": times, "loss": loss, "planned_peak_gib": round(plan.peak_bytes / 2**30, 2),
        "planned_total_gib": round(plan.binding.min_memory_bytes / 2**30, 2),
        "planned_peak_bytes": plan.peak_bytes, "planned_total_bytes": plan.binding.min_memory_bytes,
        "device_free_after_gib": round(dev.free_bytes() / 2**30, 2), "build_s": round(build_s, 2),
        "prepare_s": round(prepare_s, 2), "nodes": len(step.step.nodes), "executable": dev.describe(exe),
        "recomputed_blocks": sum(1 for d in step.grad.decisions if d.what.startswith("checkpoint:")),
        "fused_attention_backward_nodes": step.step.op_histogram().get("sdpa_backward", 0),
        "legalized": [d.what for d in plan.decisions if d.what.startswith("legalize:")],
    }  # fmt: skip
    if profile:  # where the step's device time goes: by op, and the `profile` costliest op / shape / lowerings
        result["profile_by_op"] = dev.profile(exe, 1)
        result["profile_by_shape"] = dict(list(dev.profile(exe, 1, by="shape").items())[:profile])
    del exe
    dev.empty_cache()
    if not checkpoint:  # the first step's gradients, from the gradient program on the same inputs
        with dev.bridge():
            gweights = dev.weights(grad.program, _base(case.model))
            gexe, _ = prepare(grad.program, gweights, backend, decisions=grad.decisions)
        gout = gexe.run({**case.inputs, TARGET: target, **init})
        result["grads"] = {n: np.asarray(gout[grad.gradients[n]], np.float32) for n in trainable}
        del gexe
        dev.empty_cache()
    return result


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--no-checkpoint-variant", action="store_true", help="skip the per-block recompute variant")
    ap.add_argument("--profile", type=int, default=0, help="record the step's time by op and its N costliest shapes")
    args = ap.parse_args()
    dev = Device(args.device)
    report: dict[str, Any] = {
        "model": "klein-9b",
        "tiny": args.tiny,
        "rank": RANK,
        "alpha": ALPHA,
        "device": dev.name(),
    }
    case = make_case("klein-9b", dev.torch_device, args.tiny)
    modules = lora_modules(case.model)
    init = factors(case.model, modules, seed=3)
    out_shape = (1, case.tokens["image"], case.config["in_channels"])
    target = np.random.default_rng(4).standard_normal(out_shape).astype(np.float32)
    report["lora_modules"] = len(modules)
    phases = [("dif", False)] + ([] if args.no_checkpoint_variant else [("dif_recompute", True)])
    for label, ckpt in phases:
        try:
            report[label] = dif_step(dev, case, modules, init, target, args.iters, args.warm, ckpt, args.profile)
        except Exception as exc:  # a phase that fails is reported, the others still run
            report[label] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    try:
        report["torch"] = torch_step(dev, case, modules, init, target, args.iters, args.warm)
    except Exception as exc:
        report["torch"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    dg, tg = report.get("dif", {}).pop("grads", None), report.get("torch", {}).pop("grads", None)
    if dg is not None and tg is not None:
        names = sorted(dg)
        report["grad_cosine_all"] = cosine(
            np.concatenate([dg[n].ravel() for n in names]), np.concatenate([tg[n].ravel() for n in names])
        )
        per = {n: cosine(dg[n], tg[n]) for n in names}
        report["grad_cosine_worst"] = min(per.values())
        report["grad_cosine_worst_factor"] = min(per, key=per.get)  # type: ignore[arg-type]
    if "ms" in report.get("dif", {}) and "ms" in report.get("torch", {}):
        report["time_ratio_dif_over_torch"] = round(report["dif"]["ms"] / report["torch"]["ms"], 3)
    text = json.dumps(report, indent=2, default=float)
    for folder in [args.out_dir] + ([] if args.tiny else [Path(__file__).resolve().parent / "results"]):
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "train_lora_step.json").write_text(text)
    rows = [("side", "ms/step", "peak GiB", "loss")]
    for label in ("torch", "dif", "dif_recompute"):
        r = report.get(label, {})
        rows.append((label, f"{r.get('ms', float('nan')):.1f}", str(r.get("peak_gib", r.get("planned_peak_gib", "-"))),
                     str(r.get("loss", r.get("error", "-")))[:60]))  # fmt: skip
    for row in rows:
        print(" | ".join(f"{c:>14}" for c in row))
    print("grad cosine all / worst:", report.get("grad_cosine_all"), report.get("grad_cosine_worst"),
          "time ratio:", report.get("time_ratio_dif_over_torch"))  # fmt: skip


if __name__ == "__main__":
    main()

"""The optimizer half of a training step against torch: AdamW (weight decay, bias correction), global-norm
clipping and gradient accumulation over micro-batches, on a tiny linear model in fp32, several steps;
the warm-up + cosine schedule; bf16 compute with fp32 master weights; the loss-curve PNG."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import pytest

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.layers import linear
from dif.train import AdamW, LrSchedule, Trainer, build_step_programs
from dif.train.step import TARGET, StepPrograms, training_forward

IN, OUT, ROWS = 6, 3, 8


def _forward(dtype: str = "f32") -> Program:
    b = ProgramBuilder("lin")
    x = b.input("x", (ROWS, IN), dtype)
    with b.scope(module="m", block="lin"):
        y = b.emit("silu", linear(b, x, "lin", OUT, bias=True))
    b.output(y)
    return b.build()


class _Task:
    def __init__(self, progs: StepPrograms, batches: list[dict[str, np.ndarray]]) -> None:
        self.progs, self.batches, self.model_key = progs, batches, "lin"

    def programs(self, key: Hashable) -> StepPrograms:
        return self.progs

    def micro_batch(self, rng: np.random.Generator, data: dict[str, Any]) -> tuple[Hashable, dict[str, np.ndarray]]:
        i = int(data.get("position", 0))
        data["position"] = i + 1
        return "k", self.batches[i % len(self.batches)]


def _batches(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        {
            "x": rng.standard_normal((ROWS, IN)).astype(np.float32),
            TARGET: rng.standard_normal((ROWS, OUT)).astype(np.float32),
        }
        for _ in range(n)
    ]


@pytest.mark.parametrize("accumulate,max_norm", [(1, None), (1, 0.05), (3, 0.05)])
def test_adamw_clipping_and_accumulation_match_torch(accumulate: int, max_norm: float | None) -> None:
    torch = pytest.importorskip("torch", reason="the optimizer oracle is torch.optim.AdamW")
    opt = AdamW(lr=3e-2, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1)
    sched = LrSchedule(opt.lr, total=5, warmup=2)
    fwd = _forward()
    progs = build_step_programs(
        fwd, ["lin.weight", "lin.bias"], opt=opt, max_grad_norm=max_norm, accumulate_steps=accumulate
    )
    assert (progs.micro is not None) == (accumulate > 1)
    rng = np.random.default_rng(1)
    init = {
        "lin.weight": rng.standard_normal((OUT, IN)).astype(np.float32) * 0.5,
        "lin.bias": rng.standard_normal(OUT).astype(np.float32) * 0.1,
    }
    batches = _batches(accumulate * 5)
    tr = Trainer(_Task(progs, batches), {}, dict(init), opt, sched, accumulate=accumulate, backend="cpu")
    tr.run(5)

    lin = torch.nn.Linear(IN, OUT)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(init["lin.weight"]))
        lin.bias.copy_(torch.from_numpy(init["lin.bias"]))
    topt = torch.optim.AdamW(
        lin.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay
    )
    tsched = torch.optim.lr_scheduler.LambdaLR(topt, lambda s: sched.at(s) / opt.lr)
    losses = []
    for step in range(5):
        topt.zero_grad()
        total = 0.0
        for i in range(accumulate):
            batch = batches[step * accumulate + i]
            with torch.enable_grad():
                y = torch.nn.functional.silu(lin(torch.from_numpy(batch["x"])))
                loss = torch.mean((y - torch.from_numpy(batch[TARGET])) ** 2)
                (loss / accumulate).backward()
            total += float(loss.detach()) / accumulate
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(lin.parameters(), max_norm)
        topt.step()
        tsched.step()
        losses.append(total)
    np.testing.assert_allclose(tr.params["lin.weight"], lin.weight.detach().numpy(), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(tr.params["lin.bias"], lin.bias.detach().numpy(), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(tr.losses, losses, rtol=1e-5)
    assert not np.allclose(tr.params["lin.weight"], init["lin.weight"], atol=1e-3)


def test_lr_schedule_warms_up_then_decays_by_cosine() -> None:
    s = LrSchedule(1.0, total=12, warmup=2, min_ratio=0.1)
    lrs = [s.at(i) for i in range(12)]
    assert lrs[0] == pytest.approx(0.5) and lrs[1] == pytest.approx(1.0) and lrs[2] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:], strict=False))
    assert s.at(12) == pytest.approx(0.1)
    assert LrSchedule(2.0, total=5, cosine=False).at(4) == 2.0


def test_bf16_compute_keeps_fp32_master_weights() -> None:
    fwd = _forward("bf16")
    prog = training_forward(fwd, ["lin.weight"], master_dtype="f32")
    types = {v.name: v.type for v in prog.inputs}
    assert types["lin.weight"].dtype == DType.F32
    assert any(n.op == "cast" and n.operands == ("lin.weight",) and n.attrs["dtype"] == "bf16" for n in prog.nodes)
    progs = build_step_programs(fwd, ["lin.weight"], opt=AdamW(lr=1e-2))
    out_types = {name: progs.step.types[value] for name, value in progs.outputs.items()}
    assert out_types["lin.weight"].dtype == DType.F32 and out_types["adam.m.lin.weight"].dtype == DType.F32
    assert [p.name for p in progs.step.params] == ["lin.bias"]  # frozen: a parameter, no gradient


def test_loss_curve_is_a_png(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    from dif.train.plot import write_loss_curve

    path = write_loss_curve(tmp_path / "loss.png", [5.0 - 0.1 * i + 0.3 * np.sin(i) for i in range(40)])
    with Image.open(path) as im:
        arr = np.asarray(im.convert("RGB"))
    assert arr.shape == (320, 640, 3)
    blue = (arr[..., 2] > 180) & (arr[..., 0] < 80)
    assert blue.sum() > 100
    rows = np.nonzero(blue)[0]
    cols = np.nonzero(blue)[1]
    assert rows[cols < 100].mean() < rows[cols > 540].mean()  # falls left to right: higher rows at the left

"""The training loop: runs the step programs (`dif.train.step`) on a backend, carries the state
between steps (trainable values, AdamW moments, step count, random generator, data order, losses),
and saves / resumes it as `.diftrain` (`dif.train.checkpoint`) so a resumed run is bit-identical.

What a model adds (the frontend's `train.py`): how to build the step programs for a data shape and
how to turn an encoded sample into the forward's inputs (`Task`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from attrs import define, field, frozen

from dif.errors import CheckpointError, DifError, NonFiniteError
from dif.interp import interpret
from dif.train.checkpoint import TrainState, check_shapes, load_state, save_state
from dif.train.optim import BC1, BC2, GRAD_SCALE, LR, accum_name, moment_names
from dif.train.schedule import AdamW, LrSchedule, bias_corrections
from dif.train.step import LOSS, StepPrograms

RESUME_MATCHES = {"timestep_shift": "--timestep-shift", "sampler_share": "--sampler-share"}
"""Settings a resumed run must share with its checkpoint where both record them, with the option that sets
each: the timestep shift and the share of sigmas drawn from the sampler's own decide which sigmas it trains on."""


class Task(Protocol):
    """A model's side of training: programs per data shape and the inputs of one micro-batch."""

    model_key: str

    def programs(self, key: Hashable) -> StepPrograms: ...

    def micro_batch(self, rng: np.random.Generator, data: dict[str, Any]) -> tuple[Hashable, dict[str, np.ndarray]]:
        """(shape key, forward inputs + `target`) of the next micro-batch; advances `data` (the order state)."""
        ...


@frozen
class StepReport:
    step: int
    loss: float
    grad_norm: float
    lr: float
    seconds: float


@define
class Trainer:
    task: Task
    weights: Mapping[str, np.ndarray]  # frozen parameters, bound once
    params: dict[str, np.ndarray]  # trainable values (master dtype)
    opt: AdamW
    schedule: LrSchedule
    accumulate: int = 1
    backend: str | None = None  # a dif backend name, None for the default, "interp" for the reference interpreter
    seed: int = 0
    settings: dict[str, Any] = field(factory=dict)
    step: int = 0
    moments: dict[str, np.ndarray] = field(factory=dict)
    rng: np.random.Generator = field(init=False)
    data: dict[str, Any] = field(factory=dict)
    losses: list[float] = field(factory=list)
    _executables: dict[tuple[Hashable, str], Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]] = field(
        init=False, factory=dict
    )
    plans: dict[tuple[Hashable, str], Any] = field(init=False, factory=dict)  # (shape key, program) -> Plan

    def __attrs_post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        for name, p in self.params.items():
            for m in moment_names(name):
                self.moments.setdefault(m, np.zeros(p.shape, np.float32))

    # -- programs ------------------------------------------------------------------------------
    def _runner(self, key: Hashable, which: str) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        cached = self._executables.get((key, which))
        if cached is not None:
            return cached
        progs = self.task.programs(key)
        program = progs.step if which == "step" else progs.micro
        assert program is not None
        weights = {p.name: self.weights[p.name] for p in program.params}
        if self.backend == "interp":

            def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                return interpret(program, inputs, weights)
        else:
            from dif.runtime import get_backend, prepare

            backend = get_backend(self.backend, program=program)
            grad = progs.grad if which == "step" else None
            # legalized and optimized as every program the runtime runs; the autodiff decisions first
            executable, plan = prepare(program, weights, backend, decisions=grad.decisions if grad else ())
            self.plans[(key, which)] = plan
            run = executable.run
        self._executables[(key, which)] = run
        return run

    # -- one optimizer step ----------------------------------------------------------------------
    def train_step(self) -> StepReport:
        """k micro-batches (k = `accumulate`), one AdamW update; the loss is their mean."""
        start = time.perf_counter()
        k = self.accumulate
        acc = {accum_name(n): np.zeros(p.shape, np.float32) for n, p in self.params.items()} if k > 1 else {}
        losses = []
        for i in range(k):
            key, inputs = self.task.micro_batch(self.rng, self.data)
            progs = self.task.programs(key)
            feed = {**inputs, **self.params, **acc}
            if i < k - 1:
                out = self._runner(key, "micro")(feed)
                labels = progs.micro_outputs
                acc = {accum_name(n): out[labels[accum_name(n)]] for n in self.params}
                losses.append(float(out[labels[LOSS]]))
                continue
            lr = self.schedule.at(self.step)
            bc1, bc2 = bias_corrections(self.opt, self.step)
            scalars = {LR: lr, BC1: bc1, BC2: bc2, GRAD_SCALE: 1.0 / k}
            feed.update({n: np.array([v], np.float32) for n, v in scalars.items()})
            feed.update(self.moments)
            out = self._runner(key, "step")(feed)
            labels = progs.outputs
            losses.append(float(out[labels[LOSS]]))
            grad_norm = float(out[labels["grad_norm"]])
            if not np.isfinite(grad_norm) or not all(np.isfinite(losses)):
                raise NonFiniteError(
                    f"training step {self.step}: loss {losses} / gradient norm {grad_norm} is not finite"
                )
            self.params = {n: np.array(out[labels[n]]) for n in self.params}
            self.moments = {m: np.array(out[labels[m]]) for m in self.moments}
        loss = float(np.mean(losses))
        self.losses.append(loss)
        self.step += 1
        return StepReport(self.step, loss, grad_norm, lr, time.perf_counter() - start)

    def evaluate(self, batches: Sequence[tuple[Hashable, dict[str, np.ndarray]]]) -> float:
        """Mean loss of fixed micro-batches at the current values (the step program's loss, computed
        before its update; the update is discarded), for judging a run on held data."""
        total = []
        for key, inputs in batches:
            if self.accumulate > 1:
                zeros = {accum_name(n): np.zeros(p.shape, np.float32) for n, p in self.params.items()}
                out = self._runner(key, "micro")({**inputs, **self.params, **zeros})
                total.append(float(out[self.task.programs(key).micro_outputs[LOSS]]))
                continue
            scalars = {LR: 0.0, BC1: 1.0, BC2: 1.0, GRAD_SCALE: 1.0}
            feed = {
                **inputs,
                **self.params,
                **self.moments,
                **{n: np.array([v], np.float32) for n, v in scalars.items()},
            }
            total.append(float(self._runner(key, "step")(feed)[self.task.programs(key).outputs[LOSS]]))
        return float(np.mean(total))

    def run(self, steps: int, *, on_step: Callable[[StepReport], None] | None = None,
            save_every: int = 0, save_path: Path | None = None) -> list[StepReport]:  # fmt: skip
        """Train until `steps` optimizer steps are done in total (a resumed run continues its count)."""
        reports = []
        while self.step < steps:
            report = self.train_step()
            reports.append(report)
            if on_step is not None:
                on_step(report)
            if save_every and save_path is not None and (self.step % save_every == 0 or self.step == steps):
                self.save(save_path)
        return reports

    # -- state -----------------------------------------------------------------------------------
    def state(self) -> TrainState:
        return TrainState(
            model=self.task.model_key, step=self.step, params=dict(self.params), moments=dict(self.moments),
            rng=_jsonable(self.rng.bit_generator.state), data=dict(self.data), losses=list(self.losses),
            settings=dict(self.settings),
        )  # fmt: skip

    def save(self, path: str | Path) -> Path:
        return save_state(path, self.state())

    def resume(self, path: str | Path) -> None:
        """Continue from a `.diftrain` of this model (refused, naming the file, otherwise; also when both
        record one of the `RESUME_MATCHES` settings and they differ: the resumed run would train on other
        sigmas)."""
        state = load_state(path, model=self.task.model_key)
        check_shapes(path, state, {n: p.shape for n, p in self.params.items()})
        for name, option in RESUME_MATCHES.items():
            ours, theirs = self.settings.get(name), state.settings.get(name)
            if ours is not None and theirs is not None and float(ours) != float(theirs):
                raise CheckpointError(
                    f"{path}: trained with {name.replace('_', ' ')} {theirs:g}, this run has {ours:g}",
                    hint=f"resume with {option} {theirs:g}, or leave the option out to keep the checkpoint's",
                )
        self.params = {n: state.params[n].astype(self.params[n].dtype) for n in self.params}
        self.moments = {m: state.moments[m] for m in self.moments}
        self.step, self.data, self.losses = state.step, dict(state.data), list(state.losses)
        try:
            self.rng.bit_generator.state = state.rng
        except (TypeError, ValueError, KeyError) as exc:
            raise DifError(f"{path}: random generator state is not usable ({exc})") from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.integer):
        return int(value)
    return value


def eta_seconds(reports: Sequence[StepReport], remaining: int) -> float:
    """Seconds left at the mean of the last 10 steps' time (the first step compiles: skipped when others exist)."""
    times = [r.seconds for r in reports[1:][-10:]] or [r.seconds for r in reports]
    return float(np.mean(times)) * remaining if times else 0.0

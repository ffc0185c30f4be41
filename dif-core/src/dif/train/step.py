"""A training step as DiffIR: the forward with its trainable values turned into (fp32 master) inputs,
a flow-matching MSE loss, the gradients (`dif.autodiff.grad_program`) and the optimizer update in the
same program. With gradient accumulation over k micro-batches there is a second program, `micro`,
which only adds the gradients into f32 accumulators; `step` adds the last micro-batch's and updates."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from attrs import frozen

from dif.autodiff import GradProgram, grad_program
from dif.dtypes import DType
from dif.errors import DifError
from dif.fingerprint import fingerprint
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program, Provenance
from dif.train.optim import accum_name, accumulate, adamw_step, moment_names
from dif.train.schedule import AdamW

TARGET, LOSS = "target", "loss"


def _scope(b: ProgramBuilder, prov: Provenance | None):  # type: ignore[no-untyped-def]
    p = prov or Provenance()
    return b.scope(module=p.module, block=p.block, section=p.section, tensors=p.tensors)


def training_forward(
    forward: Program,
    trainable: Sequence[str],
    *,
    master_dtype: DType | str = DType.F32,
    scales: Mapping[str, float] | None = None,
) -> Program:
    """`forward` (output 0: the prediction) rebuilt for training: each trainable parameter or input
    becomes an input of `master_dtype` under its own name (cast to its compute dtype where they differ:
    fp32 master weights, bf16 compute), the other parameters stay parameters (frozen, bound once),
    a `target` input of the prediction's shape (f32) is added, and the single output is
    loss = mean((f32(prediction) - target)^2), shape []. `scales`: a constant factor a trainable value
    is multiplied by where the forward reads it (a LoRA's alpha / rank on its up matrix)."""
    master = DType(master_dtype)
    declared = {v.name: v for v in (*forward.inputs, *forward.params)}
    missing = [t for t in trainable if t not in declared]
    if missing:
        raise DifError(f"training '{forward.name}': {', '.join(missing[:5])} are not inputs or parameters of it")
    if not trainable:
        raise DifError(f"training '{forward.name}': nothing is trainable (no LoRA targets or parameters matched)")
    chosen = set(trainable)
    b = ProgramBuilder(f"{forward.name}.train")
    b.meta.update(forward.meta)
    env: dict[str, Var] = {}
    for v in forward.inputs:
        if v.name not in chosen:
            env[v.name] = b.input(v.name, v.type.shape, v.type.dtype)
    for name in trainable:
        t = declared[name].type
        x = b.input(name, t.shape, master)
        factor = (scales or {}).get(name, 1.0)
        if factor != 1.0:
            x = b.emit("scalar_affine", x, scale=float(factor), bias=0.0)
        env[name] = x if t.dtype == master else b.emit("cast", x, dtype=t.dtype.value)
    for v in forward.params:
        if v.name not in chosen:
            env[v.name] = b.param(v.name, v.type.shape, v.type.dtype)
    for node in forward.nodes:
        with _scope(b, forward.provenance.get(node.id)):
            res = b.emit_multi(node.op, *(env[o] for o in node.operands), **node.attrs)
        env.update((r.name, v) for r, v in zip(node.results, res, strict=True))
    pred = env[forward.outputs[0]]
    with b.scope(module="train", block="loss", section="mse"):
        target = b.input(TARGET, pred.shape, DType.F32)
        p32 = pred if pred.dtype == DType.F32 else b.emit("cast", pred, dtype=DType.F32.value)
        err = b.emit("square", b.emit("sub", p32, target))
        loss = b.emit("reduce_mean", err, axes=tuple(range(len(pred.shape))))
    b.output(loss)
    b.meta["outputs"] = LOSS
    return b.build()


@frozen
class StepPrograms:
    """`step` (and `micro` when accumulating): inputs are the forward's data inputs, `target`, the
    trainable values (master dtype), `adam.m.*` / `adam.v.*`, the `opt.*` scalars and (accumulating)
    `accum.*`; `outputs` / `micro_outputs` map labels (`loss`, `grad_norm`, a trainable's name for its
    new value, `adam.m.<name>`, `accum.<name>`) to output value names."""

    step: Program
    micro: Program | None
    trainable: tuple[str, ...]
    outputs: dict[str, str]
    micro_outputs: dict[str, str]
    grad: GradProgram
    model_fingerprint: str

    @property
    def accumulating(self) -> bool:
        return self.micro is not None


def build_step_programs(
    forward: Program,
    trainable: Sequence[str],
    *,
    opt: AdamW,
    max_grad_norm: float | None = 1.0,
    accumulate_steps: int = 1,
    checkpoint: Sequence[str] = (),
    master_dtype: DType | str = DType.F32,
    scales: Mapping[str, float] | None = None,
) -> StepPrograms:
    """The training step program(s) of `forward` for the `trainable` values (see `training_forward`)."""
    if accumulate_steps < 1:
        raise DifError(f"gradient accumulation needs >= 1 micro-batches, got {accumulate_steps}")
    fwd = training_forward(forward, trainable, master_dtype=master_dtype, scales=scales)
    loss = fwd.outputs[0]
    names = tuple(trainable)

    def step_ext(b: ProgramBuilder, env, grads):  # type: ignore[no-untyped-def]
        g = accumulate(b, grads) if accumulate_steps > 1 else dict(grads)
        return adamw_step(b, opt, {n: env[n] for n in names}, g, max_norm=max_grad_norm)

    step = grad_program(fwd, names, loss=loss, checkpoint=checkpoint, extend=step_ext, name=f"{forward.name}.step")
    micro = None
    if accumulate_steps > 1:
        micro = grad_program(
            fwd, names, loss=loss, checkpoint=checkpoint, name=f"{forward.name}.micro",
            extend=lambda b, env, grads: {accum_name(n): v for n, v in accumulate(b, grads).items()},
        )  # fmt: skip
    outputs = {LOSS: step.outputs[0], **step.extra}
    micro_outputs = {} if micro is None else {LOSS: micro.outputs[0], **micro.extra}
    step_prog = step.program
    step_prog.meta["train"] = json.dumps({"trainable": list(names), "outputs": outputs}, sort_keys=True)
    return StepPrograms(
        step_prog, None if micro is None else micro.program, names, outputs, micro_outputs, step,
        model_fingerprint(forward, names),
    )  # fmt: skip


def model_fingerprint(forward: Program, trainable: Sequence[str]) -> str:
    """What a `.diftrain` checkpoint belongs to: the forward's structural fingerprint and the trainable
    values' names and shapes (a resume file of another model or another LoRA layout differs)."""
    types = forward.types
    shapes = {n: list(types[n].shape) for n in trainable}
    return f"{fingerprint(forward)}:{_hash(json.dumps(shapes, sort_keys=True))}"


def _hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = ["LOSS", "TARGET", "StepPrograms", "build_step_programs", "moment_names", "training_forward"]

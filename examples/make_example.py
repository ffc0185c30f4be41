"""Writes the example program the README runs: a two-layer MLP as DiffIR, its weights and inputs.

    x[4,16] -> linear(fc1: 32x16, bias) -> silu -> linear(fc2: 8x32, bias) -> y[4,8]
Outputs (beside this script): mlp.difir (provenance embedded), mlp-weights.safetensors,
mlp-inputs.safetensors. Deterministic: running it again gives identical files.

    python examples/make_example.py [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import dif.ops  # noqa: F401  (registers the core ops)
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.serialize.difir import save_program
from dif.serialize.diftensor import save_tensors

BATCH, D_IN, D_HIDDEN, D_OUT = 4, 16, 32, 8


def build_mlp() -> Program:
    b = ProgramBuilder("mlp", frontend_revision="examples/make_example.py")
    x = b.input("x", (BATCH, D_IN), "f32")
    with b.scope(module="mlp", block="fc1", tensors=("fc1.weight", "fc1.bias")):
        h = b.emit("linear", x, b.param("fc1.weight", (D_HIDDEN, D_IN), "f32"), b.param("fc1.bias", (D_HIDDEN,), "f32"))
    with b.scope(module="mlp", block="act"):
        h = b.emit("silu", h)
    with b.scope(module="mlp", block="fc2", tensors=("fc2.weight", "fc2.bias")):
        y = b.emit("linear", h, b.param("fc2.weight", (D_OUT, D_HIDDEN), "f32"), b.param("fc2.bias", (D_OUT,), "f32"))
    b.output(y)
    b.meta["description"] = "two-layer MLP example (examples/make_example.py)"
    return b.build()


def make_tensors(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(weights, inputs) drawn from a fixed seed."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    weights = {
        "fc1.weight": normal(D_HIDDEN, D_IN, scale=D_IN**-0.5),
        "fc1.bias": normal(D_HIDDEN, scale=0.1),
        "fc2.weight": normal(D_OUT, D_HIDDEN, scale=D_HIDDEN**-0.5),
        "fc2.bias": normal(D_OUT, scale=0.1),
    }
    inputs = {"x": normal(BATCH, D_IN, scale=1.0)}
    return weights, inputs


def write_example(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    weights, inputs = make_tensors()
    paths = [out / "mlp.difir", out / "mlp-weights.safetensors", out / "mlp-inputs.safetensors"]
    save_program(build_mlp(), paths[0])
    save_tensors(paths[1], weights, {"program": "mlp"})
    save_tensors(paths[2], inputs, {"program": "mlp"})
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    for path in write_example(parser.parse_args().out):
        print(path)


if __name__ == "__main__":
    main()

"""Options of the cross-distribution tests: `--update-golden` rewrites tests/golden/ (see test_golden.py)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the golden files in tests/golden/ from the current code instead of comparing against them",
    )


@pytest.fixture(scope="session")
def tiny_klein(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The tiny FLUX.2 [klein] transformer of the embedded demo checkpoint (1 double + 1 single block,
    4 image and 8 text tokens), random weights and inputs, saved as .difir / .diftensor files:
    {"program", "weights", "inputs", "difir", "weights_path", "inputs_path"} (tools' tests share it)."""
    import numpy as np

    from dif.serialize.difir import save_program
    from dif.serialize.diftensor import save_tensors
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
    folder = tmp_path_factory.mktemp("tiny_klein")
    save_program(program, folder / "klein.difir")
    save_tensors(folder / "weights.diftensor", weights)
    save_tensors(folder / "inputs.diftensor", inputs)
    return {
        "program": program,
        "weights": weights,
        "inputs": inputs,
        "difir": folder / "klein.difir",
        "weights_path": folder / "weights.diftensor",
        "inputs_path": folder / "inputs.diftensor",
    }

"""Fuzz the FLUX.2 [klein] folder readers (model_index.json, the components' config.json) through
`open_checkpoint`: whatever a config file holds, only a `DifError` may come out.

`fuzz_targets()` is also what perf/fuzz.py runs at 100,000 cases per file; here a short run per file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dif.testing.fuzz_run import FuzzTarget, check_seeds, run_fuzz
from dif.testing.fuzz_targets import config_file_target
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2 import config as config_module
from dif_frontend_flux2.weights import open_checkpoint

CONFIGS = Path(config_module.__file__).parent / "configs"
FILES = ("model_index.json", "transformer/config.json", "text_encoder/config.json", "vae/config.json")
CI_CASES = 300


def fuzz_targets() -> list[FuzzTarget]:
    """One target per config file: the embedded demo folder's copy is mutated (seeds: the demo's and
    the published klein configs) and opened as `dif flux2` opens a checkpoint."""
    folders = [Path(DEFAULT_CHECKPOINT), *sorted(p for p in CONFIGS.iterdir() if (p / "model_index.json").is_file())]
    reader = "dif_frontend_flux2.weights.open_checkpoint"
    return [config_file_target(f"flux2 {file}", folders, file, open_checkpoint, reader) for file in FILES]


TARGETS = fuzz_targets()


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_seeds_load(target: FuzzTarget) -> None:
    check_seeds(target)  # a seed the reader rejects would make its mutations test nothing


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_mutated_configs_raise_only_dif_errors(target: FuzzTarget) -> None:
    result = run_fuzz(target, CI_CASES, seed=14)
    assert result.failures == (), f"{target.name}: {result.failures[:3]}"

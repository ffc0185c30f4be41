"""Fuzz the Krea 2 folder readers (model_index.json, the components' config.json, the scheduler
config) through `load_configs`: whatever a config file holds, only a `DifError` may come out.

`fuzz_targets()` is also what perf/fuzz.py runs at 100,000 cases per file; here a short run per file.
"""

from __future__ import annotations

import pytest

from dif.testing.fuzz_run import FuzzTarget, check_seeds, run_fuzz
from dif.testing.fuzz_targets import config_file_target
from dif_frontend_krea2 import DEFAULT_CHECKPOINT
from dif_frontend_krea2.config import load_configs

CONFIGS = DEFAULT_CHECKPOINT.parent / "configs"
FILES = (
    "model_index.json",
    "transformer/config.json",
    "text_encoder/config.json",
    "vae/config.json",
    "scheduler/scheduler_config.json",
)
CI_CASES = 300


def fuzz_targets() -> list[FuzzTarget]:
    """One target per config file: a copy of the published turbo configs is mutated (seeds: the turbo
    and raw files) and read as `open_checkpoint` reads it (`load_configs`, cross-checks included).
    The embedded demo's configs are not seeds: its small widths do not match the published files'."""
    folders = [CONFIGS / "turbo", CONFIGS / "raw"]
    return [
        config_file_target(f"krea2 {file}", folders, file, load_configs, "dif_frontend_krea2.config.load_configs")
        for file in FILES
    ]


TARGETS = fuzz_targets()


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_seeds_load(target: FuzzTarget) -> None:
    check_seeds(target)  # a seed the reader rejects would make its mutations test nothing


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_mutated_configs_raise_only_dif_errors(target: FuzzTarget) -> None:
    result = run_fuzz(target, CI_CASES, seed=14)
    assert result.failures == (), f"{target.name}: {result.failures[:3]}"

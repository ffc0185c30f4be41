"""`dif.load(path)(prompt)`: the Python API finds the frontend through the installed plugins, uses
the CLI's defaults and writes the PNG the CLI writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import dif
from dif.dtypes import DType
from dif.errors import CheckpointError, UsageError
from dif.media import read_png_metadata
from dif_frontend_flux2 import DEFAULT_CHECKPOINT as FLUX2_DEFAULT
from dif_frontend_krea2 import DEFAULT_CHECKPOINT as KREA2_DEFAULT
from dif_tools.cli import build_cli


def test_import_dif_loads_no_plugin() -> None:
    code = (
        "import sys, dif; assert callable(dif.load); "
        "print(sorted(m for m in sys.modules if m.startswith(('dif_', 'dif.plugins.manager', 'dif.api', 'click'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_load_without_a_path_is_the_embedded_flux2_with_the_cli_defaults() -> None:
    pipe = dif.load()
    assert pipe.family == "flux2" and pipe.pipeline.checkpoint.root == FLUX2_DEFAULT
    assert pipe.pipeline.dtype == DType.F32  # dtype "auto": the embedded checkpoint is stored in f32
    assert pipe.pipeline.native_size == 256
    result = pipe("a fox", steps=1, seed=3, width=32, height=16)
    assert result.image.mode == "RGB" and result.image.size == (32, 16)
    s = result.settings
    assert (s["steps"], s["seed"], s["cfg"], s["guidance"]) == (1, 3, False, 1.0)  # distilled: guidance off
    drawn = pipe("a fox", steps=1, width=16, height=16).settings["seed"]
    assert isinstance(drawn, int) and 0 <= drawn < 2**32  # no seed: a fresh one, recorded


def test_both_families_by_path_and_by_name() -> None:
    krea2 = dif.load(KREA2_DEFAULT, backend="cpu")
    assert krea2.family == "krea2"  # detected
    assert dif.load(family="krea2").pipeline.checkpoint.root == KREA2_DEFAULT
    steps: list[tuple[int, int, tuple[int, ...]]] = []
    result = krea2("a fox", seed=1, width=32, height=32, on_step=lambda i, n, x: steps.append((i, n, x.shape)))
    assert steps == [(i, 8, (1, 4, 64)) for i in range(1, 9)]  # Turbo's 8 steps, latents of 2x2 tokens
    assert result.settings["variant"] == "turbo" and result.settings["steps"] == 8
    assert dif.load(FLUX2_DEFAULT).family == "flux2"
    with pytest.raises(UsageError, match="no frontend 'sd15'"):
        dif.load(family="sd15")
    with pytest.raises(CheckpointError, match="not a checkpoint the 'krea2' frontend loads"):
        dif.load(FLUX2_DEFAULT, family="krea2")
    with pytest.raises(UsageError, match="unknown setting 'cfg'"):
        krea2("x", cfg=2.0)


def test_save_writes_what_the_cli_writes(tmp_path: Path) -> None:
    api_png, cli_png = tmp_path / "api.png", tmp_path / "cli.png"
    result = dif.load(backend="cpu")("a red fox", steps=2, seed=5, width=48, height=32)
    summary = result.save(api_png)
    assert summary["output"] == str(api_png) and summary["settings"]["seed"] == 5
    args = ["flux2", "generate", "-p", "a red fox", "--steps", "2", "--seed", "5", "-W", "48", "-H", "32"]
    cli = CliRunner().invoke(build_cli(), [*args, "--backend", "cpu", "-o", str(cli_png), "--json"])
    assert cli.exit_code == 0, cli.output
    api_meta, cli_meta = read_png_metadata(api_png), read_png_metadata(cli_png)
    assert api_meta["parameters"] == cli_meta["parameters"] and "Seed: 5, Size: 48x32" in api_meta["parameters"]
    assert (
        api_meta["dif"]
        == cli_meta["dif"]
        == json.loads(cli.stdout)["data"]["settings"]
        | {
            "generator": api_meta["dif"]["generator"],
            "frontend": "flux2",
        }
    )
    with Image.open(api_png) as a, Image.open(cli_png) as b:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(result.image))

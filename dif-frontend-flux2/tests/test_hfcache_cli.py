"""`dif flux2 generate -m org/name` and `dif.load("org/name")` on a repo in the local Hugging Face
cache (the embedded checkpoint laid out as the hub client caches it); a repo not in the cache is
refused saying where dif looked, exit != 0, nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif_frontend_flux2 import DEFAULT_CHECKPOINT

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
COMMIT = "1111111111111111111111111111111111111111"
COMMON = ["-p", "a fox", "-W", "32", "-H", "32", "--seed", "1", "--steps", "1"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    hub = tmp_path / "home" / "hub"
    repo = hub / "models--black-forest-labs--FLUX.2-klein-tiny"
    shutil.copytree(DEFAULT_CHECKPOINT, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    return hub


def test_repo_id_in_the_cache_generates(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.png"
    repo = "black-forest-labs/FLUX.2-klein-tiny"
    result = CliRunner().invoke(cli, ["flux2", "generate", "-m", repo, *COMMON, "-o", str(out)])
    assert result.exit_code == 0, result.output
    ref = tmp_path / "ref.png"
    assert CliRunner().invoke(cli, ["flux2", "generate", *COMMON, "-o", str(ref)]).exit_code == 0
    assert out.read_bytes() != b"" and np.array_equal(_pixels(out), _pixels(ref))
    info = CliRunner().invoke(cli, ["flux2", "info", "black-forest-labs/FLUX.2-klein-tiny@main"])
    assert info.exit_code == 0 and COMMIT in info.output


def _pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def test_repo_id_not_in_the_cache_is_refused(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.png"
    result = CliRunner().invoke(cli, ["flux2", "generate", "-m", "acme/absent", *COMMON, "-o", str(out)])
    assert result.exit_code != 0 and not out.exists() and "Traceback" not in result.output
    assert "acme/absent" in result.output and "models--acme--absent" in result.output


def test_python_api_takes_a_repo_id(cache: Path) -> None:
    import dif

    pipe = dif.load("black-forest-labs/FLUX.2-klein-tiny")
    assert pipe.family == "flux2"

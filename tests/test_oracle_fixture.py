"""The oracle-fixture protocol end to end against diffusers: perf/reference/oracle_fixture_flux2.py writes a
manifest from Flux2Transformer2DModel (the embedded tiny checkpoint, fp32), `dif bisect validate-oracle`
accepts it, and dif's block captures of the same forward on the CPU backend agree with every boundary
under tight f32 bars; a manifest naming a tensor its file lacks is refused naming it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dif.telemetry import validate_document
from dif_tools.cli import build_cli

pytestmark = pytest.mark.oracle
SCRIPT = Path(__file__).resolve().parents[1] / "perf" / "reference" / "oracle_fixture_flux2.py"


def data_of(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    result = CliRunner().invoke(build_cli(), [*args, "--json"], env=env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    validate_document(doc)
    return doc["data"]  # type: ignore[no-any-return]


def test_diffusers_fixture_and_dif_blocks_agree(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the oracle is diffusers on torch")
    pytest.importorskip("diffusers", reason="the oracle is diffusers")
    from dif_frontend_flux2 import DEFAULT_CHECKPOINT

    spec = importlib.util.spec_from_file_location("oracle_fixture_flux2", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    manifest = module.main(["--out", str(tmp_path / "klein.json")])
    checked = data_of(["bisect", "validate-oracle", str(manifest)])
    names = [b["name"] for b in checked["boundaries"]]
    assert (
        names[0] == "transformer_blocks.0" and names[-1] == "velocity" and all(b["dif"] for b in checked["boundaries"])
    )

    weights = DEFAULT_CHECKPOINT / "transformer" / "diffusion_pytorch_model.safetensors"
    args = ["run", str(tmp_path / "klein.difir"), "--inputs", str(tmp_path / "klein.inputs.safetensors")]
    args += ["--weights", str(weights), "--out", str(tmp_path / "out.safetensors"), "--backend", "cpu"]
    env = {"DIF_CAPTURE": "blocks", "DIF_CAPTURE_DIR": str(tmp_path / "cap"), "DIF_PASSES": "none"}
    data_of(args, env)
    (capture,) = (tmp_path / "cap").glob("*.diftensor")
    # f32 on both sides; measured rel-L2 6.6e-8 (double block), 1.1e-7 (single block), 2.3e-7 (velocity)
    bars = ["--min-cosine", "0.999999", "--max-rel-l2", "1e-5", "--max-norm-ratio-deviation", "1e-5"]
    report = data_of(["bisect", "manifest", str(manifest), "--capture", str(capture), *bars])
    assert report["verdict"] == "agree", report["boundaries"]
    assert report["observed"] == len(names)

    doc = json.loads(manifest.read_text())
    doc["boundaries"][0]["tensor"] = "transformer_blocks.missing"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc))
    result = CliRunner().invoke(build_cli(), ["bisect", "validate-oracle", str(broken)])
    assert result.exit_code == 1 and "transformer_blocks.missing" in result.output

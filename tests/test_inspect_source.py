"""`dif inspect --source` on the tiny FLUX.2 [klein] transformer as the CPU backend executed it: each op links
the frontend's provenance (module / block / checkpoint tensors), the fusion that made it, the plan's
decisions that name it and the implementation the trace saw; links that do not apply are reported absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dif.ir.program import Provenance
from dif.telemetry import validate_document
from dif_tools.cli import build_cli


def data_of(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(build_cli(), [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    validate_document(doc)
    return doc["data"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def files(tiny_klein: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inspect")
    out = {"opt": root / "opt.difir", "plan": root / "p.difplan", "trace": root / "t.jsonl"}
    data_of(
        ["plan", "make", str(tiny_klein["difir"]), "--backend", "cpu", "--out", str(out["plan"])]
        + ["--save-program", str(out["opt"])]
    )
    args = [
        "trace",
        "program",
        str(tiny_klein["difir"]),
        "--inputs",
        str(tiny_klein["inputs_path"]),
        "--backend",
        "cpu",
    ]
    data_of([*args, "--weights", str(tiny_klein["weights_path"]), "--runs", "1", "--save-trace", str(out["trace"])])
    return out


def test_fused_op_links_every_layer(files: dict[str, Path]) -> None:
    from dif.serialize.difir import load_program

    program = load_program(files["opt"])
    fused = next(n for n in program.nodes if program.provenance[n.id].transforms and program.provenance[n.id].tensors)
    args = ["inspect", str(files["opt"]), "--source", "--op", str(fused.id), "--plan", str(files["plan"])]
    data = data_of([*args, "--trace", str(files["trace"])])
    links = data["source"]["links"]
    assert all("source" in links[k] for k in ("provenance", "plan", "trace")), links
    (row,) = data["source"]["ops"]
    prov = program.provenance[fused.id]
    assert row["opcode"] == fused.op and row["semantic"]
    assert row["frontend"]["module"] == prov.module and row["frontend"]["block"] == prov.block
    assert row["frontend"]["checkpoint_tensors"] == list(prov.tensors)
    assert row["transforms"] == list(prov.transforms)
    assert row["backend"]["implementations"] == ["numpy reference"] and row["backend"]["executions"] == 1
    assert row["plan"]["placement"] == "device" and row["plan"]["schedule_step"] == fused.id


def test_absent_links_are_reported_not_guessed(files: dict[str, Path], tiny_klein: dict[str, Any]) -> None:
    args = [
        "inspect",
        str(tiny_klein["difir"]),
        "--source",
        "--plan",
        str(files["plan"]),
        "--trace",
        str(files["trace"]),
    ]
    data = data_of(args)
    links = data["source"]["links"]
    assert "another program" in links["plan"]["absent"]  # the plan is of the optimized program
    assert "no execution of this program" in links["trace"]["absent"]
    rows = data["source"]["ops"]
    assert len(rows) == len(tiny_klein["program"].nodes)
    assert all("absent" in r["backend"] and "absent" in r["plan"] for r in rows)
    unprovenanced = [r for r in rows if "absent" in r["frontend"]]
    assert len(unprovenanced) == sum(
        1
        for n in tiny_klein["program"].nodes
        if tiny_klein["program"].provenance.get(n.id, Provenance()) == Provenance()
    )
    result = CliRunner().invoke(build_cli(), ["inspect", str(tiny_klein["difir"]), "--source", "--op", "100000"])
    assert result.exit_code == 1 and "no op 100000" in result.output


def _demo_programs() -> dict[str, Any]:
    from dif_frontend_flux2 import DEFAULT_CHECKPOINT
    from dif_frontend_flux2.config import load_configs
    from dif_frontend_flux2.model import build_transformer
    from dif_frontend_flux2.text_encoder import build_text_encoder
    from dif_frontend_flux2.vae import build_vae_decoder
    from dif_frontend_krea2 import DEFAULT_CHECKPOINT as KREA2
    from dif_frontend_krea2.config import load_configs as krea2_configs
    from dif_frontend_krea2.model import build_denoiser

    c = load_configs(DEFAULT_CHECKPOINT)
    return {
        "flux2-transformer": lambda: build_transformer(c.transformer, batch=1, n_img=4, n_txt=8),
        "flux2-text-encoder": lambda: build_text_encoder(c.text_encoder, batch=1, seq_len=8, taps=(1, 2, 3)),
        "flux2-vae-decoder": lambda: build_vae_decoder(c.vae, batch=1, latent_h=4, latent_w=4, from_packed=True),
        "krea2-denoiser": lambda: build_denoiser(krea2_configs(KREA2).transformer, image_len=4, text_len=8),
    }


@pytest.mark.parametrize(
    "name",
    [
        "flux2-transformer",
        "flux2-text-encoder",
        "flux2-vae-decoder",
        "krea2-denoiser",
    ],
)
def test_frontends_record_module_and_block_for_every_op(name: str) -> None:
    program = _demo_programs()[name]()
    missing = [(n.id, n.op) for n in program.nodes if not (program.provenance.get(n.id) or Provenance()).block]
    assert missing == [], f"{name}: ops without a provenance block: {missing[:10]}"

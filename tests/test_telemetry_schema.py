"""docs/telemetry.schema.json (the published JSON Schema of dif-telemetry/1) accepts what the truth and
debugging tools print on the tiny FLUX.2 [klein] transformer, agrees with `dif.telemetry.validate_document`,
and rejects what it must (an op event of a kind outside the vocabulary, a bisect verdict it does not know)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dif.telemetry import validate_document
from dif_tools.cli import build_cli

SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "telemetry.schema.json"


def doc_of(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    result = CliRunner().invoke(build_cli(), [*args, "--json"], env=env)
    assert result.stdout.strip(), result.output
    doc = json.loads(result.stdout)
    validate_document(doc)
    return doc  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema", reason="checking the published schema needs jsonschema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_every_tool_document_matches_the_schema(validator: Any, tiny_klein: dict[str, Any], tmp_path: Path) -> None:
    from PIL import Image

    k = tiny_klein
    run = ["--inputs", str(k["inputs_path"]), "--weights", str(k["weights_path"]), "--backend", "cpu"]
    docs = [
        doc_of(["trace", "program", str(k["difir"]), *run, "--runs", "1", "--save-trace", str(tmp_path / "t.jsonl")])
    ]
    docs += [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    docs.append(doc_of(["trace", "merge", str(tmp_path / "t.jsonl")]))
    plan = tmp_path / "p.difplan"
    docs.append(doc_of(["plan", "make", str(k["difir"]), "--backend", "cpu", "--out", str(plan)]))
    docs += [doc_of(["plan", kind, str(plan)]) for kind in ("show", "residency")]
    docs.append(doc_of(["plan", "explain", "op", "3", str(plan)]))
    for name in ("a", "b"):
        env = {"DIF_CAPTURE": "ops", "DIF_CAPTURE_DIR": str(tmp_path / name), "DIF_PASSES": "none"}
        doc_of(["run", str(k["difir"]), *run, "--out", str(tmp_path / f"{name}.out")], env=env)
    (a,), (b,) = (tmp_path / "a").glob("*.diftensor"), (tmp_path / "b").glob("*.diftensor")
    docs.append(doc_of(["bisect", "program", str(k["difir"]), "--capture", str(a), "--reference", str(b)]))
    png = tmp_path / "x.png"
    Image.fromarray((np.arange(16 * 16 * 3) % 251).astype(np.uint8).reshape(16, 16, 3)).save(png)
    docs.append(doc_of(["quality", str(png)]))
    docs.append(
        doc_of(["tune", str(k["difir"]), "--backend", "cpu", "--repeat", "1"], env={"DIF_CACHE_DIR": str(tmp_path)})
    )
    suite = tmp_path / "suite.json"
    suite.write_text(
        json.dumps(
            {
                "schema": "dif-regress-suite/1",
                "checks": [{"name": "v", "tiers": ["smoke"], "argv": ["dif", "--version"]}],
            }
        )
    )
    docs.append(doc_of(["regress", "run", str(suite), "--tier", "smoke"]))
    kinds = {d["kind"] for d in docs}
    assert {
        "trace",
        "trace.program",
        "trace.merge",
        "plan.make",
        "plan.show",
        "plan.explain",
        "bisect",
        "quality",
        "tune",
        "regress",
    } <= kinds
    for doc in docs:
        errors = sorted(str(e.message) for e in validator.iter_errors(doc))
        assert errors == [], f"{doc['kind']}: {errors[:3]}"

    bad = copy.deepcopy(next(d for d in docs if d["kind"] == "trace" and d["data"]["stage"] == "run"))
    op = next(e for e in bad["events"] if e["name"] == "op")
    op["kind"] = "magic"
    assert list(validator.iter_errors(bad))
    bad = copy.deepcopy(next(d for d in docs if d["kind"] == "bisect"))
    bad["data"]["verdict"] = "probably fine"
    assert list(validator.iter_errors(bad))

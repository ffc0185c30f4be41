"""`dif train lora` on the embedded tiny klein: writes a LoRA dif itself then loads, a resumable
`.diftrain`, the loss curve and a dif-telemetry/1 document; resuming continues the step count; bad
data exits non-zero with one line naming the file and writes nothing; `--timestep-shift` is checked,
recorded and kept on resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner
from PIL import Image

from dif.lora.file import read_lora
from dif.telemetry import validate_document
from dif.train.checkpoint import recorded_settings
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_tools.cli import build_cli


def _data(root: Path, n: int = 2) -> Path:
    root.mkdir(parents=True)
    for i in range(n):
        a = np.zeros((64, 64, 3), np.uint8)
        a[..., i % 3] = 210
        a[16:48, 16:48] = 255
        Image.fromarray(a).save(root / f"s{i}.png")
        (root / f"s{i}.txt").write_text(f"a white square, picture {i}")
    return root


def _attention_projections() -> int:
    """The default targets on the embedded model: 8 projections per double block (image and text
    q, k, v, out), 2 per single block (the fused qkv+mlp input and the output)."""
    config = json.loads((DEFAULT_CHECKPOINT / "transformer" / "config.json").read_text())
    return 8 * config["num_layers"] + 2 * config["num_single_layers"]


ARGS = ["--rank", "4", "--resolution", "64", "--lr", "1e-2", "--backend", "cpu"]


def test_train_lora_writes_lora_checkpoint_curve_and_document(tmp_path: Path) -> None:
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    r = CliRunner().invoke(
        build_cli(), ["train", "lora", "--data", str(data), "--output", str(out), "--steps", "4", *ARGS, "--json"]
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    validate_document(doc)
    d = doc["data"]
    assert doc["kind"] == "train.lora" and d["family"] == "flux2" and d["steps"] == 4 and len(d["losses"]) == 4
    assert "it/s" in r.stderr and "ETA" in r.stderr and "loss" in r.stderr
    lora = read_lora(out / "lora.safetensors")
    assert lora.dialect == "diffusers" and len(lora.adapters) == len(d["modules"]) == _attention_projections()
    assert (out / "last.diftrain").is_file() and (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "train.json").read_text())["steps"] == 4
    assert d["plans"] and all(p["peak_bytes"] > 0 for p in d["plans"])  # the planner states the step's peak
    assert d["timestep_shift"] == 1.0  # the default: the embedded scheduler shifts dynamically, so unshifted

    r = CliRunner().invoke(build_cli(), ["train", "lora", "--data", str(data), "--output", str(out), "--steps", "6",
                                         *ARGS, "--resume", str(out / "last.diftrain"), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    again = json.loads(r.stdout)["data"]
    assert again["steps"] == 6 and again["losses"][:4] == d["losses"] and "resumed" in r.stderr


def test_bad_data_exits_naming_the_file(tmp_path: Path) -> None:
    data = _data(tmp_path / "data")
    (data / "s1.txt").unlink()
    out = tmp_path / "out"
    r = CliRunner().invoke(
        build_cli(), ["train", "lora", "--data", str(data), "--output", str(out), "--steps", "2", *ARGS]
    )
    assert r.exit_code != 0
    assert "s1.png: image has no caption file s1.txt" in r.output
    assert "Traceback" not in r.output
    assert not (out / "lora.safetensors").exists()


def test_resume_from_another_rank_is_refused(tmp_path: Path) -> None:
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    r = CliRunner().invoke(
        build_cli(), ["train", "lora", "--data", str(data), "--output", str(out), "--steps", "1", *ARGS]
    )
    assert r.exit_code == 0, r.output
    args = ["train", "lora", "--data", str(data), "--output", str(tmp_path / "o2"), "--steps", "2", "--rank", "2",
            "--resolution", "64", "--backend", "cpu", "--resume", str(out / "last.diftrain")]  # fmt: skip
    r = CliRunner().invoke(build_cli(), args)
    assert r.exit_code != 0 and "last.diftrain: written for another model or LoRA layout" in r.output


def test_train_full_writes_a_model_folder_dif_generates_from(tmp_path: Path) -> None:
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    args = ["train", "full", "--data", str(data), "--output", str(out), "--steps", "3", "--lr", "1e-3",
            "--resolution", "64", "--backend", "cpu", "--json"]  # fmt: skip
    r = CliRunner().invoke(build_cli(), args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["data"]
    assert d["kind"] == "full" and d["steps"] == 3 and d["modules"] > 10 and "--rank" not in r.stderr
    model = Path(d["full"])
    assert (model / "transformer" / "diffusion_pytorch_model.safetensors").is_file()
    gen = ["flux2", "generate", "-p", "a square", "-m", str(model), "-W", "64", "-H", "64", "--steps", "2",
           "-o", str(tmp_path / "img.png"), "--backend", "cpu"]  # fmt: skip
    r = CliRunner().invoke(build_cli(), gen)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "img.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_timestep_shift_exits_naming_the_option_and_writes_nothing(tmp_path: Path) -> None:
    data = _data(tmp_path / "data")
    for kind, bad in [("lora", "0"), ("full", "-1"), ("lora", "nan"), ("full", "inf")]:
        out = tmp_path / f"out-{kind}-{bad}"
        args = ["train", kind, "--data", str(data), "--output", str(out), "--steps", "1", "--resolution", "64",
                "--backend", "cpu", "--timestep-shift", bad]  # fmt: skip
        r = CliRunner().invoke(build_cli(), args)
        assert r.exit_code == 1, (bad, r.output)
        assert len(r.output.strip().splitlines()) == 1 and "--timestep-shift must be a finite number > 0" in r.output
        assert "Traceback" not in r.output and not out.exists()


def test_timestep_shift_is_recorded_and_kept_on_resume(tmp_path: Path) -> None:
    data, out = _data(tmp_path / "data"), tmp_path / "out"

    def train(output: Path, steps: int, *extra: str) -> Any:
        args = ["train", "lora", "--data", str(data), "--output", str(output), "--steps", str(steps), *ARGS,
                *extra, "--json"]  # fmt: skip
        return CliRunner().invoke(build_cli(), args)

    r = train(tmp_path / "straight", 3, "--timestep-shift", "3")
    assert r.exit_code == 0, r.output
    straight = json.loads(r.stdout)["data"]
    assert straight["timestep_shift"] == 3.0
    r = train(tmp_path / "unshifted", 3)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["data"]["losses"] != straight["losses"]  # the shift changes the run
    r = train(out, 1, "--timestep-shift", "3")
    assert r.exit_code == 0, r.output
    assert recorded_settings(out / "last.diftrain")["timestep_shift"] == 3.0
    r = train(out, 3, "--resume", str(out / "last.diftrain"))  # no --timestep-shift: the checkpoint's
    assert r.exit_code == 0, r.output
    resumed = json.loads(r.stdout)["data"]
    assert resumed["timestep_shift"] == 3.0 and resumed["losses"] == straight["losses"]
    r = train(tmp_path / "other", 3, "--timestep-shift", "2", "--resume", str(out / "last.diftrain"))
    assert r.exit_code == 1 and "last.diftrain: trained with timestep shift 3, this run has 2" in r.output


def test_batch_size_builds_the_step_program_of_that_batch(tmp_path: Path) -> None:
    data, out = _data(tmp_path / "data", n=4), tmp_path / "out"
    args = ["train", "full", "--data", str(data), "--output", str(out), "--steps", "2", "--resolution", "64"]
    r = CliRunner().invoke(build_cli(), [*args, "--backend", "cpu", "--batch-size", "2", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["data"]
    assert d["settings"]["batch_size"] == 2 and d["steps"] == 2 and len(d["losses"]) == 2
    assert recorded_settings(out / "last.diftrain")["batch_size"] == 2  # a resume trains at the same batch
    from dif.plugins.manager import frontends
    from dif.train.tasks import LoraSettings, full_trainer

    model = Path(frontends()["flux2"].default_checkpoint)
    session = full_trainer("flux2")(model, data, LoraSettings(steps=2, resolution=64, batch_size=2), backend="cpu")
    step = session.task.programs((4, 4)).step  # 64² images: a 4x4 token grid
    assert {i.name: i.type.shape[0] for i in step.inputs if i.name in ("latents", "timestep_proj")} == {
        "latents": 2,
        "timestep_proj": 2,
    }


def test_krea2_refuses_a_batch_size_naming_the_way_out(tmp_path: Path) -> None:
    from dif.plugins.manager import frontends

    info = frontends().get("krea2")
    if info is None or info.default_checkpoint is None:
        import pytest

        pytest.skip("needs the Krea 2 frontend (dif-frontend-krea2) and its embedded default")
    data, out = _data(tmp_path / "data"), tmp_path / "out"
    r = CliRunner().invoke(build_cli(), ["train", "lora", "-m", str(info.default_checkpoint), "--data", str(data),
                                         "--output", str(out), "--batch-size", "2", *ARGS])  # fmt: skip
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "Krea 2 trains one image per micro-batch, not --batch-size 2" in r.output and "--accumulate 2" in r.output

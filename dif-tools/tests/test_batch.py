"""`dif batch` on a local Ray cluster (2 CPU workers, the embedded tiny FLUX.2 klein on the CPU backend):
20 jobs, one that cannot run (a size off the model's grid) retried and reported, the 19 others written as
they finish, with their metadata; the images are the Python API's for the same settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("ray", reason="dif batch schedules on Ray")

from dif.errors import UsageError  # noqa: E402
from dif_tools.cli import cli  # noqa: E402
from dif_tools.serve.batch import read_jobs  # noqa: E402


def write_jobs(path: Path, count: int = 20, bad: int = 7) -> Path:
    lines = []
    for i in range(count):
        job = {"id": f"j{i:02d}", "prompt": f"a fox number {i}", "size": "32x32", "steps": 1, "seed": 100 + i}
        if i == bad:
            job["size"] = "40x40"  # not a multiple of klein's 16-pixel token: every attempt fails
        lines.append(json.dumps(job))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_twenty_jobs_one_forced_failure(tmp_path: Path) -> None:
    jobs, out = write_jobs(tmp_path / "jobs.jsonl"), tmp_path / "out"
    args = ["batch", str(jobs), "--ray", "local", "--out", str(out), "--workers", "2", "--backend", "cpu",
            "--retries", "1", "--json"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output  # a job failed: the run says so
    doc = json.loads(result.stdout)
    summary = doc["data"]
    assert (summary["jobs"], summary["completed"], summary["failed"]) == (20, 19, 1)
    (failure,) = summary["failures"]
    assert failure["id"] == "j07" and len(failure["errors"]) == 2  # tried, retried once, reported
    assert "40" in failure["errors"][-1]
    assert json.loads((out / "batch.json").read_text())["completed"] == 19
    assert sum(summary["per_worker_jobs"].values()) == 19 and len(summary["per_worker_jobs"]) == 2  # both worked
    from PIL import Image

    for i in range(20):
        meta = json.loads((out / f"j{i:02d}.json").read_text())
        if i == 7:
            assert meta["status"] == "failed" and not (out / "j07.png").exists()
            continue
        assert meta["status"] == "ok" and meta["attempts"] == 1 and meta["settings"][0]["seed"] == 100 + i
        with Image.open(out / f"j{i:02d}.png") as im:
            assert im.size == (32, 32)
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*"))  # nothing half-written left
    # the same job run directly, on one BLAS thread as Ray's workers run (OMP_NUM_THREADS=1): a BLAS sums in
    # another order on another thread count, and the embedded model's 32x32 image moves one value by 1 then
    code = ("import sys, numpy as np, dif; np.save(sys.argv[1], dif.load(backend='cpu')('a fox number 3', "
            "seed=103, steps=1, width=32, height=32).run.pixels)")  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "direct.npy")], env=env, check=True, timeout=240)
    with Image.open(out / "j03.png") as im:
        assert np.array_equal(np.asarray(im.convert("RGB")), np.load(tmp_path / "direct.npy"))


def test_bad_jobs_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b", "size": "huge"}\n')
    with pytest.raises(UsageError, match=r"jobs.jsonl:3: 'size'"):
        read_jobs(path)
    path.write_text('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n')
    with pytest.raises(UsageError, match=r":2: id 'x' is not a unique"):
        read_jobs(path)
    result = CliRunner().invoke(cli, ["batch", str(path), "--ray", "local", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "not a unique" in result.output and not (tmp_path / "o").exists()

"""dif.bench: recipe checks (each refusal names the file and the stage/key), the page-cache probe, the NVML
sampler's record, and the runner on tiny Python stages (timing, rusage, failures, medians)."""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from dif.bench import RecipeError, load_recipe, run_recipe
from dif.bench.nvml import DeviceSampler
from dif.bench.recipe import find_cycle, substitute
from dif.bench.residency import classify, evict, file_residency, probe_files
from dif.errors import DifError
from dif.telemetry import build_document, validate_document

PY = "{python}"


def write_recipe(tmp_path: Path, stages: list[dict[str, Any]], **top: Any) -> Path:
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({"kind": "dif-bench-recipe/1", "stages": stages, **top}))
    return path


def py_stage(name: str, code: str, role: str = "measured", **extra: Any) -> dict[str, Any]:
    return {"name": name, "role": role, "argv": [PY, "-c", code], **extra}


# -- recipe checks ------------------------------------------------------------------------------------------


def test_placeholders_substitute_and_unknown_ones_name_the_key(tmp_path):
    path = write_recipe(
        tmp_path,
        [py_stage("a", "print('{{x}}')", env={"OUT": "{out}"}, outputs=["{workdir}/a.png"])],
        vars={"out": "{workdir}/o"},
    )
    recipe = load_recipe(path, tmp_path / "w")
    stage = recipe.stage("a")
    assert stage.argv == (sys.executable, "-c", "print('{x}')")
    assert dict(stage.env) == {"OUT": str((tmp_path / "w").resolve() / "o")}
    assert stage.outputs == (str((tmp_path / "w").resolve() / "a.png"),)
    with pytest.raises(RecipeError, match=r"stage 'a'.argv: unknown placeholder \{nope\}"):
        substitute("{nope}", {}, lambda: "stage 'a'.argv")


def test_pkg_placeholder_finds_an_installed_package_folder(tmp_path):
    text = substitute("{pkg:dif}/x", {}, lambda: "here")
    assert Path(text).parent == Path(__import__("dif").__file__).parent
    with pytest.raises(RecipeError, match="not installed"):
        substitute("{pkg:no_such_package_xyz}", {}, lambda: "here")


@pytest.mark.parametrize(
    ("stages", "top", "pattern"),
    [
        ([py_stage("a", "1", colour="red")], {}, r"recipe.json: stage 'a': unknown key\(s\) 'colour'"),
        ([py_stage("a", "1")], {"extra": 1}, r"recipe.json: unknown key\(s\) 'extra'"),
        ([py_stage("a", "1", timeout_s="10")], {}, r"stage 'a'.timeout_s: must be a number, got str"),
        ([{"name": "a", "role": "measured", "argv": "python -c 1"}], {}, r"stage 'a'.argv: must be a list"),
        ([py_stage("a", "1", role="timed")], {}, r"stage 'a'.role: 'timed' is not one of"),
        ([py_stage("a", "1", depends_on=["ghost"])], {}, r"stage 'a'.depends_on: unknown stage 'ghost'"),
        ([{"name": "a", "role": "measured", "argv": ["/no/such/binary"]}], {}, r"stage 'a'.argv: /no/such/binary"),
        ([{"name": "a", "role": "measured", "argv": [PY, "/no/such.py"]}], {}, r"stage 'a'.argv: /no/such.py"),
        ([py_stage("a", "1", model_files=["/no/such/*.safetensors"])], {}, r"stage 'a'.model_files: nothing matches"),
        ([py_stage("a", "1"), py_stage("a", "2")], {}, r"stage 'a' is defined 2 times"),
    ],
)
def test_invalid_recipes_are_refused_naming_stage_and_key(tmp_path, stages, top, pattern):
    path = write_recipe(tmp_path, stages, **top)
    with pytest.raises(RecipeError, match=pattern) as info:
        load_recipe(path, tmp_path / "w")
    assert str(path) in str(info.value)


def test_a_cycle_is_named(tmp_path):
    stages = [
        py_stage("a", "1", depends_on=["c"]),
        py_stage("b", "1", depends_on=["a"]),
        py_stage("c", "1", depends_on=["b"]),
        py_stage("d", "1"),
    ]
    with pytest.raises(RecipeError, match=r"dependency cycle a -> c -> b -> a"):
        load_recipe(write_recipe(tmp_path, stages), tmp_path / "w")
    assert find_cycle({"x": ["x"]}) == ["x", "x"]
    assert find_cycle({"x": ["y"], "y": []}) is None


def test_a_file_a_setup_stage_produces_may_be_missing_but_only_for_its_dependents(tmp_path):
    model = "{workdir}/model"
    setup = py_stage("make", "1", role="setup", produces=[model])
    user = py_stage("use", "1", depends_on=["make"], model_files=[model + "/*.safetensors"])
    recipe = load_recipe(write_recipe(tmp_path, [user, setup]), tmp_path / "w")
    assert [s.name for s in recipe.stages] == ["make", "use"]  # dependencies first
    loner = py_stage("use", "1", model_files=[model + "/*.safetensors"])
    with pytest.raises(RecipeError, match="stage 'use'.model_files"):
        load_recipe(write_recipe(tmp_path, [loner, setup]), tmp_path / "w")


def test_unknown_var_override_is_refused(tmp_path):
    path = write_recipe(tmp_path, [py_stage("a", "1")], vars={"model": "m"})
    with pytest.raises(RecipeError, match="no var 'modle'"):
        load_recipe(path, tmp_path / "w", overrides={"modle": "x"})


# -- residency ----------------------------------------------------------------------------------------------


def test_residency_of_a_written_file_and_after_eviction(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(4 << 20))
    written = file_residency(str(path))
    assert written.bytes == 4 << 20 and 0.0 <= written.fraction <= 1.0
    evict(str(path))
    evicted = file_residency(str(path)).fraction
    assert 0.0 <= evicted <= 1.0  # DONTNEED is advice: the kernel may keep pages
    path.read_bytes()
    after_read = file_residency(str(path)).fraction
    assert after_read >= evicted
    assert after_read > 0.5  # just read, 4 MiB: resident unless memory is exhausted
    record = probe_files([str(tmp_path / "*.bin")])
    assert record["measured"] and record["bytes"] == 4 << 20
    assert record["class"] == classify(record["resident_fraction"])
    assert probe_files([]) == {"measured": False, "reason": "no model_files declared", "patterns": []}


def test_classify_thresholds():
    assert classify(1.0) == "warm" and classify(0.0) == "cold" and classify(0.5) == "mixed"


# -- NVML ---------------------------------------------------------------------------------------------------


class FakeNvml:
    """pynvml's calls the sampler uses, on one device whose memory rises while the stage runs."""

    def __init__(self) -> None:
        self.used = iter([1000, 1000, 5000, 9000] + [3000] * 1000)

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"Fake GPU"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return type("Mem", (), {"used": next(self.used)})()

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [type("P", (), {"pid": 42, "usedGpuMemory": 7000})(), type("P", (), {"pid": 7, "usedGpuMemory": 1})()]

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        raise RuntimeError("Not Supported")


def test_sampler_records_peaks_and_reports_unsupported_queries():
    sampler = DeviceSampler(interval_s=0.001, nvml=FakeNvml())
    sampler.start()
    sampler.watch(42)
    import time

    time.sleep(0.05)
    record = sampler.stop()
    dev = record["devices"][0]
    assert record["measured"] and dev["name"] == "Fake GPU"
    assert dev["memory_used_before_bytes"] == 1000 and dev["memory_used_peak_bytes"] == 9000
    assert dev["memory_peak_increase_bytes"] == 8000 and dev["process_memory_peak_bytes"] == 7000
    assert dev["power_peak_w"] is None and any("power" in e for e in record["errors"])


def test_sampler_without_pynvml_says_not_measured(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    sampler = DeviceSampler()
    sampler.start()
    record = sampler.stop()
    assert record["measured"] is False and "pynvml" in record["reason"]


# -- runner -------------------------------------------------------------------------------------------------


def test_runner_times_stages_and_takes_medians_over_rounds(tmp_path):
    make_out = "from pathlib import Path; import time; time.sleep({s}); Path('{name}.json').write_text('{{{{}}}}')"
    stages = [
        py_stage("prep", "print('once')", role="setup"),
        py_stage("slow", make_out.format(s=0.15, name="slow"), outputs=["slow.json"], depends_on=["prep"]),
        py_stage("fast", make_out.format(s=0.02, name="fast"), role="reference", outputs=["fast.json"]),
    ]
    recipe = load_recipe(write_recipe(tmp_path, stages), tmp_path / "w")
    result = run_recipe(recipe, repeat=3)
    assert result.ok, result.failures
    assert [r["name"] for r in result.rounds[0]] == ["prep", "slow", "fast"]
    assert [[r["name"] for r in rnd] for rnd in result.rounds[1:]] == [["slow", "fast"]] * 2  # setup once
    slow = [r for rnd in result.rounds for r in rnd if r["name"] == "slow"]
    assert all(r["wall_s"] >= 0.15 and r["exit_status"] == 0 for r in slow)
    assert all(r["rusage"]["max_rss_bytes"] > 0 and r["outputs"][0]["ok"] for r in slow)
    summary = result.summary()
    assert summary["measured"]["walls_s"] == [r["wall_s"] for r in slow]
    assert summary["measured"]["median_s"] == round(statistics.median(summary["measured"]["walls_s"]), 4)
    ratio = summary["measured"]["median_s"] / summary["reference"]["median_s"]
    assert summary["ratio"] == round(ratio, 4) and summary["ratio"] > 1
    assert (tmp_path / "w" / "prep.r0.stdout").read_text() == "once\n"
    doc = build_document("bench", tool="test", data=result.to_data(), events=result.events())
    validate_document(doc)
    assert len(doc["events"]) == 7


def test_a_failing_stage_is_reported_and_its_dependents_not_run(tmp_path):
    stages = [
        py_stage("boom", "import sys; sys.stderr.write('it broke here\\n'); sys.exit(3)", role="setup"),
        py_stage("after", "1", depends_on=["boom"]),
        py_stage("other", "1", role="reference"),
    ]
    result = run_recipe(load_recipe(write_recipe(tmp_path, stages), tmp_path / "w"), repeat=2)
    assert not result.ok and len(result.rounds) == 1  # ends after the failing round
    (failure,) = result.failures
    assert failure["name"] == "boom" and failure["exit_status"] == 3 and "it broke here" in failure["stderr_tail"]
    status = {r["name"]: r["status"] for r in result.rounds[0]}
    assert status == {"boom": "failed", "after": "not run", "other": "ok"}


def test_timeouts_and_missing_or_undecodable_outputs_fail(tmp_path):
    stages = [
        py_stage("sleepy", "import time; time.sleep(30)", timeout_s=0.3),
        py_stage("liar", "1", role="reference", outputs=["never.png"]),
        py_stage("bad", "open('bad.png', 'wb').write(b'not a png')", role="reference", outputs=["bad.png"]),
    ]
    result = run_recipe(load_recipe(write_recipe(tmp_path, stages), tmp_path / "w"))
    reasons = {f["name"]: f["reason"] for f in result.failures}
    assert "timed out after 0.3 s" in reasons["sleepy"]
    assert reasons["liar"].endswith("never.png: missing")
    assert "bad.png: does not decode" in reasons["bad"]
    sleepy = result.rounds[0][0]
    assert sleepy["wall_s"] < 10 and sleepy["exit_status"] != 0


def test_a_stage_killed_by_a_signal_says_which(tmp_path):
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    result = run_recipe(load_recipe(write_recipe(tmp_path, [py_stage("k", code)]), tmp_path / "w"))
    (failure,) = result.failures
    assert failure["exit_status"] == -15 and "killed by signal SIGTERM" in failure["reason"]


def test_a_stage_printing_telemetry_gets_it_embedded(tmp_path):
    doc = build_document("x.generate", tool="fake", data={"timings_s": {"load": 0.5}, "total_s": 0.7}, plugins=[])
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    code = f"print(open({str(tmp_path / 'doc.json')!r}).read())"
    result = run_recipe(load_recipe(write_recipe(tmp_path, [py_stage("t", code)]), tmp_path / "w"))
    record = result.rounds[0][0]
    assert record["telemetry"]["kind"] == "x.generate"
    assert record["dif_reported"] == {"timings_s": {"load": 0.5}, "total_s": 0.7}


def test_repeat_must_be_positive(tmp_path):
    with pytest.raises(DifError, match="--repeat"):
        run_recipe(load_recipe(write_recipe(tmp_path, [py_stage("a", "1")]), tmp_path / "w"), repeat=0)


def test_an_mp4_without_pyav_is_reported_not_verified(tmp_path, monkeypatch):
    from dif.bench.outputs import verify_output

    monkeypatch.setitem(sys.modules, "av", None)  # as if PyAV were not installed
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"\0\0\0\x18ftypmp42")
    record = verify_output(str(clip))
    assert record["ok"] and not record["verified"] and record["detail"] == "not verified: PyAV missing"
    assert verify_output(str(tmp_path / "absent.mp4"))["ok"] is False

"""The `dif` command with in-process fake plugins: JSON documents validate, errors are one line,
plugins add commands, and `--help` imports no heavy library."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

import dif
import dif.ops  # noqa: F401  (registers the core ops)
from dif.backend import Availability, BackendInfo
from dif.ir.builder import ProgramBuilder
from dif.plugins import isolated_plugins, plugin_records, register_plugin
from dif.serialize.difir import save_program
from dif.serialize.diftensor import load_tensors, save_tensors
from dif.target import RuntimeBudget, TargetProfile
from dif.telemetry import validate_document
from dif_tools.cli import BUILTINS, build_cli

HEAVY = ("torch", "diffusers", "transformers", "cupy", "pyopencl", "nvmath", "cudnn")


class NumpyBackend:
    """A minimal Backend: runs y = x @ w.T for the one-linear test program."""

    name = "fakenp"

    def profile(self) -> TargetProfile:
        return TargetProfile(backend="fakenp", device="test", dtypes=("f32", "bf16"), tensor_core_formats=("bf16",))

    def budget(self) -> RuntimeBudget:
        return RuntimeBudget(free_memory_bytes=1 << 30)

    def prepare(self, program, plan, weights):
        from dif.interp import interpret

        return type("Exe", (), {"run": lambda self, inputs: interpret(program, inputs, weights)})()


class FakePlugin:
    @dif.hookimpl
    def register_backends(self, register):
        register(BackendInfo("fakenp", 1, "test", lambda: Availability(True, "an ICD hint"), NumpyBackend))
        register(BackendInfo("absent", 9, "test", lambda: Availability(False, "no such device here"), object))

    @dif.hookimpl
    def register_commands(self, cli):
        @cli.command("hello")
        @click.option("--json", "as_json", is_flag=True)
        def hello(as_json: bool) -> None:
            """Say hello (added by a plugin)."""
            click.echo("hello from a plugin")


@pytest.fixture
def runner():
    with isolated_plugins(""):
        register_plugin(FakePlugin(), "fakeplugin")
        yield CliRunner()


def _invoke(runner: CliRunner, *args: str):
    return runner.invoke(build_cli(), list(args), catch_exceptions=False)


def _doc(result, kind: str) -> dict:
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    validate_document(doc)
    assert doc["kind"] == kind
    return doc


def test_help_lists_builtins_and_plugin_commands(runner):
    result = _invoke(runner, "--help")
    assert result.exit_code == 0
    for name in [*BUILTINS, "hello"]:
        assert name in result.output
    assert "Say hello (added by a plugin)." in result.output
    assert _invoke(runner, "hello").output.strip() == "hello from a plugin"


def test_plugin_cannot_replace_a_builtin_command():
    class Hijack:
        @dif.hookimpl
        def register_commands(self, cli):
            @cli.command("run")
            def run() -> None:
                """Not the real run."""

    with isolated_plugins(""):
        register_plugin(Hijack(), "hijack")
        cli = build_cli()
        assert CliRunner().invoke(cli, ["--help"]).exit_code == 0  # listing asks the plugins
        assert "built into dif" in plugin_records()[0].error
        assert "Run FILE.difir once" in CliRunner().invoke(cli, ["run", "--help"]).output


def test_plugins_json(runner):
    doc = _doc(_invoke(runner, "plugins", "--json"), "plugins")
    (entry,) = doc["data"]["plugins"]
    assert entry["name"] == "fakeplugin"
    assert entry["registers"] == {"backends": ["absent", "fakenp"]}
    assert entry["hooks"] == ["register_backends", "register_commands"]
    assert doc["provenance"]["tool"] == "dif plugins"


def test_plugins_reports_a_failing_register_commands():
    class BrokenCommands:
        @dif.hookimpl
        def register_commands(self, cli):
            raise ImportError("No module named 'myfrontend.cli'")

    with isolated_plugins(""):
        register_plugin(BrokenCommands(), "brokencmds")
        result = CliRunner().invoke(build_cli(), ["plugins", "--json"], catch_exceptions=False)
        doc = _doc(result, "plugins")
        (entry,) = doc["data"]["plugins"]
        assert "register_commands raised ImportError" in entry["error"]
        assert "ERROR: register_commands raised" in CliRunner().invoke(build_cli(), ["plugins"]).output


def test_probe_json_lists_available_and_unavailable(runner):
    doc = _doc(_invoke(runner, "probe", "--json"), "probe")
    by_name = {h["backend"]: h for h in doc["hardware"]}
    assert by_name["absent"] == {
        "backend": "absent",
        "available": False,
        "reason": "no such device here",
        "profile": None,
        "fingerprint": None,
    }
    assert by_name["fakenp"]["profile"]["device"] == "test"
    assert doc["runtime_budget"]["fakenp"]["free_memory_bytes"] == 1 << 30
    human = _invoke(runner, "probe").output
    assert "absent: unavailable: no such device here" in human
    assert "fakenp: test" in human
    assert "  note: an ICD hint" in human  # the availability reason of an available backend is shown too


def test_formats_table_json(runner):
    doc = _doc(_invoke(runner, "formats-table", "--backend", "fakenp", "--json"), "formats-table")
    rows = {r["format"]: r for r in doc["data"]["tables"]["fakenp"]}
    assert rows["bf16"]["legal"] and rows["bf16"]["searchable"]
    assert not rows["fp8-e4m3"]["legal"] and "dtype 'f8e4m3'" in rows["fp8-e4m3"]["reason"]
    assert doc["hardware"][0]["backend"] == "fakenp"
    assert "fp8-e4m3" in _invoke(runner, "formats-table").output


def test_unavailable_backend_is_a_one_line_error(runner):
    result = runner.invoke(build_cli(), ["formats-table", "--backend", "absent"])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert "backend 'absent' is not available: no such device here" in result.output
    assert "Traceback" not in result.output


def _write_program(tmp_path: Path) -> tuple[Path, Path, Path]:
    b = ProgramBuilder("one_linear")
    x = b.input("x", (2, 3), "f32")
    with b.scope(module="toy", block="proj", tensors=("proj.weight",)):
        b.output(b.emit("linear", x, b.param("w", (4, 3), "f32")))
    save_program(b.build(), tmp_path / "p.difir")
    save_tensors(tmp_path / "x.safetensors", {"x": np.arange(6, dtype=np.float32).reshape(2, 3)})
    save_tensors(tmp_path / "w.safetensors", {"w": np.ones((4, 3), np.float32)})
    return tmp_path / "p.difir", tmp_path / "x.safetensors", tmp_path / "w.safetensors"


def test_inspect_json(runner, tmp_path):
    program, _, _ = _write_program(tmp_path)
    doc = _doc(_invoke(runner, "inspect", str(program), "--json", "--text"), "inspect")
    data = doc["data"]
    assert data["ops"] == {"linear": 1}
    assert data["params"] == {"tensors": 1, "count": 12, "bytes": 48, "dtypes": {"f32": 1}}
    assert data["inputs"] == [{"name": "x", "type": "f32[2,3]"}]
    assert data["provenance"]["source"] == "embedded"
    assert data["provenance"]["modules"] == ["toy"]
    assert "linear" in data["text"]
    assert len(data["fingerprint"]) >= 16


def test_inspect_reads_a_provenance_sidecar(runner, tmp_path):
    from attrs import evolve

    from dif.ir.program import Provenance
    from dif.serialize.difir import load_program
    from dif.serialize.provenance import save_provenance

    path, _, _ = _write_program(tmp_path)
    program = load_program(path)
    richer = evolve(program, provenance={0: Provenance(module="sidecar_mod", tensors=("a.weight", "b.weight"))})
    save_provenance(richer, tmp_path / "p.difir.prov.json")
    prov = _doc(_invoke(runner, "inspect", str(path), "--json"), "inspect")["data"]["provenance"]
    assert prov["source"] == "sidecar"
    assert prov["modules"] == ["sidecar_mod"]
    assert prov["checkpoint_tensors"] == 2


def test_run_json_and_output_file(runner, tmp_path):
    program, x, w = _write_program(tmp_path)
    out = tmp_path / "y.safetensors"
    args = ["run", str(program), "--inputs", str(x), "--weights", str(w), "--out", str(out), "--backend", "fakenp"]
    doc = _doc(_invoke(runner, *args, "--json"), "run")
    assert doc["data"]["backend"] == "fakenp"
    assert {e["name"] for e in doc["events"]} >= {"load_program", "prepare", "run", "save_outputs"}
    tensors, meta = load_tensors(out)
    (y,) = tensors.values()
    np.testing.assert_allclose(y, np.arange(6, dtype=np.float32).reshape(2, 3).sum(1, keepdims=True).repeat(4, 1))
    assert meta["backend"] == "fakenp"


def test_run_missing_weights_is_a_clear_error(runner, tmp_path):
    program, x, _ = _write_program(tmp_path)
    result = runner.invoke(build_cli(), ["run", str(program), "--inputs", str(x), "--out", str(tmp_path / "y")])
    assert result.exit_code == 1
    assert "parameter 'w'" in result.output and "was not provided" in result.output
    assert "Traceback" not in result.output


def test_run_on_a_file_that_is_not_difir(runner, tmp_path):
    bogus = tmp_path / "bogus.difir"
    bogus.write_bytes(b"not a program at all, just bytes")
    result = runner.invoke(build_cli(), ["inspect", str(bogus)])
    assert result.exit_code == 1
    assert str(bogus) in result.output
    assert result.output.count("\n") == 1


def test_help_imports_no_heavy_library():
    code = (
        "import sys\n"
        "from dif_tools.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Commands:" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY=", proc.stdout


def test_python_dash_m_entry_point(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dif_tools", "inspect", str(tmp_path / "missing.difir")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("Error:") and "missing.difir" in proc.stderr

"""dif-core alone: `pip install ./dif-core` into a fresh venv, import it, run its own tests there.

Proves the core has no hidden dependency on another distribution or on a package that only the
monorepo's install.sh brings. Slow (builds a venv); CI runs it with everything else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "DIF_"))}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=900, **kwargs)


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("core-venv") / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", "-q"]
    installed = _run([*pip, f"{REPO / 'dif-core'}[test]"])
    assert installed.returncode == 0, installed.stdout[-4000:] + installed.stderr[-4000:]
    return python


def test_dif_core_imports_alone_with_no_plugins(core_venv):
    code = (
        "import importlib.util, dif, dif.ops, dif.runtime, dif.telemetry, dif.formats\n"
        "from dif.plugins import load_plugins, backends\n"
        "assert load_plugins() == [], load_plugins()\n"
        "assert backends() == {}\n"
        "assert importlib.util.find_spec('dif_backend_cpu') is None\n"
        "assert 'site-packages' in dif.__file__, dif.__file__\n"
        "print('ok', dif.__version__)\n"
    )
    proc = _run([str(core_venv), "-c", code], cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok ")


def test_dif_core_tests_pass_in_the_fresh_venv(core_venv):
    proc = _run(
        [str(core_venv), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow", "dif-core/tests"],
        cwd=REPO,
    )
    tail = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout

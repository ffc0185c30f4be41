"""The whole tree is ruff-clean under the root config (line length, import layering, banned oracle imports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO, capture_output=True, text=True)
    report = proc.stdout[-4000:] + proc.stderr
    assert proc.returncode == 0, f"ruff check . failed (ruff comes with ./install.sh):\n{report}"

"""Options of the cross-distribution tests: `--update-golden` rewrites tests/golden/ (see test_golden.py)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the golden files in tests/golden/ from the current code instead of comparing against them",
    )

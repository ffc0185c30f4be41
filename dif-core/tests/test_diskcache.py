"""`dif.diskcache`: an entry reads back only for its own key and only when intact; anything else is a
miss with a warning, and the bad file is gone so the caller's rebuild replaces it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dif.diskcache import MAGIC, key_digest, read_entry, write_entry
from dif.errors import DifWarning

KEY = {"arch": "sm_90", "source": "abc123", "compiler": "12.8"}


def test_round_trip_and_miss(tmp_path: Path) -> None:
    path = tmp_path / "sub" / f"gemm-{key_digest(KEY)}.bin"
    assert read_entry(path, KEY) is None  # nothing there: a plain miss, no warning
    write_entry(path, b"\x00cubin bytes\xff", KEY)
    assert read_entry(path, KEY) == b"\x00cubin bytes\xff"
    assert key_digest(KEY) == key_digest(dict(reversed(list(KEY.items()))))  # order-blind
    assert key_digest(KEY) != key_digest({**KEY, "arch": "sm_80"})


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda b: b[:-3], "truncated"),
        (lambda b: b[:-5] + b"XXXXX", "checksum"),
        (lambda b: b[: len(MAGIC) + 2], "not a dif cache entry|truncated"),
        (lambda b: b"garbage" + b, "not a dif cache entry"),
        (lambda b: b[: len(MAGIC) + 4] + b"}" + b[len(MAGIC) + 5 :], "damaged header"),
    ],
)
def test_damaged_entries_warn_and_are_removed(tmp_path: Path, damage, why: str) -> None:  # noqa: ANN001
    path = tmp_path / "entry.bin"
    write_entry(path, b"payload" * 100, KEY)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.warns(DifWarning, match=why):
        assert read_entry(path, KEY) is None
    assert not path.exists()
    write_entry(path, b"rebuilt", KEY)  # the caller's rebuild is then trusted again
    assert read_entry(path, KEY) == b"rebuilt"


def test_an_entry_for_another_key_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "entry.bin"
    write_entry(path, b"for sm_80", {**KEY, "arch": "sm_80"})
    with pytest.warns(DifWarning, match="another key"):
        assert read_entry(path, KEY) is None

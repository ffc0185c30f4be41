"""read_json_object: every way a config file can be wrong is a ConfigError naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from dif.checkpoint import read_json_object
from dif.errors import ConfigError


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "file not found"), (b"{", "not readable JSON"), (b"\xff\xfe", "not readable JSON"), (b"[1]", "object")],
)
def test_bad_config_files(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as info:
        read_json_object(path, hint="point at a model folder")
    assert str(path) in str(info.value)


def test_a_folder_in_place_of_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").mkdir()
    with pytest.raises(ConfigError, match="not readable JSON"):
        read_json_object(tmp_path / "config.json")


def test_a_good_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"a": 1}')
    assert read_json_object(tmp_path / "config.json") == {"a": 1}

"""The FrontendInfo contract: settings with bounds, cross-setting validation, detection."""

from __future__ import annotations

from pathlib import Path

import pytest

from dif.errors import CheckpointError, UsageError
from dif.frontend import FrontendInfo, SettingSpec, detect_frontend


def _no_guidance_when_distilled(settings: dict) -> dict:
    if settings["distilled"] and settings["guidance"] != 1.0:
        raise UsageError("distilled checkpoints ignore guidance; leave it at 1.0")
    return settings


FAMILY = FrontendInfo(
    "fam",
    "a test family",
    detect=lambda p: (p / "fam.json").exists() if p.is_dir() else False,
    variants=("small", "large"),
    settings=(
        SettingSpec("steps", 4, "denoising steps", minimum=1, maximum=100),
        SettingSpec("guidance", 1.0, "classifier-free guidance scale", minimum=0.0),
        SettingSpec("width", 512, "image width", minimum=64, multiple_of=16),
        SettingSpec("sampler", "euler", choices=("euler", "heun")),
        SettingSpec("distilled", True),
    ),
    validate=_no_guidance_when_distilled,
)


def test_defaults_and_overrides():
    assert FAMILY.defaults() == {"steps": 4, "guidance": 1.0, "width": 512, "sampler": "euler", "distilled": True}
    got = FAMILY.resolve_settings({"steps": "8", "width": 1024, "guidance": None})
    assert got["steps"] == 8 and got["width"] == 1024 and got["guidance"] == 1.0
    assert FAMILY.resolve_settings({"distilled": "false", "guidance": 3.5})["distilled"] is False
    assert FAMILY.to_dict()["variants"] == ["small", "large"]
    assert FAMILY.to_dict()["settings"][0] == {"name": "steps", "help": FAMILY.settings[0].help, "by_kind": {}}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"steps": 0}, "below the minimum"),
        ({"steps": 500}, "above the maximum"),
        ({"width": 520}, "not a multiple of 16"),
        ({"sampler": "ddim"}, "not one of"),
        ({"steps": "many"}, "must be int"),
        ({"distilled": "maybe"}, "must be true or false"),
        ({"seed_typo": 1}, "unknown setting 'seed_typo'"),
        ({"guidance": 4.0}, "distilled checkpoints ignore guidance"),
    ],
)
def test_bad_settings_are_usage_errors(overrides, message):
    with pytest.raises(UsageError, match=message):
        FAMILY.resolve_settings(overrides)


def test_detect_frontend(tmp_path: Path):
    other = FrontendInfo("other", "never matches", detect=lambda p: False)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with pytest.raises(CheckpointError, match="no frontend recognises"):
        detect_frontend(ckpt, {"fam": FAMILY, "other": other})
    (ckpt / "fam.json").write_text("{}")
    assert detect_frontend(ckpt, {"fam": FAMILY, "other": other}) is FAMILY
    greedy = FrontendInfo("greedy", "matches all", detect=lambda p: True)
    with pytest.raises(CheckpointError, match="several frontends"):
        detect_frontend(ckpt, {"fam": FAMILY, "greedy": greedy})
    with pytest.raises(CheckpointError, match="no such file"):
        detect_frontend(tmp_path / "missing", {"fam": FAMILY})


def test_detector_crash_names_the_frontend(tmp_path: Path):
    def crash(path: Path) -> bool:
        raise ValueError("bad json")

    with pytest.raises(CheckpointError, match="frontend 'crashy' failed while inspecting"):
        detect_frontend(tmp_path, {"crashy": FrontendInfo("crashy", "d", detect=crash)})

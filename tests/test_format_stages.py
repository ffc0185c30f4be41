"""Which programs of a pipeline a format pass converts (`DIF_FORMAT_STAGES`, `dif.passes.quantize.scoped_to_stage`):
by default the denoiser's only, the others' plans saying the pass was held back; `all` runs it on every program;
an unknown stage is refused naming the known ones. On the CPU backend over the embedded FLUX.2 [klein]
pipeline with `quantize_int4`, the format the CPU executes."""

from __future__ import annotations

import pytest

import dif
from dif.errors import UsageError
from dif.image_pipeline import ImageRequest
from dif.plugins import isolated_plugins


def plans_by_stage(monkeypatch: pytest.MonkeyPatch, stages: str | None) -> dict[str, list[str]]:
    """Stage -> the decision lines of its programs after one 64x64 generate with `quantize_int4` appended."""
    monkeypatch.setenv("DIF_PASSES", "default,quantize_int4")
    if stages is None:
        monkeypatch.delenv("DIF_FORMAT_STAGES", raising=False)
    else:
        monkeypatch.setenv("DIF_FORMAT_STAGES", stages)
    with isolated_plugins(None):
        pipe = dif.load(None, backend="cpu", dtype="bf16").pipeline
        pipe.generate(ImageRequest("a red square", seed=0, width=64, height=64, steps=1))
        out: dict[str, list[str]] = {}
        for stage, _program, decisions in pipe.optimized_programs().values():
            out.setdefault(stage, []).extend(f"{d.what}: {d.why}" for d in decisions)
    return out


def test_by_default_only_the_denoiser_gets_the_format(monkeypatch: pytest.MonkeyPatch) -> None:
    plans = plans_by_stage(monkeypatch, None)
    assert any(line.startswith("quantize_int4: applied") for line in plans["denoise"])
    assert not any("not run" in line for line in plans["denoise"])
    for stage in ("encode", "decode"):
        held = [line for line in plans[stage] if line.startswith("formats: quantize_int4 not run")]
        assert held and "DIF_FORMAT_STAGES=denoise" in held[0], plans[stage]
        assert sum("DIF_FORMAT_STAGES" in line for line in plans[stage]) == 1  # the reason given once
        assert not any(line.startswith("quantize_int4:") for line in plans[stage])


def test_all_stages_run_the_format_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    plans = plans_by_stage(monkeypatch, "all")
    for stage in ("encode", "denoise", "decode"):
        assert any(line.startswith("quantize_int4:") for line in plans[stage]), plans[stage]
        assert not any("not run" in line for line in plans[stage])


def test_an_unknown_stage_is_refused_naming_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match=r"DIF_FORMAT_STAGES: unknown stage denoiser") as err:
        plans_by_stage(monkeypatch, "denoiser")
    assert "encode, denoise, decode" in str(err.value.hint)

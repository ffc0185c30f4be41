"""One memory budget for a pipeline: `dif.plan.pipeline.decide_pipeline_residency` (the strategies in order,
their arithmetic, the error naming the program) and `ProgramCache` acting on it on a fake backend
(what is prepared and released at which stage, re-preparing on the next run, nothing read on failure)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pytest

import dif
import dif.ops  # noqa: F401  (registers the core ops)
from dif.backend import Availability, BackendInfo
from dif.errors import PlanError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plan.pipeline import (
    ALL_RESIDENT,
    ONE_STAGE_AT_A_TIME,
    RELEASE_TEXT_ENCODER,
    STREAM_DENOISER,
    ProgramNeed,
    decide_pipeline_residency,
)
from dif.plugins import isolated_plugins, register_plugin
from dif.program_cache import ProgramCache
from dif.target import RuntimeBudget, TargetProfile

NEEDS = [ProgramNeed("text", "encode", 400), ProgramNeed("denoiser", "denoise", 600), ProgramNeed("vae", "decode", 300)]


def _streams_down_to(minimum: int):  # noqa: ANN202
    asked: list[tuple[str, int]] = []

    def plan_within(name: str, nbytes: int) -> int:
        asked.append((name, nbytes))
        if nbytes < minimum:
            raise PlanError(f"program '{name}' does not fit: even streaming all weights needs {minimum} B")
        return min(nbytes, minimum + 1)

    return plan_within, asked


def test_all_resident_when_the_programs_fit_together() -> None:
    plan_within, asked = _streams_down_to(0)
    d = decide_pipeline_residency(NEEDS, 1300, plan_within)
    assert d.strategy == ALL_RESIDENT and d.all_resident and asked == []
    assert d.resident_during("denoise") == ("text", "denoiser", "vae")
    assert d.arithmetic.startswith("text 400 + denoiser 600 + vae 300 = 1300 B <= available 1300 B")


def test_release_the_text_encoder_when_denoiser_and_vae_fit_without_it() -> None:
    plan_within, asked = _streams_down_to(0)
    d = decide_pipeline_residency(NEEDS, 900, plan_within)
    assert d.strategy == RELEASE_TEXT_ENCODER and asked == []
    assert d.phases == {"encode": ("text",), "denoise": ("denoiser", "vae"), "decode": ("denoiser", "vae")}
    assert "1300 B > available 900 B" in d.arithmetic and "denoiser 600 + vae 300 = 900 B <= available" in d.arithmetic


def test_one_stage_at_a_time_rather_than_streaming_when_each_stage_fits_alone() -> None:
    plan_within, asked = _streams_down_to(450)
    d = decide_pipeline_residency(NEEDS, 800, plan_within)
    assert d.strategy == ONE_STAGE_AT_A_TIME and asked == []  # nothing streams: the denoiser fits alone
    assert d.phases == {"encode": ("text",), "denoise": ("denoiser",), "decode": ("vae",)}
    assert d.allowance_bytes == {"text": 400, "denoiser": 600, "vae": 300}
    assert "denoise: denoiser 600 = 600 B <= available" in d.arithmetic and "nothing streamed" in d.arithmetic


def test_stream_the_denoiser_within_what_the_vae_leaves() -> None:
    plan_within, asked = _streams_down_to(250)
    d = decide_pipeline_residency(NEEDS, 590, plan_within)  # the denoiser does not fit even alone
    assert d.strategy == STREAM_DENOISER and asked == [("denoiser", 290)]
    assert d.allowance_bytes == {"text": 400, "denoiser": 290, "vae": 300}
    assert "within available - the rest of its stages = 290 B (needs 251 B)" in d.arithmetic


def test_one_stage_at_a_time_when_the_denoiser_cannot_stream_beside_the_vae() -> None:
    plan_within, asked = _streams_down_to(550)
    d = decide_pipeline_residency(NEEDS, 560, plan_within)
    assert d.strategy == ONE_STAGE_AT_A_TIME and asked == [("denoiser", 260), ("denoiser", 560)]
    assert d.phases == {"encode": ("text",), "denoise": ("denoiser",), "decode": ("vae",)}
    assert d.allowance_bytes["denoiser"] == 560
    assert "denoise: 'denoiser' streams within 560 B (needs 551 B)" in d.arithmetic


def test_too_small_for_the_streamed_denoiser_names_it_the_need_and_the_budget() -> None:
    plan_within, _ = _streams_down_to(550)
    with pytest.raises(PlanError) as err:
        decide_pipeline_residency(NEEDS, 500, plan_within)
    message = str(err.value)
    assert "program 'denoiser' (denoise) does not fit the pipeline's memory budget of 500 B" in message
    assert "needs 550 B" in message and "raise --vram-budget" in (err.value.hint or "")


# -- ProgramCache on a fake backend -----------------------------------------------------------------------


class _Exe:
    def __init__(self, backend: FakeBackend, program: Program, weights: Mapping[str, np.ndarray]) -> None:
        self.backend, self.program, self.weights = backend, program, weights

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        for p in self.program.params:
            x = x @ np.asarray(self.weights[p.name]).T
        return {self.program.outputs[0]: x}

    def release(self) -> None:
        self.backend.events.append(("release", self.program.name))


class FakeBackend:
    name = "fake"

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def profile(self) -> TargetProfile:
        return TargetProfile(backend=self.name, device="fake", dtypes=("f32",))

    def budget(self) -> RuntimeBudget:
        return RuntimeBudget(free_memory_bytes=1 << 30)

    def prepare(self, program: Program, plan, weights):  # noqa: ANN001, ANN201
        self.events.append(("prepare", program.name))
        return _Exe(self, program, weights)


class Plugin:
    def __init__(self, backend: FakeBackend) -> None:
        self.backend = backend

    @dif.hookimpl
    def register_backends(self, register):  # noqa: ANN001, ANN201
        register(BackendInfo("fake", 0, "fake", lambda: Availability(True), lambda: self.backend))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBackend]:
    monkeypatch.delenv("DIF_BACKEND", raising=False)
    backend = FakeBackend()
    with isolated_plugins(""):
        register_plugin(Plugin(backend), "fake")
        yield backend


class _Recorded(dict):  # weights that say which were read
    def __init__(self, arrays: dict[str, np.ndarray], read: list[str]) -> None:
        super().__init__(arrays)
        self.read = read

    def __getitem__(self, name: str) -> np.ndarray:
        self.read.append(name)
        return super().__getitem__(name)


def _chain(name: str, layers: int, width: int, read: list[str]) -> tuple[Program, Mapping[str, np.ndarray]]:
    """`layers` linear layers of width x width f32 (each weight its own streamable block)."""
    b = ProgramBuilder(name)
    x = b.input("x", (1, width), "f32")
    rng = np.random.default_rng(len(name))
    weights = {}
    for i in range(layers):
        w = b.param(f"w{i}", (width, width), "f32")
        weights[f"w{i}"] = rng.standard_normal((width, width), dtype=np.float32) / width
        x = b.emit("linear", x, w)
    b.output(x)
    return b.build(), _Recorded(weights, read)


PROGRAMS = {"text": ("encode", 2, 64), "denoiser": ("denoise", 4, 128), "vae": ("decode", 2, 128)}
"""(stage, layers, width): the denoiser streams no lower than two of its 64 KiB weights, the VAE's half."""


def _register(cache: ProgramCache, read: list[str]) -> dict[str, object]:
    with cache.planning():
        return {
            name: cache.get(name, lambda n=name, s=spec: _chain(n, s[1], s[2], read), spec[0])
            for name, spec in PROGRAMS.items()
        }


def _run_stages(cache: ProgramCache, runners: dict[str, object]) -> np.ndarray:
    x = np.ones((1, 64), np.float32)
    cache.enter("encode")
    x = runners["text"]({"x": x})  # type: ignore[operator]
    cache.enter("denoise")
    (h,) = x.values()
    y = runners["denoiser"]({"x": np.tile(h, (1, 2))})  # type: ignore[operator]
    cache.enter("decode")
    (z,) = y.values()
    (out,) = runners["vae"]({"x": z}).values()  # type: ignore[operator]
    return out


def _sizes(fake: FakeBackend) -> dict[str, int]:
    cache = ProgramCache()
    _register(cache, [])
    return {name: r["all_resident_bytes"] for name, r in cache.memory_report()["programs"].items()}


def test_cache_prepares_everything_up_front_when_it_fits(fake: FakeBackend) -> None:
    cache = ProgramCache()
    runners = _register(cache, [])
    assert fake.events == [("prepare", "text"), ("prepare", "denoiser"), ("prepare", "vae")]
    _run_stages(cache, runners)
    assert [e for e in fake.events if e[0] == "release"] == []
    assert cache.memory_report()["pipeline"]["fake"]["strategy"] == ALL_RESIDENT


def test_cache_one_stage_at_a_time_releases_before_preparing_and_again_next_run(fake: FakeBackend) -> None:
    sizes = _sizes(fake)
    fake.events.clear()
    reference = _run_stages(c := ProgramCache(), _register(c, []))
    fake.events.clear()
    cache = ProgramCache(vram_budget=max(sizes.values()))
    runners = _register(cache, [])
    assert fake.events == []  # nothing prepared in "load": the stages do it
    out = _run_stages(cache, runners)
    assert fake.events == [
        ("prepare", "text"),
        ("release", "text"),
        ("prepare", "denoiser"),
        ("release", "denoiser"),
        ("prepare", "vae"),
    ]
    np.testing.assert_array_equal(out, reference)
    fake.events.clear()
    runners = _register(cache, [])  # the next call of a long-lived pipeline
    np.testing.assert_array_equal(_run_stages(cache, runners), reference)
    assert fake.events[:2] == [("release", "vae"), ("prepare", "text")]
    report = cache.memory_report()
    assert report["programs"]["text"]["prepared"] == 2
    assert report["pipeline"]["fake"]["strategy"] == ONE_STAGE_AT_A_TIME
    assert any(d.what.startswith("pipeline residency: one-stage-at-a-time") for d in _prepared_plan(cache, "vae"))


def _prepared_plan(cache: ProgramCache, key: str):  # noqa: ANN202
    entry = cache._entries[key]
    return cache._with_decision(entry, cache.decision["fake"]).decisions


def test_cache_streams_the_denoiser_when_alone_it_does_not_fit(fake: FakeBackend) -> None:
    sizes = _sizes(fake)
    fake.events.clear()
    cap = sizes["denoiser"] - 1  # above the text encoder and the VAE, below the whole denoiser
    assert cap > max(sizes["text"], sizes["vae"])
    cache = ProgramCache(vram_budget=cap)
    _run_stages(cache, _register(cache, []))
    report = cache.memory_report()
    # beside the VAE it has less than its two largest weights: no room; alone in its stage it streams
    assert report["pipeline"]["fake"]["strategy"] == ONE_STAGE_AT_A_TIME
    assert report["programs"]["denoiser"]["streamed_params"] > 0
    assert report["programs"]["denoiser"]["min_memory_bytes"] <= cap
    assert report["programs"]["text"]["streamed_params"] == 0


def test_cache_too_small_for_the_streamed_denoiser_fails_before_reading_weights(fake: FakeBackend) -> None:
    sizes = _sizes(fake)
    fake.events.clear()
    read: list[str] = []
    cap = sizes["text"] + 1024  # the text encoder fits; the streamed denoiser (two 64 KiB blocks) does not
    cache = ProgramCache(vram_budget=cap)
    with pytest.raises(PlanError) as err:
        _register(cache, read)
    message = str(err.value)
    assert f"within the memory budget of {cap} B: program 'denoiser' does not fit" in message
    assert f"B, but only available {cap} B" in message and "needs" in message
    assert read == [] and fake.events == []


def test_programs_of_an_earlier_size_make_room_for_this_runs(fake: FakeBackend) -> None:
    sizes = _sizes(fake)
    fake.events.clear()
    cache = ProgramCache(vram_budget=sum(sizes.values()))  # one run's programs fit together, not more
    _register(cache, [])
    assert cache.memory_report()["pipeline"]["fake"]["strategy"] == ALL_RESIDENT
    fake.events.clear()
    with cache.planning():  # the next call, at another size: a new denoiser beside the same text encoder and VAE
        cache.get("text", lambda: _chain("text", 2, 64, []), "encode")
        cache.get(("denoiser", 2), lambda: _chain("denoiser", 4, 128, []), "denoise")
        cache.get("vae", lambda: _chain("vae", 2, 128, []), "decode")
    assert fake.events == [("release", "denoiser"), ("prepare", "denoiser")]
    assert cache.releases == ["denoiser before this run"]
    assert cache.memory_report()["pipeline"]["fake"]["strategy"] == ALL_RESIDENT

"""dif.runtime: choosing a backend (priority, DIF_BACKEND, clear errors) and prepare() through the planner."""

from __future__ import annotations

import numpy as np
import pytest

import dif
import dif.ops  # noqa: F401  (registers the core ops)
from dif.backend import Availability, BackendInfo
from dif.errors import BackendError, BackendUnavailableError
from dif.ir.builder import ProgramBuilder
from dif.plugins import isolated_plugins, register_plugin
from dif.program_cache import ProgramCache
from dif.runtime import backend_status, describe_backends, get_backend, prepare
from dif.target import RuntimeBudget, TargetProfile


class FakeBackend:
    def __init__(self, name: str) -> None:
        self.name = name
        self.prepared: list[tuple] = []

    def profile(self) -> TargetProfile:
        return TargetProfile(backend=self.name, device="fake", dtypes=("f32",))

    def budget(self) -> RuntimeBudget:
        return RuntimeBudget(free_memory_bytes=1 << 30)

    def prepare(self, program, plan, weights):
        self.prepared.append((program, plan, dict(weights)))
        return lambda inputs: {"unused": inputs}


def _info(name: str, priority: int, ok: bool = True, create=None) -> BackendInfo:
    return BackendInfo(
        name,
        priority,
        f"fake {name}",
        lambda: Availability(ok, "" if ok else f"{name} hardware absent"),
        create or (lambda: FakeBackend(name)),
    )


class Plugin:
    def __init__(self, *infos: BackendInfo) -> None:
        self.infos = infos

    @dif.hookimpl
    def register_backends(self, register):
        for info in self.infos:
            register(info)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("DIF_BACKEND", raising=False)
    with isolated_plugins(""):
        yield


def test_highest_priority_available_backend_wins():
    register_plugin(Plugin(_info("low", 0), _info("high", 10), _info("best_but_absent", 99, ok=False)), "p")
    assert [info.name for info, _ in backend_status()] == ["best_but_absent", "high", "low"]
    assert get_backend().name == "high"
    assert get_backend("low").name == "low"


def test_dif_backend_env_picks_the_default(monkeypatch):
    register_plugin(Plugin(_info("low", 0), _info("high", 10)), "p")
    monkeypatch.setenv("DIF_BACKEND", "low")
    assert get_backend().name == "low"
    assert get_backend("high").name == "high"  # an explicit name beats the env var


def test_unavailable_backend_error_gives_the_reason():
    register_plugin(Plugin(_info("cpu", 0), _info("gpu", 10, ok=False)), "p")
    with pytest.raises(BackendUnavailableError, match="backend 'gpu' is not available: gpu hardware absent"):
        get_backend("gpu")


def test_unknown_backend_error_lists_known_names():
    register_plugin(Plugin(_info("cpu", 0), _info("gpu", 10, ok=False)), "p")
    with pytest.raises(BackendUnavailableError, match=r"unknown backend 'tpu' \(known backends: cpu, gpu\)"):
        get_backend("tpu")


def test_a_named_backend_is_the_only_one_probed():
    asked: list[str] = []

    def probing(name: str) -> BackendInfo:
        def available() -> Availability:
            asked.append(f"{name}.available")
            return Availability(True, "")

        def priority() -> int:
            asked.append(f"{name}.priority")
            return 10

        return BackendInfo(name, priority, f"fake {name}", available, lambda: FakeBackend(name))

    register_plugin(Plugin(probing("slow"), _info("cpu", 0)), "p")
    assert get_backend("cpu").name == "cpu"
    assert asked == []  # neither the other backend's availability nor its callable priority
    assert get_backend().name == "slow"  # automatic selection asks both
    assert asked == ["slow.priority", "slow.available"]


def test_no_backend_at_all():
    with pytest.raises(BackendUnavailableError, match="no backend is registered"):
        get_backend()
    register_plugin(Plugin(_info("gpu", 10, ok=False)), "p")
    with pytest.raises(BackendUnavailableError, match="gpu: gpu hardware absent"):
        get_backend()


def test_is_available_that_raises_becomes_a_reason():
    def explode() -> Availability:
        raise OSError("driver crashed")

    register_plugin(Plugin(BackendInfo("shaky", 1, "d", explode, lambda: FakeBackend("shaky"))), "p")
    ((_, avail),) = backend_status()
    assert not avail.ok and "OSError: driver crashed" in avail.reason


def test_create_failure_is_a_backend_error():
    def broken():
        raise RuntimeError("no context")

    register_plugin(Plugin(_info("broken", 1, create=broken)), "p")
    with pytest.raises(BackendError, match="failed to start: RuntimeError: no context"):
        get_backend("broken")


def test_describe_backends_reports_profiles_and_reasons():
    register_plugin(Plugin(_info("cpu", 0), _info("gpu", 10, ok=False)), "p")
    hardware, budgets = describe_backends()
    assert [(h["backend"], h["available"]) for h in hardware] == [("gpu", False), ("cpu", True)]
    assert hardware[0]["reason"] == "gpu hardware absent"
    assert hardware[1]["profile"]["device"] == "fake"
    assert budgets["cpu"].free_memory_bytes == 1 << 30


def test_prepare_plans_for_the_backend_profile_and_passes_weights():
    fake = FakeBackend("fake")
    register_plugin(Plugin(_info("fake", 0, create=lambda: fake)), "p")
    b = ProgramBuilder("tiny")
    x = b.input("x", (2, 4), "f32")
    w = b.param("w", (3, 4), "f32")
    b.output(b.emit("linear", x, w))
    program = b.build()
    weights = {"w": np.ones((3, 4), np.float32)}
    executable, plan = prepare(program, weights)
    assert callable(executable)
    ((prog, got_plan, got_weights),) = fake.prepared
    assert prog is program and got_plan is plan
    assert list(got_weights) == ["w"]
    assert plan.program_name == "tiny"
    assert plan.binding.target_backend == "fake"


class _Runs:
    def __init__(self, out: np.ndarray) -> None:
        self.out = out

    def run(self, inputs):
        return {"y": self.out}


def _linear_program():
    b = ProgramBuilder("tiny")
    x = b.input("x", (2, 4), "f32")
    w = b.param("w", (3, 4), "f32")
    b.output(b.emit("linear", x, w))
    return b.build()


def test_program_cache_prepares_once_per_key_and_tracks_the_largest_plan():
    fake = FakeBackend("fake")
    fake.prepare = lambda program, plan, weights: _Runs(np.zeros(1, np.float32))  # type: ignore[method-assign]
    register_plugin(Plugin(_info("fake", 0, create=lambda: fake)), "p")
    cache = ProgramCache()
    builds = []

    def build():
        builds.append(1)
        return _linear_program(), {"w": np.ones((3, 4), np.float32)}

    first = cache.get(("linear", 2), build)
    assert cache.get(("linear", 2), build) is first and len(builds) == 1
    assert cache.backend_name == "fake"
    assert cache.plan_peak_bytes >= 3 * 4 * 4  # at least the parameter bytes
    assert cache.load_seconds > 0


def test_program_cache_interp_runs_the_reference_interpreter():
    cache = ProgramCache("interp")
    run = cache.get("k", lambda: (_linear_program(), {"w": np.ones((3, 4), np.float32)}))
    (y,) = run({"x": np.ones((2, 4), np.float32)}).values()
    np.testing.assert_array_equal(y, np.full((2, 3), 4.0, np.float32))
    assert cache.backend_name == "interp" and cache.plan_peak_bytes == 0

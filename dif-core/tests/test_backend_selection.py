"""Op-aware backend selection (dif.runtime.get_backend with a program): a backend that lacks an op or a
dtype a program uses is never chosen for it; automatic selection falls through by priority, an explicit
request is refused before anything is prepared, and the error names the ops and the backends."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pytest

import dif
import dif.ops  # noqa: F401  (registers the core ops)
from dif.backend import Availability, BackendInfo
from dif.backend_checks import Coverage, coverage, program_dtypes, program_ops
from dif.errors import BackendError, BackendUnavailableError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plugins import isolated_plugins, register_plugin
from dif.program_cache import ProgramCache
from dif.runtime import get_backend, prepare
from dif.target import RuntimeBudget, TargetProfile

LINEAR_ONLY = frozenset({"linear"})


class FakeBackend:
    def __init__(self, name: str, dtypes: tuple[str, ...] = ("f32", "bf16"), caps: tuple[str, ...] = ()) -> None:
        self.name = name
        self.dtypes = dtypes
        self.caps = caps
        self.prepared: list[str] = []

    def profile(self) -> TargetProfile:
        return TargetProfile(backend=self.name, device="fake", dtypes=self.dtypes, capabilities=self.caps)

    def budget(self) -> RuntimeBudget:
        return RuntimeBudget(free_memory_bytes=1 << 30)

    def prepare(self, program, plan, weights):
        self.prepared.append(program.name)
        self.last_histogram = program.op_histogram()
        return self

    def run(self, inputs):
        return {}


class Fleet:
    """Fake backends by name, each created at most once, counting the creations."""

    def __init__(self) -> None:
        self.backends: dict[str, FakeBackend] = {}
        self.created: list[str] = []

    def info(
        self,
        name: str,
        priority: int,
        ops: Iterable[str] | Callable[[], Iterable[str]] | None = None,
        dtypes: tuple[str, ...] = ("f32", "bf16"),
        ok: bool = True,
        probe: bool = False,
        caps: tuple[str, ...] = (),
    ) -> BackendInfo:
        def create() -> FakeBackend:
            self.created.append(name)
            return self.backends.setdefault(name, FakeBackend(name, dtypes, caps))

        return BackendInfo(
            name,
            priority,
            f"fake {name}",
            lambda: Availability(ok, "" if ok else f"{name} hardware absent"),
            create,
            supported_ops=ops,
            probe=(lambda: FakeBackend(name, dtypes).profile()) if probe else None,
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


def _program(name: str = "mlp", *, act: str | None = "silu", dtype: str = "f32") -> Program:
    b = ProgramBuilder(name)
    x = b.input("x", (2, 4), dtype)
    w = b.param("w", (3, 4), dtype)
    y = b.emit("linear", x, w)
    b.output(b.emit(act, y) if act else y)
    return b.build()


def _weights(dtype: str = "f32") -> dict[str, np.ndarray]:
    from dif.dtypes import DType

    return {"w": np.ones((3, 4), DType(dtype).np)}


def test_a_program_needs_its_ops_and_dtypes():
    program = _program(dtype="bf16")
    assert program_ops(program) == {"linear", "silu"}
    assert program_dtypes(program) == {"bf16"}
    gap = coverage(program, "small", LINEAR_ONLY, ("f32",))
    assert gap == Coverage("small", ("silu",), ("bf16",))
    assert gap.describe() == "small lacks op silu and dtype bf16"
    assert coverage(program, "any", None, ()).ok  # nothing declared: nothing to refuse


def test_automatic_selection_falls_to_the_next_backend_that_has_every_op():
    fleet = Fleet()
    register_plugin(Plugin(fleet.info("fast", 10, LINEAR_ONLY), fleet.info("slow", 0)), "p")
    assert get_backend(program=_program(act=None)).name == "fast"
    assert get_backend(program=_program()).name == "slow"
    assert get_backend().name == "fast"  # without a program: priority and availability only
    _executable, plan = prepare(_program(), _weights())
    assert plan.binding.target_backend == "slow" and fleet.backends["slow"].prepared == ["mlp"]


def test_no_backend_with_the_op_is_an_error_naming_op_and_backends():
    fleet = Fleet()
    infos = (
        fleet.info("fast", 10, LINEAR_ONLY),
        fleet.info("slow", 0, {"linear", "gelu"}),
        fleet.info("gpu", 99, ok=False),
    )
    register_plugin(Plugin(*infos), "p")
    with pytest.raises(BackendUnavailableError) as exc:
        get_backend(program=_program())
    message = str(exc.value)
    assert "no available backend can run program 'mlp'" in message
    assert "fast lacks op silu; slow lacks op silu" in message
    assert "not available: gpu: gpu hardware absent" in message
    assert fleet.created == []  # refused from the declarations, nothing was started


def test_an_explicitly_requested_backend_that_lacks_an_op_is_refused(monkeypatch):
    fleet = Fleet()
    register_plugin(Plugin(fleet.info("fast", 10, LINEAR_ONLY), fleet.info("slow", 0)), "p")
    with pytest.raises(BackendUnavailableError, match="backend 'fast' cannot run program 'mlp': fast lacks op silu"):
        get_backend("fast", program=_program())
    monkeypatch.setenv("DIF_BACKEND", "fast")  # the env var is a request too: no silent fallback
    with pytest.raises(BackendUnavailableError, match="fast lacks op silu"):
        prepare(_program(), _weights())
    assert get_backend("slow", program=_program()).name == "slow"  # an explicit name beats the env var
    assert "fast" not in fleet.created


def test_a_backend_instance_is_refused_before_prepare_when_its_registration_lacks_an_op():
    fleet = Fleet()
    register_plugin(Plugin(fleet.info("fast", 10, LINEAR_ONLY)), "p")
    fast = get_backend("fast")
    with pytest.raises(BackendUnavailableError, match="fast lacks op silu"):
        prepare(_program(), _weights(), backend=fast)
    assert fleet.backends["fast"].prepared == []


def _norm_then_modulate() -> Program:
    b = ProgramBuilder("mod")
    x, scale, shift = (
        b.input("x", (2, 5, 16), "f32"),
        b.input("scale", (2, 1, 16), "f32"),
        b.input("shift", (2, 1, 16), "f32"),
    )
    b.output(b.emit("modulate", b.emit("layer_norm", x, eps=1e-6), scale, shift))
    return b.build()


def test_an_op_the_optimizer_made_is_checked_on_the_program_actually_prepared():
    fleet = Fleet()
    fused = ("op:norm_modulate",)  # the profile lets the optimizer fuse...
    register_plugin(Plugin(fleet.info("sloppy", 10, {"layer_norm", "modulate"}, caps=fused)), "p")
    with pytest.raises(BackendUnavailableError, match="program 'mod': sloppy lacks op norm_modulate"):
        prepare(_norm_then_modulate(), {}, passes=["fuse_norm_modulate"])  # ...but the registration has no lowering
    assert fleet.backends["sloppy"].prepared == []


def test_a_fused_op_declared_on_both_sides_is_prepared():
    fleet = Fleet()
    ops = {"layer_norm", "modulate", "norm_modulate"}
    register_plugin(Plugin(fleet.info("fuses", 10, ops, caps=("op:norm_modulate",))), "p")
    _executable, plan = prepare(_norm_then_modulate(), {}, passes=["fuse_norm_modulate"])
    assert plan.binding.target_backend == "fuses" and fleet.backends["fuses"].prepared == ["mod"]
    assert fleet.backends["fuses"].last_histogram == {"norm_modulate": 1}


def test_a_missing_dtype_falls_through_and_a_probe_spares_creating_the_backend():
    fleet = Fleet()
    infos = (fleet.info("f32_only", 10, dtypes=("f32",), probe=True), fleet.info("wide", 0))
    register_plugin(Plugin(*infos), "p")
    assert get_backend(program=_program(dtype="bf16")).name == "wide"
    assert fleet.created == ["wide"]  # f32_only's probe answered; it was never created
    with pytest.raises(BackendUnavailableError, match="f32_only lacks dtype bf16"):
        get_backend("f32_only", program=_program(dtype="bf16"))
    assert get_backend(program=_program()).name == "f32_only"


def test_a_missing_dtype_without_a_probe_is_found_from_the_created_backend():
    fleet = Fleet()
    register_plugin(Plugin(fleet.info("f32_only", 10, dtypes=("f32",)), fleet.info("wide", 0)), "p")
    assert get_backend(program=_program(dtype="bf16")).name == "wide"


def test_program_cache_selects_per_program_and_creates_each_backend_once():
    fleet = Fleet()
    register_plugin(Plugin(fleet.info("fast", 10, LINEAR_ONLY), fleet.info("slow", 0)), "p")
    cache = ProgramCache()
    assert cache.backend_name == "fast"  # nothing prepared yet: the default
    cache.get("linear", lambda: (_program("linear", act=None), _weights()))
    cache.get("mlp", lambda: (_program(), _weights()))
    cache.get("linear again", lambda: (_program("linear2", act=None), _weights()))
    assert fleet.backends["fast"].prepared == ["linear", "linear2"]
    assert fleet.backends["slow"].prepared == ["mlp"]
    assert sorted(fleet.created) == ["fast", "slow"]
    assert cache.backend_name == "fast"  # the latest program's


def test_program_cache_with_a_requested_backend_refuses_a_program_it_cannot_run():
    fleet = Fleet()
    register_plugin(Plugin(fleet.info("fast", 10, LINEAR_ONLY), fleet.info("slow", 0)), "p")
    cache = ProgramCache("fast")
    with pytest.raises(BackendUnavailableError, match="backend 'fast' cannot run program 'mlp'"):
        cache.get("mlp", lambda: (_program(), _weights()))
    assert "slow" not in fleet.created


def test_supported_ops_may_be_a_function_and_a_broken_one_names_the_backend():
    fleet = Fleet()

    def broken() -> list[str]:
        raise ImportError("no lowering table")

    register_plugin(Plugin(fleet.info("lazy", 10, lambda: ["linear"]), fleet.info("broken", 5, broken)), "p")
    assert get_backend(program=_program(act=None)).name == "lazy"
    with pytest.raises(BackendError, match="backend 'broken': supported_ops raised ImportError: no lowering table"):
        get_backend(program=_program())


def test_supported_ops_must_be_names_not_one_string():
    with pytest.raises(TypeError, match="not the string 'linear'"):
        Fleet().info("x", 0, "linear")

"""The load-time NaN / inf scan handed to the backend that uploads the weights (`deferred_scans`,
`PendingScan`, `ProgramCache`): a backend that tests its uploads gets the scan, every other backend keeps
the host's, and either way a damaged tensor is refused by name before its program first runs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pytest

import dif
import dif.ops  # noqa: F401  (registers the core ops)
import dif.weights.scan as scan
from dif.backend import Availability, BackendInfo
from dif.errors import WeightError
from dif.ir import ProgramBuilder
from dif.ir.program import Program
from dif.plugins import isolated_plugins, register_plugin
from dif.program_cache import ProgramCache
from dif.target import RuntimeBudget, TargetProfile
from dif.weights import ArraySource, bind_weights
from dif.weights.bind import deferred_scans, prefixed_scans
from dif.weights.scan import has_nonfinite


def _program(name: str = "toy") -> Program:
    b = ProgramBuilder(name)
    x = b.input("x", (1, 3), "f32")
    w = b.param("w", (2, 3), "f32")
    b.output(b.emit("linear", x, w))
    return b.build()


def _source(bad: bool, label: str = "model.safetensors") -> ArraySource:
    w = np.ones((2, 3), np.float32)
    if bad:
        w[0, 2] = np.inf
    return ArraySource({"w": w}, label=label)


@pytest.fixture
def scanned(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The tensor lists the host scan was asked about, in order."""
    asked: list[list[str]] = []
    real = scan.nonfinite_counts
    monkeypatch.setattr(scan, "nonfinite_counts", lambda src, names: asked.append(list(names)) or real(src, names))
    return asked


def test_bind_inside_deferred_scans_leaves_the_scan_pending(scanned: list[list[str]]) -> None:
    source = _source(bad=True)
    with deferred_scans() as pending:
        bound = bind_weights(_program(), source)  # type: ignore[arg-type]
    assert set(bound) == {"w"} and scanned == []  # bound, nothing read yet
    (job,) = pending
    assert (job.program, dict(job.tensors)) == ("toy", {"w": "w"})
    with pytest.raises(WeightError, match=r"program 'toy': 1 weight tensor\(s\) hold NaN / infinite values: 'w' in"):
        job.on_host()


def test_scans_of_an_inlined_part_name_the_whole_programs_parameters(scanned: list[list[str]]) -> None:
    """A part bound for a program that inlines it under a prefix: the device's report on the whole program
    (parameter 'unet.w') covers the part's tensor, so the host reads nothing."""
    with deferred_scans() as pending, prefixed_scans("unet."):
        bind_weights(_program(), _source(bad=False))  # type: ignore[arg-type]
    (job,) = pending
    assert dict(job.tensors) == {"unet.w": "w"}
    job.report(flagged=set(), covered={"unet.w"})
    assert scanned == []
    with prefixed_scans("unet."):  # outside deferred_scans: the scan runs at bind, as without the prefix
        bind_weights(_program(), _source(bad=False))  # type: ignore[arg-type]
    assert scanned == [["w"]]


def test_a_report_recounts_what_the_device_flagged_and_scans_what_it_did_not_cover(scanned: list[list[str]]) -> None:
    with deferred_scans() as pending:
        bind_weights(_program(), _source(bad=True))  # type: ignore[arg-type]
    with pytest.raises(WeightError, match=r"'w' in model.safetensors \(1 of 6 values\)"):
        pending[0].report(flagged={"w"}, covered={"w"})
    with pytest.raises(WeightError, match="'w'"):  # not covered (a derived parameter replaced it): host scan
        pending[0].report(flagged=set(), covered=set())
    assert scanned == [["w"], ["w"]]


def test_a_clean_report_marks_the_tensors_known_finite(scanned: list[list[str]]) -> None:
    source = _source(bad=False)
    with deferred_scans() as pending:
        bind_weights(_program(), source)  # type: ignore[arg-type]
    pending[0].report(flagged=set(), covered={"w"})
    assert scanned == []  # the device's word taken: nothing read on the host
    with deferred_scans() as again:
        bind_weights(_program("toy_at_another_size"), source)  # type: ignore[arg-type]
    assert again == []  # known clean for the process: no second scan anywhere


# -- through a pipeline's program cache --------------------------------------------------------------


class _Exe:
    def __init__(self, program: Program, weights: Mapping[str, np.ndarray]) -> None:
        self.program, self.weights = program, weights

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from dif.interp import interpret

        return interpret(self.program, inputs, dict(self.weights))


class DeviceScanning:
    """A backend that tests the weights it uploads (as CUDA does), recording what it was asked."""

    name = "scanning"
    scans_weights_on_device = True

    def __init__(self) -> None:
        self.events: list[str] = []

    def profile(self) -> TargetProfile:
        return TargetProfile(backend=self.name, device="fake", dtypes=("f32",))

    def budget(self) -> RuntimeBudget:
        return RuntimeBudget(free_memory_bytes=1 << 30)

    def prepare(self, program: Program, plan, weights, nonfinite_check=None):  # noqa: ANN001, ANN201
        self.events.append("prepare")
        assert nonfinite_check is not None
        params = {p.name for p in program.params}
        nonfinite_check({n for n in params if has_nonfinite(np.asarray(weights[n]))}, params)
        self.events.append("checked")
        return _Exe(program, weights)


class _Plugin:
    def __init__(self, backend: DeviceScanning) -> None:
        self.backend = backend

    @dif.hookimpl
    def register_backends(self, register):  # noqa: ANN001, ANN201
        name = self.backend.name
        register(BackendInfo(name, 0, "fake", lambda: Availability(True), lambda: self.backend))


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> Iterator[DeviceScanning]:
    monkeypatch.delenv("DIF_BACKEND", raising=False)
    backend = DeviceScanning()
    with isolated_plugins(""):
        register_plugin(_Plugin(backend), "scanning")
        yield backend


def test_a_scanning_backend_gets_the_scan_and_refuses_before_the_first_run(
    device: DeviceScanning, scanned: list[list[str]]
) -> None:
    cache = ProgramCache()
    with pytest.raises(WeightError, match=r"program 'toy': 1 weight tensor\(s\) .*'w' in bad.safetensors"):
        cache.get("bad", lambda: (_program(), bind_weights(_program(), _source(True, "bad.safetensors"))))
    assert device.events == ["prepare"]  # refused inside prepare, before anything ran
    assert scanned == [["w"]]  # only the flagged tensor was counted on the host, for the message

    runner = cache.get("good", lambda: (_program("good"), bind_weights(_program("good"), _source(False))))
    out = runner({"x": np.ones((1, 3), np.float32)})
    np.testing.assert_array_equal(next(iter(out.values())), [[3.0, 3.0]])
    assert device.events[-2:] == ["prepare", "checked"] and scanned == [["w"]]


class HostScanned(DeviceScanning):
    """A backend that does not test its uploads: it must never be handed the scan."""

    name = "host-scanned"
    scans_weights_on_device = False

    def prepare(self, program: Program, plan, weights, nonfinite_check=None):  # noqa: ANN001, ANN201
        assert nonfinite_check is None
        self.events.append("prepare")
        return _Exe(program, weights)


def test_a_backend_without_device_scans_keeps_the_host_scan_before_preparing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DIF_BACKEND", raising=False)
    backend = HostScanned()
    plugin = _Plugin(backend)  # type: ignore[arg-type]
    with isolated_plugins(""):
        register_plugin(plugin, "host-scanned")
        cache = ProgramCache()
        with pytest.raises(WeightError, match="'w' in bad.safetensors"):
            cache.get("bad", lambda: (_program(), bind_weights(_program(), _source(True, "bad.safetensors"))))
        assert backend.events == [] and cache.keys() == set()  # refused at registration: never prepared
        runner = cache.get("good", lambda: (_program("good"), bind_weights(_program("good"), _source(False))))
        assert backend.events == ["prepare"] and runner({"x": np.ones((1, 3), np.float32)})


def test_the_reference_interpreter_scans_on_the_host() -> None:
    cache = ProgramCache(backend="interp")
    with pytest.raises(WeightError, match="'w' in bad.safetensors"):
        cache.get("bad", lambda: (_program(), bind_weights(_program(), _source(True, "bad.safetensors"))))

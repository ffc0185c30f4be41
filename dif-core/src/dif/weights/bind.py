"""Checkpoint access, step 4: bind a source to a program's parameters, checking everything first.

`bind_weights` compares every parameter of the program with the checkpoint before any data is
read: missing tensors, unexpected ones, wrong shapes and unusable dtypes are gathered into one
`WeightError` that names each tensor and the file it lives in. Float dtypes convert (a bf16
checkpoint runs an f32 program and vice versa); the conversion happens on first access and is
cached, and same-dtype tensors stay zero-copy memmap views. Then every bound tensor is scanned
once for NaN / infinite values (`check_finite_weights`, `dif.weights.scan`): a damaged checkpoint is
refused with the tensor named instead of running to a black image. Under `deferred_scans()` (a pipeline's
program cache) that scan is handed to the backend that uploads the weights, as a `PendingScan`.
"""

from __future__ import annotations

import re
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
from attrs import frozen

from dif.dtypes import DType
from dif.errors import DifWarning, WeightError
from dif.ir.program import Program
from dif.weights.source import TensorSource

FLOAT_SOURCES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
MAX_LISTED = 12


@frozen
class Conversion:
    param: str
    tensor: str
    source_dtype: str
    target_dtype: str


class BoundWeights(Mapping[str, np.ndarray]):
    """Parameter name -> array for one program; converts dtypes lazily and caches the result."""

    def __init__(
        self,
        source: TensorSource,
        names: Mapping[str, str],
        targets: Mapping[str, DType],
        conversions: list[Conversion],
    ) -> None:
        self.source = source
        self._names = dict(names)
        self._targets = dict(targets)
        self._convert = {c.param for c in conversions}
        self.conversions = tuple(conversions)
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, param: str) -> np.ndarray:
        cached = self._cache.get(param)
        if cached is not None:
            return cached
        arr = self.source[self._names[param]]
        if param in self._convert:
            arr = np.asarray(arr, dtype=np.float32).astype(self._targets[param].np)
            self._cache[param] = arr
        return arr

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, param: object) -> bool:  # without reading (Mapping's would load the tensor)
        return param in self._names

    def tensor_of(self, param: str) -> str:
        """The name of the `source` tensor bound to parameter `param`."""
        return self._names[param]

    def materialize(self) -> dict[str, np.ndarray]:
        """Every parameter read (and converted) now; returns a plain dict."""
        return {p: self[p] for p in self._names}


class PrefixedWeights(Mapping[str, np.ndarray]):
    """The weights of a program that inlines others (`ProgramBuilder.inline(..., params=PREFIX)`):
    parameter PREFIX + name -> that part's weights[name]. Nothing is read until a parameter is."""

    def __init__(self, parts: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        self._parts = dict(parts)

    def _split(self, param: str) -> tuple[Mapping[str, np.ndarray], str] | None:
        for prefix, weights in self._parts.items():
            if param.startswith(prefix) and (name := param[len(prefix) :]) in weights:
                return weights, name
        return None

    def __getitem__(self, param: str) -> np.ndarray:
        if (part := self._split(param)) is None:
            raise KeyError(param)
        return part[0][part[1]]

    def __iter__(self) -> Iterator[str]:
        return (prefix + name for prefix, weights in self._parts.items() for name in weights)

    def __len__(self) -> int:
        return sum(len(w) for w in self._parts.values())

    def __contains__(self, param: object) -> bool:  # without reading
        return isinstance(param, str) and self._split(param) is not None


def bind_weights(
    program: Program,
    source: TensorSource,
    mapping: Mapping[str, str] | Callable[[str], str] | None = None,
    *,
    ignore: Iterable[str] | Callable[[str], bool] = (),
    convert: bool = True,
    scan: bool = True,
) -> BoundWeights:
    """Check `source` against `program.params` and return the bound weights.

    mapping: param name -> checkpoint tensor name (a dict or a function); identity by default.
    ignore:  checkpoint tensors the program legitimately does not use (regexes, matched in
             full, or a predicate), e.g. `lm_head.weight` or encoder halves of a VAE.
    convert: allow float -> float dtype conversion; otherwise a dtype mismatch is an error.
    scan:    scan the bound tensors for NaN / infinite values (`check_finite_weights`).

    Raises one `WeightError` listing every missing, mis-shaped, mis-typed and unexpected tensor.
    """
    if mapping is None:
        name_of: Callable[[str], str] = lambda p: p  # noqa: E731
    elif callable(mapping):
        name_of = mapping
    else:
        table = dict(mapping)
        name_of = lambda p: table.get(p, p)  # noqa: E731
    ignored = _ignore_predicate(ignore)

    names: dict[str, str] = {}
    targets: dict[str, DType] = {}
    conversions: list[Conversion] = []
    missing: list[str] = []
    misshaped: list[str] = []
    mistyped: list[str] = []
    for param in program.params:
        tensor = name_of(param.name)
        names[param.name] = tensor
        targets[param.name] = param.type.dtype
        want = param.type
        alias = "" if tensor == param.name else f" (program parameter '{param.name}')"
        if tensor not in source:
            missing.append(f"'{tensor}'{alias}: expected {want}, not found in {source.label}")
            continue
        info = source.info(tensor)
        if info.shape != want.shape:
            misshaped.append(
                f"'{tensor}'{alias} in {source.file_of(tensor)}: "
                f"checkpoint has {info.describe()}, program expects {want}"
            )
            continue
        if info.dtype == want.dtype.safetensors_name:
            continue
        if convert and info.dtype in FLOAT_SOURCES and want.dtype.is_float:
            conversions.append(Conversion(param.name, tensor, info.dtype, want.dtype.value))
        else:
            why = "" if convert else " (conversion disabled)"
            mistyped.append(
                f"'{tensor}'{alias} in {source.file_of(tensor)}: checkpoint dtype {info.dtype} cannot feed {want}{why}"
            )
    used = set(names.values())
    unexpected = [
        f"'{n}' in {source.file_of(n)} ({source.info(n).describe()})"
        for n in source.names()
        if n not in used and not ignored(n)
    ]
    problems = [
        ("missing", missing),
        ("mis-shaped", misshaped),
        ("mis-typed", mistyped),
        ("unexpected (not used by the program)", unexpected),
    ]
    if any(items for _, items in problems):
        raise WeightError(_report(program.name, source.label, problems), hint=_hint(missing, unexpected))
    if scan:
        deferred = _DEFERRED.get()
        if deferred is None:
            check_finite_weights(program.name, source, names.values())
        else:
            clean = _clean_tensors(source)
            todo = {param: tensor for param, tensor in names.items() if tensor not in clean}
            if todo:
                deferred.append(PendingScan(program.name, source, todo))
    return BoundWeights(source, names, targets, conversions)


@frozen
class PendingScan:
    """The NaN / infinity scan of one bound program, left to the backend that uploads its weights
    (`deferred_scans`). The upload reads every byte anyway; on a GPU the test of the uploaded bits costs
    milliseconds, where the host's own pass over klein 9B's 30 GB took 1.4 s of every load on the H200.
    `tensors`: program parameter -> checkpoint tensor, for those not yet known to be finite."""

    program: str
    source: TensorSource
    tensors: Mapping[str, str]

    def on_host(self) -> None:
        """The scan `bind_weights` would have run (for a backend that does not scan what it uploads)."""
        check_finite_weights(self.program, self.source, self.tensors.values())

    def report(self, flagged: Iterable[str], covered: Iterable[str]) -> None:
        """The backend tested the parameters `covered` and found `flagged` among them non-finite. Flagged ones
        are counted again on the host for the message (`check_finite_weights`: `WeightError`, or a warning
        under allow_nonfinite_weights); parameters it did not cover (say, replaced by a derived one) are
        scanned on the host here. Afterwards every tensor is known clean for the process."""
        covered = set(covered)
        again = {p for p in flagged if p in self.tensors} | {p for p in self.tensors if p not in covered}
        if again:
            check_finite_weights(self.program, self.source, [self.tensors[p] for p in sorted(again)])
        _clean_tensors(self.source).update(self.tensors.values())


_DEFERRED: ContextVar[list[PendingScan] | None] = ContextVar("dif_deferred_weight_scans", default=None)


@contextmanager
def deferred_scans() -> Iterator[list[PendingScan]]:
    """Inside, `bind_weights` does not scan: it appends a `PendingScan` to the yielded list, for the caller
    to run (`PendingScan.on_host`) or hand to the backend that uploads the weights (`ProgramCache`)."""
    pending: list[PendingScan] = []
    token = _DEFERRED.set(pending)
    try:
        yield pending
    finally:
        _DEFERRED.reset(token)


@contextmanager
def prefixed_scans(prefix: str) -> Iterator[None]:
    """Inside `deferred_scans()`, the scans deferred meanwhile are keyed by `prefix` + parameter: for the
    parts of a program that inlines them under that prefix (`ProgramBuilder.inline(..., params=prefix)`,
    `PrefixedWeights`), so the backend's report on the whole program's parameters covers them."""
    outer = _DEFERRED.get()
    if outer is None:
        yield
        return
    with deferred_scans() as inner:
        yield
    outer.extend(PendingScan(s.program, s.source, {prefix + p: t for p, t in s.tensors.items()}) for s in inner)


_CLEAN: dict[int, set[str]] = {}
"""By source id (while the source lives), the tensors a scan found finite: a program rebound at
another size scans nothing again. Sources are Mappings, hence unhashable: ids with a finalizer."""


def _clean_tensors(source: TensorSource) -> set[str]:
    key = id(source)
    if key not in _CLEAN:
        _CLEAN[key] = set()
        weakref.finalize(source, _CLEAN.pop, key, None)
    return _CLEAN[key]


def check_finite_weights(program: str, source: TensorSource, tensors: Iterable[str]) -> None:
    """The load-time scan: `WeightError` naming each tensor of `tensors` that holds NaN / infinite
    values (the file, and how many), or under `allow_nonfinite_weights` one `DifWarning` saying so."""
    from dif.kit.finite import current_checks
    from dif.weights.scan import describe_nonfinite, nonfinite_counts

    clean = _clean_tensors(source)
    todo = [t for t in dict.fromkeys(tensors) if t not in clean]
    found = nonfinite_counts(source, todo)
    clean.update(t for t in todo if t not in found)
    if not found:
        return
    what = f"program '{program}': {len(found)} weight tensor(s) hold NaN / infinite values: "
    what += describe_nonfinite(found, source)
    if current_checks().allow_nonfinite_weights:
        warnings.warn(f"{what}; running on as --allow-nonfinite-weights asks", DifWarning, stacklevel=2)
        return
    raise WeightError(
        what,
        hint="the checkpoint is damaged or was saved from a diverged run: re-download or re-export it "
        "(`dif weights stats MODEL` lists every tensor); --allow-nonfinite-weights runs on regardless",
    )


def _ignore_predicate(ignore: Iterable[str] | Callable[[str], bool]) -> Callable[[str], bool]:
    if callable(ignore):
        return ignore
    patterns = [re.compile(p) for p in ignore]
    return lambda name: any(p.fullmatch(name) for p in patterns)


def _report(program: str, label: str, problems: list[tuple[str, list[str]]]) -> str:
    counts = ", ".join(f"{len(items)} {kind.split(' ')[0]}" for kind, items in problems if items)
    lines = [f"checkpoint {label} does not fit program '{program}' ({counts})"]
    for kind, items in problems:
        for item in items[:MAX_LISTED]:
            lines.append(f"  {kind}: {item}")
        if len(items) > MAX_LISTED:
            lines.append(f"  ... and {len(items) - MAX_LISTED} more {kind.split(' ')[0]}")
    return "\n".join(lines)


def _hint(missing: list[str], unexpected: list[str]) -> str | None:
    if missing and unexpected:
        return "tensors are missing and others are unused: is this the right model size / layout (or a key prefix)?"
    if missing:
        return "the checkpoint is incomplete or belongs to another model"
    return None

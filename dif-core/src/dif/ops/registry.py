"""The op table: the one place that says what every DiffIR op is.

Each `OpDef` carries its operand and attribute schema, a type rule, a numpy reference
implementation (which *is* the op's semantics), a docstring, and a generator of conformance
cases. Backends, the verifier, the printer and the test kit all read this table; nothing else
defines op meaning.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from attrs import field, frozen

from dif.dtypes import DType
from dif.errors import AttrError, PluginError, TypeRuleError, UnknownOpError
from dif.ir.types import TensorType

REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_KIND_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "ints": lambda v: isinstance(v, tuple | list) and all(_is_int(i) for i in v),
    "floats": lambda v: isinstance(v, tuple | list) and all(isinstance(i, int | float) for i in v),
    "dtype": lambda v: isinstance(v, str) and v in DType._value2member_map_,
}
ATTR_KINDS = tuple(_KIND_CHECKS)

InferFn = Callable[..., TensorType | tuple[TensorType, ...]]
ReferenceFn = Callable[..., np.ndarray | tuple[np.ndarray, ...]]
CasesFn = Callable[[np.random.Generator, DType], list["Case"]]


@frozen
class AttrSpec:
    name: str
    kind: str
    default: Any = REQUIRED
    choices: tuple[Any, ...] | None = None
    doc: str = ""

    def __attrs_post_init__(self) -> None:
        if self.kind not in _KIND_CHECKS:
            raise PluginError(f"attribute '{self.name}': unknown kind '{self.kind}' (kinds: {', '.join(ATTR_KINDS)})")

    def check(self, op: str, value: Any) -> Any:
        if value is None and self.default is None:
            return None
        if not _KIND_CHECKS[self.kind](value):
            raise AttrError(f"op '{op}': attribute '{self.name}' must be {self.kind}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise AttrError(f"op '{op}': attribute '{self.name}'={value!r} is not one of {self.choices}")
        if self.kind == "float":
            return float(value)
        if self.kind in ("ints", "floats"):
            return tuple(float(v) if self.kind == "floats" else v for v in value)
        return value


def _arrays(items: Iterable[np.ndarray]) -> tuple[np.ndarray, ...]:
    return tuple(items)


@frozen
class Case:
    """One conformance case: operand arrays (storage dtypes) and attributes."""

    name: str
    operands: tuple[np.ndarray, ...] = field(converter=_arrays)
    attrs: dict[str, Any] = field(factory=dict)


@frozen
class OpDef:
    """A DiffIR op. `operands` names are plain (`x`), optional and trailing (`bias?`) or
    variadic (`inputs*`, last only)."""

    name: str
    doc: str
    operands: tuple[str, ...]
    attrs: tuple[AttrSpec, ...]
    infer: InferFn
    reference: ReferenceFn
    cases: CasesFn | None
    category: str = "misc"
    num_results: int | None = 1  # None: decided by the type rule (split)

    @property
    def min_operands(self) -> int:
        return sum(1 for o in self.operands if not o.endswith(("?", "*")))

    @property
    def max_operands(self) -> float:
        return float("inf") if any(o.endswith("*") for o in self.operands) else len(self.operands)

    def check_attrs(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """Attributes with defaults filled in; raises `AttrError` on unknown/missing/bad ones."""
        specs = {a.name: a for a in self.attrs}
        unknown = sorted(set(attrs) - set(specs))
        if unknown:
            raise AttrError(
                f"op '{self.name}' has no attribute {', '.join(map(repr, unknown))}",
                hint=f"its attributes are: {', '.join(specs) or '(none)'}",
            )
        out: dict[str, Any] = {}
        for name, spec in specs.items():
            if name in attrs:
                out[name] = spec.check(self.name, attrs[name])
            elif spec.default is REQUIRED:
                raise AttrError(f"op '{self.name}' requires attribute '{name}' ({spec.kind})")
            else:
                out[name] = spec.check(self.name, spec.default)
        return out

    def infer_types(self, operand_types: Sequence[TensorType], attrs: Mapping[str, Any]) -> tuple[TensorType, ...]:
        """Result types for these operands; raises `TypeRuleError` naming the op."""
        n = len(operand_types)
        if not self.min_operands <= n <= self.max_operands:
            raise TypeRuleError(f"op '{self.name}' takes operands ({', '.join(self.operands)}), got {n}")
        full = self.check_attrs(attrs)
        try:
            out = self.infer(*operand_types, **full)
        except TypeRuleError as exc:
            raise TypeRuleError(f"op '{self.name}': {exc}") from None
        results = out if isinstance(out, tuple) else (out,)
        if self.num_results is not None and len(results) != self.num_results:
            raise TypeRuleError(f"op '{self.name}' type rule gave {len(results)} results, expected {self.num_results}")
        return results

    def run_reference(self, operands: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
        """The reference result in compute precision (fp32, or fp64 when given fp64 inputs);
        the caller casts to the result types of `infer_types`."""
        out = self.reference(*operands, **self.check_attrs(attrs))
        return out if isinstance(out, tuple) else (out,)


class OpTable:
    """Name -> OpDef. Core ops are registered at import; plugins add theirs via `register_ops`."""

    def __init__(self) -> None:
        self._ops: dict[str, OpDef] = {}

    def register(self, opdef: OpDef) -> None:
        existing = self._ops.get(opdef.name)
        if existing is not None and existing is not opdef:
            raise PluginError(f"op '{opdef.name}' is already registered")
        self._ops[opdef.name] = opdef

    def get(self, name: str) -> OpDef:
        try:
            return self._ops[name]
        except KeyError:
            raise UnknownOpError(
                f"unknown op '{name}'", hint="check the spelling, or load the plugin that registers it"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(sorted(self._ops.values(), key=lambda o: o.name))

    def __len__(self) -> int:
        return len(self._ops)


OPS = OpTable()


def defop(
    name: str,
    *,
    operands: tuple[str, ...],
    infer: InferFn,
    cases: CasesFn | None,
    attrs: tuple[AttrSpec, ...] = (),
    category: str = "misc",
    num_results: int | None = 1,
    table: OpTable = OPS,
) -> Callable[[ReferenceFn], ReferenceFn]:
    """Decorator: register the decorated numpy function as the reference of op `name`.

    The function's docstring becomes the op's documentation (it is required)."""

    def wrap(fn: ReferenceFn) -> ReferenceFn:
        doc = inspect.cleandoc(fn.__doc__ or "")
        table.register(OpDef(name, doc, operands, attrs, infer, fn, cases, category=category, num_results=num_results))
        return fn

    return wrap


def get_op(name: str) -> OpDef:
    return OPS.get(name)

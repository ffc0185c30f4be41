"""ProgramBuilder: how frontends (and tests) write DiffIR.

Each `emit` type-checks against the op table at once, so a shape bug surfaces at the line that
made it, with the provenance scope the frontend declared around it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from attrs import evolve, frozen

from dif.dtypes import DType
from dif.errors import DifError, TypeRuleError
from dif.ir.program import Node, Program, Provenance, Value
from dif.ir.types import TensorType
from dif.ops.registry import OPS, OpTable


@frozen(eq=False)
class Var:
    """A handle on a value being built; only meaningful with the builder that made it."""

    builder: ProgramBuilder
    name: str
    type: TensorType

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"Var({self.name}: {self.type})"


class ProgramBuilder:
    def __init__(self, name: str, *, frontend_revision: str = "", table: OpTable = OPS) -> None:
        self.name = name
        self._table = table
        self._inputs: list[Value] = []
        self._params: list[Value] = []
        self._nodes: list[Node] = []
        self._outputs: list[str] = []
        self._names: set[str] = set()
        self._prov: dict[int, Provenance] = {}
        self._scope = Provenance(frontend_revision=frontend_revision)
        self.meta: dict[str, str] = {}

    # -- definitions ---------------------------------------------------------------------------
    def _define(self, name: str) -> None:
        if name in self._names:
            raise DifError(f"value '{name}' is defined twice in program '{self.name}'")
        if name.startswith("%"):
            raise DifError(f"'{name}': names starting with '%' are reserved for node results")
        self._names.add(name)

    def input(self, name: str, shape: Sequence[int], dtype: DType | str) -> Var:
        self._define(name)
        value = Value(name, TensorType(shape, DType(dtype)))
        self._inputs.append(value)
        return Var(self, value.name, value.type)

    def param(self, name: str, shape: Sequence[int], dtype: DType | str) -> Var:
        """A weight, named independently of any checkpoint (the frontend maps names)."""
        self._define(name)
        value = Value(name, TensorType(shape, DType(dtype)))
        self._params.append(value)
        return Var(self, value.name, value.type)

    def emit(self, op: str, *operands: Var | None, **attrs: Any) -> Var:
        """Append one single-result node; `None` operands must be trailing optional ones."""
        results = self.emit_multi(op, *operands, **attrs)
        if len(results) != 1:
            raise TypeRuleError(f"op '{op}' has {len(results)} results; use emit_multi")
        return results[0]

    def emit_multi(self, op: str, *operands: Var | None, **attrs: Any) -> tuple[Var, ...]:
        opdef = self._table.get(op)
        given = list(operands)
        while given and given[-1] is None:
            given.pop()
        if any(v is None for v in given):
            raise TypeRuleError(f"op '{op}': only trailing optional operands may be omitted")
        for v in given:
            assert v is not None
            if v.builder is not self:
                raise DifError(f"op '{op}': operand {v.name} belongs to another ProgramBuilder")
        full_attrs = opdef.check_attrs(attrs)
        types = opdef.infer_types([v.type for v in given if v is not None], full_attrs)
        node_id = len(self._nodes)
        results = tuple(Value(f"%{node_id}" if len(types) == 1 else f"%{node_id}.{i}", t) for i, t in enumerate(types))
        node = Node(node_id, op, tuple(v.name for v in given if v is not None), results, full_attrs)
        self._nodes.append(node)
        self._prov[node_id] = self._scope
        return tuple(Var(self, r.name, r.type) for r in results)

    def output(self, *values: Var) -> None:
        for v in values:
            self._outputs.append(v.name)

    def inline(self, program: Program, inputs: Mapping[str, Var], *, params: str = "") -> list[Var]:
        """Re-emit `program`'s nodes here, its inputs bound to `inputs` (by input name); its outputs, in
        order. Its parameters become this program's, named `params` + their name (a prefix keeps the
        weights of several inlined programs apart); each node keeps its provenance. How one program runs
        several stages: a pipeline's text encoder, denoiser and decoder as one graph, or an encoder and
        decoder trained as one autoencoder."""
        missing = [v.name for v in program.inputs if v.name not in inputs]
        if missing:
            raise DifError(f"inlining '{program.name}': no value for its input(s) {', '.join(missing)}")
        env: dict[str, Var] = {}
        for v in program.inputs:
            given = inputs[v.name]
            if given.type != v.type:
                raise DifError(f"inlining '{program.name}': input '{v.name}' is {v.type}, given {given.type}")
            env[v.name] = given
        for v in program.params:
            env[v.name] = self.param(params + v.name, v.type.shape, v.type.dtype)
        for node in program.nodes:
            p = program.provenance.get(node.id)
            with (
                self.scope(module=p.module, block=p.block, section=p.section, tensors=p.tensors) if p else self.scope()
            ):
                results = self.emit_multi(node.op, *(env[o] for o in node.operands), **node.attrs)
            env.update((r.name, v) for r, v in zip(node.results, results, strict=True))
        return [env[name] for name in program.outputs]

    # -- provenance ----------------------------------------------------------------------------
    @contextmanager
    def scope(
        self,
        *,
        module: str | None = None,
        block: str | None = None,
        section: str | None = None,
        tensors: Sequence[str] = (),
    ) -> Iterator[None]:
        """Nodes emitted inside carry this provenance (unspecified fields are inherited)."""
        saved = self._scope
        self._scope = evolve(
            saved,
            module=saved.module if module is None else module,
            block=saved.block if block is None else block,
            section=saved.section if section is None else section,
            tensors=tuple(tensors) or saved.tensors,
        )
        try:
            yield
        finally:
            self._scope = saved

    # -- result --------------------------------------------------------------------------------
    def build(self, *, verify: bool = True) -> Program:
        program = Program(
            self.name,
            tuple(self._inputs),
            tuple(self._params),
            tuple(self._nodes),
            tuple(self._outputs),
            provenance=dict(self._prov),
            meta=dict(self.meta),
        )
        if verify:
            from dif.verify import verify_program

            verify_program(program, table=self._table)
        return program

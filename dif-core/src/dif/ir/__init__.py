"""DiffIR: typed, immutable SSA programs (see docs/ir.md)."""

from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Node, Program, Provenance, Value
from dif.ir.types import TensorType

__all__ = ["Node", "Program", "ProgramBuilder", "Provenance", "TensorType", "Value", "Var"]

"""DiffIR text form: a deterministic printer and its parser, for `dif inspect`, golden files and tests.

It is an operations surface over the one IR, not a second IR: `parse_program(print_program(p)) == p`
and printing the result gives the same text. Provenance is not part of it (it lives in a sidecar;
`print_program(p, provenance=True)` adds it as comments, which the parser ignores).

    program NAME
    meta KEY = "value"
    input x: f32[2,3]
    param w: bf16[4,3]
    %0: f32[2,4] = linear(x, w) {}
    %1.0: f32[2,2], %1.1: f32[2,2] = split(%0) {axis=-1, sizes=[2, 2]}
    output %1.0, %1.1

Names matching `[A-Za-z_%][A-Za-z0-9_.%/-]*` print bare, any other name (and a keyword) prints as a
JSON string. Attribute values: ints, floats as `repr` (`1e-06`, `inf`, `nan`), `True`/`False`/`None`,
JSON strings, and `[...]` for tuples (nested). Attributes print sorted by key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from dif.dtypes import DType
from dif.errors import DifError, ParseError
from dif.ir.program import AttrValue, Node, Program, Value
from dif.ir.types import TensorType
from dif.ops.registry import OPS, OpTable

_NAME_CHARS = r"A-Za-z0-9_.%/\-"
_TOKEN = re.compile(
    rf"""
    (?P<ws>[ \t\r]+)
  | (?P<comment>\#.*)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<number>-?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|inf|nan)(?![{_NAME_CHARS}]))
  | (?P<name>[A-Za-z_%][{_NAME_CHARS}]*)
  | (?P<punct>[=,(){{}}\[\]:])
    """,
    re.VERBOSE,
)
_BARE_NAME = re.compile(rf"[A-Za-z_%][{_NAME_CHARS}]*")
KEYWORDS = frozenset({"program", "meta", "input", "param", "output"})
_CONSTANTS = {"True": True, "False": False, "None": None}
_RESERVED = KEYWORDS | set(_CONSTANTS) | {"inf", "nan"}
MAX_ATTR_DEPTH = 32


# -- printing -------------------------------------------------------------------------------------


def format_name(name: str) -> str:
    """A value/op/attribute name: bare when unambiguous, else a JSON string."""
    if _BARE_NAME.fullmatch(name) and name not in _RESERVED:
        return name
    return json.dumps(name, ensure_ascii=True)


def format_attr_value(value: AttrValue) -> str:
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=True)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(format_attr_value(v) for v in value) + "]"
    raise DifError(f"attribute value {value!r} ({type(value).__name__}) has no text form")


def format_attrs(attrs: dict[str, AttrValue]) -> str:
    return "{" + ", ".join(f"{format_name(k)}={format_attr_value(attrs[k])}" for k in sorted(attrs)) + "}"


def format_value(value: Value) -> str:
    """`name: dtype[shape]` as in declarations and node results."""
    return f"{format_name(value.name)}: {value.type}"


def format_node(node: Node) -> str:
    """One node as its text line, e.g. `%3: f32[2,4] = linear(%2, w) {}`."""
    results = ", ".join(format_value(r) for r in node.results)
    operands = ", ".join(format_name(o) for o in node.operands)
    return f"{results} = {format_name(node.op)}({operands}) {format_attrs(node.attrs)}"


def print_program(program: Program, *, provenance: bool = False) -> str:
    """The program as deterministic text (see the module docstring); ends with a newline.

    With `provenance=True` each node line gets a `# module/block/section` comment."""
    lines = [f"program {format_name(program.name)}"]
    lines += [f"meta {format_name(k)} = {json.dumps(program.meta[k], ensure_ascii=True)}" for k in sorted(program.meta)]
    lines += [f"input {format_value(v)}" for v in program.inputs]
    lines += [f"param {format_value(v)}" for v in program.params]
    for node in program.nodes:
        line = format_node(node)
        if provenance and node.id in program.provenance:
            line += f"  # {program.provenance[node.id].describe()}"
        lines.append(line)
    if program.outputs:
        lines.append("output " + ", ".join(format_name(o) for o in program.outputs))
    return "\n".join(lines) + "\n"


# -- parsing --------------------------------------------------------------------------------------


class _Line:
    """Tokens of one line with a cursor; errors carry the line number."""

    def __init__(self, text: str, lineno: int, what: str) -> None:
        self.text, self.lineno, self.what = text, lineno, what
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise self.error(f"unexpected character {text[pos]!r} at column {pos + 1}")
            kind = m.lastgroup or ""
            if kind == "comment":
                break
            if kind != "ws":
                self.tokens.append((kind, m.group(), pos))
            pos = m.end()
        self.i = 0

    def error(self, message: str, hint: str | None = None) -> ParseError:
        return ParseError(f"{self.what}:{self.lineno}: {message}\n    {self.text.strip()}", hint=hint)

    def peek(self) -> tuple[str, str]:
        if self.i >= len(self.tokens):
            return ("end", "")
        kind, text, _ = self.tokens[self.i]
        return kind, text

    def next(self, what: str) -> tuple[str, str]:
        tok = self.peek()
        if tok[0] == "end":
            raise self.error(f"line ends where {what} was expected")
        self.i += 1
        return tok

    def accept(self, punct: str) -> bool:
        if self.peek() == ("punct", punct):
            self.i += 1
            return True
        return False

    def expect(self, punct: str) -> None:
        kind, text = self.next(f"'{punct}'")
        if (kind, text) != ("punct", punct):
            raise self.error(f"expected '{punct}', found {text!r}")

    def end(self) -> None:
        if self.peek()[0] != "end":
            raise self.error(f"unexpected {self.peek()[1]!r} after the end of the statement")

    def string(self, token: str) -> str:
        try:
            value = json.loads(token)
        except ValueError:
            raise self.error(f"bad string literal {token}") from None
        assert isinstance(value, str)
        return value

    def name(self, what: str = "a name") -> str:
        kind, text = self.next(what)
        if kind == "name":
            return text
        if kind == "string":
            return self.string(text)
        raise self.error(f"expected {what}, found {text!r}")

    def integer(self) -> int:
        kind, text = self.next("an integer")
        if kind != "number" or not re.fullmatch(r"-?\d+", text):
            raise self.error(f"expected an integer, found {text!r}")
        try:
            return int(text)
        except ValueError:
            raise self.error(f"integer {text[:20]}... is too long") from None

    def tensor_type(self) -> TensorType:
        dtype_name = self.name("a dtype")
        if dtype_name not in DType._value2member_map_:
            raise self.error(f"unknown dtype {dtype_name!r}", hint=f"use one of {', '.join(d.value for d in DType)}")
        self.expect("[")
        dims: list[int] = []
        if not self.accept("]"):
            dims.append(self.integer())
            while self.accept(","):
                dims.append(self.integer())
            self.expect("]")
        return TensorType(tuple(dims), DType(dtype_name))

    def value_decl(self) -> Value:
        name = self.name()
        self.expect(":")
        return Value(name, self.tensor_type())

    def attr_value(self, depth: int = 0) -> AttrValue:
        if depth > MAX_ATTR_DEPTH:
            raise self.error(f"attribute value nested deeper than {MAX_ATTR_DEPTH}")
        kind, text = self.next("an attribute value")
        if kind == "number":
            try:
                return float(text) if not re.fullmatch(r"-?\d+", text) else int(text)
            except ValueError:
                raise self.error(f"number {text[:20]}... is too long") from None
        if kind == "string":
            return self.string(text)
        if kind == "name" and text in _CONSTANTS:
            return _CONSTANTS[text]
        if (kind, text) == ("punct", "["):
            items: list[AttrValue] = []
            while not self.accept("]"):
                items.append(self.attr_value(depth + 1))
                if not self.accept(","):
                    self.expect("]")
                    break
            return tuple(items)
        raise self.error(f"expected an attribute value, found {text!r}", hint="strings need double quotes")

    def attrs(self) -> dict[str, AttrValue]:
        out: dict[str, AttrValue] = {}
        if not self.accept("{"):
            return out
        while not self.accept("}"):
            key = self.name("an attribute name")
            if key in out:
                raise self.error(f"attribute {key!r} given twice")
            self.expect("=")
            out[key] = self.attr_value()
            if not self.accept(","):
                self.expect("}")
                break
        return out

    def names(self) -> list[str]:
        out = [self.name()]
        while self.accept(","):
            out.append(self.name())
        return out


def _lines(text: str, what: str) -> Iterator[_Line]:
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = _Line(raw, lineno, what)
        if line.tokens:
            yield line


def parse_program(text: str, *, what: str = "<text>", table: OpTable = OPS, verify: bool = True) -> Program:
    """Parse the text form back into a `Program` (ids follow node order; provenance is empty).

    Syntax errors raise `ParseError` with the line number; the result is then verified against
    `table` (a `VerifyError` names the failing node)."""
    name: str | None = None
    meta: dict[str, str] = {}
    inputs: list[Value] = []
    params: list[Value] = []
    nodes: list[Node] = []
    outputs: list[str] = []
    for line in _lines(text, what):
        kind, word = line.peek()
        if name is None and (kind, word) != ("name", "program"):
            raise line.error("the text must start with 'program NAME'")
        if kind == "name" and word in KEYWORDS:
            line.next(word)
            if word == "program":
                if name is not None:
                    raise line.error("a second 'program' line")
                name = line.name("the program name")
            elif word == "meta":
                key = line.name("a meta key")
                if key in meta:
                    raise line.error(f"meta key {key!r} given twice")
                line.expect("=")
                kind, token = line.next("a meta value")
                if kind != "string":
                    raise line.error("meta values are strings", hint='write meta key = "value"')
                meta[key] = line.string(token)
            elif word in ("input", "param"):
                (inputs if word == "input" else params).append(line.value_decl())
            else:
                outputs += line.names()
        else:
            results = [line.value_decl()]
            while line.accept(","):
                results.append(line.value_decl())
            line.expect("=")
            op = line.name("an op name")
            line.expect("(")
            operands: list[str] = []
            if not line.accept(")"):
                operands = line.names()
                line.expect(")")
            attrs = line.attrs()
            nodes.append(Node(len(nodes), op, tuple(operands), tuple(results), attrs))
        line.end()
    if name is None:
        raise ParseError(f"{what}: empty program text", hint="the text must start with 'program NAME'")
    program = Program(name, tuple(inputs), tuple(params), tuple(nodes), tuple(outputs), {}, meta)
    if verify:
        from dif.verify import verify_program

        verify_program(program, table=table)
    return program

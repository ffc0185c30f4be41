"""DiffIR text form: deterministic printing, exact round trips, parse errors with line numbers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dif.errors import ParseError, VerifyError
from dif.fingerprint import fingerprint
from dif.ir.program import Node, Program, Value
from dif.ir.types import TensorType
from dif.ops.registry import AttrSpec, OpTable, defop
from dif.serialize.text import format_name, parse_program, print_program

T = TensorType((2,), "f32")


def test_round_trip_is_exact(program: Program) -> None:
    text = print_program(program)
    back = parse_program(text)
    assert back == program
    assert back.meta == program.meta
    assert print_program(back) == text
    assert fingerprint(back) == fingerprint(program)


def test_printed_form(program: Program) -> None:
    lines = print_program(program).splitlines()
    assert lines[0] == "program sample"
    assert lines[1] == 'meta model = "tiny \\"quoted\\"\\n"'
    assert 'param "norm weight": f32[16]' in lines
    assert "%2.0: f32[2,8,16], %2.1: f32[2,8,16], %2.2: f32[2,8,16] = split(%1) {axis=-1, sizes=[16, 16, 16]}" in lines
    assert '%9: f32[2,8,16] = full() {dtype="f32", shape=[2, 8, 16], value=-inf}' in lines
    assert "%12: f32[2,8,32] = scalar_affine(%11) {bias=-1.0, scale=0.5}" in lines  # attrs sorted by key
    assert lines[-1] == "output %13, %2.1"


def test_provenance_comments_are_printed_and_ignored(program: Program) -> None:
    text = print_program(program, provenance=True)
    assert "= linear(%0, blocks.0.attn.qkv.weight) {}  # transformer/blocks.0/attn" in text
    assert parse_program(text) == program
    assert print_program(parse_program(text)) == print_program(program)


def _one_node_program(attrs: dict, name: str = "p") -> Program:
    node = Node(0, "anything", ("x",), (Value("%0", T),), attrs)
    return Program(name, (Value("x", T),), (), (node,), ("%0",))


def _attrs_equal(a: object, b: object) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_attrs_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


SPECIAL_VALUES = {
    "tiny": 5e-324,
    "huge": 1e300,
    "eps": 1e-06,
    "neg_zero": -0.0,
    "tenth": 0.1,
    "pinf": math.inf,
    "ninf": -math.inf,
    "nan": math.nan,
    "big_int": -(10**30),
    "flag": True,
    "none": None,
    "text": 'tab\t "q" back\\slash é \u2028 \x00',
    "nested": ((1, (2.5, "a")), (), (None, False)),
}


def test_attr_values_round_trip_with_their_types() -> None:
    program = _one_node_program(SPECIAL_VALUES)
    text = print_program(program)
    back = parse_program(text, verify=False)
    assert text.isascii()
    for key, value in SPECIAL_VALUES.items():
        assert _attrs_equal(back.nodes[0].attrs[key], value), key
    assert print_program(back) == text


attr_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4).map(tuple),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None, database=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), attr_values, max_size=4), st.text(max_size=10))
def test_any_attrs_and_names_round_trip(attrs: dict, name: str) -> None:
    program = _one_node_program(attrs, name=name)
    text = print_program(program)
    back = parse_program(text, verify=False)
    assert back.name == name
    assert set(back.nodes[0].attrs) == set(attrs)
    for key, value in program.nodes[0].attrs.items():
        assert _attrs_equal(back.nodes[0].attrs[key], value)
    assert print_program(back) == text


@pytest.mark.parametrize(
    "name", ["input", "output", "inf", "nan", "True", "None", "%0", "a b", "0.weight", "é", 'q"', "x\ny", "a-b/c:d", ""]
)
def test_awkward_value_names_round_trip(name: str) -> None:
    program = Program("p", (Value(name or "e", T),), (), (), (name or "e",))
    text = print_program(program)
    assert parse_program(text, verify=False) == program


def test_bare_names_stay_bare() -> None:
    assert format_name("blocks.0.attn.to_q.weight") == "blocks.0.attn.to_q.weight"
    assert format_name("%12.3") == "%12.3"
    assert format_name("input") == '"input"'
    assert format_name("inf") == '"inf"'


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("input x: f32[2]\n", 1, "must start with 'program NAME'"),
        ("program p\nprogram q\n", 2, "a second 'program' line"),
        ("program p\ninput x: f33[2]\n", 2, "unknown dtype 'f33'"),
        ("program p\ninput x: f32[2\n", 2, "line ends where ']' was expected"),
        ("program p\ninput x: f32[2.5]\n", 2, "expected an integer"),
        ("program p\ninput x: f32[2]\n%0: f32[2] = neg(x) {a=1, a=2}\n", 3, "attribute 'a' given twice"),
        ("program p\ninput x: f32[2]\n\n%0: f32[2] = neg(x) {a=hello}\n", 4, "expected an attribute value"),
        ("program p\ninput x: f32[2]\n%0: f32[2] = neg(x) {a=[1, 2}\n", 3, "expected ']'"),
        ("program p\ninput x: f32[2]\n%0: f32[2] neg(x)\n", 3, "expected '='"),
        ("program p\n# comment\nmeta k = 3\n", 3, "meta values are strings"),
        ('program p\nmeta k = "a"\nmeta k = "b"\n', 3, "meta key 'k' given twice"),
        ("program p\noutput %0 %1\n", 2, "unexpected '%1'"),
        ("program p\ninput x: f32[2] ; \n", 2, "unexpected character ';'"),
        ('program p\nmeta k = "bad \\q escape"\n', 2, "bad string literal"),
        ("program p\n%0: f32[2] = f(x) {a=" + "[" * 40 + "]" * 40 + "}\n", 2, "nested deeper"),
        ("", 0, "empty program text"),
    ],
)
def test_parse_errors_name_the_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_program(text, what="golden.dif")
    message = str(info.value)
    assert fragment in message
    if line:
        assert f"golden.dif:{line}:" in message


def test_parsed_text_is_verified(program: Program) -> None:
    text = print_program(program).replace("%1: f32[2,8,48] = linear", "%1: f32[2,8,47] = linear")
    with pytest.raises(VerifyError, match="node 1 \\(linear\\)"):
        parse_program(text)
    assert parse_program(text, verify=False).nodes[1].results[0].type.shape == (2, 8, 47)


def test_parse_with_custom_table() -> None:
    table = OpTable()
    defop(
        "twice",
        operands=("x",),
        attrs=(AttrSpec("k", "int", 2),),
        infer=lambda x, k: x,
        cases=None,
        table=table,
    )(lambda x, k: x * k)
    text = "program p\ninput x: f32[2]\n%0: f32[2] = twice(x) {k=2}\noutput %0\n"
    program = parse_program(text, table=table)
    assert program.nodes[0].attrs == {"k": 2}
    with pytest.raises(VerifyError, match="unknown op 'twice'"):
        parse_program(text)

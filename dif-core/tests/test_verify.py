"""The verifier: one failing program per invariant, and messages that point at the node and say how to fix."""

from __future__ import annotations

import pytest
from attrs import evolve

from dif.errors import VerifyError
from dif.ir.program import Node, Program, Provenance, Value
from dif.ir.types import TensorType
from dif.ops.registry import OPS, OpTable, defop
from dif.verify import verify_program


def _replace_node(program: Program, index: int, **changes: object) -> Program:
    nodes = list(program.nodes)
    nodes[index] = evolve(nodes[index], **changes)
    return evolve(program, nodes=tuple(nodes))


def _fails(program: Program, *fragments: str, table: OpTable = OPS) -> str:
    with pytest.raises(VerifyError) as info:
        verify_program(program, table=table)
    message = str(info.value)
    assert message.count("hint:") == 1, f"every verifier error carries exactly one fix hint:\n{message}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    return message


def test_valid_program_passes(program: Program) -> None:
    verify_program(program)  # also ran in build(); must stay silent
    assert len(program.nodes) == 14


def test_node_error_shows_neighbours_provenance_and_hint(program: Program) -> None:
    bad = _replace_node(program, 2, operands=("%99",))
    message = _fails(bad, "node 2 (split)", "operand '%99' is not defined", "hint:")
    lines = message.splitlines()
    arrow = next(i for i, line in enumerate(lines) if line.startswith("  --> "))
    assert "= split(%99)" in lines[arrow]
    assert "= linear(" in lines[arrow - 1]  # previous node
    assert "= reshape(%2.0)" in lines[arrow + 1]  # next node
    assert "provenance: transformer/blocks.0/attn (tensors: blocks.0.attn.qkv.weight)" in message


def test_first_and_last_node_errors_have_one_neighbour(program: Program) -> None:
    message = _fails(_replace_node(program, 0, op="no_such_op"), "node 0 (no_such_op)", "unknown op")
    assert message.count("\n      %") == 1
    last = len(program.nodes) - 1
    message = _fails(_replace_node(program, last, attrs={"dtype": "q7"}), f"node {last} (cast)")
    assert message.count("\n      %") == 1


def test_meta_must_be_strings(program: Program) -> None:
    _fails(evolve(program, meta={"steps": 4}), "meta entry 'steps'")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (Value("%x", TensorType((2,), "f32")), "reserved for node results"),
        (Value("z", TensorType((2, 0), "f32")), "dim below 1"),
        (Value("z", TensorType((2, -3), "f32")), "dim below 1"),
        (Value("z", TensorType((1,) * 17, "f32")), "rank 17"),
        (Value("z", TensorType((1 << 30, 1 << 30), "f32")), "2^48"),
        (Value("", TensorType((2,), "f32")), "not a named Value"),
    ],
)
def test_declarations_need_names_and_positive_shapes(program: Program, value: Value, fragment: str) -> None:
    _fails(evolve(program, params=(*program.params, value)), fragment)


def test_single_definition(program: Program) -> None:
    twin = Value("x", TensorType((16,), "f32"))
    _fails(evolve(program, params=(*program.params, twin)), "param 'x'", "defined twice")
    results = (Value("x", TensorType((2, 8, 16), "f32")),)
    _fails(_replace_node(program, 0, results=results), "node 0 (rms_norm)", "result 'x' is already defined")
    t = TensorType((2, 8, 16), "f32")
    _fails(
        _replace_node(program, 2, results=(Value("a", t), Value("a", t), Value("b", t))),
        "result 'a' is already defined",
    )


def test_node_ids_in_order(program: Program) -> None:
    _fails(_replace_node(program, 3, id=7), "node id 7 at position 3", "0..n-1")


def test_unknown_op_and_operand_count(program: Program) -> None:
    _fails(_replace_node(program, 1, op="linaer"), "node 1 (linaer)", "unknown op 'linaer'", "hint: check the spelling")
    _fails(_replace_node(program, 1, operands=("%0",)), "node 1 (linear)", "1 operands", "(x, w, bias?)")


def test_use_before_definition(program: Program) -> None:
    message = _fails(
        _replace_node(program, 1, operands=("%5", "blocks.0.attn.qkv.weight")), "used before it is defined"
    )
    assert "topological order" in message


def test_attrs_must_be_complete_and_valid(program: Program) -> None:
    _fails(_replace_node(program, 0, attrs={"eps": 1e-6, "offset": 0.0}), "attribute 'round_before_weight' is missing")
    _fails(_replace_node(program, 8, attrs={"approximate": "fast"}), "node 8 (gelu)", "'fast' is not one of")
    _fails(_replace_node(program, 2, attrs={"axis": -1, "sizes": (16, 16, 16), "groups": 2}), "no attribute 'groups'")
    _fails(_replace_node(program, 2, attrs={"axis": 1.5, "sizes": (16, 16, 16)}), "'axis' must be int")


def test_result_types_follow_the_type_rule(program: Program) -> None:
    wrong = (Value("%1", TensorType((2, 8, 47), "f32")),)
    _fails(_replace_node(program, 1, results=wrong), "node 1 (linear)", "declared f32[2,8,47]", "gives f32[2,8,48]")
    wrong_dtype = (Value("%1", TensorType((2, 8, 48), "bf16")),)
    _fails(_replace_node(program, 1, results=wrong_dtype), "bf16[2,8,48]")
    node = program.nodes[2]
    _fails(_replace_node(program, 2, results=node.results[:2]), "node 2 (split)", "2 results", "gives 3")
    _fails(_replace_node(program, 11, attrs={"axis": 5}), "node 11 (concat)", "hint:")


def test_outputs_defined_and_unique(program: Program) -> None:
    _fails(evolve(program, outputs=("%13", "%404")), "output '%404' is not a defined value")
    _fails(evolve(program, outputs=("%13", "%13")), "output '%13' is listed twice")


def test_outputs_may_be_inputs_and_params_may_be_unused(program: Program) -> None:
    extra = Value("unused.bias", TensorType((3,), "bf16"))
    verify_program(evolve(program, params=(*program.params, extra), outputs=("%13", "x")))


def test_provenance_must_key_existing_nodes(program: Program) -> None:
    prov = {**program.provenance, 99: Provenance(module="ghost")}
    _fails(evolve(program, provenance=prov), "provenance for node ids [99]", "remap program.provenance")


def test_custom_table_and_crashing_type_rule() -> None:
    table = OpTable()

    def infer(x: TensorType) -> TensorType:
        return TensorType((x.shape[3],), x.dtype)  # crashes (IndexError) on rank < 4: a bug to report, not leak

    defop("pick", operands=("x",), infer=infer, cases=None, table=table)(lambda x: x)
    t = TensorType((2,), "f32")
    node = Node(0, "pick", ("x",), (Value("%0", t),), {})
    program = Program("custom", (Value("x", t),), (), (node,), ("%0",))
    _fails(program, "unknown op 'pick'")  # not in the global table
    _fails(program, "node 0 (pick)", "type rule of op 'pick' failed: IndexError", table=table)

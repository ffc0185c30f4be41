"""Regenerate docs/ir.md from the op table: `python docs/gen_ir_md.py` (a test checks it is current)."""

from __future__ import annotations

from pathlib import Path

from dif.ops.registry import OPS

HEAD = """# DiffIR

A DiffIR program is an SSA graph in topological order: typed inputs, parameters (weights, named
independently of any checkpoint), nodes `(op, operands, attrs) -> results`, and outputs. Types are
static: `TensorType(shape, dtype)` with dtypes f32, f16, bf16, f8e4m3, f8e5m2, i8, i32, i64, u8,
bool. Programs, nodes and values are immutable; passes return new programs.

The op table below is generated from `dif.ops` (`python docs/gen_ir_md.py`). Each op's numpy
reference implementation is its definition; references compute in fp32 (fp64 when given fp64) and
the result is rounded to the node's declared dtype. Operands ending in `?` are optional (omitted
when absent, trailing only); `*` marks a variadic operand.

"""


def render() -> str:
    out = [HEAD]
    by_cat: dict[str, list] = {}
    for op in OPS:
        by_cat.setdefault(op.category, []).append(op)
    for cat in sorted(by_cat):
        out.append(f"## {cat}\n")
        for op in by_cat[cat]:
            attrs = ", ".join(
                f"{a.name}: {a.kind}" + ("" if repr(a.default) == "REQUIRED" else f" = {a.default!r}") for a in op.attrs
            )
            sig = f"{op.name}({', '.join(op.operands)}{'; ' + attrs if attrs else ''})"
            out.append(f"### `{op.name}`\n\n`{sig}`\n\n{op.doc}\n")
    return "\n".join(out)


if __name__ == "__main__":
    path = Path(__file__).with_name("ir.md")
    path.write_text(render())
    print(f"wrote {path} ({len(list(OPS))} ops)")

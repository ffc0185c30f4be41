"""Checkpoint access: GGUF Q4_0 weights kept 4-bit (weight-only `int4_linear`, groups of 32) instead of
dequantized on the host.

Where it sits: between binding a program to a GGUF checkpoint and optimizing it (`dif.program_cache`). A Q4_0
block is 32 values `(q - 8) * d` with q a nibble and d a float16 scale: exactly `int4_linear`'s groups at
group size 32 (`dif.ops.quant`), so the blocks are re-packed, never re-quantized, and the 4-bit model runs
with the values the file holds (the same values the dequantizing path reads) at a quarter of their bf16
bytes. Other GGUF types (Q8_0, Q4_1, K-quants ...) carry an offset or more bits than those groups hold and
are dequantized as before.

- `choose_int4` decides per program: its frontend asks (a denoiser, as for fp8), the backend runs
  `int4_linear`; `Int4Choice.apply` rewrites the linears over Q4_0-stored weights before the optimizer
  (`dif.passes.quantize.keep_stored_int4`), so fusions that would concatenate their weights leave them as they
  are; `Int4Choice.outcome` says what came of it, for the plan.
- `dif.weights.quantized.QuantizedWeights` reads the derived `W@int4-group32.q` / `.scale` of such a weight
  from its blocks (`stored_q4_0(...).load()`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from attrs import frozen

from dif.weights.quantized import GROUP_FORMAT, derived_name
from dif.weights.remap import Chunk
from dif.weights.source import TensorSource

if TYPE_CHECKING:
    from dif.ir.program import Program
    from dif.target import TargetProfile

KEPT_TYPE = "Q4_0"
GROUP = 32  # values per Q4_0 block: int4_linear's group size for these weights
BLOCK_BYTES = 18  # float16 d, then 16 bytes of nibbles


def q4_0_groups(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed [rows, cols/2] u8, scales [rows, cols/32] f16) of the Q4_0 blocks `raw` (u8) of a [rows, cols]
    matrix, in `int4_linear`'s layout: a block's element j < 16 is the low nibble of its byte j, element
    j + 16 the high one; int4_linear's nibble k is the low half of byte k/2 for even k. The same offset (8)
    and scale, so nothing is rounded."""
    blocks = np.asarray(raw, np.uint8).reshape(rows, cols // GROUP, BLOCK_BYTES)
    scales = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16).reshape(rows, cols // GROUP)
    qs = blocks[:, :, 2:]
    values = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(rows, cols)
    return (values[:, 0::2] | (values[:, 1::2] << 4)).astype(np.uint8), scales


@frozen
class StoredQ4_0:
    """A weight stored as Q4_0 blocks: tensor `tensor` of GGUF file `source` ([rows, cols] by numpy's order)
    and the row chunks rename rules take of it (innermost first)."""

    source: Any  # dif.weights.gguf.GGUFFile
    tensor: str
    rows: tuple[Chunk, ...] = ()

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """(packed, scales) as `int4_linear` reads them (`q4_0_groups`), the row chunks taken."""
        rows, cols = self.source.info(self.tensor).shape
        q, s = q4_0_groups(self.source.raw(self.tensor), rows, cols)
        for chunk in self.rows:
            q, s = chunk.apply(q), chunk.apply(s)
        return np.ascontiguousarray(q), np.ascontiguousarray(s)


def stored_q4_0(weights: Mapping[str, Any], param: str) -> StoredQ4_0 | None:
    """The Q4_0 blocks behind parameter `param` of bound weights, or None (another type, another source, a
    source between that changes the values: `dif.weights.stored.stored_of`)."""
    from dif.weights.gguf import GGUFFile
    from dif.weights.stored import stored_of

    found = stored_of(weights, param)
    if found is None or found.scale is not None or not isinstance(found.source, GGUFFile):
        return None
    if found.source.stored_type(found.tensor) != KEPT_TYPE or len(found.source.info(found.tensor).shape) != 2:
        return None
    return StoredQ4_0(found.source, found.tensor, found.rows)


@frozen
class Int4Choice:
    """A program's parameters stored as Q4_0 and whether their linears run 4-bit: `why_not` None rewrites them
    (`apply`); otherwise it says why they run dequantized."""

    label: str
    stored: tuple[str, ...]
    dtype: str
    why_not: str | None

    def apply(self, program: Program, target: TargetProfile | None) -> Program:
        """`program` with each linear over a stored parameter as `int4_linear` over its blocks (unchanged when
        `why_not` says why not)."""
        if self.why_not is not None:
            return program
        from dif.passes.context import PassContext
        from dif.passes.quantize import keep_stored_int4

        return keep_stored_int4(program, set(self.stored), GROUP, ctx=PassContext("keep_stored_int4", target))

    def outcome(self, optimized: Program) -> tuple[str, str]:
        """(summary, why) once the program is `optimized`: how many Q4_0 weights run as stored 4-bit groups and
        how many run dequantized."""
        names = {p.name for p in optimized.params}
        kept = sum(1 for p in self.stored if derived_name(p, GROUP_FORMAT, "q", GROUP) in names)
        rest = len(self.stored) - kept
        if kept:
            why = f"{self.label}: their Q4_0 blocks are int4_linear's groups of {GROUP}, re-packed, not re-quantized"
            if rest:
                why += f"; {rest} more run dequantized to {self.dtype} (not the weight of a linear)"
            return f"{kept} kept as stored ({KEPT_TYPE} as {GROUP_FORMAT}{GROUP})", why
        reason = self.why_not or "no linear reads them"
        return f"{rest} dequantized to {self.dtype}", f"{self.label}: {rest} Q4_0 weights dequantized: {reason}"


def choose_int4(
    program: Program, weights: Mapping[str, Any], target: TargetProfile | None, *, keep: bool
) -> Int4Choice | None:
    """Whether `program`, bound to `weights`, runs the weights its GGUF checkpoint stores as Q4_0 4-bit on
    `target` (None: the reference interpreter, which runs programs as built); None when it has no such weight.
    `keep`: its frontend asks for it (a denoiser)."""
    from dif.formats import execution_on
    from dif.passes.context import supports_op

    stored = tuple(p.name for p in program.params if stored_q4_0(weights, p.name) is not None)
    if not stored:
        return None
    dtype = program.types[stored[0]].dtype.value
    source = getattr(weights, "source", None)
    label = source.label if isinstance(source, TensorSource) else program.name
    why_not: str | None = None
    if not keep:
        why_not = f"its frontend runs program '{program.name}' in the run dtype (4-bit weights are kept in denoisers)"
    elif target is None:
        why_not = "the reference interpreter runs programs as built"
    elif execution_on(GROUP_FORMAT, target).startswith("not executed") or not supports_op(target, "int4_linear"):
        why_not = f"backend '{target.backend}' does not run int4_linear"
    return Int4Choice(label, stored, dtype, why_not)

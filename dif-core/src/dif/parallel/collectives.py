"""The collective op of sequence-parallel rank programs: `all_to_all`.

It lives in its own op table (`COLLECTIVE_OPS`; `parallel_table()` adds it to the core opset for verifying
rank programs), not in `dif.ops.OPS`: no backend lowers it. A rank program is cut at its collectives
(`dif.parallel.segments`) and the runner performs them between the pieces: in-process on the host
(`dif.parallel.local`) or with NCCL (`dif_backend_cuda.nccl`).
"""

from __future__ import annotations

import numpy as np

from dif.errors import DifError
from dif.ir.types import TensorType
from dif.ops._rules import fail, float_cases
from dif.ops.registry import OPS, AttrSpec, OpTable, defop

COLLECTIVE_OPS = OpTable()
COLLECTIVES = ("all_to_all",)


def _a2a_infer(x: TensorType, *, ranks: int, split_axis: int, concat_axis: int) -> TensorType:
    if ranks < 1:
        raise fail(f"ranks must be >= 1, got {ranks}")
    shape = list(x.shape)
    for a in (split_axis, concat_axis):
        if not -x.rank <= a < x.rank:
            raise fail(f"axis {a} is outside the {x.rank} axes of {x}")
    s, c = split_axis % x.rank, concat_axis % x.rank
    if shape[s] % ranks:
        raise fail(f"axis {s} of {x} ({shape[s]}) does not split into {ranks} equal parts")
    shape[s] //= ranks
    shape[c] *= ranks
    return TensorType(shape, x.dtype)


@defop(
    "all_to_all",
    operands=("x",),
    attrs=(
        AttrSpec("ranks", "int", doc="ranks in the group"),
        AttrSpec("split_axis", "int", doc="axis cut into `ranks` parts; part j goes to rank j"),
        AttrSpec("concat_axis", "int", doc="axis along which the parts received from ranks 0..P-1 are joined"),
    ),
    infer=_a2a_infer,
    cases=lambda rng, dt: float_cases(rng, dt, [[(2, 3, 4)]], ranks=1, split_axis=2, concat_axis=1),
    category="collective",
    table=COLLECTIVE_OPS,
)
def all_to_all(x: np.ndarray, *, ranks: int, split_axis: int, concat_axis: int) -> np.ndarray:
    """all_to_all(x; ranks, split_axis, concat_axis): every rank cuts x into `ranks` equal parts along
    split_axis, sends part j to rank j, and joins what it receives from ranks 0..P-1 along concat_axis.
    One rank alone: x unchanged. With more, only a communicator runs it (`exchange_all_to_all`)."""
    if ranks != 1:
        raise DifError(
            f"all_to_all over {ranks} ranks needs a communicator",
            hint="run the rank programs with dif.parallel.local.run_ranks or the NCCL launcher",
        )
    return x


def exchange_all_to_all(xs: list[np.ndarray], *, split_axis: int, concat_axis: int) -> list[np.ndarray]:
    """The all-to-all of every rank's operand at once (in-process): what rank r receives, for r in order."""
    ranks = len(xs)
    parts = [np.split(x, ranks, axis=split_axis) for x in xs]
    return [np.concatenate([parts[src][dst] for src in range(ranks)], axis=concat_axis) for dst in range(ranks)]


def parallel_table() -> OpTable:
    """The core opset (as registered now, plugins included) plus the collectives."""
    table = OpTable()
    for op in (*OPS, *COLLECTIVE_OPS):
        table.register(op)
    return table

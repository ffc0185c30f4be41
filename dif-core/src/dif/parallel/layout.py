"""How one axis of a tensor (the packed sequence) is split across ranks.

A sharded axis is a list of `Block`s: contiguous row ranges of the global axis, each cut into `ranks` equal
chunks of ceil(length / ranks) rows; rank r holds chunk r of every block, in block order, the rows past a
block's end padded. Every rank's tensor has the same shape (`local_length`), so the all-to-all exchanges
equal pieces; a block keeps its rows apart from its neighbours', so the text and image streams of a joint
attention stay whole blocks that a later slice can take apart again.
"""

from __future__ import annotations

from attrs import field, frozen


@frozen
class Block:
    """Global rows [start, start + length) of the axis, split evenly over the ranks. `origin`: the program
    input and row this block's first row comes from (the transform cuts an input's block where the program
    slices it; not part of equality: two values split alike are alike whatever they came from)."""

    start: int
    length: int
    origin: tuple[str, int] | None = field(default=None, eq=False)

    def chunk(self, ranks: int) -> int:
        """Rows of this block on every rank (padding included)."""
        return -(-self.length // ranks)

    def valid(self, rank: int, ranks: int) -> int:
        """Rows of this block rank `rank` really holds (the rest of its chunk is padding)."""
        c = self.chunk(ranks)
        return max(0, min(c, self.length - rank * c))

    def first_row(self, rank: int, ranks: int) -> int:
        """The global row of rank `rank`'s first row of this block."""
        return self.start + rank * self.chunk(ranks)

    def padding(self, ranks: int) -> int:
        """Padding rows of this block summed over all ranks."""
        return self.chunk(ranks) * ranks - self.length

    def shifted(self, by: int) -> Block:
        return Block(self.start + by, self.length, self.origin)

    def source_row(self, row: int) -> tuple[str, int] | None:
        """(input, input row) of global row `row` of this block, when the block comes from an input."""
        return None if self.origin is None else (self.origin[0], self.origin[1] + row - self.start)


@frozen
class Sharding:
    """`axis` of a value is split as `blocks` (local order); the blocks partition the global axis."""

    axis: int
    blocks: tuple[Block, ...]

    @property
    def global_length(self) -> int:
        return sum(b.length for b in self.blocks)

    def local_length(self, ranks: int) -> int:
        return sum(b.chunk(ranks) for b in self.blocks)

    def local_offsets(self, ranks: int) -> list[int]:
        """Each block's first local row."""
        out, at = [], 0
        for b in self.blocks:
            out.append(at)
            at += b.chunk(ranks)
        return out

    def padding(self, ranks: int) -> int:
        return sum(b.padding(ranks) for b in self.blocks)

    def on_axis(self, axis: int) -> Sharding:
        return Sharding(axis, self.blocks)

    def describe(self, ranks: int) -> str:
        parts = ", ".join(f"rows {b.start}..{b.start + b.length} ({b.chunk(ranks)}/rank)" for b in self.blocks)
        return f"axis {self.axis}: {parts}; {self.local_length(ranks)} rows per rank, {self.padding(ranks)} padding"


def single(axis: int, length: int, origin: str | None = None) -> Sharding:
    """One block: the whole axis split evenly (`origin`: the input it is)."""
    return Sharding(axis, (Block(0, length, None if origin is None else (origin, 0)),))


def cut_at(sharding: Sharding, row: int) -> Sharding:
    """`sharding` with the block holding `row` (not at its start) cut in two there."""
    blocks = []
    for b in sharding.blocks:
        if b.start < row < b.start + b.length:
            o = b.origin
            blocks += [Block(b.start, row - b.start, o), Block(row, b.start + b.length - row, b.source_row(row))]
        else:
            blocks.append(b)
    return Sharding(sharding.axis, tuple(blocks))

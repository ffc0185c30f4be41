"""How one axis of a tensor (the packed sequence) is split across ranks.

A sharded axis is a list of `Block`s: contiguous row ranges of the global axis, each cut into `ranks` equal
chunks of ceil(length / ranks) rows; rank r holds chunk r of every block, in block order, the rows past a
block's end padded. Every rank's tensor has the same shape (`local_length`), so the all-to-all exchanges
equal pieces; a block keeps its rows apart from its neighbours', so the text and image streams of a joint
attention stay whole blocks that a later slice can take apart again.
"""

from __future__ import annotations

from attrs import frozen


@frozen
class Block:
    """Global rows [start, start + length) of the axis, split evenly over the ranks."""

    start: int
    length: int

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
        return Block(self.start + by, self.length)


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


def single(axis: int, length: int) -> Sharding:
    """One block: the whole axis split evenly."""
    return Sharding(axis, (Block(0, length),))

"""Sequence parallelism (Ulysses) as a DiffIR transform, and the runners of its per-rank programs.

    program --ulysses(ranks=P)--> P rank programs (all_to_all before/after each sdpa, sequence rows sharded)
            --segments--> collective-free pieces any backend prepares --run_ranks / launcher--> outputs

`layout` describes how a sequence axis is split across ranks (padding included), `collectives` holds the
collective op (its own op table: backends never see it), `ulysses` is the transform, `segments` cuts a rank
program at its collectives, `local` runs all ranks in one process with an in-process all-to-all (the CPU
stand-in), `launch` is the one-process-per-GPU entry (torchrun-style environment, NCCL through
`dif_backend_cuda.nccl`).
"""

from dif.parallel.layout import Block, Sharding
from dif.parallel.ulysses import ParallelPlan, ulysses

__all__ = ["Block", "ParallelPlan", "Sharding", "ulysses"]

"""CFG-parallel: classifier-free guidance's two denoiser passes on two ranks instead of one after the other.

    every step, on both ranks:  rank 0: v_c = predict(x, t, cond)    rank 1: v_u = predict(x, t, uncond)
                                all_gather -> [v_c, v_u] on both -> v = cfg_combine(v_c, v_u, guidance)
                                the same Euler / Heun / DPM++ step on both, so both hold the same latents

Where it sits: the kit's sampling loop (`dif.kit.sampling.sample(cfg_parallel=...)`) takes a `CfgParallel`;
`dif NAME generate --gpus 2` makes one per rank process (`dif.kit.ranks`). Each rank runs the model's own
programs unchanged on its branch's conditioning, and the combine sees exactly the arrays one device would
compute, so the result equals the single-device run bit for bit (on a deterministic backend).

The decision (degree, which rank runs which branch, why) is recorded as `PassDecision`s (pass name
`cfg_parallel`) and in the run's settings (`record()`). Not composed with Ulysses sequence parallel yet:
CFG x Ulysses needs a communicator per sub-group (ranks {0, 1} per branch exchanging rows, ranks {0, 2}
exchanging velocities), which neither stand-in nor `dif_backend_cuda.nccl` has.
"""

from __future__ import annotations

from typing import Any

from attrs import field, frozen

from dif.errors import UsageError
from dif.passes.context import PassDecision

BRANCHES = ("cond", "uncond")
"""The branch of rank r is BRANCHES[r]: rank 0 the prompt, rank 1 the negative prompt (or empty one)."""
DEGREE = len(BRANCHES)


@frozen
class CfgParallel:
    """Rank `rank` of a CFG-parallel pair; `comm` has `all_gather(x) -> [x of rank 0, x of rank 1]`
    (`dif.parallel.launch.Communicator`)."""

    rank: int
    comm: Any = field(eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.rank < DEGREE:
            raise UsageError(f"CFG-parallel rank {self.rank} is outside 0..{DEGREE - 1}")

    @property
    def branch(self) -> str:
        """The branch ("cond" or "uncond"): the conditioning this rank's denoiser pass takes."""
        return BRANCHES[self.rank]

    def decisions(self) -> tuple[PassDecision, ...]:
        """The decision as passes record theirs: the degree and each rank's branch."""
        ranks = ", ".join(f"rank {r}: {b}" for r, b in enumerate(BRANCHES))
        return (
            PassDecision(
                "cfg_parallel",
                f"degree {DEGREE}",
                f"CFG is on: its cond and uncond denoiser passes are independent, so they run on {DEGREE} ranks "
                f"at once ({ranks}); their velocities are all-gathered each step and combined alike on both",
            ),
        )

    def record(self) -> dict[str, Any]:
        """What the run's settings say about it (`settings["parallel"]`)."""
        return {"mode": "cfg", "degree": DEGREE, "branches": {str(r): b for r, b in enumerate(BRANCHES)}}


def check_cfg_parallel(ranks: int, *, cfg: bool, guidance: float) -> None:
    """`UsageError` unless `ranks` ranks can run this request CFG-parallel: exactly two, and CFG on."""
    if ranks != DEGREE:
        raise UsageError(
            f"--gpus {ranks}: generate splits a run over {DEGREE} ranks (CFG-parallel: cond and uncond on one each)",
            hint="use --gpus 2, or --gpus 1; sequence parallel (dif.parallel.ulysses) is not run by generate yet",
        )
    if not cfg:
        raise UsageError(
            f"--gpus {ranks} runs CFG-parallel, but CFG is off for this run (guidance {guidance:g}, or a "
            "guidance-distilled checkpoint)",
            hint="raise --guidance on a base checkpoint, or run on one GPU (--gpus 1)",
        )

"""What an optimizer pass is given (`PassContext`) and what it leaves behind (`PassDecision`).

A pass asks the context whether the target runs an op (`supports`: the backend lists `op:<name>`
in its `TargetProfile.capabilities`, or `op:*` for "everything in the op table") and records one
decision per candidate it looked at: applied, or skipped with the reason. The pass manager
(`dif.passes.manager`) turns the decisions into plan decisions.
"""

from __future__ import annotations

import logging

from attrs import define, field, frozen

from dif._convert import ints
from dif.target import TargetProfile

APPLIED = "applied"
SKIPPED = "skipped"
VERDICTS = (APPLIED, SKIPPED)

OP_CAPABILITY = "op:{}"
"""A backend that implements op NAME beyond the core opset lists `op:NAME` in its capabilities."""
ALL_OPS_CAPABILITY = "op:*"
"""Listed by a backend that runs every op of the table (the CPU reference backend)."""

log = logging.getLogger("dif.passes")


def supports_op(target: TargetProfile | None, op: str) -> bool:
    """Whether `target` declares it runs `op`. No target means the reference interpreter: every op."""
    if target is None:
        return True
    caps = target.capabilities
    return ALL_OPS_CAPABILITY in caps or OP_CAPABILITY.format(op) in caps


@frozen
class PassDecision:
    """One candidate a pass looked at. `nodes` are ids in the program the pass was given; `value`
    names the result the (fused) node produces, which stays the same in later programs."""

    pass_name: str
    verdict: str
    reason: str
    nodes: tuple[int, ...] = field(default=(), converter=ints)
    value: str = ""

    def describe(self) -> str:
        where = f" at {self.value}" if self.value else ""
        nodes = f" (nodes {', '.join(map(str, self.nodes))})" if self.nodes else ""
        return f"{self.pass_name}: {self.verdict}{where}{nodes}: {self.reason}"


@define
class PassContext:
    """Handed to every pass as the `ctx` option. Mutable on purpose: `record` appends decisions."""

    pass_name: str
    target: TargetProfile | None = None
    decisions: list[PassDecision] = field(factory=list)

    def supports(self, op: str) -> bool:
        return supports_op(self.target, op)

    def lacks(self, op: str) -> str:
        """The skip reason when the target does not run `op`."""
        backend = self.target.backend if self.target is not None else "?"
        return f"target '{backend}' does not declare {OP_CAPABILITY.format(op)}"

    def record(self, verdict: str, reason: str, nodes: tuple[int, ...] = (), value: str = "") -> PassDecision:
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
        decision = PassDecision(self.pass_name, verdict, reason, nodes, value)
        self.decisions.append(decision)
        log.debug("%s", decision.describe())
        return decision

    def applied(self, reason: str, nodes: tuple[int, ...] = (), value: str = "") -> PassDecision:
        return self.record(APPLIED, reason, nodes, value)

    def skipped(self, reason: str, nodes: tuple[int, ...] = (), value: str = "") -> PassDecision:
        return self.record(SKIPPED, reason, nodes, value)

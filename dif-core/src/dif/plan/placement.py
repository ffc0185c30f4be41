"""Host/device node placement: which nodes of a plan run on the host instead of as device launches
(a planner step, after the schedule; executors that can run nodes on the host follow it).

A target whose launches cost more than the host needs for a tiny op declares the measured break-even
as `TargetProfile.host_threshold_bytes`. A node then runs on the host when it touches (operands +
results) at most that many bytes and reads only values the host has: program inputs, weights and
results of other host nodes. Everything else, and everything on a target declaring no threshold,
runs on the device. Host results a device node reads keep their arena slot; the executor writes them
there before that node.
"""

from __future__ import annotations

from attrs import frozen

from dif.errors import PlanError
from dif.ir.program import Node, Program

DEVICE = "device"
HOST = "host"
PLACEMENTS = (DEVICE, HOST)


@frozen
class Placed:
    """The placement of a schedule, one entry per step, and the reason for each host node."""

    placement: tuple[str, ...]
    host_reasons: dict[int, str]


def node_bytes(program: Program, node: Node) -> int:
    types = program.types
    return sum(types[o].nbytes for o in node.operands) + sum(r.type.nbytes for r in node.results)


def host_known(program: Program) -> set[str]:
    """Values the host has before any node runs: program inputs and weights."""
    return {v.name for v in program.inputs} | {p.name for p in program.params}


def place_nodes(program: Program, schedule: tuple[int, ...], threshold: int | None) -> Placed:
    """Where each step of `schedule` runs (see the module docstring); None or 0: all on the device."""
    if not threshold:
        return Placed((DEVICE,) * len(schedule), {})
    nodes = program.node_by_id
    known = host_known(program)
    placement: list[str] = []
    reasons: dict[int, str] = {}
    for node_id in schedule:
        node = nodes[node_id]
        size = node_bytes(program, node)
        if size <= threshold and all(o in known for o in node.operands):
            placement.append(HOST)
            known.update(r.name for r in node.results)
            reasons[node_id] = f"touches {size} B <= {threshold} B and reads only inputs, weights and host results"
        else:
            placement.append(DEVICE)
    return Placed(tuple(placement), reasons)


def check_placement(placement: tuple[str, ...], schedule: tuple[int, ...], program: Program | None = None) -> None:
    """Raise `PlanError` unless there is one known placement per step and (given the program) every
    host node reads only inputs, weights and results of earlier host nodes."""
    if len(placement) != len(schedule):
        raise PlanError(f"placement lists {len(placement)} nodes but the schedule has {len(schedule)}")
    bad = sorted(set(placement) - set(PLACEMENTS))
    if bad:
        raise PlanError(f"unknown node placement {bad[:3]}, expected one of {PLACEMENTS}")
    if program is None:
        return
    nodes = program.node_by_id
    known = host_known(program)
    for node_id, where in zip(schedule, placement, strict=True):
        node = nodes[node_id]
        if where != HOST:
            continue
        missing = [o for o in node.operands if o not in known]
        if missing:
            raise PlanError(
                f"node {node_id} ({node.op}) is placed on the host but reads {missing[0]}, which only the device has",
                hint="a host node may read program inputs, weights and results of earlier host nodes; re-plan",
            )
        known.update(r.name for r in node.results)

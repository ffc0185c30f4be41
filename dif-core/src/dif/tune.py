"""What `dif tune` reports: each tunable problem of a program (GEMM, attention, convolution), the backend's
candidates for it with their verdicts, and the library choices a backend stored on disk.

A backend offers candidates through an optional `tune_candidates(node, program) -> [(name, kernel)]`
method; one without it has a single candidate per op, its own lowering (the CPU backend: the op table's
numpy reference, which is what makes it the reference, so nothing is chosen there). Candidates are
accepted in the compiler's order: runs, matches the reference within the op's dtype tolerance, then
fastest (median of `repeat` timed calls). Measured verdicts are stored per backend fingerprint and
problem (`dif.diskcache`, under DIF_CACHE_DIR/tune) and reused until `force`.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dif.diskcache import key_digest, read_entry, write_entry
from dif.env import cache_dir
from dif.trace.vocabulary import ATTENTION, CONVOLUTION, GEMM, op_kind

if TYPE_CHECKING:
    from dif.backend import Backend
    from dif.ir.program import Node, Program

TUNABLE = (GEMM, ATTENTION, CONVOLUTION)
Kernel = Callable[[list[np.ndarray], Any], Sequence[np.ndarray]]


def problem_key(node: Node, program: Program) -> str:
    """The problem a node poses: opcode, operand types and attributes (what a choice depends on)."""
    types = [str(program.types[o]) for o in node.operands]
    return f"{node.op}({', '.join(types)}) {json.dumps(node.attrs, sort_keys=True, default=str)}"


def problems(program: Program) -> dict[str, Node]:
    """The distinct tunable problems of `program`, each with its first node."""
    out: dict[str, Node] = {}
    for node in program.nodes:
        if op_kind(node.op) in TUNABLE:
            out.setdefault(problem_key(node, program), node)
    return out


def _operands(node: Node, program: Program, rng: np.random.Generator) -> list[np.ndarray]:
    ops = []
    for name in node.operands:
        t = program.types[name]
        if t.dtype.value == "bool":
            ops.append(np.ones(t.shape, dtype=bool))
        else:
            ops.append((rng.standard_normal(t.shape) * 0.5).astype(t.dtype.np))
    return ops


def _time(kernel: Kernel, operands: list[np.ndarray], attrs: Any, repeat: int) -> float:
    kernel(operands, attrs)  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        kernel(operands, attrs)
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def candidates_of(backend: Backend, node: Node, program: Program) -> list[tuple[str, Kernel]]:
    offer = getattr(backend, "tune_candidates", None)
    if offer is not None:
        return list(offer(node, program))
    from dif.ops.registry import OPS

    return [(f"{backend.name} lowering (op table reference)", OPS.get(node.op).run_reference)]


def tune_program(program: Program, backend: Backend, *, repeat: int = 5, force: bool = False) -> list[dict[str, Any]]:
    """One row per distinct tunable problem: its candidates with verdicts, the chosen one, and whether
    the verdicts came from the store ("cached") or were measured now ("measured")."""
    from dif.interp import cast_results
    from dif.ops.registry import OPS
    from dif.testing.tolerances import compare, tolerance_for

    profile = backend.profile()
    root = cache_dir() / "tune"
    rows = []
    for key, node in problems(program).items():
        store_key = {"backend": str(backend.name), "target": profile.fingerprint(), "problem": key}
        path = root / f"{backend.name}-{key_digest(store_key)}.json"
        stored = None if force else read_entry(path, store_key)
        if stored is not None:
            rows.append({**json.loads(stored), "source": "cached"})
            continue
        rng = np.random.default_rng(0)
        operands = _operands(node, program, rng)
        want = cast_results(node, OPS.get(node.op).run_reference(operands, node.attrs))
        tol = tolerance_for(node.results[0].type.dtype, reduction=int(program.types[node.operands[0]].shape[-1]))
        verdicts = []
        for name, kernel in candidates_of(backend, node, program):
            row: dict[str, Any] = {"candidate": name}
            try:
                got = cast_results(node, kernel(operands, node.attrs))
            except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is rejected, not fatal
                verdicts.append(
                    {**row, "verdict": "rejected: does not run", "detail": f"{type(exc).__name__}: {exc}"[:200]}
                )
                continue
            cmp = compare(got[0], want[0], tol)
            if not cmp.ok:
                verdicts.append({**row, "verdict": "rejected: numerical gate", "max_abs": cmp.max_abs})
                continue
            verdicts.append(
                {**row, "verdict": "accepted", "ms_median": round(_time(kernel, operands, node.attrs, repeat), 6)}
            )
        accepted = [v for v in verdicts if v["verdict"] == "accepted"]
        chosen = min(accepted, key=lambda v: v["ms_median"])["candidate"] if accepted else None
        for v in accepted:
            v["verdict"] = "chosen" if v["candidate"] == chosen else "slower"
        result = {
            "problem": key,
            "kind": op_kind(node.op),
            "op_id": node.id,
            "candidates": verdicts,
            "chosen": chosen,
            "note": "" if len(verdicts) > 1 else "one candidate: this backend has nothing to choose for this op",
        }
        write_entry(path, json.dumps(result, sort_keys=True).encode(), store_key)
        rows.append({**result, "source": "measured"})
    return rows


def stored_choices(folder: Path) -> list[dict[str, Any]]:
    """The library choices a backend stored under `folder` (e.g. the cuda backend's `cuda/choices`):
    one row per intact entry with its key (library, version, device, problem, candidates) and choice.
    Read only; damaged entries are left to their owner."""
    from dif.diskcache import MAGIC

    rows = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        data = path.read_bytes()
        if not data.startswith(MAGIC):
            continue
        size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
        try:
            header = json.loads(data[len(MAGIC) + 4 : len(MAGIC) + 4 + size])
            key = header["key"]
            payload = json.loads(data[len(MAGIC) + 4 + size :])
        except (ValueError, KeyError, TypeError):
            continue
        rows.append({"file": path.name, **{k: v for k, v in key.items()}, "choice": payload.get("choice")})
    return rows

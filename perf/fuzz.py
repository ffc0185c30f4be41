"""Fuzz every reader of outside bytes (issue 14): N mutated inputs per format, count what is not a DifError.

Targets: dif-core's (`dif.testing.fuzz_targets.core_targets`) and the frontends' config readers
(`fuzz_targets()` of dif-frontend-*/tests/test_fuzz_*.py, loaded by path: dif-core does not import
frontends). Cases are split into chunks run in a process pool; a case's input depends only on
(seed, target, case index), so any failure replays with `dif.testing.fuzz_run.case_input`.

    python perf/fuzz.py --cases 100000 --out perf/results/fuzz.json [--targets NAME ...] [--jobs 2]

Prints the table (format, cases, non-DifError exceptions, seconds), writes the JSON, exits 1 when
any target raised something other than a DifError.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import concurrent.futures.process
import datetime
import importlib.util
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from dif.testing.fuzz_run import Failure, FuzzResult, FuzzTarget, check_seeds, run_fuzz
from dif.testing.fuzz_targets import NOT_APPLICABLE, core_targets

REPO = Path(__file__).resolve().parent.parent
FRONTEND_TARGET_FILES = sorted(REPO.glob("dif-frontend-*/tests/test_fuzz_*.py"))

_TARGETS: list[FuzzTarget] = []  # set before the pool forks; workers index into it


def frontend_targets() -> list[FuzzTarget]:
    """`fuzz_targets()` of every frontend fuzz test file (a frontend that is not installed is skipped)."""
    found: list[FuzzTarget] = []
    for path in FRONTEND_TARGET_FILES:
        spec = importlib.util.spec_from_file_location(f"fuzz_{path.parent.parent.name.replace('-', '_')}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as exc:
            print(f"skipping {path}: {exc}", file=sys.stderr)
            continue
        found.extend(module.fuzz_targets())
    return found


def _chunk(index: int, start: int, cases: int, seed: int, trace: bool) -> FuzzResult:
    if trace:  # a chunk that starts and never ends names the target that killed its process
        print(f"start {_TARGETS[index].name} {start}", file=sys.stderr, flush=True)
    result = run_fuzz(_TARGETS[index], cases, seed, start=start)
    if trace:
        print(f"end {_TARGETS[index].name} {start}", file=sys.stderr, flush=True)
    return result


def _failure_doc(f: Failure) -> dict[str, object]:
    return {"type": f.type, "message": f.message, "where": f.where, "sha256": f.sha256, "case": f.case}


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000, help="cases per target")
    parser.add_argument("--targets", nargs="*", default=None, help="only targets whose name contains one of these")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--chunk", type=int, default=5_000, help="cases per pool task")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--trace", action="store_true", help="print each chunk's start and end on stderr")
    args = parser.parse_args(argv)

    targets = core_targets() + frontend_targets()
    if args.targets:
        targets = [t for t in targets if any(s in t.name for s in args.targets)]
    for t in targets:
        check_seeds(t)  # a rejected seed would make the whole target meaningless
    _TARGETS[:] = targets

    tasks = [
        (i, start, min(args.chunk, args.cases - start))
        for i in range(len(targets))
        for start in range(0, args.cases, args.chunk)
    ]
    results: dict[int, list[FuzzResult]] = {i: [] for i in range(len(targets))}
    commit = _commit()  # the code that runs is the code imported now, whatever is committed meanwhile
    began = time.perf_counter()
    context = multiprocessing.get_context("fork")
    pending = list(tasks)
    for attempt in range(3):  # a worker killed from outside (out of memory) breaks the pool: rerun what it lost
        done: list[tuple[int, int, int]] = []
        try:
            with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
                futures = {pool.submit(_chunk, *task, args.seed, args.trace): task for task in pending}
                for future in concurrent.futures.as_completed(futures):
                    results[futures[future][0]].append(future.result())
                    done.append(futures[future])
                    if len(done) % max(1, len(tasks) // 20) == 0:
                        elapsed = time.perf_counter() - began
                        print(f"  {len(done)}/{len(pending)} chunks, {elapsed:.0f} s", file=sys.stderr, flush=True)
        except concurrent.futures.process.BrokenProcessPool:
            print(f"a worker died (attempt {attempt + 1}); rerunning its chunks", file=sys.stderr)
        pending = [t for t in pending if t not in done]
        if not pending:
            break
    lost = pending
    wall = time.perf_counter() - began

    rows = []
    for i, t in enumerate(targets):
        parts = results[i]
        failures = sorted((f for r in parts for f in r.failures), key=lambda f: f.case)
        rows.append(
            {
                "format": t.name,
                "reader": t.reader,
                "kind": t.kind,
                "cases": sum(r.cases for r in parts),
                "non_dif_exceptions": len(failures),
                "seconds": round(sum(r.seconds for r in parts), 2),
                "slowest_case_s": round(max(r.slowest_case_s for r in parts), 4),
                "examples": [_failure_doc(f) for f in failures[:20]],
                "lost_chunks": [[start, n] for j, start, n in lost if j == i],
            }
        )
    width = max(len(r["format"]) for r in rows)  # type: ignore[arg-type]
    print(f"{'format':<{width}}  {'cases':>8}  {'non-DifError':>12}  {'seconds':>8}")
    for r in rows:
        print(f"{r['format']:<{width}}  {r['cases']:>8}  {r['non_dif_exceptions']:>12}  {r['seconds']:>8.1f}")
    for name, why in NOT_APPLICABLE.items():
        print(f"{name:<{width}}  {'n/a':>8}  {'n/a':>12}  {'n/a':>8}  ({why})")
    total = sum(int(r["non_dif_exceptions"]) for r in rows)  # type: ignore[call-overload]
    if lost:
        print(f"{len(lost)} chunks never finished (their worker died three times): {lost}")
    print(f"{len(rows)} targets, {total} non-DifError exceptions, {wall:.0f} s wall on {args.jobs} processes")

    if args.out is not None:
        doc = {
            "kind": "dif-fuzz/1",
            "commit": commit,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other work)",
            "python": platform.python_version(),
            "cases_per_target": args.cases,
            "seed": args.seed,
            "jobs": args.jobs,
            "wall_s": round(wall, 1),
            "seconds_note": "a target's seconds: its run time summed over its chunks (one process each)",
            "targets": rows,
            "not_applicable": [{"format": name, "why": why} for name, why in NOT_APPLICABLE.items()],
            "non_dif_exceptions_total": total,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 1 if total or lost else 0


if __name__ == "__main__":
    sys.exit(main())

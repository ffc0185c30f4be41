"""Run a checked `Recipe`: each stage a fresh child process, timed and measured from the outside.

Where it sits: after `dif.bench.recipe`; `dif bench` turns the `BenchResult` into a dif-telemetry/1 document.
Per stage: page-cache residency of its model files before it starts, wall time (perf_counter around the
process, from spawn to reaping), the child's rusage from wait4 (CPU, max RSS, major faults), NVML device
memory and power sampled while it runs, stdout/stderr in files in the workdir, its declared outputs decoded
afterwards, and the dif-telemetry/1 document it printed, if any. The figure is the summed wall of the
measured stages in a round, its median over rounds; reference stages give the ratio.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from attrs import define, field

from dif.bench.nvml import DeviceSampler
from dif.bench.outputs import verify_output
from dif.bench.recipe import ROLES, Recipe, Stage
from dif.bench.residency import evict, expand, probe_files
from dif.errors import DifError

STDERR_TAIL = 2000  # characters of a failed stage's stderr kept in the report
MAX_TELEMETRY_BYTES = 64 << 20  # a stdout larger than this is not parsed for a telemetry document


@define
class BenchResult:
    """What `run_recipe` did: one list of stage records per round, the failures, and the summary."""

    recipe: Recipe
    repeat: int
    rounds: list[list[dict[str, Any]]] = field(factory=list)
    failures: list[dict[str, Any]] = field(factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> dict[str, Any]:
        return summarize(self.recipe, self.rounds)

    def events(self) -> list[dict[str, Any]]:
        """One telemetry event per stage that ran: its wall time in ms, round and role."""
        return [
            {"name": f"stage.{r['name']}", "ms": round(r["wall_s"] * 1000, 3), "round": r["round"], "role": r["role"]}
            for stage_records in self.rounds
            for r in stage_records
            if r.get("wall_s") is not None
        ]

    def to_data(self) -> dict[str, Any]:
        """The `data` of the `bench` telemetry document."""
        return {
            "recipe": {"path": str(self.recipe.path), "name": self.recipe.name, "description": self.recipe.description},
            "workdir": str(self.recipe.workdir),
            "repeat": self.repeat,
            "status": "ok" if self.ok else "failed",
            "summary": self.summary(),
            "failures": list(self.failures),
            "rounds": [list(stages) for stages in self.rounds],
        }


def _rusage(ru: Any) -> dict[str, Any]:
    rss_unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return {
        "user_s": round(ru.ru_utime, 4),
        "sys_s": round(ru.ru_stime, 4),
        "max_rss_bytes": int(ru.ru_maxrss) * rss_unit,
        "major_faults": int(ru.ru_majflt),
        "minor_faults": int(ru.ru_minflt),
    }


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(os.path.getsize(path) - 4 * STDERR_TAIL, 0))
            return f.read().decode("utf-8", errors="replace")[-STDERR_TAIL:]
    except OSError:
        return ""


def _telemetry(stdout: Path) -> dict[str, Any]:
    """The dif-telemetry/1 document the stage printed (all of its stdout), with dif's own stage times."""
    from dif.telemetry import SCHEMA, validate_document

    try:
        if os.path.getsize(stdout) > MAX_TELEMETRY_BYTES:
            return {}
        doc = json.loads(stdout.read_text(errors="replace"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return {}
    try:
        validate_document(doc)
    except DifError as exc:
        return {"telemetry_error": str(exc)}
    data = doc.get("data", {})
    diagnostics = {k: data[k] for k in ("timings_s", "total_s") if k in data}
    return {"telemetry": doc, "dif_reported": diagnostics}


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pid, signal.SIGKILL)  # the stage's whole session: it may have children of its own


def run_stage(stage: Stage, workdir: Path, round_index: int, *, drop_cache: bool = False) -> dict[str, Any]:
    """Run one stage as a child process and return its record (`status` 'ok' or 'failed', with `reason`)."""
    record: dict[str, Any] = {"name": stage.name, "role": stage.role, "round": round_index, "argv": list(stage.argv)}
    for out in stage.outputs:  # an output left by an earlier run must not pass for this one
        Path(out).unlink(missing_ok=True)
    if drop_cache and stage.role != "setup":
        record["evicted_files"] = sum(evict(f) for f in expand(stage.model_files))
    record["residency"] = probe_files(stage.model_files)
    stdout = workdir / f"{stage.name}.r{round_index}.stdout"
    stderr = workdir / f"{stage.name}.r{round_index}.stderr"
    record["stdout"], record["stderr"] = str(stdout), str(stderr)
    env = {**os.environ, **dict(stage.env)}
    sampler = DeviceSampler()
    sampler.start()  # NVML's own start-up stays outside the timed wall
    timed_out = threading.Event()
    with open(stdout, "wb") as out_file, open(stderr, "wb") as err_file:
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                list(stage.argv), stdin=subprocess.DEVNULL, stdout=out_file, stderr=err_file, env=env, cwd=workdir,
                start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            sampler.stop()
            return {**record, "status": "failed", "reason": f"cannot start {stage.argv[0]}: {exc}", "exit_status": None}
        sampler.watch(proc.pid)

        def expire() -> None:
            timed_out.set()
            _kill_group(proc.pid)

        timer = threading.Timer(stage.timeout_s, expire)
        timer.start()
        try:
            _, status, ru = os.wait4(proc.pid, 0)  # this child's own rusage, not the sum over all children
        except BaseException:  # Ctrl-C: take the stage down with us
            _kill_group(proc.pid)
            proc.wait()
            raise
        finally:
            timer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
    record.update(exit_status=proc.returncode, timed_out=timed_out.is_set(), wall_s=round(wall, 4), rusage=_rusage(ru))
    record["device"] = sampler.stop()
    record.update(_telemetry(stdout))
    record["outputs"] = [verify_output(p) for p in stage.outputs]
    reason = None
    if timed_out.is_set():
        reason = f"timed out after {stage.timeout_s:g} s (killed)"
    elif proc.returncode < 0:
        reason = f"killed by signal {signal.Signals(-proc.returncode).name} (exit status {proc.returncode})"
    elif proc.returncode != 0:
        reason = f"exit status {proc.returncode}"
    else:
        bad = [o for o in record["outputs"] if not o["ok"]]
        if bad:
            reason = "; ".join(f"output {o['path']}: {o['detail']}" for o in bad)
    record["status"] = "ok" if reason is None else "failed"
    if reason is not None:
        record["reason"] = reason
        record["stderr_tail"] = _tail(stderr)
    return record


def run_recipe(
    recipe: Recipe,
    *,
    repeat: int = 1,
    roles: Collection[str] = ROLES,
    drop_cache: bool = False,
    on_stage: Callable[[dict[str, Any]], None] | None = None,
) -> BenchResult:
    """Run `recipe` `repeat` times: setup stages in the first round only, measured and reference stages in
    every round, each after its dependencies. A failed stage marks its dependents "not run" and ends the
    benchmark after that round. Stages whose role is not in `roles` are "skipped"."""
    if repeat < 1:
        raise DifError(f"--repeat must be at least 1, got {repeat}")
    recipe.workdir.mkdir(parents=True, exist_ok=True)
    result = BenchResult(recipe=recipe, repeat=repeat)
    status: dict[str, str] = {}
    for round_index in range(repeat):
        records: list[dict[str, Any]] = []
        for stage in recipe.stages:
            if stage.role == "setup" and round_index > 0:
                continue  # done once; its status from the first round stands
            blocked = [d for d in stage.depends_on if status.get(d) != "ok"]
            if stage.role not in roles:
                record: dict[str, Any] = {"status": "skipped", "reason": f"role '{stage.role}' not selected"}
            elif blocked:
                record = {"status": "not run", "reason": f"depends on {', '.join(blocked)} ({status[blocked[0]]})"}
            else:
                record = run_stage(stage, recipe.workdir, round_index, drop_cache=drop_cache)
            record = {"name": stage.name, "role": stage.role, "round": round_index, **record}
            status[stage.name] = record["status"]
            if record["status"] == "failed":
                result.failures.append(
                    {k: record.get(k) for k in ("name", "round", "reason", "exit_status", "stderr_tail", "stderr")}
                )
            records.append(record)
            if on_stage is not None:
                on_stage(record)
        result.rounds.append(records)
        if result.failures:
            break
    return result


def _chain(recipe: Recipe, rounds: Sequence[Sequence[dict[str, Any]]], role: str) -> dict[str, Any] | None:
    names = [s.name for s in recipe.stages if s.role == role]
    if not names:
        return None
    walls = []
    for records in rounds:
        mine = [r for r in records if r["role"] == role]
        if len(mine) == len(names) and all(r["status"] == "ok" for r in mine):
            walls.append(round(sum(r["wall_s"] for r in mine), 4))
    out: dict[str, Any] = {"stages": names, "walls_s": walls}
    if walls:
        out.update(median_s=round(statistics.median(walls), 4), min_s=min(walls), max_s=max(walls))
    return out


def summarize(recipe: Recipe, rounds: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """Medians of the measured and reference chains over the complete rounds, and measured / reference."""
    measured = _chain(recipe, rounds, "measured")
    reference = _chain(recipe, rounds, "reference")
    summary: dict[str, Any] = {"measured": measured, "reference": reference, "ratio": None}
    if measured and reference and "median_s" in measured and "median_s" in reference and reference["median_s"] > 0:
        summary["ratio"] = round(measured["median_s"] / reference["median_s"], 4)
    else:
        summary["ratio_reason"] = (
            "the recipe has no reference stage" if reference is None else "no complete measured and reference round"
        )
    return summary

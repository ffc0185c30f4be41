"""`dif bench RECIPE.json`: run a benchmark recipe's stages as fresh processes and report what the user waits.

The recipe model, its checks and the runner live in `dif.bench`; this module is the command line: options,
progress on stderr, the table or the dif-telemetry/1 document (kind "bench"), and DIR/bench.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from dif_tools.output import human_bytes, table


def _vars(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--var")
        out[key] = value
    return out


def _cache(record: dict[str, Any]) -> str:
    r = record.get("residency") or {}
    return f"{r['class']} {r['resident_fraction']:.0%}" if r.get("measured") else "-"


def _device(record: dict[str, Any]) -> str:
    d = record.get("device") or {}
    if not d.get("measured"):
        return "-"
    parts = []
    for dev in d["devices"]:
        mem = dev["process_memory_peak_bytes"] or dev["memory_peak_increase_bytes"]
        watts = f" {dev['power_peak_w']:.0f} W" if dev["power_peak_w"] is not None else ""
        parts.append(f"{human_bytes(mem)}{watts}")
    return ", ".join(parts)


def _row(record: dict[str, Any]) -> list[Any]:
    ru = record.get("rusage") or {}
    wall = record.get("wall_s")
    status = record["status"] if record["status"] == "ok" else f"{record['status']}: {record.get('reason', '')}"
    return [
        record["round"],
        record["name"],
        record["role"],
        f"{wall:.3f}" if wall is not None else "-",
        f"{ru['user_s']:.2f}/{ru['sys_s']:.2f}" if ru else "-",
        human_bytes(ru["max_rss_bytes"]) if ru else "-",
        ru.get("major_faults", "-") if ru else "-",
        _cache(record),
        _device(record),
        status[:80],
    ]


def _summary_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    for role in ("measured", "reference"):
        chain = summary.get(role)
        if chain is None:
            continue
        walls = ", ".join(f"{w:.3f}" for w in chain["walls_s"]) or "none complete"
        median = f"{chain['median_s']:.3f} s" if "median_s" in chain else "-"
        lines.append(f"{role}: median {median} over rounds [{walls}] ({' + '.join(chain['stages'])})")
    ratio = summary.get("ratio")
    lines.append(
        f"measured / reference: {ratio:.3f}" if ratio is not None else f"ratio: - ({summary.get('ratio_reason')})"
    )
    return lines


@click.command("bench")
@click.argument("recipe_path", metavar="RECIPE.json", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--workdir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the stages' outputs, logs and bench.json (made if absent; it is each stage's cwd).",
)
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(min=1), help="Rounds to take medians over.")
@click.option("--no-reference", is_flag=True, help="Skip the reference stages (no diffusers run).")
@click.option(
    "--drop-cache",
    is_flag=True,
    help="Before each measured/reference stage, ask the kernel to drop its model files' cached pages "
    "(posix_fadvise DONTNEED, best effort; the residency record says what it achieved).",
)
@click.option("--var", "var_items", multiple=True, metavar="KEY=VALUE", help="Override one of the recipe's vars.")
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def bench(
    recipe_path: Path,
    workdir: Path,
    repeat: int,
    no_reference: bool,
    drop_cache: bool,
    var_items: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run RECIPE.json's stages as fresh processes, each timed from the outside, and report the total wall of
    the measured chain (median over --repeat rounds) beside the reference chain. Exit status 1 when the recipe
    is invalid or any stage fails (the failing stage, its exit status and stderr tail are reported)."""
    from dif.bench import load_recipe, run_recipe
    from dif.serialize.container import write_atomic
    from dif.telemetry import build_document, dumps

    recipe = load_recipe(recipe_path, workdir, overrides=_vars(var_items))
    roles = ("setup", "measured") if no_reference else ("setup", "measured", "reference")

    def progress(record: dict[str, Any]) -> None:
        wall = f" {record['wall_s']:.3f} s" if record.get("wall_s") is not None else ""
        reason = f" ({record['reason']})" if record.get("reason") else ""
        click.echo(f"[round {record['round']}] {record['name']}: {record['status']}{wall}{reason}", err=True)

    result = run_recipe(recipe, repeat=repeat, roles=roles, drop_cache=drop_cache, on_stage=progress)
    doc = build_document("bench", tool="dif bench", data=result.to_data(), events=result.events())
    write_atomic(recipe.workdir / "bench.json", (dumps(doc) + "\n").encode())
    if as_json:
        click.echo(dumps(doc))
    else:
        headers = ["round", "stage", "role", "wall s", "cpu u/s", "max rss", "majflt", "cache", "device", "status"]
        click.echo(table(headers, [_row(r) for records in result.rounds for r in records]))
        click.echo("\n".join(_summary_lines(doc["data"]["summary"])))
        click.echo(f"wrote {recipe.workdir / 'bench.json'}")
    for failure in result.failures:
        tail = (failure.get("stderr_tail") or "").strip()
        click.echo(
            f"dif bench: stage '{failure['name']}' failed in round {failure['round']}: {failure['reason']}"
            f" (stderr: {failure['stderr']})" + (f"\n--- stderr tail ---\n{tail}" if tail else ""),
            err=True,
        )
    if not result.ok:
        raise SystemExit(1)

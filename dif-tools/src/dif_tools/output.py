"""Shared output helpers for `dif` subcommands: the telemetry document for --json, plain tables otherwise.

Results go to stdout; nothing else is printed there when --json is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from dif.telemetry import EventLog, build_document, dumps


def emit_document(
    kind: str,
    data: Mapping[str, Any],
    *,
    hardware: Sequence[Mapping[str, Any]] = (),
    runtime_budget: Mapping[str, Any] | None = None,
    events: EventLog | Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Print the `dif-telemetry/1` document for this command on stdout and return it."""
    ctx = click.get_current_context(silent=True)
    tool = ctx.command_path if ctx is not None else "dif"
    doc = build_document(kind, tool=tool, data=data, hardware=hardware, runtime_budget=runtime_budget, events=events)
    click.echo(dumps(doc))
    return doc


def human_bytes(n: int | float) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left-aligned plain-text table."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)

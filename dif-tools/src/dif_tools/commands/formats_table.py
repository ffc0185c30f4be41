"""`dif formats-table`: every physical format judged against a backend's TargetProfile."""

from __future__ import annotations

import click

from dif_tools.output import emit_document, table


@click.command("formats-table")
@click.option(
    "--backend", "backend_name", default=None, help="Backend to judge against (default: every available one)."
)
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def formats_table(backend_name: str | None, as_json: bool) -> None:
    """Legality (from the probed TargetProfile), usage and execution of every physical format: whether the
    backend executes it (its code exists and the target has the units), emulates it (its ops run, but the
    target lacks the matrix units that make it pay) or does not execute it."""
    from dif.formats import formats_table as judge
    from dif.plugins import physical_formats
    from dif.runtime import backend_status, get_backend
    from dif.telemetry import hardware_entry

    physical_formats()  # plugin formats join the core ones
    if backend_name is not None:
        names = [backend_name]
    else:
        names = [info.name for info, avail in backend_status() if avail.ok]
        if not names:
            get_backend(None)  # raises the clear "no backend available" error
    tables, hardware = {}, []
    for name in names:
        profile = get_backend(name).profile()
        hardware.append(hardware_entry(name, profile=profile))
        tables[name] = [v.to_dict() for v in judge(profile)]
    if as_json:
        emit_document("formats-table", {"tables": tables}, hardware=hardware)
        return
    for name, rows in tables.items():
        click.echo(f"backend {name}:")
        click.echo(
            table(
                ("format", "legal", "usage", "executes", "why"),
                [
                    (
                        r["format"],
                        "yes" if r["legal"] else "no",
                        r["usage"],
                        str(r["executes"]).partition(":")[0].partition(" (")[0],  # executed | emulated | not executed
                        r["reason"] if not r["legal"] else r["usage_reason"],
                    )
                    for r in rows
                ],
            )
        )
        click.echo()

"""`dif probe`: static capability (TargetProfile) and current budget (RuntimeBudget) of every backend."""

from __future__ import annotations

import click

from dif_tools.output import emit_document, human_bytes


@click.command("probe")
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def probe(as_json: bool) -> None:
    """Probe every registered backend; unavailable ones are listed with the reason, available ones
    with their availability note when they give one."""
    from dif.runtime import describe_backends

    hardware, budgets = describe_backends()
    if as_json:
        emit_document(
            "probe", {"backends": [h["backend"] for h in hardware]}, hardware=hardware, runtime_budget=budgets
        )
        return
    if not hardware:
        click.echo("no backends registered (see `dif plugins`)")
    for entry in hardware:
        name = entry["backend"]
        if not entry["available"]:
            click.echo(f"{name}: unavailable: {entry['reason']}")
            continue
        p = entry["profile"]
        click.echo(
            f"{name}: {p['device']} ({p['arch'] or 'arch ?'}), {p['compute_units']} compute units, "
            f"{human_bytes(p['memory_bytes'])}, fingerprint {entry['fingerprint']}"
        )
        if entry["reason"]:  # an available backend may still have advice (OpenCL: a hidden NVIDIA ICD)
            click.echo(f"  note: {entry['reason']}")
        click.echo(f"  dtypes: {', '.join(p['dtypes']) or '-'}")
        click.echo(f"  tensor-core formats: {', '.join(p['tensor_core_formats']) or '-'}")
        if p["capabilities"]:
            click.echo(f"  capabilities: {', '.join(p['capabilities'])}")
        if p["libraries"]:
            click.echo(f"  libraries: {', '.join(f'{k} {v}' for k, v in sorted(p['libraries'].items()))}")
        b = budgets.get(name)
        if b is not None:
            click.echo(
                f"  budget: free {human_bytes(b.free_memory_bytes)}, host {human_bytes(b.host_memory_bytes)}, "
                f"pinned staging {human_bytes(b.pinned_staging_bytes)}, workspace {human_bytes(b.workspace_bytes)} "
                f"(class {b.budget_class})"
            )

"""`dif plugins`: what loaded, from which distribution, which hooks, what it registered, what failed."""

from __future__ import annotations

import click

from dif_tools.output import emit_document


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def plugins(as_json: bool) -> None:
    """List installed plugins (entry-point group "dif"), their hooks, registrations and errors.

    DIF_LOAD_PLUGINS=a,b limits loading to those entry-point names; an empty value loads none.
    """
    from dif.plugins import load_plugins, plugin_records, registrations

    load_plugins()
    regs = registrations()  # runs every collector, so duplicate names are reported below
    root = click.get_current_context().find_root().command
    if hasattr(root, "add_plugin_commands"):
        root.add_plugin_commands()  # so errors raised by register_commands are reported too
    entries = [{**r.to_dict(), "registers": regs.get(r.name, {})} for r in plugin_records()]
    if as_json:
        emit_document("plugins", {"plugins": entries})
        return
    if not entries:
        click.echo("no plugins loaded (install dif-backend-cpu, or check DIF_LOAD_PLUGINS)")
    for e in entries:
        where = f"{e['distribution']} {e['version']}".strip() or e["source"]
        click.echo(f"{e['name']}  ({where})")
        click.echo(f"  hooks: {', '.join(e['hooks']) or '-'}")
        for kind, names in e["registers"].items():
            click.echo(f"  {kind}: {', '.join(names)}")
        if e["error"]:
            click.echo(f"  ERROR: {e['error']}")

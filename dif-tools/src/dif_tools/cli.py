"""The `dif` command: a click group whose built-in subcommands are imported only when invoked,
plus whatever plugins add through the `register_commands(cli)` hook.

A `DifError` anywhere below ends the command with one line on stderr and exit status 1; Ctrl-C ends it
with status 130; a `DifWarning` prints one `warning: ...` line on stderr.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import click

import dif
from dif.errors import DifError, DifWarning, PluginError

# name -> (module, attribute, one-line summary shown by `dif --help` without importing the module)
BUILTINS: dict[str, tuple[str, str, str]] = {
    "bench": ("dif_tools.commands.bench", "bench", "Time a recipe's stages as fresh processes: prompt to saved file."),
    "formats-table": (
        "dif_tools.commands.formats_table",
        "formats_table",
        "Physical formats: legality and usage per backend.",
    ),
    "opt": ("dif_tools.commands.opt", "opt", "Optimizer searches: physical formats measured through the gate."),
    "inspect": ("dif_tools.commands.inspect", "inspect", "Summarise a .difir program: ops, types, params, provenance."),
    "plugins": ("dif_tools.commands.plugins", "plugins", "List plugins, their hooks, registrations and errors."),
    "probe": ("dif_tools.commands.probe", "probe", "TargetProfile and RuntimeBudget of every backend."),
    "run": ("dif_tools.commands.run", "run", "Run a .difir program on inputs from a safetensors file."),
    "serve": ("dif_tools.commands.serve", "serve", "An OpenAI-style HTTP image endpoint over one warm pipeline."),
    "batch": ("dif_tools.commands.batch", "batch", "Generate a JSONL file of prompts across Ray workers."),
    "weights": ("dif_tools.commands.weights", "weights", "Checkpoint tensors: per-tensor statistics, NaN / inf."),
    "trace": ("dif_tools.commands.trace", "trace", "Attribute execution time to ops, kinds, blocks and stages."),
    "plan": ("dif_tools.commands.plan", "plan", "A .difplan's recorded decisions: show, diff, residency, explain."),
    "bisect": ("dif_tools.commands.bisect", "bisect", "First divergence between dif's captures and an oracle."),
    "quality": ("dif_tools.commands.quality", "quality", "Image / audio / video sanity, metrics and verdict."),
    "regress": ("dif_tools.commands.regress", "regress", "Correctness and performance regression suites."),
    "tune": ("dif_tools.commands.tune", "tune", "A backend's candidates per GEMM / attention / conv problem."),
    "train": ("dif_tools.commands.train", "train", "Train through dif's programs: LoRA adapters (dif train lora)."),
}


def one_line(exc: BaseException) -> str:
    """An error message folded onto one line (hints included)."""
    return " ".join(part.strip() for part in str(exc).splitlines() if part.strip()) or type(exc).__name__


class DifGroup(click.Group):
    """Lazy built-ins, plugin commands added on first listing/lookup, DifError -> one-line exit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plugins_added = False

    def add_plugin_commands(self) -> None:
        """Ask every plugin's `register_commands` hook once (errors are recorded by dif.plugins)."""
        if not self._plugins_added:
            self._plugins_added = True
            from dif.plugins import add_commands

            add_commands(self)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        name = name or cmd.name
        if name in BUILTINS and not getattr(cmd, "_dif_builtin", False):
            raise PluginError(f"command '{name}' is built into dif and cannot be replaced by a plugin")
        super().add_command(cmd, name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.add_plugin_commands()
        return sorted(set(BUILTINS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in BUILTINS and cmd_name not in self.commands:
            module, attr, _ = BUILTINS[cmd_name]
            cmd = getattr(importlib.import_module(module), attr)
            cmd._dif_builtin = True
            self.add_command(cmd, cmd_name)
        if cmd_name not in self.commands:
            self.add_plugin_commands()
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in BUILTINS:
                rows.append((name, BUILTINS[name][2]))
            else:
                rows.append((name, self.commands[name].get_short_help_str(formatter.width - 20)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("always", DifWarning)
            warnings.showwarning = _show_warning
            try:
                return super().invoke(ctx)
            except DifError as exc:
                raise click.ClickException(one_line(exc)) from None
            except KeyboardInterrupt as exc:
                # the shell convention for SIGINT; files are written by rename, so none is left half-way
                what = " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand)))
                where = f" {exc}" if str(exc) else ""  # a command may say where it was ("in the denoise stage")
                click.echo(f"\n{what}: interrupted{where}", err=True)
                raise click.exceptions.Exit(130) from None


def _show_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None
) -> None:
    """dif's warnings as one `warning: ...` line on stderr; others as Python prints them."""
    if issubclass(category, DifWarning):
        click.echo(f"warning: {one_line(Exception(str(message)))}", err=True)
    else:
        click.echo(warnings.formatwarning(message, category, filename, lineno, line).rstrip(), err=True)


def build_cli() -> DifGroup:
    """A fresh root group (the module-level `cli` is one; tests build their own)."""

    @click.group(cls=DifGroup, name="dif", context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(dif.__version__, prog_name="dif")
    def root() -> None:
        """dif: a diffusion compiler. DiffIR programs, planned and run on pluggable backends.

        Every command takes --json and then prints one dif-telemetry/1 document on stdout.
        Errors print one line on stderr and exit 1 (2 for command-line usage errors).
        """

    assert isinstance(root, DifGroup)
    return root


cli = build_cli()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (`dif`)."""
    cli.main(args=argv, prog_name="dif")

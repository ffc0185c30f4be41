"""How `dif` ends when interrupted or warned: Ctrl-C (SIGINT) exits 130 naming what was interrupted, and
a `DifWarning` is one `warning: ...` line on stderr."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import warnings

import click
from click.testing import CliRunner

from dif.errors import DifWarning
from dif_tools.cli import build_cli


def test_sigint_exits_130_naming_the_command() -> None:
    script = textwrap.dedent(
        """
        import sys, time, click
        from dif_tools.cli import build_cli
        cli = build_cli()

        @cli.command("wait")
        def wait():
            print("ready", flush=True)
            time.sleep(60)

        cli.main(args=["wait"], prog_name="dif")
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "dif wait: interrupted" in err
    assert "Traceback" not in err


def test_dif_warning_is_one_line_on_stderr() -> None:
    cli = build_cli()

    @cli.command("warns")
    def warns() -> None:
        warnings.warn("cache entry /x is truncated;\nrebuilding it", DifWarning, stacklevel=1)
        click.echo("done")

    result = CliRunner().invoke(cli, ["warns"], catch_exceptions=False)
    assert result.exit_code == 0
    assert result.stdout == "done\n"
    assert result.stderr.strip() == "warning: cache entry /x is truncated; rebuilding it"

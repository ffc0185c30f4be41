"""Where a fresh `dif` process spends the seconds outside its own timer (issue 13's wall vs dif's total_s).

Runs `python -c WRAPPER dif-args...` several times; the wrapper stamps the wall clock after interpreter start
(site included), after importing the CLI, and when `main` returns; this process stamps the spawn and the
reap. So: start_s (exec, interpreter, site), import_s (dif_tools.cli), main_s (the command: its own
--json total_s is inside), exit_s (interpreter finalization and the driver's teardown of the process).
  python perf/boundary_phases.py --repeat 3 --out phases.json -- flux2 generate -m DIR -p "..." --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time

WRAPPER = """
import json, sys, time
start = time.time()
from dif_tools.cli import main
imported = time.time()
code = 0
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
stamps = {"start": start, "imported": imported, "done": time.time(), "code": code}
sys.stderr.write("\\nPHASES " + json.dumps(stamps) + "\\n")
"""


def one_run(args: list[str]) -> dict[str, float]:
    spawn = time.time()
    done = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, check=False)
    reaped = time.time()
    stamps = next((json.loads(line[7:]) for line in done.stderr.splitlines() if line.startswith("PHASES ")), None)
    if stamps is None or done.returncode != 0:
        raise SystemExit(f"run failed (exit {done.returncode}): {done.stderr[-2000:]}")
    run = {
        "wall_s": reaped - spawn,
        "start_s": stamps["start"] - spawn,
        "import_s": stamps["imported"] - stamps["start"],
        "main_s": stamps["done"] - stamps["imported"],
        "exit_s": reaped - stamps["done"],
    }
    with contextlib.suppress(ValueError, KeyError, TypeError):  # a --json command: its own timer's total
        run["dif_total_s"] = float(json.loads(done.stdout)["data"]["total_s"])
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    runs = [one_run(args) for _ in range(opts.repeat)]
    summary = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    doc = {"argv": args, "runs": runs, "median": summary}
    print(json.dumps({k: round(v, 3) for k, v in summary.items()}))
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()

"""`dif serve` under a bounded load: 200 requests, 8 at a time, against a `dif serve` subprocess on loopback.

    python perf/serve_load.py [--requests 200] [--concurrency 8] [--size 64x64] [--backend cpu] [--out FILE]

Starts `dif serve --port 0 --json` (the embedded tiny FLUX.2 klein unless --model), reads its URL from the
document it prints, runs `dif_tools.serve.load.run_load` (every image fetched and decoded), and writes the
report (errors, p50/p90/p99 latency, throughput, the machine) to perf/results/serve_load_<backend>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dif_tools.serve.load import run_load


def read_document(stream: Any) -> dict[str, Any]:
    """The first JSON document `dif serve --json` prints (indented: read until it parses)."""
    text = ""
    for line in stream:
        text += line
        try:
            return json.loads(text)  # type: ignore[no-any-return]
        except json.JSONDecodeError:
            continue
    raise SystemExit(f"dif serve ended before printing its document: {text!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--size", default="64x64")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", default=None)
    ap.add_argument("--format", default="b64_json", choices=("b64_json", "url"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cmd = ["dif", "serve", "--port", "0", "--json", "--backend", args.backend, "--queue", str(4 * args.concurrency)]
    if args.model:
        cmd += ["--model", args.model]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        doc = read_document(proc.stdout)
        ready_s = time.perf_counter() - started
        url = doc["data"]["url"]
        body = {"prompt": "a red fox in the snow", "size": args.size, "response_format": args.format}
        if args.steps is not None:
            body["steps"] = args.steps
        report = run_load(url, body, requests=args.requests, concurrency=args.concurrency)
    finally:
        proc.terminate()
        proc.wait(30)
    report |= {
        "tool": "perf/serve_load.py",
        "command": " ".join(cmd),
        "model": doc["data"]["model"],
        "backend": args.backend,
        "server_ready_s": round(ready_s, 2),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = args.out or Path(__file__).parent / "results" / f"serve_load_{args.backend}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)
    lat = report["latency_s"]
    print(f"{report['requests']} requests, {report['errors']} errors, {report['images_decoded']} images decoded; "
          f"p50 {lat['p50']} s, p99 {lat['p99']} s, {report['throughput_rps']} req/s -> {out}")  # fmt: skip
    sys.exit(1 if report["errors"] or report["images_decoded"] != report["requests"] else 0)


if __name__ == "__main__":
    main()

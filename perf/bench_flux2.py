"""Former FLUX.2-only benchmark, now an alias of perf/bench_denoiser.py (same options; --models
defaults to klein-4b and still accepts 4b / 9b). Results go to perf/results/bench_<model>.json.

    python3 perf/bench_flux2.py --models 4b,9b --compile
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_denoiser import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(default_models="klein-4b"))

# Sourced by the GPU-machine scripts of perf/: the environment every one of them needs, from a bare machine.
#   - runs HEAD, not the working tree, so unfinished edits cannot leak in: with device-overlay.tgz
#     (perf/device_overlay.sh) a copy of the tree is turned back into HEAD, with device-snapshot.tgz (a
#     `git archive` of HEAD) that is unpacked;
#   - installs the carried wheels (.whl/) into /tmp/site, puts every distribution's src/ on PYTHONPATH and
#     makes their `dif` entry points visible (nothing of dif is pip-installed there);
#   - lets Python write bytecode, as an installed machine has it: this machine sets PYTHONDONTWRITEBYTECODE=1
#     and its Python ships part of the stdlib (and the torch venv) without .pyc files, so every fresh process
#     compiled ~270 modules again (1.0 s of 'builtins.compile' in the stop-13 profile, after a compileall of
#     the snapshot and the wheels and a pass over a list of imported modules). With a writable
#     PYTHONPYCACHEPREFIX the first process writes whatever it imports and later ones only read; the
#     snapshot and the wheels are compiled into it up front, as pip does at install.
# After it: $OUT exists, `stamp MESSAGE` prints the elapsed seconds, `gpu_tests NAME LABEL SECONDS PYTEST_ARGS...`
# runs pytest into $OUT/pytest_NAME.log and $OUT/NAME_tests.json, `forward_step MODEL [FORMATS]` times one forward into
# $OUT/step_MODEL.json, `pipeline_9b SECONDS [FORMATS]` the klein 9B pipeline into $OUT/pipeline_klein-9b.json, the working
# directory is the snapshot.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_out}
mkdir -p "$OUT"
T0=$SECONDS
stamp() { echo "== $((SECONDS - T0)) s: $*"; }
gpu_tests() {  # NAME LABEL SECONDS PYTEST_ARGS...: the tests' log, rc, failures, and their JUnit summary as JSON
  local name=$1 label=$2 limit=$3
  shift 3
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider "$@" --junitxml="/tmp/junit_$name.xml" \
    >"$OUT/pytest_$name.log" 2>&1
  echo "pytest rc=$?"
  tail -2 "$OUT/pytest_$name.log"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_$name.log" | head -10
  python3 perf/junit_summary.py "/tmp/junit_$name.xml" "$OUT/${name}_tests.json" --label "$label" >/dev/null 2>&1
}
forward_step() {  # MODEL [FORMATS]: one forward at 1024^2, bf16 and FORMATS (default fp8-e4m3; perf/formats_h200.py),
  # its time by op printed
  stamp "$1 one forward"
  timeout 200 python3 perf/formats_h200.py --phase step --models "$1" --formats "${2:-fp8-e4m3}" --iters 10 2>&1 | tail -4
  python3 -c "
import json; d = json.load(open('$OUT/step_$1.json'))['formats']
for f, r in d.items(): print(f, 'by op', dict(list(r.get('by_op', {}).items())[:10]))
" 2>&1 | cut -c1-800
}
pipeline_9b() {  # SECONDS [FORMATS]: klein 9B prompt -> PNG, 4 steps, 1024^2, bf16 and FORMATS (default fp8-e4m3)
  # with the gate; its stages
  stamp "klein 9B prompt -> PNG"
  timeout "$1" python3 perf/formats_h200.py --phase pipeline --models klein-9b --formats "${2:-fp8-e4m3}" --runs 3 \
    2>&1 | tail -3
  python3 -c "
import json; d = json.load(open('$OUT/pipeline_klein-9b.json'))['formats']
for f, r in d.items(): print(f, r.get('stages_s'), r.get('forward_ms'))
" 2>&1 | cut -c1-600
  rm -f "$OUT"/*.jpg  # at most 8 files come back: the side-by-side images stay on the machine
}
[ -n "${DIF_H200_ENV:-}" ] && return 0  # a calling script of perf/ has set the machine up already
export DIF_H200_ENV=1
if [ -f device-overlay.tgz ]; then  # perf/device_overlay.sh: this copy of the working tree turned back into HEAD
  rm -rf /tmp/snap && mkdir -p /tmp/snap && cp -a . /tmp/snap/ && cd /tmp/snap || exit 1
  tar -xzf device-overlay.tgz && xargs -r -d '\n' rm -f < device-untracked.txt && rm -f device-overlay.tgz
elif [ -f device-snapshot.tgz ]; then
  rm -rf /tmp/snap && mkdir -p /tmp/snap && tar -xzf device-snapshot.tgz -C /tmp/snap && cp -r .whl /tmp/snap/
  cd /tmp/snap || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
SRC=$(for d in "$PWD"/*/src; do printf '%s:' "$d"; done)
export PYTHONPATH=/tmp/site:${SRC}$PWD/perf:/tmp/dif_entry_points
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
python3 -m compileall -q -j 0 . /tmp/site >/dev/null 2>&1; echo "compileall rc=$?"
# the stdlib and torch-venv modules a generate process imports get their .pyc now, as a normal machine has them
python3 -c "import dif_tools.cli, dif.image_pipeline, dif_frontend_flux2.pipeline, dif_backend_cuda.device, \
cupy, nvmath, cudnn, tokenizers, PIL.PngImagePlugin, concurrent.futures.thread" || echo "warm-up import failed"
python3 -c "from pathlib import Path; from pipeline_wall import ensure_entry_points; \
print('entry points', ensure_entry_points(Path.cwd(), Path('/tmp/dif_entry_points')))"

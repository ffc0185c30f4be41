# Sourced by the GPU-machine scripts of perf/: the environment every one of them needs, from a bare machine.
#   - runs HEAD, not the working tree, so unfinished edits cannot leak in: with device-overlay.tgz
#     (perf/device_overlay.sh) a copy of the tree is turned back into HEAD, with device-snapshot.tgz (a
#     `git archive` of HEAD) that is unpacked;
#   - installs the carried wheels (.whl/) into /tmp/site, puts every distribution's src/ on PYTHONPATH and
#     makes their `dif` entry points visible (nothing of dif is pip-installed there);
#   - byte-compiles what a fresh `dif` process imports, as an installed machine has it: the snapshot, the
#     wheels, and any imported module whose .pyc is missing (this machine sets PYTHONDONTWRITEBYTECODE=1 and
#     its system Python ships part of the stdlib without .pyc files; compiling them on every run cost a
#     fresh process about 1 s of 'builtins.compile' in the stop-12 profile).
# After it: $OUT exists, `stamp MESSAGE` prints the elapsed seconds, the working directory is the snapshot.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_out}
mkdir -p "$OUT"
T0=$SECONDS
stamp() { echo "== $((SECONDS - T0)) s: $*"; }
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
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
python3 -m compileall -q -j 0 . /tmp/site >/dev/null 2>&1; echo "compileall rc=$?"
python3 -c "from pathlib import Path; from pipeline_wall import ensure_entry_points; \
print('entry points', ensure_entry_points(Path.cwd(), Path('/tmp/dif_entry_points')))"
python3 - <<'PY'
# Modules a dif generate process imports whose bytecode cache is missing: compile them (where writable).
import importlib, importlib.util, os, py_compile, sys
for name in ("dif_tools.cli", "dif.image_pipeline", "dif_frontend_flux2.pipeline", "dif_backend_cuda.device",
             "PIL.PngImagePlugin", "tokenizers", "concurrent.futures.thread", "json", "click"):
    try:
        importlib.import_module(name)
    except Exception as exc:  # a missing optional part must not stop the machine's set-up
        print(f"pyc check: {name} does not import ({exc})")
missing, fixed = [], 0
for mod in list(sys.modules.values()):
    src = getattr(mod, "__file__", None)
    if not src or not src.endswith(".py"):
        continue
    cached = importlib.util.cache_from_source(src)
    if os.path.exists(cached):
        continue
    missing.append(src)
    try:
        py_compile.compile(src, cfile=cached, doraise=True)
        fixed += 1
    except Exception:
        pass
roots = sorted({os.path.dirname(p).split("/site-packages/")[0] for p in missing})
print(f"pyc check: {len(missing)} imported modules had no .pyc, compiled {fixed}; under {roots[:6]}")
PY

#!/usr/bin/env bash
# Installs every dif distribution (editable), and for tests their test dependencies. Idempotent: run it
# again after pulling. Any failure stops it with a non-zero status. Two ways to use it:
#
#   ./install.sh --venv runtime   make .venv (first use) with the distributions: what ./dif runs
#   ./install.sh --venv test      the same plus the test dependencies: what ./dif-test runs
#       .venv is made from the newest python3.11+ on PATH (PYTHON=/path/to/python to pick one). A stamp in
#       .venv records what was installed, keyed by the pyproject files, this script and the clone's path,
#       so a pull that changes any of them installs again and an unchanged tree costs one hash.
#       All messages go to stderr (a `--json` run of ./dif keeps stdout for its document).
#
#   ./install.sh                  everything, with the test dependencies, into the current Python
#       (PYTHON=/path/to/python ./install.sh to pick an interpreter); no venv, no stamp.
set -euo pipefail
cd "$(dirname "$0")"

DISTRIBUTIONS=(
  dif-core
  dif-backend-cpu
  dif-backend-cuda
  dif-backend-opencl
  dif-frontend-flux2
  dif-frontend-krea2
  dif-frontend-sdturbo
  dif-frontend-h3
  dif-tools
)
# Pinned: torch 2.13.0 is the CPU wheel on this machine's disk; an unpinned torch pulls a CUDA build (3 GB).
TEST_DEPS=(
  "torch==2.13.0"
  "diffusers==0.42.1"
  "transformers==5.24.0"
  accelerate  # diffusers needs it to load models with fp32-pinned modules (Krea 2 oracle)
  "peft==0.21.2"  # diffusers' load_lora_weights needs it (LoRA oracle tests)
  gguf  # the reference GGUF reader / writer / dequantizer of the GGUF tests
  scipy  # diffusers' beta sigmas need it (the sampler and Krea 2 seed oracle tests)
  tokenizers
  pyopencl
  pocl-binary-distribution
  intel-opencl-rt  # Intel's CPU OpenCL runtime: builds kernels on CPUs PoCL's LLVM 14 cannot target (Zen 5)
  intel-cmplr-lib-rt  # its libimf / libsvml, which its wheel does not depend on
  pillow
  av  # PyAV: dif quality decodes MP4 frames and audio with it (its tests make MP4s)
  jsonschema  # tests check tools' documents against docs/telemetry.schema.json
  httpx  # the dif serve tests and perf/serve_load.py talk HTTP through it
  ray  # dif batch schedules on Ray; its tests start a local cluster
  pytest
  hypothesis
  ruff
  mypy
)
MODULES="dif dif_backend_cpu dif_backend_cuda dif_backend_opencl dif_frontend_flux2 dif_frontend_krea2 dif_frontend_sdturbo dif_frontend_h3 dif_tools"
VENV=.venv

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*" >&2; }

new_enough() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1; }

find_python() {
  # PYTHON wins when set; otherwise the newest python3.x >= 3.11 on PATH, then python3 / python.
  if [[ -n "${PYTHON:-}" ]]; then
    new_enough "$PYTHON" || die "PYTHON=$PYTHON is not a runnable Python 3.11 or newer"
    echo "$PYTHON"; return
  fi
  local candidate
  for candidate in python3.14 python3.13 python3.12 python3.11 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && new_enough "$candidate"; then echo "$candidate"; return; fi
  done
  die "no Python 3.11 or newer on PATH (tried python3.14 ... python3.11, python3, python); install one, or set PYTHON=/path/to/python3.11"
}

pip_install() {  # pip_install PYTHON ARGS...: one resolver run, so nothing can drag in a different torch than the pinned one
  local python=$1; shift
  "$python" -m pip install --disable-pip-version-check --progress-bar off "$@"
}

EDITABLES=()
for dist in "${DISTRIBUTIONS[@]}"; do
  [[ -f "$dist/pyproject.toml" ]] || die "$dist/pyproject.toml is missing (every distribution folder needs one)"
  EDITABLES+=(-e "./$dist")
done

check_imports() {  # check_imports PYTHON WANT_TORCH
  "$1" - "$2" $MODULES <<'PY' || die "the installed environment is not usable (see above)"
import importlib
import importlib.metadata as md
import sys

want_torch, modules = sys.argv[1] == "1", sys.argv[2:]
for name in modules:
    importlib.import_module(name)
note = ""
if want_torch:
    torch = md.version("torch")
    assert torch.startswith("2.13.0"), f"torch {torch} is installed, expected 2.13.0 (the CPU wheel)"
    note = f"; torch {torch}"
print(f"install.sh: ok ({len(modules)} packages import{note})", file=sys.stderr)
PY
}

stamp_key() {  # what an install depends on: every pyproject, this script, the clone's path, the level
  "$1" - "$2" "$PWD" <<'PY'
import hashlib
import sys
from pathlib import Path

digest = hashlib.sha256("\0".join(sys.argv[1:]).encode())
for path in sorted(Path(".").glob("dif-*/pyproject.toml")) + [Path("install.sh")]:
    digest.update(str(path).encode() + b"\0" + path.read_bytes())
print(digest.hexdigest())
PY
}

installed() {  # installed LEVEL: .venv runs and its stamp says LEVEL (or test, which covers runtime) is current
  local have
  [[ -x "$VENV/bin/python" ]] && new_enough "$VENV/bin/python" || return 1
  for have in "$1" test; do
    [[ -f "$VENV/.dif-installed-$have" ]] || continue
    [[ "$(cat "$VENV/.dif-installed-$have")" == "$(stamp_key "$VENV/bin/python" "$have")" ]] && return 0
  done
  return 1
}

ensure_venv() {  # ensure_venv runtime|test
  local level=$1 python
  [[ "$level" == runtime || "$level" == test ]] || die "--venv takes 'runtime' or 'test', not '$level'"
  installed "$level" && return 0
  if command -v flock >/dev/null 2>&1; then
    # Two first calls at once (./dif and ./dif-test in two shells) take turns; the second finds the work done.
    exec 9>"$VENV.lock"
    flock 9 || die "could not lock $VENV.lock"
    installed "$level" && return 0
  fi
  if ! { [[ -x "$VENV/bin/python" ]] && new_enough "$VENV/bin/python"; }; then
    python=$(find_python)
    say "creating $VENV with $python ($("$python" --version 2>&1)); once per clone"
    "$python" -m venv --clear "$VENV" \
      || die "'$python -m venv' failed; on Debian/Ubuntu install python3-venv (apt-get install python3-venv)"
  fi
  rm -f "$VENV/.dif-installed-runtime" "$VENV/.dif-installed-test"
  local packages=("${EDITABLES[@]}")
  if [[ "$level" == test ]]; then
    packages+=("${TEST_DEPS[@]}")
    say "installing ${#DISTRIBUTIONS[@]} distributions (editable) and the test dependencies into $VENV (minutes the first time)"
  else
    say "installing ${#DISTRIBUTIONS[@]} distributions (editable) into $VENV (a minute the first time)"
  fi
  pip_install "$VENV/bin/python" -q "${packages[@]}"
  check_imports "$VENV/bin/python" "$([[ "$level" == test ]] && echo 1 || echo 0)"
  [[ -x "$VENV/bin/dif" ]] || die "$VENV/bin/dif is missing after installing dif-tools"
  stamp_key "$VENV/bin/python" "$level" > "$VENV/.dif-installed-$level"
}

if [[ "${1:-}" == "--venv" ]]; then
  [[ $# -eq 2 ]] || die "usage: ./install.sh --venv runtime|test"
  exec 1>&2  # pip's output too: stdout belongs to the command the launcher runs next
  ensure_venv "$2"
  exit 0
fi
[[ $# -eq 0 ]] || die "usage: ./install.sh [--venv runtime|test]"

PYTHON="${PYTHON:-python}"
new_enough "$PYTHON" || die "$PYTHON is $("$PYTHON" --version 2>&1); dif needs Python 3.11 or newer"
echo "install.sh: installing ${#DISTRIBUTIONS[@]} distributions (editable) and test dependencies with $PYTHON"
pip_install "$PYTHON" "${TEST_DEPS[@]}" "${EDITABLES[@]}"

# pyenv keeps console scripts behind shims; make the new `dif` visible.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi

check_imports "$PYTHON" 1
command -v dif >/dev/null 2>&1 || die "the 'dif' command is not on PATH after installing dif-tools"
dif --version

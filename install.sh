#!/usr/bin/env bash
# Installs every dif distribution (editable) and the test dependencies into the current Python.
# Idempotent: run it again after pulling. Any failure stops it with a non-zero status.
#
#   ./install.sh            (PYTHON=/path/to/python ./install.sh to pick an interpreter)
set -euo pipefail
cd "$(dirname "$0")"

PYTHON="${PYTHON:-python}"
DISTRIBUTIONS=(
  dif-core
  dif-backend-cpu
  dif-backend-cuda
  dif-backend-opencl
  dif-frontend-flux2
  dif-frontend-krea2
  dif-frontend-h3
  dif-tools
)
# Pinned: torch 2.13.0 is the CPU wheel on this machine's disk; an unpinned torch pulls a CUDA build.
TEST_DEPS=(
  "torch==2.13.0"
  "diffusers==0.42.1"
  "transformers==5.24.0"
  accelerate  # diffusers needs it to load models with fp32-pinned modules (Krea 2 oracle)
  tokenizers
  pyopencl
  pocl-binary-distribution
  pillow
  pytest
  hypothesis
  ruff
  mypy
)

die() { echo "install.sh: $*" >&2; exit 1; }

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || die "$PYTHON is $("$PYTHON" --version 2>&1); dif needs Python 3.11 or newer"

editables=()
for dist in "${DISTRIBUTIONS[@]}"; do
  [[ -f "$dist/pyproject.toml" ]] || die "$dist/pyproject.toml is missing (every distribution folder needs one)"
  editables+=(-e "./$dist")
done

echo "install.sh: installing ${#DISTRIBUTIONS[@]} distributions (editable) and test dependencies with $PYTHON"
# One resolver run, so no package can drag in a different torch than the pinned one.
"$PYTHON" -m pip install --disable-pip-version-check --progress-bar off "${TEST_DEPS[@]}" "${editables[@]}"

# pyenv keeps console scripts behind shims; make the new `dif` visible.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi

"$PYTHON" - <<'PY' || die "the installed environment is not usable (see above)"
import importlib
import importlib.metadata as md

modules = ["dif", "dif_backend_cpu", "dif_backend_cuda", "dif_backend_opencl", "dif_frontend_flux2",
           "dif_frontend_krea2", "dif_frontend_h3", "dif_tools"]
for name in modules:
    importlib.import_module(name)
torch = md.version("torch")
assert torch.startswith("2.13.0"), f"torch {torch} is installed, expected 2.13.0 (the CPU wheel)"
print(f"install.sh: ok ({len(modules)} packages import; torch {torch})")
PY
command -v dif >/dev/null 2>&1 || die "the 'dif' command is not on PATH after installing dif-tools"
dif --version

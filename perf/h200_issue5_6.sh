#!/usr/bin/env bash
# One GPU-machine call for issues 5 and 6 (run from the repo root by the device tool, carry [".whl", ".snap"]):
#   stage 1  pytest dif-backend-cuda/tests (marker cuda) and the OpenCL conformance kit on NVIDIA's
#            platform, side by side (correctness only, nothing timed)
#   stage 2  perf/bench_denoiser.py --models krea2 --compile   (issue 6)
#   stage 3  perf/opencl_vs_cuda.py, klein-4B at 512^2 and 1024^2   (issue 5)
# .snap/ is `git archive HEAD` of the packages' src/ and tests/ (+ pyproject.toml, COMMIT): the code under
# test is a commit, not whatever the working tree holds mid-edit. Every stage is time-boxed; results go to $OUT.
# Make it (repo root):  grep -qx /.snap/ .git/info/exclude || echo /.snap/ >>.git/info/exclude; rm -rf .snap;
#   mkdir .snap && git archive HEAD pyproject.toml dif-core/src dif-backend-cpu/src dif-backend-cuda/src \
#   dif-backend-cuda/tests dif-backend-opencl/src dif-backend-opencl/tests dif-frontend-flux2/src \
#   dif-frontend-krea2/src dif-tools/src | tar -x -C .snap && git rev-parse HEAD >.snap/COMMIT
#   rm -rf .snap/dif-frontend-*/src/*/default   # demo checkpoints, not needed
# Device call:  set -o pipefail; bash perf/h200_issue5_6.sh 2>&1 | tee $OUT/run.log   (timeout_s 540)
# DRY=1 checks the script on a machine without a GPU (CPU backends, PoCL, tiny models, no pip install).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_out}
mkdir -p "$OUT"
T0=$SECONDS
stamp() { echo "== $((SECONDS - T0)) s: $*"; }
S=$PWD/.snap
SRC=$S/dif-core/src:$S/dif-backend-cpu/src:$S/dif-backend-cuda/src:$S/dif-backend-opencl/src
SRC=$SRC:$S/dif-frontend-flux2/src:$S/dif-frontend-krea2/src:$S/dif-tools/src
COMMIT=$(cat "$S/COMMIT")
if [ "${DRY:-0}" = 1 ]; then
  export PYTHONPATH=$SRC
  OCL=(--reference cpu --tiny) BENCH=(--device cpu --tiny) OCLDEV=()
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$SRC
  OCL=(--reference cuda) BENCH=(--device cuda) OCLDEV=(--device NVIDIA)
  mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 >/etc/OpenCL/vendors/nvidia.icd
  if ! python3 -c "import pyopencl as c, sys; sys.exit(not any('NVIDIA' in p.name for p in c.get_platforms()))"; then
    lib=$(find /usr /lib /lib64 -name libnvidia-opencl.so.1 2>/dev/null | head -1)
    echo "no NVIDIA platform by soname; ICD -> ${lib:-not found}"
    [ -n "$lib" ] && echo "$lib" >/etc/OpenCL/vendors/nvidia.icd
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
fi
stamp "commit $COMMIT; OpenCL platforms:"
python3 -c "import pyopencl as cl; [print('  ', p.name, '|', p.version, '|', [d.name for d in p.get_devices()]) for p in cl.get_platforms()]"

stamp "stage 1: CUDA backend tests + OpenCL conformance (side by side)"
(cd "$S" && timeout 110 python3 -m pytest -q -p no:cacheprovider dif-backend-cuda/tests --junitxml=/tmp/cuda_junit.xml \
  >"$OUT/pytest_cuda.log" 2>&1; echo "pytest rc=$?" >>"$OUT/pytest_cuda.log") &
P1=$!
timeout 110 python3 perf/opencl_conformance.py "${OCLDEV[@]}" --out "$OUT/opencl_conformance_h200.json" \
  >"$OUT/opencl_conformance.log" 2>&1 &
P2=$!
wait $P1
wait $P2
echo "opencl conformance rc=$?"
tail -4 "$OUT/pytest_cuda.log"
tail -4 "$OUT/opencl_conformance.log"
python3 perf/junit_summary.py /tmp/cuda_junit.xml "$OUT/cuda_conformance_h200.json" \
  --label "pytest dif-backend-cuda/tests on the H200" --meta "commit=$COMMIT"

stamp "stage 2: Krea 2 vs diffusers"
timeout "${KREA_S:-240}" python3 perf/bench_denoiser.py --models krea2 --compile "${BENCH[@]}" --out-dir "$OUT"
echo "bench rc=$?"

stamp "stage 3: klein-4B on OpenCL vs CUDA"
timeout "${OCL_S:-140}" python3 perf/opencl_vs_cuda.py "${OCLDEV[@]}" "${OCL[@]}" --sizes 512,1024 \
  --deadline-s "$((${OCL_S:-140} - 12))" --conformance "$OUT/opencl_conformance_h200.json" \
  --out "$OUT/opencl_h200_klein4b.json"
echo "opencl rc=$?"
stamp done

#!/usr/bin/env bash
# One GPU-machine call for issue 21 (SD-Turbo; about 9 of the 10 allowed minutes, every stage time-boxed,
# results in $OUT):
#   stage 1  NVIDIA OpenCL made visible (the ICD file), platforms listed
#   stage 2  tests: dif-frontend-sdturbo/tests/test_backends.py (tiny SD-Turbo on CUDA and OpenCL vs the
#            CPU backend, the seed's pixel bar; CUDA f16/bf16), the conformance cases of group_norm /
#            group_norm_silu on CUDA and OpenCL
#   stage 3  perf/bench_sdturbo.py: full-size UNet 512^2 f16/bf16 (dif vs diffusers eager / torch.compile),
#            prompt -> image (KL VAE, TAESD) vs StableDiffusionPipeline, the pipeline through NVIDIA OpenCL
# Device call (repo root, carry [".whl"] from the device notes' fetch-wheels.sh, timeout_s 600):
#   set -o pipefail; COMMIT=<sha> bash perf/h200_sdturbo.sh 2>&1 | tee $OUT/run.log
# DRY=1 checks the script without a GPU (CPU backend, miniatures, no pip install).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_out}
mkdir -p "$OUT"
T0=$SECONDS
LIMIT=${LIMIT:-560}
stamp() { echo "== $((SECONDS - T0)) s: $*"; }
SRC=dif-core/src:dif-backend-cpu/src:dif-backend-cuda/src:dif-backend-opencl/src:dif-frontend-sdturbo/src:dif-tools/src
SRC=$PWD/${SRC//:/:$PWD/}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ "${DRY:-0}" = 1 ]; then
  export PYTHONPATH=$SRC
  BENCH=(--device cpu --tiny --dtypes f32 --pipeline-dtype f32 --opencl-dtypes f32 --iters 2)
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$SRC
  BENCH=(--device cuda --compile)
  mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 >/etc/OpenCL/vendors/nvidia.icd
  if ! python3 -c "import pyopencl as c, sys; sys.exit(not any('NVIDIA' in p.name for p in c.get_platforms()))"; then
    lib=$(find /usr /lib /lib64 -name libnvidia-opencl.so.1 2>/dev/null | head -1)
    [ -n "$lib" ] && echo "$lib" >/etc/OpenCL/vendors/nvidia.icd
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
fi
stamp "stage 1 (commit $COMMIT): OpenCL platforms"
python3 -c "import pyopencl as cl; [print('  ', p.name, '|', p.version, '|', [d.name for d in p.get_devices()]) for p in cl.get_platforms()]"

stamp "stage 2: SD-Turbo backend tests, group_norm(_silu) conformance on CUDA and OpenCL"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs dif-frontend-sdturbo/tests/test_backends.py \
  "dif-backend-cuda/tests/test_conformance_cuda.py" "dif-backend-opencl/tests/test_conformance.py" -k "group_norm or backends" \
  --junitxml=/tmp/sdturbo_junit.xml >"$OUT/pytest_sdturbo.log" 2>&1
echo "pytest rc=$?"
tail -12 "$OUT/pytest_sdturbo.log"
python3 perf/junit_summary.py /tmp/sdturbo_junit.xml "$OUT/sdturbo_tests_h200.json" \
  --label "SD-Turbo backend tests + group_norm_silu conformance on the H200" --meta "commit=$COMMIT" || true

LEFT=$((LIMIT - (SECONDS - T0) - 10))
stamp "stage 3: bench_sdturbo ($LEFT s)"
timeout "$LEFT" python3 perf/bench_sdturbo.py "${BENCH[@]}" --opencl --deadline-s $((LEFT - 15)) --out-dir "$OUT"
echo "bench rc=$?"
stamp "done"

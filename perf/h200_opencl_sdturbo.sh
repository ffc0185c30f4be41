#!/usr/bin/env bash
# One GPU-machine call (results packed into $OUT/results.tgz), issue 21 at the current commit:
#   stage 1  the OpenCL backend's whole test folder on NVIDIA OpenCL (the default device there: GPUs first),
#            the SD-Turbo backends test (CPU vs OpenCL vs CUDA), the CUDA conformance cases of the ops the
#            OpenCL backend gained this stop (linear_add, the quantized ops) and the rendezvous tests
#   stage 2  one training step of the embedded model's VAE on CUDA (perf/profile_vae_step.py), as shipped and
#            widened, profiled by op and shape (issue 16: the VAE's CUDA step is what bounds its training)
#   stage 3  SD-Turbo f16, DIF_CUDA_TUNE=on: the UNet beside diffusers eager and torch.compile; prompt -> image
#            (KL VAE, TAESD) as one program and with the stages apart, beside StableDiffusionPipeline; the
#            pipeline through NVIDIA OpenCL f32 / f16 with its stage split
# Device call (repo root, carry [".whl"], after perf/device_overlay.sh):
#   set -o pipefail; bash perf/h200_opencl_sdturbo.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 >/etc/OpenCL/vendors/nvidia.icd
stamp "stage 1: OpenCL tests on NVIDIA OpenCL, SD-Turbo backends, CUDA conformance of the new OpenCL ops"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs dif-backend-opencl/tests \
  dif-frontend-sdturbo/tests/test_backends.py dif-core/tests/test_rendezvous.py \
  dif-backend-cuda/tests/test_conformance_cuda.py \
  -k "not test_conformance_cuda or linear_add or quantize_rows or glu_quant or norm_modulate_quant or scaled_linear or int4_linear" \
  --junitxml=/tmp/junit1.xml >"$OUT/pytest_opencl_cuda.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_opencl_cuda.log" | tail -15
python3 -c "from dif_backend_opencl.device import OpenCLBackend as B; b = B(); print('opencl default device:', b.info.platform, '/', b.info.name)"
python3 perf/junit_summary.py /tmp/junit1.xml "$OUT/opencl_cuda_tests_h200.json" \
  --label "OpenCL (NVIDIA) + CUDA tests (perf/h200_opencl_sdturbo.sh)" || true
stamp "stage 2: the VAE's training step on CUDA, profiled"
timeout 60 python3 perf/profile_vae_step.py --backend cuda --batch 16 --crop 128 --out "$OUT/vae_step_8ch.json" \
  | grep -E "step_ms_median|prepare_s" ; echo "profile rc=${PIPESTATUS[0]}"
timeout 60 python3 perf/profile_vae_step.py --backend cuda --batch 16 --crop 128 --channels 16,32,32,32 --groups 4 \
  --out "$OUT/vae_step_wide.json" | grep -E "step_ms_median|prepare_s" ; echo "profile rc=${PIPESTATUS[0]}"
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(json.dumps(d.get('by_op'))); \
print(json.dumps(dict(list(d.get('by_shape', {}).items())[:12]), indent=0))" "$OUT/vae_step_8ch.json" || true
LEFT=$((${LIMIT:-570} - (SECONDS - T0) - 15))
stamp "stage 3: SD-Turbo f16 (tuned): UNet + compile, prompt -> image (one program / apart), OpenCL f32 / f16 (${LEFT} s)"
DIF_CUDA_TUNE=on timeout "$LEFT" python3 perf/bench_sdturbo.py --device cuda --dtypes f16 --pipeline-dtype f16 \
  --compile --iters 20 --profile-iters 0 --opencl --opencl-dtypes f32,f16 --deadline-s $((LEFT - 10)) \
  --out-dir "$OUT/sdturbo_f16" 2>&1 | grep -v "kept in float32"
echo "sdturbo rc=$?"
stamp "done"
cd "$OUT" && tar czf /tmp/results.tgz --exclude results.tgz --exclude run.log . && mv /tmp/results.tgz results.tgz \
  && find . -mindepth 1 ! -name results.tgz ! -name run.log -delete 2>/dev/null; ls -la "$OUT"

#!/usr/bin/env bash
# Stop 30's first GPU-machine call. It measures what stop 29 left unmeasured (glu_quant / concat_glu_quant on
# pitched rows, so klein 9B's single blocks no longer copy the MLP part out of the fused projection; klein 4B;
# the 9B pipeline) together with this stop's change to the row kernels: every division by a row's norm
# denominator or quantization scale is one reciprocal a row and a corrected product a value (common.cuh
# Divisor), and sigmoid's quotient (silu, the gates) an approximate reciprocal and one correction, instead of
# the IEEE division and its slow-path test per value. NVRTC 13 / sm_90 SASS: norm_modulate_quant_warp16 7,904
# instructions -> 5,584, rms_norm_modulate_quant_vec 3,256 -> 2,368, act_mul_quant_vec (silu) 2,056 -> 1,472,
# whose kernels the row-kernel probe found at 0.74-1.7 TB/s with a copy of the same bytes at about 3.
# And the DiT blocks' gated residuals in the fp8 GEMM's epilogue (scaled_linear_gated_residual: the gate in the
# output-channel scales, the residual as cuBLASLt's C), where Krea 2's 56 gated residuals took 3.3 ms of 136.9.
# And fp8 attention without the passes over q and k: their norms write them in e4m3 at a scale the norm weights
# bound (rms_norm_rope_quant -> sdpa_fp8_qk), and the passes left for v and the output move 16 bytes a load.
# Stages in order of need, each writing its results as it ends (a call cut short keeps them):
#   stage 1  GPU tests of the changed kernels against the references: the quantized ops (the gated residual's
#            fused GEMM among them), the fused and unfused norms, silu / sigmoid / GLU, input staging, the tiny
#            FLUX.2 through the format passes
#   stage 2  the row kernels alone (perf/probe_elementwise.py), against a copy of the same bytes
#   stage 3  one forward at 1024^2, bf16, fp8-e4m3 and fp8-e4m3+attention, with the time by op and by GEMM
#            shape: Krea 2, klein 9B
#   stage 4  klein 4B one forward; klein 9B prompt -> PNG, 4 steps, 1024^2, bf16, fp8-e4m3 and
#            fp8-e4m3+attention with the gate
# Device call (repo root, carry [".whl"], timeout_s 600):
#   set -o pipefail; bash perf/h200_call1_30.sh 2>&1 | tee $OUT/run.log
source "$(dirname "$0")/h200_env.sh"
stamp "stage 1: GPU tests"
gpu_tests rows "changed kernels' GPU tests" 170 dif-backend-cuda/tests/test_quant_cuda.py \
  dif-backend-cuda/tests/test_input_staging.py dif-backend-cuda/tests/test_fast_paths_cuda.py \
  dif-backend-cuda/tests/test_conformance_cuda.py dif-backend-cuda/tests/test_streaming.py \
  -k "norm or silu or sigmoid or quant or glu or rope or modulate or residual or stag or fused_projection or tiny or gelu or mask or profile_times or sdpa"
stamp "stage 2: the row kernels alone"
timeout 100 python3 perf/probe_elementwise.py --ops norm_modulate_quant,rms_norm_modulate_quant,act_mul_quant,glu_quant,concat_glu_quant,quantize_rows,rms_norm_rope,norm_modulate --out "$OUT/probe_elementwise.json" 2>&1 | cut -c1-240
stamp "stage 3"
forward_step krea2 fp8-e4m3,fp8-e4m3+attention
forward_step klein-9b fp8-e4m3,fp8-e4m3+attention
stamp "stage 4"
forward_step klein-4b
pipeline_9b 150 fp8-e4m3,fp8-e4m3+attention
stamp "done"

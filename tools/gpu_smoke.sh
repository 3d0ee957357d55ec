#!/usr/bin/env bash
# The first run on a machine with an NVIDIA GPU, from the repository root: the most important figures first, every
# step under its own time limit, at most 9 minutes in all, at most 5 result files in OUT_DIR.
#
#   bash tools/gpu_smoke.sh OUT_DIR          # on the GPU machine
#   bash tools/gpu_smoke.sh --cpu OUT_DIR    # the same steps on the tiny presets, on any machine (CI runs it)
#
# Steps, in order (each stops cleanly at its limit: SIGINT, then SIGKILL 10 s later):
#   env       GPU, driver, versions, git commit                                              -> env.txt
#   pi0       pi0 bf16, 2 views, batch 1, eager and CUDA graph: p50, first call, kernel launches, device-busy
#             fraction, max |diff| vs eager, peak memory                                     (tools/gpu_bench.py)
#   tests     pytest -m "gpu or kernels": the GPU-only tests and the Triton kernel tests on the device -> tests.txt
#   groot     GR00T N1.6 full size, eager and CUDA graph                                     (tools/groot_gpu_bench.py)
#   pi05      pi0.5 bf16, eager and CUDA graph
#   pi0-triton-attention   pi0 with the Triton attention kernel, eager and CUDA graph
# Results: summary.txt (one line per step, then its figures), log.txt, env.txt, tests.txt, results.jsonl.
# The wheels tools/fetch_gpu_wheels.sh put in .gpu_wheels/ are installed first when the machine lacks them.
# Later steps (VGGT, Hunyuan3D-2, compile modes, training): tools/gpu_followup.sh.
set -uo pipefail

# shellcheck source=tools/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"
gpu_arguments '2,20p' 1 "[--cpu] OUT_DIR" "$@"
OUT=${ARGS[0]}
gpu_setup "$OUT" 540 "$CPU_MODE"

if [ "$CPU_MODE" = 1 ]; then
    PI0=pi0-tiny PI05=pi05-tiny GROOT=groot-tiny RUNS=1 WARMUP=0 TESTS=gpu CPU=--allow-cpu
else
    PI0=pi0 PI05=pi05 GROOT=groot-n1.6 RUNS=50 WARMUP=5 TESTS="gpu or kernels" CPU=
    gpu_install_wheels
fi
FIGURES=' p50 [0-9.]+ ms|loaded in'

gpu_environment
# shellcheck disable=SC2086  # $CPU is one flag or nothing
gpu_step pi0 150 "$FIGURES" "$PY" tools/gpu_bench.py --model $PI0 --captures eager cudagraph --buckets 2x1 \
    --runs $RUNS --warmup $WARMUP --out-dir "$RESULTS" $CPU
gpu_pytest tests 150 "$TESTS"
# shellcheck disable=SC2086
gpu_step groot 120 "$FIGURES" "$PY" tools/groot_gpu_bench.py --preset $GROOT --captures eager cudagraph \
    --runs $RUNS --warmup $WARMUP --out-dir "$RESULTS" $CPU
# shellcheck disable=SC2086
gpu_step pi05 90 "$FIGURES" "$PY" tools/gpu_bench.py --model $PI05 --captures eager cudagraph --buckets 2x1 \
    --runs $RUNS --warmup $WARMUP --out-dir "$RESULTS" $CPU
# shellcheck disable=SC2086
gpu_step pi0-triton-attention 90 "$FIGURES" "$PY" tools/gpu_bench.py --model $PI0 --attention triton \
    --captures eager cudagraph --buckets 2x1 --runs $RUNS --warmup $WARMUP --out-dir "$RESULTS" $CPU
gpu_summary "done in $SECONDS s; files: $(cd "$OUT" && ls | tr '\n' ' ')"

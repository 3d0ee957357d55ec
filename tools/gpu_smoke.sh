#!/usr/bin/env bash
# The first run on a machine with an NVIDIA GPU, from the repository root: the most important figures first, every
# step under its own time limit, the worst case (every cap and kill grace summed) at most 6 minutes, computed and
# printed first; at most 5 result files in OUT_DIR.
#
#   bash tools/gpu_smoke.sh OUT_DIR          # on the GPU machine
#   bash tools/gpu_smoke.sh --cpu OUT_DIR    # the same steps on the tiny presets, on any machine (CI runs it)
#
# Steps, in order (each stops cleanly at its limit: SIGINT, then SIGKILL 5 s later):
#   env       GPU, driver, versions, git commit                                              -> env.txt
#   pi0       pi0 bf16, 2 views, batch 1, eager and CUDA graph: p50, first call, kernel launches, device-busy
#             fraction, max |diff| vs eager, peak memory                                     (tools/gpu_bench.py)
#   tests     pytest -m "(gpu or kernels) and not compile": the GPU-only tests and the Triton kernel tests on the
#             device, no torch.compile test (those run in gpu_followup.sh's tests step)   -> tests.txt
#   groot     GR00T N1.6 full size, eager and CUDA graph                                     (tools/groot_gpu_bench.py)
# Each benchmark writes its result file as soon as its timing is done (the profiler pass after it is optional).
# Results: summary.txt (the worst case, then one line per step and its figures), log.txt, env.txt, tests.txt,
# results.jsonl. The wheels tools/fetch_gpu_wheels.sh put in .gpu_wheels/ are installed first when the machine lacks them.
# Later steps (pi0.5, the Triton attention kernel, VGGT, Hunyuan3D-2, compile modes, training): tools/gpu_followup.sh.
set -uo pipefail

# shellcheck source=tools/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"
gpu_arguments '2,19p' 1 "[--cpu] OUT_DIR" "$@"
OUT=${ARGS[0]}
# Step caps in seconds, in the order the steps run; the session's cap is their sum plus one kill grace per step and
# the final bundling (gpu_common.sh), so no step is ever cut by another's overrun.
STEP_NAMES=(env pi0 tests groot)
STEP_CAPS=(15 115 105 90)
gpu_setup "$OUT" "$(gpu_worst_case "${STEP_CAPS[@]}")" "$CPU_MODE"
gpu_summary "worst case: $CAP s ($(gpu_cap_terms STEP_NAMES STEP_CAPS))"

if [ "$CPU_MODE" = 1 ]; then
    PI0=pi0-tiny GROOT=groot-tiny RUNS=1 WARMUP=0 TESTS="gpu and not compile" CPU=--allow-cpu
else
    PI0=pi0 GROOT=groot-n1.6 RUNS=50 WARMUP=5 TESTS="(gpu or kernels) and not compile" CPU=
    gpu_install_wheels
fi
FIGURES=' p50 [0-9.]+ ms|loaded in'

gpu_environment "${STEP_CAPS[0]}"
# shellcheck disable=SC2086  # $CPU is one flag or nothing
gpu_step pi0 "${STEP_CAPS[1]}" "$FIGURES" "$PY" tools/gpu_bench.py --model $PI0 --captures eager cudagraph \
    --buckets 2x1 --runs $RUNS --warmup $WARMUP --out-dir "$RESULTS" $CPU
gpu_pytest tests "${STEP_CAPS[2]}" "$TESTS"
# shellcheck disable=SC2086
gpu_step groot "${STEP_CAPS[3]}" "$FIGURES" "$PY" tools/groot_gpu_bench.py --preset $GROOT --captures eager cudagraph \
    --runs $RUNS --warmup $WARMUP --out-dir "$RESULTS" $CPU
gpu_summary "done in $SECONDS s; files: $(cd "$OUT" && ls | tr '\n' ' ')"

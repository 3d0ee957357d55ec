#!/usr/bin/env bash
# The GPU work on a machine with an NVIDIA GPU, from the repository root; results go to OUT_DIR.
#
#   tools/fetch_gpu_wheels.sh            # once, where there is network: pure-Python wheels the GPU machine may lack
#   bash tools/gpu_session.sh OUT_DIR tests             # kernels, CUDA graphs, device processing on the GPU
#   bash tools/gpu_session.sh OUT_DIR bench pi0         # the bench matrix, one model per call
#   bash tools/gpu_session.sh OUT_DIR bench pi0 --attention triton --captures cudagraph   # one axis of it
#   bash tools/gpu_session.sh OUT_DIR bench pi05
#   bash tools/gpu_session.sh OUT_DIR profile pi0 cudagraph           # packed-SDPA attention
#   bash tools/gpu_session.sh OUT_DIR profile pi0 cudagraph triton    # the Triton attention kernel
#   bash tools/gpu_session.sh OUT_DIR groot                           # GR00T N1.6: GPU tests, full-size benchmark
#   bash tools/gpu_session.sh OUT_DIR groot --attention sdpa triton --captures eager cudagraph
#
# Result files are bundled into one archive per call. Needs torch, triton, numpy, safetensors (and the wheels in
# .gpu_wheels/ when pytest or tqdm are missing); downloads nothing.
set -uo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 OUT_DIR tests | bench MODEL [gpu_bench args] | profile MODEL CAPTURE [sdpa|triton] | groot [args]" >&2
    exit 2
fi
OUT=$1
shift
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}

for module in pytest tqdm; do
    if ! "$PY" -c "import $module" 2>/dev/null && [ -d .gpu_wheels ]; then
        "$PY" -m pip install --quiet --no-index --find-links .gpu_wheels "$module" 2>&1 | tail -2
    fi
done
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >"$OUT/gpu.txt" 2>&1
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))" >>"$OUT/gpu.txt" 2>&1

case "${1:-tests}" in
tests)
    "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py tests/test_cuda_attention.py tests/test_cudagraph.py \
        tests/test_device_processing.py tests/test_runtime.py tests/test_pi0_parity.py 2>&1 | tail -40 | tee "$OUT/tests.txt"
    ;;
bench)
    model=${2:-pi0}
    shift 2 || true
    "$PY" tools/gpu_bench.py --model "$model" --out-dir "$OUT/results" "$@" 2>&1 | grep -v "^INFO" | tee "$OUT/bench_$model.txt"
    tar czf "$OUT/results_$model.tgz" -C "$OUT" results && rm -rf "$OUT/results"
    ;;
profile)
    model=${2:-pi0}
    capture=${3:-cudagraph}
    attention=${4:-sdpa}
    tag="${model}_${capture//+/_}_${attention}"
    "$PY" -m embodied_accel.cli profile --model "$model" --dtype bfloat16 --capture "$capture" --views 2 \
        --cuda-attention "$attention" --out-dir "$OUT/profiles" 2>&1 | tee "$OUT/profile_${tag}.txt"
    tar czf "$OUT/profile_${tag}.tgz" -C "$OUT" profiles && rm -rf "$OUT/profiles"
    ;;
groot)
    # GR00T N1.6: its kernel tests (and, when the groot extra's wheels were carried, its policy tests with real CUDA
    # graphs), then the full-size benchmark of tools/groot_gpu_bench.py (bf16, one view, 4 steps, batch 1)
    shift 1 || true
    "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_groot_kernels.py tests/test_groot_policy.py 2>&1 \
        | tail -20 | tee "$OUT/groot_tests.txt"
    "$PY" tools/groot_gpu_bench.py --out-dir "$OUT/results" "$@" 2>&1 | grep -v "^INFO" | tee "$OUT/bench_groot.txt"
    tar czf "$OUT/results_groot.tgz" -C "$OUT" results && rm -rf "$OUT/results"
    ;;
*)
    echo "usage: $0 OUT_DIR tests | bench MODEL [gpu_bench args] | profile MODEL CAPTURE [sdpa|triton] | groot [args]" >&2
    exit 2
    ;;
esac

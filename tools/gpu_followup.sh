#!/usr/bin/env bash
# The GPU steps after tools/gpu_smoke.sh, one step per call (each fits a short session), with the same rules: the
# step under its own time limit (SIGINT, then SIGKILL 5 s later; at most 9 minutes), logs written as they go,
# summary.txt / env.txt / log.txt / results.jsonl (and tests.txt for the tests step) in OUT_DIR, nothing else.
#
#   bash tools/gpu_followup.sh [--cpu] OUT_DIR STEP [ARGS]
#
# STEP:
#   pi05                       pi0.5 bf16, 2 views batch 1, eager and CUDA graph
#   triton-attention [MODEL]   pi0 (or pi05) with the Triton attention kernel, eager and CUDA graph, 2 views batch 1
#   vggt                       full-size VGGT, 1/10/50/100 frames of 518x518: aggregator time and peak memory
#   vggt-w8a8                  the same with the W8A8 plan, 1/10/50 frames
#   vggt-long                  full-size VGGT streamed, 100/500/1,000 frames: time, peak memory and its estimate;
#                              the chunked aggregator against its whole-block form (bit-equal?) on 8 frames
#   hunyuan3d [CAPTURE [DECODING [CACHE]]]   Hunyuan3D-2, one configuration (default: eager hierarchical none;
#                              CAPTURE eager|compile|cudagraph, DECODING hierarchical|dense, CACHE none|taylorseer-o1n5)
#   texture [CAPTURE]          Hunyuan3D-Paint's whole texture stage at full size (20k faces, 2048), stage by stage
#   texture-unwrap             the same (eager) with each UV unwrap mode, default and fast
#   compile MODEL              pi0 / pi05 eager, compile and compile+cudagraph, 2 views batch 1
#   quant MODEL                pi0 / pi05 with W8A8 and FP8 linear layers, eager and CUDA graph, 2 views batch 1
#   groot-compile              GR00T N1.6 eager, compile and compile+cudagraph
#   groot-n17                  GR00T N1.7 (full size, bf16, 1 view batch 1) eager, cudagraph and compile+cudagraph
#   buckets MODEL              pi0 / pi05 / groot eager and CUDA graph over every shape bucket (1-3 views x batch 1, 8)
#   train [PRESET]             full-size pi0.5 (or pi0) training steps: samples/s and peak memory per batch size
#   int8-gemm                  the W8A8 int8 GEMM's paths (_int_mm, Triton) and bf16 mm at the models' linear shapes
#   tests                      every test with the GPU visible (the whole suite; kernels, GPU and compile tests)
# --cpu runs the step on the tiny presets (graphs through the CPU replay stand-in), to check the script anywhere.
set -uo pipefail

# shellcheck source=tools/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"
gpu_arguments '2,27p' 2 "[--cpu] OUT_DIR STEP [ARGS]  (steps: pi05 triton-attention vggt vggt-long vggt-w8a8 hunyuan3d texture texture-unwrap compile quant groot-compile groot-n17 buckets train int8-gemm tests)" "$@"
OUT=${ARGS[0]}
STEP=${ARGS[1]}
STEP_ARGS=("${ARGS[@]:2}")
gpu_setup "$OUT" 540 "$CPU_MODE"
[ "$CPU_MODE" = 0 ] && gpu_install_wheels
gpu_environment

tiny() {  # the full-size name, or its tiny preset in CPU mode
    if [ "$CPU_MODE" = 1 ]; then
        case $1 in
            pi0 | pi05) echo "$1-tiny" ;;
            groot-n1.6) echo groot-tiny ;;
            groot-n1.7) echo groot-n1.7-tiny ;;
            vggt) echo vggt-tiny ;;
            hunyuan3d-dit-v2-0) echo hunyuan3d-tiny ;;
            *) echo "$1" ;;
        esac
    else
        echo "$1"
    fi
}
if [ "$CPU_MODE" = 1 ]; then
    CPU=(--allow-cpu) RUNS=2 VGGT_FRAMES=(1 3) VGGT_SIZE=56 H3D=(--steps 2 --octree-resolution 32 --runs 1)
    PAINT=(--preset hunyuan3d-paint-tiny --device cpu --dtype float32 --runs 1 --subdivisions 2 --render-size 256
           --texture-size 256)
else
    CPU=() RUNS=30 VGGT_FRAMES=(1 10 50 100) VGGT_SIZE=518 H3D=(--runs 2) PAINT=(--runs 2)
fi
FIGURES=' p50 [0-9.]+ ms|loaded in|frames|out of memory|samples/s'
PIX=(--buckets 2x1 --runs "$RUNS" --warmup 3 --out-dir "$RESULTS" "${CPU[@]}")

case $STEP in
    pi05)
        gpu_step pi05 240 "$FIGURES" "$PY" tools/gpu_bench.py --model "$(tiny pi05)" --captures eager cudagraph \
            "${PIX[@]}"
        ;;
    triton-attention)
        gpu_step "triton-attention-${STEP_ARGS[0]:-pi0}" 240 "$FIGURES" "$PY" tools/gpu_bench.py \
            --model "$(tiny "${STEP_ARGS[0]:-pi0}")" --attention triton --captures eager cudagraph "${PIX[@]}"
        ;;
    vggt)
        gpu_step vggt 480 "$FIGURES" "$PY" tools/vggt_gpu_bench.py --preset "$(tiny vggt)" --size "$VGGT_SIZE" \
            --frames "${VGGT_FRAMES[@]}" --runs 5 --out-dir "$RESULTS" "${CPU[@]}"
        ;;
    vggt-long)
        LONG_FRAMES=(100 500 1000)
        [ "$CPU_MODE" = 1 ] && LONG_FRAMES=(4 16)
        gpu_step vggt-long 520 "$FIGURES|estimate|bit-equal" "$PY" tools/vggt_long_gpu_bench.py --preset "$(tiny vggt)" \
            --size "$VGGT_SIZE" --frames "${LONG_FRAMES[@]}" --out-dir "$RESULTS" "${CPU[@]}"
        ;;
    vggt-w8a8)
        gpu_step vggt-w8a8 480 "$FIGURES" "$PY" tools/vggt_gpu_bench.py --preset "$(tiny vggt)" --size "$VGGT_SIZE" \
            --frames "${VGGT_FRAMES[@]:0:3}" --quant --runs 5 --out-dir "$RESULTS" "${CPU[@]}"
        ;;
    hunyuan3d)
        gpu_step hunyuan3d 520 "$FIGURES" "$PY" tools/hunyuan3d_gpu_bench.py --preset "$(tiny hunyuan3d-dit-v2-0)" \
            --capture "${STEP_ARGS[0]:-eager}" --decoding "${STEP_ARGS[1]:-hierarchical}" --cache "${STEP_ARGS[2]:-none}" \
            "${H3D[@]}" --out-dir "$RESULTS" "${CPU[@]}"
        ;;
    texture)
        gpu_step "texture-${STEP_ARGS[0]:-eager}" 520 "$FIGURES|total" "$PY" tools/hunyuan3d_paint_gpu_bench.py \
            --capture "${STEP_ARGS[0]:-eager}" --out-dir "$RESULTS" "${PAINT[@]}"
        ;;
    texture-unwrap)
        for mode in default fast; do
            gpu_step "texture-unwrap-$mode" 260 "$FIGURES|total" "$PY" tools/hunyuan3d_paint_gpu_bench.py \
                --unwrap "$mode" --out-dir "$RESULTS" "${PAINT[@]}"
        done
        ;;
    compile)
        gpu_step "compile-${STEP_ARGS[0]:-pi0}" 520 "$FIGURES" "$PY" tools/gpu_bench.py \
            --model "$(tiny "${STEP_ARGS[0]:-pi0}")" --captures eager compile compile+cudagraph "${PIX[@]}"
        ;;
    quant)
        gpu_step "quant-${STEP_ARGS[0]:-pi0}" 520 "$FIGURES" "$PY" tools/gpu_bench.py \
            --model "$(tiny "${STEP_ARGS[0]:-pi0}")" --quant w8a8 fp8 --captures eager cudagraph "${PIX[@]}"
        ;;
    groot-compile)
        gpu_step groot-compile 520 "$FIGURES" "$PY" tools/groot_gpu_bench.py --preset "$(tiny groot-n1.6)" \
            --captures eager compile compile+cudagraph --runs "$RUNS" --out-dir "$RESULTS" "${CPU[@]}"
        ;;
    groot-n17)
        if [ "$CPU_MODE" = 1 ]; then
            N17=(eager:100 compile:200) N17_DTYPE=float32
        else
            N17=(eager:120 cudagraph:150 compile+cudagraph:250) N17_DTYPE=bfloat16
        fi
        for entry in "${N17[@]}"; do
            gpu_step "groot-n17-${entry%%:*}" "${entry##*:}" "$FIGURES|mean" "$PY" -m embodied_accel.cli bench \
                --model "$(tiny groot-n1.7)" --capture "${entry%%:*}" --dtype "$N17_DTYPE" --runs "$RUNS" --warmup 3 \
                --out-dir "$RESULTS"
        done
        ;;
    buckets)
        model=${STEP_ARGS[0]:-pi0}
        if [ "$model" = groot ]; then
            gpu_step buckets-groot 400 "$FIGURES" "$PY" tools/groot_gpu_bench.py --preset "$(tiny groot-n1.6)" \
                --buckets 1x1 1x8 2x1 2x8 --runs "$RUNS" --out-dir "$RESULTS" "${CPU[@]}"
        else
            gpu_step "buckets-$model" 400 "$FIGURES" "$PY" tools/gpu_bench.py --model "$(tiny "$model")" \
                --buckets all --runs "$RUNS" --warmup 3 --out-dir "$RESULTS" "${CPU[@]}"
        fi
        ;;
    train)
        if [ "$CPU_MODE" = 1 ]; then
            TRAIN=(--preset "$(tiny "${STEP_ARGS[0]:-pi05}")" --device cpu --batches 1 2 --steps 1 --warmup 1 --dtype float32)
        else
            TRAIN=(--preset "${STEP_ARGS[0]:-pi05}" --batches 8 16 32 48 64)
        fi
        gpu_step train 520 "$FIGURES" "$PY" tools/bench_train_gpu.py "${TRAIN[@]}" --out "$RESULTS"
        ;;
    int8-gemm)
        INT8=()
        [ "$CPU_MODE" = 1 ] && INT8=(--cpu)
        gpu_step int8-gemm 300 ' ms|wrote' "$PY" tools/int8_gemm_gpu_bench.py "${INT8[@]}" "$RESULTS"
        ;;
    tests)
        if [ "$CPU_MODE" = 1 ]; then
            gpu_pytest tests 520 "gpu"
        else
            gpu_pytest tests 520
        fi
        ;;
    *)
        echo "unknown step $STEP (steps: pi05 triton-attention vggt vggt-long vggt-w8a8 hunyuan3d texture texture-unwrap compile quant groot-compile groot-n17 buckets train int8-gemm tests)" >&2
        exit 2
        ;;
esac
gpu_summary "done in $SECONDS s; files: $(cd "$OUT" && ls | tr '\n' ' ')"

# Shared by tools/gpu_smoke.sh and tools/gpu_followup.sh (sourced, not run): steps under their own time limits,
# logs written as they go, results bundled into a handful of files with safe names, one summary line per step.
#
# OUT_DIR receives at most these files (nothing deeper, names of [A-Za-z0-9._-] only):
#   summary.txt    one line per step (status, seconds) and the step's figures, in the order the steps ran
#   env.txt        the GPU, driver, Python / torch / Triton versions, the git commit
#   log.txt        everything every step printed, appended and flushed as it goes (tracebacks included)
#   tests.txt      the pytest step's own output (full failure reports)
#   results.jsonl  every result record the steps wrote, one JSON object per line, rewritten after each step
# Raw result files live in a temporary folder outside OUT_DIR.

KILL_GRACE=5 # seconds between a step's SIGINT at its limit and its SIGKILL
RESERVE=10   # seconds kept for the last bundling

gpu_worst_case() {  # gpu_worst_case CAP...: the session's worst case, every step cap, one kill grace each, bundling
    local total=$RESERVE cap
    for cap in "$@"; do
        total=$((total + cap + KILL_GRACE))
    done
    echo "$total"
}

gpu_cap_terms() {  # gpu_cap_terms NAMES_ARRAY CAPS_ARRAY: "env 15 + pi0 115 + ... + 4 kill graces of 5 s + bundling 10"
    local -n names=$1 caps=$2
    local i terms=""
    for i in "${!caps[@]}"; do
        terms+="${names[$i]} ${caps[$i]} + "
    done
    echo "${terms}${#caps[@]} kill graces of $KILL_GRACE + bundling $RESERVE"
}

gpu_arguments() {  # gpu_arguments HELP_LINES MIN_ARGS USAGE "$@": sets CPU_MODE (--cpu) and ARGS (the rest)
    local help=$1 min=$2 usage=$3 arg
    shift 3
    CPU_MODE=0
    ARGS=()
    for arg in "$@"; do
        case $arg in
            --cpu) CPU_MODE=1 ;;
            -h | --help)
                sed -n "$help" "$0"
                exit 0
                ;;
            *) ARGS+=("$arg") ;;
        esac
    done
    if [ "${#ARGS[@]}" -lt "$min" ]; then
        echo "usage: $0 $usage" >&2
        exit 2
    fi
}

gpu_setup() {  # gpu_setup OUT_DIR CAP_SECONDS CPU_MODE(0|1); then the working directory is the repository root
    OUT=$1
    CAP=$2
    CPU_MODE=$3
    mkdir -p "$OUT" || exit 2
    OUT=$(cd "$OUT" && pwd) # relative to the caller's directory; the steps run from the repository root
    cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/embodied_accel_gpu.XXXXXX")
    RESULTS=$WORK/results
    mkdir -p "$RESULTS"
    LOG=$OUT/log.txt
    SUMMARY=$OUT/summary.txt
    : >"$LOG"
    : >"$SUMMARY"
    DEADLINE=$((SECONDS + CAP))
    PY=${PYTHON:-python3}
    export PYTHONUNBUFFERED=1
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
    if [ "$CPU_MODE" = 1 ]; then
        export CUDA_VISIBLE_DEVICES= # the CPU even on a machine with a GPU
    fi
    trap 'rm -rf "$WORK"' EXIT
}

gpu_summary() {  # one line into summary.txt (and onto the terminal)
    echo "$*" | tee -a "$SUMMARY"
}

gpu_install_wheels() {  # wheels the GPU image lacks, from tools/fetch_gpu_wheels.sh's folder, when it is there
    local module
    for module in websockets; do
        if ! "$PY" -c "import $module" 2>/dev/null && ls .gpu_wheels/"$module"-*.whl >/dev/null 2>&1; then
            "$PY" -m pip install --quiet --no-index --find-links .gpu_wheels "$module" >>"$LOG" 2>&1 &&
                echo "installed $module from .gpu_wheels" >>"$LOG"
        fi
    done
}

gpu_environment() {  # gpu_environment [LIMIT_SECONDS]: env.txt, each probe under the limit (default 30 s)
    local limit=${1:-30}
    {
        if [ "$CPU_MODE" = 1 ]; then
            echo "CPU mode (tiny presets, graphs through the CPU replay stand-in): $(nproc) cores"
        else
            timeout -k "$KILL_GRACE" "$limit" nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
                --format=csv,noheader 2>&1
        fi
        timeout -k "$KILL_GRACE" "$limit" "$PY" - <<'PYEOF' 2>&1
import importlib.util, platform, torch
triton = "absent"
if importlib.util.find_spec("triton") is not None:
    import triton as _triton
    triton = _triton.__version__
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"python {platform.python_version()}, torch {torch.__version__}, triton {triton}, {device}")
for module in ("websockets", "av", "xdist", "pytest_timeout"):
    print(f"{module}: {'yes' if importlib.util.find_spec(module) else 'no'}")
PYEOF
        echo "git $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain --untracked-files=no 2>/dev/null | wc -l) modified"
    } >"$OUT/env.txt"
    cat "$OUT/env.txt" >>"$LOG"
    gpu_summary "env: $(head -n 2 "$OUT/env.txt" | tr '\n' ' ')"
}

gpu_bundle() {  # every result file so far as one JSON object per line
    "$PY" - "$RESULTS" "$OUT/results.jsonl" <<'PYEOF' 2>>"$LOG"
import json, pathlib, sys
files = sorted(pathlib.Path(sys.argv[1]).glob("*.json"))
lines = [json.dumps({"file": f.name, **json.loads(f.read_text())}, separators=(",", ":")) for f in files]
pathlib.Path(sys.argv[2]).write_text("".join(line + "\n" for line in lines))
PYEOF
}

# gpu_step NAME LIMIT_SECONDS PATTERN COMMAND...
#   Runs COMMAND under `timeout -s INT` (at most LIMIT seconds, less when the session's cap is near; SIGKILL
#   KILL_GRACE seconds later if it does not stop), its output appended to log.txt as it comes and kept for the
#   summary, whose lines are the
#   step's status and the output lines matching PATTERN (an extended regular expression).
gpu_step() {
    local name=$1 limit=$2 pattern=$3
    shift 3
    local left=$((DEADLINE - SECONDS - RESERVE - KILL_GRACE))
    if [ "$left" -lt "$limit" ]; then
        limit=$left
    fi
    if [ "$limit" -lt 5 ]; then
        gpu_summary "$name: skipped (the session's time is up)"
        return
    fi
    local step_out=$WORK/$name.out start=$SECONDS status rc
    echo "== $name (limit ${limit} s) $(date -u +%H:%M:%S)" >>"$LOG"
    timeout -s INT -k "$KILL_GRACE" "$limit" "$@" 2>&1 | tee -a "$LOG" >"$step_out"
    rc=${PIPESTATUS[0]}
    case $rc in
        0) status="ok" ;;
        124 | 137) status="stopped at its limit (${limit} s)" ;;
        *) status="failed (exit $rc)" ;;
    esac
    gpu_summary "$name: $status in $((SECONDS - start)) s"
    grep -E "$pattern" "$step_out" | head -n 20 | sed 's/^/    /' | tee -a "$SUMMARY"
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != 137 ]; then
        tail -n 5 "$step_out" | sed 's/^/    | /' | tee -a "$SUMMARY"
    fi
    gpu_bundle
}

# gpu_pytest NAME LIMIT [MARKEXPR]: the tests selected by MARKEXPR (all without one), in parallel (4 workers) and
# with a per-test timeout where the plugins are installed; the full report goes to tests.txt (and log.txt). Inductor
# compiles in each test process itself (TORCHINDUCTOR_COMPILE_THREADS=1: no pool of compile workers per xdist worker).
gpu_pytest() {
    local name=$1 limit=$2 marks=${3:-} extra=()
    if [ -n "$marks" ]; then
        extra+=(-m "$marks")
    fi
    if "$PY" -c "import xdist" 2>/dev/null && [ "$CPU_MODE" = 0 ]; then
        extra+=(-n 4)
    fi
    if "$PY" -c "import pytest_timeout" 2>/dev/null; then
        extra+=(--timeout 60)
    fi
    gpu_step "$name" "$limit" '(passed|failed|error|skipped|no tests ran)|^(FAILED|ERROR) ' \
        env TORCHINDUCTOR_COMPILE_THREADS=1 "$PY" -m pytest -q -rfE -p no:cacheprovider "${extra[@]}" tests
    cp "$WORK/$name.out" "$OUT/tests.txt"
}

#!/usr/bin/env bash
# Wheels the GPU machine's image lacks (it has no network), downloaded where there is network into .gpu_wheels/
# (ignored by git); tools/gpu_smoke.sh and tools/gpu_followup.sh install them from there when the module is missing.
#
#   bash tools/fetch_gpu_wheels.sh [PYTHON_VERSION]     # default 3.12, the GPU machines' Python
#
# websockets (the policy server and its tests): CPython, manylinux x86-64. PyAV is not fetched: the tests that need
# it skip with a reason, and the benchmarks do not read videos.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
abi=cp${version//./}
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest .gpu_wheels \
    --python-version "$version" --implementation cp --abi "$abi" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    'websockets>=14'
ls -l .gpu_wheels

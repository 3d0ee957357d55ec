#!/usr/bin/env bash
# Pure-Python wheels for the GPU machine (no network there): pytest and its dependencies, tqdm.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --dest .gpu_wheels pytest tqdm
ls .gpu_wheels

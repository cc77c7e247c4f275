#!/usr/bin/env bash
# One call on the GPU machine (see README, "GPU tests"): FlashInfer from carried wheels, then
# the GPU test module (or with `all` the whole suite), and optionally the benchmark; logs
# under $OUT.
# Usage: scripts/device_run.sh [all] [bench]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__)"
if [[ " $* " == *" all "* ]]; then  # the whole suite, the GPU module included
    python3 -m pytest -q -rs -s tests 2>&1 | tee "$OUT/all-tests.log" | grep -E "passed|failed|error|differ|SKIP|^E " | tail -15
else
    python3 -m pytest -q -rA -s tests/test_gpu.py 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "passed|failed|error|differ|^E " | tail -15
fi
if [[ " $* " == *" bench "* ]]; then
    python3 scripts/bench.py --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -40
fi

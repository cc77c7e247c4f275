#!/usr/bin/env bash
# One call on the GPU machine (see docs/development.md, "GPU tests"): FlashInfer and vLLM's Python code from
# carried files, then the GPU test modules (or with `all` the whole suite), and optionally the
# benchmark; logs under $OUT.
# Usage: [K=pytest-k-expression] [TESTS="test files"] [VLLM_RELEASES="0.34.0 ..."]
#        [BENCH_ARGS="--cases layers"] scripts/device_run.sh [all | no-tests] [bench | vllm-bench |
#        vllm-bench-quick] [cli-bench] [child-read-bench]
# Carried (see docs/development.md): .carry/wheels/*.whl (FlashInfer 0.6.18.post1, apache-tvm-ffi and vLLM's
# pure-Python dependencies missing from the image) and .carry/vllm-py.zip (vLLM 0.33.0's package
# without its compiled parts); the older .whl/ folder is taken too.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
wheels=$(ls .carry/wheels/*.whl .whl/*.whl 2>/dev/null)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $wheels || exit 1
[ -f .carry/vllm-py.zip ] && python3 -m zipfile -e .carry/vllm-py.zip /tmp/site
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__)"
python3 -c "import vllm.model_executor.layers.fused_moe; print('vllm', __import__('vllm').__version__)" 2>&1 | tail -3
if [[ " $* " == *" no-tests "* ]]; then
    :
elif [[ " $* " == *" all "* ]]; then  # the whole suite, the GPU modules included
    python3 -m pytest -q -rs -s tests --ignore=tests/engine 2>&1 | tee "$OUT/all-tests.log" | grep -E "passed|failed|error|differ|SKIP|^E " | tail -15
else
    python3 -m pytest -q -rA -s ${TESTS:-tests/test_gpu.py tests/test_bulk_read.py tests/test_vllm_gpu.py tests/test_vllm.py} ${K:+-k "$K"} 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "passed|failed|error|differ|^E " | tail -25
fi
# Each vLLM release of VLLM_RELEASES (its package carried as .carry/releases/vllm-X.zip:
# scripts/carry_for_device.sh X) as the test authority of the vLLM GPU tests, with the FlashInfer
# carried above: `pytest --server vllm --release X`.
for release in ${VLLM_RELEASES:-}; do
    rm -rf "/tmp/site-$release" && python3 -m zipfile -e ".carry/releases/vllm-$release.zip" "/tmp/site-$release"
    PYTHONPATH="/tmp/site-$release:$PYTHONPATH" python3 -m pytest -q -rA -s -p no:cacheprovider \
        --server vllm --release "$release" ${RELEASE_TESTS:-tests/test_vllm_gpu.py} ${RELEASE_K:+-k "$RELEASE_K"} 2>&1 |
        tee "$OUT/gpu-tests-vllm-$release.log" | grep -E "passed|failed|error|differ|^E " | tail -25
done
if [[ " $* " == *" bench "* ]]; then
    python3 scripts/bench.py --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -40
fi
if [[ " $* " == *" bench "* || " $* " == *" vllm-bench "* ]]; then
    python3 scripts/bench_vllm_load.py --out "$OUT" $BENCH_ARGS 2>&1 | tee "$OUT/bench-vllm-load.log" | grep -E "^\||^limit|^wrote|^cold|^read gap|^gap run|Error" | tail -40
fi
if [[ " $* " == *" vllm-bench-quick "* ]]; then  # two cases, warm, and the plugin's settings swept
    python3 scripts/bench_vllm_load.py --out "$OUT" --quick --sweep 2>&1 | tee "$OUT/bench-vllm-load.log" | grep -v "^\(INFO\|WARNING\|DEBUG\)" | tail -60
fi
if [[ " $* " == *" vllm-bench-big "* ]]; then  # two layers warm, then 256 experts and a whole model
    python3 scripts/bench_vllm_load.py --out "$OUT" --quick 2>&1 | tee "$OUT/bench-vllm-quick.log" | grep -E "^\||^limit|^wrote|Error"
    python3 scripts/bench_vllm_load.py --out "$OUT" --cases big 2>&1 | tee "$OUT/bench-vllm-big.log" | grep -E "^\||^limit|^wrote|^cold|Error"
fi
if [[ " $* " == *" child-read-bench "* ]]; then  # a child's readers beside this process's Python
    python3 scripts/bench_read_process.py --size 1.8 --runs 6 --work-ms 8 --threads 12 \
        --ring 128,512,1024 --streams 1,4 --switch 0.5 --out "$OUT" 2>&1 |
        tee "$OUT/bench-read-process.log" | tail -22
fi
if [[ " $* " == *" cli-bench "* ]]; then  # the CLI + sync against cp -r + sync (8 and 16 GB)
    python3 scripts/bench_cli_sync.py --out "$OUT" --tmp /tmp 2>&1 | tee "$OUT/bench-cli-sync.log" | tail -12
fi

#!/usr/bin/env bash
# Builds .carry/ for scripts/device_run.sh on the GPU machine (no network there; Python 3.12,
# torch 2.11, transformers and huggingface_hub in its image): FlashInfer 0.6.18.post1 and
# apache-tvm-ffi, the pure-Python packages vLLM 0.33 imports that the image lacks (compressed-tensors
# included, for its compressed-tensors configs; at the
# versions in .venv), and vLLM's own package from .venv without its compiled parts (about
# 48 MB in all; `run` carries at most 64 MiB). With RELEASE..., also each vLLM release's package
# from its venv (scripts/release_env.sh vllm RELEASE: 13 MB each) as .carry/releases/vllm-RELEASE.zip,
# which `VLLM_RELEASES="RELEASE..." scripts/device_run.sh` runs the GPU tests against, with the
# FlashInfer above (0.6.18.post1, the one 0.30 pins: the later ones' wheels are 34-101 MB, and
# their MoE byte layouts are 0.6.18's). With NO_BASE=1, vLLM 0.33's package is left out, so that
# two releases fit (`VLLM_RELEASES="A B" scripts/device_run.sh no-tests`: their tests alone).
# Usage: [NO_BASE=1] scripts/carry_for_device.sh [RELEASE...]
set -euo pipefail
cd "$(dirname "$0")/.."
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf .carry && mkdir -p .carry/wheels
pins=$(.venv/bin/pip list --format=freeze 2>/dev/null | grep -iE "^(annotated-types|cachetools|cbor2|fastapi|starlette|llguidance|msgspec|openai|oss-harmony|partial-json-parser|pybase64|pydantic|pydantic_core|typing-inspection|xgrammar|pyzmq|truststore|sniffio|distro|jiter|httpx2|httpcore2|compressed-tensors|loguru)==")
for p in flashinfer-python==0.6.18.post1 apache-tvm-ffi==0.1.15.post2 $pins; do
    pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .carry/wheels \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any "$p"
done
zip_vllm() {  # the vllm package of site-packages $1 into $2, without its compiled parts and the
    # largest model packages and attention kernels, which no GPU test or bench imports
    (cd "$1" && zip -qr9 "$2" vllm vllm-*.dist-info -x "*.so" -x "*__pycache__*" -x "*.dist-info/RECORD" \
        -x "vllm/vllm-rs" -x "vllm/third_party/deep_gemm/*" -x "vllm/third_party/fmha_sm100/*" \
        -x "vllm/entrypoints/serve/instrumentator/static/*" \
        -x "vllm/models/kimi_k3/*" -x "vllm/models/deepseek_v4*" -x "vllm/models/minimax_m3/*" \
        -x "vllm/models/muse_spark/*" -x "vllm/third_party/tml_fa4/*" -x "vllm/vllm_flash_attn/cute/*")
    # vLLM's CUDA platform imports its compiled ops (92 MB, left behind) as its modules import,
    # and its attention package its FlashAttention extension: stand-ins (scripts/vllm_stand_ins/)
    # let them import, and an op a test needs fails naming it
    (cd scripts/vllm_stand_ins && zip -qr "$2" vllm -x "*__pycache__*")
}
[ -n "${NO_BASE:-}" ] || zip_vllm "$site" "$PWD/.carry/vllm-py.zip"
for release in "$@"; do
    mkdir -p .carry/releases
    venv=$(bash scripts/release_env.sh vllm "$release")
    zip_vllm "$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")" \
        "$PWD/.carry/releases/vllm-$release.zip"
done
du -sh .carry

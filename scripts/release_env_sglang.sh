#!/usr/bin/env bash
# One SGLang release as a test authority: a venv with that release's Python code beside the
# CPU torch 2.13.0, as `make install-server SERVER=sglang` builds `.venv-sglang` for 0.5.23
# (its wheel with --no-deps, the FlashInfer that release pins, and the pure-Python packages
# its MoE layers, loaders and plugin discovery import: requirements/sglang-alone-cpu-test.txt).
# fi-convert itself is not installed there (its dependencies are): the tests run it from the
# clone, with PYTHONPATH, so one cached venv serves every clone.
#
#   scripts/release_env_sglang.sh 0.5.21          # build it unless a finished one is cached
#   scripts/release_env_sglang.sh 0.5.21 --path   # print the venv's path only (builds nothing)
#   scripts/release_env_sglang.sh 0.5.21 --fresh  # remove it and build it again
#
# The venv is ${FI_CONVERT_CACHE:-$HOME/.cache/fi-convert}/venvs/sglang-<release>-<hash>,
# <hash> from this script and the requirement files it reads: a change to either builds
# another. It prints the path last on stdout. The FlashInfer version is read from the
# release's own wheel (its `flashinfer_python` pin), never written here; so is xgrammar's
# (--no-deps: SGLang 0.5.20's configs import it).
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."

release=${1:?usage: scripts/release_env_sglang.sh RELEASE [--path|--fresh]}
[[ "$release" =~ ^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$ ]] ||
    { echo "release_env_sglang: '$release' is not a release number (e.g. 0.5.21)" >&2; exit 2; }
TORCH=torch==2.13.0
inputs=(requirements/torch-cpu.txt requirements/sglang-alone-cpu-test.txt
    requirements/sglang-cpu-test.txt)
hash=$(cat "$self" "${inputs[@]}" | sha256sum | cut -c1-12)
VENV="${FI_CONVERT_CACHE:-$HOME/.cache/fi-convert}/venvs/sglang-$release-$hash"
STAMP="$VENV/.release-env-installed"

case "${2:-}" in
    --path) echo "$VENV"; exit 0 ;;
    --fresh) rm -rf "$VENV" ;;
    "") ;;
    *) echo "release_env_sglang: unknown option '$2' (--path or --fresh)" >&2; exit 2 ;;
esac
if [[ -f "$STAMP" ]]; then
    echo "release_env_sglang: $VENV is up to date" >&2
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
pip_ install -q "$TORCH"
# the release's wheel first, to read the versions it pins
wheels="$VENV/.wheels"
pip_ download -q --no-deps -d "$wheels" "sglang==$release"
pin() {  # the version the release's wheel pins for a distribution (its METADATA)
    unzip -p "$wheels"/sglang-"$release"-*.whl "sglang-$release.dist-info/METADATA" |
        sed -n "s/^Requires-Dist: $1\\(\\[[^]]*\\]\\)\\? *==\\([^ ;]*\\).*/\\2/p"
}
flashinfer=$(pin 'flashinfer[_-]python')
xgrammar=$(pin xgrammar)  # 0.5.20's configs import it on the way to the MoE layer
[[ -n "$flashinfer" && -n "$xgrammar" ]] ||
    { echo "release_env_sglang: sglang $release pins no flashinfer or xgrammar" >&2; exit 1; }
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
pip_ install -q -c requirements/torch-cpu.txt -r requirements/sglang-alone-cpu-test.txt
pip_ install -q --no-deps "flashinfer-python==$flashinfer" "xgrammar==$xgrammar" \
    "$wheels"/sglang-"$release"-*.whl
rm -rf "$wheels"
check='from tests.sglang_stubs import installed
with installed(): import sglang.srt.layers.moe.fused_moe_triton.layer'
"$VENV/bin/python" -c "$check"
! "$VENV/bin/python" -c "import vllm" 2>/dev/null ||
    { echo "release_env_sglang: $VENV holds vllm, which it must not" >&2; exit 1; }
got=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"))')
[[ "$got" == "$release" ]] || { echo "release_env_sglang: sglang $got, not $release" >&2; exit 1; }
echo "$release flashinfer-python==$flashinfer xgrammar==$xgrammar" >"$STAMP"
echo "release_env_sglang: built $VENV (sglang $release, flashinfer-python $flashinfer," \
    "xgrammar $xgrammar)" \
    "in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1)" >&2
echo "$VENV"

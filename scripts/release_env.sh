#!/usr/bin/env bash
# One server release as a test authority: a venv of the release's own packages over the clone's
# one-server venv (.venv-vllm or .venv-sglang, `make install-server SERVER=...`): every package of
# that venv linked in (symbolic links, nothing copied), but those the release replaces, which are
# installed there, so that its interpreter runs the release's code beside the CPU torch 2.13.0
# and everything else the one-server venv holds. A package is replaced whole: none of the venv's
# version of it (its modules, its other top-level packages, its metadata) is linked.
#
#   scripts/release_env.sh vllm 0.30.0          # build it unless a finished one is cached
#   scripts/release_env.sh sglang 0.5.21 --path # print its path only (builds nothing)
#   scripts/release_env.sh vllm 0.30.0 --fresh  # remove it and build it again
#
# Installed there with --no-deps: the release's wheel and each package it pins that the venv
# holds at a version the release refuses: its FlashInfer and xgrammar, and, for vLLM, every
# package of requirements/vllm-cpu-test.txt (0.31 takes transformers < 5.18 and xgrammar 0.2.7,
# for example), then what those need that the venv lacks (round by round). The pins are read
# from the wheel's metadata, never written here, except where the package index lacks the
# pinned release (FLASHINFER_INSTEAD).
#
# It lies in the clone, under .venv-releases/<server>-<release>-<hash> (it links into the clone's
# one-server venv: it serves no other clone), <hash> from this script, the one-server venv's
# path and its installed distributions: a change to any builds another (and removes the one it
# replaces). It prints the venv's path last on stdout; run its bin/python (with the clone on
# PYTHONPATH).
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."

usage="usage: scripts/release_env.sh vllm|sglang RELEASE [--path|--fresh]"
server=${1:?$usage}
release=${2:?$usage}
case "$server" in
    vllm) narrow=requirements/vllm-cpu-test.txt ;;
    sglang) narrow= ;;
    *) echo "release_env: '$server' is not a server (vllm or sglang)" >&2; exit 2 ;;
esac
[[ "$release" =~ ^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$ ]] ||
    { echo "release_env: '$release' is not a release number (e.g. 0.30.0)" >&2; exit 2; }
VENV=${SERVER_VENV:-.venv-$server}
[[ -f "$VENV/.installed" ]] ||
    { echo "release_env: $VENV is not built; run: make install-server SERVER=$server" >&2; exit 1; }
PY="$VENV/bin/python"
installed=$("$PY" -c 'import importlib.metadata as m
print("\n".join(sorted({d.metadata["Name"] + "==" + d.version for d in m.distributions()})))')
base=$(cd "$VENV" && pwd)
hash=$( (cat "$self" ${narrow:+"$narrow"}; echo "$base"; echo "$installed") | sha256sum | cut -c1-12)
OVERLAY="$PWD/.venv-releases/$server-$release-$hash"
STAMP="$OVERLAY/.release-env-installed"

case "${3:-}" in
    --path) echo "$OVERLAY"; exit 0 ;;
    --fresh) rm -rf "$OVERLAY" ;;
    "") ;;
    *) echo "release_env: unknown option '$3' (--path or --fresh)" >&2; exit 2 ;;
esac
if [[ -f "$STAMP" ]]; then
    echo "release_env: $OVERLAY is up to date ($(cat "$STAMP"))" >&2
    echo "$OVERLAY"
    exit 0
fi

exec 3>&1 1>&2  # stdout: the path alone (what the build runs logs on stderr: vLLM logs on stdout)
start=$(date +%s)
mkdir -p "$(dirname "$OVERLAY")"
echo '*' >"$(dirname "$OVERLAY")/.gitignore"
# built in a folder of its own, then renamed into place: a run beside this one (another clone's
# CI) builds its own and the first to finish wins; a run cut off leaves none half built
tmp=$(mktemp -d "$OVERLAY.XXXXXX.tmp")
trap 'rm -rf "$tmp"' EXIT
pip_() {  # this machine's pip config names local indexes that may be absent: drop that noise
    "$VENV/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
wheels="$tmp/.wheels"
pip_ download -q --no-deps -d "$wheels" "$server==$release"
wheel=$(ls "$wheels"/"$server"-"$release"-*.whl)
# What the release pins that the venv does not hold, as pip requirements: its FlashInfer and
# xgrammar, and (vLLM) each package of $narrow whose installed version its requirement refuses.
mapfile -t wanted < <("$PY" - "$wheel" "$server" "$release" "$narrow" <<'EOF'
import importlib.metadata as md
import sys
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon

# vLLM 0.34.0 pins flashinfer-python 0.7.3, which the package index lacks; 0.7.4 holds the same
# MoE layouts (FlashInfer's byte layouts are the same from 0.6.18 through 0.7.4).
FLASHINFER_INSTEAD = {"0.7.3": "0.7.4"}
wheel, server, release, narrow = sys.argv[1:]
meta = zipfile.ZipFile(wheel).read(f"{server}-{release}.dist-info/METADATA").decode()
ours = {"flashinfer-python", "xgrammar"}
if narrow:
    ours |= {canon(Requirement(line.strip()).name) for line in open(narrow)
             if line.strip() and not line.startswith(("#", "-"))}
pins = {}
for line in meta.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line.removeprefix("Requires-Dist: "))
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canon(req.name) in ours and req.specifier:
        pins[canon(req.name)] = str(req.specifier)
flashinfer = pins.get("flashinfer-python", "")
if not flashinfer.startswith("=="):
    sys.exit(f"release_env: {server} {release} pins no flashinfer-python ({flashinfer or 'none'})")
version = flashinfer.removeprefix("==")
pins["flashinfer-python"] = "==" + FLASHINFER_INSTEAD.get(version, version)
for name, spec in sorted(pins.items()):
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = None
    if have is None or not Requirement(f"{name}{spec}").specifier.contains(have, True):
        print(f"{name}{spec}")
EOF
)
"$PY" -m venv --without-pip "$tmp"
site=$("$tmp/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# Link the one-server venv's packages in, but those named (canonical names) and whatever else
# their own files hold at the top (flashinfer-python's `b12x` package, say); with --drop, remove
# the links of the named ones from a venv built so far.
base_site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
relink() {
    "$PY" scripts/venv_links.py link "$base_site" "$site" "$@"
}
names() { printf '%s\n' "$@" | sed 's/[][<>=!~;, ].*//'; }
mapfile -t replaced < <(names "${wanted[@]}" "$server")
relink "${replaced[@]}"
pip_ install -q --no-deps --no-compile --target "$site" "${wanted[@]}" "$wheel"
# What a narrowed package needs that the venv lacks (transformers 5.17 imports httpx, which the
# venv's newer one does not), round by round; the server's, FlashInfer's and xgrammar's own
# requirements are not followed (CUDA-only packages, triton: the venv holds what runs on CPU).
for round in 1 2 3 4 5; do
    mapfile -t more < <("$tmp/bin/python" - "$site" "$server" <<'EOF'
import importlib.metadata as md
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon

site, server = sys.argv[1:]
skip = {canon(server), "flashinfer-python", "xgrammar"}
for dist in md.distributions(path=[site]):
    if Path(dist._path).is_symlink() or canon(dist.metadata["Name"]) in skip:
        continue  # (one of the one-server venv's, linked in)
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, True):
            print(f"{canon(req.name)}{req.specifier}")
EOF
    )
    [[ ${#more[@]} -eq 0 ]] && break
    [[ $round -lt 5 ]] || { echo "release_env: unmet after 5 rounds: ${more[*]}" >&2; exit 1; }
    mapfile -t gone < <(names "${more[@]}")
    relink --drop "${gone[@]}"
    pip_ install -q --no-deps --no-compile --target "$site" "${more[@]}"
    wanted+=("${more[@]}")
done
rm -rf "$wheels" "$site/bin"
got=$("$tmp/bin/python" -c "import importlib.metadata as m; print(m.version('$server'))")
[[ "$got" == "$release" ]] || { echo "release_env: $server $got, not $release" >&2; exit 1; }
if [[ "$server" == vllm ]]; then
    check="import vllm.model_executor.layers.fused_moe"
else
    check='from tests.sglang_stubs import installed
with installed(): import sglang.srt.layers.moe.fused_moe_triton.layer'
fi
PYTHONPATH="$PWD" "$tmp/bin/python" -c "$check"
echo "$server $release over $base: ${wanted[*]}" >"$tmp/.release-env-installed"
if ! mv -T "$tmp" "$OVERLAY" 2>/dev/null; then  # built beside this run meanwhile: keep that one
    [[ -f "$STAMP" ]] || { echo "release_env: cannot move $tmp to $OVERLAY" >&2; exit 1; }
fi
for old in "${OVERLAY%-*}"-*; do  # the ones this replaces: the same release, older builds
    [[ "$old" != "$OVERLAY" && "$old" != *.tmp && -f "$old/.release-env-installed" ]] || continue
    rm -rf "$old"
done
echo "release_env: built $OVERLAY ($server $release: ${wanted[*]})" \
    "in $(($(date +%s) - start)) s, $(du -sh "$OVERLAY" | cut -f1)" >&2
echo "$OVERLAY" >&3

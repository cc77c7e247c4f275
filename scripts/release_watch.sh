#!/usr/bin/env bash
# Prove the newest release of a server on small outputs of every scheme and backend its plugin
# loads, with the release's own MoE processing: examples/ci/release-watch.yml runs this daily,
# and it runs the same way on a workstation (docs/publishing.md, "Know the day a release lands").
#
#   scripts/release_watch.sh vllm|sglang [WORKDIR]
#
# In WORKDIR (default: a new temporary folder, removed at the end unless KEEP=1): a fresh venv
# with fi-convert, the CPU torch and the server's pure-Python requirements (requirements/), then
# the newest flashinfer-python and server wheels, unpinned, with --no-deps (their CUDA-only
# dependencies are not needed to run their MoE processing on CPU); small outputs of every
# scheme x backend (scripts/proof_outputs.py); `fi-convert verify OUT --server SERVER --json`
# on each. Prints one line per output (proven or FAILED) and a markdown report, also appended to
# $GITHUB_STEP_SUMMARY where set; exits 1 when any output fails. TORCH_INDEX: where the CPU torch
# comes from (default: PyTorch's CPU index; empty: pip's own configuration).
set -euo pipefail
cd "$(dirname "$0")/.."
server=${1:?usage: scripts/release_watch.sh vllm|sglang [WORKDIR]}
case "$server" in
    vllm) requirements=requirements/vllm-cpu-test.txt; wheels=(vllm xgrammar) ;;
    sglang) requirements=requirements/sglang-alone-cpu-test.txt; wheels=(sglang) ;;
    *) echo "release_watch: '$server' is not a server (vllm or sglang)" >&2; exit 2 ;;
esac
work=${2:-}
if [[ -z "$work" ]]; then
    work=$(mktemp -d "${TMPDIR:-/tmp}/release-watch-$server.XXXXXX")
    [[ "${KEEP:-}" == 1 ]] || trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
TORCH_INDEX=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}

python3 -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip
"${pip[@]}" install -q -r requirements/torch-cpu.txt ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
"${pip[@]}" install -q .
"${pip[@]}" install -q -c requirements/torch-cpu.txt -r requirements/flashinfer-cpu.txt \
    -r "$requirements"
"${pip[@]}" install -q --no-deps --upgrade flashinfer-python "${wheels[@]}"
release=$("$work/venv/bin/python" -c "import importlib.metadata as m; print(m.version('$server'))")
flashinfer=$("$work/venv/bin/python" -c "import importlib.metadata as m; print(m.version('flashinfer-python'))")
echo "release_watch: $server $release, flashinfer-python $flashinfer"

"$work/venv/bin/python" scripts/proof_outputs.py "$server" "$work/outputs" >"$work/outputs.txt"
failed=0
report="$work/report.md"
echo "### $server $release (flashinfer-python $flashinfer)" >"$report"
while read -r out; do
    name=$(basename "$out")
    if "$work/venv/bin/fi-convert" verify "$out" --server "$server" --json \
            >"$work/$name.json" 2>"$work/$name.err"; then
        status=proven
    else
        status=FAILED
        failed=1
    fi
    echo "$name: $status"
    {
        echo "- $name: $status"
        "$work/venv/bin/python" - "$work/$name.json" "$work/$name.err" <<'EOF'
import json
import sys

try:
    proof = json.load(open(sys.argv[1]))
except ValueError:  # no proof ran: the error says why
    print("  - " + (open(sys.argv[2]).read().strip().splitlines() or ["(no output)"])[-1])
    sys.exit()
for s in proof.get("shapes", []):
    where = f" at {s['where']}" if s.get("where") else ""
    tensor = f", {s['tensor']}" if s.get("tensor") else ""
    print(f"  - {s.get('shape')} rank {s.get('rank')}: {s.get('result')}{tensor}{where}")
EOF
    } >>"$report"
done <"$work/outputs.txt"
cat "$report"
[[ -z "${GITHUB_STEP_SUMMARY:-}" ]] || cat "$report" >>"$GITHUB_STEP_SUMMARY"
exit "$failed"

"""The load-time proof on the installed SGLang (`fi_convert.servers.proving` says what a proof
is): SGLang's own FusedMoE for each distinct layer shape of an output, at the output's sizes
and for one MoE TP rank, with two synthetic experts through SGLang's own weight loader and its
quant method's own `process_weights_after_loading`, against fi-convert's layout of the same
values.

SGLang keeps its parallel state and server arguments per process, so the proof runs in a
process of its own (`python -m fi_convert.servers.sglang.proof`), on the CPU as the tests run
SGLang (`moe_layer.py`: SGLang's own test hooks for the platform, FlashInfer's CUDA-only
swizzles as their CPU equivalents), whatever GPU the server holds.

The plugin runs it for an SGLang release an output does not list (`checks.UnlistedRelease`);
`fi-convert verify OUT --server sglang` runs it for the installed release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from ...format.names import target_of
from ..proving import Proof, ProofError, Row, Shape, prove
from . import checks
from .checks import PluginError, UnlistedRelease

SERVER = "sglang"
TIMEOUT_S = 1800
# Run in a process of its own (the tests run it in theirs, to plant a change in SGLang's code)
OWN_PROCESS = True


def prove_installed(
    manifest: Mapping, *, ranks: list[int] | None = None, cache: bool = True
) -> Proof:
    """Prove the installed SGLang on the output's shapes (every TP rank unless `ranks`), in a
    process of its own."""
    ranks = list(range(manifest["tp_size"])) if ranks is None else ranks
    if not OWN_PROCESS:
        return _prove_here(manifest, ranks, cache)
    job = json.dumps({"manifest": manifest, "ranks": ranks, "cache": cache})
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # SGLang's CPU path, as in the tests
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__],
            input=job,
            capture_output=True,
            text=True,
            env=env,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return _cannot(manifest, f"the proof took over {TIMEOUT_S} s")
    if done.returncode != 0 or not done.stdout.strip():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return _cannot(manifest, f"SGLang's own MoE processing did not run here ({last})")
    return _proof(json.loads(done.stdout.strip().splitlines()[-1]))


def _proof(got: dict) -> Proof:
    proof = Proof(got["server"], got["release"], got["device"])
    proof.rows = [Row(**row) for row in got["shapes"]]
    return proof


def _cannot(manifest: Mapping, why: str) -> Proof:
    from ..proving import shapes

    proof = Proof(SERVER, checks.sglang_version(), "cpu")
    first = shapes(manifest)[0]
    proof.rows.append(Row(first.label, len(first.layers), 0, result="cannot run", where=why))
    return proof


def run(shape: Shape, src: Path, prefix: str, rank: int, names: list[str]) -> dict:
    """SGLang's own layer for `rank` of the shape's TP size, loaded with the source's two
    experts and processed by SGLang: what it holds, by the output's tensor names."""
    from . import moe_layer as ml

    backend = f"mxfp4-{shape.backend}" if shape.scheme == "mxfp4" else shape.backend
    try:
        layer = ml.build(backend, shape.tp_size, rank, src, prefix)
    except Exception as e:  # a hook missing or changed: the proof cannot run here
        why = str(e).splitlines()[0] if str(e) else ""
        raise ProofError(
            f"SGLang {checks.sglang_version()}'s own MoE processing did not run here "
            f"({type(e).__name__}: {why})"
        ) from None
    held = ml.params(layer)
    return {name: held.get(name) for name in names}


def check_release(manifest: Mapping, root: str, unlisted: UnlistedRelease, rank: int) -> str:
    """The plugin's hook for an SGLang release the output does not list: prove it for this
    rank; the log line when it is proven, else PluginError (one line: the first tensor that
    differs and where, or why the proof cannot run here, and the fix)."""
    proof = prove_installed(manifest, ranks=[rank])
    if proof.ok:
        return proof.line("SGLang")
    listed = getattr(unlisted, "listed", None) or listed_releases(manifest)
    raise PluginError(refusal(proof, root, listed))


def listed_releases(manifest: Mapping) -> str:
    """The releases the output lists (its target's list, else its range), for a refusal."""
    target = target_of(dict(manifest), SERVER)
    got = target.get("sglang_releases")
    if isinstance(got, list) and got:
        return ", ".join(map(str, got))
    return str(target.get("sglang_versions") or "none")


def refusal(proof: Proof, root: str, listed: str) -> str:
    """Why a failed proof refuses the output, in one line with the fix."""
    row = proof.first_failure()
    assert row is not None
    rel = proof.release
    fix = f"install an SGLang in {listed}, or an fi-convert that lists SGLang {rel}"
    if row.result == "differs":
        return (
            f"{root}: SGLang {rel} is not a release this output lists ({listed}), and its own "
            f"MoE processing holds other bytes: {row.tensor} of the layer shape {row.shape} "
            f"(rank {row.rank}) differs from the output's, {row.where}; {fix}"
        )
    return (
        f"{root}: SGLang {rel} is not a release this output lists ({listed}), and fi-convert "
        f"cannot prove it here: {row.where}; {fix}"
    )


def _prove_here(manifest: Mapping, ranks: list[int], cache: bool) -> Proof:
    release = checks.sglang_version()
    return prove(manifest, server=SERVER, release=release, ranks=ranks, run=run, cache=cache)


def main() -> None:
    """The proof's own process: a job on stdin, the proof's JSON as the last line of stdout."""
    job = json.loads(sys.stdin.read())
    got = _prove_here(job["manifest"], job["ranks"], job["cache"])
    sys.stdout.write("\n" + json.dumps(got.as_dict()) + "\n")


if __name__ == "__main__":
    main()

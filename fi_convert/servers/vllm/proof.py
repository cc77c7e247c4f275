"""The load-time proof on the installed vLLM (`fi_convert.servers.proving` says what a proof
is): vLLM's own MoE layer for each distinct layer shape of an output, at the output's sizes and
for one TP rank, with two synthetic experts through vLLM's own weight loading and its own
`process_weights_after_loading` (on the GPU when there is one; on CPU with only the hardware
queries patched and FlashInfer's CUDA-only swizzles as their CPU equivalents), against
fi-convert's layout of the same values.

The plugin runs it for a vLLM release an output does not list (`checks.UnlistedRelease`);
`fi-convert verify OUT --server vllm` runs it for the installed release."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from unittest import mock

import torch

from ...format.names import target_of
from ..proving import Proof, ProofError, Shape, prove
from . import checks
from .checks import PluginError, UnlistedRelease

SERVER = "vllm"
# The GPU vLLM is told it runs on, by (scheme, backend): where vLLM runs that path
SM = {("fp8-block", "cutlass"): 90}
# The user's MoE activation override that makes vLLM pick the path an output is for
MOE_ACTIVATION = {("mxfp4", "cutlass"): "mxfp8"}


def prove_installed(
    manifest: Mapping, *, ranks: list[int] | None = None, cache: bool = True
) -> Proof:
    """Prove the installed vLLM on the output's shapes (every TP rank unless `ranks`)."""
    release = checks.vllm_version()
    try:
        from . import moe_layer  # noqa: F401  (vLLM's modules the proof builds on)
    except (ImportError, AttributeError) as e:
        return _cannot(manifest, release, f"vLLM {release} lacks a module the proof uses ({e})")
    ranks = list(range(manifest["tp_size"])) if ranks is None else ranks
    return prove(manifest, server=SERVER, release=release, ranks=ranks, run=run, cache=cache)


def _cannot(manifest: Mapping, release: str, why: str) -> Proof:
    from ..proving import Row, shapes

    proof = Proof(SERVER, release, "cuda" if torch.cuda.is_available() else "cpu")
    first = shapes(manifest)[0]
    proof.rows.append(Row(first.label, len(first.layers), 0, result="cannot run", where=why))
    return proof


def run(shape: Shape, src: Path, prefix: str, rank: int, names: list[str]) -> dict:
    """vLLM's own layer for `rank` of the shape's TP size, loaded with the source's two experts
    and processed by vLLM: what it holds, by the output's tensor names."""
    from .. import flashinfer_cpu
    from . import moe_layer as ml

    key = (shape.scheme, shape.backend)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        with (
            ml.vllm_context(
                shape.backend,
                shape.tp_size,
                rank,
                sm=SM.get(key, 100),
                device=device,
                moe_activation=MOE_ACTIVATION.get(key),
            ),
            flashinfer_cpu.installed(("vllm",)),
            _on_cpu() if device == "cpu" else contextlib.nullcontext(),
        ):
            layer = ml.make_layer(prefix, src, shape.tp_size)
            ml.vllm_load_and_process(layer, src, prefix)
    except Exception as e:  # a hook missing or changed: the proof cannot run here
        why = str(e).splitlines()[0] if str(e) else ""
        raise ProofError(
            f"vLLM {checks.vllm_version()}'s own MoE processing did not run here "
            f"({type(e).__name__}: {why})"
        ) from None
    return {name: ml.held(layer, name) for name in names}


@contextlib.contextmanager
def _on_cpu() -> Iterator[None]:
    """Without CUDA the current device is the CPU: vLLM's kernel objects allocate their small
    constants (gpt-oss's SwiGLU alphas) on `torch.accelerator.current_device_index()`, and its
    NVFP4 CUTLASS scale swizzle (`nvfp4_utils.swizzle_blockscale`, plain PyTorch) ends with
    `.cuda()`: both stay on the CPU."""
    with (
        mock.patch.object(torch.accelerator, "current_device_index", lambda: "cpu"),
        mock.patch.object(torch.Tensor, "cuda", _stay),
    ):
        yield


def _stay(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return self


def check_release(manifest: Mapping, root: str, unlisted: UnlistedRelease, rank: int) -> str:
    """The plugin's hook for a vLLM release the output does not list: prove it on the output's
    shapes for this rank; the log line when it is proven, else PluginError (one line: the
    first tensor that differs and where, or why the proof cannot run here, and the fix)."""
    proof = prove_installed(manifest, ranks=[rank])
    if proof.ok:
        return proof.line("vLLM")
    listed = getattr(unlisted, "listed", None) or listed_releases(manifest)
    raise PluginError(refusal(proof, root, listed))


def listed_releases(manifest: Mapping) -> str:
    """The releases the output lists (its target's list, else its range), for a refusal."""
    target = target_of(dict(manifest), SERVER)
    got = target.get("vllm_releases")
    if isinstance(got, list) and got:
        return ", ".join(map(str, got))
    return str(target.get("vllm_versions") or "none")


def refusal(proof: Proof, root: str, listed: str) -> str:
    """Why a failed proof refuses the output, in one line with the fix."""
    row = proof.first_failure()
    assert row is not None
    rel = proof.release
    fix = f"install a vLLM in {listed}, or an fi-convert that lists vLLM {rel}"
    if row.result == "differs":
        return (
            f"{root}: vLLM {rel} is not a release this output lists ({listed}), and its own "
            f"MoE processing holds other bytes: {row.tensor} of the layer shape {row.shape} "
            f"(rank {row.rank}) differs from the output's, {row.where}; {fix}"
        )
    return (
        f"{root}: vLLM {rel} is not a release this output lists ({listed}), and fi-convert "
        f"cannot prove it here: {row.where}; {fix}"
    )

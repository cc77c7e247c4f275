"""gpt-oss MXFP4 (both backends) against the installed vLLM's own processing on CPU, in every
proven release's venv (`make test-release`): vLLM's FusedMoE layer with its gpt-oss MXFP4
method, its weight loading (vLLM's gpt-oss loader does the TP split) and its
`process_weights_after_loading`, against fi-convert's bytes; and the plugin's load and kernel
setup leaving the layer as vLLM's own path does. TP 1, 2 and 4, every rank.

vLLM builds its MXFP4 experts' small constants on `torch.accelerator.current_device_index()`,
which is the CPU here (as in the load-time proof, fi_convert/servers/vllm/proof.py), and its
TRT-LLM and CUTLASS paths swizzle the scales with FlashInfer's CUDA-only `block_scale_interleave`,
replaced by the CPU version of tests/vllm_moe.py, which takes only the shapes
tests/test_gpu.py has checked against FlashInfer's on the GPU (tests/swizzle_shapes.py): the
sizes below are chosen so that every shape they pass is one of those. tests/test_vllm_gpu.py
runs the same comparison with FlashInfer's own functions on CUDA.

Each case runs as the releases table says of the installed release
(fi_convert/servers/vllm/releases.py): proven (the bytes equal); a release it leaves "not
proven" is not run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests import vllm_moe as vm

PREFIX = "model.layers.1.mlp.experts"
CASES = {
    # H 512, I 384: per rank 384, 192, 96 (-> 128 at TP 4; rank 3 holds rows), both backends
    "h512-i384": (
        Spec("gpt-oss", layers=2, experts=3, hidden=512, intermediate=384),
        ("trtllm", "cutlass"),
    ),  # fmt: skip
    # H 320 (-> 512 on TRT-LLM), I 192: per rank 192, 96, 48 (-> 128, 128, 64 padded)
    "h320-i192": (Spec("gpt-oss", layers=2, experts=3, hidden=320, intermediate=192), ("trtllm",)),
}
# the user's MoE activation override that makes vLLM pick the path an output is for
MOE_ACTIVATION = {"cutlass": "mxfp8"}

ALL_PARAMS = [
    (case, backend, tp, rank)
    for case, (_, backends) in CASES.items()
    for backend in backends
    for tp in (1, 2, 4)
    for rank in range(tp)
]
PARAMS = [
    p for p in ALL_PARAMS if vm.release_status("mxfp4", p[1], CASES[p[0]][0], p[2]) == "proven"
]


@contextlib.contextmanager
def _context(backend: str, tp: int, rank: int) -> Iterator[None]:
    with (
        vm.vllm_context(backend, tp, rank, moe_activation=MOE_ACTIVATION.get(backend)),
        vm.cpu_swizzle(),
        mock.patch.object(torch.accelerator, "current_device_index", lambda: "cpu"),
    ):
        yield


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-mxfp4-src")
    return {name: write_checkpoint(root / name, c[0]) for name, c in CASES.items()}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, checkpoints):
    root = tmp_path_factory.mktemp("vllm-mxfp4-out")
    done: dict = {}

    def get(case: str, backend: str, tp: int):
        if (case, backend, tp) not in done:
            out = root / f"{case}-{backend}-{tp}"
            opts = Options(SchemeName.MXFP4, Backend(backend), tp)
            convert(checkpoints[case], out, opts, device="cpu")
            done[case, backend, tp] = out
        return done[case, backend, tp]

    return get


def _vllm_layer(case, backend, tp, rank, checkpoints):
    with _context(backend, tp, rank):
        layer = vm.make_layer(PREFIX, checkpoints[case], tp)
        vm.vllm_load_and_process(layer, checkpoints[case], PREFIX)
    return layer


@pytest.mark.parametrize(("case", "backend", "tp", "rank"), PARAMS)
def test_vllm_params_equal_fi_convert_bytes(case, backend, tp, rank, checkpoints, outputs):
    layer = _vllm_layer(case, backend, tp, rank, checkpoints)
    vm.assert_holds_output_bytes(layer, outputs(case, backend, tp), PREFIX, rank)


@pytest.mark.parametrize(("case", "backend", "tp", "rank"), PARAMS)
def test_plugin_path_leaves_the_layer_as_vllm_does(case, backend, tp, rank, checkpoints, outputs):
    out = outputs(case, backend, tp)
    theirs = _vllm_layer(case, backend, tp, rank, checkpoints)
    with _context(backend, tp, rank):
        ours = vm.plugin_layer(PREFIX, checkpoints[case], out, tp)
    vm.assert_same_layer(theirs, ours)


@pytest.mark.parametrize(
    "case", sorted({c for c, b, tp, _ in PARAMS if (b, tp) == ("trtllm", 2)})
)  # (where the release holds the layout's bytes)
def test_plugin_path_gives_back_the_memory_of_what_it_replaces(case, checkpoints, outputs):
    """gpt-oss's biases: the model allocates them in bfloat16, the kernel takes float32, so the
    install replaces them (the layer ends larger, as vLLM's processing leaves it too); what they
    held is freed, not kept beside (TRT-LLM's layout, rank 1 of TP 2; CUTLASS's keeps them in
    bfloat16, in place)."""
    with _context("trtllm", 2, 1):
        replaced = vm.assert_plugin_gives_memory_back(
            PREFIX, checkpoints[case], outputs(case, "trtllm", 2), 2
        )
    assert replaced >= 2  # (w13_bias and w2_bias at least)

"""NVFP4 and MXFP8 against the installed vLLM's own processing on CPU, in every proven release's
venv (`make test-release`): vLLM's FusedMoE layers, its weight loading and its
`process_weights_after_loading`, with FlashInfer's CUDA-only 128x4 scale swizzle replaced by a
CPU version checked against FlashInfer's on the GPU (tests/vllm_moe.py `cpu_swizzle`,
tests/swizzle_shapes.py); on a CUDA GPU tests/test_vllm_gpu.py runs the same checks with
FlashInfer's own. As tests/test_vllm.py:

(a) the parameters vLLM holds equal fi-convert's bytes;
(b) the plugin's path leaves the layer exactly as vLLM's own path.

Where the releases table (fi_convert/servers/vllm/releases.py) leaves the installed release out
for an output's sizes (MXFP8 that needs padding, on 0.30-0.32), the release's own processing must
fail on them: the table is what these tests decide, in each release.
"""

from __future__ import annotations

import pytest

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests import vllm_moe as vm

CASES = {
    # ModelOpt NVFP4, H 320 (-> 512 on TRT-LLM), I 384 (per rank 192/96, -> 128 at TP 4)
    "deepseek-nvfp4": (
        "nvfp4",
        Spec("deepseek-v3", layers=2, experts=5, hidden=320, intermediate=384, quant="nvfp4"),
        "model.layers.1.mlp.experts",
        ("trtllm", "cutlass"),
    ),
    # Nemotron-H ModelOpt NVFP4 (as nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4): non-gated
    # experts, w13 the up projection alone; H 320 (-> 512 on TRT-LLM), I 384 (per rank 384,
    # 192, 96: -> 384, 256, 128 on both backends, CUTLASS padding along to its swizzle's rows)
    "nemotron-nvfp4": (
        "nvfp4",
        Spec("nemotron-h", layers=1, experts=3, hidden=320, intermediate=384, quant="nvfp4"),
        "backbone.layers.0.mixer.experts",
        ("trtllm", "cutlass"),
    ),
    # Nemotron-H ModelOpt MXFP8: non-gated experts; H 320 (-> 512), I 384 (per rank 384, 192,
    # 96 -> 384, 256, 128)
    "nemotron-mxfp8": (
        "mxfp8",
        Spec("nemotron-h", layers=1, experts=3, hidden=320, intermediate=384, quant="mxfp8"),
        "backbone.layers.0.mixer.experts",
        ("trtllm",),
    ),
    # ModelOpt MXFP8 whose sizes need no padding at TP 1 and 2 (H 512, I per rank 256, 128)
    "qwen3-mxfp8": (
        "mxfp8",
        Spec("qwen3-moe", layers=1, experts=3, hidden=512, intermediate=256, quant="mxfp8"),
        "model.layers.0.mlp.experts",
        ("trtllm",),
    ),
    # ... and sizes that do: H 320 (-> 512), I per rank 384, 192 (-> 256)
    "qwen3-mxfp8-pad": (
        "mxfp8",
        Spec("qwen3-moe", layers=1, experts=3, hidden=320, intermediate=384, quant="mxfp8"),
        "model.layers.0.mlp.experts",
        ("trtllm",),
    ),
}
ALL_PARAMS = [
    (case, backend, tp, rank)
    for case, (_, _, _, backends) in CASES.items()
    for backend in backends
    for tp in (1, 2, 4)
    for rank in range(tp)
    if (case, backend, tp) != ("deepseek-nvfp4", "cutlass", 4)  # refused by both (test_vllm_gpu)
    if not (case == "qwen3-mxfp8" and tp == 4)  # I per rank 64: the -pad case's
]


def status(case: str, backend: str, tp: int) -> str:
    return vm.release_status(CASES[case][0], backend, CASES[case][1], tp)


# what the installed release serves; where the table says it fails, its own processing must
PARAMS = [p for p in ALL_PARAMS if status(*p[:3]) == "proven"]
LEFT_OUT = [p for p in ALL_PARAMS if status(*p[:3]) == "fails"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-scales-src")
    return {name: write_checkpoint(root / name, c[1]) for name, c in CASES.items()}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, checkpoints):
    root = tmp_path_factory.mktemp("vllm-scales-out")
    done: dict = {}

    def get(case: str, backend: str, tp: int):
        if (case, backend, tp) not in done:
            out = root / f"{case}-{backend}-{tp}"
            opts = Options(SchemeName(CASES[case][0]), Backend(backend), tp)
            convert(checkpoints[case], out, opts, device="cpu")
            done[case, backend, tp] = out
        return done[case, backend, tp]

    return get


def _vllm_layer(case, backend, tp, rank, checkpoints):
    prefix = CASES[case][2]
    with vm.vllm_context(backend, tp, rank), vm.cpu_swizzle():
        layer = vm.make_layer(prefix, checkpoints[case], tp)
        vm.vllm_load_and_process(layer, checkpoints[case], prefix)
    return layer


@pytest.mark.parametrize(("case", "backend", "tp", "rank"), PARAMS)
def test_vllm_params_equal_fi_convert_bytes(case, backend, tp, rank, checkpoints, outputs):
    layer = _vllm_layer(case, backend, tp, rank, checkpoints)
    vm.assert_holds_output_bytes(layer, outputs(case, backend, tp), CASES[case][2], rank)


# (empty, and so reported as skipped, where the installed release serves every case)
@pytest.mark.parametrize(("case", "backend", "tp", "rank"), LEFT_OUT)
def test_a_release_the_table_leaves_out_fails_in_its_own_processing(
    case, backend, tp, rank, checkpoints
):
    with pytest.raises(RuntimeError, match="shape .* is invalid for input of size"):
        _vllm_layer(case, backend, tp, rank, checkpoints)


@pytest.mark.parametrize(("case", "backend", "tp", "rank"), PARAMS)
def test_plugin_path_leaves_the_layer_as_vllm_does(case, backend, tp, rank, checkpoints, outputs):
    out = outputs(case, backend, tp)
    theirs = _vllm_layer(case, backend, tp, rank, checkpoints)
    with vm.vllm_context(backend, tp, rank), vm.cpu_swizzle():
        ours = vm.plugin_layer(CASES[case][2], checkpoints[case], out, tp)
    vm.assert_same_layer(theirs, ours)

"""fi_convert/schemes/ and the vLLM plugin (fi_convert/servers/vllm/), with the installed vLLM's
own MoE processing where it calls CUDA-only FlashInfer ops (the NVFP4 and MXFP8 scale swizzles):
the same tier as tests/test_vllm.py, with the layers on a CUDA GPU (marker `gpu`, skipped
without one). vLLM's Python code is enough: no kernel runs, its compiled `_C` is not needed
(scripts/device_run.sh carries 0.33's as a zip, and with VLLM_RELEASES other releases', run
with `--server vllm --release X`).

(a) vLLM's parameters equal fi-convert's bytes, for nvfp4 (both backends), mxfp8 (TRT-LLM) and
mxfp4 (gpt-oss, both backends; vLLM's gpt-oss loader does the TP split), TP 1, 2 and 4, every
rank, on sizes that pad H and I; nvfp4 and mxfp8 of gated and of non-gated (Nemotron-H) experts;
(b) for each of them, which the plugin loads, the plugin's path leaves the layer as vLLM's.
"""

from __future__ import annotations

import pytest

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.testing.synthetic import Spec, write_checkpoint

pytestmark = pytest.mark.gpu

CASES = {
    # ModelOpt NVFP4, H 320 (-> 512 on TRT-LLM), I 384 (per rank 192/96, -> 128 at TP 4),
    # 5 experts, expert 4's gate and up global scales differ
    "deepseek-nvfp4": (
        "nvfp4",
        Spec("deepseek-v3", layers=2, experts=5, hidden=320, intermediate=384, quant="nvfp4"),
        "model.layers.1.mlp.experts",
        ("trtllm", "cutlass"),
    ),
    # Nemotron-H ModelOpt NVFP4: non-gated experts (w13 the up projection alone), H 320 (->
    # 512 on TRT-LLM), I 384 (per rank 384, 192, 96: -> 384, 256, 128 on both backends)
    "nemotron-nvfp4": (
        "nvfp4",
        Spec("nemotron-h", layers=1, experts=3, hidden=320, intermediate=384, quant="nvfp4"),
        "backbone.layers.0.mixer.experts",
        ("trtllm", "cutlass"),
    ),
    # ... and MXFP8 (non-gated, the same sizes)
    "nemotron-mxfp8": (
        "mxfp8",
        Spec("nemotron-h", layers=1, experts=3, hidden=320, intermediate=384, quant="mxfp8"),
        "backbone.layers.0.mixer.experts",
        ("trtllm",),
    ),
    # ModelOpt MXFP8, H 320 (-> 512), I 384 (per rank 192 -> 256 at TP 2), 3 experts
    "qwen3-mxfp8": (
        "mxfp8",
        Spec("qwen3-moe", layers=1, experts=3, hidden=320, intermediate=384, quant="mxfp8"),
        "model.layers.0.mlp.experts",
        ("trtllm",),
    ),
    # gpt-oss MXFP4, H 320 (-> 512 TRT-LLM, 384 CUTLASS), I 192 = 6 blocks of 32: per rank 192,
    # 96, 64 (-> 128); at TP 4 rank 3 holds no rows
    "gpt-oss-mxfp4": (
        "mxfp4",
        Spec("gpt-oss", layers=2, experts=3, hidden=320, intermediate=192),
        "model.layers.1.mlp.experts",
        ("trtllm", "cutlass"),
    ),
}
# the user's MoE activation override that makes vLLM pick the path an output is for
MOE_ACTIVATION = {("mxfp4", "cutlass"): "mxfp8"}


def _ctx(vm, case, backend, tp, rank):
    act = MOE_ACTIVATION.get((CASES[case][0], backend))
    return vm.vllm_context(backend, tp, rank, device="cuda", moe_activation=act)


ALL_PARAMS = [
    (case, backend, tp, rank)
    for case, (_, _, _, backends) in CASES.items()
    for backend in backends
    for tp in (1, 2, 4)
    for rank in range(tp)
    if (case, backend, tp) != ("deepseek-nvfp4", "cutlass", 4)  # refused by both, below
]


def _status(case: str, backend: str, tp: int) -> str:
    from tests import vllm_moe as vm

    return vm.release_status(CASES[case][0], backend, CASES[case][1], tp)


# What the installed release serves (the releases table); where the table says its own
# processing fails, it must not hold the bytes; a case the table leaves "not proven" for it is
# not run: to prove it, list the release in the table's row and run these tests there
# (scripts/device_run.sh, VLLM_RELEASES).
PARAMS = [p for p in ALL_PARAMS if _status(*p[:3]) == "proven"]
LEFT_OUT = [p for p in ALL_PARAMS if _status(*p[:3]) == "fails"]


def test_nvfp4_cutlass_that_vllm_cannot_pad_is_refused_by_both(checkpoints, tmp_path):
    """At TP 4 (I/tp = 96) vLLM 0.33 refuses to pad w1/w3 for CUTLASS NVFP4; fi-convert refuses
    to write such an output instead of writing one no vLLM can serve."""
    from fi_convert import LayoutError
    from tests import vllm_moe as vm

    with pytest.raises(NotImplementedError, match="Intermediate size padding for w1 and w3"):
        _vllm_layer(vm, "deepseek-nvfp4", "cutlass", 4, 0, checkpoints)
    opts = Options(SchemeName.NVFP4, Backend.CUTLASS, 4)
    with pytest.raises(LayoutError, match="use --backend trtllm"):
        convert(checkpoints["deepseek-nvfp4"], tmp_path / "out", opts, device="cpu")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-gpu-src")
    return {name: write_checkpoint(root / name, c[1]) for name, c in CASES.items()}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, checkpoints):
    root = tmp_path_factory.mktemp("vllm-gpu-out")
    done: dict = {}

    def get(case: str, backend: str, tp: int):
        if (case, backend, tp) not in done:
            out = root / f"{case}-{backend}-{tp}"
            opts = Options(SchemeName(CASES[case][0]), Backend(backend), tp)
            convert(checkpoints[case], out, opts, device="cpu")
            done[case, backend, tp] = out
        return done[case, backend, tp]

    return get


def _vllm_layer(vm, case, backend, tp, rank, checkpoints):
    prefix = CASES[case][2]
    with _ctx(vm, case, backend, tp, rank):
        layer = vm.make_layer(prefix, checkpoints[case], tp)
        vm.vllm_load_and_process(layer, checkpoints[case], prefix)
    return layer


@pytest.mark.parametrize(("case", "backend", "tp", "rank"), PARAMS)
def test_vllm_params_equal_fi_convert_bytes_on_cuda(case, backend, tp, rank, checkpoints, outputs):
    from tests import vllm_moe as vm

    layer = _vllm_layer(vm, case, backend, tp, rank, checkpoints)
    vm.assert_holds_output_bytes(layer, outputs(case, backend, tp), CASES[case][2], rank)


# (empty, and so reported as skipped, where the installed release serves every case)
@pytest.mark.parametrize(("case", "backend", "tp", "rank"), LEFT_OUT)
def test_a_release_the_table_leaves_out_does_not_hold_the_bytes_on_cuda(
    case, backend, tp, rank, checkpoints, outputs
):
    """Its own processing, with FlashInfer's CUDA swizzles, fails, or holds other bytes."""
    from tests import vllm_moe as vm

    try:
        layer = _vllm_layer(vm, case, backend, tp, rank, checkpoints)
    except (RuntimeError, ValueError, AssertionError) as e:
        print(f"{case} {backend} TP {tp} rank {rank}: the release's own processing fails: {e!r}")
        return
    with pytest.raises(AssertionError):
        vm.assert_holds_output_bytes(layer, outputs(case, backend, tp), CASES[case][2], rank)


@pytest.mark.parametrize(("case", "backend", "tp", "rank"), PARAMS)
def test_plugin_path_leaves_the_layer_as_vllm_does_on_cuda(
    case, backend, tp, rank, checkpoints, outputs
):
    from tests import vllm_moe as vm

    theirs = _vllm_layer(vm, case, backend, tp, rank, checkpoints)
    with _ctx(vm, case, backend, tp, rank):
        ours = vm.plugin_layer(CASES[case][2], checkpoints[case], outputs(case, backend, tp), tp)
    vm.assert_same_layer(theirs, ours)

"""fi_convert/schemes/ and the vLLM plugin (fi_convert/servers/vllm/), with vLLM 0.33's own MoE
code as the authority: real FusedMoE layers from vLLM's factory with a FlashInfer backend, raw
checkpoint tensors through vLLM's `load_weights` and its `process_weights_after_loading`, on CPU
(tests/vllm_moe.py says what is patched: device checks and the TP rank, and for FP8 per-tensor
the one compiled op vLLM's requantization calls).

(a) the parameters vLLM holds equal fi-convert's bytes;
(b) the plugin's path (the artifact's tensors into the layer, kernel setup only) leaves the layer
    exactly as vLLM's own path: every parameter, the MoE config sizes, and every tensor and value
    of the kernel object.
"""

from __future__ import annotations

import pytest

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests import vllm_moe as vm

# (scheme, spec, layer prefix): sizes that need padding (I per rank 96 or 48 -> 128 on TRT-LLM)
# and odd expert counts (Mixtral with 7) where the kernel allows them.
CASES = {
    "qwen3-bf16": (
        "bf16",
        Spec("qwen3-moe", layers=1, experts=6, hidden=128, intermediate=192, shards=1),
        "model.layers.0.mlp.experts",
    ),
    "mixtral-bf16-7": (
        "bf16",
        Spec("mixtral", layers=1, experts=7, hidden=128, intermediate=192, shards=1),
        "model.layers.0.block_sparse_moe.experts",
    ),
    "qwen3-fp8-tensor": (  # ModelOpt FP8; I per rank 200, 100, 50 -> 208, 112, 64
        "fp8-tensor",
        Spec(
            "qwen3-moe",
            layers=1,
            experts=6,
            hidden=128,
            intermediate=200,
            shards=1,
            quant="fp8-tensor",
        ),
        "model.layers.0.mlp.experts",
    ),
    "qwen3-fp8-tensor-ct": (  # compressed-tensors FP8, tensor strategy, static activations
        "fp8-tensor",
        Spec(
            "qwen3-moe",
            layers=1,
            experts=5,
            hidden=128,
            intermediate=200,
            shards=1,
            quant="fp8-tensor-ct",
        ),
        "model.layers.0.mlp.experts",
    ),
    # Nemotron-H: non-gated (relu2_no_mul) experts, w13 the up projection alone; I per rank
    # 192, 96, 48 -> 256, 128, 128 on TRT-LLM BF16 and on both backends for FP8 per tensor
    "nemotron-bf16": (
        "bf16",
        Spec("nemotron-h", layers=1, experts=5, hidden=128, intermediate=192, shards=1),
        "backbone.layers.0.mixer.experts",
    ),
    # a latent MoE (Nemotron-3 Super/Ultra): the experts run in moe_latent_size (128), not
    # hidden_size (config.json's 512; the synthetic experts are made at the latent size)
    "nemotron-latent-bf16": (
        "bf16",
        Spec(
            "nemotron-h",
            layers=1,
            experts=4,
            hidden=128,
            intermediate=192,
            shards=1,
            config={"moe_latent_size": 128, "hidden_size": 512},
        ),
        "backbone.layers.0.mixer.experts",
    ),
    "nemotron-fp8-tensor": (  # ModelOpt FP8 (as nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8)
        "fp8-tensor",
        Spec(
            "nemotron-h",
            layers=1,
            experts=5,
            hidden=128,
            intermediate=200,
            shards=1,
            quant="fp8-tensor",
        ),
        "backbone.layers.0.mixer.experts",
    ),
    "nemotron-fp8-tensor-ct": (  # compressed-tensors FP8, tensor strategy
        "fp8-tensor",
        Spec(
            "nemotron-h",
            layers=1,
            experts=4,
            hidden=128,
            intermediate=256,
            shards=1,
            quant="fp8-tensor-ct",
        ),
        "backbone.layers.0.mixer.experts",
    ),
    # Nemotron-H in DeepSeek-style block FP8 (non-gated; I per rank 512, 256, 128)
    "nemotron-fp8-block": (
        "fp8-block",
        Spec(
            "nemotron-h",
            layers=1,
            experts=4,
            hidden=256,
            intermediate=512,
            shards=1,
            quant="fp8-block",
        ),
        "backbone.layers.0.mixer.experts",
    ),
    "deepseek-fp8-block": (
        "fp8-block",
        Spec("deepseek-v3", layers=2, experts=8, hidden=256, intermediate=512, shards=2),
        "model.layers.1.mlp.experts",
    ),
}
PARAMS = [
    (case, backend, tp, rank)
    for case in CASES
    for backend in ("trtllm", "cutlass")
    for tp in (1, 2, 4)
    for rank in range(tp)
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-src")
    return {name: write_checkpoint(root / name, spec) for name, (_, spec, _) in CASES.items()}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, checkpoints):
    root = tmp_path_factory.mktemp("vllm-out")
    done: dict = {}

    def get(case: str, backend: str, tp: int):
        key = (case, backend, tp)
        if key not in done:
            out = root / "-".join(map(str, key))
            scheme = SchemeName(CASES[case][0])
            opts = Options(scheme=scheme, backend=Backend(backend), tp_size=tp)
            convert(checkpoints[case], out, opts, device="cpu")
            done[key] = out
        return done[key]

    return get


def _sm(scheme: str, backend: str) -> int:
    return 90 if (scheme, backend) == ("fp8-block", "cutlass") else 100  # vLLM: SM90 only


def _vllm_layer(case, backend, tp, rank, checkpoints):
    scheme, _, prefix = CASES[case]
    with vm.vllm_context(backend, tp, rank, sm=_sm(scheme, backend)):
        layer = vm.make_layer(prefix, checkpoints[case], tp)
        vm.vllm_load_and_process(layer, checkpoints[case], prefix)
    assert layer.moe_config.moe_parallel_config.tp_rank == rank  # vLLM plays this rank
    return layer


@pytest.mark.parametrize(("case", "backend", "tp", "rank"), PARAMS)
def test_vllm_params_equal_fi_convert_bytes(case, backend, tp, rank, checkpoints, outputs):
    layer = _vllm_layer(case, backend, tp, rank, checkpoints)
    vm.assert_holds_output_bytes(layer, outputs(case, backend, tp), CASES[case][2], rank)


@pytest.mark.parametrize(("case", "backend", "tp", "rank"), PARAMS)
def test_plugin_path_leaves_the_layer_as_vllm_does(case, backend, tp, rank, checkpoints, outputs):
    scheme, _, prefix = CASES[case]
    theirs = _vllm_layer(case, backend, tp, rank, checkpoints)
    with vm.vllm_context(backend, tp, rank, sm=_sm(scheme, backend)):
        ours = vm.plugin_layer(prefix, checkpoints[case], outputs(case, backend, tp), tp)
    vm.assert_same_layer(theirs, ours)


# the cases whose install replaces parameters the layer allocated (FP8 per-tensor: scales of
# another shape than the kernel's)
REPLACING = [c for c in sorted(CASES) if CASES[c][0] == "fp8-tensor"]


@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
@pytest.mark.parametrize("case", REPLACING)
def test_plugin_path_gives_back_the_memory_of_what_it_replaces(case, backend, checkpoints, outputs):
    """Where the install puts another tensor in place of a parameter the layer allocated
    (another shape than the kernel's), the old memory is freed, not kept beside (rank 1 of TP
    2)."""
    scheme, _, prefix = CASES[case]
    with vm.vllm_context(backend, 2, 1, sm=_sm(scheme, backend)):
        replaced = vm.assert_plugin_gives_memory_back(
            prefix, checkpoints[case], outputs(case, backend, 2), 2
        )
    assert replaced > 0

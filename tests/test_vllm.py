"""vLLM 0.33's own MoE code is the authority: real FusedMoE layers from vLLM's factory with a
FlashInfer backend, raw checkpoint tensors through vLLM's `load_weights` and its
`process_weights_after_loading`, on CPU (tests/vllm_moe.py says what is patched: device checks
and the TP rank only).

(a) the parameters vLLM holds equal fi-convert's bytes;
(b) the plugin's path (the artifact's tensors into the layer, kernel setup only) leaves the layer
    exactly as vLLM's own path: every parameter, the MoE config sizes, and every tensor and value
    of the kernel object.
"""

from __future__ import annotations

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.loader import OutputReader
from fi_convert.synthetic import Spec, write_checkpoint
from fi_convert.vllm_plugin import experts as plugin
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


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().view(-1).view(torch.uint8).numpy())


def _vllm_layer(case, backend, tp, rank, checkpoints):
    scheme, _, prefix = CASES[case]
    with vm.vllm_context(backend, tp, rank, sm=_sm(scheme, backend)):
        layer = vm.make_layer(scheme, prefix, checkpoints[case], tp)
        vm.vllm_load_and_process(layer, checkpoints[case], prefix)
    return layer


def _plugin_layer(case, backend, tp, rank, checkpoints, out):
    scheme, _, prefix = CASES[case]
    with vm.vllm_context(backend, tp, rank, sm=_sm(scheme, backend)):
        layer = vm.make_layer(scheme, prefix, checkpoints[case], tp)
        with OutputReader(out) as reader:
            plugin.install(layer, reader, prefix, layer.moe_config.moe_parallel_config.tp_rank)
            plugin.finish(layer, reader.layer(prefix))
    return layer


@pytest.mark.parametrize(("case", "backend", "tp", "rank"), PARAMS)
def test_vllm_params_equal_fi_convert_bytes(case, backend, tp, rank, checkpoints, outputs):
    _, _, prefix = CASES[case]
    layer = _vllm_layer(case, backend, tp, rank, checkpoints)
    assert layer.moe_config.moe_parallel_config.tp_rank == rank  # vLLM plays this rank
    held = vm.params(layer)
    with OutputReader(outputs(case, backend, tp)) as reader:
        names = list(reader.layer(prefix)["tensors"])
        assert sorted(held) == sorted(names)
        for name in names:
            _, shape, dtype = reader.info(prefix, name)
            ours = torch.empty(shape, dtype=dtype)
            reader.read_into(prefix, name, rank, ours)
            assert held[name].dtype == dtype, name
            assert held[name].numel() == ours.numel(), name
            assert _bytes(held[name]) == _bytes(ours), f"{name} differs from vLLM's"


@pytest.mark.parametrize(("case", "backend", "tp", "rank"), PARAMS)
def test_plugin_path_leaves_the_layer_as_vllm_does(case, backend, tp, rank, checkpoints, outputs):
    theirs = _vllm_layer(case, backend, tp, rank, checkpoints)
    ours = _plugin_layer(case, backend, tp, rank, checkpoints, outputs(case, backend, tp))
    a, b = vm.params(theirs), vm.params(ours)
    assert sorted(a) == sorted(b)
    for name in a:
        assert (a[name].dtype, a[name].shape) == (b[name].dtype, b[name].shape), name
        assert _bytes(a[name]) == _bytes(b[name]), name
    for field in ("intermediate_size_per_partition", "hidden_dim", "hidden_dim_unpadded"):
        assert getattr(theirs.moe_config, field) == getattr(ours.moe_config, field), field
    assert (
        type(ours.quant_method.moe_kernel.fused_experts).__name__
        == type(theirs.quant_method.moe_kernel.fused_experts).__name__
    )
    assert vm.kernel_state(ours) == vm.kernel_state(theirs)

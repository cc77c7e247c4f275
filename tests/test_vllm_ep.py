"""fi_convert/servers/vllm/experts.py and fi_convert/format/reader.py: expert parallelism against
vLLM 0.33's own code (tests/vllm_moe.py: its FusedMoE layers on CPU, the MoE's EP rank played as
vLLM makes it from the TP rank without data parallelism).

A `--tp-size 1` output serves every EP size: each rank takes whole experts, the ones vLLM's own
expert map gives it (linear placement, and round-robin). For each rank:
(a) the parameters vLLM holds after its own loading and processing under EP equal the
    output's slices of that rank's experts, byte for byte;
(b) the plugin's path leaves the layer exactly as vLLM's own path (parameters, MoE config
    sizes, the kernel object's every tensor and value, its expert offsets included).
"""

from __future__ import annotations

import pytest

from tests import test_vllm as tv
from tests import vllm_moe as vm

# test_vllm's cases that vLLM runs under EP: odd expert counts that split unevenly (Mixtral's
# 7 over 2 and 4: 4+3, 2+2+2+1), padding on TRT-LLM (I = 192), DeepSeek's FP8 blocks
CASES = {k: tv.CASES[k] for k in ("mixtral-bf16-7", "qwen3-bf16", "deepseek-fp8-block")}
# test_vllm's fixtures: its checkpoints, and its outputs at --tp-size 1, which serve every EP size
checkpoints, outputs = tv.checkpoints, tv.outputs
PARAMS = [
    (case, backend, ep, rank, placement)
    for case in CASES
    for backend in ("trtllm", "cutlass")
    for ep in (2, 4)
    for rank in range(ep)
    for placement in ("linear", "round_robin")
    if placement == "linear" or (ep == 2 and CASES[case][1].experts % 2 == 0)
]
GROUPS = 2  # round-robin: vLLM places so only a model of several expert groups


def _context(case, backend, ep, rank, placement):
    return vm.vllm_context(backend, ep, rank, sm=tv._sm(CASES[case][0], backend), ep=placement)


def _make(case, ep, placement, checkpoints):
    groups = GROUPS if placement == "round_robin" else None
    return vm.make_layer(CASES[case][2], checkpoints[case], ep, groups=groups)


def _vllm_layer(case, backend, ep, rank, placement, checkpoints):
    _, _, prefix = CASES[case]
    with _context(case, backend, ep, rank, placement):
        layer = _make(case, ep, placement, checkpoints)
        vm.vllm_load_and_process(layer, checkpoints[case], prefix)
    pc = layer.moe_config.moe_parallel_config
    assert (pc.use_ep, pc.ep_size, pc.ep_rank, pc.tp_size) == (True, ep, rank, 1)
    assert layer.local_num_experts < layer.global_num_experts
    held = [g for g, local in enumerate(layer._expert_map.tolist()) if local >= 0]
    if placement == "round_robin":  # vLLM placed them so, not linear as its fallback
        assert held == list(range(rank, layer.global_num_experts, ep)), held
    else:
        assert held == list(range(held[0], held[0] + len(held))), held
    return layer


@pytest.mark.parametrize(("case", "backend", "ep", "rank", "placement"), PARAMS)
def test_vllm_params_under_ep_equal_the_output_slices(
    case, backend, ep, rank, placement, checkpoints, outputs
):
    layer = _vllm_layer(case, backend, ep, rank, placement, checkpoints)
    vm.assert_holds_output_bytes(layer, outputs(case, backend, 1), CASES[case][2], 0)


@pytest.mark.parametrize(("case", "backend", "ep", "rank", "placement"), PARAMS)
def test_plugin_path_under_ep_leaves_the_layer_as_vllm_does(
    case, backend, ep, rank, placement, checkpoints, outputs
):
    _, _, prefix = CASES[case]
    theirs = _vllm_layer(case, backend, ep, rank, placement, checkpoints)
    with _context(case, backend, ep, rank, placement):
        ours = vm.plugin_layer(
            prefix,
            checkpoints[case],
            outputs(case, backend, 1),
            ep,
            groups=GROUPS if placement == "round_robin" else None,
        )
    vm.assert_same_layer(theirs, ours)
    assert theirs._expert_map.tolist() == ours._expert_map.tolist()


def test_the_slices_are_the_experts_not_the_first_rows(checkpoints, outputs):
    """The negative control: rank 1's layer read as if it held experts 0..2 holds other bytes
    than vLLM's own (so (b) above would catch a reader that ignored the expert map)."""
    from fi_convert.format.reader import OutputReader
    from fi_convert.servers.vllm import experts as plugin

    case, backend, prefix = "qwen3-bf16", "cutlass", CASES["qwen3-bf16"][2]
    theirs = _vllm_layer(case, backend, 2, 1, "linear", checkpoints)
    with _context(case, backend, 2, 1, "linear"):
        ours = vm.make_layer(prefix, checkpoints[case], 2)
        ours._expert_map[:] = vm.torch.tensor([0, 1, 2, -1, -1, -1], dtype=ours._expert_map.dtype)
        with OutputReader(outputs(case, backend, 1)) as reader:
            plugin.install(ours, reader, prefix, 0)
            plugin.finish(ours, reader.layer(prefix))
    assert theirs.w13_weight.shape == ours.w13_weight.shape
    assert vm._bytes(theirs.w13_weight) != vm._bytes(ours.w13_weight)
    assert vm._bytes(theirs.w2_weight) != vm._bytes(ours.w2_weight)

"""The families fi-convert added (fi_convert/families/*.json) proven by SGLang 0.5.23's own model
classes, on CPU: a tiny checkpoint written by transformers' own `save_pretrained` (tests/
hf_checkpoints.py; quantized as the exporters write it, tests/quantized_checkpoints.py) is
loaded by SGLang's `get_model_loader` twice: the plugin's load of fi-convert's output
(`--server sglang`) and SGLang's default load of the source (its own model class's
`load_weights`, expert mapping and FusedMoE processing). Every parameter, buffer and tensor a
module holds, and each MoE layer's state, must be equal, at TP 1 and 2, every rank
(tests/test_sglang_models.py's harness).

GLM-4.5 (Glm4MoeForCausalLM: DeepSeek's expert names, sigmoid + bias routing) in every scheme
SGLang's plugin loads from a source of that family; MiniMax-M2 (MiniMaxM2ForCausalLM: Mixtral's
w1/w2/w3 names, MiniMax2 routing) in BF16 and FP8 block; ERNIE-4.5-MoE (softmax + bias routing)
and OLMoE (softmax, no renormalization) in BF16.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fi_convert.format.manifest import read
from tests import hf_checkpoints as hf
from tests import quantized_checkpoints as qc
from tests.test_sglang_models import _both, _convert, _differences, _moe, _no_gpu  # noqa: F401
from tests.test_sglang_plugin import registered  # noqa: F401

pytestmark = pytest.mark.usefixtures("registered")

# case: (transformers' model, the source format or None for BF16, sizes)
CASES = {
    "glm-bf16": ("glm4_moe", None, {}),
    # 128x128 blocks: every linear's rows per TP rank a multiple of 128 (attention 2 x 128)
    "glm-fp8-block": (
        "glm4_moe",
        "fp8-block",
        dict(
            hidden_size=128,
            intermediate_size=256,
            moe_intermediate_size=256,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=128,
        ),
    ),
    "glm-nvfp4": ("glm4_moe", "nvfp4", dict(hidden_size=128, moe_intermediate_size=128)),
    "glm-mxfp8": ("glm4_moe", "mxfp8", dict(hidden_size=128, moe_intermediate_size=192)),
    "glm-fp8-tensor": ("glm4_moe", "fp8-tensor", dict(hidden_size=128, moe_intermediate_size=200)),
    "minimax-bf16": ("minimax_m2", None, {}),
    "minimax-fp8-block": (
        "minimax_m2",
        "fp8-block",
        dict(
            hidden_size=128,
            intermediate_size=256,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=128,
        ),
    ),
    "ernie-bf16": ("ernie4_5_moe", None, {}),
    "olmoe-bf16": ("olmoe", None, {}),
}
# the MoE modules SGLang's model builds for each transformers model
# (Nemotron-H is proven at SGLang's MoE level only, tests/test_sglang_non_gated.py: its model
# module cannot be imported on CPU, where the Mamba kernels it imports ask Triton, a stand-in
# here, for the device: sglang/kernels/ops/attention/fla/utils.py, getattr(torch, device))
MOE = {
    "glm4_moe": ["model.layers.1.mlp.experts"],
    "minimax_m2": [f"model.layers.{i}.block_sparse_moe.experts" for i in (0, 1)],
    "ernie4_5_moe": ["model.layers.1.mlp.experts"],  # layer 0 dense (moe_layer_start_index)
    "olmoe": [f"model.layers.{i}.mlp.experts" for i in (0, 1)],
}
# (case, backend, scheme)
RUNS = [
    ("glm-bf16", "trtllm", "bf16"),
    ("glm-bf16", "cutlass", "bf16"),
    ("glm-fp8-block", "trtllm", "fp8-block"),
    ("glm-nvfp4", "trtllm", "nvfp4"),
    ("glm-nvfp4", "cutlass", "nvfp4"),
    ("glm-mxfp8", "trtllm", "mxfp8"),
    ("glm-fp8-tensor", "trtllm", "fp8-tensor"),
    ("glm-fp8-tensor", "cutlass", "fp8-tensor"),
    ("minimax-bf16", "trtllm", "bf16"),
    ("minimax-bf16", "cutlass", "bf16"),
    ("minimax-fp8-block", "trtllm", "fp8-block"),
    ("ernie-bf16", "cutlass", "bf16"),
    ("ernie-bf16", "trtllm", "bf16"),
    ("olmoe-bf16", "cutlass", "bf16"),
]
MODELS = [(*run, tp) for run in RUNS for tp in (1, 2)]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sgl-families-src")
    done: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in done:
            kind, quant, sizes = CASES[case]
            if quant is None:
                done[case] = hf.save(kind, root / case, **sizes)
            else:
                done[case] = qc.write(kind, root / case, quant, **sizes)
        return done[case]

    return get


@pytest.mark.parametrize(("case", "backend", "scheme", "tp"), MODELS)
def test_a_whole_model_of_the_family_equals_sglangs_default_load(
    case, backend, scheme, tp, sources, tmp_path
):
    src, (kind, quant, _) = sources(case), CASES[case]
    out = _convert(src, tmp_path / "out", scheme, backend, tp)
    assert sorted(read(out)["layers"]) == MOE[kind]
    for rank in range(tp):
        ours, theirs = _both(src, out, quant or "bf16", backend, tp, rank)
        moe = _moe(theirs)
        assert sorted(moe) == MOE[kind]
        assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
        assert _differences(ours, theirs) == ([], {}), f"rank {rank} of {tp}"

"""The tensor forms' families through SGLang 0.5.23's own whole models on CPU
(tests/family_forms_models.py's checkpoints; tests/test_sglang_models.py's way): SGLang's
default load of the source (its model class's `load_weights`: Llama-4's and Qwen3-VL-MoE's
transposes, Granite-MoE's input_linear/output_linear) against the plugin's load of
fi-convert's `--server sglang` output; every parameter, buffer and tensor attribute equal,
bf16, TP 1 and 2, every rank. Qwen3-VL-MoE's layers are modules model.layers.L.mlp.experts
built with the checkpoint's prefix model.language_model.layers.L.mlp.experts (the plugin
finds them by it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fi_convert import Backend, Options, SchemeName, convert
from tests import family_forms_models as ffm
from tests import hf_checkpoints as hf
from tests import sglang_moe as sm
from tests.conftest import cli
from tests.test_sglang_models import _moe, _tensors
from tests.test_sglang_plugin import _model, differing, registered  # noqa: F401
from tests.test_transformers_ckpts import the_error

pytestmark = pytest.mark.usefixtures("registered")

CASES = [
    (kind, backend, tp)
    for kind in ("llama4", "qwen3_vl_moe", "granitemoe")
    for backend, tp in (("trtllm", 1), ("trtllm", 2), ("cutlass", 2))
]
# the MoE modules SGLang builds for each
MOE = {
    "llama4": ["language_model.model.layers.1.feed_forward.experts"],
    "qwen3_vl_moe": ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"],
    "granitemoe": [
        "model.layers.0.block_sparse_moe.experts",
        "model.layers.1.block_sparse_moe.experts",
    ],
}


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")  # no GPU here: skip its checks


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    base = tmp_path_factory.mktemp("sglang-family-forms")
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = ffm.save(kind, base / kind)
        return made[kind]

    return get


@pytest.mark.parametrize(("kind", "backend", "tp"), CASES)
def test_a_whole_model_equals_sglangs_default_load(ckpt, tmp_path, kind, backend, tp):
    src, out = ckpt(kind), tmp_path / "out"
    opts = Options(SchemeName.BF16, Backend(backend), tp, server="sglang")
    convert(src, out, opts, device="cpu")
    for rank in range(tp):
        with sm.sglang_context(backend, tp, rank):
            ours = _model(None, out, "fi-convert", backend)
            theirs = _model(None, src, "auto", backend)
        moe = _moe(theirs)
        assert sorted(moe) == MOE[kind]
        assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
        # SGLang's own load read the experts (not left as allocated); on TRT-LLM it splits I by
        # the padded size per rank (I 128 at TP 2: rank 0 holds all rows, rank 1 none)
        if rank == 0:
            assert all(m.w13_weight.abs().sum() > 0 for m in moe.values())
        assert differing(_tensors(theirs), _tensors(ours)) == [], f"rank {rank} of {tp}"


def test_dbrx_is_refused_for_sglang_with_sglangs_reason(tmp_path):
    """SGLang 0.5.23's DBRX builds no FusedMoE layer: its DbrxExperts holds `ws`/`w2s` of its
    own and calls the Triton `fused_moe` (so no --moe-runner-backend reaches FlashInfer);
    fi-convert refuses a --server sglang output of it, naming that."""
    with sm.sglang_context("trtllm", 1, 0):  # its imports, on CPU
        from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
        from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_moe
        from sglang.srt.models import dbrx

    assert not issubclass(dbrx.DbrxExperts, FusedMoE)
    assert not any(isinstance(v, type) and issubclass(v, FusedMoE) for v in vars(dbrx).values())
    assert dbrx.fused_moe is fused_moe
    src = hf.save("dbrx", tmp_path / "dbrx")
    res = cli("convert", src, tmp_path / "out", "--server", "sglang")
    assert the_error(res) == (
        "error: --scheme bf16 --backend trtllm --server sglang: SGLang 0.5.23's DBRX "
        "(models/dbrx.py, DbrxExperts) holds its experts in parameters of its own (ws, w2s) and "
        "runs them through its Triton fused_moe, not a FusedMoE layer, so no FlashInfer MoE "
        "runner serves it; or convert for vLLM (--server vllm)"
    )
    assert not (tmp_path / "out").exists()


def test_aria_is_refused_for_sglang_which_has_no_aria(tmp_path):
    """SGLang 0.5.23 registers no Aria model class (nor Jamba's, refused alike in
    tests/test_families.py): a --server sglang output is refused."""
    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.models.registry import ModelRegistry

        archs = set(ModelRegistry.get_supported_archs())
    assert "DbrxForCausalLM" in archs  # (the registry's names, as it lists them)
    assert not {"AriaForConditionalGeneration", "JambaForCausalLM"} & archs
    src = ffm.save("aria", tmp_path / "aria")
    res = cli("convert", src, tmp_path / "out", "--server", "sglang")
    assert the_error(res) == (
        "error: --scheme bf16 --backend trtllm --server sglang: SGLang 0.5.23 has no model "
        "class for Aria (AriaForConditionalGeneration); or convert for vLLM (--server vllm)"
    )


@pytest.mark.parametrize(
    ("backend", "tp"), [("trtllm", 1), ("trtllm", 2), ("cutlass", 1), ("cutlass", 2)]
)
def test_ernie_vl_equals_sglangs_default_load(tmp_path, backend, tp):
    """ERNIE-4.5-VL (tests/family_forms_models.py's checkpoint in the published names) through
    SGLang 0.5.23's whole Ernie4_5_VLMoeForConditionalGeneration: its load_weights splits each
    layer's 2N experts into text_experts and vision_experts (FusedMoE layers of their own I);
    SGLang's default load of the source equals the plugin's load of the output, every
    parameter, buffer and MoE layer state, every rank."""
    from tests.test_sglang_models import _both, _convert, _differences

    ffm.register_ernie45_vl_config()
    src = ffm.save_ernie45_vl(tmp_path / "src")
    out = _convert(src, tmp_path / "out", "bf16", backend, tp)
    moe = ["model.layers.1.mlp.text_experts", "model.layers.1.mlp.vision_experts"]
    for rank in range(tp):
        ours, theirs = _both(src, out, "bf16", backend, tp, rank)
        layers = _moe(theirs)
        assert sorted(layers) == moe
        assert {(m.moe_tp_size, m.moe_tp_rank) for m in layers.values()} == {(tp, rank)}
        assert _differences(ours, theirs) == ([], {}), f"rank {rank} of {tp}"


def test_sglangs_ernie_vl_declares_no_routing_method(tmp_path):
    """SGLang 0.5.23's ERNIE-4.5-VL builds its FusedMoE layers without a routing method, so
    its ModelOpt FP8 method would run Triton on flashinfer_trtllm: fi-convert refuses that
    output (servers/sglang/target.py, NO_ROUTING_METHOD) and takes CUTLASS."""
    import inspect

    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.models import ernie45_moe_vl

    assert "routing_method_type" not in inspect.getsource(ernie45_moe_vl)
    from fi_convert.servers.sglang.target import SglangTarget

    ernie_vl = "Ernie4_5_VLMoeForConditionalGeneration"
    why = SglangTarget().refuses_source("fp8-tensor", "trtllm", "modelopt", [ernie_vl])
    assert why and "ERNIE-4.5-VL declares no routing method" in why
    assert SglangTarget().refuses_source("fp8-tensor", "cutlass", "modelopt", [ernie_vl]) is None

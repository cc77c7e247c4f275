"""fi_convert/source.py and fi_convert/families.py, through the command and `verify`, on
checkpoints no one here wrote: transformers' own `save_pretrained` of the real model classes
(tests/hf_checkpoints.py), converted with the CLI at TP 1 and 2 and checked with `verify
--source --full --against-flashinfer` (every expert re-derived with FlashInfer's own functions).
Plus what fi-convert says to the inputs it does not convert: BF16 gpt-oss (and the vLLM 0.33
facts behind that refusal), a config.json that contradicts its tensors, a folder without
config.json, an fi-convert output, a dense model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from . import hf_checkpoints as hf
from .conftest import ANSI_RE, cli

MANIFEST = "fi-convert-manifest.json"
# our family name for each transformers model, and its first MoE layer
FAMILY = {"qwen3_moe": "qwen3-moe", "mixtral": "mixtral", "deepseek_v3": "deepseek-v3"}
CASES = [(kind, scheme, tp) for kind in FAMILY for scheme in ("bf16", "mxfp8") for tp in (1, 2)]


@pytest.fixture(scope="session")
def hf_ckpt(tmp_path_factory):
    """Each transformers checkpoint, written once per session (on first use)."""
    base = tmp_path_factory.mktemp("transformers")
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = hf.save(kind, base / kind)
        return made[kind]

    return get


def the_error(res) -> str:
    """The one stderr line of a clean user error (exit code 1, no traceback, no stdout)."""
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 1, res.output
    lines = [ln for ln in ANSI_RE.sub("", res.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert res.stdout == ""
    return lines[0]


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------ converts and verifies


@pytest.mark.parametrize(
    ("kind", "scheme", "tp"), CASES, ids=[f"{k}-{s}-tp{t}" for k, s, t in CASES]
)
def test_transformers_checkpoint_converts_and_verifies_against_flashinfer(
    hf_ckpt, tmp_path, kind, scheme, tp
):
    src, out = hf_ckpt(kind), tmp_path / "out"
    assert len(list(src.glob("*.safetensors"))) >= 2  # transformers sharded it
    res = cli("convert", src, out, "--scheme", scheme, "--tp-size", tp, "-q", "--json")
    assert res.exit_code == 0, res.output
    m = json.loads((out / MANIFEST).read_text())
    assert (m["source"]["family"], m["scheme"], m["tp_size"]) == (FAMILY[kind], scheme, tp)
    assert m["layers"], m
    res = cli("verify", out, "--source", src, "--full", "--against-flashinfer", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["ok"] is True, report
    # every expert tensor of every layer and rank was re-derived with FlashInfer's functions
    expected = tp * sum(len(layer["tensors"]) for layer in m["layers"].values())
    assert report["checked"]["tensors_vs_flashinfer"] == expected, report


# ------------------------------------------------------------------------ BF16 gpt-oss

GPT_OSS_BF16 = (
    "BF16 gpt-oss experts (transformers' [E, H, 2I] gate_up_proj with biases) are not "
    "supported: vLLM 0.33 serves them with its Triton MoE only (its FlashInfer TRT-LLM BF16 and "
    "MXFP8 experts take no swigluoai activation, and its FlashInfer CUTLASS BF16 path passes no "
    "expert biases), so there is no FlashInfer layout to write; serve this checkpoint as it is, "
    "or convert the MXFP4 original (--scheme mxfp4)"
)


@pytest.mark.parametrize("args", [(), ("--scheme", "bf16"), ("--scheme", "mxfp8")])
def test_bf16_gpt_oss_is_refused_in_one_line(hf_ckpt, tmp_path, args):
    src, out = hf_ckpt("gpt_oss"), tmp_path / "out"
    line = the_error(cli("convert", src, out, *args))
    assert line == f"error: model.layers.0.mlp.experts.gate_up_proj: {GPT_OSS_BF16}"
    assert not out.exists()


@pytest.mark.vllm
def test_vllm_serves_bf16_gpt_oss_on_no_flashinfer_backend(hf_ckpt):
    """The facts the refusal above states, from vLLM 0.33's own code: its gpt-oss MoE layer
    (MLPBlock's FusedMoE: BF16, swigluoai, biases) on each FlashInfer backend."""
    from unittest import mock

    import torch
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts import flashinfer_cutlass_moe, trtllm_fp8_moe

    from . import vllm_moe as vm

    src, prefix = hf_ckpt("gpt_oss"), "model.layers.0.mlp.experts"
    with vm.vllm_context("trtllm", 1, 0), pytest.raises(ValueError, match="SWIGLUOAI activation"):
        vm.make_layer(prefix, src, 1)
    # MXFP8 runs on TRT-LLM's FP8 experts: only the uninterleaved form of the activation
    fp8 = trtllm_fp8_moe.TrtLlmFp8ExpertsBase
    assert not fp8._supports_activation(MoEActivation.SWIGLUOAI)
    assert fp8._supports_activation(MoEActivation.SWIGLUOAI_UNINTERLEAVE)
    # CUTLASS builds the layer, biases included, but hands the kernel neither the biases nor
    # swigluoai's alpha and limit: plain SwiGLU
    with vm.vllm_context("cutlass", 1, 0):
        layer = vm.make_layer(prefix, src, 1)
        vm.process(layer)
        assert layer.w13_bias.shape == (4, 256) and layer.w2_bias.shape == (4, 64)
        experts = layer.quant_method.moe_kernel.impl.fused_experts
        assert isinstance(experts, flashinfer_cutlass_moe.FlashInferExperts)
        seen: dict = {}
        x = torch.zeros(2, 64, dtype=torch.bfloat16)
        with mock.patch.object(
            flashinfer_cutlass_moe, "flashinfer_cutlass_fused_moe", lambda **kw: seen.update(kw)
        ):
            experts.apply(
                output=torch.empty_like(x),
                hidden_states=x,
                w1=layer.w13_weight,
                w2=layer.w2_weight,
                topk_weights=torch.ones(2, 2),
                topk_ids=torch.zeros(2, 2, dtype=torch.int32),
                activation=MoEActivation.SWIGLUOAI,
                global_num_experts=4,
                expert_map=None,
                a1q_scale=None,
                a2_scale=None,
                workspace13=None,
                workspace2=None,
                expert_tokens_meta=None,
                apply_router_weight_on_input=False,
            )
    assert seen["fc1_expert_weights"] is layer.w13_weight
    dropped = ("fc1_expert_biases", "fc2_expert_biases", "swiglu_alpha", "swiglu_limit")
    assert [seen[k] for k in dropped] == [None] * 4


# ------------------------------------------------- what the source is, from config.json


def test_config_that_contradicts_the_tensors_is_refused(hf_ckpt, tmp_path):
    model, out = copy(hf_ckpt("qwen3_moe"), tmp_path / "model"), tmp_path / "out"
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(model_type="mixtral", architectures=["MixtralForCausalLM"])
    (model / "config.json").write_text(json.dumps(cfg))
    line = the_error(cli("convert", model, out))
    assert line == (
        f"error: {model}/config.json says model_type mixtral (MixtralForCausalLM) but the expert "
        "tensors are named as Qwen3-MoE's (model.layers.0.mlp.experts.0.gate_proj.weight); fix "
        "config.json, or if the model is of that family pass a copy of its family file with "
        '"mixtral" in "model_types" (--family FILE.json)'
    )
    assert not out.exists()
    # DeepSeek-V3 and Qwen3-MoE name their experts alike: the other tensors tell which
    model = copy(hf_ckpt("deepseek_v3"), tmp_path / "ds")
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(model_type="mixtral", architectures=["MixtralForCausalLM"])
    (model / "config.json").write_text(json.dumps(cfg))
    line = the_error(cli("inspect", model))
    assert " but the expert tensors are named as DeepSeek-V3's (model.layers.1." in line


def test_the_family_comes_from_config_json_not_the_tensor_names(hf_ckpt):
    # Qwen3-MoE tensors are named as DeepSeek-V3's; config.json says which they are
    res = cli("inspect", hf_ckpt("qwen3_moe"), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["family"] == "qwen3-moe"


def test_folder_without_config_json_is_refused(hf_ckpt, tmp_path):
    model, out = copy(hf_ckpt("mixtral"), tmp_path / "model"), tmp_path / "out"
    (model / "config.json").unlink()
    line = the_error(cli("convert", model, out))
    assert line == (
        f"error: {model}: no config.json; fi-convert takes the model family and sizes from it "
        "and the output needs it - put the model's config.json in the folder (e.g. `hf download "
        f"<repo> config.json --local-dir {model}`)"
    )
    assert not out.exists()


def test_an_output_given_as_the_source_says_so(hf_ckpt, tmp_path):
    out = tmp_path / "out"
    assert cli("convert", hf_ckpt("mixtral"), out, "--tp-size", 2, "-q").exit_code == 0
    line = the_error(cli("convert", out, tmp_path / "again"))
    assert line == (
        f"error: {out}: already an fi-convert output (scheme bf16, backend trtllm, tp 2): nothing "
        "to convert; serve it, or convert the original"
    )
    assert not (tmp_path / "again").exists()


def test_a_dense_model_has_nothing_to_convert(hf_ckpt, tmp_path):
    src, out = hf_ckpt("qwen3"), tmp_path / "out"
    line = the_error(cli("convert", src, out))
    assert line == f"error: no MoE layers in {src}: nothing to convert"
    assert not out.exists()

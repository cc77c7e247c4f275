"""Every fact about SGLang 0.5.23 that the converter needs (`SglangTarget`, a
`fi_convert.target.ServerTarget` registered as "sglang"): the releases whose bytes an SGLang
output holds, the layout variant its load-time processing gives each scheme and backend, what
fi-convert does not write for it and why, where it runs, and its launch line. It imports no
SGLang (the converter and the tests read it without SGLang installed), and only the core's
`target` interface and format names.

An output is for one server: the manifest's top-level `server` field ("vllm" or "sglang",
`fi_convert.format.names.server_of`; a manifest without it was written for vLLM). Each
variant here is proven against SGLang's own loading and processing on CPU
(tests/test_sglang.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...families import gated
from ...format.names import DEFAULT_SERVER, SERVER_FIELD, server_of
from ...target import Layout, Refusal, release_rows
from . import releases as rel

__all__ = ["DEFAULT_SERVER", "SERVER_FIELD", "SGLANG", "SGLANG_TARGET", "VLLM", "server_of"]

SGLANG = "sglang"
VLLM = "vllm"

LOAD_FORMAT = "fi-convert"  # python -m sglang.launch_server ... --load-format fi-convert
ENTRY_POINT_GROUP = "sglang.srt.plugins"  # SGLang's general-plugin entry points
ENV_ALLOW_LIST = "SGLANG_PLUGINS"  # SGLang's optional allow-list of plugin names
PLUGIN_NAME = "fi_convert"  # the entry point's name (what SGLANG_PLUGINS must list, if set)

# The release whose load-time processing fi-convert's SGLang layouts follow (`sglang`), and
# FlashInfer's, as the manifest's `target` holds them; beside them the releases proven to hold
# an output's bytes (releases.py: `sglang_releases`, and `sglang_versions`, the PEP 440 range
# of exactly those). SGLang 0.5.23 pins flashinfer-python 0.7.2 (0.5.20 and 0.5.21: 0.6.18,
# 0.5.22: 0.7.1); FlashInfer's MoE byte layouts are the same from 0.6.18 through 0.7.4
# (shared/SPEC.md).
TARGET = {
    "sglang": "0.5.23",
    "flashinfer": "0.7.2",
    "flashinfer_layouts": "0.6.18-0.7.4",
    "flashinfer_versions": ">=0.6.18,<0.7.5",
}
# The target every SGLang output held before the releases were proven one by one: still a
# target `verify` accepts (the plugin serves such an output on every release proven for it)
FORMER_TARGETS = ({**TARGET, rel.VERSIONS_FIELD: "==0.5.23"},)

# --moe-runner-backend for each fi-convert backend
MOE_RUNNER_BACKEND = {"trtllm": "flashinfer_trtllm", "cutlass": "flashinfer_cutlass"}
# ... where a scheme runs FlashInfer's kernels on a runner of its own: gpt-oss MXFP4 is
# SGLang's `flashinfer_mxfp4`, which runs TRT-LLM on SM100 and CUTLASS on SM90 (and, with
# another layout fi-convert does not write, on SM120)
OWN_RUNNER = {("mxfp4", "trtllm"): "flashinfer_mxfp4", ("mxfp4", "cutlass"): "flashinfer_mxfp4"}


def moe_runner_backend(scheme: str, backend: str) -> str:
    """The --moe-runner-backend that runs the scheme with fi-convert's `backend`."""
    return OWN_RUNNER.get((scheme, backend)) or MOE_RUNNER_BACKEND.get(backend, backend)


# What fi-convert writes for SGLang, by (scheme, backend): the layout variant SGLang 0.5.23's
# processing gives (tests/test_sglang.py proves each against SGLang's own, every TP rank).
# BF16 on TRT-LLM: SGLang pads I per rank to 128 and shards I by the padded size; on CUTLASS
# its bytes are vLLM's. DeepSeek FP8 block on TRT-LLM: [up; gate] MajorK, unshuffled, the
# block scales as loaded (unclamped).
LAYOUTS = {
    ("bf16", "trtllm"): Layout(shard_padded=True),
    ("bf16", "cutlass"): Layout(),
    ("fp8-block", "trtllm"): Layout(shard_padded=True, shuffled=False, clamped=False),
    # gpt-oss MXFP4 on flashinfer_mxfp4: vLLM's bytes, the scale padding UE8M0 1.0 (127),
    # the biases under SGLang's names
    ("mxfp4", "trtllm"): Layout(unit_scale_pad=True, weight_bias_names=True),
    # ... on SM90 (FlashInfer's CUTLASS mixed-input GEMM): a layout of its own (I/TP and H
    # padded, [up; gate], weights interleaved, scales folded, BF16 biases) under its names
    ("mxfp4", "cutlass"): Layout(sm90_mixed=True, weight_bias_names=True),
    # ModelOpt NVFP4 on TRT-LLM: I/TP padded to 64 and sharded by it, H as is, SGLang's scalars
    ("nvfp4", "trtllm"): Layout(shard_padded=True, hidden_padded=False, split_scales=True),
    # ... on CUTLASS: vLLM's weights and swizzled block scales, SGLang's scalars; a swizzle
    # that pads (H % 128 for w2, H % 64 for w13) apart, beside the scale as loaded
    ("nvfp4", "cutlass"): Layout(split_scales=True, swizzle_apart=True),
    # ModelOpt MXFP8 (SGLang's native mxfp8 method): I/TP padded to 128 and sharded by it, H as
    # is, the scale padding 0, its scale names
    ("mxfp8", "trtllm"): Layout(
        shard_padded=True, hidden_padded=False, zero_scale_pad=True, scale_inv_names=True
    ),
    # ModelOpt FP8 per-tensor (ModelOptFp8MoEMethod) on TRT-LLM: vLLM's transforms, but I/TP
    # padded to 128 by FusedMoE and sharded by it; its scalars (the w13 activation scale of the
    # input scale its loader reads last, output1 by the reciprocal)
    ("fp8-tensor", "trtllm"): Layout(shard_padded=True, pad_i_128=True, sglang_scalars=True),
    # ... on CUTLASS: w13 [gate; up] as loaded (each half padded to 16), its scalars and names
    ("fp8-tensor", "cutlass"): Layout(gate_up_rows=True, sglang_scalars=True),
}

# Source formats (their `quant_method`; None: an unquantized source) of a scheme that SGLang
# reads with another MoE method than the one proven here (tests/test_sglang.py measured
# ModelOpt MXFP8 and ModelOpt FP8), and why fi-convert writes no output of them for it
SOURCES_REFUSED = {
    ("mxfp8", "compressed-tensors"): (
        "a compressed-tensors MXFP8 source: SGLang {sglang} reads it with a method of its own, "
        "whose layout fi-convert has not proven yet (it has proven ModelOpt's)"
    ),
    ("fp8-tensor", "compressed-tensors"): (
        "a compressed-tensors FP8 source: SGLang {sglang} reads it with "
        "CompressedTensorsW8A8Fp8MoE, which has no FlashInfer per-tensor path (its weights stay "
        "as loaded for a Triton quant info; flashinfer_cutlass refuses the method); fi-convert "
        "writes SGLang's layout of ModelOpt FP8"
    ),
    ("fp8-tensor", "fp8"): (
        "an FP8 (quant_method fp8) per-tensor source: SGLang {sglang} reads it with "
        "Fp8MoEMethod, whose layout fi-convert has not proven yet (it has proven ModelOpt FP8's)"
    ),
    ("fp8-tensor", None): (
        "BF16 experts: SGLang {sglang} quantizes them itself on load (--quantization fp8, "
        "Fp8MoEMethod's online FP8), which lays out no FlashInfer kernel bytes (Triton on "
        "flashinfer_cutlass; on flashinfer_trtllm the weights unshuffled and no output "
        "scales); fi-convert writes SGLang's layout of ModelOpt FP8 checkpoints"
    ),
}

# SGLang's model classes that declare no routing method to their FusedMoE (no
# `routing_method_type=` in models/mixtral.py, glm4_moe_lite.py, minimax_m2.py, ernie4.py,
# ernie45_moe_vl.py, hunyuan_v3.py, olmoe.py, phimoe.py, lfm2_moe.py, afmoe.py, deepseek.py,
# longcat_flash.py, hunyuan.py), so ModelOptFp8MoEMethod runs Triton on flashinfer_trtllm (it runs
# FlashInfer TRT-LLM only for a declared one: Qwen3-MoE's Renormalize, DeepSeek's and GLM-4.5's
# DeepSeekV3, ...). Keyed by architecture, as SGLang picks its model class by config.json's
# `architectures` (models/registry.py), not by `model_type` (LongCat-Flash's published
# config.json has no model_type)
_UNDECLARED = {
    "MixtralForCausalLM": "Mixtral",
    "Glm4MoeLiteForCausalLM": "GLM-4.7-Flash",
    "MiniMaxM2ForCausalLM": "MiniMax-M2",
    "Ernie4_5_MoeForCausalLM": "ERNIE-4.5-MoE",
    "Ernie4_5_VLMoeForConditionalGeneration": "ERNIE-4.5-VL",  # models/ernie45_moe_vl.py
    "HYV3ForCausalLM": "HY v3",
    "OlmoeForCausalLM": "OLMoE",
    "PhiMoEForCausalLM": "Phi-3.5-MoE",
    "Lfm2MoeForCausalLM": "LFM2-MoE",
    "AfmoeForCausalLM": "AFMoE",
    "DeepseekForCausalLM": "DeepSeek-MoE",
    "LongcatFlashForCausalLM": "LongCat-Flash",
    "HunYuanMoEV1ForCausalLM": "Hunyuan-A13B",  # models/hunyuan.py
}
NO_ROUTING_METHOD = {
    arch: (
        f"SGLang {{sglang}}'s {title} declares no routing method, so its ModelOpt FP8 method "
        "runs Triton, not FlashInfer TRT-LLM, on flashinfer_trtllm; use --backend cutlass"
    )
    for arch, title in _UNDECLARED.items()
}

NO_FLASHINFER_ROUTING = ("DeepseekV4",)  # its own MegaMoE path (models/deepseek_v4)
# The activations of gated experts each FlashInfer runner of SGLang 0.5.23 takes: TRT-LLM's
# (moe_runner/flashinfer_trtllm.py: _SUPPORTED_BF16_ACTIVATIONS; _SUPPORTED_FP8_ACTIVATIONS,
# for FP8 per tensor, block FP8 and MXFP8; _SUPPORTED_FP4_ACTIVATIONS) and CUTLASS's
# (flashinfer_cutlass.py: Swiglu, Geglu, Relu2), by fi-convert's names (SGLang's "gelu" is the
# tanh GELU Gemma 4's experts run, vLLM's gelu_tanh). gpt-oss MXFP4 has a runner of its own.
_TRTLLM_FP8 = ("silu", "relu2_no_mul")
TRTLLM_ACTIVATIONS = {
    "bf16": ("silu", "relu2_no_mul"),
    "fp8-tensor": _TRTLLM_FP8,
    "fp8-block": _TRTLLM_FP8,
    "mxfp8": _TRTLLM_FP8,
    "nvfp4": ("silu", "relu2_no_mul", "gelu_tanh"),
}
CUTLASS_ACTIVATIONS = ("silu", "gelu_tanh", "relu2_no_mul", "swigluoai_uninterleave")
# SiTU (Kimi K3's situ experts: models/kimi_k3.py KimiK3MoE builds them with activation situ,
# gemm1_alpha its activation_situ_beta, gemm1_clamp_limit its activation_situ_linear_beta): of
# SGLang's FlashInfer runners only TRT-LLM's FP4 one takes it (flashinfer_trtllm.py:
# _SUPPORTED_FP4_ACTIVATIONS, ActivationType.Situ; its own kernel scales: both GEMM1 scales
# consumed before tanh, scale_c the GEMM2 input's alone); CUTLASS's _activation_type asserts on
# it, TRT-LLM's BF16 and FP8 runners take silu and relu2 alone (TRTLLM_ACTIVATIONS)
SITU_FP4_WHY = (
    "SGLang {sglang}'s TRT-LLM FP4 MoE runner runs situ experts with kernel scales of their own "
    "(moe_runner/flashinfer_trtllm.py: ActivationType.Situ, both GEMM1 scales consumed before "
    "tanh), and fi-convert has not proven an {scheme} output of situ experts against it: serve "
    "the checkpoint as it is"
)
# SwiGLU-OAI on [gate; up] halves (vLLM's swigluoai_uninterleave, MiniMax-M3's experts): SGLang
# builds them as silu experts with gemm1_alpha, gemm1_beta 1.0 and gemm1_clamp_limit,
# gate_up_interleaved False (models/minimax_m3.py), silu's layout; its CUTLASS runner takes
# the three per expert (flashinfer_cutlass.py: materialize_swiglu_params_for_cutlass, from
# unquant.py and modelopt_quant.py; proven through SGLang's own MiniMax-M3 class in BF16,
# tests/test_sglang_families.py), its TRT-LLM BF16 runner has no field for them, and its
# TRT-LLM FP8 per-tensor methods (ModelOpt FP8's, modelopt_quant.py, and compressed-tensors
# W8A8 FP8's) build their FlashInferTrtllmFp8MoeQuantInfo without them, so that kernel runs
# plain silu; its block FP8, MXFP8 (fp8.py: per expert) and ModelOpt NVFP4 TRT-LLM paths pass
# them, but fi-convert has not proven those outputs through SGLang's class with them
OAI_TRTLLM_WHY = {
    "bf16": (
        "SGLang {sglang} runs these experts as silu with SwiGLU-OAI's alpha and clamp "
        "(gemm1_alpha, gemm1_clamp_limit: models/minimax_m3.py), which its TRT-LLM BF16 runner "
        "has no field for (moe_runner/flashinfer_trtllm.py); use --backend cutlass"
    ),
    "fp8-tensor": (
        "SGLang {sglang} runs these experts as silu with SwiGLU-OAI's alpha and clamp "
        "(gemm1_alpha, gemm1_clamp_limit: models/minimax_m3.py), which its TRT-LLM FP8 "
        "per-tensor methods do not hand their kernel (modelopt_quant.py ModelOptFp8MoEMethod "
        "and compressed-tensors W8A8 FP8 build FlashInferTrtllmFp8MoeQuantInfo without "
        "them); use --backend cutlass"
    ),
}
OAI_TRTLLM_UNREAD = (
    "SGLang {sglang} runs these experts as silu with SwiGLU-OAI's alpha and clamp "
    "(gemm1_alpha, gemm1_clamp_limit: models/minimax_m3.py); fi-convert has not proven its "
    "TRT-LLM {scheme} runner with them; use --backend cutlass"
)
# Non-gated experts (Nemotron-H, relu2_no_mul): SGLang runs them on FlashInfer
# (models/nemotron_h.py builds its MoE with is_gated=False; moe_runner/flashinfer_trtllm.py pads
# a non-gated w13 to 128 and skips the interleave, and computes output1 as ones * (1 / a2), not
# vLLM's ones / a2; on CUTLASS it pads I/TP to 16 where vLLM pads non-gated experts to 128).
# fi-convert's layouts of them are proven against SGLang's own processing for these schemes
# (tests/test_sglang_non_gated.py), both backends; the others are refused
NON_GATED_PROVEN = ("bf16", "fp8-tensor")
NON_GATED_WHY = (
    "fi-convert has not proven SGLang {sglang}'s {scheme} layout of non-gated ({activation}) "
    "experts (its MoE runners' is_gated=False path) against its own processing yet; "
    "convert with --scheme " + " or ".join(NON_GATED_PROVEN)
)

# Architectures whose SGLang 0.5.23 model class runs its experts on no FlashInfer MoE kernel
# (or that SGLang has no model class for, or whose model refuses the plugin's load, or whose
# model fi-convert has not run its plugin's load through yet), and why:
# fi-convert writes no SGLang output of them (the plugin would refuse it at load, finding no
# MoE layer, or SGLang's model would)
NO_FLASHINFER_MODEL = {
    # (tests/test_sglang_families.py: test_sglangs_intern_s1_pro_model_is_not_built)
    "InternS1ProForConditionalGeneration": (
        "SGLang {sglang} builds no Intern-S1-Pro model (models/interns1pro.py): its "
        "InternS1ProTextDecoderLayer takes no start_layer, which the Qwen2-MoE model it is "
        "built in passes to every decoder layer (models/qwen2_moe.py), a TypeError; no SGLang "
        "release fi-convert knows serves it"
    ),
    "DbrxForCausalLM": (
        "SGLang {sglang}'s DBRX (models/dbrx.py, DbrxExperts) holds its experts in parameters "
        "of its own (ws, w2s) and runs them through its Triton fused_moe, not a FusedMoE "
        "layer, so no FlashInfer MoE runner serves it"
    ),
    "AriaForConditionalGeneration": (
        "SGLang {sglang} has no model class for Aria (AriaForConditionalGeneration)"
    ),
    "JambaForCausalLM": "SGLang {sglang} has no model class for Jamba (JambaForCausalLM)",
    "LongcatFlashNgramForCausalLM": (
        "SGLang {sglang} has no model class for LongCat-Flash-Lite (LongcatFlashNgramForCausalLM)"
    ),
    "MiMoV2OmniForCausalLM": (
        "SGLang {sglang} has no model class for MiMo-V2-Omni (MiMoV2OmniForCausalLM)"
    ),
    "AXK1ForCausalLM": "SGLang {sglang} has no model class for A.X K1 (AXK1ForCausalLM)",
    "LagunaForCausalLM": (
        "SGLang {sglang}'s Laguna model (models/laguna.py, load_weights) counts the routed "
        "experts' w1/w2/w3 tensors it is handed and refuses a load without them, which is how "
        "fi-convert's SGLang plugin fills its MoE layers; convert with --server vllm, or serve "
        "the checkpoint as it is"
    ),
    "Param2MoEForCausalLM": "SGLang {sglang} has no model class for Param2 (Param2MoEForCausalLM)",
    "FlexOlmoForCausalLM": "SGLang {sglang} has no model class for FlexOlmo (FlexOlmoForCausalLM)",
    "Kolibri1ForCausalLM": "SGLang {sglang} has no model class for Kolibri1 (Kolibri1ForCausalLM)",
    "BeamForCausalLM": (
        "SGLang {sglang}'s Beam model (models/beam.py) runs BF16 and FP8 experts on its auto or "
        "Triton MoE runner only, refusing FlashInfer's, and takes FlashInfer's TRT-LLM for "
        "ModelOpt NVFP4 alone, whose load through fi-convert's plugin is not proven; convert "
        "with --server vllm, or serve the checkpoint as it is"
    ),
    "PanguUltraMoEForCausalLM": (
        "SGLang {sglang} has no model class for openPangu-Ultra-MoE (PanguUltraMoEForCausalLM)"
    ),
    "PanguProMoEV2ForCausalLM": (
        "SGLang {sglang} has no model class for openPangu Pro MoE V2 (PanguProMoEV2ForCausalLM)"
    ),
    "Step3TextForCausalLM": (
        "SGLang {sglang} has no model class for Step-3's text model (Step3TextForCausalLM: its "
        "models/step3_vl.py serves Step3VLForConditionalGeneration alone)"
    ),
    # served: Step3-VL's config.json names Step3TextForCausalLM in its text_config too, and
    # SGLang takes the top-level architecture, whose class it has
    "Step3VLForConditionalGeneration": "",
    "AfmoeForCausalLM": (
        "SGLang {sglang}'s AFMoE model (models/afmoe.py, AfmoeMoE) holds its experts as "
        "per-expert MLPs and calls its fused_moe function itself, building no FusedMoE "
        "layer, so it never runs FlashInfer's MoE kernels; serve the checkpoint as it is"
    ),
    "DeepseekForCausalLM": (
        "SGLang {sglang}'s DeepSeek-MoE model (models/deepseek.py, DeepseekMoE) holds its "
        "experts as per-expert MLPs and calls its fused_moe function itself, building no "
        "FusedMoE layer, so it never runs FlashInfer's MoE kernels; serve the checkpoint as it is"
    ),
    # DeepSeek-VL2 (config.json's DeepseekVLV2ForCausalLM, which SGLang's DeepseekVL2Config
    # names DeepseekVL2ForCausalLM) and DeepSeek-OCR: their language_config's DeepSeek-V2
    # language model is the DeepSeek-V3 family's
    "DeepseekVLV2ForCausalLM": (
        "SGLang {sglang}'s DeepSeek-VL2 model (models/deepseek_vl2.py) builds its vision tower "
        "with timm (vit_so400m_patch14_siglip_384), which fi-convert's tests do not install, and "
        "DeepSeek-MoE's model, with no FusedMoE layer, where language_config.use_mla is false: "
        "fi-convert has not proven an output of it against SGLang's own load; serve the "
        "checkpoint as it is"
    ),
    "DeepseekOCRForCausalLM": (
        "SGLang {sglang}'s DeepSeek-OCR model (models/deepseek_ocr.py) builds DeepSeek-MoE's "
        "model, with no FusedMoE layer, where language_config.use_mla is false and its "
        "topk_method is not noaux_tc, beside SAM ViT-B and CLIP-L towers of a fixed size "
        "whatever config.json says: fi-convert has not proven an output of it against SGLang's "
        "own load; serve the checkpoint as it is"
    ),
    # Step-3.5 (tests/test_sglang_families.py: test_sglangs_step3p5_load_asserts_it_filled_the_
    # experts): SGLang runs its clamped layers as silu experts with gemm1_clamp_limit (not
    # vLLM's swiglustep, servers/vllm/target.py), and refuses it for this reason
    "Step3p5ForCausalLM": (
        "SGLang {sglang}'s Step-3.5 load_weights (models/step3p5.py) asserts that it filled every "
        "parameter, the experts' w13 and w2 among them, so it refuses a load that fills the MoE "
        "layers otherwise, as fi-convert's SGLang plugin does; serve the checkpoint as it is"
    ),
    # MiniMax-M3 as published (MiniMaxM3SparseForConditionalGeneration) is proven
    # (tests/test_sglang_families.py); its text model alone has no published checkpoint
    "MiniMaxM3SparseForCausalLM": (
        "SGLang {sglang} has a model class for MiniMax-M3's text model (models/minimax_m3.py), "
        "but no checkpoint of it alone is published and fi-convert has proven SGLang's load of "
        "MiniMax-M3 as published (MiniMaxM3SparseForConditionalGeneration) only; serve the "
        "checkpoint as it is"
    ),
    # (tests/test_sglang_families.py: test_sglangs_gemma4_unified_load_leaves_its_experts_unfilled)
    "Gemma4UnifiedForConditionalGeneration": (
        "SGLang {sglang}'s Gemma 4 Unified (models/gemma4_unified.py) builds Gemma 4's MoE "
        "layers where text_config says enable_moe_block, but its load_weights has no expert "
        "mapping: it skips experts.gate_up_proj, experts.down_proj and router.per_expert_scale "
        "as names it does not hold, so its own load of a MoE checkpoint leaves every expert "
        "unfilled; convert with --server vllm"
    ),
    "InklingForConditionalGeneration": (
        "SGLang {sglang}'s Inkling model runs its BF16 routed experts on its own Triton grouped "
        "GEMM (models/inkling_common/moe.py InklingMoE._forward_routed: moe_tp_forward, over "
        "the interleaved rows as loaded) on flashinfer_trtllm and flashinfer_cutlass, and hands "
        "them to FlashInfer's TRT-LLM kernel only on --moe-runner-backend "
        "flashinfer_trtllm_routed (inkling_common/util.py bf16_routed_uses_stock_fused_moe), "
        "which fi-convert writes no output for; convert with --server vllm, or serve the "
        "checkpoint as it is"
    ),
    "InklingForCausalLM": (
        "SGLang {sglang} has no model class for Inkling's text model (InklingForCausalLM)"
    ),
    "MistralLarge3ForCausalLM": (
        "SGLang {sglang} has a model class for Mistral Large 3 (models/mistral_large_3.py, "
        "DeepSeek-V3's with Mistral's names mapped), but fi-convert has not proven an output of it "
        "against SGLang's own load yet (vLLM 0.33's is proven); convert with --server vllm"
    ),
    "PixtralForConditionalGeneration": (
        "SGLang {sglang} has a model class for Mistral Large 3 as published whole "
        "(models/pixtral.py, PixtralForConditionalGeneration around MistralLarge3ForCausalLM, "
        "DeepSeek-V3's with Mistral's names mapped), but fi-convert has not proven an output of "
        "it against SGLang's own load yet (vLLM 0.33's is proven); convert with --server vllm"
    ),
}

# ... architectures no family file names, which a user's family file (--family) would plan, or
# a family would take as the language model it wraps (Ming-Omni: Ling 2.0's): Step-3.7, whose
# language model is Step-3.5's (tests/test_sglang_families.py:
# test_sglangs_step3p5_load_asserts_it_filled_the_experts)
NO_FAMILY_REFUSED = {
    "Step3p7ForConditionalGeneration": (
        "SGLang {sglang}'s Step-3.7 (models/step3p7.py) loads its language model with Step-3.5's "
        "load_weights (models/step3p5.py), which asserts that it filled every parameter, the "
        "experts' w13 and w2 among them, so it refuses a load that fills the MoE layers "
        "otherwise, as fi-convert's SGLang plugin does; serve the checkpoint as it is"
    ),
    # DeepSeek-VL2 under SGLang's own name of it (its DeepseekVL2Config's; the published
    # config.json says DeepseekVLV2ForCausalLM, refused in NO_FLASHINFER_MODEL for the same reason)
    "DeepseekVL2ForCausalLM": NO_FLASHINFER_MODEL["DeepseekVLV2ForCausalLM"],
    # Ming-Omni, a wrapper over Ling 2.0 (tests/test_sglang_families.py:
    # test_sglangs_own_load_of_ming_omni_fails): converted as Ling 2.0 otherwise
    "BailingMMNativeForConditionalGeneration": (
        "SGLang {sglang} cannot load Ming-Omni (models/bailing_mm.py): its load_weights takes "
        "the return of BailingMoeV2ForCausalLM.load_weights (None) and logs len() of it, a "
        "TypeError after every load, of the checkpoint as of an output; no SGLang release "
        "fi-convert knows serves it, nor vLLM (--server vllm: no release's registry has it)"
    ),
    "BailingMM2NativeForConditionalGeneration": (
        "SGLang {sglang} cannot load Ming-Omni 2 (models/bailing_mm.py, Ming-Omni's subclass): "
        "its load_weights logs len() of BailingMoeV2ForCausalLM.load_weights' return (None), a "
        "TypeError after every load, of the checkpoint as of an output; no SGLang release "
        "fi-convert knows serves it, nor vLLM (--server vllm: no release's registry has it)"
    ),
}

# ... and those refused by what config.json says of the model, beside its architecture: (the
# architecture config.json itself names, the field, the values refused (None: any value but
# null), why). Kimi Linear (models/kimi_linear.py): its KimiMoE builds the routed experts of
# hidden_size with no routed_expert_down_proj / _up_proj (routed_expert_hidden_size, which its
# KimiLinearConfig holds, is read by nothing else), and raises on any hidden_act but silu
CONFIG_REFUSED = (
    (
        "KimiLinearForCausalLM",
        "routed_expert_hidden_size",
        None,
        "SGLang {sglang}'s Kimi Linear (models/kimi_linear.py) ignores config.json's "
        "routed_expert_hidden_size ({value}): its KimiMoE builds the routed experts of "
        "hidden_size, without routed_expert_down_proj or routed_expert_up_proj, so its own "
        "load of a latent Kimi Linear fails on the experts' shapes; convert with --server "
        "vllm, or serve the checkpoint as it is",
    ),
    (
        "KimiLinearForCausalLM",
        "hidden_act",
        ("situ",),
        "SGLang {sglang}'s Kimi Linear (models/kimi_linear.py KimiMoE) raises on any "
        'hidden_act but silu ("Only silu is supported for now"): it builds no situ experts '
        "(config.json's hidden_act is {value}); serve the checkpoint as it is",
    ),
)

NO_FLASHINFER = {
    ("fp8-block", "cutlass"): (
        "SGLang 0.5.23 has no FlashInfer CUTLASS path for block FP8 (asked for "
        "flashinfer_cutlass, it runs its Triton MoE runner on the weights as loaded)"
    ),
    ("mxfp8", "cutlass"): (
        "SGLang 0.5.23 has no FlashInfer CUTLASS path for MXFP8 experts (it runs them on "
        "FlashInfer TRT-LLM, or on its own kernels)"
    ),
}

# What the plugin loads, by (scheme, backend): the SGLang MoE method whose end state it builds
# (class name), each proven against SGLang's own processing (tests/test_sglang_plugin.py).
METHODS = {
    ("bf16", "trtllm"): "UnquantizedFusedMoEMethod",
    ("bf16", "cutlass"): "UnquantizedFusedMoEMethod",
    ("fp8-block", "trtllm"): "Fp8MoEMethod",
    ("mxfp4", "trtllm"): "Mxfp4MoEMethod",
    ("mxfp4", "cutlass"): "Mxfp4MoEMethod",
    ("nvfp4", "trtllm"): "ModelOptNvFp4FusedMoEMethod",
    ("nvfp4", "cutlass"): "ModelOptNvFp4FusedMoEMethod",
    ("mxfp8", "trtllm"): "Fp8MoEMethod",
    ("fp8-tensor", "trtllm"): "ModelOptFp8MoEMethod",
    ("fp8-tensor", "cutlass"): "ModelOptFp8MoEMethod",
}

# Where SGLang 0.5.23 runs FlashInfer's MoE kernels (as fi-convert's manifests name families):
# TRT-LLM-gen on the SM10x family only; CUTLASS BF16 on SM90, SM10x and SM12x; gpt-oss
# MXFP4's SM90 layout on SM90 only (SM120 runs another, SM100 TRT-LLM).
GPU_FAMILY = {
    ("bf16", "trtllm"): "sm100",
    ("bf16", "cutlass"): "sm90+",
    ("fp8-block", "trtllm"): "sm100",
    ("mxfp4", "trtllm"): "sm100",
    ("mxfp4", "cutlass"): "sm90",
    ("nvfp4", "trtllm"): "sm100",
    ("nvfp4", "cutlass"): "sm100+",  # FlashInfer's CUTLASS FP4 MoE: SM10x and SM12x
    ("mxfp8", "trtllm"): "sm100",
    ("fp8-tensor", "trtllm"): "sm100",
    ("fp8-tensor", "cutlass"): "sm90+",  # FlashInfer's CUTLASS FP8 MoE: SM90, SM10x, SM12x
}

NOTE = (
    "MoE experts pre-shuffled into FlashInfer kernel layouts by fi-convert for SGLang "
    "{sglang}: serve with `{launch}` (fi-convert's SGLang plugin: fi-convert installed with its "
    "sglang extra)"
)
# Schemes whose experts fi-convert's SGLang plugin serves under expert parallelism (--ep-size
# N, --tp T*N: MoE TP size T), from a --tp-size T output: SGLang 0.5.23 gives EP rank r the
# experts [r*E/N, (r+1)*E/N), with the bytes of TP T, proven against its own EP
# loading and processing on both backends where it has them (tests/test_sglang_ep.py). ModelOpt
# NVFP4's input scales are the exception that holds: SGLang keeps them for every expert on
# every rank (`_sglang_require_global_experts`), so its maxima over them are the output's.
EP_SCHEMES = ("bf16", "fp8-block", "nvfp4", "mxfp8", "mxfp4")
# ... not ModelOpt FP8 per-tensor: its processing takes the activation scales' max over the
# experts a rank loads, another value on each EP rank than the output's max over all
EP_REFUSED = {
    "fp8-tensor": (
        "its activation scales are the max over all experts, and under EP SGLang takes the max "
        "over each rank's own"
    ),
}
EP_NOTE = (
    "any EP size that divides the expert count (--tp = --tp-size x --ep-size): SGLang's EP "
    "ranks take whole experts, whose bytes do not change"
)
FP8_TENSOR_EP_NOTE = (
    "EP size 1: activation scales are the max over all experts; under EP SGLang takes the max "
    "over a rank's local experts"
)
# the note of every SGLang output before the plugin served EP_SCHEMES under EP: still
# accepted in their manifests (an older output of them serves under EP as well)
NO_EP_NOTE = (
    "EP size 1: fi-convert's SGLang plugin does not load experts under expert parallelism yet"
)
FORMER_EP_NOTES = (NO_EP_NOTE,)


def sglang_fields(manifest: Mapping) -> dict:
    """The manifest fields that make an output SGLang's: `server` and `target` (as the
    converter writes them with --server sglang, for the output's scheme, backend and layers)."""
    scheme, backend = str(manifest["scheme"]), str(manifest["backend"])
    fields = {**SGLANG_TARGET.target_fields(scheme, backend), **rel.release_fields(manifest)}
    return {SERVER_FIELD: SGLANG, "target": fields}


# Backends on which SGLang 0.5.23 may fuse a layer's shared expert into its routed experts
# (DeepSeek-V3/R1's 256 experts: `resolve_shared_experts_config`); the output holds the routed
# experts only, so the launch line turns fusion off (on flashinfer_trtllm SGLang turns it off
# itself, arg_groups/overrides.py `_moe_runner_fusion_disable`; gpt-oss has no shared expert)
FUSION_OFF = ("cutlass",)


def launch_command(where: str, scheme: str, backend: str, tp: int, ep: int = 0) -> str:
    """The SGLang line that serves an output (a folder or a Hub repo id); with `ep`, with
    expert parallelism over `ep` ranks (`--tp tp*ep --ep-size ep`: an output of EP_SCHEMES,
    its TP size SGLang's MoE TP size)."""
    cmd = f"python -m sglang.launch_server --model-path {where} --load-format {LOAD_FORMAT} "
    cmd += f"--moe-runner-backend {moe_runner_backend(scheme, backend)}"
    cmd += f" --tp {tp * ep} --ep-size {ep}" if ep else f" --tp {tp}" if tp != 1 else ""
    return cmd + (" --disable-shared-experts-fusion" if backend in FUSION_OFF else "")


class SglangTarget:
    """SGLang 0.5.23 as a `fi_convert.target.ServerTarget`."""

    name = SGLANG
    label = "SGLang"
    versions = TARGET
    ep_schemes: tuple[str, ...] = EP_SCHEMES
    former_ep_notes = FORMER_EP_NOTES
    former_targets = FORMER_TARGETS

    def release_fields(self, manifest: Mapping) -> dict:
        """The target's fields naming the releases proven to hold the output's bytes (its
        scheme, backend and layer entries): `sglang_releases` and `sglang_versions`."""
        return rel.release_fields(manifest)

    def marker_note(self, scheme: str, backend: str, tp: int) -> str:
        return NOTE.format(
            sglang=TARGET["sglang"], launch=launch_command("DIR", scheme, backend, tp)
        )

    def no_path(self, scheme: str, backend: str) -> str:
        return NO_FLASHINFER.get((scheme, backend), "fi-convert has no such layout of it")

    def refuses(self, scheme: str, backend: str) -> str | None:
        if (scheme, backend) in LAYOUTS:
            return None
        if (scheme, backend) in NO_FLASHINFER:
            return NO_FLASHINFER[scheme, backend]
        return f"fi-convert does not write SGLang {TARGET['sglang']}'s layout of it yet"

    def refuses_source(
        self,
        scheme: str,
        backend: str,
        quant_method: str | None,
        architectures: Sequence[str] = (),
        config: Mapping | None = None,
    ) -> str | None:
        facts = {**NO_FLASHINFER_MODEL, **NO_FAMILY_REFUSED}
        why = _first(facts, architectures) or _config_refused(config or {})
        why = why or SOURCES_REFUSED.get((scheme, quant_method))
        if why is None and (scheme, backend) == ("fp8-tensor", "trtllm"):
            why = _first(NO_ROUTING_METHOD, architectures)
        return why.format(sglang=TARGET["sglang"]) if why else None

    def refuses_moe(
        self, scheme: str, backend: str, routing: str, activation: str, swiglu_limit: float | None
    ) -> str | None:
        if routing in NO_FLASHINFER_ROUTING:
            return f"SGLang {TARGET['sglang']} runs {routing} routing on no FlashInfer MoE kernel"
        if activation == "swigluoai_uninterleave" and backend == "trtllm":
            why = OAI_TRTLLM_WHY.get(scheme, OAI_TRTLLM_UNREAD)
            return why.format(sglang=TARGET["sglang"], scheme=scheme)
        if activation == "situ" and backend == "trtllm" and scheme in ("nvfp4", "mxfp4"):
            return SITU_FP4_WHY.format(sglang=TARGET["sglang"], scheme=scheme)
        takes = CUTLASS_ACTIVATIONS if backend == "cutlass" else TRTLLM_ACTIVATIONS.get(scheme)
        if (
            (scheme != "mxfp4" or activation == "situ")
            and takes is not None
            and activation not in takes
        ):
            runner = moe_runner_backend(scheme, backend)
            return (
                f"SGLang {TARGET['sglang']}'s {runner} MoE runner takes no {activation} "
                f"experts in {scheme} (it takes {', '.join(takes)})"
            )
        if not gated(activation) and scheme not in NON_GATED_PROVEN:
            return NON_GATED_WHY.format(
                sglang=TARGET["sglang"], activation=activation, scheme=scheme
            )
        return None  # its runners take the routing they are given (refuses_source: ModelOpt FP8)

    def moe_kernel(self, scheme: str, backend: str, routing: str) -> str:
        runner = "flashinfer_cutlass" if backend == "cutlass" else "flashinfer_trtllm"
        return f"SGLang's {runner} MoE runner (routing {routing})"

    def layout(self, scheme: str, backend: str) -> Layout:
        return LAYOUTS[scheme, backend]

    def unservable(
        self,
        scheme: str,
        backend: str,
        layers: Sequence[Mapping],
        quant_method: str | None = None,
    ) -> Refusal | None:
        return None  # `refuses` keeps every output the plugin cannot load from being planned

    def gpu_family(self, backend: str, scheme: str) -> str:
        return GPU_FAMILY.get((scheme, backend), "")

    def target_fields(self, scheme: str, backend: str) -> dict:
        return {**TARGET, "gpu_family": self.gpu_family(backend, scheme)}

    def ep_note(self, scheme: str, layers: Mapping[str, dict]) -> str:
        if scheme in EP_SCHEMES:
            return EP_NOTE
        return FP8_TENSOR_EP_NOTE if scheme == "fp8-tensor" else NO_EP_NOTE

    def serve_command(self, where: str, scheme: str, backend: str, tp: int, ep: int = 0) -> str:
        return launch_command(where, scheme, backend, tp, ep)

    def card_rows(self, target: Mapping) -> list[str]:
        rows = release_rows(self.label, target.get("sglang"), target)
        return [*rows, f"| SGLang releases holding these bytes | {_listed(target)} |"]

    def card_section(self, m: Mapping, repo_id: str) -> list[str]:
        """The model card's lines on serving the output with fi-convert's SGLang plugin."""
        scheme, backend, tp, t = m["scheme"], m["backend"], m["tp_size"], m["target"]
        version = m["fi_convert_version"]
        return [
            f"**SGLang.** The expert bytes are those SGLang {t.get('sglang')} with FlashInfer "
            f"{t.get('flashinfer')} holds after `process_weights_after_loading` (not vLLM's: "
            "the two servers' layouts differ for several schemes). Serve it with fi-convert's "
            "SGLang plugin, which loads them straight into the MoE layers and runs kernel setup "
            f"only. fi-convert is not on PyPI: install fi-convert {version} with its `sglang` "
            'extra from a clone of its repository (`pip install ".[sglang]"`) or from its wheel '
            f'(`make wheel`, then `pip install "dist/fi_convert-{version}-py3-none-any.whl'
            '[sglang]"`), then (the plugin fetches the files of this repo into the Hugging '
            "Face cache, or `--download-dir`; `--revision` pins a commit; a local copy of it "
            "serves the same):",
            "",
            "```",
            launch_command(repo_id, scheme, backend, tp),
            "```",
            "",
            *self._ep_lines(repo_id, scheme, backend, tp),
            "The plugin refuses, before loading anything, an SGLang release other than "
            f"{_listed(t)}, another TP size, another `--moe-runner-backend`, "
            f"{self._ep_refused(scheme, tp)}, or a GPU outside the {t.get('gpu_family')} "
            "family. Stock SGLang without `--load-format fi-convert`, and vLLM, must not be "
            "used on this repo.",
            "",
        ]

    def _ep_lines(self, repo_id: str, scheme: str, backend: str, tp: int) -> list[str]:
        """The card's launch line with expert parallelism, where the plugin serves it."""
        if scheme not in EP_SCHEMES or (backend == "cutlass" and tp != 1):
            return []  # (SGLang takes --ep-size 1 or --tp on flashinfer_cutlass)
        return [
            "With expert parallelism (each EP rank holds whole experts; the EP size must "
            f"divide the expert count; here 8 EP ranks, each of TP size {tp}):",
            "",
            "```",
            launch_command(repo_id, scheme, backend, tp, ep=8),
            "```",
            "",
        ]

    def _ep_refused(self, scheme: str, tp: int) -> str:
        if scheme in EP_SCHEMES:
            return "redundant experts (EPLB) or a placement other than trivial"
        return "expert parallelism"


def _config_refused(config: Mapping) -> str | None:
    """Why config.json's fields refuse the model it names itself (CONFIG_REFUSED), the value
    said, or None."""
    archs = config.get("architectures")
    own = archs if isinstance(archs, list) else []
    for arch, key, values, why in CONFIG_REFUSED:
        v = config.get(key)
        if arch in own and v is not None and (values is None or v in values):
            return why.replace("{value}", repr(v))
    return None


def _first(facts: Mapping[str, str], architectures: Sequence[str]) -> str | None:
    """The fact of the first of config.json's architectures that has one (SGLang takes the
    first it has a class for; an empty fact: one it serves, whatever its text_config names);
    one name given as a string is one architecture."""
    names = (architectures,) if isinstance(architectures, str) else architectures
    return next((facts[a] for a in names if a in facts), None) or None


def _listed(target: Mapping) -> str:
    """The releases a target lists (an older one: its range)."""
    releases = target.get(rel.RELEASES_FIELD)
    return ", ".join(releases) if releases else str(target.get(rel.VERSIONS_FIELD))


SGLANG_TARGET = SglangTarget()

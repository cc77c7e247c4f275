"""The families fi-convert added (fi_convert/families/*.json) proven by vLLM 0.33's own model
classes, on CPU: a tiny checkpoint written by transformers' own `save_pretrained` (tests/
hf_checkpoints.py; quantized as ModelOpt's FP8 exporter writes it, tests/
quantized_checkpoints.py) is built as vLLM's own model (Glm4MoeForCausalLM,
MiniMaxM2ForCausalLM, Ernie4_5_MoeForCausalLM, OlmoeForCausalLM: their FusedMoE layers and
expert mappings) twice: vLLM's default load of the source (`DefaultModelLoader.load_weights`,
the model's own `load_weights`) and fi-convert's plugin's load of the output
(`FiConvertModelLoader`), each followed by vLLM's own post-load driver. Every parameter and
buffer, and each MoE layer's kernel and its state (tests/vllm_moe.assert_same_layer), must be
equal, at TP 1 and 2, every rank.

What is patched is what tests/vllm_moe.py patches (device checks, the capability, the TP rank)
and, to build a whole model on a CPU-less platform, the attention backend's name (Triton's;
for DeepSeek-V3.2's sparse MLA, FlashInfer's TRT-LLM sparse MLA, the one vLLM picks on SM100:
the attention layers hold no weights), the platform's device type ("cpu", where DeepSeek-V3.2
allocates its indexer's buffer) and a one-process gloo group for vLLM's pipeline-parallel
checks.

GLM-5 Next's, Step3-VL's, GLM-4.5V's and the Qwen3-Omni-MoE thinker's modules import image
processors (transformers' Glm4v and Qwen2-VL ones, vLLM's Step3-VL one) that import torchvision
(absent from this CPU install): each is imported beside
stand-ins for torchvision's modules
(torchvision_stand_in: permissive modules, gone again after the import; no image is
processed), vLLM's registry entry for its class is that imported class for the test
(_registered_in_process: vLLM's model config inspects a lazily registered class in a
subprocess, without the stand-in), and GLM-5 Next is built with vLLM's JIT warm-up off (its
hyper-connections' TileLang kernels, CUDA's, compiled when warmed up).

Published FP8 block checkpoints (DeepSeek-style 128x128 `weight_scale_inv`: GLM-4.5-FP8 and
GLM-4.7-FP8, MiniMax-M2, MiMo-V2-Flash) quantize the attention, dense and shared-expert linears
too, and vLLM 0.33's CPU kernels for block-FP8 linears need its compiled ops (AMX), which this
install lacks. So the tests give those linears the kernel class vLLM's CUDA list ends on where
no faster one is present, TritonFp8BlockScaledMMKernel (its device check answered yes, as
tests/vllm_moe.py answers the MoE kernels'): a real vLLM class whose post-load processing is
vLLM's own (`process_fp8_weight_block_strategy`, pure PyTorch) and whose GEMM never runs here.
Nothing of the MoE layers is stood in for: their FP8 block processing and kernel state are
vLLM's and FlashInfer's, as in every case.

Mistral Large 3 is written in Mistral's own format (tests/mistral_checkpoints.py: params.json,
consolidated shards, Mistral's names), which vLLM reads itself (its params.json parser, the
model's `hf_to_vllm_mapper`); its MLA layers get FlashInfer's MLA backend and prefill kernel
(vLLM's first MLA prefill choice allocates a GPU workspace when built), their workspace on the
CPU. As published whole (params.json's vision_encoder: pixtral.PixtralForConditionalGeneration
around the text model, bf16 on both backends), its module imported beside the torchvision
stand-in and stand-ins for mistral_common's modules (mistral_common_stand_in: its chat and
tokenizer types, absent from this install, used in processing a prompt only).

Kimi Linear (vllm/models/kimi_k3's KimiLinearForCausalLM: a KDA layer, an MLA layer with the
MoE block, transformers' tensors under the published config.json) is built with two stand-ins
of CUDA its model asks for when built (CUDA_STREAMS: its overlap streams, and its GEMM +
all-reduce kernel switched off), neither touching a weight; where its model pads a rank's share
of the experts' size itself, the plugin refuses the output
(test_kimi_linear_where_vllms_model_pads_a_ranks_share_the_plugin_refuses). Kimi K3
(vllm/models/kimi_k3's KimiK3ForConditionalGeneration: Kimi-K2.5's vision tower over that
language model with a latent MoE, routed experts of routed_expert_hidden_size, tests/
hf_checkpoints.py) with the same stand-ins, bf16 on both backends
(test_kimi_k3s_latent_experts_are_the_ones_vllms_class_builds), and a latent Kimi Linear alone
(KimiLinearForCausalLM, its config.json with routed_expert_hidden_size: bf16 on both backends,
test_a_latent_kimi_linears_experts_are_the_ones_vllms_class_builds; SGLang's class ignores the
key and is refused, tests/test_sglang_families.py). K2 Horizon
(K2HorizonForCausalLM, no public checkpoint found: xLLM's FFN names and K2 Horizon's keys as the
model reads them, tests/remote_code_checkpoints.py, its attention without MoVA) in bf16 on both
backends.

Families proven here: GLM-4.5 (bf16, ModelOpt fp8-tensor, fp8-block), Nemotron-H Puzzle (bf16
on both backends: two MoE layers of other expert counts and sizes, read by vLLM from
block_configs through the config class, tests/remote_code_checkpoints.py), Nemotron Nano VL,
Nano Omni, Omni and Super Omni (nano_nemotron_vl.NemotronH_Nano_VL_V2, the class vLLM's registry
builds all four with; bf16 on both backends: a RADIO tower and the projector mlp1 over Nemotron-H
under language_model, the Omnis with a video embedder and a Parakeet sound encoder, Super Omni's
Nemotron-H a latent MoE; read with a stand-in of the checkpoints' config class as remote code,
auto_map, and a tokenizer, which the model encodes its image tags with when built: tests/
remote_code_checkpoints.py save_nemotron_h_nano_vl; their load_weights returns None, so vLLM's
own load checks no list of loaded parameters, nor does the plugin's), MiniMax-M2 (bf16,
fp8-block), MiMo-V2-Flash (bf16, fp8-block), DeepSeek-V3.2 (bf16; the class vLLM resolves on a
platform that is neither CUDA nor ROCm, DeepseekV3ForCausalLM with the DSA indexer, as
`vllm.models.deepseek_v32` exports it), ERNIE-4.5-MoE, OLMoE, Phi-3.5-MoE, K-EXAONE,
Arcee Trinity (AFMoE), HY v3, LFM2-MoE, Cohere2-MoE, Ling 2.0, Ling v1, DeepSeek-MoE v1,
Sarvam-30B and Sarvam-105B (bf16, the Sarvams on both backends, Sarvam-105B's MLA on FlashInfer's
MLA backend; the last five with the names and a config module of tests/
remote_code_checkpoints.py, their published config classes being remote code),
LongCat-Flash (bf16 on CUTLASS: its
ZeroExpertRouter's Unspecified routing; the checkpoint as published, the routed experts alone,
its MLA attention on FlashInfer's MLA backend with vLLM's workspace set up as its model runner
does, torch.accelerator.empty_cache a no-op where there is no accelerator), Gemma 4
(Gemma4ForCausalLM, bf16 on CUTLASS: its gelu_tanh experts, fused [E, 2I, H] beside each
layer's dense MLP, and its router's own function, Custom routing; and as published, whole:
gemma4_mm.Gemma4ForConditionalGeneration, its experts under model.language_model., a vision
tower, its module imported beside the torchvision stand-in; and under Gemma 4 Unified's
encoder-free vision embedder, gemma4_unified.Gemma4UnifiedForConditionalGeneration, its
text_config with Gemma 4's MoE keys, which vLLM's Gemma4ForCausalLM builds the MoE layers of:
tests/hf_checkpoints.py; SGLang's class is refused, its load filling no expert), LongCat-Flash-Lite
(LongcatFlashNgramForCausalLM, bf16 on CUTLASS: LongCat-Flash under an n-gram embedding layer,
built for vLLM's V2 model runner, V2_RUNNER; the padding rows of its n-gram table, which
neither load writes, not compared: PADDED_TABLES), MiMo-V2-Omni (MiMoV2OmniForCausalLM) and
Granite 4.0 hybrid (GraniteMoeHybridForCausalLM), bf16 on both backends (the three refused for
SGLang, which has no class of the first two names and whose Granite 4.0 hybrid module this
install cannot import), A.X K1
(AXK1ForCausalLM, bf16 on both backends: DeepSeek-V3's layout, its published post-MLP norm in
every layer, tests/hf_checkpoints.py), Granite-MoE SWA (GraniteMoeSWAForCausalLM, the
registry's GraniteMoeSharedForCausalLM: bf16 on both backends, its fused experts as transformers 5
writes them, sliding windows and attention sinks), Laguna (bf16 on both backends: its router's
bias stored under mlp.experts), Hunyuan-A13B and Kolibri1 (bf16 on CUTLASS: the registry's
TransformersMoEForCausalLM, routing with the model's own function), FlexOlmo (bf16 on CUTLASS)
and Mellum (bf16 on both backends; the same backend, whose MoE block fuser takes their softmax
routers over), Beam (bf16 on both backends: sigmoid + bias routing in groups), HY v4 (bf16
on both backends: MLA with its lightning indexer, hyper-connections, transformers 5's fused
experts with a SwiGLU clamp, the names vLLM reads outside the experts, tests/
hf_checkpoints.py), Param2 (bf16 on both backends: Ling 2.0's names, tests/
remote_code_checkpoints.py), openPangu MoE (bf16 on both backends:
PanguUltraMoEForCausalLM with MLA, PanguProMoEV2ForCausalLM with its learned sink keys and
values, the names vLLM's own load reads: tests/remote_code_checkpoints.py), Ling 2.5
(BailingMoeV25ForCausalLM, bf16 on both backends: Ling 2.0's experts beside linear-attention
and MLA layers, its config class remote code, tests/remote_code_checkpoints.py), Ling 3
(BailingMoeV3ForCausalLM, bf16 on both backends: KDA linear-attention and MLA layers, its
experts' SwiGLU clamped per layer, as fi-convert reads it: test_ling3s_per_layer_clamp_...),
GLM-5 Next (vllm.models.glm5next's Glm5NextForConditionalGeneration and the Glm5NextForCausalLM
it builds as its language model, bf16 on both backends: the whole multimodal model transformers
writes, with the text_config fields vLLM's model reads that transformers' config class does not
write, tests/hf_checkpoints.py), Step3-VL (Step3VLForConditionalGeneration as stepfun-ai/step3
publishes it, bf16 on both backends: Step-3's packed experts in its language model, a layer
vLLM names language_model.layers.L.moe.experts in the module language_model.model.layers.L.
moe.experts, tests/family_forms_models.py), GLM-4.5V (Glm4vMoeForConditionalGeneration, the
whole multimodal model transformers writes; its config.json's text_config with use_qk_norm, which
vLLM's model reads and transformers 5.20's config class does not write) and Qwen3-Omni-MoE (the
whole model transformers writes, which vLLM's registry builds as its thinker,
Qwen3OmniMoeThinkerForConditionalGeneration; the keys vLLM's thinker reads that transformers
5.20's config classes do not write: the vision tower's image_size and apply_vit_abs_pos_embed,
the text model's tie_word_embeddings, tests/hf_checkpoints.py), Qwen4 Exp
(vllm.models.qwen4_exp's Qwen4ExpForConditionalGeneration, the whole multimodal model
transformers writes: gated-delta-net and QSA attention layers, hyper-connections; its QSA
attention's FlashAttention probe answered yes, KERNEL_PROBES, and its top-k scratch buffer not
compared, SCRATCH_BUFFERS), Qwen3.5 MoE (qwen3_5.Qwen3_5MoeForConditionalGeneration, the whole
multimodal model transformers writes, whose config.json has no norm_topk_prob: vLLM
renormalizes, as the family reads it), Kimi-K2.5 (kimi_k25.KimiK25ForConditionalGeneration:
MoonViT 3D over DeepSeek-V3's model under language_model., its published MLA head sizes,
tests/hf_checkpoints.py), Kimi-VL (kimi_vl.KimiVLForConditionalGeneration, the whole model as
published: a MoonViT tower beside DeepSeek-V3's language model under language_model., which
vLLM builds through its registry; its MLA at the published head sizes, tests/
hf_checkpoints.py), each bf16 on both backends, Intern-S2 Preview
(interns2_preview.InternS2PreviewForConditionalGeneration: that model under its own model_type,
its config class remote code, tests/hf_checkpoints.py), MiniCPM-V 4.6 and 4.7
(minicpmv4_6's and minicpmv4_7's classes, transformers' whole models over a Qwen3.5 MoE language
model), MiniCPM-OCR (minicpm_ocr's class: MiniCPM-V 4.6's model under a config.json of model_type
minicpm_ocr, read with a config class for it, OWN_CONFIGS: transformers 5.20 has none, and vLLM
0.33 requires transformers <5.21: a vLLM 0.33 process reads that config.json only through a
config class the checkpoint brings as remote code), Ling 3 VL (bailing_moe_v3_vl's class: Ling 3
beside a vision tower whose patch merger is its norm alone, tests/remote_code_checkpoints.py),
each bf16 on both backends, Cohere2 Vision (cohere2_vision's class, transformers' whole model
over a Cohere2-MoE language model, its SigLIP tower under the published
vision_tower.vision_model.) bf16 on CUTLASS, as Cohere2-MoE, DiffusionGemma
(diffusion_gemma.DiffusionGemmaForConditionalGeneration, the whole block-diffusion model
transformers writes: Gemma 4's MoE layers in its decoder; its module imports torchvision) bf16
on CUTLASS (Gemma 4's gelu_tanh experts and Custom routing), MiniMax-M3
(vllm.models.minimax_m3's MiniMaxM3SparseForConditionalGeneration, the whole model as published,
read with vLLM's own MiniMaxM3Config, which keeps hidden_act swigluoai and moe_layer_freq; its
module imports torchvision: a dense layer, then SwiGLU-OAI experts, swigluoai_uninterleave, beside
a shared expert; tests/hf_checkpoints.py) bf16 on CUTLASS (vLLM's TRT-LLM BF16 kernel lists no
swigluoai_uninterleave: tests/test_families.py), Intern-S1-Pro
(interns1_pro.InternS1ProForConditionalGeneration, the names and config.json keys of the published
checkpoint, its config class remote code, tests/remote_code_checkpoints.py: per-expert experts, a
grouped router, FoPE coefficients; its module imports torchvision) bf16 on CUTLASS (its router's
own function, Custom routing: test_interns1_pros_fope_coefficients_and_grouped_router_are_vllms),
and
Mistral
Large 3 (bf16, in Mistral's own format; its output also served from vLLM's engine arguments,
through the plugin's config parser).

The families' quantized releases fi-convert refuses (test_a_published_quantized_form_...,
their forms in tests/quantized_checkpoints.py PUBLISHED): Hunyuan-A13B-Instruct-FP8 (FP8 static
per tensor, vLLM's Fp8MoEMethod), Laguna-XS.2-FP8 (compressed-tensors block FP8, which no
scheme reads) and Laguna-XS.2-NVFP4 (compressed-tensors NVFP4, vLLM's
CompressedTensorsW4A4Nvfp4MoEMethod): the method is the one vLLM's own FusedMoE builds from
the checkpoint's quantization config (a FusedMoE alone for each: the Hunyuan FP8 and Laguna
NVFP4 whole models cannot be built here, vLLM 0.33 having no CPU kernel for their FP8
per-tensor and NVFP4 linears).

Not proven here, and why:
- Mistral Large 3 in its published FP8 format (`quantization.qformat_weight` fp8_e4m3: every
  linear FP8 with per-tensor `qscale_weight`/`qscale_act`): vLLM 0.33 finds no CPU kernel for
  its per-tensor FP8 linears ("Failed to find a kernel that can implement the ScaledMM linear
  layer"), and fp8-tensor of it is refused for vLLM when planned (vLLM's Fp8MoEMethod, which
  the plugin does not set up yet: test_an_fp8_mistral_format_source_is_refused_...);
- DeepSeek-V3.2 in its published FP8 block format: vLLM 0.33's MLA post-load step
  (`MLAAttention.process_weights_after_loading` -> `split_kv_b_proj` ->
  `get_and_maybe_dequant_weights`) dequantizes a block-FP8 kv_b_proj with `scaled_dequantize`,
  and fails on the block size it is given as a list (`'list' object has no attribute
  'is_per_tensor'`) wherever vLLM uses neither DeepGEMM nor Marlin for the linear (both
  CUDA-only), as on this CPU;
- Ling 2.0 in FP8: its FP8 releases were not checked for their format here (Ling 2.0 is
  proven in BF16, with the names and a config module of tests/remote_code_checkpoints.py:
  transformers 5.20 has no Ling 2.0 model, its checkpoints ship their config class as remote
  code);
- Qwen3-VL-MoE, whole: Qwen3VLMoeForConditionalGeneration imports torchvision, which this
  install lacks (tests/test_vllm_family_forms.py proves its MoE layers through Qwen3MoeModel's
  own load_weights, in BF16); its FP8 release is not written here yet.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from vllm.config import ModelConfig, get_current_vllm_config
from vllm.config.load import LoadConfig
from vllm.distributed import parallel_state as ps
from vllm.model_executor.kernels import linear as linear_kernels
from vllm.model_executor.kernels.linear.scaled_mm.triton import TritonFp8BlockScaledMMKernel
from vllm.model_executor.layers.fused_moe.runner.moe_runner_interface import MoERunnerInterface
from vllm.model_executor.model_loader import get_model_loader
from vllm.model_executor.model_loader.utils import process_weights_after_loading
from vllm.platforms import PlatformEnum, current_platform
from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum
from vllm.v1.worker import workspace

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.servers.vllm.loader import FiConvertModelLoader
from tests import family_forms_models as ffm
from tests import hf_checkpoints as hf
from tests import mistral_checkpoints as mistral
from tests import quantized_checkpoints as qc
from tests import remote_code_checkpoints as rc
from tests import vllm_moe as vm
from tests.inert_cuda import inert_cuda_streams

ATTENTION = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
FP8B = "fp8-block"
REMOTE_CODE = {
    "ling2": rc.save_ling2,
    "ling1": rc.save_ling1,
    "deepseek_v1": rc.save_deepseek_v1,
    "sarvam_moe": rc.save_sarvam_moe,
    "sarvam_mla": rc.save_sarvam_mla,
    "param2": rc.save_param2,
    "nemotron_h_puzzle": rc.save_nemotron_h_puzzle,
    "pangu_ultra": rc.save_pangu_ultra,
    "pangu_pro_v2": rc.save_pangu_pro_v2,
    "ling25": rc.save_ling25,
    "ling3": rc.save_ling3,
    "ling3_vl": rc.save_ling3_vl,
    "k2_horizon": rc.save_k2_horizon,
    "intern_s2_preview": lambda root: hf.save("intern_s2_preview", root),
    "interns1_pro": rc.save_interns1_pro,
    "nemotron_h_nano_vl": rc.save_nemotron_h_nano_vl,
    "nemotron_h_nano_omni": lambda root: rc.save_nemotron_h_nano_vl(
        root, kind="nemotron_h_nano_omni"
    ),
    "nemotron_h_omni": lambda root: rc.save_nemotron_h_nano_vl(root, kind="nemotron_h_omni"),
    "nemotron_h_super_omni": lambda root: rc.save_nemotron_h_nano_vl(
        root, kind="nemotron_h_super_omni"
    ),
}
SPARSE_MLA = "vllm.v1.attention.backends.mla.flashinfer_mla_sparse.FlashInferMLASparseTRTLLMBackend"
MLA = "vllm.v1.attention.backends.mla.flashinfer_mla.FlashInferMLABackend"
BLOCK_SIZES = dict(
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=256,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=128,
)
TRANSFORMERS_MOE = "vllm.model_executor.models.transformers.TransformersMoEForCausalLM"
# case: (transformers' model, vLLM's model class, the source format or None for BF16, sizes)
CASES = {
    "glm-bf16": ("glm4_moe", "glm4_moe.Glm4MoeForCausalLM", None, {}),
    # ModelOpt FP8 per tensor (attention, dense and shared MLPs left BF16 as ModelOpt lists
    # them; DeepSeek-style FP8 block quantizes the attention too, whose FP8 linears vLLM has no
    # CPU kernel for), I 200: padded per rank
    "glm-fp8-tensor": (
        "glm4_moe",
        "glm4_moe.Glm4MoeForCausalLM",
        "fp8-tensor",
        dict(hidden_size=128, moe_intermediate_size=200),
    ),
    "minimax-bf16": ("minimax_m2", "minimax_m2.MiniMaxM2ForCausalLM", None, {}),
    "ernie-bf16": ("ernie4_5_moe", "ernie45_moe.Ernie4_5_MoeForCausalLM", None, {}),
    "olmoe-bf16": ("olmoe", "olmoe.OlmoeForCausalLM", None, {}),
    # Nemotron-H: a Mamba mixer, then non-gated experts (relu2_no_mul), then attention; I 192:
    # padded per rank
    "nemotron-bf16": (
        "nemotron_h",
        "nemotron_h.NemotronHForCausalLM",
        None,
        dict(moe_intermediate_size=192),
    ),
    # ModelOpt FP8 per tensor (as nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8), I 200
    "nemotron-fp8-tensor": (
        "nemotron_h",
        "nemotron_h.NemotronHForCausalLM",
        "fp8-tensor",
        dict(hidden_size=128, moe_intermediate_size=200),
    ),
    # Nemotron-H Puzzle: two MoE layers of other expert counts and sizes (block_configs), read
    # by vLLM through its config class's get_nemotron_h_config_for_layer (remote code)
    "nemotron-puzzle-bf16": ("nemotron_h_puzzle", "nemotron_h.NemotronHForCausalLM", None, {}),
    # Nemotron Nano VL as published: a RADIO tower over Nemotron-H's model under
    # language_model (tests/hf_checkpoints.py), read with its config class as remote code
    # (tests/remote_code_checkpoints.py save_nemotron_h_nano_vl)
    "nemotron-vl-bf16": (
        "nemotron_h_nano_vl",
        "nano_nemotron_vl.NemotronH_Nano_VL_V2",
        None,
        {},
    ),
    # Nemotron Nano Omni and Omni (model_type nemotron_h_omni, its RADIO tower with a video
    # embedder): the same layout under their architectures, which vLLM's registry builds with
    # NemotronH_Nano_VL_V2's class, each read with its config class as remote code
    "nemotron-nano-omni-bf16": (
        "nemotron_h_nano_omni",
        "nano_nemotron_vl.NemotronH_Nano_VL_V2",
        None,
        {},
    ),
    "nemotron-omni-bf16": (
        "nemotron_h_omni",
        "nano_nemotron_vl.NemotronH_Nano_VL_V2",
        None,
        {},
    ),
    # Nemotron Super Omni: Omni's layout over a latent-MoE Nemotron-H (moe_latent_size 64 of
    # hidden 128: the experts' w1 [I, latent], w2 [latent, I]; tests/hf_checkpoints.py)
    "nemotron-super-omni-bf16": (
        "nemotron_h_super_omni",
        "nano_nemotron_vl.NemotronH_Nano_VL_V2",
        None,
        {},
    ),
    # flat experts [E*I, H], w2 turned (DbrxExperts' own weight loader splits them)
    "dbrx-bf16": ("dbrx", "dbrx.DbrxForCausalLM", None, {}),
    # fused experts stored turned (fc1 [E, H, 2I], fc2 [E, I, H]), beside a shared expert
    "aria-bf16": ("aria", "aria.AriaForConditionalGeneration", None, {}),
    # Mamba layers beside the MoE; softmax routing without renormalization (Default)
    "jamba-bf16": ("jamba", "jamba.JambaForCausalLM", None, {}),
    # ERNIE-4.5-VL, the whole multimodal model: its language model's load_weights splits each
    # layer's 2N experts into text_experts and vision_experts, and its mapper names the layers
    # language_model.model.layers.L (tests/family_forms_models.py)
    "ernie-vl-bf16": (
        "ernie4_5_moe_vl",
        "ernie45_vl.Ernie4_5_VLMoeForConditionalGeneration",
        None,
        {},
    ),
    # DeepSeek-style FP8 block, as GLM-4.5-FP8 / GLM-4.7-FP8, MiniMax-M2 and MiMo-V2-Flash are
    # published (every linear but routers and lm_head): 128x128 blocks, so every linear's rows
    # per TP rank a multiple of 128 (attention 2 heads x 128)
    "glm-fp8-block": ("glm4_moe", "glm4_moe.Glm4MoeForCausalLM", "fp8-block", BLOCK_SIZES),
    "minimax-fp8-block": (
        "minimax_m2",
        "minimax_m2.MiniMaxM2ForCausalLM",
        "fp8-block",
        {k: v for k, v in BLOCK_SIZES.items() if k != "moe_intermediate_size"},
    ),
    "mimo-fp8-block": (
        "mimo_v2_flash",
        "mimo_v2.MiMoV2FlashForCausalLM",
        "fp8-block",
        BLOCK_SIZES
        | dict(
            v_head_dim=128,
            swa_num_attention_heads=2,
            swa_num_key_value_heads=2,
            swa_head_dim=128,
            swa_v_head_dim=128,
        ),
    ),
    "mimo-bf16": ("mimo_v2_flash", "mimo_v2.MiMoV2FlashForCausalLM", None, {}),
    "deepseek-v32-bf16": (
        "deepseek_v32",
        "vllm.models.deepseek_v32.DeepseekV32ForCausalLM",
        None,
        {},
    ),
    "phimoe-bf16": ("phimoe", "phimoe.PhiMoEForCausalLM", None, {}),
    "exaone-bf16": ("exaone_moe", "exaone_moe.ExaoneMoeForCausalLM", None, {}),
    "afmoe-bf16": ("afmoe", "afmoe.AfmoeForCausalLM", None, {}),
    "hy-v3-bf16": ("hy_v3", "hy_v3.HYV3ForCausalLM", None, {}),
    "lfm2-bf16": ("lfm2_moe", "lfm2_moe.Lfm2MoeForCausalLM", None, {}),
    "cohere2-bf16": ("cohere2_moe", "cohere2_moe.Cohere2MoeForCausalLM", None, {}),
    # Cohere2 Vision and MiniCPM-V 4.6 and 4.7: transformers' whole models over a Cohere2-MoE
    # and a Qwen3.5 MoE language model (tests/hf_checkpoints.py)
    "cohere2-vision-bf16": (
        "cohere2_vision",
        "cohere2_vision.Cohere2VisionForConditionalGeneration",
        None,
        {},
    ),
    "minicpmv4-6-bf16": (
        "minicpmv4_6",
        "minicpmv4_6.MiniCPMV4_6ForConditionalGeneration",
        None,
        {},
    ),
    "minicpmv4-7-bf16": (
        "minicpmv4_7",
        "minicpmv4_7.MiniCPMV4_7ForConditionalGeneration",
        None,
        {},
    ),
    # MiniCPM-OCR: MiniCPM-V 4.6's model under its own model type (tests/hf_checkpoints.py),
    # read with a config class for it (OWN_CONFIGS: transformers 5.20 has none)
    "minicpm-ocr-bf16": (
        "minicpm_ocr",
        "minicpm_ocr.MiniCPMOcrForConditionalGeneration",
        None,
        {},
    ),
    # Ling 2.0: names and config of tests/remote_code_checkpoints.py
    "ling2-bf16": ("ling2", "bailing_moe.BailingMoeV2ForCausalLM", None, {}),
    "deepseek-v1-bf16": ("deepseek_v1", "deepseek_v2.DeepseekForCausalLM", None, {}),
    "ling1-bf16": ("ling1", "bailing_moe.BailingMoeForCausalLM", None, {}),
    # Sarvam-30B: Ling 2.0's names, one group (sarvam.SarvamMoEForCausalLM: BailingMoe's)
    "sarvam-moe-bf16": ("sarvam_moe", "sarvam.SarvamMoEForCausalLM", None, {}),
    # Sarvam-105B: MLA attention (FlashInfer's MLA backend), its router's bias centred on load
    "sarvam-mla-bf16": ("sarvam_mla", "sarvam.SarvamMLAForCausalLM", None, {}),
    # openPangu-Ultra-MoE: MLA with a q LoRA (FlashInfer's MLA backend), sandwich norms
    "pangu-ultra-bf16": ("pangu_ultra", "openpangu.PanguUltraMoEForCausalLM", None, {}),
    # openPangu Pro MoE V2: its GQA with learned sink keys and values
    "pangu-pro-v2-bf16": ("pangu_pro_v2", "openpangu.PanguProMoEV2ForCausalLM", None, {}),
    # Param2: Ling 2.0's names, its router's bias centred on load
    "param2-bf16": ("param2", "param2moe.Param2MoEForCausalLM", None, {}),
    # Laguna: its router's bias stored under mlp.experts (vLLM's MoERunner holds it)
    "laguna-bf16": ("laguna", "laguna.LagunaForCausalLM", None, {}),
    # Hunyuan-A13B: vLLM's generic Transformers backend (its registry's class for it), the
    # model's own router function (Custom routing): CUTLASS only; its per-layer config lists
    "hunyuan-bf16": ("hunyuan_v1_moe", TRANSFORMERS_MOE, None, {}),
    # Beam: sigmoid + bias routing in groups, a dense layer first
    "beam-bf16": ("beam", "vllm.models.beam.BeamForCausalLM", None, {}),
    # HY v4: MLA with its lightning indexer (sparse MLA), hyper-connections, fused experts
    "hy-v4-bf16": ("hy_v4", "vllm.models.hy_v4.HYV4ForCausalLM", None, {}),
    # FlexOlmo, Kolibri1 and Mellum: vLLM's generic Transformers backend too (Kolibri1's own
    # router: Custom routing; FlexOlmo's and Mellum's softmax routers taken over by vLLM's)
    "flex-olmo-bf16": ("flex_olmo", TRANSFORMERS_MOE, None, {}),
    "kolibri1-bf16": ("kolibri1", TRANSFORMERS_MOE, None, {}),
    "mellum-bf16": ("mellum", TRANSFORMERS_MOE, None, {}),
    # Granite-MoE SWA: fused experts as transformers 5 names them, per-layer sliding windows
    # and attention sinks (vLLM's registry: granitemoeshared.GraniteMoeSharedForCausalLM)
    "granite-swa-bf16": (
        "granitemoe_swa",
        "granitemoeshared.GraniteMoeSharedForCausalLM",
        None,
        {},
    ),
    # LongCat-Flash: zero-computation experts routed beside the real ones (ZeroExpertRouter)
    "longcat-bf16": ("longcat_flash", "longcat_flash.LongcatFlashForCausalLM", None, {}),
    # Mistral Large 3 in Mistral's own format (params.json, consolidated shards, Mistral's
    # names; tests/mistral_checkpoints.py): vLLM reads params.json itself and maps the names
    # (MistralLarge3ForCausalLM.hf_to_vllm_mapper); I 96: padded per rank
    "mistral-large-3-bf16": ("mistral", "mistral_large_3.MistralLarge3ForCausalLM", None, {}),
    # Mistral Large 3 as published whole (params.json's vision_encoder): vLLM builds
    # PixtralForConditionalGeneration around MistralLarge3ForCausalLM; its module imports
    # torchvision (TORCHVISION)
    "pixtral-large-3-bf16": ("mistral", "pixtral.PixtralForConditionalGeneration", None, {}),
    # Gemma 4: fused experts beside the dense MLP, gelu_tanh, its router's own function
    "gemma4-bf16": ("gemma4", "gemma4.Gemma4ForCausalLM", None, {}),
    # DiffusionGemma: Gemma 4's MoE layers in its decoder (vLLM's diffusion_gemma.py builds
    # them as gemma4's Gemma4Model), its encoder's text layers tied to them
    "diffusion-gemma-bf16": (
        "diffusion_gemma",
        "diffusion_gemma.DiffusionGemmaForConditionalGeneration",
        None,
        {},
    ),
    # A.X K1: DeepSeek-V3's layout, MLA on FlashInfer's MLA backend
    "axk1-bf16": ("axk1", "AXK1.AXK1ForCausalLM", None, {}),
    # Ling 2.5: Ling 2.0's experts beside linear-attention and MLA layers (FlashInfer's MLA
    # backend); names and config of tests/remote_code_checkpoints.py
    "ling25-bf16": ("ling25", "bailing_moe_linear.BailingMoeV25ForCausalLM", None, {}),
    # Ling 3: KDA linear-attention and MLA layers, its experts' SwiGLU clamped per layer
    "ling3-bf16": ("ling3", "bailing_moe_v3.BailingMoeV3ForCausalLM", None, {}),
    # Ling 3 VL: Ling 3 under its own names beside a Qwen3-VL-MoE vision tower (tests/
    # remote_code_checkpoints.py save_ling3_vl), read with vLLM's own BailingMoeV3VLConfig
    "ling3-vl-bf16": (
        "ling3_vl",
        "bailing_moe_v3_vl.BailingMoeV3VLForConditionalGeneration",
        None,
        {},
    ),
    # GLM-5 Next, the whole multimodal model transformers writes: KDA and sparse-MLA layers
    # (its indexer), hyper-connections, DeepSeek-V3's MoE with a SwiGLU clamp; its package
    # imported beside a torchvision stand-in (TORCHVISION)
    # Step3-VL as stepfun-ai/step3 publishes it (tests/family_forms_models.py); imported beside
    # the torchvision stand-in too
    "step3-vl-bf16": (
        "step3_vl",
        "step3_vl.Step3VLForConditionalGeneration",
        None,
        {},
    ),
    "glm5-next-bf16": (
        "glm5_next",
        "vllm.models.glm5next.Glm5NextForConditionalGeneration",
        None,
        {},
    ),
    # GLM-4.5V, the whole multimodal model transformers writes (GLM-4.5's MoE under
    # model.language_model, a vision tower); its module imports torchvision (TORCHVISION)
    "glm4v-bf16": ("glm4v_moe", "glm4_1v.Glm4vMoeForConditionalGeneration", None, {}),
    # Qwen3-Omni-MoE, the whole model transformers writes: vLLM's registry builds its thinker
    # (Qwen3OmniMoeThinkerForConditionalGeneration); its module imports torchvision too
    "omni-bf16": (
        "qwen3_omni_moe",
        "qwen3_omni_moe_thinker.Qwen3OmniMoeThinkerForConditionalGeneration",
        None,
        {},
    ),
    # Qwen4 Exp, the whole multimodal model transformers writes (tests/hf_checkpoints.py)
    "qwen4-exp-bf16": (
        "qwen4_exp",
        "vllm.models.qwen4_exp.Qwen4ExpForConditionalGeneration",
        None,
        {},
    ),
    # Qwen3.5 MoE, the whole multimodal model transformers writes (tests/hf_checkpoints.py)
    "qwen3-5-moe-bf16": ("qwen3_5_moe", "qwen3_5.Qwen3_5MoeForConditionalGeneration", None, {}),
    # Kimi-K2.5, as published (tests/hf_checkpoints.py): MoonViT 3D over DeepSeek-V3's model
    # under language_model. (vLLM's DeepseekV3ForCausalLM, built from its text_config)
    "kimi-k25-bf16": ("kimi_k25", "kimi_k25.KimiK25ForConditionalGeneration", None, {}),
    # MiMo-V2-Omni: MiMo-V2-Flash's language model under a vision tower (tests/
    # hf_checkpoints.py); its module imports transformers' Qwen2-VL image processor, which
    # imports torchvision (TORCHVISION)
    "mimo-omni-bf16": ("mimo_v2_omni", "mimo_v2_omni.MiMoV2OmniForCausalLM", None, {}),
    # Granite 4.0 hybrid: Mamba2 and attention layers with Granite-MoE's experts
    "granite-hybrid-bf16": (
        "granitemoehybrid",
        "granitemoehybrid.GraniteMoeHybridForCausalLM",
        None,
        {},
    ),
    # LongCat-Flash-Lite: LongCat-Flash's model under an n-gram embedding input layer (tests/
    # hf_checkpoints.py), built for vLLM's V2 model runner, which its class requires
    "longcat-lite-bf16": (
        "longcat_flash_ngram",
        "longcat_flash_ngram.LongcatFlashNgramForCausalLM",
        None,
        {},
    ),
    # Gemma 4 as published, whole (its experts under model.language_model, a vision tower);
    # its module imports transformers' Gemma4Processor, which imports torchvision (TORCHVISION)
    "gemma4-mm-bf16": ("gemma4_mm", "gemma4_mm.Gemma4ForConditionalGeneration", None, {}),
    # Gemma 4 Unified over Gemma 4's MoE text model (tests/hf_checkpoints.py): its
    # encoder-free vision embedder, the language model built by vLLM's registry as
    # Gemma4ForCausalLM; its module imports transformers' Gemma 4 Unified processor (TORCHVISION)
    "gemma4-unified-bf16": (
        "gemma4_unified",
        "gemma4_unified.Gemma4UnifiedForConditionalGeneration",
        None,
        {},
    ),
    # Kimi-VL, the whole multimodal model as published (tests/hf_checkpoints.py: a MoonViT
    # vision tower beside DeepSeek-V3's language model, which vLLM builds through its registry;
    # its MLA on FlashInfer's MLA backend, at the published head sizes vLLM has prefill kernels
    # for)
    "kimi-vl-bf16": (
        "kimi_vl",
        "kimi_vl.KimiVLForConditionalGeneration",
        None,
        dict(qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    ),
    # Intern-S2 Preview: Qwen3.5 MoE's model under its own model_type and class, its config class
    # remote code (tests/hf_checkpoints.py); its module imports qwen3_5's, torchvision too
    "intern-s2-preview-bf16": (
        "intern_s2_preview",
        "interns2_preview.InternS2PreviewForConditionalGeneration",
        None,
        {},
    ),
    # Kimi Linear: a KDA layer, an MLA layer with the MoE block (vllm/models/kimi_k3)
    "kimi-linear-bf16": ("kimi_linear", "vllm.models.kimi_k3.KimiLinearForCausalLM", None, {}),
    # a latent Kimi Linear (tests/hf_checkpoints.py): the same class alone, its config.json with
    # routed_expert_hidden_size, routed experts of that size (SGLang's is refused)
    "kimi-linear-latent-bf16": (
        "kimi_linear_latent",
        "vllm.models.kimi_k3.KimiLinearForCausalLM",
        None,
        {},
    ),
    # Kimi K3 (tests/hf_checkpoints.py): Kimi-K2.5's vision tower over Kimi Linear's language
    # model (built through vLLM's registry as KimiLinearForCausalLM) with a latent MoE
    "kimi-k3-bf16": ("kimi_k3", "vllm.models.kimi_k3.KimiK3ForConditionalGeneration", None, {}),
    # K2 Horizon: xLLM's FFN (sigmoid + correction bias: MiniMax2), attention without MoVA
    "k2-horizon-bf16": ("k2_horizon", "k2_horizon.K2HorizonForCausalLM", None, {}),
    # Inkling as published (thinkingmachines/Inkling, tests/hf_checkpoints.py): its routed
    # experts stacked with gate and up rows interleaved, shared sink experts beside them, under
    # its vision and audio towers
    "inkling-bf16": (
        "inkling",
        "vllm.models.inkling.InklingForConditionalGeneration",
        None,
        {},
    ),
    # ... its text model alone (vLLM's text-only entry point, InklingForCausalLM)
    "inkling-text-bf16": ("inkling_text", "vllm.models.inkling.InklingForCausalLM", None, {}),
    # MiniMax-M3 as published (tests/hf_checkpoints.py): a dense layer, then a MoE layer of
    # SwiGLU-OAI experts (swigluoai_uninterleave) beside a shared expert, under its vision tower
    "minimax-m3-bf16": (
        "minimax_m3",
        "vllm.models.minimax_m3.MiniMaxM3SparseForConditionalGeneration",
        None,
        {},
    ),
    # Intern-S1-Pro (tests/remote_code_checkpoints.py): Qwen3-VL-MoE's fused experts under its
    # grouped router (its own function: Custom routing) and FoPE rotary coefficients, its vision
    # tower Qwen3-VL's; its module imports qwen3_vl's, which imports torchvision
    "interns1-pro-bf16": (
        "interns1_pro",
        "interns1_pro.InternS1ProForConditionalGeneration",
        None,
        {},
    ),
    # The families' quantized checkpoints as published (tests/quantized_checkpoints.py
    # PUBLISHED), each refused (test_a_published_quantized_form_...): Hunyuan-A13B-Instruct-FP8
    # (AngelSlim's FP8 static per tensor, vLLM's "fp8" method), Laguna-XS.2-FP8 (compressed-
    # tensors FP8 block on the experts), Laguna-XS.2-NVFP4 (compressed-tensors NVFP4 on them)
    "hunyuan-fp8-static": ("hunyuan_v1_moe", TRANSFORMERS_MOE, "fp8-static", {}),
    "laguna-fp8-block-ct": (
        "laguna",
        "laguna.LagunaForCausalLM",
        "fp8-block-ct",
        dict(hidden_size=256, moe_intermediate_size=256),
    ),
    "laguna-nvfp4-ct": (
        "laguna",
        "laguna.LagunaForCausalLM",
        "nvfp4-ct",
        dict(hidden_size=128, moe_intermediate_size=128),
    ),
}
# Cases whose vLLM model asks for CUDA when built, beside the device checks tests/vllm_moe.py
# answers: Kimi Linear's (vllm/models/kimi_k3/nvidia/model.py) makes CUDA streams (to overlap
# its router with work on another stream) and, with VLLM_KIMI_K3_GEMM_AR (on by default), sets
# up a CuTe DSL GEMM + all-reduce kernel (NCCL multicast): the streams are stand-ins here and
# the kernel's switch is off; neither touches a weight. Inkling's (vllm/models/inkling/nvidia/
# moe.py InklingMoE) makes two CUDA events, to join its sink experts' stream to the routed
# experts' one: stand-ins too
CUDA_STREAMS = (
    "kimi-linear-bf16",
    "kimi-linear-latent-bf16",
    "kimi-k3-bf16",
    "inkling-bf16",
    "inkling-text-bf16",
)
# Cases whose vLLM model class requires the V2 model runner (LongCat-Flash-Lite's n-gram state)
V2_RUNNER = ("longcat-lite-bf16",)
# Cases whose vLLM model probes for a CUDA kernel library when built, each probe answered yes
# (no kernel runs while weights load): Qwen4 Exp's QSA attention (nvidia/qsa.py) asks for
# FlashAttention's varlen function, which this CPU install lacks
KERNEL_PROBES = {
    "qwen4-exp-bf16": ("vllm.models.qwen4_exp.nvidia.qsa.is_flash_attn_varlen_func_available",),
}
# (case, backend, scheme): ERNIE-4.5 (Unspecified routing), OLMoE and Jamba (Default) run BF16
# on CUTLASS only (vLLM's monolithic TRT-LLM BF16 kernels take neither routing)
RUNS = [
    ("glm-bf16", "trtllm", "bf16"),
    ("glm-bf16", "cutlass", "bf16"),
    ("glm-fp8-tensor", "trtllm", "fp8-tensor"),
    ("glm-fp8-tensor", "cutlass", "fp8-tensor"),
    ("minimax-bf16", "trtllm", "bf16"),
    ("minimax-bf16", "cutlass", "bf16"),
    ("ernie-bf16", "cutlass", "bf16"),
    ("olmoe-bf16", "cutlass", "bf16"),
    ("nemotron-bf16", "trtllm", "bf16"),
    ("nemotron-bf16", "cutlass", "bf16"),
    ("nemotron-fp8-tensor", "trtllm", "fp8-tensor"),
    ("nemotron-fp8-tensor", "cutlass", "fp8-tensor"),
    ("nemotron-puzzle-bf16", "trtllm", "bf16"),
    ("nemotron-puzzle-bf16", "cutlass", "bf16"),
    ("nemotron-vl-bf16", "trtllm", "bf16"),
    ("nemotron-vl-bf16", "cutlass", "bf16"),
    ("nemotron-nano-omni-bf16", "trtllm", "bf16"),
    ("nemotron-nano-omni-bf16", "cutlass", "bf16"),
    ("nemotron-omni-bf16", "trtllm", "bf16"),
    ("nemotron-omni-bf16", "cutlass", "bf16"),
    ("nemotron-super-omni-bf16", "trtllm", "bf16"),
    ("nemotron-super-omni-bf16", "cutlass", "bf16"),
    ("dbrx-bf16", "trtllm", "bf16"),
    ("dbrx-bf16", "cutlass", "bf16"),
    ("aria-bf16", "trtllm", "bf16"),
    ("aria-bf16", "cutlass", "bf16"),
    ("jamba-bf16", "cutlass", "bf16"),
    ("ernie-vl-bf16", "cutlass", "bf16"),
    ("glm-fp8-block", "trtllm", "fp8-block"),
    ("glm-fp8-block", "cutlass", "fp8-block"),
    ("minimax-fp8-block", "trtllm", "fp8-block"),
    ("minimax-fp8-block", "cutlass", "fp8-block"),
    ("mimo-fp8-block", "trtllm", "fp8-block"),
    ("mimo-bf16", "trtllm", "bf16"),
    ("deepseek-v32-bf16", "trtllm", "bf16"),
    # Phi-3.5-MoE's sparsemixer (Custom routing): BF16 on CUTLASS only
    ("phimoe-bf16", "cutlass", "bf16"),
    ("exaone-bf16", "trtllm", "bf16"),
    ("afmoe-bf16", "trtllm", "bf16"),
    ("hy-v3-bf16", "trtllm", "bf16"),
    ("lfm2-bf16", "trtllm", "bf16"),
    ("cohere2-bf16", "cutlass", "bf16"),
    ("cohere2-vision-bf16", "cutlass", "bf16"),
    ("minicpmv4-6-bf16", "trtllm", "bf16"),
    ("minicpmv4-6-bf16", "cutlass", "bf16"),
    ("minicpmv4-7-bf16", "trtllm", "bf16"),
    ("minicpmv4-7-bf16", "cutlass", "bf16"),
    ("minicpm-ocr-bf16", "trtllm", "bf16"),
    ("minicpm-ocr-bf16", "cutlass", "bf16"),
    ("ling2-bf16", "trtllm", "bf16"),
    # DeepSeek-MoE v1's softmax without renormalization (Default routing): CUTLASS only
    ("deepseek-v1-bf16", "cutlass", "bf16"),
    ("ling1-bf16", "trtllm", "bf16"),
    ("ling1-bf16", "cutlass", "bf16"),
    ("sarvam-moe-bf16", "trtllm", "bf16"),
    ("sarvam-moe-bf16", "cutlass", "bf16"),
    ("sarvam-mla-bf16", "trtllm", "bf16"),
    ("sarvam-mla-bf16", "cutlass", "bf16"),
    ("granite-swa-bf16", "trtllm", "bf16"),
    ("granite-swa-bf16", "cutlass", "bf16"),
    ("hunyuan-bf16", "cutlass", "bf16"),
    ("beam-bf16", "trtllm", "bf16"),
    ("beam-bf16", "cutlass", "bf16"),
    ("hy-v4-bf16", "trtllm", "bf16"),
    ("hy-v4-bf16", "cutlass", "bf16"),
    ("flex-olmo-bf16", "cutlass", "bf16"),
    ("kolibri1-bf16", "cutlass", "bf16"),
    ("mellum-bf16", "trtllm", "bf16"),
    ("mellum-bf16", "cutlass", "bf16"),
    ("laguna-bf16", "trtllm", "bf16"),
    ("laguna-bf16", "cutlass", "bf16"),
    ("param2-bf16", "trtllm", "bf16"),
    ("param2-bf16", "cutlass", "bf16"),
    ("pangu-ultra-bf16", "trtllm", "bf16"),
    ("pangu-ultra-bf16", "cutlass", "bf16"),
    ("pangu-pro-v2-bf16", "trtllm", "bf16"),
    ("pangu-pro-v2-bf16", "cutlass", "bf16"),
    # LongCat-Flash's ZeroExpertRouter (Unspecified routing): BF16 on CUTLASS only
    ("longcat-bf16", "cutlass", "bf16"),
    # Mistral Large 3: softmax + renormalize (RenormalizeNaive), on both backends
    ("mistral-large-3-bf16", "trtllm", "bf16"),
    ("mistral-large-3-bf16", "cutlass", "bf16"),
    ("pixtral-large-3-bf16", "trtllm", "bf16"),
    ("pixtral-large-3-bf16", "cutlass", "bf16"),
    # Gemma 4's gelu_tanh experts and Custom routing: BF16 on CUTLASS only
    ("gemma4-bf16", "cutlass", "bf16"),
    ("diffusion-gemma-bf16", "cutlass", "bf16"),
    ("axk1-bf16", "trtllm", "bf16"),
    ("axk1-bf16", "cutlass", "bf16"),
    ("ling25-bf16", "trtllm", "bf16"),
    ("ling25-bf16", "cutlass", "bf16"),
    ("ling3-bf16", "trtllm", "bf16"),
    ("ling3-bf16", "cutlass", "bf16"),
    ("ling3-vl-bf16", "trtllm", "bf16"),
    ("ling3-vl-bf16", "cutlass", "bf16"),
    ("step3-vl-bf16", "trtllm", "bf16"),
    ("step3-vl-bf16", "cutlass", "bf16"),
    ("glm5-next-bf16", "trtllm", "bf16"),
    ("glm5-next-bf16", "cutlass", "bf16"),
    ("kimi-linear-bf16", "trtllm", "bf16"),
    ("kimi-linear-bf16", "cutlass", "bf16"),
    ("kimi-linear-latent-bf16", "trtllm", "bf16"),
    ("kimi-linear-latent-bf16", "cutlass", "bf16"),
    ("kimi-k3-bf16", "trtllm", "bf16"),
    ("kimi-k3-bf16", "cutlass", "bf16"),
    ("k2-horizon-bf16", "trtllm", "bf16"),
    ("k2-horizon-bf16", "cutlass", "bf16"),
    ("glm4v-bf16", "trtllm", "bf16"),
    ("glm4v-bf16", "cutlass", "bf16"),
    ("omni-bf16", "trtllm", "bf16"),
    ("omni-bf16", "cutlass", "bf16"),
    ("kimi-k25-bf16", "trtllm", "bf16"),
    ("kimi-k25-bf16", "cutlass", "bf16"),
    ("qwen4-exp-bf16", "trtllm", "bf16"),
    ("qwen4-exp-bf16", "cutlass", "bf16"),
    ("qwen3-5-moe-bf16", "trtllm", "bf16"),
    ("qwen3-5-moe-bf16", "cutlass", "bf16"),
    ("kimi-vl-bf16", "trtllm", "bf16"),
    ("kimi-vl-bf16", "cutlass", "bf16"),
    ("gemma4-mm-bf16", "cutlass", "bf16"),
    ("gemma4-unified-bf16", "cutlass", "bf16"),
    ("mimo-omni-bf16", "trtllm", "bf16"),
    ("mimo-omni-bf16", "cutlass", "bf16"),
    ("granite-hybrid-bf16", "trtllm", "bf16"),
    ("granite-hybrid-bf16", "cutlass", "bf16"),
    # LongCat-Flash-Lite: LongCat-Flash's Unspecified routing, CUTLASS only
    ("longcat-lite-bf16", "cutlass", "bf16"),
    ("intern-s2-preview-bf16", "trtllm", "bf16"),
    ("intern-s2-preview-bf16", "cutlass", "bf16"),
    # Inkling's router's own function (Custom routing): BF16 on CUTLASS only
    ("inkling-bf16", "cutlass", "bf16"),
    ("inkling-text-bf16", "cutlass", "bf16"),
    # MiniMax-M3's swigluoai_uninterleave experts: BF16 on CUTLASS only
    ("minimax-m3-bf16", "cutlass", "bf16"),
    # Intern-S1-Pro's grouped router (Custom routing): BF16 on CUTLASS only
    ("interns1-pro-bf16", "cutlass", "bf16"),
]
MODELS = [(*run, tp) for run in RUNS for tp in (1, 2)]


def _one_process_group() -> None:
    """vLLM's parallel groups of one process (its model classes ask the PP group's rank), made
    once, inside a vLLM config's context, and kept."""
    if ps._WORLD is not None:
        return
    vm.make_process_group()
    # what vLLM's model runner sets up at start (MLA attention reserves its workspace in it)
    workspace.init_workspace_manager(torch.device("cpu"))


@pytest.fixture(scope="module", autouse=True)
def _remote_code(tmp_path_factory):
    with rc.modules_cache(tmp_path_factory.mktemp("hf-modules")):
        yield


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-families-src")
    done: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in done:
            kind, _, quant, sizes = CASES[case]
            if kind == "mistral":
                done[case] = mistral.write(root / case, quant, vision=case.startswith("pixtral"))
            elif kind == "ernie4_5_moe_vl":
                done[case] = ffm.save_ernie45_vl(root / case)
            elif kind == "step3_vl":
                done[case] = ffm.save_step3_vl(root / case)
            elif kind in REMOTE_CODE:
                done[case] = REMOTE_CODE[kind](root / case, **sizes)
            elif quant is None:
                save = ffm.save if kind in ffm.MODELS else hf.save  # multimodal: text + vision
                done[case] = save(kind, root / case, **sizes)
            elif quant in qc.PUBLISHED:
                done[case] = qc.write_published(kind, root / case, quant, **sizes)
            else:
                done[case] = qc.write(kind, root / case, quant, **sizes)
        return done[case]

    return get


# cases whose model warms its JIT kernels up when built (GLM-5 Next's hyper-connections:
# TileLang kernels, for CUDA, whose package this install lacks): built with the warm-up off
NO_JIT_WARMUP = ("glm5-next-bf16",)
# cases whose model's package imports transformers' image processors, which import torchvision
# (absent from this CPU install): imported beside a stand-in for it (torchvision_stand_in)
TORCHVISION = (
    "glm5-next-bf16",
    "pixtral-large-3-bf16",
    "step3-vl-bf16",
    "glm4v-bf16",
    "omni-bf16",
    "qwen4-exp-bf16",
    "qwen3-5-moe-bf16",
    "gemma4-mm-bf16",
    "gemma4-unified-bf16",
    "mimo-omni-bf16",
    "intern-s2-preview-bf16",
    "diffusion-gemma-bf16",
    "cohere2-vision-bf16",
    "minicpmv4-6-bf16",
    "minicpmv4-7-bf16",
    "minicpm-ocr-bf16",
    "ling3-vl-bf16",
    "minimax-m3-bf16",
    "interns1-pro-bf16",
    "nemotron-vl-bf16",
    "nemotron-nano-omni-bf16",
    "nemotron-omni-bf16",
    "nemotron-super-omni-bf16",
)
TORCHVISION_MODULES = (
    "torchvision",
    "torchvision.transforms",
    "torchvision.transforms.v2",
    "torchvision.transforms.v2.functional",
    "torchvision.transforms.functional",
)


# cases whose vLLM model reads the checkpoint's tokenizer when built (Nemotron Nano VL's encodes
# its image tags): their model config made with the tokenizer
TOKENIZER = (
    "nemotron-vl-bf16",
    "nemotron-nano-omni-bf16",
    "nemotron-omni-bf16",
    "nemotron-super-omni-bf16",
)


# cases whose config.json's model type transformers 5.20 has no config class for, and the class
# each is read with (registered in transformers' config registry while its model is made:
# _own_config): MiniCPM-OCR's, which vLLM 0.33 takes from transformers (a release newer than
# the <5.21 it requires; so on a vLLM process of its own this config.json is not read)
OWN_CONFIGS = {"minicpm-ocr-bf16": hf.minicpm_ocr_config}


@contextlib.contextmanager
def _own_config(case: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if case not in OWN_CONFIGS:
        yield
        return
    cls = OWN_CONFIGS[case]()
    CONFIG_MAPPING.register(cls.model_type, cls)
    try:
        yield
    finally:
        del CONFIG_MAPPING._extra_content[cls.model_type]


# cases whose model's module imports mistral_common (vLLM's pixtral.py, and the tokenizer module
# it imports, vllm/tokenizers/mistral.py: chat request, image chunk and tokenizer types, used in
# processing a prompt), absent from this CPU install: imported beside stand-ins for any module
# of mistral_common (nothing of them runs while weights load; mistral_common_stand_in)
MISTRAL_COMMON = {"pixtral-large-3-bf16"}


@contextlib.contextmanager
def mistral_common_stand_in():
    """Stand-ins (fi_convert.servers.sglang.stand_ins' permissive module) for every module of
    mistral_common imported meanwhile; they, and the vLLM modules imported meanwhile that took
    them, leave sys.modules again after (the model class imported keeps what it took)."""
    import importlib.abc
    import importlib.machinery
    import sys

    from fi_convert.servers.sglang.stand_ins import _StubModule

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] != "mistral_common":
                return None
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

        def create_module(self, spec):
            module = _StubModule(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module) -> None:
            pass

    assert "mistral_common" not in sys.modules
    before, finder = set(sys.modules), Finder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            if name.startswith(("mistral_common", "vllm.tokenizers.mistral")):
                sys.modules.pop(name)


@contextlib.contextmanager
def torchvision_stand_in():
    """Stand-ins for torchvision's modules (fi_convert.servers.sglang.stand_ins' permissive
    module) while a vLLM model's package is imported: its image processors import torchvision
    at the top, and nothing of them runs here (the model is built from its config and loads its
    weights; no image is processed). They leave sys.modules again, as torch and transformers
    must keep finding no torchvision afterwards (transformers caches its answer: asked first,
    before the stand-ins lie in sys.modules)."""
    import importlib.machinery
    import sys

    from transformers.utils import import_utils

    from fi_convert.servers.sglang.stand_ins import _StubModule

    assert not import_utils.is_torchvision_available()  # (cached: stays so)
    added = [n for n in TORCHVISION_MODULES if n not in sys.modules]
    for name in added:
        module = _StubModule(name)
        module.__path__ = []
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        sys.modules[name] = module
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


@contextlib.contextmanager
def _registered_in_process(model_cls):
    """vLLM's registry entry of the class's architecture as the class imported here, for the
    test only: vLLM's model config inspects a lazily registered class in a subprocess of its
    own, which imports its package without the torchvision stand-in. Every architecture the
    registry builds with that class (Qwen3-Omni-MoE's Qwen3OmniMoeForConditionalGeneration is
    Qwen3OmniMoeThinkerForConditionalGeneration)."""
    from vllm.model_executor.models.registry import (
        _VLLM_MODELS,
        ModelRegistry,
        _RegisteredModel,
    )

    name = model_cls.__name__
    archs = {name} | {a for a, (_, cls) in _VLLM_MODELS.items() if cls == name}
    entry = dict.fromkeys(archs, _RegisteredModel.from_model_cls(model_cls))
    with mock.patch.dict(ModelRegistry.models, entry):
        yield


@contextlib.contextmanager
def vllm_model(
    case: str, src: Path, backend: str, tp: int, rank: int, mc: ModelConfig | None = None
):
    """vLLM's own model class for the case, built as rank `rank` of `tp` (inside its
    context: the MoE layers' kernel setup needs it), with the source's model config (or `mc`,
    one vLLM made from engine arguments), on an SM100 GPU (SM90 for FP8 block on CUTLASS,
    which vLLM runs there only)."""
    import importlib

    module, cls = CASES[case][1].rsplit(".", 1)
    if not module.startswith("vllm."):  # a module of vllm/model_executor/models
        module = f"vllm.model_executor.models.{module}"
    ffm.register_ernie45_vl_config()
    with (
        torchvision_stand_in() if case in TORCHVISION else contextlib.nullcontext(),
        mistral_common_stand_in() if case in MISTRAL_COMMON else contextlib.nullcontext(),
    ):
        model_cls = getattr(importlib.import_module(module), cls)
    quant = CASES[case][2]
    with (
        _registered_in_process(model_cls) if case in TORCHVISION else contextlib.nullcontext(),
        vm.vllm_context(backend, tp, rank, sm=90 if (quant, backend) == (FP8B, "cutlass") else 100),
        mock.patch.object(type(current_platform), "get_attn_backend_cls", _attention),
        mock.patch.object(type(current_platform), "device_type", "cpu"),
        # (MLA's prefill workspace, grown on the CPU: there is no accelerator cache to empty)
        mock.patch.object(torch.accelerator, "empty_cache", lambda: None),
        _block_fp8_linears(),
        _cuda_streams(case),
        _kernel_probes(case),
        # (LongCat-Flash-Lite's class requires the V2 model runner, vLLM's default where
        # Triton is: its switch set, as this install has no Triton)
        mock.patch.dict("os.environ", {"VLLM_USE_V2_MODEL_RUNNER": "1"})
        if case in V2_RUNNER
        else contextlib.nullcontext(),
        _transformers_classes_kept(),
        _without_sglangs_configs(),
        _own_config(case),
    ):
        _one_process_group()
        cfg = get_current_vllm_config()
        # (a family whose published config class is remote code: tests/remote_code_checkpoints)
        remote = CASES[case][0] in REMOTE_CODE
        if mc is None:
            mc = ModelConfig(
                model=str(src),
                skip_tokenizer_init=case not in TOKENIZER,
                dtype="bfloat16",
                trust_remote_code=remote,
            )
        cfg.model_config = mc
        # what VllmConfig sets once it has a model (DeepSeek-V3.2's indexer reads it): 5 up
        # to a max_model_len of 256K
        cfg.attention_config.sparse_mla_prefill_workspace_factor = 5
        if case in NO_JIT_WARMUP:  # (its TileLang kernels, compiled when warmed up: CUDA's)
            cfg.kernel_config.enable_jit_warmup = False
        if CASES[case][0] == "mistral":
            # MLA's prefill kernel: FlashInfer's (TRT-LLM's ragged one, vLLM's first choice on
            # SM100, allocates its workspace on the GPU when built)
            cfg.attention_config.mla_prefill_backend = MLAPrefillBackendEnum.FLASHINFER
        cfg.quant_config = _quant_config(Path(mc.model), mc)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = model_cls(vllm_config=cfg, prefix="")
        finally:
            torch.set_default_dtype(default)
        yield model, mc


@contextlib.contextmanager
def _cuda_streams(case: str):
    """For CUDA_STREAMS' cases: torch.cuda.Stream and torch.cuda.Event classes of inert objects
    (no stream or event is used while weights load), VLLM_KIMI_K3_GEMM_AR off."""
    if case not in CUDA_STREAMS:
        yield
        return

    with inert_cuda_streams(), mock.patch.dict("os.environ", {"VLLM_KIMI_K3_GEMM_AR": "0"}):
        yield


@contextlib.contextmanager
def _kernel_probes(case: str):
    """For KERNEL_PROBES' cases: each probe answers yes."""
    with contextlib.ExitStack() as stack:
        for probe in KERNEL_PROBES.get(case, ()):
            stack.enter_context(mock.patch(probe, lambda: True))
        yield


def _quant_config(src: Path, mc: ModelConfig):
    """vLLM's quantization config of the source: from its config.json, or for a Mistral-format
    source from the config vLLM read out of its params.json (its `quantization_config`)."""
    if (src / "config.json").exists():
        return vm.quant_config(src)
    qc = getattr(mc.hf_config, "quantization_config", None)
    if qc is None:
        return None
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    return Fp8Config.from_config(qc)


@classmethod
def _attention(cls, selected, attn_selector_config, num_heads=None) -> str:
    """The attention backend's class name: Triton's, for MLA (LongCat-Flash, Mistral Large 3)
    FlashInfer's MLA, or for sparse MLA (DeepSeek-V3.2's DSA) FlashInfer's TRT-LLM sparse MLA."""
    if attn_selector_config.use_sparse:
        return SPARSE_MLA
    return MLA if attn_selector_config.use_mla else ATTENTION


@contextlib.contextmanager
def _without_sglangs_configs():
    """transformers' config registry as in a vLLM process, where SGLang is not imported: this
    session's SGLang tests import SGLang's config modules, which register classes of their own
    for model types in transformers' CONFIG_MAPPING (intern_s2_preview's, whose text config
    has no layer_types), and AutoConfig would hand those to vLLM. They are back afterwards."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    extra = CONFIG_MAPPING._extra_content
    theirs = {k: c for k, c in extra.items() if c.__module__.startswith("sglang.")}
    for k in theirs:
        del extra[k]
    try:
        yield
    finally:
        extra.update(theirs)


@contextlib.contextmanager
def _transformers_classes_kept():
    """vLLM's Transformers backend (Hunyuan-A13B, Kolibri1, FlexOlmo, Mellum) decorates
    transformers' own decoder class in place for torch.compile when it builds the model
    (models/transformers/base.py _decorate_cls_for_torch_compile -> compilation/decorators.py
    _support_torch_compile: a base class added, __init__ and __call__ replaced, the new
    __init__ asking for a current vLLM config): left so, every later use of that class in the
    process is vLLM's, and transformers' own save of a checkpoint of the family (tests/
    hf_checkpoints.py) fails with "Current vLLM config is not set". Each class it decorates is
    put back as it was when the model's context ends (the model built keeps working: these
    tests run no forward pass)."""
    from vllm.model_executor.models.transformers import base

    decorate, kept = base.Base._decorate_cls_for_torch_compile, []

    def keeping(self, cls, *args, **kwargs):
        kept.append((cls, cls.__bases__, dict(cls.__dict__)))
        return decorate(self, cls, *args, **kwargs)

    try:
        with mock.patch.object(base.Base, "_decorate_cls_for_torch_compile", keeping):
            yield
    finally:
        for cls, bases, attrs in reversed(kept):
            for name in cls.__dict__.keys() - attrs.keys():
                delattr(cls, name)
            for name, value in attrs.items():
                if cls.__dict__.get(name) is not value:
                    setattr(cls, name, value)
            cls.__bases__ = bases


@contextlib.contextmanager
def _block_fp8_linears():
    """vLLM's Triton block-FP8 linear kernel class for the non-MoE linears of an FP8 block
    checkpoint (the module docstring says why), its device check answered yes."""
    supported = classmethod(lambda cls, compute_capability=None: (True, None))
    kernels = {PlatformEnum.UNSPECIFIED: [TritonFp8BlockScaledMMKernel]}
    with (
        mock.patch.dict(linear_kernels._POSSIBLE_FP8_BLOCK_KERNELS, kernels),
        mock.patch.object(TritonFp8BlockScaledMMKernel, "is_supported", supported),
    ):
        yield


def _tensors(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters()) | {f"buffer:{n}": b for n, b in model.named_buffers()}


def _moe(model) -> dict:
    return {n: m for n, m in model.named_modules() if isinstance(m, MoERunnerInterface)}


def _differing(theirs: dict, ours: dict) -> list[str]:
    names = list(theirs) + [n for n in ours if n not in theirs]
    return [
        n
        for n in names
        if n not in theirs
        or n not in ours
        or (theirs[n].dtype, theirs[n].shape) != (ours[n].dtype, ours[n].shape)
        or not torch.equal(
            theirs[n].reshape(-1).view(torch.uint8), ours[n].reshape(-1).view(torch.uint8)
        )
    ]


# Cases whose model's own `load_weights` looks its experts' parameters up under the MoE
# module's name (DbrxModel: `blocks.L.ffn.experts.w13_weight`), where vLLM 0.33's FusedMoEFactory
# returns a MoERunner that holds them one level down (`...experts.routed_experts.w13_weight`):
# vLLM 0.33's own load of a DBRX checkpoint fails there with a KeyError. For vLLM's side of the
# comparison each such parameter is also registered, for the load only, under the name the
# model asks (the same Parameter, so its own weight_loader, DbrxExperts', fills it); the
# plugin's side needs no such help (it reads the experts into the RoutedExperts itself).
EXPERTS_ASKED_ON_THE_RUNNER = ("dbrx-bf16",)


@contextlib.contextmanager
def _experts_under_the_runners_name(model, case: str):
    runners = list(_moe(model).values()) if case in EXPERTS_ASKED_ON_THE_RUNNER else []
    for r in runners:
        for n, p in list(r.routed_experts.named_parameters(recurse=False)):
            r.register_parameter(n, p)
    try:
        yield
    finally:
        for r in runners:
            for n, _ in list(r.routed_experts.named_parameters(recurse=False)):
                r._parameters.pop(n, None)


def test_vllms_own_dbrx_load_fails_without_the_alias(sources):
    """The reason for EXPERTS_ASKED_ON_THE_RUNNER: vLLM 0.33's DbrxModel.load_weights asks
    for `blocks.0.ffn.experts.w13_weight`, which its MoERunner does not hold."""
    src = sources("dbrx-bf16")
    with (
        vllm_model("dbrx-bf16", src, "cutlass", 1, 0) as (theirs, mc),
        pytest.raises(KeyError, match=r"blocks\.0\.ffn\.experts\.w13_weight"),
    ):
        get_model_loader(LoadConfig(load_format="auto")).load_weights(theirs, mc)


# Cases whose vLLM model holds a run-time scratch buffer, allocated empty and written by its
# kernels (no checkpoint tensor fills it, nor is it saved): Qwen4 Exp's QSA attention's top-k
# indices (nvidia/qsa.py topk_indices_buffer, non-persistent). Not compared; each is shown
# non-persistent
SCRATCH_BUFFERS = {"qwen4-exp-bf16": ("topk_indices_buffer",)}


def _scratch(model, case: str) -> set[str]:
    names = set()
    for prefix, module in model.named_modules():
        for b in SCRATCH_BUFFERS.get(case, ()):
            if b in module._buffers:
                assert b in module._non_persistent_buffers_set, f"{prefix}.{b}"
                names.add(f"buffer:{prefix}.{b}")
    assert bool(names) == (case in SCRATCH_BUFFERS)
    return names


# Cases whose vLLM model holds a vocabulary-parallel table whose padding rows (beyond this
# rank's share of the real rows) its own loading never writes: LongCat-Flash-Lite's n-gram
# table (NgramEmbedding.load_weight copies each embedder's rows into
# ngram_embeddings.oe_embedder.weight by slice, where VocabParallelEmbedding's weight_loader
# would zero the padding). Those rows hold whatever memory they were allocated with in either
# load; the real rows are compared
PADDED_TABLES = {"longcat-lite-bf16": ("model.ngram_embeddings.oe_embedder",)}


def _padding_left(theirs, ours, case: str) -> set[str]:
    """The PADDED_TABLES parameters whose real rows are equal (their padding is not compared)."""
    names = set()
    for prefix in PADDED_TABLES.get(case, ()):
        table = theirs.get_submodule(prefix)
        shard = table.shard_indices
        rows = shard.org_vocab_end_index - shard.org_vocab_start_index
        a, b = table.weight, ours.get_submodule(prefix).weight
        assert rows <= a.shape[0] and torch.equal(a[:rows], b[:rows]), prefix
        names.add(f"{prefix}.weight")
    return names


def _both(case: str, src: Path, out: Path, backend: str, tp: int, rank: int):
    """vLLM's default load of the source and the plugin's load of the output, each processed
    by vLLM's own post-load driver, as rank `rank` of `tp`."""
    with vllm_model(case, src, backend, tp, rank) as (theirs, mc):
        with _experts_under_the_runners_name(theirs, case):
            get_model_loader(LoadConfig(load_format="auto")).load_weights(theirs, mc)
        process_weights_after_loading(theirs, mc, torch.device("cpu"))
    with vllm_model(case, src, backend, tp, rank) as (ours, mc):
        served = types.SimpleNamespace(
            model=str(out), revision=None, quantization=mc.quantization, hf_config=mc.hf_config
        )
        FiConvertModelLoader(LoadConfig(load_format="fi-convert")).load_weights(ours, served)
        process_weights_after_loading(ours, mc, torch.device("cpu"))
    return ours, theirs


@pytest.mark.parametrize(("case", "backend", "scheme", "tp"), MODELS)
def test_a_whole_model_of_the_family_equals_vllms_default_load(
    case, backend, scheme, tp, sources, tmp_path
):
    src = sources(case)
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName(scheme), Backend(backend), tp), device="cpu")
    for rank in range(tp):
        ours, theirs = _both(case, src, out, backend, tp, rank)
        a, b = _moe(theirs), _moe(ours)
        assert sorted(a) == sorted(b) and a
        scratch = _scratch(theirs, case) | _padding_left(theirs, ours, case)
        differing = _differing(_tensors(theirs), _tensors(ours))
        assert [n for n in differing if n not in scratch] == [], f"rank {rank} of {tp}"
        for name in a:
            vm.assert_same_layer(a[name].routed_experts, b[name].routed_experts)  # kernel, state


def test_the_plugin_reads_vllms_bf16_backend_names():
    """vLLM 0.33 spells its unquantized MoE backends "FlashInfer TRTLLM" / "FlashInfer
    CUTLASS" (oracle/unquantized.py), its quantized ones FLASHINFER_TRTLLM: before the plugin
    read both, it refused every BF16 output on a whole model (the test above found it)."""
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

    from fi_convert.servers.vllm.checks import backend_of

    for backend, name in (("trtllm", "FLASHINFER_TRTLLM"), ("cutlass", "FLASHINFER_CUTLASS")):
        method = types.SimpleNamespace(unquantized_backend=UnquantizedMoeBackend[name])
        assert " " in UnquantizedMoeBackend[name].value
        assert backend_of(method) == backend


def _engine_config(path: Path, **kw) -> ModelConfig:
    """The model config vLLM's engine arguments make of `path`, as `vllm serve PATH ...` makes
    it (the tokenizer left out: the tiny checkpoints' tekken.json holds no vocabulary)."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(path), skip_tokenizer_init=True, **kw).create_model_config()


@pytest.mark.parametrize("tp", [1, 2])
def test_a_mistral_format_output_serves_from_vllms_engine_arguments(tp, sources, tmp_path):
    """`vllm serve OUT --load-format fi-convert -tp N` for an output of a Mistral-format source
    (params.json, no config.json), as far as vLLM's path goes on CPU: its engine arguments ->
    its model config (the plugin's hook: its config parser, servers/vllm/mistral.py) -> vLLM's
    own MistralLarge3ForCausalLM -> the loader vLLM's registry gives for the load format ->
    vLLM's post-load driver. The config equals the one vLLM reads from the source's params.json
    (dtype inferred, no --dtype), and every parameter, buffer and kernel state equals vLLM's
    default load of the source from its own engine arguments, every rank."""
    from fi_convert.servers.vllm import mistral as plugin_mistral
    from fi_convert.servers.vllm import register

    register()
    case, backend = "mistral-large-3-bf16", "trtllm"
    src = sources(case)
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.BF16, Backend(backend), tp), device="cpu")
    theirs_mc = _engine_config(src, tensor_parallel_size=tp)
    ours_mc = _engine_config(out, load_format="fi-convert", tensor_parallel_size=tp)
    assert ours_mc.config_format == plugin_mistral.CONFIG_FORMAT
    assert ours_mc.hf_config.to_dict() == theirs_mc.hf_config.to_dict()
    assert ours_mc.architectures == theirs_mc.architectures == ["MistralLarge3ForCausalLM"]
    assert (ours_mc.dtype, ours_mc.quantization) == (theirs_mc.dtype, None)
    assert ours_mc.dtype == torch.bfloat16
    for rank in range(tp):
        with vllm_model(case, src, backend, tp, rank, theirs_mc) as (theirs, mc):
            get_model_loader(LoadConfig(load_format="auto")).load_weights(theirs, mc)
            process_weights_after_loading(theirs, mc, torch.device("cpu"))
        with vllm_model(case, out, backend, tp, rank, ours_mc) as (ours, mc):
            loader = get_model_loader(LoadConfig(load_format="fi-convert"))
            assert isinstance(loader, FiConvertModelLoader)
            loader.load_weights(ours, mc)
            process_weights_after_loading(ours, mc, torch.device("cpu"))
        a, b = _moe(theirs), _moe(ours)
        assert sorted(a) == sorted(b) and a
        assert _differing(_tensors(theirs), _tensors(ours)) == [], f"rank {rank} of {tp}"
        for name in a:
            vm.assert_same_layer(a[name].routed_experts, b[name].routed_experts)


def test_an_fp8_mistral_format_source_is_refused_for_vllm_in_one_line(tmp_path):
    """Mistral Large 3 in Mistral's FP8 format (`qformat_weight` fp8_e4m3, per-tensor
    `qscale_weight`/`qscale_act`: vLLM's `fp8` method, static activation scales): vLLM 0.33
    builds its Fp8MoEMethod for such experts, whose per-tensor kernel setup the plugin does not
    run yet (checks.NOT_YET), so fp8-tensor is refused when planned (servers/vllm/target.py,
    SOURCES_NOT_YET), not written for a plugin that would refuse it at load."""
    from fi_convert import SchemeMismatchError
    from fi_convert.servers.vllm.checks import NOT_YET

    assert "Fp8MoEMethod" in NOT_YET["fp8-tensor"]
    src = mistral.write(tmp_path / "src", "fp8")
    for backend in ("trtllm", "cutlass"):
        with pytest.raises(SchemeMismatchError) as e:
            convert(src, tmp_path / "out", Options(SchemeName.FP8_TENSOR, Backend(backend), 2))
        assert "\n" not in str(e.value) and "Fp8MoEMethod" in str(e.value)
        assert not (tmp_path / "out").exists()


def test_mistral_large_3_published_whole_is_pixtral_and_refused_for_sglang(sources, tmp_path):
    """Mistral Large 3 as published whole (params.json's vision_encoder): fi-convert records the
    architecture both servers build, PixtralForConditionalGeneration (vLLM's adapt_config_dict,
    the case above), and refuses an output of it for SGLang in one line, as it refuses the
    text model's (SGLang's class of it not proven here)."""
    from fi_convert import SchemeMismatchError, read_manifest

    src = sources("pixtral-large-3-bf16")
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.TRTLLM, 1), device="cpu")
    assert read_manifest(out)["source"]["architectures"] == ["PixtralForConditionalGeneration"]
    sglang = Options(SchemeName.BF16, Backend.TRTLLM, 1, server="sglang")
    with pytest.raises(SchemeMismatchError) as e:
        convert(src, tmp_path / "sglang", sglang, device="cpu")
    assert "\n" not in str(e.value) and "(models/pixtral.py, PixtralForConditionalGeneration" in (
        str(e.value)
    )
    assert str(e.value).count("--server vllm") == 1  # the reason names the fix: said once
    assert not (tmp_path / "sglang").exists()


def test_vllm_builds_each_puzzle_moe_layer_of_its_own_size(sources):
    """Nemotron-H Puzzle's MoE layers as vLLM builds them (from block_configs, through the
    config class's get_nemotron_h_config_for_layer): 4 experts of I 128, then 3 of I 64, the
    sizes fi-convert reads for each layer (families.Family.layer_configs)."""
    from fi_convert.families import all_families, declared
    from fi_convert.source import open_checkpoint

    case = "nemotron-puzzle-bf16"
    src = sources(case)
    with vllm_model(case, src, "cutlass", 1, 0) as (model, _):
        experts = {n: m.routed_experts for n, m in _moe(model).items()}
    assert {n: (e.w13_weight.shape[0], e.w2_weight.shape[2]) for n, e in experts.items()} == {
        "model.layers.1.mixer.experts": (4, 128),  # (vLLM's modules for backbone.layers.L)
        "model.layers.2.mixer.experts": (3, 64),
    }
    config = open_checkpoint(src).config
    (fam,) = declared(config)
    assert fam in all_families() and fam.name == "nemotron-h"
    for layer, sizes in (("1", (4, 128)), ("2", (3, 64))):
        prefix = f"backbone.layers.{layer}.mixer.experts"
        got = (fam.config_value(config, "num_experts", prefix),)
        got += (fam.config_value(config, "intermediate_size", prefix),)
        assert got == sizes


@pytest.mark.parametrize(
    ("case", "router", "method", "layers"),
    [
        ("hunyuan-bf16", "CustomRoutingRouter", "Custom", 2),
        ("kolibri1-bf16", "CustomRoutingRouter", "Custom", 2),
        ("flex-olmo-bf16", "FusedTopKRouter", "Default", 2),
        ("mellum-bf16", "FusedTopKRouter", "RenormalizeNaive", 1),
    ],
)
def test_vllms_transformers_backend_routes_as_its_moe_block_fuser_finds(
    case, router, method, layers, sources
):
    """How vLLM 0.33's Transformers backend routes the families it serves (servers/vllm/
    target.py, TRANSFORMERS_BACKEND): where its MoEBlockFuser does not recognise the MoE block
    (Hunyuan-A13B, Kolibri1's top-k of logits plus a bias), it leaves the block's forward to
    transformers and routes with its router through a custom routing function, which
    CustomRoutingRouter reports as Custom routing, so those run on CUTLASS only; where it does
    (FlexOlmo's and Mellum's softmax routers), its own router routes as the family's routing
    data says (Default without renormalization, RenormalizeNaive with it). Mellum's dense
    layer builds none."""
    from vllm.model_executor.layers.fused_moe.config import RoutingMethodType

    with vllm_model(case, sources(case), "cutlass", 1, 0) as (model, _):
        routers = [m.router for m in _moe(model).values()]
    assert len(routers) == layers and {type(r).__name__ for r in routers} == {router}
    assert {r.routing_method_type for r in routers} == {RoutingMethodType[method]}


def test_ling3s_per_layer_clamp_is_the_one_vllm_builds_and_limits_its_backends(sources, tmp_path):
    """Ling 3's routed experts clamp their SwiGLU per decoder layer (expert_swiglu_limit_list,
    0 for none): vLLM 0.33's own BailingMoeV3ForCausalLM builds each MoE layer with its entry,
    the limit fi-convert reads for the layer (families.Family.swiglu_limit); a clamp, which
    vLLM's TRT-LLM FP8 per-tensor experts do not apply, refuses fp8-tensor on TRT-LLM in one line
    (CUTLASS is planned)."""
    from fi_convert import SchemeMismatchError, read_manifest
    from fi_convert.source import find_family, open_checkpoint

    case = "ling3-bf16"
    src = sources(case)
    with vllm_model(case, src, "cutlass", 1, 0) as (model, _):
        built = {n: m.routed_experts.swiglu_limit for n, m in _moe(model).items()}
    assert built == {"model.layers.1.mlp.experts": None, "model.layers.2.mlp.experts": 7.0}
    fam, layers = find_family(open_checkpoint(src))
    assert fam.name == "bailing-moe-v3"
    assert {x.prefix: x.swiglu_limit for x in layers} == built
    # (BF16 to fp8-tensor has no static activation scales: converted with --allow-unservable)
    fp8 = dict(scheme=SchemeName.FP8_TENSOR, tp_size=1, allow_unservable=True)
    with pytest.raises(SchemeMismatchError) as e:
        convert(src, tmp_path / "t", Options(backend=Backend.TRTLLM, **fp8))
    assert "\n" not in str(e.value) and "swiglu_limit" in str(e.value)
    assert not (tmp_path / "t").exists()
    convert(src, tmp_path / "c", Options(backend=Backend.CUTLASS, **fp8), device="cpu")
    assert sorted(read_manifest(tmp_path / "c")["layers"]) == sorted(built)


def test_vllms_step5_runs_clamped_layers_as_swiglustep_which_no_flashinfer_kernel_takes():
    """The reason fi-convert refuses Step-5 (families/step5.json): vLLM 0.33's Step5MoE runs a
    layer with a swiglu_limits entry (7.0) as activation swiglustep, and none of vLLM's
    FlashInfer MoE experts (CUTLASS's, TRT-LLM's per scheme) takes it; SGLang has no Step-5."""
    import inspect

    from transformers.utils import import_utils
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts import (
        flashinfer_cutlass_moe,
        trtllm_bf16_moe,
        trtllm_fp8_moe,
        trtllm_mxfp4_moe,
        trtllm_nvfp4_moe,
    )

    with torchvision_stand_in():
        from vllm.models.step5.nvidia import model as step5
    assert not import_utils.is_torchvision_available() and "torchvision" not in sys.modules

    source = inspect.getsource(step5.Step5MoE.__init__)
    assert 'activation = "swiglustep"' in source and "swiglu_limit != 7.0" in source
    experts = (
        flashinfer_cutlass_moe.FlashInferExperts,
        trtllm_bf16_moe.TrtLlmBf16ExpertsBase,
        trtllm_fp8_moe.TrtLlmFp8ExpertsBase,
        trtllm_mxfp4_moe.TrtLlmMxfp4ExpertsBase,
        trtllm_nvfp4_moe.TrtLlmNvFp4ExpertsBase,
    )
    assert not [e for e in experts if e._supports_activation(MoEActivation.SWIGLUSTEP)]
    assert [e for e in experts if e._supports_activation(MoEActivation.SILU)] == list(experts)


def test_kimi_linear_where_vllms_model_pads_a_ranks_share_the_plugin_refuses(tmp_path):
    """vLLM 0.33's Kimi Linear pads each TP rank's share of moe_intermediate_size below
    min_moe_intermediate_per_partition (256) up to it (models/kimi_k3/nvidia/model.py), a layer
    of other sizes than fi-convert's output of that TP size holds: the plugin refuses the
    output in one line at load, naming the sizes, before it reads an expert."""
    from fi_convert.servers.vllm.checks import PluginError

    src = hf._save_kimi_linear(tmp_path / "src", moe_intermediate_size=128)
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.TRTLLM, 2), device="cpu")
    with vllm_model("kimi-linear-bf16", src, "trtllm", 2, 0) as (ours, mc):
        (runner,) = _moe(ours).values()
        assert runner.routed_experts.moe_config.intermediate_size_per_partition == 256  # not 64
        served = types.SimpleNamespace(
            model=str(out), revision=None, quantization=mc.quantization, hf_config=mc.hf_config
        )
        with pytest.raises(PluginError) as e:
            FiConvertModelLoader(LoadConfig(load_format="fi-convert")).load_weights(ours, served)
    assert str(e.value) == (
        f"fi-convert: {out}: model.layers.1.block_sparse_moe.experts: vLLM's model built it "
        "with 256 intermediate rows per rank, the output holds 64 (padded to 128): its model "
        "pads a rank's share itself, which fi-convert's layout does not; serve the source "
        "checkpoint with vLLM's own loader"
    )


def test_kimi_k3s_latent_experts_are_the_ones_vllms_class_builds(sources, tmp_path):
    """vLLM 0.33's Kimi K3 (KimiK3ForConditionalGeneration) builds its language model as
    KimiLinearForCausalLM, whose KimiMoE runs the routed experts in routed_expert_hidden_size
    (its FusedMoE of that hidden size, LatentMoERunner) with routed_expert_down_proj and
    routed_expert_up_proj outside them: the output's layer holds experts of that size, which the
    plugin's load puts in the layer, equal to vLLM's own load (the test above); the latent
    projections come out of the output as the source holds them."""
    from safetensors import safe_open

    src = sources("kimi-k3-bf16")
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.CUTLASS, 1), device="cpu")
    layer = "language_model.layers.1.block_sparse_moe.experts"
    manifest = json.loads((out / "fi-convert-manifest.json").read_text())
    assert manifest["layers"][layer]["hidden_size"] == hf.KIMI_K3_LATENT
    with vllm_model("kimi-k3-bf16", src, "cutlass", 1, 0) as (theirs, _):
        assert type(theirs.language_model).__name__ == "KimiLinearForCausalLM"
        (runner,) = _moe(theirs).values()
        assert type(runner).__name__ == "LatentMoERunner"
        assert runner.routed_experts.moe_config.hidden_dim == hf.KIMI_K3_LATENT
        moe = theirs.language_model.model.layers[1].block_sparse_moe
        assert moe.routed_expert_up_proj.weight.shape == (hf.KIMI_K3_HIDDEN, hf.KIMI_K3_LATENT)
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    name = "language_model.layers.1.block_sparse_moe.routed_expert_up_proj.weight"
    shard = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"][name]
    with safe_open(out / index[name], "pt") as f, safe_open(src / shard, "pt") as g:
        assert torch.equal(f.get_tensor(name), g.get_tensor(name))


def test_a_latent_kimi_linears_experts_are_the_ones_vllms_class_builds(sources, tmp_path):
    """A latent Kimi Linear alone (KimiLinearForCausalLM, config.json with
    routed_expert_hidden_size): fi-convert read its experts' hidden size as hidden_size and
    refused the checkpoint as one whose tensors disagree with config.json; vLLM 0.33's class
    builds the experts of routed_expert_hidden_size (LatentMoERunner), which the output's layer
    holds (the plugin's load equals vLLM's own: the cases above), its latent projections as
    the source holds them."""
    from safetensors import safe_open

    src = sources("kimi-linear-latent-bf16")
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.TRTLLM, 2), device="cpu")
    manifest = json.loads((out / "fi-convert-manifest.json").read_text())
    assert manifest["layers"]["model.layers.1.block_sparse_moe.experts"]["hidden_size"] == (
        hf.KIMI_K3_LATENT
    )
    with vllm_model("kimi-linear-latent-bf16", src, "trtllm", 2, 1) as (theirs, _):
        (runner,) = _moe(theirs).values()
        assert type(runner).__name__ == "LatentMoERunner"
        assert runner.routed_experts.moe_config.hidden_dim == hf.KIMI_K3_LATENT
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    theirs_index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    for proj in ("down_proj", "norm", "up_proj"):
        name = f"model.layers.1.block_sparse_moe.routed_expert_{proj}.weight"
        with (
            safe_open(out / index[name], "pt") as f,
            safe_open(src / theirs_index[name], "pt") as g,
        ):
            assert torch.equal(f.get_tensor(name), g.get_tensor(name))


@pytest.mark.parametrize(
    ("case", "backend", "method", "words"),
    [
        # vLLM's Fp8Config builds Fp8MoEMethod, whose per-tensor kernel setup the plugin does
        # not run (servers/vllm/target.py SOURCES_NOT_YET); SGLang's Fp8MoEMethod, not proven
        ("hunyuan-fp8-static", "cutlass", "Fp8MoEMethod", ("Fp8MoEMethod", "Fp8MoEMethod")),
        # a weight_scale per 128x128 block, compressed-tensors' names: no scheme reads it (the
        # plugin's fp8-block outputs load into Fp8MoEMethod, checks.METHODS)
        (
            "laguna-fp8-block-ct",
            "trtllm",
            "CompressedTensorsW8A8Fp8MoEMethod",
            ("per 128x128 block", "per 128x128 block"),
        ),
        # read as nvfp4, whose compressed-tensors method the plugin does not set up; SGLang's
        # Laguna refuses the plugin's load whatever the scheme
        (
            "laguna-nvfp4-ct",
            "trtllm",
            "CompressedTensorsW4A4Nvfp4MoEMethod",
            ("CompressedTensorsW4A4Nvfp4MoEMethod", "Laguna model"),
        ),
    ],
)
def test_a_published_quantized_form_of_a_family_is_refused_for_the_method_vllm_builds(
    case, backend, method, words, sources, tmp_path
):
    """The families' quantized checkpoints as their publishers write them: vLLM's own model
    class (Hunyuan-A13B's Transformers backend, LagunaForCausalLM) builds its experts with
    `method` from the checkpoint's quantization config, a method whose kernel setup fi-convert's
    vLLM plugin does not run for that output (checks.NOT_YET, checks.METHODS); so `convert`
    refuses each in one line for both servers and backends, before writing anything, naming
    why (`words`: vLLM's, SGLang's)."""
    from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory

    from fi_convert.servers.vllm import checks

    from .conftest import cli
    from .test_errors import error_line

    src = sources(case)
    h, i = (
        CASES[case][3].get(k, d) for k, d in (("hidden_size", 64), ("moe_intermediate_size", 96))
    )
    with vm.vllm_context(backend, 1, 0):
        built = FusedMoEFactory(
            num_experts=4,
            top_k=2,
            hidden_size=h,
            intermediate_size=i,
            params_dtype=torch.bfloat16,
            quant_config=vm.quant_config(src),
            tp_size=1,
            dp_size=1,
            pcp_size=1,
            prefix="model.layers.1.mlp.experts",
        ).routed_experts.quant_method
    assert type(built).__name__ == method
    scheme = {"fp8-static": "fp8-tensor", "nvfp4-ct": "nvfp4"}.get(CASES[case][2])
    if scheme:  # the scheme that reads it: the plugin loads no output of that method
        assert method in checks.NOT_YET[scheme]
    else:  # block FP8 under compressed-tensors' method, not the one fp8-block outputs load into
        assert built.block_quant and method not in checks.METHODS["fp8-block"]
    for server, word in zip(("vllm", "sglang"), words, strict=True):
        for b in ("trtllm", "cutlass"):
            out = tmp_path / f"{server}-{b}"
            res = cli("convert", src, out, "--server", server, "--backend", b)
            line = error_line(res)
            assert word in line or (b, case) == ("trtllm", "hunyuan-fp8-static"), line
            assert not out.exists()


def test_building_a_transformers_backend_model_leaves_transformers_own_classes(sources, tmp_path):
    """After vLLM's Transformers backend built Hunyuan-A13B here, transformers' HunYuanMoEV1Model
    is transformers' own again (vllm_model's _transformers_classes_kept), so transformers can
    still write a checkpoint of the family in this process: before, a later save (another
    test's source) failed with "Current vLLM config is not set"."""
    import transformers

    cls = transformers.HunYuanMoEV1Model
    before = (cls.__bases__, dict(cls.__dict__))
    with vllm_model("hunyuan-bf16", sources("hunyuan-bf16"), "cutlass", 1, 0):
        assert cls.__bases__ != before[0]  # (vLLM's decoration, while its model is built)
    assert (cls.__bases__, dict(cls.__dict__)) == before
    assert hf.save("hunyuan_v1_moe", tmp_path / "again").is_dir()


def test_a_qwen3_5_moe_config_without_norm_topk_prob_renormalizes_as_vllm_builds(sources):
    """Qwen3.5 MoE's config.json as transformers 5.20 writes it has no norm_topk_prob (its
    router renormalizes unconditionally); vLLM 0.33's block reads it with default true
    (qwen3_next.py: getattr(config, "norm_topk_prob", True)) and routes RenormalizeNaive: so
    does the family fi-convert takes it as (the Qwen3-MoE family's default, false, read it as
    Default routing and refused TRT-LLM for vLLM)."""
    from vllm.model_executor.layers.fused_moe.config import RoutingMethodType

    from fi_convert.source import find_family, open_checkpoint

    src = sources("qwen3-5-moe-bf16")
    ckpt = open_checkpoint(src)
    assert "norm_topk_prob" not in ckpt.config["text_config"]
    fam, _ = find_family(ckpt)
    assert fam is not None and fam.name == "qwen3.5-moe"
    assert fam.moe.routing(ckpt.config) == "RenormalizeNaive"
    with vllm_model("qwen3-5-moe-bf16", src, "cutlass", 1, 0) as (model, _):
        routers = [m.router for m in _moe(model).values()]
    assert len(routers) == 2
    assert {r.routing_method_type for r in routers} == {RoutingMethodType.RenormalizeNaive}


def test_vllms_muse_spark_hooks_its_post_expert_norm_where_the_pre_processed_mode_does_not():
    """The reason fi-convert refuses a vLLM output of Muse Spark (servers/vllm/target.py
    OWN_MOE_METHOD): vLLM 0.33's MuseSparkUnquantizedFusedMoE hooks its post-expert RMSNorm
    into the experts (post_gemm2_hook) in its _setup_kernel, after UnquantizedFusedMoEMethod's
    conversion of the weights; under weights_already_processed (the plugin's kernel-only setup)
    its processing builds the kernel alone: no conversion, no hook. It takes TRT-LLM whatever
    the backend (Triton on SM90), and is the method of every layer but ModelOpt NVFP4 ones."""
    import inspect

    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )
    from vllm.model_executor.utils import weights_already_processed
    from vllm.models.muse_spark.nvidia import muse_moe_runner as muse

    cls = muse.MuseSparkUnquantizedFusedMoE

    def process(pre_processed: bool) -> tuple[int, int, bool]:
        method = cls.__new__(cls)
        method.moe_kernel = mock.Mock()
        method.muse_post_expert_finalize = object()
        method.unquantized_backend = muse.UnquantizedMoeBackend.FLASHINFER_TRTLLM
        layer = torch.nn.Module()
        layer.w13_weight = torch.nn.Parameter(torch.zeros(1))
        layer.w2_weight = torch.nn.Parameter(torch.zeros(1))
        mode = weights_already_processed() if pre_processed else contextlib.nullcontext()
        with (
            mock.patch.object(UnquantizedFusedMoEMethod, "_setup_kernel") as convert,
            mock.patch.object(cls, "_init_moe_kernel") as kernel,
            mock.patch.object(cls, "_maybe_pad_weight", lambda self, w: w),
            mode,
        ):
            cls.process_weights_after_loading(method, layer)
        hook = method.moe_kernel.fused_experts.post_gemm2_hook
        return convert.call_count, kernel.call_count, hook is method.muse_post_expert_finalize

    assert process(pre_processed=False) == (1, 0, True)
    assert process(pre_processed=True) == (0, 1, False)
    init = inspect.getsource(cls.__init__)
    assert "self.unquantized_backend = UnquantizedMoeBackend.FLASHINFER_TRTLLM" in init
    assert "moe_backend" not in init
    pick = inspect.getsource(muse.MuseSparkRoutedExperts._get_quant_method)
    assert pick.rstrip().endswith("return MuseSparkUnquantizedFusedMoE(moe_config)")
    assert "is_weights_pre_processed" not in inspect.getsource(muse)


def test_vllms_minimax_m3_text_model_reads_a_config_its_mlp_refuses(sources, tmp_path):
    """Why vLLM refuses MiniMax-M3's text model alone (servers/vllm/target.py NOT_PROVEN):
    the published whole model's config.json is read with vLLM's own MiniMaxM3Config (hidden_act
    swigluoai, moe_layer_freq kept: the proof above), a text model's (its text_config, model_type
    minimax_m3_vl_text) with transformers 5.20's MiniMaxM3VLTextConfig, which rewrites
    hidden_act to silu and drops moe_layer_freq; vLLM's own MiniMaxM3MLP refuses it when built."""
    import json

    from vllm.transformers_utils.config import get_config

    with torchvision_stand_in():  # (its package imports vLLM's MiniMax-M3 image processor)
        from vllm.models.minimax_m3.nvidia.model import MiniMaxM3MLP

    src = sources("minimax-m3-bf16")
    whole = get_config(str(src), trust_remote_code=False).text_config
    assert (type(whole).__name__, whole.hidden_act, whole.moe_layer_freq) == (
        "MiniMaxM3TextConfig",
        "swigluoai",
        [0, 1],
    )
    text = json.loads((src / "config.json").read_text())["text_config"]
    (tmp_path / "config.json").write_text(
        json.dumps(text | {"architectures": ["MiniMaxM3SparseForCausalLM"]})
    )
    config = get_config(str(tmp_path), trust_remote_code=False)
    assert type(config).__name__ == "MiniMaxM3VLTextConfig" and config.hidden_act == "silu"
    assert getattr(config, "moe_layer_freq", None) is None
    with vm.vllm_context("cutlass", 1, 0):
        _one_process_group()
        with pytest.raises(ValueError, match="Unsupported activation: silu"):
            MiniMaxM3MLP(config, intermediate_size=config.dense_intermediate_size)


def test_mimo_v2_omni_is_refused_for_sglang_in_one_line(sources, tmp_path):
    """MiMo-V2-Omni (the MiMo-V2-Flash family's MiMoV2OmniForCausalLM, proven above on vLLM):
    SGLang 0.5.23 has no model class for it, so an SGLang output is refused when planned,
    naming vLLM instead; nothing is written."""
    from fi_convert.errors import SchemeMismatchError

    out = tmp_path / "out"
    opts = Options(SchemeName.BF16, Backend.TRTLLM, 1, server="sglang")
    with pytest.raises(SchemeMismatchError) as e:
        convert(sources("mimo-omni-bf16"), out, opts, device="cpu")
    assert str(e.value) == (
        "--scheme bf16 --backend trtllm --server sglang: SGLang 0.5.23 has no model class for "
        "MiMo-V2-Omni (MiMoV2OmniForCausalLM); or convert for vLLM (--server vllm)"
    )
    assert not out.exists()


def test_longcat_flash_lite_is_refused_for_sglang_in_one_line(sources, tmp_path):
    """LongCat-Flash-Lite (the LongCat-Flash family's LongcatFlashNgramForCausalLM, proven above
    on vLLM): SGLang 0.5.23's registry has no class of that name (its LongcatFlashForCausalLM
    builds n-gram embeddings itself, under its own name), so an SGLang output is refused when
    planned, naming vLLM instead; nothing is written."""
    from fi_convert.errors import SchemeMismatchError

    out = tmp_path / "out"
    opts = Options(SchemeName.BF16, Backend.CUTLASS, 1, server="sglang")
    with pytest.raises(SchemeMismatchError) as e:
        convert(sources("longcat-lite-bf16"), out, opts, device="cpu")
    assert str(e.value) == (
        "--scheme bf16 --backend cutlass --server sglang: SGLang 0.5.23 has no model class for "
        "LongCat-Flash-Lite (LongcatFlashNgramForCausalLM); or convert for vLLM (--server vllm)"
    )
    assert not out.exists()


@pytest.mark.parametrize("tp", [1, 2])
def test_interns1_pros_fope_coefficients_and_grouped_router_are_vllms(sources, tmp_path, tp):
    """What makes Intern-S1-Pro's case above prove something beyond Qwen3-VL-MoE's: vLLM's class
    builds its FoPE rotary embedding (the checkpoint's rope_scaling keys read) and its load of
    the output fills each rank's share of the coefficients fi-convert copied unchanged
    (model.language_model.rotary_emb.{sin,cos}_coef, split by key-value head), and its MoE
    layers route with the model's own grouped function (router_n_groups), which vLLM reports
    as Custom routing (so the plan's CUTLASS only)."""
    from safetensors.torch import load_file
    from vllm.model_executor.layers.fused_moe.config import RoutingMethodType
    from vllm.model_executor.layers.rotary_embedding.fope import FourierRotaryEmbedding

    case = "interns1-pro-bf16"
    src = sources(case)
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName("bf16"), Backend("cutlass"), tp), device="cpu")
    fope = load_file(src / "model-fope.safetensors")  # (the source's: copied unchanged)
    for rank in range(tp):
        ours, _ = _both(case, src, out, "cutlass", tp, rank)
        ropes = {m for m in ours.modules() if isinstance(m, FourierRotaryEmbedding)}
        assert len(ropes) == 1, ropes  # one module, shared by every layer
        rope = ropes.pop()
        for k in ("sin", "cos"):
            whole = fope[f"model.language_model.rotary_emb.{k}_coef"]
            assert torch.equal(getattr(rope, f"{k}_coef").data, whole.chunk(tp)[rank])
        routers = [m.router for m in _moe(ours).values()]
        assert len(routers) == 2 and {type(r).__name__ for r in routers} == {"CustomRoutingRouter"}
        assert {r.routing_method_type for r in routers} == {RoutingMethodType.Custom}
        assert {r.custom_routing_function.__self__.n_groups for r in routers} == {2}


def test_interns1_pro_is_refused_on_trtllm_and_for_sglang_in_one_line(sources, tmp_path):
    """Intern-S1-Pro's other plans, each one line naming the server's reason, nothing written:
    for vLLM on TRT-LLM (its grouped router is the model's own function, Custom routing, which
    vLLM 0.33's monolithic TRT-LLM BF16 experts do not take), and for SGLang on either backend
    (SGLang 0.5.23 builds no Intern-S1-Pro model: tests/test_sglang_families.py
    test_sglangs_intern_s1_pro_model_is_not_built)."""
    from tests.test_errors import error_line

    from .conftest import cli

    src = sources("interns1-pro-bf16")
    out = tmp_path / "out"
    line = error_line(cli("convert", src, out, "--server", "vllm", "--backend", "trtllm"))
    assert line.startswith(
        "error: --scheme bf16 --backend trtllm --server vllm: the model's router is Custom "
        "routing, which vLLM 0.33's monolithic TRT-LLM bf16 experts do not take"
    ), line
    assert not out.exists()
    for backend in ("trtllm", "cutlass"):
        line = error_line(cli("convert", src, out, "--server", "sglang", "--backend", backend))
        assert line.startswith(
            f"error: --scheme bf16 --backend {backend} --server sglang: SGLang 0.5.23 builds no "
            "Intern-S1-Pro model (models/interns1pro.py)"
        ), line
        assert not out.exists()

"""The families fi-convert added (fi_convert/families/*.json) proven by SGLang 0.5.23's own model
classes, on CPU: a tiny checkpoint written by transformers' own `save_pretrained` (tests/
hf_checkpoints.py; quantized as the exporters write it, tests/quantized_checkpoints.py) is
loaded by SGLang's `get_model_loader` twice: the plugin's load of fi-convert's output
(`--server sglang`) and SGLang's default load of the source (its own model class's
`load_weights`, expert mapping and FusedMoE processing). Every parameter, buffer and tensor a
module holds, and each MoE layer's state, must be equal, at TP 1 and 2, every rank
(tests/test_sglang_models.py's harness). The same runs on SGLang 0.5.20-0.5.22 in their venvs
(`make test-release`, the layouts each holds): where a release has no model class of the
source's architecture (K-EXAONE's ExaoneMoeForCausalLM before 0.5.22), its own load takes its
Transformers backend, and the plugin refuses the output in one line.

GLM-4.5 (Glm4MoeForCausalLM: DeepSeek's expert names, sigmoid + bias routing) in every scheme
SGLang's plugin loads from a source of that family; MiniMax-M2 (MiniMaxM2ForCausalLM: Mixtral's
w1/w2/w3 names, MiniMax2 routing) in BF16 and FP8 block; DeepSeek-V3.2 (DeepseekV32ForCausalLM,
with its DSA indexer) in its published FP8 block format and BF16; ERNIE-4.5-MoE (softmax + bias
routing), OLMoE (softmax, no renormalization), Phi-3.5-MoE (PhiMoEForCausalLM, sparsemixer),
K-EXAONE (ExaoneMoeForCausalLM), HY v3 (HYV3ForCausalLM), LFM2-MoE (Lfm2MoeForCausalLM: its
lm_head tied to the embedding after its loading loop), Cohere2-MoE, Qwen3-Omni-MoE
(Qwen3OmniMoeForConditionalGeneration, the whole model transformers writes: its thinker's
experts converted, its talker's MoE tensors carried as they are), GLM-4.5V
(Glm4vMoeForConditionalGeneration, the whole multimodal model transformers writes: its language
model's experts, a layer SGLang builds as `language_model.layers.L.mlp.experts` in its module
`model.layers.L.mlp.experts`), Ling 2.0 (BailingMoeV2ForCausalLM), Ling v1
(BailingMoeForCausalLM), Sarvam-30B (SarvamMoEForCausalLM) and Sarvam-105B
(SarvamMLAForCausalLM; the four test_ling_equals_sglangs_default_load) in BF16, Ling 2.5
(BailingMoeV2_5ForCausalLM: linear-attention and MLA layers) and Ling 3
(BailingMoeV3ForCausalLM: KDA and MLA layers, its per-layer SwiGLU clamp as fi-convert reads
it; the same test) in BF16 on both backends; Step3-VL (Step3VLForConditionalGeneration as
stepfun-ai/step3 publishes it, taken as Step-3 by its text_config:
test_step3_vl_equals_sglangs_default_load) in BF16 on both backends; Gemma 4
(Gemma4ForCausalLM: its checkpoint's model.layers.L.experts, a layer SGLang builds in its
module model.layers.L.moe.experts) in BF16 on CUTLASS (its TRT-LLM BF16 runner takes no gelu
experts: test_gemma4_on_sglangs_trtllm_bf16_runner_is_refused); Hunyuan-A13B
(HunYuanMoEV1ForCausalLM: transformers' model, its config.json's per-layer
moe_intermediate_size, moe_topk and num_shared_expert as tencent/Hunyuan-A13B-Instruct
publishes them) in BF16 on both backends (its published FP8 release's format was not checked
here; SGLang declares no routing method for it, so ModelOpt FP8 on TRT-LLM is refused);
Granite-MoE SWA (GraniteMoeSWAForCausalLM: transformers' model, its fused
block_sparse_moe.experts.gate_up_proj / down_proj, sliding windows and attention sinks) in BF16
on both backends, Mellum (MellumForCausalLM: Qwen3-MoE's layers, a dense layer by
mlp_layer_types) in BF16 on both backends, InternVL 3.5 MoE (InternVLChatModel: its Qwen3-MoE
language model's config in llm_config) and Intern-S1 (InternS1ForConditionalGeneration as
published, its config class remote code: test_interns1_equals_sglangs_default_load), Kimi-VL
(KimiVLForConditionalGeneration over DeepSeek-V3: test_kimi_vl_equals_sglangs_default_load) and
Kimi-K2.5 (KimiK25ForConditionalGeneration, its language model built without the checkpoint's
prefix: test_kimi_k25_equals_sglangs_default_load) and dots.vlm (DotsVLMForCausalLM: its
DeepSeek-V3 language model's keys at config.json's top level, its tensors under their own
names beside a vision tower) in
BF16 on both backends, HY v4 (HYV4ForCausalLM: MLA with its indexer,
hyper-connections, fused experts whose SwiGLU is clamped; the names vLLM's and SGLang's loads
read, tests/hf_checkpoints.py) in BF16 on both backends, GLM-5 Next
(Glm5NextForConditionalGeneration, the whole multimodal model transformers writes, its
language model's layers built as model.layers.L.mlp.experts: KDA and sparse-MLA layers,
hyper-connections, a SwiGLU clamp) in BF16 on both backends, Kimi Linear (KimiLinearForCausalLM:
a KDA layer, an MLA layer with the MoE block; transformers' tensors under the published
config.json, tests/hf_checkpoints.py) in BF16 on both backends, Kimi K3
(KimiK3ForConditionalGeneration: its latent MoE, test_kimi_k3_equals_sglangs_default_load) in
BF16 on both backends, K2 Horizon
(K2HorizonForCausalLM: test_k2_horizon_equals_sglangs_default_load) in BF16 on both backends,
Qwen4 Exp (Qwen4ExpForConditionalGeneration, the whole multimodal model transformers writes: a
gated-delta-net and an indexed-attention layer, each with Qwen2-MoE's block, hyper-connections;
its module imports models/qwen3_5.py, whose Mamba kernels ask Triton for the device: the
stand-in answers as Triton without a GPU) and Qwen3.5 MoE (Qwen3_5MoeForConditionalGeneration,
the whole multimodal model transformers writes, the same module) in BF16 on both backends,
Intern-S2 Preview (InternS2PreviewForConditionalGeneration: that model under its own model_type
and class, Qwen3.5 MoE's subclass) and Cohere2 Vision (Cohere2VisionForConditionalGeneration,
transformers' whole model over a Cohere2-MoE language model) and MiniCPM-V 4.6 and 4.7
(MiniCPMV4_6ForConditionalGeneration, MiniCPMV4_7ForConditionalGeneration: transformers' whole
models over a Qwen3.5 MoE language model; their merger placed by SGLang's get_device(), which
answers the CPU here: DEVICE_ASKED) in BF16 on both backends, and DiffusionGemma
(DiffusionGemmaForBlockDiffusion, transformers' whole block-diffusion model: Gemma 4's MoE
layers in its decoder, model.decoder.layers.L.experts, which SGLang builds as
model.layers.L.moe.experts; its encoder's text layers tied to them) in BF16 on CUTLASS, Granite
4.0 hybrid (GraniteMoeHybridForCausalLM: a Mamba2 layer and an attention one, each with
Granite-MoE's block; at TP 2 its one-group Mamba2 projections are compared where SGLang's
loader writes them: MAMBA_ONE_GROUP) and Nemotron-H (NemotronHForCausalLM: Mamba, MoE with
non-gated relu2 experts, attention; the checkpoint's backbone.layers.L built as model.layers.L)
in BF16 on both backends, MiniMax-M3 (MiniMaxM3SparseForConditionalGeneration, the whole model
as published: its SwiGLU-OAI experts built as silu ones with gemm1_alpha, gemm1_beta and
gemm1_clamp_limit, which the CUTLASS runner's state holds per expert and the comparison covers)
in BF16 on CUTLASS (its TRT-LLM BF16 runner has no field for them: tests/test_families.py), and
Nemotron Nano VL (NemotronH_Nano_VL_V2: RADIO's smallest ViT
under its published names, vision_model.radio_model.model.*, and the projector mlp1 over
Nemotron-H's model, language_model, its config.json in llm_config:
test_nemotron_nano_vls_radio_tower_is_read_from_its_published_names), Nano Omni
(NemotronH_Nano_Omni_Reasoning_V3, its subclass without a body) and Omni
(NemotronH_Omni_Reasoning_V3, model_type nemotron_h_omni: the same layout, its RADIO tower with
a video embedder) in BF16 on both backends. Their
modules import SGLang's model runner's distributed bootstrap,
which imports uvicorn: its stand-in (fi_convert/servers/sglang/stand_ins.py) lets the import
through, no server is started.

Not proven here, and why:
- Arcee Trinity (AFMoE) and DeepSeek-MoE v1: SGLang 0.5.23's AfmoeMoE and DeepseekMoE hold their
  experts as per-expert MLPs and call SGLang's fused_moe function themselves, building no
  FusedMoE layer: SGLang never runs them on FlashInfer's MoE kernels, and `--server sglang`
  refuses them (test_sglangs_model_builds_no_moe_layer);
- MiMo-V2-Flash: SGLang 0.5.23's MiMoV2 model builds its rotary embedding from
  `config.rope_scaling`, which transformers 5.20's MiMoV2FlashConfig (the config class SGLang
  loads a `mimo_v2_flash` config.json with) gives as a dict per layer type, and SGLang's rope
  cache fails on it (`unhashable type: 'dict'`): the model is not built;
- LongCat-Flash: SGLang 0.5.23's own LongcatFlashConfig (configs/longcat_flash.py) under this
  venv's transformers 5.20 (SGLang pins 5.19.0) holds `rope_parameters` None, whatever
  config.json says, and its decoder layer asks `"rope_theta" in getattr(config,
  "rope_parameters", {})`: the model is not built (test_sglangs_longcat_flash_model_is_not_
  built_here). The family is proven on vLLM (tests/test_vllm_families.py).
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from unittest import mock

import pytest
import torch

from fi_convert.format.manifest import read
from tests import hf_checkpoints as hf
from tests import quantized_checkpoints as qc
from tests import remote_code_checkpoints as rc
from tests.inert_cuda import inert_cuda_streams
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
    # q_lora_rank 128: SGLang fuses q_a_proj with kv_a_proj_with_mqa, and their block scales
    "deepseek-v32-fp8-block": (
        "deepseek_v32",
        "fp8-block",
        dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=256, q_lora_rank=128),
    ),
    "deepseek-v32-bf16": ("deepseek_v32", None, {}),
    "phimoe-bf16": ("phimoe", None, {}),
    "exaone-bf16": ("exaone_moe", None, {}),
    "hy-v3-bf16": ("hy_v3", None, {}),
    "lfm2-bf16": ("lfm2_moe", None, {}),
    "cohere2-bf16": ("cohere2_moe", None, {}),
    "omni-bf16": ("qwen3_omni_moe", None, {}),
    "glm4v-bf16": ("glm4v_moe", None, {}),
    "gemma4-bf16": ("gemma4", None, {}),
    "diffusion-gemma-bf16": ("diffusion_gemma", None, {}),
    "hunyuan-bf16": ("hunyuan_v1_moe", None, {}),
    "granite-swa-bf16": ("granitemoe_swa", None, {}),
    "mellum-bf16": ("mellum", None, {}),
    "hy-v4-bf16": ("hy_v4", None, {}),
    "glm5-next-bf16": ("glm5_next", None, {}),
    "internvl-bf16": ("internvl_chat", None, {}),
    "kimi-vl-bf16": ("kimi_vl", None, {}),
    "kimi-k25-bf16": ("kimi_k25", None, {}),
    "dots-vlm-bf16": ("dots_vlm", None, {}),
    "kimi-linear-bf16": ("kimi_linear", None, {}),
    "qwen4-exp-bf16": ("qwen4_exp", None, {}),
    "qwen3-5-moe-bf16": ("qwen3_5_moe", None, {}),
    "intern-s2-preview-bf16": ("intern_s2_preview", None, {}),
    "cohere2-vision-bf16": ("cohere2_vision", None, {}),
    "minicpmv4-6-bf16": ("minicpmv4_6", None, {}),
    "minicpmv4-7-bf16": ("minicpmv4_7", None, {}),
    "granite-hybrid-bf16": ("granitemoehybrid", None, {}),
    "nemotron-bf16": ("nemotron_h", None, {}),
    "nemotron-vl-bf16": ("nemotron_h_nano_vl", None, {}),
    "nemotron-nano-omni-bf16": ("nemotron_h_nano_omni", None, {}),
    "nemotron-omni-bf16": ("nemotron_h_omni", None, {}),
    "minimax-m3-bf16": ("minimax_m3", None, {}),
    # Beam: SGLang's model takes FlashInfer's MoE for ModelOpt NVFP4 only (TRT-LLM)
    "beam-nvfp4": (
        "beam",
        "nvfp4",
        dict(hidden_size=128, moe_intermediate_size=128),
    ),  # (test_kimi_vl_equals_sglangs_default_load)
}
# the MoE modules SGLang's model builds for each transformers model
MOE = {
    "glm4_moe": ["model.layers.1.mlp.experts"],
    "minimax_m2": [f"model.layers.{i}.block_sparse_moe.experts" for i in (0, 1)],
    "ernie4_5_moe": ["model.layers.1.mlp.experts"],  # layer 0 dense (moe_layer_start_index)
    "olmoe": [f"model.layers.{i}.mlp.experts" for i in (0, 1)],
    "deepseek_v32": ["model.layers.1.mlp.experts"],
    "phimoe": [f"model.layers.{i}.block_sparse_moe.experts" for i in (0, 1)],
    "exaone_moe": ["model.layers.1.mlp.experts"],
    "hy_v3": ["model.layers.1.mlp.experts"],
    "lfm2_moe": ["model.layers.1.feed_forward.experts"],
    "cohere2_moe": [f"model.layers.{i}.mlp.experts" for i in (0, 1)],
    "qwen3_omni_moe": [f"thinker.model.layers.{i}.mlp.experts" for i in (0, 1)],
    "glm4v_moe": ["model.language_model.layers.1.mlp.experts"],
    "gemma4": [f"model.layers.{i}.experts" for i in (0, 1)],
    "diffusion_gemma": [f"model.decoder.layers.{i}.experts" for i in (0, 1)],
    "hunyuan_v1_moe": [f"model.layers.{i}.mlp.experts" for i in (0, 1)],
    "granitemoe_swa": [f"model.layers.{i}.block_sparse_moe.experts" for i in (0, 1)],
    "mellum": ["model.layers.1.mlp.experts"],  # layer 0 dense (mlp_layer_types)
    "hy_v4": ["model.layers.1.mlp.experts"],
    "glm5_next": ["model.language_model.layers.1.mlp.experts"],
    # Kimi Linear: a KDA layer (dense MLP), then an MLA one (its MoE block, which SGLang
    # builds as module block_sparse_moe, its layer named mlp.experts)
    "kimi_linear": ["model.layers.1.block_sparse_moe.experts"],
    # Qwen4 Exp: a gated-delta-net layer and an indexed-attention one, each with the MoE block
    "qwen4_exp": [f"model.language_model.layers.{i}.mlp.experts" for i in (0, 1)],
    "qwen3_5_moe": [f"model.language_model.layers.{i}.mlp.experts" for i in (0, 1)],
    "intern_s2_preview": [f"model.language_model.layers.{i}.mlp.experts" for i in (0, 1)],
    "cohere2_vision": [f"model.language_model.layers.{i}.mlp.experts" for i in (0, 1)],
    "minicpmv4_6": [f"model.language_model.layers.{i}.mlp.experts" for i in (0, 1)],
    "minicpmv4_7": [f"model.language_model.layers.{i}.mlp.experts" for i in (0, 1)],
    # Granite 4.0 hybrid: a Mamba2 layer, then an attention one, each with the MoE block
    "granitemoehybrid": [f"model.layers.{i}.block_sparse_moe.experts" for i in (0, 1)],
    # Nemotron-H: a Mamba layer, a MoE one (non-gated relu2 experts), an attention one
    "nemotron_h": ["backbone.layers.1.mixer.experts"],
    # Nemotron Nano VL / Nano Omni: Nemotron-H's model under language_model, beside RADIO
    "nemotron_h_nano_vl": ["language_model.backbone.layers.1.mixer.experts"],
    "nemotron_h_nano_omni": ["language_model.backbone.layers.1.mixer.experts"],
    "nemotron_h_omni": ["language_model.backbone.layers.1.mixer.experts"],
    # InternVL 3.5 MoE: SGLang's InternVLChatModel builds its Qwen3-MoE language model as
    # language_model, the checkpoint's prefix
    "internvl_chat": [f"language_model.model.layers.{i}.mlp.experts" for i in (0, 1)],
    # dots.vlm: the language model's tensors under their own names (model.layers.L), its
    # layers named so in SGLang's module language_model
    "dots_vlm": ["model.layers.1.mlp.experts"],
    # MiniMax-M3: a dense layer, then the MoE one (block_sparse_moe, which SGLang names mlp)
    "minimax_m3": ["language_model.model.layers.1.block_sparse_moe.experts"],
}
# where SGLang's module is not named as the checkpoint's layer: GLM-4.5V's language model is
# SGLang's module `model` (its load_weights drops `language_model.` from the checkpoint's names)
MODULES = {
    "glm4v_moe": ["model.layers.1.mlp.experts"],
    "gemma4": [f"model.layers.{i}.moe.experts" for i in (0, 1)],
    "diffusion_gemma": [f"model.layers.{i}.moe.experts" for i in (0, 1)],
    "glm5_next": ["model.layers.1.mlp.experts"],
    "qwen4_exp": [f"model.layers.{i}.mlp.experts" for i in (0, 1)],
    "qwen3_5_moe": [f"model.layers.{i}.mlp.experts" for i in (0, 1)],
    "dots_vlm": ["language_model.model.layers.1.mlp.experts"],
    "intern_s2_preview": [f"model.layers.{i}.mlp.experts" for i in (0, 1)],
    "cohere2_vision": [f"language_model.model.layers.{i}.mlp.experts" for i in (0, 1)],
    "minicpmv4_6": [f"llm.layers.{i}.mlp.experts" for i in (0, 1)],
    "minicpmv4_7": [f"llm.layers.{i}.mlp.experts" for i in (0, 1)],
    # Nemotron-H: the checkpoint's backbone.layers.L, SGLang's module model.layers.L
    "nemotron_h": ["model.layers.1.mixer.experts"],
    "nemotron_h_nano_vl": ["language_model.model.layers.1.mixer.experts"],
    "nemotron_h_nano_omni": ["language_model.model.layers.1.mixer.experts"],
    "nemotron_h_omni": ["language_model.model.layers.1.mixer.experts"],
    # MiniMax-M3: its language model is SGLang's module `model` (language_model. dropped)
    "minimax_m3": ["model.layers.1.mlp.experts"],
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
    ("deepseek-v32-fp8-block", "trtllm", "fp8-block"),
    ("deepseek-v32-bf16", "trtllm", "bf16"),
    ("phimoe-bf16", "trtllm", "bf16"),
    ("phimoe-bf16", "cutlass", "bf16"),
    ("exaone-bf16", "trtllm", "bf16"),
    ("hy-v3-bf16", "trtllm", "bf16"),
    ("lfm2-bf16", "trtllm", "bf16"),
    ("cohere2-bf16", "cutlass", "bf16"),
    ("omni-bf16", "trtllm", "bf16"),
    ("glm4v-bf16", "trtllm", "bf16"),
    ("glm4v-bf16", "cutlass", "bf16"),
    # Gemma 4's gelu_tanh experts: SGLang's TRT-LLM BF16 runner takes silu and relu2 only
    ("gemma4-bf16", "cutlass", "bf16"),
    # DiffusionGemma: Gemma 4's MoE layers in its decoder (its encoder's tied to them)
    ("diffusion-gemma-bf16", "cutlass", "bf16"),
    # Hunyuan-A13B: its per-layer moe_intermediate_size as published; I 96, padded per rank
    ("hunyuan-bf16", "trtllm", "bf16"),
    ("hunyuan-bf16", "cutlass", "bf16"),
    # Granite-MoE SWA: transformers 5's fused gate_up_proj / down_proj; I 96, padded per rank
    ("granite-swa-bf16", "trtllm", "bf16"),
    ("granite-swa-bf16", "cutlass", "bf16"),
    # Mellum: Qwen3-MoE's layers (SGLang's MellumForCausalLM), a dense layer then a MoE one
    ("mellum-bf16", "trtllm", "bf16"),
    ("mellum-bf16", "cutlass", "bf16"),
    # HY v4: MLA with its indexer, hyper-connections, fused experts with a SwiGLU clamp
    ("hy-v4-bf16", "trtllm", "bf16"),
    ("hy-v4-bf16", "cutlass", "bf16"),
    # GLM-5 Next: KDA and MLA layers (an indexer, hyper-connections), a SwiGLU clamp
    ("glm5-next-bf16", "trtllm", "bf16"),
    ("glm5-next-bf16", "cutlass", "bf16"),
    # InternVL 3.5 MoE (InternVLChatModel): its language model's config read from llm_config
    ("internvl-bf16", "trtllm", "bf16"),
    ("internvl-bf16", "cutlass", "bf16"),
    # Kimi Linear: KDA and MLA layers, sigmoid + bias routing in groups (DeepSeekV3)
    ("kimi-linear-bf16", "trtllm", "bf16"),
    ("kimi-linear-bf16", "cutlass", "bf16"),
    # Qwen4 Exp: Qwen3.5's layers (its module imports models/qwen3_5.py) with Qwen2-MoE's block
    ("qwen4-exp-bf16", "trtllm", "bf16"),
    ("qwen4-exp-bf16", "cutlass", "bf16"),
    # Qwen3.5 MoE, the whole multimodal model (models/qwen3_5.py, importable beside the stand-in)
    ("qwen3-5-moe-bf16", "trtllm", "bf16"),
    ("qwen3-5-moe-bf16", "cutlass", "bf16"),
    # dots.vlm (DotsVLMForCausalLM): its DeepSeek-V3 language model's keys at config.json's top
    ("dots-vlm-bf16", "trtllm", "bf16"),
    ("dots-vlm-bf16", "cutlass", "bf16"),
    # Intern-S2 Preview: SGLang's Qwen3.5 MoE class under its own name and model_type
    ("intern-s2-preview-bf16", "trtllm", "bf16"),
    ("intern-s2-preview-bf16", "cutlass", "bf16"),
    # Cohere2 Vision: transformers' whole model over a Cohere2-MoE language model (text_config)
    ("cohere2-vision-bf16", "cutlass", "bf16"),
    ("cohere2-vision-bf16", "trtllm", "bf16"),
    # MiniCPM-V 4.6: transformers' whole model over a Qwen3.5 MoE language model (text_config)
    ("minicpmv4-6-bf16", "trtllm", "bf16"),
    ("minicpmv4-6-bf16", "cutlass", "bf16"),
    ("minicpmv4-7-bf16", "trtllm", "bf16"),
    ("minicpmv4-7-bf16", "cutlass", "bf16"),
    # Granite 4.0 hybrid (its module imports SGLang's distributed bootstrap: uvicorn's stand-in)
    ("granite-hybrid-bf16", "trtllm", "bf16"),
    ("granite-hybrid-bf16", "cutlass", "bf16"),
    # Nemotron-H: non-gated relu2 experts (the same module import)
    ("nemotron-bf16", "trtllm", "bf16"),
    ("nemotron-bf16", "cutlass", "bf16"),
    # Nemotron Nano VL (NemotronH_Nano_VL_V2) and its bodiless subclass Nano Omni: Nemotron-H's
    # language model (llm_config) under a RADIO vision tower (SGLang's RadioModel)
    ("nemotron-vl-bf16", "trtllm", "bf16"),
    ("nemotron-vl-bf16", "cutlass", "bf16"),
    ("nemotron-nano-omni-bf16", "trtllm", "bf16"),
    ("nemotron-nano-omni-bf16", "cutlass", "bf16"),
    # Nemotron Omni (NemotronH_Omni_Reasoning_V3, model_type nemotron_h_omni): the same layout
    ("nemotron-omni-bf16", "trtllm", "bf16"),
    ("nemotron-omni-bf16", "cutlass", "bf16"),
    # MiniMax-M3: silu experts with SwiGLU-OAI's alpha and clamp, which SGLang's CUTLASS runner
    # takes (its TRT-LLM BF16 runner has no field for them)
    ("minimax-m3-bf16", "cutlass", "bf16"),
]
MODELS = [(*run, tp) for run in RUNS for tp in (1, 2)]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sgl-families-src")
    done: dict[str, Path] = {}

    def get(case: str) -> Path:  # (get.root: where the sources are written)
        if case not in done:
            kind, quant, sizes = CASES[case]
            if quant is None:
                done[case] = hf.save(kind, root / case, **sizes)
            else:
                done[case] = qc.write(kind, root / case, quant, **sizes)
        return done[case]

    get.root = root  # type: ignore[attr-defined]
    return get


@pytest.mark.parametrize(("case", "backend", "scheme", "tp"), MODELS)
def test_a_whole_model_of_the_family_equals_sglangs_default_load(
    case, backend, scheme, tp, sources, tmp_path
):
    src, (kind, quant, _) = sources(case), CASES[case]
    out = _convert(src, tmp_path / "out", scheme, backend, tp)
    assert sorted(read(out)["layers"]) == MOE[kind]
    arch = json.loads((src / "config.json").read_text())["architectures"][0]
    if arch not in _sglangs_own_architectures():  # an older release, without the family's class
        _assert_refused_for_the_transformers_backend(src, out, arch, backend)
        return
    for rank in range(tp):
        with _device_answered(kind):
            ours, theirs = _both(src, out, quant or "bf16", backend, tp, rank)
        moe = _moe(theirs)
        assert sorted(moe) == MODULES.get(kind, MOE[kind])
        assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
        params, states = _differences(ours, theirs)
        left = _unwritten_rows_left(ours, theirs, kind, tp)
        assert ([n for n in params if n not in left], states) == ([], {}), f"rank {rank} of {tp}"


# Models whose Mamba2 mixers have one group of B/C heads (Granite 4.0 hybrid as published:
# mamba_n_groups 1), which SGLang's MambaMixer2 builds as plain ColumnParallelLinear layers
# (conv1d, in_proj) with a loader of its own (mamba_v2_sharded_weight_loader) that copies this
# rank's share, its group replicated, by the TP size of SGLang's parallel context. Here SGLang's
# linear layers take their width from the process group, which holds this one process: at TP 2
# they are built whole, and that loader fills this rank's share of rows at their start, in both
# loads alike; the rows past it hold whatever memory they were allocated with. The share
# (what a TP rank of SGLang holds) is compared.
MAMBA_ONE_GROUP = {"granitemoehybrid"}


def _unwritten_rows_left(ours, theirs, kind: str, tp: int) -> set[str]:
    """MAMBA_ONE_GROUP's one-group mixer parameters whose rank's rows are equal (the rows past
    them not compared)."""
    if tp == 1 or kind not in MAMBA_ONE_GROUP:
        return set()
    names, b = set(), dict(ours.named_parameters())
    for prefix, mixer in theirs.named_modules():
        if type(mixer).__name__ != "MambaMixer2":
            continue
        assert (mixer.tp_size, mixer.n_groups) == (tp, tp)  # (one group, replicated)
        inner, groups = mixer.intermediate_size, 2 * mixer.groups_ssm_state_size
        share = {
            "conv1d.weight": (inner + groups) // tp,
            "conv1d.bias": (inner + groups) // tp,
            "in_proj.weight": (2 * inner + groups + mixer.num_heads) // tp,
        }
        for leaf, rows in share.items():
            name, a = f"{prefix}.{leaf}", mixer.get_parameter(leaf)
            assert a.shape[0] > rows and torch.equal(a[:rows], b[name][:rows]), name
            # (the source's values; its conv1d bias is transformers' zeros)
            assert leaf.endswith("bias") or a[:rows].detach().abs().sum() > 0, name
            names.add(name)
    assert names, "no one-group Mamba2 mixer"
    return names


# models whose module asks SGLang's get_device() where to put a module it builds (MiniCPM-V
# 4.6's and 4.7's merger, models/minicpmv.py init_resampler), which raises without an
# accelerator: it answers the CPU, where both loads run (the weights are loaded after, as on a
# GPU)
DEVICE_ASKED = dict.fromkeys(
    ("minicpmv4_6", "minicpmv4_7"), "sglang.srt.models.minicpmv.get_device"
)


def _device_answered(kind: str):
    """For DEVICE_ASKED's models (their module imported by SGLang's registry, read before):
    get_device() answers the CPU."""
    if kind not in DEVICE_ASKED:
        return contextlib.nullcontext()
    return mock.patch(DEVICE_ASKED[kind], lambda device_id=None: "cpu")


def _sglangs_own_architectures() -> set[str]:
    """The architectures the installed SGLang has a model class of its own for (its registry;
    K-EXAONE's ExaoneMoeForCausalLM from 0.5.22 on: 0.5.20 and 0.5.21 name theirs
    ExaoneMoEForCausalLM only)."""
    from tests import sglang_moe as sm

    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.models.registry import ModelRegistry

        return set(ModelRegistry.get_supported_archs())


def _assert_refused_for_the_transformers_backend(src: Path, out: Path, arch: str, backend: str):
    """Where the installed SGLang has no model class of the family's architecture, it serves
    the source through its generic Transformers backend (its own load says so), which the plugin
    does not load into: it refuses the output in one line, before building the model."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture
    from sglang.srt.server_args import ServerArgs

    from fi_convert.servers.sglang import loader
    from fi_convert.servers.sglang.checks import PluginError
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    with sm.sglang_context(backend, read(out)["tp_size"], 0):
        args = ServerArgs(model_path=str(src), moe_runner_backend=sm.BACKEND[backend])
        _, resolved = get_model_architecture(ModelConfig.from_server_args(args))
        assert resolved.startswith("Transformers"), resolved  # SGLang's own: its backend
        built = mock.patch.object(loader, "_initialize_model", side_effect=AssertionError)
        with built, pytest.raises(PluginError) as e:
            _model(None, out, "fi-convert", backend)
    assert "\n" not in str(e.value)
    assert f"has no model class of its own for {arch} (config.json's architectures)" in str(e.value)
    assert str(e.value).endswith("install an SGLang that has one: 0.5.22, 0.5.23")


@pytest.mark.parametrize(
    ("case", "releases"),
    [("exaone-bf16", ["0.5.22", "0.5.23"]), ("hy-v4-bf16", ["0.5.22", "0.5.23"])],
)
def test_the_manifest_lists_only_releases_with_a_model_for_the_architecture(
    case, releases, sources, tmp_path
):
    """K-EXAONE as transformers writes it has no class on 0.5.20-0.5.21 (ExaoneMoeForCausalLM);
    their HYV4Config refuses HY v4's layer_types (indexed_attention): those releases hold the
    bytes, but their lists leave them out (architectures.json, read from each release)."""
    src = sources(case)
    m = read(_convert(src, tmp_path / "out", "bf16", "trtllm", 1))
    assert (
        m["source"]["architectures"]
        == json.loads((src / "config.json").read_text())["architectures"]
    )
    assert m["target"]["sglang_releases"] == releases
    assert m["target"]["sglang_versions"] == ">=0.5.22,<=0.5.23"


def test_a_release_without_the_architectures_model_class_is_refused(sources, tmp_path, monkeypatch):
    """The refusal on any release: the installed SGLang's registry without K-EXAONE's class
    for the source's architecture (as 0.5.20's and 0.5.21's have none), so that SGLang's own
    load takes its Transformers backend; the plugin refuses the output in one line."""
    from tests import sglang_moe as sm

    src = sources("exaone-bf16")
    out = _convert(src, tmp_path / "out", "bf16", "trtllm", 1)
    arch = json.loads((src / "config.json").read_text())["architectures"][0]
    if arch in _sglangs_own_architectures():
        with sm.sglang_context("trtllm", 1, 0):
            from sglang.srt.models.registry import ModelRegistry

            monkeypatch.delitem(ModelRegistry.models, arch)
    _assert_refused_for_the_transformers_backend(src, out, arch, "trtllm")


# families whose SGLang 0.5.23 model builds no FusedMoE layer: (its model module, the model
# class, its MoE block class, the source's writer, trust_remote_code)
NO_FUSED_MOE = {
    "afmoe": ("afmoe", "AfmoeForCausalLM", "AfmoeMoE", lambda root: hf.save("afmoe", root), False),
    "deepseek-v1": (
        "deepseek",
        "DeepseekForCausalLM",
        "DeepseekMoE",
        lambda root: rc.save_deepseek_v1(root),
        True,
    ),
}


@pytest.fixture(scope="module")
def no_fused_moe(tmp_path_factory):
    """The sources of NO_FUSED_MOE, written once; transformers' copies of remote code kept in
    a temporary folder meanwhile."""
    root, made = tmp_path_factory.mktemp("sgl-no-fused-moe"), {}
    with rc.modules_cache(root / "hf-modules"):

        def get(kind: str) -> Path:
            if kind not in made:
                made[kind] = NO_FUSED_MOE[kind][3](root / kind)
            return made[kind]

        yield get


@pytest.mark.parametrize("kind", sorted(NO_FUSED_MOE))
def test_sglangs_model_builds_no_moe_layer(no_fused_moe, kind):
    """Why AFMoE and DeepSeek-MoE v1 have no case above: SGLang 0.5.23's own model of each (its
    default load of a checkpoint of the family) holds no FusedMoE layer; its experts are
    per-expert MLPs it runs through SGLang's fused_moe function itself."""
    import importlib

    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    module, cls, block, _, remote = NO_FUSED_MOE[kind]
    src = no_fused_moe(kind)
    with sm.sglang_context("trtllm", 1, 0):
        models = importlib.import_module(f"sglang.srt.models.{module}")
        model = _model(None, src, "auto", "trtllm", trust_remote_code=remote)
    assert type(model) is getattr(models, cls)
    assert isinstance(model.model.layers[1].mlp, getattr(models, block))
    assert _moe(model) == {}
    assert len(model.model.layers[1].mlp.experts) == 4  # its own per-expert MLPs


@pytest.mark.parametrize("kind", sorted(NO_FUSED_MOE))
def test_an_output_for_sglang_is_refused_at_plan_time(no_fused_moe, kind, tmp_path):
    """fi-convert writes no `--server sglang` output of these families (SGLang would not serve
    it: the test above), in one line naming why; vLLM's is planned."""
    from fi_convert import Backend, Options, SchemeName, convert
    from fi_convert.errors import SchemeMismatchError

    src = no_fused_moe(kind)
    with pytest.raises(SchemeMismatchError, match="building no FusedMoE layer"):
        _convert(src, tmp_path / "out", "bf16", "cutlass", 1)
    convert(src, tmp_path / "vllm", Options(SchemeName.BF16, Backend.CUTLASS, 1), device="cpu")
    assert read(tmp_path / "vllm")["layers"]


# SGLang's module of Kimi-VL's vision tower (MoonViT)
MOONVIT = "sglang.srt.models.kimi_vl_moonvit"
# SGLang's module of the yarn rotary embedding Sarvam-105B builds
ROPE = "sglang.srt.layers.rotary_embedding.rope_variant"
LING = {
    "ling3_vl": rc.save_ling3_vl,
    "ling2": rc.save_ling2,
    "ling1": rc.save_ling1,
    "sarvam_moe": rc.save_sarvam_moe,
    "sarvam_mla": rc.save_sarvam_mla,
    "ling25": rc.save_ling25,
    "ling3": rc.save_ling3,
}


# the MoE layers of each (layer 1 alone where not named)
LING_LAYERS = {"ling1": (0, 1), "ling25": (1, 2), "ling3": (1, 2), "ling3_vl": (1, 2)}
# (kind, backend): TRT-LLM for each, CUTLASS too for Ling 2.5 and Ling 3
LING_RUNS = [(kind, "trtllm") for kind in sorted(LING)]
LING_RUNS += [(kind, "cutlass") for kind in ("ling25", "ling3", "ling3_vl")]


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize(("kind", "backend"), LING_RUNS)
def test_ling_equals_sglangs_default_load(tmp_path_factory, tmp_path, kind, backend, tp):
    """Ling 2.0 (BailingMoeV2ForCausalLM), Ling v1 (BailingMoeForCausalLM), Sarvam-30B
    (SarvamMoEForCausalLM, SGLang's BailingMoE model under Sarvam's name) and Sarvam-105B
    (SarvamMLAForCausalLM: MLA attention, its published yarn rotary embedding, whose SGLang
    class asks the platform for its device when built: "cpu" here) in BF16 on TRT-LLM, and
    Ling 2.5 (BailingMoeV2_5ForCausalLM: linear-attention and MLA layers) and Ling 3
    (BailingMoeV3ForCausalLM: KDA and MLA layers, each MoE layer's SwiGLU clamp SGLang builds
    the one fi-convert reads), both read with SGLang's own BailingHybridConfig for their
    model_type, on both backends, their config classes remote code
    as published (tests/remote_code_checkpoints.py: --trust-remote-code for both loads); Ling 3
    VL (BailingMoeV3VLForConditionalGeneration: Ling 3 under its own names beside a vision
    tower, read with SGLang's own BailingMoeV3VLConfig, its language model SGLang's module
    model) on both backends."""
    from fi_convert.source import find_family, open_checkpoint
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = tmp_path_factory.getbasetemp() / f"sgl-{kind}-src"
    if not src.exists():
        LING[kind](src)
    out = _convert(src, tmp_path / "out", "bf16", backend, tp)
    layers = [f"model.layers.{i}.mlp.experts" for i in LING_LAYERS.get(kind, (1,))]
    # (Ling 3 VL's language model: SGLang's module model, the checkpoint's names its own)
    modules = [f"model.{n}" if kind == "ling3_vl" else n for n in layers]
    with rc.modules_cache(tmp_path_factory.getbasetemp() / "hf-modules"):
        for rank in range(tp):
            with (
                sm.sglang_context(backend, tp, rank),
                mock.patch(f"{ROPE}.get_device", lambda: "cpu"),  # (imported in the context)
            ):
                ours = _model(None, out, "fi-convert", backend, trust_remote_code=True)
                theirs = _model(None, src, "auto", backend, trust_remote_code=True)
            moe = _moe(theirs)
            assert sorted(moe) == modules
            assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
            assert _differences(ours, theirs) == ([], {}), f"rank {rank} of {tp}"
    if kind.startswith("ling3"):  # its clamp per layer (expert_swiglu_limit_list), as read
        pairs = zip(layers, modules, strict=True)
        clamps = {n: moe[m].moe_runner_config.gemm1_clamp_limit for n, m in pairs}
        assert clamps == {layers[0]: None, layers[1]: 7.0}
        assert {x.prefix: x.swiglu_limit for x in find_family(open_checkpoint(src))[1]} == clamps


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_k2_horizon_equals_sglangs_default_load(tmp_path_factory, tmp_path, backend, tp):
    """K2 Horizon (K2HorizonForCausalLM: SGLang's xLLM model under K2 Horizon's config keys,
    which it normalizes; no public checkpoint found: tests/remote_code_checkpoints.py, its
    attention without MoVA) in BF16 on both backends, its config class remote code."""
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = tmp_path_factory.getbasetemp() / "sgl-k2-horizon-src"
    with rc.modules_cache(tmp_path_factory.getbasetemp() / "hf-modules"):
        if not src.exists():
            rc.save_k2_horizon(src)
        out = _convert(src, tmp_path / "out", "bf16", backend, tp)
        for rank in range(tp):
            with sm.sglang_context(backend, tp, rank):
                ours = _model(None, out, "fi-convert", backend, trust_remote_code=True)
                theirs = _model(None, src, "auto", backend, trust_remote_code=True)
            assert type(theirs).__name__ == "K2HorizonForCausalLM"
            moe = _moe(theirs)
            assert sorted(moe) == ["model.layers.1.mlp.experts"]
            assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
            assert _differences(ours, theirs) == ([], {}), f"rank {rank} of {tp}"


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_interns1_equals_sglangs_default_load(tmp_path_factory, tmp_path, backend, tp):
    """Intern-S1 (InternS1ForConditionalGeneration) as internlm/Intern-S1 publishes it (tests/
    remote_code_checkpoints.py: transformers' InternVL layout under model., its config class
    remote code): fi-convert takes it as Qwen3-MoE by its text_config; SGLang 0.5.23 builds its
    Qwen3-MoE language model without the checkpoint's prefix (modules language_model.model.
    layers.L.mlp.experts, layers named model.layers.L.mlp.experts, the checkpoint's model.
    language_model.layers.L.mlp.experts), which the plugin finds as the one output layer
    that, less one of its parts, is the layer's name. BF16 on both backends."""
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    base = tmp_path_factory.getbasetemp()
    src = base / "sgl-interns1-src"
    with rc.modules_cache(base / "hf-modules"):
        if not src.exists():
            rc.save_interns1(src)
        out = _convert(src, tmp_path / "out", "bf16", backend, tp)
        layers = [f"model.language_model.layers.{i}.mlp.experts" for i in (0, 1)]
        assert sorted(read(out)["layers"]) == layers
        for rank in range(tp):
            with sm.sglang_context(backend, tp, rank):
                ours = _model(None, out, "fi-convert", backend, trust_remote_code=True)
                theirs = _model(None, src, "auto", backend, trust_remote_code=True)
            moe = _moe(theirs)
            assert sorted(moe) == [f"language_model.model.layers.{i}.mlp.experts" for i in (0, 1)]
            assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
            assert _differences(ours, theirs) == ([], {}), f"rank {rank} of {tp}"


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_kimi_vl_equals_sglangs_default_load(sources, tmp_path, backend, tp):
    """Kimi-VL (KimiVLForConditionalGeneration; tests/hf_checkpoints.py: its DeepSeek-V3
    language model under language_model., a MoonViT vision tower): fi-convert takes it as
    DeepSeek-V3 by its text_config; SGLang builds the language model under the checkpoint's
    prefix. Its MoonViT's rotary embedding asks the platform for its device when built: "cpu"
    here. BF16 on both backends."""
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = sources("kimi-vl-bf16")
    out = _convert(src, tmp_path / "out", "bf16", backend, tp)
    layers = ["language_model.model.layers.1.mlp.experts"]
    assert sorted(read(out)["layers"]) == layers
    for rank in range(tp):
        with (
            sm.sglang_context(backend, tp, rank),
            mock.patch(f"{MOONVIT}.get_device", lambda: "cpu"),  # (imported in the context)
        ):
            ours = _model(None, out, "fi-convert", backend)
            theirs = _model(None, src, "auto", backend)
        moe = _moe(theirs)
        assert sorted(moe) == layers
        assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
        assert _differences(ours, theirs) == ([], {}), f"rank {rank} of {tp}"


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_kimi_k25_equals_sglangs_default_load(sources, tmp_path, backend, tp):
    """Kimi-K2.5 (KimiK25ForConditionalGeneration; tests/hf_checkpoints.py: its DeepSeek-V3
    language model under language_model., text_config.model_type kimi_k2, MoonViT 3D beside
    mm_projector.): fi-convert takes it as DeepSeek-V3 by its text_config; SGLang 0.5.23 builds
    the language model without the checkpoint's prefix (its load_weights drops language_model.:
    modules language_model.model.layers.L.mlp.experts, layers named model.layers.L.mlp.experts),
    which the plugin finds as the one output layer that, less one part, is the layer's name.
    BF16 on both backends."""
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = sources("kimi-k25-bf16")
    out = _convert(src, tmp_path / "out", "bf16", backend, tp)
    assert sorted(read(out)["layers"]) == ["language_model.model.layers.1.mlp.experts"]
    for rank in range(tp):
        with sm.sglang_context(backend, tp, rank):
            ours = _model(None, out, "fi-convert", backend)
            theirs = _model(None, src, "auto", backend)
        assert type(theirs).__name__ == "KimiK25ForConditionalGeneration"
        moe = _moe(theirs)
        assert sorted(moe) == ["language_model.model.layers.1.mlp.experts"]
        assert {m.layer_id for m in moe.values()} == {1}
        assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
        assert _differences(ours, theirs) == ([], {}), f"rank {rank} of {tp}"


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_kimi_k3_equals_sglangs_default_load(tmp_path_factory, tmp_path, backend, tp):
    """Kimi K3 (KimiK3ForConditionalGeneration, tests/hf_checkpoints.py: Kimi Linear's language
    model with a latent MoE under language_model., Kimi-K2.5's vision tensors): SGLang 0.5.23
    builds its language model (KimiK3LinearForCausalLM) without the checkpoint's prefix, its MoE
    block as mlp (its mapper: block_sparse_moe is mlp), the routed experts of
    routed_expert_hidden_size (KimiK3MoE). BF16 on both backends."""
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = hf.save("kimi_k3", tmp_path_factory.mktemp("k3") / "src")
    out = _convert(src, tmp_path / "out", "bf16", backend, tp)
    assert sorted(read(out)["layers"]) == ["language_model.layers.1.block_sparse_moe.experts"]
    for rank in range(tp):
        with sm.sglang_context(backend, tp, rank), inert_cuda_streams():
            ours = _model(None, out, "fi-convert", backend)
            theirs = _model(None, src, "auto", backend)
        assert type(theirs).__name__ == "KimiK3ForConditionalGeneration"
        moe = _moe(theirs)
        assert sorted(moe) == ["language_model.model.layers.1.mlp.experts"]
        assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
        assert {m.hidden_size for m in moe.values()} == {hf.KIMI_K3_LATENT}  # (its latent)
        assert _differences(ours, theirs) == ([], {}), f"rank {rank} of {tp}"


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_step3_vl_equals_sglangs_default_load(tmp_path_factory, tmp_path, backend, tp):
    """Step3-VL (Step3VLForConditionalGeneration, stepfun-ai/step3 as published: tests/
    family_forms_models.py): fi-convert takes it as Step-3 by its text_config (the family's
    packed experts model.layers.L.moe.{gate,up,down}_proj [E, out, in]); SGLang's own model,
    whose load_weights hands each expert its slice of the packed tensors, builds the layer as
    model.layers.1.moe.experts. BF16 on both backends.

    SGLang's Step3VisionAttention builds an out_proj that its forward never uses, and its
    load_weights puts the checkpoint's self_attn.out_proj into self_attn.attn.proj: that
    out_proj is left as allocated by either load (shown), the one parameter not compared.
    (Whether that uninitialised memory differs from the stored tensor is not asserted: reused
    memory can hold the same bytes, and did once in twenty runs.) Its config.json's text_config
    names Step3TextForCausalLM, which SGLang has no class for
    (a text-only Step-3 checkpoint is refused): SGLang takes the top-level architecture."""
    from safetensors.torch import load_file

    from fi_convert.servers.sglang.target import SGLANG_TARGET
    from tests import family_forms_models as ffm
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = tmp_path_factory.getbasetemp() / "sgl-step3-vl-src"
    if not src.exists():
        ffm.save_step3_vl(src)
    text = ["Step3TextForCausalLM"]
    assert "Step3TextForCausalLM" in SGLANG_TARGET.refuses_source("bf16", backend, None, text)
    out = _convert(src, tmp_path / "out", "bf16", backend, tp)
    layers = ["model.layers.1.moe.experts"]
    assert sorted(read(out)["layers"]) == layers
    attention = "vision_model.transformer.layers.0.self_attn."
    unused = {f"{attention}out_proj.{p}" for p in ("weight", "bias")}
    stored = load_file(src / "model-00001-of-00002.safetensors")[f"{attention}out_proj.weight"]
    for rank in range(tp):
        with sm.sglang_context(backend, tp, rank):
            ours = _model(None, out, "fi-convert", backend)
            theirs = _model(None, src, "auto", backend)
        moe = _moe(theirs)
        assert sorted(moe) == layers
        assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
        params = dict(theirs.named_parameters())
        assert torch.equal(params[f"{attention}attn.proj.weight"], stored)
        different, states = _differences(ours, theirs)
        assert set(different) <= unused and states == {}, f"rank {rank} of {tp}"


@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_sglangs_beam_model_refuses_flashinfers_bf16_runners(tmp_path, backend):
    """Why Beam has no case above (servers/sglang/target.py refuses it): SGLang 0.5.23's
    BeamForCausalLM (models/beam.py) runs BF16 and FP8 experts on its auto or Triton MoE runner
    only, refusing FlashInfer's, and takes FlashInfer's TRT-LLM for ModelOpt NVFP4 alone (whose
    load through the plugin is not proven here)."""
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = hf.save("beam", tmp_path / "src")
    with (
        sm.sglang_context(backend, 1, 0),
        pytest.raises(ValueError, match="Beam supports the auto or triton MoE runner for BF16"),
    ):
        _model(None, src, "auto", backend)


def test_sglangs_longcat_flash_model_is_not_built_here(tmp_path):
    """Why LongCat-Flash has no case above: SGLang 0.5.23's own LongcatFlashConfig
    (configs/longcat_flash.py), under this venv's transformers, holds `rope_parameters` None,
    and its decoder layer asks `"rope_theta" in getattr(config, "rope_parameters", {})`."""
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = hf.save("longcat_flash", tmp_path / "src")
    with (
        sm.sglang_context("cutlass", 1, 0),
        pytest.raises(TypeError, match="argument of type 'NoneType' is not iterable"),
    ):
        _model(None, src, "auto", "cutlass")


def test_sglangs_laguna_load_asks_every_expert_tensor_itself(tmp_path):
    """Why Laguna has no case above: SGLang 0.5.23's LagunaForCausalLM.load_weights counts the
    routed experts' w1/w2/w3 tensors it is handed and fails when any is missing, so a load that
    fills its MoE layers otherwise (the plugin's, from an output's stacked tensors) is refused
    by SGLang's own model; fi-convert writes no SGLang output of Laguna, in one line."""
    from safetensors.torch import load_file

    from fi_convert.errors import SchemeMismatchError
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = hf.save("laguna", tmp_path / "src")
    with sm.sglang_context("trtllm", 1, 0):
        model = _model(None, src, "auto", "trtllm")  # SGLang's default load of the source
    assert sorted(_moe(model)) == ["model.layers.1.mlp.experts"]
    tensors = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors |= load_file(shard)
    others = [(n, t) for n, t in tensors.items() if not re.search(r"\.experts\.\d+\.", n)]
    with pytest.raises(RuntimeError, match="12 routed-expert tensors were not loaded"):
        model.load_weights(others)
    with pytest.raises(SchemeMismatchError, match="counts the routed experts"):
        _convert(src, tmp_path / "out", "bf16", "trtllm", 1)
    assert not (tmp_path / "out").exists()


def test_sglangs_intern_s2_load_asks_every_expert_tensor_itself():
    """Why Intern-S2 (InternS2MobiusForConditionalGeneration) has no family: SGLang 0.5.23's
    load_weights (models/interns2_mobius.py, _load_mobius_weights_strict) counts every slot it
    fills, each routed expert's w1, w3 and w2 of every meta_mlp bank among them, and refuses a
    load that leaves any unfilled, so a load that fills its MoE layers otherwise (the plugin's:
    SGLang's load_weights over the output's non-expert tensors, then the stacked experts) is
    refused by SGLang's own model, as Laguna's is. Shown on its own function with an owner
    holding one bank's FusedMoE parameters and an embedding; a load handing the bank's fused
    expert tensors fills them all."""
    import types

    from torch import nn

    from tests import sglang_moe as sm

    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.models.interns2_mobius import _load_mobius_weights_strict

    def loader(parameter, weight, *where):
        names.append(where)

    def param(*shape: int) -> nn.Parameter:
        p = nn.Parameter(torch.zeros(shape), requires_grad=False)
        p.weight_loader = loader  # type: ignore[attr-defined]
        return p

    names: list[tuple] = []
    owner, model, embed_tokens, bank, experts = (nn.Module() for _ in range(5))
    owner.model, model.embed_tokens, model.meta_mlp = model, embed_tokens, nn.ModuleList([bank])
    embed_tokens.weight, bank.experts = param(8, 4), experts
    experts.w13_weight, experts.w2_weight = param(2, 6, 4), param(2, 4, 3)
    config = types.SimpleNamespace(num_experts=2, tie_word_embeddings=False)
    embed = [("model.language_model.embed_tokens.weight", torch.ones(8, 4))]
    with pytest.raises(ValueError, match=r"Mobius weight coverage failure; missing destinations"):
        _load_mobius_weights_strict(owner, config, embed)
    names.clear()
    experts = [
        ("model.language_model.meta_mlp.0.experts.gate_up_proj", torch.ones(2, 6, 4)),
        ("model.language_model.meta_mlp.0.experts.down_proj", torch.ones(2, 4, 3)),
    ]
    assert len(_load_mobius_weights_strict(owner, config, embed + experts)) == 3
    assert len(names) == 1 + 2 * 3  # the embedding, each expert's w1, w3 and w2


def test_gemma4_on_sglangs_trtllm_bf16_runner_is_refused(tmp_path):
    """Why Gemma 4 has no TRT-LLM case above: SGLang 0.5.23's FlashInfer TRT-LLM BF16 runner
    asserts silu or relu2 experts (moe_runner/flashinfer_trtllm.py), and Gemma 4's are gelu:
    fi-convert refuses that output at plan time, in one line naming the runner; CUTLASS's
    runner takes them (Geglu), and converts."""
    import inspect

    from sglang.srt.layers.moe.moe_runner import flashinfer_trtllm

    from fi_convert.errors import SchemeMismatchError

    source = inspect.getsource(flashinfer_trtllm.fused_experts_none_to_flashinfer_trtllm_bf16)
    assert '_SUPPORTED_BF16_ACTIVATIONS = {"silu", "relu2"}' in source
    src = hf.save("gemma4", tmp_path / "src")
    with pytest.raises(SchemeMismatchError, match="flashinfer_trtllm MoE runner takes no gelu_t"):
        _convert(src, tmp_path / "out", "bf16", "trtllm", 1)
    assert read(_convert(src, tmp_path / "c", "bf16", "cutlass", 1))["layers"]


def test_sglangs_puzzle_config_gives_each_moe_layer_the_sizes_fi_convert_reads(tmp_path):
    """Nemotron-H Puzzle for SGLang: its model module cannot be imported on CPU (as
    Nemotron-H's, whose MoE layers tests/test_sglang_non_gated.py proves), so what is shown here
    is the config: SGLang's own NemotronHPuzzleConfig (configs/nemotron_h.py, the class its
    config loader picks for model_type nemotron_h_puzzle, no remote code) gives each MoE layer
    the expert count and size fi-convert reads from block_configs and finds in the tensors."""
    from fi_convert.families import declared
    from fi_convert.source import open_checkpoint
    from tests import sglang_moe as sm

    src = rc.save_nemotron_h_puzzle(tmp_path / "src")
    config = open_checkpoint(src).config
    (fam,) = declared(config)
    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.configs.nemotron_h import NemotronHPuzzleConfig
        from sglang.srt.utils.hf_transformers_utils import get_config

        theirs = get_config(str(src), trust_remote_code=False)
    assert type(theirs) is NemotronHPuzzleConfig
    for layer in (1, 2):
        at = theirs.get_nemotron_h_config_for_layer(layer)
        prefix = f"backbone.layers.{layer}.mixer.experts"
        ours = [fam.config_value(config, k, prefix) for k in ("num_experts", "intermediate_size")]
        assert ours == [at.n_routed_experts, at.moe_intermediate_size]
    assert (
        theirs.get_nemotron_h_config_for_layer(2).n_routed_experts,
        theirs.n_routed_experts,
    ) == (
        3,
        4,
    )
    out = _convert(src, tmp_path / "out", "bf16", "trtllm", 1)
    layers = read(out)["layers"]
    assert sorted(layers) == [f"backbone.layers.{i}.mixer.experts" for i in (1, 2)]


@pytest.mark.parametrize(
    "arch", ["BailingMMNativeForConditionalGeneration", "BailingMM2NativeForConditionalGeneration"]
)
def test_sglangs_own_load_of_ming_omni_fails(tmp_path, arch):
    """Why Ming-Omni has no case above: SGLang 0.5.23's own load of it (models/bailing_mm.py)
    hands its language model's tensors to BailingMoeV2ForCausalLM.load_weights, which returns
    None, then logs len() of that: every load of the model fails there, after its weights are
    read (a tiny Ming-Omni checkpoint: Ling 2.0 under model., a vision tower; tests/
    remote_code_checkpoints.py save_ming)."""
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = rc.save_ming(tmp_path / "src", arch=arch)
    with sm.sglang_context("trtllm", 1, 0), pytest.raises(TypeError) as e:
        _model(None, src, "auto", "trtllm")
    assert str(e.value) == "object of type 'NoneType' has no len()"
    assert str(e.traceback[-1].frame.code.path).endswith("sglang/srt/models/bailing_mm.py")
    assert e.traceback[-1].name == "load_weights"


@pytest.mark.parametrize(
    "arch", ["BailingMMNativeForConditionalGeneration", "BailingMM2NativeForConditionalGeneration"]
)
def test_ming_omni_is_refused_for_sglang_in_one_line(tmp_path, arch):
    """A Ming-Omni checkpoint is Ling 2.0's family under llm_config (a wrapper), so it was
    converted for SGLang, which cannot load it (above): refused when planned, one line naming
    SGLang's reason and that no vLLM release has the class either, nothing written; for vLLM
    too (no release's registry has the class: an output would list no release that serves
    it), and `inspect` says so."""
    from tests.test_errors import error_line

    from .conftest import cli

    src = rc.save_ming(tmp_path / "src", arch=arch)
    out = tmp_path / "out"
    for backend in ("trtllm", "cutlass"):
        line = error_line(cli("convert", src, out, "--server", "sglang", "--backend", backend))
        assert line.startswith(
            f"error: --scheme bf16 --backend {backend} --server sglang: SGLang 0.5.23 cannot "
            "load Ming-Omni"
        ), line
        assert line.endswith("nor vLLM (--server vllm: no release's registry has it)"), line
        assert not out.exists()
    for command in ("convert", "inspect"):
        args = (src, out) if command == "convert" else (src,)
        line = error_line(cli(command, *args, "--server", "vllm"))
        assert line == (
            "error: --scheme bf16 --backend trtllm --server vllm: no vLLM release serves its "
            f"model (vLLM 0.30.0, 0.31.0, 0.32.0, 0.33.0, 0.34.0: its model registry has no "
            f"{arch}), so none could serve its output; see whether SGLang does (inspect "
            "--server sglang), or serve the checkpoint as it is"
        ), line
        assert not out.exists()


def test_sglangs_intern_s1_pro_model_is_not_built(tmp_path_factory):
    """Why Intern-S1-Pro has no case above: SGLang 0.5.23's InternS1ProTextDecoderLayer
    (models/interns1pro.py) takes no start_layer, which the Qwen2-MoE model it is built in
    (Qwen3MoeLLMModel's base, models/qwen2_moe.py) passes to every decoder layer: SGLang builds
    no Intern-S1-Pro model (shown on the checkpoint that vLLM's class loads, tests/
    test_vllm_families.py: the published names and config.json keys, its config class beside,
    tests/remote_code_checkpoints.py save_interns1_pro)."""
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = rc.save_interns1_pro(tmp_path_factory.mktemp("sgl-interns1-pro") / "src")
    with (
        rc.modules_cache(tmp_path_factory.getbasetemp() / "hf-modules"),
        sm.sglang_context("cutlass", 1, 0),
        pytest.raises(TypeError) as e,
    ):
        _model(None, src, "auto", "cutlass", trust_remote_code=True)
    assert "InternS1ProTextDecoderLayer.__init__() got an unexpected keyword argument " in str(
        e.value
    )
    assert str(e.value).endswith("'start_layer'")


@pytest.mark.parametrize(("case", "video"), [("nemotron-vl-bf16", 0), ("nemotron-omni-bf16", 1)])
def test_nemotron_nano_vls_radio_tower_is_read_from_its_published_names(
    case, video, sources, tmp_path
):
    """Nemotron Nano VL through SGLang's NemotronH_Nano_VL_V2 and Nemotron Omni through its
    NemotronH_Omni_Reasoning_V3: every parameter of the RADIO tower (SGLang's RadioModel; Omni's
    with its video embedder) and of the projector is the checkpoint's tensor under its published
    name (vision_model.radio_model.model.blocks.B.attn.qkv, ...), in both loads (a name the
    model's loader did not read would leave its parameter unwritten)."""
    from safetensors.torch import load_file

    src = sources(case)
    out = _convert(src, tmp_path / "out", "bf16", "trtllm", 1)
    written = load_file(src / "model.safetensors")
    ours, theirs = _both(src, out, "bf16", "trtllm", 1, 0)
    for model in (ours, theirs):
        tower = dict(model.vision_model.named_parameters())
        assert len(tower) == 3 + video + 14 * 12  # (vit_small: 12 blocks of 14)
        for name, param in tower.items():
            published = name.replace("encoder.layers", "blocks").replace("attn.attn", "attn")
            published = "vision_model.radio_model." + published.replace("qkv_proj", "qkv")
            assert torch.equal(param.detach(), written[published]), name
        for name, param in model.mlp1.named_parameters():
            assert torch.equal(param.detach(), written[f"mlp1.{name}"]), name


def test_sglangs_gemma4_unified_load_leaves_its_experts_unfilled(tmp_path, caplog):
    """Why Gemma 4 Unified over Gemma 4's MoE text model (Gemma4UnifiedForConditionalGeneration,
    proven on vLLM: tests/test_vllm_families.py) is refused for SGLang: SGLang 0.5.23 builds
    Gemma 4's MoE layers in it where text_config says enable_moe_block, but its load_weights
    (models/gemma4_unified.py) has no expert mapping and skips the names it does not hold, so
    its own load of the checkpoint fills no expert nor per_expert_scale (its own warning names
    them; the router's projection beside them is read). It reads config.json with
    transformers' Gemma4Config, whose vision config has no model_patch_size, which its vision
    embedder asks: config.json gives it here. An SGLang output is refused when planned, in one
    line; nothing is written."""
    import logging

    from safetensors.torch import load_file

    from fi_convert import Backend, Options, SchemeName, convert
    from fi_convert.errors import SchemeMismatchError
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = hf.save("gemma4_unified", tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["vision_config"]["model_patch_size"] = 8  # patch_size 4 x pooling_kernel_size 2
    (src / "config.json").write_text(json.dumps(cfg, indent=2))
    written = {}
    for shard in src.glob("*.safetensors"):
        written.update(load_file(shard))
    with (
        caplog.at_level(logging.WARNING, logger="sglang.srt.models.gemma4_unified"),
        sm.sglang_context("cutlass", 1, 0),
    ):
        model = _model(None, src, "auto", "cutlass")
    (line,) = [
        r.getMessage() for r in caplog.records if r.name == "sglang.srt.models.gemma4_unified"
    ]
    moe = [f"language_model.layers.{i}.moe." for i in (0, 1)]
    unfilled = [m + p for m in moe for p in ("experts.w13_weight", "experts.w2_weight")]
    unfilled += [m + "per_expert_scale" for m in moe]
    assert line == f"Some weights are not initialized from checkpoints: {sorted(unfilled)}"
    params = dict(model.named_parameters())
    assert params[unfilled[0]].shape == (4, 128, 64)  # (Gemma 4's MoE layer: E, 2I, H)
    for layer in (0, 1):
        router = f"language_model.layers.{layer}.router.proj.weight"
        assert torch.equal(params[router].detach(), written[f"model.{router}"])
    out = tmp_path / "out"
    with pytest.raises(SchemeMismatchError) as e:
        opts = Options(SchemeName.BF16, Backend.CUTLASS, 1, server="sglang")
        convert(src, out, opts, device="cpu")
    assert str(e.value) == (
        "--scheme bf16 --backend cutlass --server sglang: SGLang 0.5.23's Gemma 4 Unified "
        "(models/gemma4_unified.py) builds Gemma 4's MoE layers where text_config says "
        "enable_moe_block, but its load_weights has no expert mapping: it skips "
        "experts.gate_up_proj, experts.down_proj and router.per_expert_scale as names it does "
        "not hold, so its own load of a MoE checkpoint leaves every expert unfilled; convert "
        "with --server vllm"
    )
    assert not out.exists()


def test_sglangs_step3p5_load_asserts_it_filled_the_experts(tmp_path):
    """Why Step-3.7 (Step3p7ForConditionalGeneration) and Step-3.5 are refused for SGLang: SGLang
    0.5.23's Step-3.7 loads its language model (Step3p5ForCausalLM) with Step-3.5's load_weights
    (models/step3p5.py), which asserts that it filled every parameter: a load of the language
    model's tensors without the experts' is refused naming exactly the MoE layer's w13 and w2
    (the plugin's: SGLang's load_weights over the output's non-expert tensors, then the stacked
    experts), and the whole load passes. (Its clamped layers are silu experts with
    gemm1_clamp_limit there, not vLLM's swiglustep: SGLang's reason is this one, servers/sglang/
    target.py; tests/test_families.py: test_step3p5_is_refused_for_each_server_with_that_...)
    A Step-3.7 output planned for SGLang from a user's family file is refused in one line."""
    import ast

    from safetensors.torch import load_file

    from tests import sglang_moe as sm
    from tests.test_errors import error_line
    from tests.test_sglang_plugin import _model

    from .conftest import cli

    src = hf.save("step3p7", tmp_path / "src")
    written = {}
    for shard in src.glob("*.safetensors"):
        written.update(load_file(shard))
    text = {k: v for k, v in written.items() if k.startswith(("model.", "lm_head."))}
    experts = [f"model.layers.1.moe.{p}_proj.weight" for p in ("gate", "up", "down")]
    assert set(experts) < set(text)
    with sm.sglang_context("cutlass", 1, 0):
        model = _model(None, src, "dummy", "cutlass")
        assert type(model).__name__ == "Step3p7ForConditionalGeneration"
        lm = model.language_model
        with pytest.raises(AssertionError) as e:
            lm.load_weights([(k, v) for k, v in text.items() if k not in experts])
        said, unfilled = str(e.value).split(": ", 1)
        assert said == "Some parameters are not loaded"
        moe = "model.layers.1.moe.experts"
        assert ast.literal_eval(unfilled) == {f"{moe}.w13_weight", f"{moe}.w2_weight"}
        lm.load_weights(list(text.items()))
    w2 = dict(lm.named_parameters())["model.layers.1.moe.experts.w2_weight"]
    assert torch.equal(w2.detach(), written[experts[2]])
    fam = tmp_path / "step3p7.json"
    fam.write_text(json.dumps(hf.STEP3P7_FAMILY))
    out = tmp_path / "out"
    args = ("--family", fam, "--server", "sglang", "--backend", "cutlass")
    line = error_line(cli("convert", src, out, *args))
    assert line == (
        "error: --scheme bf16 --backend cutlass --server sglang: SGLang 0.5.23's Step-3.7 "
        "(models/step3p7.py) loads its language model with Step-3.5's load_weights "
        "(models/step3p5.py), which asserts that it filled every parameter, the experts' w13 "
        "and w2 among them, so it refuses a load that fills the MoE layers otherwise, as "
        "fi-convert's SGLang plugin does; serve the checkpoint as it is"
    )
    assert not out.exists()


def test_sglangs_inkling_runs_bf16_experts_on_flashinfer_only_on_trtllm_routed(tmp_path):
    """Why Inkling has no case above (servers/sglang/target.py refuses it): SGLang 0.5.23's
    InklingMoE._forward_routed (models/inkling_common/moe.py) takes FusedMoE's runner for BF16
    routed experts only where bf16_routed_uses_stock_fused_moe says so, and runs its own Triton
    grouped GEMM (moe_tp_forward) on the interleaved rows as loaded otherwise: on
    flashinfer_trtllm and flashinfer_cutlass, the runners fi-convert writes for, it says no; on
    flashinfer_trtllm_routed, which fi-convert writes no output for, yes. The conversion is
    refused in one line naming that."""
    from fi_convert.errors import SchemeMismatchError
    from fi_convert.servers.sglang import moe_layer
    from tests import sglang_moe as sm

    for backend in ("trtllm", "cutlass"):
        with sm.sglang_context(backend, 1, 0):
            from sglang.srt.models.inkling_common import util

            assert not util.bf16_routed_uses_stock_fused_moe(None)
    with (
        mock.patch.dict(moe_layer.BACKEND, {"trtllm_routed": "flashinfer_trtllm_routed"}),
        sm.sglang_context("trtllm_routed", 1, 0),
    ):
        assert util.bf16_routed_uses_stock_fused_moe(None)
    src = hf.save("inkling", tmp_path / "src")
    for backend in ("trtllm", "cutlass"):
        with pytest.raises(SchemeMismatchError, match="only on --moe-runner-backend flash"):
            _convert(src, tmp_path / "out", "bf16", backend, 1)


def test_sglangs_own_load_of_a_latent_kimi_linear_fails(tmp_path):
    """Why a latent Kimi Linear (KimiLinearForCausalLM alone, config.json with
    routed_expert_hidden_size; tests/hf_checkpoints.py _save_kimi_linear_latent) has no case
    above: SGLang 0.5.23's KimiMoE (models/kimi_linear.py) ignores routed_expert_hidden_size,
    building the routed experts of hidden_size and no latent projections, so its own load of
    the checkpoint fails copying an expert's w2 (routed_expert_hidden_size rows) into its
    FusedMoE's (hidden_size rows). vLLM 0.33's class builds the latent MoE (tests/
    test_vllm_families.py)."""
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = hf.save("kimi_linear_latent", tmp_path / "src")
    with sm.sglang_context("trtllm", 1, 0), pytest.raises(RuntimeError) as e:
        _model(None, src, "auto", "trtllm")
    assert str(e.value) == (
        f"The size of tensor a ({hf.KIMI_K3_HIDDEN}) must match the size of tensor b "
        f"({hf.KIMI_K3_LATENT}) at non-singleton dimension 0"
    )
    frames = [(str(t.frame.code.path), t.name) for t in e.traceback]
    assert "load_weights" in [
        n for p, n in frames if p.endswith("sglang/srt/models/kimi_linear.py")
    ]
    assert frames[-2][1] == "_load_w2"  # (FusedMoE's, its last frame torch's copy_)


def test_a_latent_kimi_linear_is_refused_for_sglang_in_one_line(tmp_path):
    """A latent Kimi Linear is Kimi Linear's family, its experts of routed_expert_hidden_size
    (read first, as Kimi K3's): for SGLang, whose own load cannot load it (above), refused when
    planned, one line naming SGLang's reason, nothing written, on both backends and in inspect;
    for vLLM it plans (tests/test_vllm_families.py proves it through vLLM's own class)."""
    from tests.test_errors import error_line

    from .conftest import cli

    src = hf.save("kimi_linear_latent", tmp_path / "src")
    out = tmp_path / "out"
    for backend in ("trtllm", "cutlass"):
        line = error_line(cli("convert", src, out, "--server", "sglang", "--backend", backend))
        assert line == (
            f"error: --scheme bf16 --backend {backend} --server sglang: SGLang 0.5.23's Kimi "
            "Linear (models/kimi_linear.py) ignores config.json's routed_expert_hidden_size "
            f"({hf.KIMI_K3_LATENT}): its KimiMoE builds the routed experts of hidden_size, "
            "without routed_expert_down_proj or routed_expert_up_proj, so its own load of a "
            "latent Kimi Linear fails on the experts' shapes; convert with --server vllm, or "
            "serve the checkpoint as it is"
        ), line
        assert not out.exists()
    res = cli("inspect", src, "--json", "--server", "vllm")
    assert res.exit_code == 0, res.output
    layer = json.loads(res.stdout)["layers"]["model.layers.1.block_sparse_moe.experts"]
    assert layer["hidden_size"] == hf.KIMI_K3_LATENT
    res = cli("inspect", src, "--server", "sglang")
    assert res.exit_code != 0 and "ignores config.json's routed_expert_hidden_size" in res.output

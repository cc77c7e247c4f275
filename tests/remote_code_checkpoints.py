"""Tiny checkpoints of families transformers has no model for, whose published checkpoints ship
their config class as remote code (config.json's `auto_map`): the tensor names and config keys
the servers' own model classes read, and a configuration module of our own beside them (a
plain `PretrainedConfig` of the family's model_type: the servers read the keys, not the class),
loaded with trust_remote_code as the published checkpoints are.

Ling 2.0 (inclusionAI/Ling-mini-2.0, BailingMoeV2ForCausalLM): fused QKV `attention.
query_key_value`, `attention.dense`, RMS q/k norms, layer 0 a dense MLP, layer 1 MoE with its
router (`mlp.gate.weight`, `mlp.gate.expert_bias`), a shared expert and per-expert
gate/up/down_proj; `model.word_embeddings`, `model.norm`, `lm_head`.

Ling v1 (inclusionAI/Ling-lite-1.5, BailingMoeForCausalLM, model_type bailing_moe): Ling 2.0's
names without the q/k norms, every layer MoE (first_k_dense_replace 0) with two shared experts,
softmax routing renormalized (norm_topk_prob), no expert bias, no groups.

Sarvam-30B (sarvamai/sarvam-30b, SarvamMoEForCausalLM, model_type sarvam_moe) and Param2
(Param2MoEForCausalLM, model_type param2moe): Ling 2.0's names, one routing group.

Sarvam-105B (sarvamai/sarvam-105b, SarvamMLAForCausalLM, model_type sarvam_mla): DeepSeek's
MLA names (q_proj, kv_a_proj_with_mqa, kv_b_proj), the router's e_score_correction_bias.

Xllm (XllmForCausalLM, model_type xllm) and K2 Horizon (K2HorizonForCausalLM, model_type
k2_horizon), no public checkpoints found: xLLM's names as both servers read them (Llama's
attention, a dense layer, shared experts, the router's correction bias mlp.gate.bias).

Nemotron Nano VL, Nano Omni, Omni and Super Omni (NemotronH_Nano_VL_V2 and the Omnis): tests/
hf_checkpoints.py's layout, with a stand-in of their config class (configuration.py, auto_map),
a tokenizer, and the Omnis' Parakeet sound encoder (save_nemotron_h_nano_vl).

DeepSeek-MoE v1 (deepseek-ai/deepseek-moe-16b-base, DeepseekForCausalLM): Llama's attention
(q/k/v/o_proj), layer 0 a dense MLP, layer 1 MoE with its router (`mlp.gate.weight`), shared
experts and per-expert gate/up/down_proj; softmax routing without renormalization as released.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch
from safetensors.torch import save_file

LING2_CONFIG = dict(
    model_type="bailing_moe_v2",
    architectures=["BailingMoeV2ForCausalLM"],
    auto_map={"AutoConfig": "configuration_bailing_moe_v2.BailingMoeV2Config"},
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=128,
    moe_shared_expert_intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=4,
    num_shared_experts=1,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    # routing as Ling-mini-2.0 releases it: sigmoid scores, an expert bias, grouped top-k
    score_function="sigmoid",
    moe_router_enable_expert_bias=True,
    n_group=2,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    router_dtype="fp32",
    use_qk_norm=True,
    use_rmsnorm=True,
    use_bias=False,
    use_qkv_bias=False,
    partial_rotary_factor=0.5,
    rope_theta=600000,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    embedding_dropout=0.0,
    output_dropout=0.0,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)
CONFIG_MODULE = '''"""The family's model_type's configuration class (fi-convert's tests)."""

from transformers import PretrainedConfig


class {cls}(PretrainedConfig):
    model_type = "{model_type}"

    def __init__(self, rope_theta=10000.0, rope_parameters=None, **kwargs):
        # as transformers' own config classes give it: the rotary embedding as rope_parameters
        self.rope_theta = rope_theta
        default = {{"rope_type": "default", "rope_theta": rope_theta}}
        self.rope_parameters = rope_parameters or default
        super().__init__(**kwargs)
'''


def save_ling2(root: Path, seed: int = 0) -> Path:
    """A tiny Ling 2.0 checkpoint in two shards (layer 1's experts in the second)."""
    return _save_bailing_v2(root, seed, LING2_CONFIG, "BailingMoeV2Config")


# Sarvam-30B (sarvamai/sarvam-30b, SarvamMoEForCausalLM): Ling 2.0's names and keys (both
# servers' SarvamMoEForCausalLM is their BailingMoE model class), routing as its config.json
# publishes it: sigmoid scores, an expert bias, one group (n_group 1, topk_group 1)
SARVAM_MOE_CONFIG = LING2_CONFIG | dict(
    model_type="sarvam_moe",
    architectures=["SarvamMoEForCausalLM"],
    auto_map={"AutoConfig": "configuration_sarvam_moe.SarvamMoEConfig"},
    n_group=1,
    topk_group=1,
    rope_theta=8000000,
)
SARVAM_MOE_CONFIG.pop("partial_rotary_factor")  # (not in the published config.json)


# Param2 (bharatgenai/Param2-17B-A2.4B-Thinking, Param2MoEForCausalLM, model_type param2moe):
# Ling 2.0's names (vLLM's Param2MoEModel maps word_embeddings, attention.query_key_value,
# attention.dense, mlp.gate.expert_bias), its config.json's routing: sigmoid scores with an
# expert bias (vLLM centres it on load), one group, two shared experts
PARAM2_CONFIG = LING2_CONFIG | dict(
    model_type="param2moe",
    architectures=["Param2MoEForCausalLM"],
    auto_map={"AutoConfig": "configuration_param2moe.Param2MoEConfig"},
    num_shared_experts=2,
    moe_shared_expert_intermediate_size=256,
    n_group=1,
    topk_group=1,
    partial_rotary_factor=1.0,
    rope_scaling=None,
)


def save_param2(root: Path, seed: int = 0) -> Path:
    """A tiny Param2 checkpoint in two shards (layer 1's experts in the second)."""
    # (its shared experts' size: moe_shared_expert_intermediate_size, already times the count)
    shared = PARAM2_CONFIG["moe_shared_expert_intermediate_size"]
    return _save_bailing_v2(root, seed, PARAM2_CONFIG, "Param2MoEConfig", shared)


def save_sarvam_moe(root: Path, seed: int = 0) -> Path:
    """A tiny Sarvam-30B checkpoint in two shards (layer 1's experts in the second)."""
    return _save_bailing_v2(root, seed, SARVAM_MOE_CONFIG, "SarvamMoEConfig")


def _save_bailing_v2(root: Path, seed: int, c: dict, cls: str, shared: int = 0) -> Path:
    """Ling 2.0's layout (layer 0 dense, layer 1 MoE) under config `c`, its config module's
    class `cls`, its shared experts' MLP of size `shared` (else moe_intermediate_size)."""
    g = torch.Generator().manual_seed(seed)
    h, i, e, v = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["vocab_size"]
    d, nq, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]

    def w(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)

    first: dict[str, torch.Tensor] = {"model.word_embeddings.weight": w(v, h)}
    second: dict[str, torch.Tensor] = {"model.norm.weight": w(h), "lm_head.weight": w(v, h)}
    for layer, shard in ((0, first), (1, second)):
        p = f"model.layers.{layer}."
        shard |= {
            p + "input_layernorm.weight": w(h),
            p + "post_attention_layernorm.weight": w(h),
            p + "attention.query_key_value.weight": w((nq + 2 * nkv) * d, h),
            p + "attention.dense.weight": w(h, nq * d),
            p + "attention.query_layernorm.weight": w(d),
            p + "attention.key_layernorm.weight": w(d),
        }
        sizes = [(p + "mlp.", c["intermediate_size"])] if layer == 0 else []
        sizes += [(p + "mlp.shared_experts.", shared or i)] if layer else []
        sizes += [(f"{p}mlp.experts.{x}.", i) for x in range(e)] if layer else []
        for m, size in sizes:
            shard |= {
                m + "gate_proj.weight": w(size, h),
                m + "up_proj.weight": w(size, h),
                m + "down_proj.weight": w(h, size),
            }
        if layer:
            shard[p + "mlp.gate.weight"] = w(e, h)
            shard[p + "mlp.gate.expert_bias"] = w(e, dtype=torch.float32)
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    module = CONFIG_MODULE.format(cls=cls, model_type=c["model_type"])
    file = c["auto_map"]["AutoConfig"].split(".")[0] + ".py"
    return _write(root, shards, c, file, module)


LING1_CONFIG = dict(
    model_type="bailing_moe",
    architectures=["BailingMoeForCausalLM"],
    auto_map={"AutoConfig": "configuration_bailing_moe.BailingMoeConfig"},
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=4,
    num_shared_experts=2,
    num_experts_per_tok=2,
    first_k_dense_replace=0,
    norm_topk_prob=True,
    use_bias=False,
    use_qkv_bias=False,
    norm_head=False,
    norm_softmax=False,
    rope_theta=600000,
    rope_scaling=None,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    embedding_dropout=0.0,
    output_dropout=0.0,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def save_ling1(root: Path, seed: int = 0) -> Path:
    """A tiny Ling v1 checkpoint in two shards (a layer each), both layers MoE."""
    g = torch.Generator().manual_seed(seed)
    c = LING1_CONFIG
    h, i, e, v = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["vocab_size"]
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    d, shared = h // nq, c["num_shared_experts"] * i

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    first: dict[str, torch.Tensor] = {"model.word_embeddings.weight": w(v, h)}
    second: dict[str, torch.Tensor] = {"model.norm.weight": w(h), "lm_head.weight": w(v, h)}
    for layer, shard in ((0, first), (1, second)):
        p = f"model.layers.{layer}."
        shard |= {
            p + "input_layernorm.weight": w(h),
            p + "post_attention_layernorm.weight": w(h),
            p + "attention.query_key_value.weight": w((nq + 2 * nkv) * d, h),
            p + "attention.dense.weight": w(h, nq * d),
            p + "mlp.gate.weight": w(e, h),
        }
        sizes = [(p + "mlp.shared_experts.", shared)]
        sizes += [(f"{p}mlp.experts.{x}.", i) for x in range(e)]
        for m, size in sizes:
            shard |= {
                m + "gate_proj.weight": w(size, h),
                m + "up_proj.weight": w(size, h),
                m + "down_proj.weight": w(h, size),
            }
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    module = CONFIG_MODULE.format(cls="BailingMoeConfig", model_type="bailing_moe")
    # the published class's default for the key its config.json leaves out (both servers read
    # `config.head_dim or hidden_size // num_attention_heads`)
    module += LING1_HEAD_DIM
    return _write(root, shards, c, "configuration_bailing_moe.py", module)


LING1_HEAD_DIM = """
    @property
    def head_dim(self):
        return self.__dict__.get("_head_dim")

    @head_dim.setter
    def head_dim(self, value):
        self.__dict__["_head_dim"] = value
"""


@contextlib.contextmanager
def modules_cache(path: Path) -> Iterator[None]:
    """transformers' copies of remote code (trust_remote_code) kept under `path`, not the
    user's HF_MODULES_CACHE."""
    from transformers import dynamic_module_utils

    with mock.patch.object(dynamic_module_utils, "HF_MODULES_CACHE", str(path)):
        yield


# Sarvam-105B (sarvamai/sarvam-105b, SarvamMLAForCausalLM, model_type sarvam_mla): DeepSeek's
# names (MLA attention without a q LoRA, layer 0 dense, a shared expert, the router's
# e_score_correction_bias), its config.json's keys: sigmoid scores with an expert bias, no
# n_group/topk_group (vLLM's model sets one group, SGLang's none), its yarn rotary embedding;
# the published head sizes (vLLM has MLA prefill kernels for these only), a small kv LoRA
SARVAM_MLA_CONFIG = dict(
    model_type="sarvam_mla",
    architectures=["SarvamMLAForCausalLM"],
    auto_map={"AutoConfig": "configuration_sarvam_moe.SarvamMLAConfig"},
    pad_token_id=0,
    eos_token_id=1,
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_experts=4,
    num_shared_experts=1,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    moe_router_enable_expert_bias=True,
    routed_scaling_factor=2.5,
    kv_lora_rank=16,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    q_head_dim=192,
    head_dim=576,
    rope_theta=10000.0,
    rope_parameters=dict(
        rope_type="deepseek_yarn",
        rope_theta=10000.0,
        factor=40,
        beta_fast=32,
        beta_slow=1,
        mscale=1.0,
        mscale_all_dim=1.0,
        original_max_position_embeddings=4096,
    ),
    max_position_embeddings=131072,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    embedding_dropout=0.0,
    output_dropout=0.0,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def save_sarvam_mla(root: Path, seed: int = 0) -> Path:
    """A tiny Sarvam-105B checkpoint in two shards (layer 1's experts in the second)."""
    g = torch.Generator().manual_seed(seed)
    c = SARVAM_MLA_CONFIG
    h, i, e, v = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["vocab_size"]
    nq, kv, rope = c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    nope, vd = c["qk_nope_head_dim"], c["v_head_dim"]

    def w(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)

    first: dict[str, torch.Tensor] = {"model.embed_tokens.weight": w(v, h)}
    second: dict[str, torch.Tensor] = {"model.norm.weight": w(h), "lm_head.weight": w(v, h)}
    for layer, shard in ((0, first), (1, second)):
        p = f"model.layers.{layer}."
        a = p + "self_attn."
        shard |= {
            p + "input_layernorm.weight": w(h),
            p + "post_attention_layernorm.weight": w(h),
            a + "q_proj.weight": w(nq * (nope + rope), h),
            a + "kv_a_proj_with_mqa.weight": w(kv + rope, h),
            a + "kv_a_layernorm.weight": w(kv),
            a + "kv_b_proj.weight": w(nq * (nope + vd), kv),
            a + "o_proj.weight": w(h, nq * vd),
        }
        mlps = [p + "mlp."] if layer == 0 else [p + "mlp.shared_experts."]
        mlps += [f"{p}mlp.experts.{x}." for x in range(e)] if layer else []
        size = c["intermediate_size"] if layer == 0 else i
        for m in mlps:
            shard |= {
                m + "gate_proj.weight": w(size, h),
                m + "up_proj.weight": w(size, h),
                m + "down_proj.weight": w(h, size),
            }
        if layer:
            shard[p + "mlp.gate.weight"] = w(e, h)
            shard[p + "mlp.gate.e_score_correction_bias"] = w(e, dtype=torch.float32)
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    module = CONFIG_MODULE.format(cls="SarvamMLAConfig", model_type="sarvam_mla")
    return _write(root, shards, c, "configuration_sarvam_moe.py", module)


# openPangu-Ultra-MoE-718B (FreedomIntelligence/openPangu-Ultra-MoE-718B-V1.1,
# PanguUltraMoEForCausalLM): DeepSeek's names (MLA with a q LoRA, layer 0 dense, a shared expert,
# the router's mlp.e_score_correction_bias), its depth-scaled sandwich norm (pre_mlp_layernorm and
# post_mlp_layernorm in every layer); sigmoid scores with an expert bias in one group (vLLM's
# OpenPanguMoE fixes both); the published head sizes, small LoRA ranks
PANGU_ULTRA_CONFIG = dict(
    model_type="pangu_ultra_moe",
    architectures=["PanguUltraMoEForCausalLM"],
    auto_map={"AutoConfig": "configuration_openpangu_moe.PanguUltraMoEConfig"},
    pad_token_id=0,
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    router_enable_expert_bias=True,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    sandwich_norm=True,
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    rope_theta=25600000,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


# openPangu Pro MoE V2 (openpangu/openPangu-R-72B-2512, PanguProMoEV2ForCausalLM, the same vLLM
# model class as Ultra's): config.json as published (model_type PanguProMoE, num_experts,
# shared_expert_intermediate_size, mlp_only_layers, its sink attention's keys), read by vLLM
# through the published config class, which names them as vLLM's OpenPanguMoE asks
# (PANGU_PRO_V2_NAMES: our config module's stand-in for it); its attention as vLLM's
# OpenPanguSinkAttention reads it: GQA with a fused q/k/v of qk_nope_dim + qk_rope_dim heads and
# v_channels values, a k norm, and param_sink_number learned sink keys and values per layer
PANGU_PRO_V2_CONFIG = dict(
    model_type="PanguProMoE",
    architectures=["PanguProMoEV2ForCausalLM"],
    auto_map={"AutoConfig": "configuration_pangu_moe.PanguProMoEConfig"},
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=256,
    mlp_only_layers=[0],
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=4,
    num_experts_per_tok=2,
    router_enable_expert_bias=True,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    sandwich_norm=True,
    qk_nope_dim=32,
    qk_rope_dim=16,
    v_channels=32,
    param_sink_number=4,
    param_sink_with_value=True,
    rope_theta=25600000,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)
PANGU_PRO_V2_NAMES = """
    @property
    def n_routed_experts(self):
        return self.num_experts

    @property
    def n_shared_experts(self):
        return self.shared_expert_intermediate_size // self.moe_intermediate_size

    @property
    def first_k_dense_replace(self):
        return len(self.mlp_only_layers)
"""


def save_pangu_ultra(root: Path, seed: int = 0) -> Path:
    """A tiny openPangu-Ultra-MoE checkpoint in two shards (layer 1's experts in the second)."""
    return _save_pangu(root, seed, PANGU_ULTRA_CONFIG, _mla)


def save_pangu_pro_v2(root: Path, seed: int = 0) -> Path:
    """A tiny openPangu Pro MoE V2 checkpoint in two shards (layer 1's experts in the second)."""
    return _save_pangu(root, seed, PANGU_PRO_V2_CONFIG, _sink_attention, PANGU_PRO_V2_NAMES)


def _mla(c: dict, w) -> dict[str, torch.Tensor]:
    """MLA with a q LoRA: DeepSeek-V3's attention names, under self_attn."""
    h, nq, kv, rope = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["kv_lora_rank"],
        c["qk_rope_head_dim"],
    )
    nope, vd, ql = c["qk_nope_head_dim"], c["v_head_dim"], c["q_lora_rank"]
    return {
        "q_a_proj.weight": w(ql, h),
        "q_a_layernorm.weight": w(ql),
        "q_b_proj.weight": w(nq * (nope + rope), ql),
        "kv_a_proj_with_mqa.weight": w(kv + rope, h),
        "kv_a_layernorm.weight": w(kv),
        "kv_b_proj.weight": w(nq * (nope + vd), kv),
        "o_proj.weight": w(h, nq * vd),
    }


def _sink_attention(c: dict, w) -> dict[str, torch.Tensor]:
    """openPangu's GQA with learned sink keys and values, under self_attn: q, k and v fused in
    one qkv_proj (vLLM 0.33's own load maps separate q/k/v_proj to its MergedColumnParallelLinear
    with shard ids it refuses: "This line should not be reached")."""
    h, nq, nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d, vd, sinks = c["qk_nope_dim"] + c["qk_rope_dim"], c["v_channels"], c["param_sink_number"]
    return {
        "qkv_proj.weight": w(nq * d + nkv * d + nkv * vd, h),
        "o_proj.weight": w(h, nq * vd),
        "k_layernorm.weight": w(d),
        "param_sink_key": w(sinks, nkv, d),
        "param_sink_value": w(sinks, nkv, vd),
    }


def _save_pangu(root: Path, seed: int, c: dict, attention, names: str = "") -> Path:
    """openPangu's MoE layout (layer 0 dense, layer 1 MoE) under config `c`, each layer's
    attention tensors from `attention`, `names` appended to its config class."""
    g = torch.Generator().manual_seed(seed)
    e = c.get("n_routed_experts") or c["num_experts"]
    h, i, v = c["hidden_size"], c["moe_intermediate_size"], c["vocab_size"]
    shared = c.get("shared_expert_intermediate_size") or i * c["n_shared_experts"]

    def w(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)

    first: dict[str, torch.Tensor] = {"model.embed_tokens.weight": w(v, h)}
    second: dict[str, torch.Tensor] = {"model.norm.weight": w(h), "lm_head.weight": w(v, h)}
    for layer, shard in ((0, first), (1, second)):
        p = f"model.layers.{layer}."
        a = p + "self_attn."
        norms = ("input", "post_attention", "pre_mlp", "post_mlp")
        shard |= {f"{p}{n}_layernorm.weight": w(h) for n in norms}
        shard |= {a + name: t for name, t in attention(c, w).items()}
        sizes = [(p + "mlp.", c["intermediate_size"])] if layer == 0 else []
        sizes += [(p + "mlp.shared_experts.", shared)] if layer else []
        sizes += [(f"{p}mlp.experts.{x}.", i) for x in range(e)] if layer else []
        for m, size in sizes:
            shard |= {
                m + "gate_proj.weight": w(size, h),
                m + "up_proj.weight": w(size, h),
                m + "down_proj.weight": w(h, size),
            }
        if layer:
            shard[p + "mlp.gate.weight"] = w(e, h)
            # (the name vLLM's load reads: it maps `e_score_correction_bias` to the gate's)
            shard[p + "mlp.e_score_correction_bias"] = w(e, dtype=torch.float32)
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    file, cls = c["auto_map"]["AutoConfig"].split(".")
    module = CONFIG_MODULE.format(cls=cls, model_type=c["model_type"]) + names
    return _write(root, shards, c, file + ".py", module)


XLLM_CONFIG = dict(
    model_type="xllm",
    architectures=["XllmForCausalLM"],
    auto_map={"AutoConfig": "configuration_xllm.XllmConfig"},
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=4,
    num_experts_per_tok=2,
    num_shared_experts=1,
    norm_topk_prob=True,
    router_score_func="sigmoid",
    moe_gate_bias=True,
    router_scaling_factor=1.0,
    mlp_only_layers=[0],
    decoder_sparse_step=1,
    attention_bias=False,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=128,
    hidden_act="silu",
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def save_xllm_layout(root: Path, seed: int, c: dict, cls: str) -> Path:
    """xLLM's layout (layer 0 dense, layer 1 MoE) under config `c`, its config module's class
    `cls` (the file its auto_map names), in two shards (layer 1's experts in the second)."""
    g = torch.Generator().manual_seed(seed)
    h, i, e, v = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["vocab_size"]
    d, nq, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]

    def w(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)

    first: dict[str, torch.Tensor] = {"model.embed_tokens.weight": w(v, h)}
    second: dict[str, torch.Tensor] = {"model.norm.weight": w(h), "lm_head.weight": w(v, h)}
    for layer, shard in ((0, first), (1, second)):
        p, a = f"model.layers.{layer}.", f"model.layers.{layer}.self_attn."
        shard |= {
            p + "input_layernorm.weight": w(h),
            p + "post_attention_layernorm.weight": w(h),
            a + "q_proj.weight": w(nq * d, h),
            a + "k_proj.weight": w(nkv * d, h),
            a + "v_proj.weight": w(nkv * d, h),
            a + "o_proj.weight": w(h, nq * d),
        }
        mlps = [(p + "mlp.", c["intermediate_size"])] if layer == 0 else []
        mlps += [(p + "mlp.shared_experts.", i * c["num_shared_experts"])] if layer else []
        mlps += [(f"{p}mlp.experts.{x}.", i) for x in range(e)] if layer else []
        for m, size in mlps:
            shard |= {
                m + "gate_proj.weight": w(size, h),
                m + "up_proj.weight": w(size, h),
                m + "down_proj.weight": w(h, size),
            }
        if layer:
            shard[p + "mlp.gate.weight"] = w(e, h)
            shard[p + "mlp.gate.bias"] = w(e, dtype=torch.float32)
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    module = CONFIG_MODULE.format(cls=cls, model_type=c["model_type"])
    file = c["auto_map"]["AutoConfig"].split(".")[0] + ".py"
    return _write(root, shards, c, file, module)


# K2 Horizon (K2HorizonForCausalLM, model_type k2_horizon; vLLM's models/k2_horizon.py, SGLang's
# models/xllm.py, no public checkpoint found): xLLM's FFN (its experts, shared experts and router
# with its correction bias) under K2 Horizon's keys as both servers read them, with its
# attention not MoVA (mova_num_experts 0: SGLang's "dense K2Horizon" attention, vLLM's
# K2HorizonAttention), plain RMS norms (layernorm_num_groups 1), default rotary parameters
K2_HORIZON_CONFIG = XLLM_CONFIG | dict(
    model_type="k2_horizon",
    architectures=["K2HorizonForCausalLM"],
    auto_map={"AutoConfig": "configuration_k2_horizon.K2HorizonConfig"},
    mova_num_experts=0,
    mova_num_experts_per_tok=0,
    rope_head_dim=16,
    query_key_norm=False,
    attention_gate_func=None,
    layernorm_num_groups=1,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)


def save_k2_horizon(root: Path, seed: int = 0) -> Path:
    """A tiny K2 Horizon checkpoint in two shards (layer 1's experts in the second)."""
    return save_xllm_layout(root, seed, K2_HORIZON_CONFIG, "K2HorizonConfig")


DEEPSEEK_V1_CONFIG = dict(
    model_type="deepseek",
    architectures=["DeepseekForCausalLM"],
    pad_token_id=None,  # (transformers 5's PretrainedConfig sets none; SGLang's model reads it)
    auto_map={"AutoConfig": "configuration_deepseek.DeepseekConfig"},
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    moe_layer_freq=1,
    scoring_func="softmax",
    norm_topk_prob=False,
    rope_theta=10000,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def save_deepseek_v1(root: Path, seed: int = 0) -> Path:
    """A tiny DeepSeek-MoE v1 checkpoint in two shards (layer 1's experts in the second)."""
    g = torch.Generator().manual_seed(seed)
    c = DEEPSEEK_V1_CONFIG
    h, i, e, v = (
        c["hidden_size"],
        c["moe_intermediate_size"],
        c["n_routed_experts"],
        c["vocab_size"],
    )

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    first: dict[str, torch.Tensor] = {"model.embed_tokens.weight": w(v, h)}
    second: dict[str, torch.Tensor] = {"model.norm.weight": w(h), "lm_head.weight": w(v, h)}
    for layer, shard in ((0, first), (1, second)):
        p = f"model.layers.{layer}."
        shard |= {p + "input_layernorm.weight": w(h), p + "post_attention_layernorm.weight": w(h)}
        shard |= {f"{p}self_attn.{x}_proj.weight": w(h, h) for x in "qkvo"}
        mlps = [p + "mlp."] if layer == 0 else [p + "mlp.shared_experts."]
        mlps += [f"{p}mlp.experts.{x}." for x in range(e)] if layer else []
        size = c["intermediate_size"] if layer == 0 else i
        for m in mlps:
            shard |= {
                m + "gate_proj.weight": w(size, h),
                m + "up_proj.weight": w(size, h),
                m + "down_proj.weight": w(h, size),
            }
        if layer:
            shard[p + "mlp.gate.weight"] = w(e, h)
    module = CONFIG_MODULE.format(cls="DeepseekConfig", model_type="deepseek")
    return _write(
        root,
        {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second},
        c,
        "configuration_deepseek.py",
        module,
    )


def _write(
    root: Path,
    shards: dict,
    config: dict,
    module_name: str | None,
    module: str,
    exists: bool = False,
) -> Path:
    root.mkdir(parents=True, exist_ok=exists)
    index: dict[str, str] = {}
    for name, tensors in shards.items():
        save_file(tensors, root / name, metadata={"format": "pt"})
        index |= dict.fromkeys(tensors, name)
    total = sum(t.numel() * t.element_size() for ts in shards.values() for t in ts.values())
    meta = {"metadata": {"total_size": total}, "weight_map": index}
    (root / "model.safetensors.index.json").write_text(json.dumps(meta, indent=2))
    (root / "config.json").write_text(json.dumps(config, indent=2))
    if module_name is not None:  # (a config class of the server's own: none)
        (root / module_name).write_text(module)
    return root


# Nemotron-H Puzzle (NemotronHPuzzleForCausalLM, model_type nemotron_h_puzzle): Nemotron-H whose
# layers differ (a neural-architecture search's output): config.json's block_configs holds one
# map per decoder layer whose keys replace the model's own for that layer (SGLang's own
# NemotronHPuzzleConfig, configs/nemotron_h.py; vLLM's NemotronHMoE builds each layer from
# `config.get_nemotron_h_config_for_layer(i)`, which the published config class provides): here
# two MoE layers of other expert counts and sizes, written over transformers' Nemotron-H
PUZZLE_BLOCKS = [
    {"block_type": "mamba"},
    {"block_type": "moe", "n_routed_experts": 4, "moe_intermediate_size": 128},
    {"block_type": "moe", "n_routed_experts": 3, "moe_intermediate_size": 64},
    {"block_type": "attention"},
]
PUZZLE_MODULE = '''"""Nemotron-H Puzzle's configuration class (fi-convert's tests): Nemotron-H's,
with block_configs, one map per layer whose keys replace the model's for that layer."""

import copy

from transformers import NemotronHConfig


class NemotronHPuzzleConfig(NemotronHConfig):
    model_type = "nemotron_h_puzzle"

    def __init__(self, block_configs=None, **kwargs):
        super().__init__(**kwargs)
        self.block_configs = block_configs

    def get_nemotron_h_config_for_layer(self, layer_idx):
        layer = copy.copy(self)
        layer.__dict__.update(self.block_configs[layer_idx])
        return layer
'''


def save_nemotron_h_puzzle(root: Path, seed: int = 0) -> Path:
    """transformers' Nemotron-H (a Mamba, two MoE and an attention layer), its second MoE layer
    rewritten to 3 experts of I 64, and config.json as a Puzzle's: model_type, architecture,
    block_configs (PUZZLE_BLOCKS) and its config class as remote code."""
    from safetensors.torch import load_file

    from tests import hf_checkpoints as hf

    hf.save("nemotron_h", root, seed, layers_block_type=[b["block_type"] for b in PUZZLE_BLOCKS])
    index = json.loads((root / "model.safetensors.index.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors |= load_file(root / shard)
        (root / shard).unlink()
    g = torch.Generator().manual_seed(seed + 1)
    prefix = "backbone.layers.2.mixer."
    block = PUZZLE_BLOCKS[2]
    e, i = block["n_routed_experts"], block["moe_intermediate_size"]
    tensors = {n: t for n, t in tensors.items() if not n.startswith(prefix + "experts.")}
    h = tensors[prefix + "gate.weight"].shape[1]
    bias = tensors[prefix + "gate.e_score_correction_bias"].dtype

    def w(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)

    tensors[prefix + "gate.weight"] = w(e, h)
    tensors[prefix + "gate.e_score_correction_bias"] = w(e, dtype=bias)
    for x in range(e):
        tensors[f"{prefix}experts.{x}.up_proj.weight"] = w(i, h)
        tensors[f"{prefix}experts.{x}.down_proj.weight"] = w(h, i)
    first = {n: t for n, t in tensors.items() if not n.startswith(prefix)}
    second = {n: t for n, t in tensors.items() if n.startswith(prefix)}
    config = json.loads((root / "config.json").read_text())
    config |= dict(
        model_type="nemotron_h_puzzle",
        architectures=["NemotronHPuzzleForCausalLM"],
        auto_map={"AutoConfig": "configuration_nemotron_h_puzzle.NemotronHPuzzleConfig"},
        block_configs=PUZZLE_BLOCKS,
    )
    (root / "model.safetensors.index.json").unlink()
    (root / "config.json").unlink()
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    return _write(root, shards, config, "configuration_nemotron_h_puzzle.py", PUZZLE_MODULE, True)


# Intern-S1 (internlm/Intern-S1, InternS1ForConditionalGeneration, model_type interns1):
# transformers' InternVL layout (model.language_model., model.vision_tower.,
# model.multi_modal_projector., lm_head) over a Qwen3-MoE language model, its config class
# remote code (InternS1Config: a Qwen3-MoE text_config, an InternViT-style vision_config); the
# vision keys SGLang's InternVisionModel reads beside transformers' own
INTERNS1_MODULE = '''"""Intern-S1's configuration class (fi-convert's tests): a Qwen3-MoE
text_config and an InternViT vision_config."""

from transformers import PretrainedConfig, Qwen3MoeConfig


class InternS1VisionConfig(PretrainedConfig):
    model_type = "interns1_vision"


class InternS1Config(PretrainedConfig):
    model_type = "interns1"

    def __init__(self, vision_config=None, text_config=None, **kwargs):
        self.vision_config = InternS1VisionConfig(**(vision_config or {}))
        self.text_config = Qwen3MoeConfig(**(text_config or {}))
        super().__init__(**kwargs)
'''
INTERNS1_VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=2,
    num_hidden_layers=1,
    image_size=[28, 28],
    patch_size=[14, 14],
    attention_bias=True,
    use_qk_norm=False,
    layer_scale_init_value=0.1,
)
# the published vision_config's keys SGLang's InternVisionModel reads (InternViT's names)
INTERNS1_VISION_KEYS = dict(
    qkv_bias=True,
    qk_normalization=False,
    norm_type="layer_norm",
    dropout=0.0,
    drop_path_rate=0.0,
    initializer_factor=1.0,
    layer_norm_eps=1e-6,
    hidden_act="gelu",
)


def save_interns1(root: Path, seed: int = 0) -> Path:
    """transformers' InternVL model over its Qwen3-MoE (tests/hf_checkpoints.py's sizes),
    saved, and config.json rewritten as Intern-S1 publishes it, its config class beside."""
    import transformers

    from tests import hf_checkpoints as hf

    _, _, own = hf.MODELS["qwen3_moe"]
    # an lm_head of its own, as Intern-S1 publishes it (lm_head.weight)
    text = transformers.Qwen3MoeConfig(**(hf.COMMON | own), tie_word_embeddings=False)
    vision = transformers.InternVLVisionConfig(**INTERNS1_VISION)
    config = transformers.InternVLConfig(
        text_config=text,
        vision_config=vision,
        downsample_ratio=0.5,
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.InternVLForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(root, max_shard_size=hf.MAX_SHARD_SIZE)
    _rename_tensors(root, _interns1_name)
    cfg = json.loads((root / "config.json").read_text())
    cfg["text_config"]["architectures"] = ["Qwen3MoeForCausalLM"]
    cfg["vision_config"] |= INTERNS1_VISION_KEYS | dict(image_size=28, patch_size=14)
    cfg |= dict(
        model_type="interns1",
        architectures=["InternS1ForConditionalGeneration"],
        auto_map={"AutoConfig": "configuration_interns1.InternS1Config"},
    )
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    (root / "configuration_interns1.py").write_text(INTERNS1_MODULE)
    return root


# transformers 5.20's InternVL save_pretrained writes its older names (language_model.model.,
# vision_tower., multi_modal_projector.); Intern-S1's checkpoints name them as SGLang's
# InternS1 load reads (models/interns1.py, _mapping_interns1_name): under model., lm_head alone
INTERNS1_NAMES = (
    ("language_model.model.", "model.language_model."),
    ("language_model.lm_head.", "lm_head."),
    ("vision_tower.", "model.vision_tower."),
    ("multi_modal_projector.", "model.multi_modal_projector."),
)


def _interns1_name(name: str) -> str:
    old, new = next(((o, n) for o, n in INTERNS1_NAMES if name.startswith(o)), ("", ""))
    return new + name[len(old) :]


def _rename_tensors(root: Path, rename) -> None:
    """Each shard of the checkpoint at `root` (and its index) with its tensors renamed."""
    from safetensors.torch import load_file

    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for shard in sorted(set(index["weight_map"].values())):
        tensors = {rename(k): t for k, t in load_file(root / shard).items()}
        save_file(tensors, root / shard, metadata={"format": "pt"})
    index["weight_map"] = {rename(k): v for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index, indent=2))


# Ling/Ring 2.5 (inclusionAI/Ring-2.5-1T, BailingMoeV2_5ForCausalLM, model_type bailing_hybrid,
# its config class BailingMoeV2_5Config remote code): Ling 2.0's names, its attention in two
# kinds by layer_group_size (every layer_group_size-th layer MLA, the others linear attention):
# linear layers attention.{query_key_value, query_layernorm, key_layernorm, g_proj, g_norm,
# dense}, MLA layers attention.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
# kv_a_layernorm, kv_b_proj, dense}; routing as its config class sets it (sigmoid scores, an
# expert bias, grouped top-k; no norm_topk_prob, both servers renormalize); here three layers:
# 0 linear and dense, 1 linear and MoE, 2 MLA and MoE; the published MLA head sizes (vLLM has MLA
# prefill kernels for these only), small LoRA ranks
LING25_CONFIG = dict(
    model_type="bailing_hybrid",
    architectures=["BailingMoeV2_5ForCausalLM"],
    auto_map={"AutoConfig": "configuration_bailing_moe_v2_5.BailingMoeV2_5Config"},
    pad_token_id=0,
    eos_token_id=1,
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=16,
    num_experts=4,
    num_shared_experts=1,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    first_k_dense_replace=1,
    score_function="sigmoid",
    scoring_func="sigmoid",
    topk_method="noaux_tc",
    moe_router_enable_expert_bias=True,
    routed_scaling_factor=2.5,
    router_dtype="fp32",
    use_qk_norm=True,
    use_bias=False,
    use_qkv_bias=False,
    layer_group_size=3,
    group_norm_size=2,
    linear_silu=False,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    rope_interleave=True,
    partial_rotary_factor=0.5,
    rope_theta=600000.0,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    num_nextn_predict_layers=0,
    embedding_dropout=0.0,
    output_dropout=0.0,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def save_ling25(root: Path, seed: int = 0) -> Path:
    """A tiny Ling 2.5 checkpoint in two shards (layer 2 in the second)."""
    return _save_bailing_hybrid(root, seed, LING25_CONFIG, "BailingMoeV2_5Config", _lightning)


def _lightning(c: dict, w) -> dict[str, torch.Tensor]:
    """Ling 2.5's linear (Lightning) attention, under attention: q, k and v fused, per-head
    q/k norms, an output gate and its group norm."""
    h, inner, d = c["hidden_size"], c["num_attention_heads"] * c["head_dim"], c["head_dim"]
    return {
        "query_key_value.weight": w(3 * inner, h),
        "query_layernorm.weight": w(d),
        "key_layernorm.weight": w(d),
        "g_proj.weight": w(inner, h),
        "g_norm.weight": w(inner),
        "dense.weight": w(h, inner),
    }


def _linear_layer(c: dict, layer: int) -> bool:
    """Whether the layer is a linear-attention one (every layer_group_size-th is MLA)."""
    return (layer + 1) % c["layer_group_size"] != 0


def _save_bailing_hybrid(root: Path, seed: int, c: dict, cls: str, linear) -> Path:
    """Ling 2.5's and Ling 3's layout under config `c`, its config module's class `cls`, its
    linear-attention layers' tensors `linear(c, w)`: layer 0 dense, the others MoE."""
    g = torch.Generator().manual_seed(seed)
    h, i, e, v = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["vocab_size"]
    shared = c.get("moe_shared_expert_intermediate_size", i) * c["num_shared_experts"]

    def w(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)

    first: dict[str, torch.Tensor] = {"model.word_embeddings.weight": w(v, h)}
    second: dict[str, torch.Tensor] = {"model.norm.weight": w(h), "lm_head.weight": w(v, h)}
    last = c["num_hidden_layers"] - 1
    for layer in range(last + 1):
        shard = second if layer == last else first
        p = f"model.layers.{layer}."
        shard |= {p + "input_layernorm.weight": w(h), p + "post_attention_layernorm.weight": w(h)}
        if _linear_layer(c, layer):
            attention = linear(c, w)
        else:  # (MLA's output projection: attention.dense)
            attention = _mla(c, w)
            attention["dense.weight"] = attention.pop("o_proj.weight")
        shard |= {f"{p}attention.{n}": t for n, t in attention.items()}
        sizes = [(p + "mlp.", c["intermediate_size"])] if layer == 0 else []
        sizes += [(p + "mlp.shared_experts.", shared)] if layer else []
        sizes += [(f"{p}mlp.experts.{x}.", i) for x in range(e)] if layer else []
        for m, size in sizes:
            shard |= {
                m + "gate_proj.weight": w(size, h),
                m + "up_proj.weight": w(size, h),
                m + "down_proj.weight": w(h, size),
            }
        if layer:
            shard[p + "mlp.gate.weight"] = w(e, h)
            shard[p + "mlp.gate.expert_bias"] = w(e, dtype=torch.float32)
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    module = CONFIG_MODULE.format(cls=cls, model_type=c["model_type"])
    file = c["auto_map"]["AutoConfig"].split(".")[0] + ".py"
    return _write(root, shards, c, file, module)


# Ling 3 (BailingMoeV3ForCausalLM, model_type bailing_hybrid as Ling 2.5's; no public checkpoint
# found): what both servers' models read (vLLM's models/bailing_moe_v3.py, SGLang's
# models/bailing_moe_v3.py and its BailingHybridConfig): Ling 2.5's layout with KDA linear
# attention (short_conv_kernel_size, no_kda_lora) where Ling 2.5 has Lightning attention, its
# tensors attention.{q,k,v,b,f,g}_proj, {q,k,v}_conv1d [P, 1, K], A_log [heads], dt_bias,
# o_norm, o_proj; a shared expert of moe_shared_expert_intermediate_size; the routed and shared
# experts' SwiGLU clamped per decoder layer (expert_swiglu_limit_list,
# share_expert_swiglu_limit_list: 0 for none); sigmoid routing with an expert bias in groups,
# renormalized. (transformers 5.20 has Ling 3 as BailingHybridForCausalLM, but its config class
# rewrites head_dim to qk_rope_head_dim and its save_pretrained names KDA's output projection
# attention.dense: vLLM 0.33's BailingMoeV3 reads config.head_dim as KDA's head size and KDA's
# attention.o_proj, so a checkpoint transformers writes does not load there; the names and keys
# here are the ones both servers' models read)
LING3_CONFIG = LING25_CONFIG | dict(
    architectures=["BailingMoeV3ForCausalLM"],
    auto_map={"AutoConfig": "configuration_bailing_moe_v3.BailingMoeV3Config"},
    moe_shared_expert_intermediate_size=128,
    norm_topk_prob=True,
    short_conv_kernel_size=4,
    no_kda_lora=True,
    kda_safe_gate=True,
    kda_lower_bound=-5.0,
    # (layer 1's experts unclamped: a clamp in any layer limits the backends)
    expert_swiglu_limit_list=[0, 0, 7.0],
    share_expert_swiglu_limit_list=[0, 7.0, 7.0],
)
for _k in ("group_norm_size", "linear_silu"):  # (Lightning attention's)
    LING3_CONFIG.pop(_k)


def save_ling3(root: Path, seed: int = 0) -> Path:
    """A tiny Ling 3 checkpoint in two shards (layer 2 in the second)."""
    return _save_bailing_hybrid(root, seed, LING3_CONFIG, "BailingMoeV3Config", _kda)


def _kda(c: dict, w) -> dict[str, torch.Tensor]:
    """Ling 3's KDA linear attention (no LoRA), under attention."""
    h, n, conv = c["hidden_size"], c["num_attention_heads"], c["short_conv_kernel_size"]
    p = n * c["head_dim"]
    f32 = torch.float32
    return {
        "q_proj.weight": w(p, h),
        "k_proj.weight": w(p, h),
        "v_proj.weight": w(p, h),
        "b_proj.weight": w(n, h),
        "f_proj.weight": w(p, h),
        "g_proj.weight": w(p, h),
        "q_conv1d.weight": w(p, 1, conv, dtype=f32),
        "k_conv1d.weight": w(p, 1, conv, dtype=f32),
        "v_conv1d.weight": w(p, 1, conv, dtype=f32),
        "A_log": w(n, dtype=f32),
        "dt_bias": w(p, dtype=f32),
        "o_norm.weight": w(c["head_dim"]),
        "o_proj.weight": w(h, p),
    }


# Ming-Omni (BailingMMNativeForConditionalGeneration, BailingMM2NativeForConditionalGeneration,
# model_type bailingmm_moe_v2_lite, as SGLang 0.5.23 reads it with its own BailingMM2Config,
# configs/bailing_moe_v2.py): Ling 2.0 (LING2_CONFIG, its llm_config) under model. (its module
# `model`, a BailingMoeV2ForCausalLM: model.model.layers.L.mlp.experts.E, model.lm_head), beside
# a Qwen3-VL-MoE vision tower (vision.: transformers' own Qwen3VLMoeVisionModel, tiny, without
# deepstack mergers) and its projection (linear_proj.0, mlp_depth 1); no audio (SGLang's port
# refuses an audio_config)
MING_VISION = dict(
    model_type="qwen3_vl_moe",
    depth=1,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    out_hidden_size=64,
    patch_size=4,
    num_position_embeddings=16,
    deepstack_visual_indexes=[],
)


def _vision_tensors(seed: int, prefix: str, proj: dict[str, tuple[int, ...]]) -> dict:
    """MING_VISION's tower (transformers' own Qwen3VLMoeVisionModel, seeded, BF16) under
    `prefix`, and the projection tensors `proj` (name: shape), seeded."""
    import transformers
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeVisionModel

    torch.manual_seed(seed)
    vision_cfg = transformers.Qwen3VLMoeVisionConfig(**MING_VISION)
    vision = Qwen3VLMoeVisionModel._from_config(vision_cfg).to(torch.bfloat16)
    g = torch.Generator().manual_seed(seed + 1)
    tensors = {f"{prefix}{k}": t.contiguous() for k, t in vision.state_dict().items()}
    return tensors | {
        k: (torch.randn(*shape, generator=g) * 0.05).bfloat16() for k, shape in proj.items()
    }


def _read_shards(root: Path) -> dict[str, dict[str, torch.Tensor]]:
    """The checkpoint at `root`'s shards, read, and every file of it removed."""
    from safetensors.torch import load_file

    index = json.loads((root / "model.safetensors.index.json").read_text())
    shards = {n: load_file(root / n) for n in sorted(set(index["weight_map"].values()))}
    for path in list(root.iterdir()):
        path.unlink()
    return shards


def save_ming(root: Path, seed: int = 0, arch: str = "BailingMM2NativeForConditionalGeneration"):
    save_ling2(root, seed)
    shards = {n: {f"model.{k}": t for k, t in ts.items()} for n, ts in _read_shards(root).items()}
    h, out = LING2_CONFIG["hidden_size"], MING_VISION["out_hidden_size"]
    proj = {"linear_proj.0.weight": (h, out), "linear_proj.0.bias": (h,)}
    shards["model-00001-of-00002.safetensors"] |= _vision_tensors(seed, "vision.", proj)
    llm = {k: v for k, v in LING2_CONFIG.items() if k not in ("auto_map", "torch_dtype")}
    config = dict(
        architectures=[arch],
        model_type="bailingmm_moe_v2_lite",
        mlp_depth=1,
        # M-RoPE's sections sum to half the rotary dimension (SGLang asserts it; its default
        # [8, 12, 12] is for 64): head_dim 16 x partial_rotary_factor 0.5 = 8, half 4
        mrope_section=[1, 1, 2],
        llm_config=llm,
        vision_config=MING_VISION,
        torch_dtype="bfloat16",
    )
    return _write(root, shards, config, None, "", exists=True)


# Ling 3 VL (BailingMoeV3VLForConditionalGeneration, model_type bailing_moe_v3_vl, as SGLang 0.5.23
# reads it with its own BailingMoeV3VLConfig, configs/bailing_hybrid.py, and vLLM 0.33 with its
# own, transformers_utils/configs/bailing_moe_v3_vl.py): Ling 3 (LING3_CONFIG, its text_config)
# under its own names (model.layers, model.word_embeddings, lm_head: the public layout both
# servers' classes read), beside MING_VISION's tower under model.visual. whose patch merger is
# its norm alone (vision_config model_type qwen3_moe_vit, disable_merger_proj: vLLM's tower has
# no merger MLP, SGLang's builds none so), and the projection linear_proj.0 (from the merged
# patches, hidden_size x 4) and .2
LING3_VL_VISION = MING_VISION | dict(model_type="qwen3_moe_vit", disable_merger_proj=True)


def save_ling3_vl(root: Path, seed: int = 0) -> Path:
    save_ling3(root, seed)
    shards = _read_shards(root)
    h, merged = LING3_CONFIG["hidden_size"], MING_VISION["hidden_size"] * 4
    proj = {
        "linear_proj.0.weight": (h, merged),
        "linear_proj.0.bias": (h,),
        "linear_proj.2.weight": (h, h),
        "linear_proj.2.bias": (h,),
    }
    vision = _vision_tensors(seed, "model.visual.", proj)
    mlp = ("model.visual.merger.linear_fc1.", "model.visual.merger.linear_fc2.")
    shards["model-00001-of-00002.safetensors"] |= {
        k: t for k, t in vision.items() if not k.startswith(mlp)
    }
    text = {k: v for k, v in LING3_CONFIG.items() if k not in ("auto_map", "torch_dtype")}
    config = dict(
        architectures=["BailingMoeV3VLForConditionalGeneration"],
        model_type="bailing_moe_v3_vl",
        text_config=text,
        vision_config=LING3_VL_VISION,
        torch_dtype="bfloat16",
    )
    return _write(root, shards, config, None, "", exists=True)


# Intern-S1-Pro (internlm/Intern-S1-Pro, InternS1ProForConditionalGeneration, model_type
# interns1_pro; its config class remote code, config.json's auto_map, as published; no server
# or transformers release has one): Qwen3-VL-MoE's whole model as transformers writes it, under
# Intern-S1-Pro's published names and config.json keys. Its published modeling code holds each
# layer's experts as a list of MLPs (mlp.experts.E.{gate,up,down}_proj.weight, [I, H], [I, H],
# [H, I]), not Qwen3-VL-MoE's fused tensors; its grouped router (router_n_groups 2 here: the
# top-k taken within each of 2 groups of experts), norm_topk_prob; its FoPE rotary embedding
# (text_config.rope_scaling's fope_init_factor, fope_sep_head and num_inv_freq, as published:
# 0.5, true, null; rope_theta beside, no mrope_section) and the FoPE coefficients it stores
# once for the whole language model, model.language_model.rotary_emb.{sin,cos}_coef of
# [num_key_value_heads, F, F] (F the rotary frequencies kept: those above 2 pi /
# max_position_embeddings where num_inv_freq is null); its vision tower without DeepStack
# mergers (the published vision_config names no deepstack_visual_indexes). Our config module
# (INTERNS1_PRO_MODULE) keeps each config.json key as given, as the published classes do
INTERNS1_PRO_MODULE = '''"""Intern-S1-Pro's configuration classes (fi-convert's tests): each key of
config.json kept as given (rope_scaling with its FoPE keys among them)."""

from transformers import PretrainedConfig


class InternS1ProTextConfig(PretrainedConfig):
    model_type = "interns1_pro_text"
    base_config_key = "text_config"

    def __init__(self, rope_scaling=None, rope_theta=5000000.0, mlp_only_layers=None, **kwargs):
        self.rope_scaling = rope_scaling
        self.rope_theta = rope_theta
        self.mlp_only_layers = mlp_only_layers or []
        super().__init__(**kwargs)


class InternS1ProVisionConfig(PretrainedConfig):
    model_type = "interns1_pro_vision"
    base_config_key = "vision_config"


class InternS1ProConfig(PretrainedConfig):
    model_type = "interns1_pro"
    sub_configs = {"vision_config": InternS1ProVisionConfig, "text_config": InternS1ProTextConfig}

    def __init__(self, text_config=None, vision_config=None, **kwargs):
        self.text_config = InternS1ProTextConfig(**(text_config or {}))
        self.vision_config = InternS1ProVisionConfig(**(vision_config or {}))
        super().__init__(**kwargs)
'''
INTERNS1_PRO_ROPE = dict(
    rope_type="default", fope_init_factor=0.5, fope_sep_head=True, num_inv_freq=None
)
INTERNS1_PRO_FOPE = "model.language_model.rotary_emb.{}_coef"


def save_interns1_pro(root: Path, seed: int = 0) -> Path:
    from safetensors.torch import load_file

    from tests import family_forms_models as ffm

    ffm.save("qwen3_vl_moe", root, published=False, seed=seed)
    cfg = json.loads((root / "config.json").read_text())
    text, vision = cfg["text_config"], cfg["vision_config"]
    text["num_experts"] = text.pop("num_local_experts")
    rope = text.pop("rope_parameters")
    text |= dict(
        model_type="interns1_pro_text",
        router_n_groups=2,
        norm_topk_prob=True,
        rope_scaling=INTERNS1_PRO_ROPE,
        rope_theta=rope["rope_theta"],
    )
    for key in ("deepstack_visual_indexes", "rope_parameters"):
        vision.pop(key)
    vision["model_type"] = "interns1_pro_vision"
    cfg |= dict(
        model_type="interns1_pro",
        architectures=["InternS1ProForConditionalGeneration"],
        auto_map={"AutoConfig": "configuration_interns1_pro.InternS1ProConfig"},
    )
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    (root / "configuration_interns1_pro.py").write_text(INTERNS1_PRO_MODULE)
    # the DeepStack mergers out, each fused expert tensor as the published per-expert ones, the
    # FoPE coefficients in (a shard of their own)
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    weight_map = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors = {}
        for n, t in load_file(root / shard).items():
            if ".deepstack_merger_list." in n:
                continue
            if n.endswith(".experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
                for e, (gate, up) in enumerate(zip(*t.chunk(2, dim=1), strict=True)):
                    tensors[f"{n[: -len('gate_up_proj')]}{e}.gate_proj.weight"] = gate.contiguous()
                    tensors[f"{n[: -len('gate_up_proj')]}{e}.up_proj.weight"] = up.contiguous()
            elif n.endswith(".experts.down_proj"):  # [E, H, I]
                for e, down in enumerate(t.unbind()):
                    tensors[f"{n[: -len('down_proj')]}{e}.down_proj.weight"] = down.contiguous()
            else:
                tensors[n] = t
        save_file(tensors, root / shard, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, shard)
    index["weight_map"] = weight_map
    head_dim, theta = text["head_dim"], rope["rope_theta"]
    kept = [
        i
        for i in range(0, head_dim, 2)
        if theta ** (-i / head_dim) > 2 * math.pi / text["max_position_embeddings"]
    ]
    g = torch.Generator().manual_seed(seed + 1)
    shape = (text["num_key_value_heads"], len(kept), len(kept))
    fope = {
        INTERNS1_PRO_FOPE.format(k): torch.randn(shape, generator=g).to(torch.bfloat16)
        for k in ("sin", "cos")
    }
    save_file(fope, root / "model-fope.safetensors", metadata={"format": "pt"})
    index["weight_map"] |= dict.fromkeys(fope, "model-fope.safetensors")
    index_path.write_text(json.dumps(index, indent=2))
    return root


# Nemotron Nano VL (NemotronH_Nano_VL_V2, as nvidia/NVIDIA-Nemotron-Nano-12B-v2-VL-BF16): its
# config class is remote code (config.json's auto_map: configuration.NemotronH_Nano_VL_V2_Config),
# which vLLM 0.33 takes (it has no config class of this model_type, nor has transformers 5.20).
# The published class makes text_config a Nemotron-H config from llm_config and vision_config
# RADIO's (its own remote code, C-RADIO's RADIOConfig: args, preferred_resolution, patch_size,
# ...), and keeps the top-level keys vLLM's model reads (force_image_size, patch_size,
# downsample_ratio, ps_version, template, image_tag_type, vit_hidden_size,
# projector_hidden_size, norm_mean, norm_std). Our stand-in: transformers' NemotronHConfig for
# text_config, a plain config of model_type radio holding vision_config's keys as given.
# The checkpoint is tests/hf_checkpoints.py's (the layout SGLang's class is proven with), and a
# tokenizer as the published checkpoints have one (vLLM's model, when built, encodes its image
# tags <img>, </img>, <image> with it): a word-level vocabulary holding those tags. The Omnis
# (kinds with "omni") also hold their sound encoder as vLLM's ProjectedParakeet reads it:
# sound_config (a Parakeet encoder's keys, and projection_hidden_size, projection_bias,
# sampling_rate), transformers' own ParakeetEncoder under sound_encoder.encoder. (without
# attention biases: vLLM builds it with attention_bias False) and the projection
# sound_projection.{norm,linear1,linear2}
NANO_VL_MODULE = '''"""Nemotron Nano VL's configuration class (fi-convert's tests): a Nemotron-H
text_config from llm_config, RADIO's vision_config, the Omnis' Parakeet sound_config."""

from transformers import NemotronHConfig, PretrainedConfig


class RADIOConfig(PretrainedConfig):
    model_type = "radio"


class SoundConfig(PretrainedConfig):
    model_type = "parakeet"


class {cls}(PretrainedConfig):
    model_type = "{model_type}"

    def __init__(self, vision_config=None, llm_config=None, sound_config=None, **kwargs):
        self.vision_config = RADIOConfig(**(vision_config or {{}}))
        self.text_config = NemotronHConfig(**(llm_config or {{}}))
        self.sound_config = SoundConfig(**sound_config) if sound_config else None
        super().__init__(**kwargs)
'''


def save_nemotron_h_nano_vl(root: Path, seed: int = 0, kind: str = "nemotron_h_nano_vl") -> Path:
    """tests/hf_checkpoints.py's Nemotron Nano VL (or, by `kind`, Nano Omni / Omni: the same
    layout under their architectures and model types), its config class beside it as the
    module config.json's auto_map names."""
    from tests import hf_checkpoints as hf

    hf.save(kind, root, seed)
    config = json.loads((root / "config.json").read_text())
    module, cls = config["auto_map"]["AutoConfig"].split(".")
    text = NANO_VL_MODULE.format(cls=cls, model_type=config["model_type"])
    (root / f"{module}.py").write_text(text)
    _tokenizer(root, ["<img>", "</img>", "<image>", "<video>", "<so_embedding>"])
    if "omni" in kind:
        _add_sound(root, seed, config)
    return root


SOUND = dict(
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    subsampling_conv_channels=16,
    num_mel_bins=16,
)


def _add_sound(root: Path, seed: int, config: dict) -> None:
    """The Omnis' sound encoder and projection, beside the other tensors (one shard)."""
    import transformers
    from safetensors.torch import load_file

    torch.manual_seed(seed + 3)
    encoder_cfg = transformers.ParakeetEncoderConfig(
        **SOUND, attention_bias=False, scale_input=False
    )
    encoder = transformers.ParakeetEncoder(encoder_cfg).to(torch.bfloat16)
    tensors = load_file(root / "model.safetensors")
    tensors |= {f"sound_encoder.encoder.{k}": t for k, t in encoder.state_dict().items()}
    g = torch.Generator().manual_seed(seed + 4)
    d, proj, h = SOUND["hidden_size"], 64, config["llm_config"]["hidden_size"]
    for name, shape in (("norm.weight", (d,)), ("linear1.weight", (proj, d))):
        tensors[f"sound_projection.{name}"] = torch.randn(shape, generator=g).bfloat16()
    tensors["sound_projection.linear2.weight"] = torch.randn((h, proj), generator=g).bfloat16()
    save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
    config["sound_config"] = SOUND | dict(
        model_type="parakeet",
        projection_hidden_size=proj,
        projection_bias=False,
        sampling_rate=16000,
    )
    (root / "config.json").write_text(json.dumps(config, indent=2))


def _tokenizer(root: Path, special: list[str]) -> None:
    """A word-level fast tokenizer of a few words and the tokens `special`, saved at `root`
    by transformers' own save_pretrained."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "a", "b", *special]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.add_special_tokens({"additional_special_tokens": special})
    fast.save_pretrained(root)

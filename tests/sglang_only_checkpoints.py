"""Tiny checkpoints of MoE families only SGLang 0.5.23 has a model class for (vLLM 0.33's
registry has none), in the names and config keys SGLang's own model class reads.

SDAR MoE (SDARMoeForCausalLM, model_type sdar_moe; JetLM's SDAR-30B-A3B): a block-diffusion
language model on Qwen3-MoE's layers: the tensors transformers' own Qwen3-MoE writes (per-expert
gate/up/down_proj, q/k norms, every layer MoE), config.json with Qwen3-MoE's keys under
SDAR's model_type, its config class remote code (auto_map), as published.

LLaDA 2 MoE (LLaDA2MoeModelLM, model_type llada2_moe; inclusionAI's LLaDA2.0-mini): a diffusion
language model on Ling 2.0's layout (tests/remote_code_checkpoints.py's writer: fused QKV, layer
0 dense, a shared expert, per-expert gate/up/down_proj, the router's expert bias) and keys
(sigmoid scores, grouped top-k), its config class remote code.

Xllm (XllmForCausalLM, model_type xllm; SGLang's models/xllm.py, no public MoE checkpoint
found): Llama's names (q/k/v/o_proj, input/post_attention_layernorm), layer 0 dense
(mlp_only_layers), layer 1 MoE: router mlp.gate.weight and its correction bias mlp.gate.bias
(moe_gate_bias), one shared expert (mlp.shared_experts, num_shared_experts x
moe_intermediate_size), per-expert gate/up/down_proj; sigmoid scores (router_score_func)
renormalized (norm_topk_prob); a config class of its own (remote code).

IQuest Q1 (IQuestQ1ForCausalLM, model_type iquest_q1; SGLang's models/iquest_q1.py and its own
config class configs/iquest_q1.py, no public checkpoint found): q/k/v/o_proj with q/k norms and
a learned attention sink (sink_k), its own norms (attention_norm, attn_out_norm,
feed_forward_norm; layer 0's ffn_out_norm), layer 0 dense (mlp_only_layers, of
dense_intermediate_size), layer 1 MoE: its router mlp.router.weight (FP32) and its experts
fused, mlp.experts.fc [E, 2I, H] ([gate; up]) and mlp.experts.proj [E, H, I], tensors without a
.weight suffix as its load_weights reads them.

GigaChat 3.5 (GigaChat35ForCausalLM, model_type gigachat3_5; SGLang's models/gigachat35.py and
its own config class configs/gigachat35.py, no public checkpoint found): DeepSeek-V3's layout
(layer 0 dense, layer 1 MoE with a shared expert and the router's e_score_correction_bias,
per-expert gate/up/down_proj) where layer 0 is a Gated-Delta-Net layer (self_attn.in_proj_qkvz,
in_proj_ba, conv1d, A_log, dt_bias, norm, out_proj) and layer 1 a gated MLA one (q_a_proj,
kv_a_proj_with_mqa, ..., the gate self_attn.gate_proj), every norm gated (its weight and its
low-rank gate_up_projection / gate_down_projection), as SGLang's load_weights reads them.

Grok-1 (Grok1ForCausalLM; SGLang's models/grok.py): Mixtral's expert names beside Grok's own
norms, its config.json under model_type git, as Grok-2's (GROK1_CONFIG).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests import hf_checkpoints as hf
from tests import remote_code_checkpoints as rc

# SDAR MoE: Qwen3-MoE's keys (num_experts, moe_intermediate_size, norm_topk_prob,
# decoder_sparse_step, mlp_only_layers) at the sizes hf_checkpoints' qwen3_moe is written with
SDAR_MOE_CONFIG = dict(
    model_type="sdar_moe",
    architectures=["SDARMoeForCausalLM"],
    auto_map={"AutoConfig": "configuration_sdar_moe.SDARMoeConfig"},
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    attention_bias=False,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    rope_scaling=None,
    max_position_embeddings=128,
    hidden_act="silu",
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def save_sdar_moe(root: Path, seed: int = 0) -> Path:
    """A tiny SDAR MoE checkpoint: transformers' Qwen3-MoE tensors, SDAR's config.json and
    config class."""
    hf.save("qwen3_moe", root, seed)
    return _remote_config(root, SDAR_MOE_CONFIG, "SDARMoeConfig")


LLADA2_CONFIG = rc.LING2_CONFIG | dict(
    model_type="llada2_moe",
    architectures=["LLaDA2MoeModelLM"],
    auto_map={"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig"},
)


def save_llada2(root: Path, seed: int = 0) -> Path:
    """A tiny LLaDA 2 MoE checkpoint in two shards (layer 1's experts in the second)."""
    return rc._save_bailing_v2(root, seed, LLADA2_CONFIG, "LLaDA2MoeConfig")


def save_xllm(root: Path, seed: int = 0) -> Path:
    """A tiny Xllm checkpoint in two shards (layer 1's experts in the second)."""
    return rc.save_xllm_layout(root, seed, rc.XLLM_CONFIG, "XllmConfig")


IQUEST_Q1_CONFIG = dict(
    model_type="iquest_q1",
    architectures=["IQuestQ1ForCausalLM"],
    vocab_size=128,
    hidden_size=64,
    dense_intermediate_size=128,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rotary_dim=8,
    use_hybrid_layers=False,
    use_sliding_window=False,
    mlp_only_layers=[0],
    num_experts=4,
    num_experts_per_tok=2,
    moe_router_dtype="fp32",
    enable_sink_attention=True,
    enable_lm_head_fp32=True,
    rope_theta=1000000.0,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def save_iquest_q1(root: Path, seed: int = 0) -> Path:
    """A tiny IQuest Q1 checkpoint in two shards (layer 1's experts in the second)."""
    g = torch.Generator().manual_seed(seed)
    c = IQUEST_Q1_CONFIG
    h, i, e, v = c["hidden_size"], c["intermediate_size"], c["num_experts"], c["vocab_size"]
    d, nq, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]

    def w(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)

    first: dict[str, torch.Tensor] = {"model.embed_tokens.weight": w(v, h)}
    second: dict[str, torch.Tensor] = {"model.norm.weight": w(h), "lm_head.weight": w(v, h)}
    for layer, shard in ((0, first), (1, second)):
        p, a = f"model.layers.{layer}.", f"model.layers.{layer}.self_attn."
        norms = ["attention_norm", "attn_out_norm", "feed_forward_norm"]
        shard |= {f"{p}{n}.weight": w(h) for n in norms + (["ffn_out_norm"] if not layer else [])}
        shard |= {
            a + "q_proj.weight": w(nq * d, h),
            a + "k_proj.weight": w(nkv * d, h),
            a + "v_proj.weight": w(nkv * d, h),
            a + "o_proj.weight": w(h, nq * d),
            a + "q_norm.weight": w(d),
            a + "k_norm.weight": w(d),
            a + "sink_k": w(nkv, d),
        }
        if layer == 0:
            m, size = p + "mlp.", c["dense_intermediate_size"]
            shard |= {
                m + "gate_proj.weight": w(size, h),
                m + "up_proj.weight": w(size, h),
                m + "down_proj.weight": w(h, size),
            }
        else:
            shard |= {
                p + "mlp.router.weight": w(e, h, dtype=torch.float32),
                p + "mlp.experts.fc": w(e, 2 * i, h),
                p + "mlp.experts.proj": w(e, h, i),
            }
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    return _write(root, shards, c)


# GigaChat 3.5: SGLang's GigaChat35Config's keys, tiny; the routing keys written out (sigmoid
# scores with the correction bias, renormalized: the config class's defaults), which the
# DeepSeek-V3 family reads; layer 0 a Gated-Delta-Net layer, layer 1 MLA
GIGACHAT35_CONFIG = dict(
    architectures=["GigaChat35ForCausalLM"],
    model_type="gigachat3_5",
    torch_dtype="bfloat16",
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=128,
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    head_dim=64,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    layer_types=["linear_attention", "attention"],
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    norm_type="ZeroCenteredGatedNorm",
    layernorm_type="pre_post",
    gated_attention=True,
)
# the rank of each gated norm's low-rank gate (SGLang's _GATED_NORM_LOW_RANK)
GIGACHAT35_NORM_RANK = 16


def save_gigachat35(root: Path, seed: int = 0) -> Path:
    """A tiny GigaChat 3.5 checkpoint in two shards (layer 1 in the second)."""
    g = torch.Generator().manual_seed(seed)
    c, r = GIGACHAT35_CONFIG, GIGACHAT35_NORM_RANK
    h, v, dense, i = (
        c["hidden_size"],
        c["vocab_size"],
        c["intermediate_size"],
        c["moe_intermediate_size"],
    )
    heads, nope, rope, vd = (
        c["num_attention_heads"],
        c["qk_nope_head_dim"],
        c["qk_rope_head_dim"],
        c["v_head_dim"],
    )
    ql, kvl = c["q_lora_rank"], c["kv_lora_rank"]
    kh, vh = c["linear_num_key_heads"], c["linear_num_value_heads"]
    kd, lvd = c["linear_key_head_dim"], c["linear_value_head_dim"]

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    def norm(name: str, n: int) -> dict[str, torch.Tensor]:
        return {
            f"{name}.weight": w(n),
            f"{name}.gate_up_projection.weight": w(r, n),
            f"{name}.gate_down_projection.weight": w(n, r),
        }

    def mlp(name: str, size: int) -> dict[str, torch.Tensor]:
        return {
            f"{name}.gate_proj.weight": w(size, h),
            f"{name}.up_proj.weight": w(size, h),
            f"{name}.down_proj.weight": w(h, size),
        }

    layer_norms = ("input", "post_attention", "post_self_attn", "post_feedforward")
    first = {"model.embed_tokens.weight": w(v, h)}
    second = {**norm("model.norm", h), "lm_head.weight": w(v, h)}
    a, p = "model.layers.0.self_attn.", "model.layers.0."
    first |= {
        a + "in_proj_qkvz.weight": w(2 * kh * kd + 2 * vh * lvd, h),
        a + "in_proj_ba.weight": w(2 * vh, h),
        a + "conv1d.weight": w(2 * kh * kd + vh * lvd, 1, c["linear_conv_kernel_dim"]),
        a + "A_log": w(vh),
        a + "dt_bias": w(vh),
        a + "norm.weight": w(lvd),
        a + "out_proj.weight": w(h, vh * lvd),
        **mlp(p + "mlp", dense),
    }
    for n in layer_norms:
        first |= norm(f"{p}{n}_layernorm", h)
    a, p = "model.layers.1.self_attn.", "model.layers.1."
    second |= {
        a + "q_a_proj.weight": w(ql, h),
        **norm(a + "q_a_layernorm", ql),
        a + "q_b_proj.weight": w(heads * (nope + rope), ql),
        a + "kv_a_proj_with_mqa.weight": w(kvl + rope, h),
        **norm(a + "kv_a_layernorm", kvl),
        a + "kv_b_proj.weight": w(heads * (nope + vd), kvl),
        a + "o_proj.weight": w(h, heads * vd),
        a + "gate_proj.weight": w(heads * vd, h),
        p + "mlp.gate.weight": w(c["n_routed_experts"], h),
        p + "mlp.gate.e_score_correction_bias": w(c["n_routed_experts"]).float(),
        **mlp(p + "mlp.shared_experts", i * c["n_shared_experts"]),
    }
    for e in range(c["n_routed_experts"]):
        second |= mlp(f"{p}mlp.experts.{e}", i)
    for n in layer_norms:
        second |= norm(f"{p}{n}_layernorm", h)
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    return _write(root, shards, c)


def _write(root: Path, shards: dict, config: dict) -> Path:
    """`shards` and config.json (a config class SGLang has: no remote code)."""
    rc._write(root, shards, config, "README.md", "A tiny checkpoint of fi-convert's tests.\n")
    return root


def _remote_config(root: Path, config: dict, cls: str) -> Path:
    """`root`'s config.json replaced by `config`, beside its config module (class `cls` of
    config's model_type, the file auto_map names)."""
    (root / "config.json").write_text(json.dumps(config, indent=2))
    module = rc.CONFIG_MODULE.format(cls=cls, model_type=config["model_type"])
    (root / (config["auto_map"]["AutoConfig"].split(".")[0] + ".py")).write_text(module)
    return root


# Grok-1 / Grok-2 (Grok1ForCausalLM; SGLang's models/grok.py, no public checkpoint in a form
# fi-convert reads: xai-org/grok-2 ships its weights presharded per TP rank): config.json under
# model_type git (as Grok-2's: SGLang reads it through transformers' GitConfig, models/grok.py's
# keys beside it), its MoE read unsharded (load_presharded_moe false, the key SGLang's class
# reads; presharded by default at TP > 1); the names its load_weights reads: q/k/v/o_proj, the
# four norms of a layer (pre/post_attn_norm, pre/post_moe_norm), the router
# block_sparse_moe.gate.weight, per-expert block_sparse_moe.experts.E.w1/w3/w2 (Mixtral's)
GROK1_CONFIG = dict(
    model_type="git",
    architectures=["Grok1ForCausalLM"],
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    embedding_multiplier_scale=8.0,
    output_multiplier_scale=0.5,
    pad_token_id=0,
    load_presharded_moe=False,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def save_grok1(root: Path, seed: int = 0) -> Path:
    """A tiny Grok-1 checkpoint in two shards (layer 1 in the second)."""
    g = torch.Generator().manual_seed(seed)
    c = GROK1_CONFIG
    h, i, e, v, d = (
        c["hidden_size"],
        c["intermediate_size"],
        c["num_local_experts"],
        c["vocab_size"],
        c["head_dim"],
    )
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    def layer(n: int) -> dict[str, torch.Tensor]:
        p = f"model.layers.{n}."
        out = {
            f"{p}self_attn.q_proj.weight": w(q, h),
            f"{p}self_attn.k_proj.weight": w(kv, h),
            f"{p}self_attn.v_proj.weight": w(kv, h),
            f"{p}self_attn.o_proj.weight": w(h, q),
            f"{p}block_sparse_moe.gate.weight": w(e, h),
        }
        for norm in ("pre_attn_norm", "post_attn_norm", "pre_moe_norm", "post_moe_norm"):
            out[f"{p}{norm}.weight"] = 1 + w(h)
        for x in range(e):
            ex = f"{p}block_sparse_moe.experts.{x}."
            out |= {f"{ex}w1.weight": w(i, h), f"{ex}w3.weight": w(i, h), f"{ex}w2.weight": w(h, i)}
        return out

    first = {"model.embed_tokens.weight": w(v, h)} | layer(0)
    second = layer(1) | {"model.norm.weight": 1 + w(h), "lm_head.weight": w(v, h)}
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    return _write(root, shards, c)


# ZAYA1 (ZayaForCausalLM, model_type zaya; SGLang's models/zaya.py and its own config class
# configs/zaya.py, which SGLang registers over transformers' for model_type zaya): Zyphra's
# published layout (ZAYA1-8B: 40 CCA attention layers alternating with 40 MoE layers, 16 experts
# of ffn_hidden_size 4096 over H 2048), here one attention layer (0) and one MoE layer (1) as
# zaya_layers says ("a", then the MoE layer's expert count); the keys SGLang's ZayaConfig reads,
# ffn_hidden_size the fused gate/up's rows (2I: SGLang's FusedMoE is built with
# ffn_hidden_size // 2); the names its load_weights reads: the CCA projection self_attn.qkv.
# {linear_q, linear_k, val_proj1, val_proj2, conv_qk.{0,1}, temp} and o_proj, each layer's
# input_norm and res_scale (layer 0 without a residual scale), the router zaya_block.router.
# {down_proj, rmsnorm_eda, router_states_scale, router_mlp.{0,2,4}, balancing_biases} (one
# class more than experts: the skip expert of zaya_use_mod), and per expert zaya_block.experts.
# local_experts.E.linear_fc1 ([gate; up], [2I, H]) and linear_fc2 ([H, I]); the final norm and
# residual scale; tied embeddings
ZAYA_CONFIG = dict(
    model_type="zaya",
    architectures=["ZayaForCausalLM"],
    vocab_size=128,
    hidden_size=64,
    ffn_hidden_size=256,
    num_hidden_layers=2,
    zaya_layers=["a", 4],
    num_experts=4,
    num_attention_heads=4,
    num_query_groups=2,
    num_key_value_heads=2,
    head_dim=16,
    kv_channels=16,
    moe_router_topk=1,
    zaya_mlp_expansion=32,
    zaya_use_mod=True,
    zaya_use_eda=True,
    zaya_high_prec=True,
    activation_func="swiglu",
    gated_linear_unit=True,
    add_bias_linear=False,
    normalization="RMSNorm",
    norm_epsilon=1e-5,
    scale_residual_merge=True,
    residual_in_fp32=True,
    cca=True,
    cca_time0=2,
    cca_time1=2,
    partial_rotary_factor=0.5,
    rope_theta=5000000,
    max_position_embeddings=128,
    tie_word_embeddings=True,
    lm_head_bias=False,
    attention_bias=False,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
    torch_dtype="bfloat16",
)


def save_zaya(root: Path, seed: int = 0, config: dict | None = None) -> Path:
    """A tiny ZAYA1 checkpoint in two shards (the MoE layer in the second)."""
    g = torch.Generator().manual_seed(seed)
    c = config or ZAYA_CONFIG
    h, v, e, d = c["hidden_size"], c["vocab_size"], c["num_experts"], c["head_dim"]
    i, r = c["ffn_hidden_size"] // 2, c["zaya_mlp_expansion"]
    q, k = c["num_attention_heads"] * d, c["num_query_groups"] * d

    def w(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)

    def scaling(p: str, residual: bool) -> dict[str, torch.Tensor]:
        out = {
            f"{p}res_scale.hidden_states_scale": 1 + w(h),
            f"{p}res_scale.hidden_states_bias": w(h),
        }
        if residual:
            out |= {f"{p}res_scale.residual_scale": 1 + w(h), f"{p}res_scale.residual_bias": w(h)}
        return out

    a = "model.layers.0.self_attn."
    first = {
        "model.embed_tokens.weight": w(v, h),
        "model.layers.0.input_norm.weight": 1 + w(h),
        **scaling("model.layers.0.", residual=False),
        a + "qkv.linear_q.weight": w(q, h),
        a + "qkv.linear_k.weight": w(k, h),
        a + "qkv.val_proj1.weight": w(k // 2, h),
        a + "qkv.val_proj2.weight": w(k // 2, h),
        a + "qkv.conv_qk.0.weight": w(q + k, 1, c["cca_time0"]),
        a + "qkv.conv_qk.0.bias": w(q + k),
        a + "qkv.conv_qk.1.weight": w(q + k, d, c["cca_time1"]),
        a + "qkv.conv_qk.1.bias": w(q + k),
        a + "qkv.temp": w(c["num_query_groups"]),
        a + "o_proj.weight": w(h, q),
    }
    p, rt = "model.layers.1.", "model.layers.1.zaya_block.router."
    classes = e + 1  # the skip expert (zaya_use_mod)
    second = {
        p + "input_norm.weight": 1 + w(h),
        **scaling(p, residual=True),
        rt + "down_proj.weight": w(r, h),
        rt + "down_proj.bias": w(r),
        rt + "rmsnorm_eda.weight": 1 + w(r),
        rt + "router_states_scale": 1 + w(r),
        rt + "router_mlp.0.weight": w(r, r),
        rt + "router_mlp.0.bias": w(r),
        rt + "router_mlp.2.weight": w(r, r),
        rt + "router_mlp.2.bias": w(r),
        rt + "router_mlp.4.weight": w(classes, r),
        rt + "balancing_biases": torch.cat([w(e, dtype=torch.float32), torch.tensor([-1.0])]),
        "model.final_norm.weight": 1 + w(h),
        **scaling("model.", residual=True),
    }
    for x in range(e):
        ex = f"{p}zaya_block.experts.local_experts.{x}."
        second |= {ex + "linear_fc1.weight": w(2 * i, h), ex + "linear_fc2.weight": w(h, i)}
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    return _write(root, shards, c)

"""Tiny checkpoints written by transformers itself: the real model classes, randomly
initialized (seeded), cast to BF16 and saved with `save_pretrained` in several shards. No one
here chose their tensor names, shapes or config keys: a new transformers release that renames
them shows up here before users see it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

# shared by every model: small enough that a conversion takes well under a second
COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
)
# (config class, model class, the config's own arguments), by transformers' names
MODELS: dict[str, tuple[str, str, dict]] = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        # norm_topk_prob as the released Qwen3-MoE checkpoints set it (transformers' default is
        # False: softmax routing without renormalization, which vLLM runs on CUTLASS only)
        dict(
            moe_intermediate_size=128,
            intermediate_size=128,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
        ),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(intermediate_size=128, num_local_experts=4, num_experts_per_tok=2),
    ),
    "deepseek_v3": (  # layer 0 dense, layer 1 MoE with a shared expert, MLA attention
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=128,
            n_routed_experts=4,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
        ),
    ),
    "gpt_oss": (  # BF16: experts.gate_up_proj [E, H, 2I] (gate/up interleaved), with biases
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            intermediate_size=128,
            num_local_experts=4,
            num_experts_per_tok=2,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    # the families of fi_convert/families/*.json that transformers has (tests/test_families.py)
    "glm4_moe": (  # GLM-4.5: layer 0 dense, layer 1 MoE with a shared expert, GQA attention
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=128,
            n_routed_experts=4,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
        ),
    ),
    "minimax_m2": (  # MiniMax-M2: block_sparse_moe.experts.E.w{1,2,3}, sigmoid + bias routing
        "MiniMaxM2Config",
        "MiniMaxM2ForCausalLM",
        dict(
            intermediate_size=128,
            num_local_experts=4,
            num_experts_per_tok=2,
            scoring_func="sigmoid",
            use_routing_bias=True,
            rotary_dim=8,  # released: 64 of head_dim 128 (vLLM's model reads it)
        ),
    ),
    "ernie4_5_moe": (  # ERNIE-4.5-MoE: softmax routing with a correction bias (Unspecified)
        "Ernie4_5_MoeConfig",
        "Ernie4_5_MoeForCausalLM",
        dict(intermediate_size=128, moe_intermediate_size=128, moe_num_experts=4, moe_k=2),
    ),
    "olmoe": (  # OLMoE: softmax routing without renormalization (Default)
        "OlmoeConfig",
        "OlmoeForCausalLM",
        # (SGLang's OLMoE normalizes q and k over all heads: as many KV heads as heads)
        dict(intermediate_size=128, num_experts=4, num_experts_per_tok=2, num_key_value_heads=4),
    ),
    "nemotron_h": (  # Nemotron-H: a Mamba mixer, a MoE one (non-gated relu2 experts) and an
        # attention one
        "NemotronHConfig",
        "NemotronHForCausalLM",
        dict(
            layers_block_type=["mamba", "moe", "attention"],
            intermediate_size=128,
            moe_intermediate_size=128,
            moe_shared_expert_intermediate_size=64,
            n_shared_experts=1,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
        ),
    ),
    # ZAYA1 in transformers' own form (Zyphra/ZAYA1-8B as republished for transformers 5):
    # attention and MoE folded into one layer, experts fused, mlp.experts.gate_up_proj
    # [E, 2I, H] and down_proj [E, H, I]; not the layout SGLang's ZayaForCausalLM reads (the
    # family refuses it: tests/test_family_forms.py)
    "zaya": (
        "ZayaConfig",
        "ZayaForCausalLM",
        dict(moe_intermediate_size=32, num_experts=4, router_hidden_size=32),
    ),
    # DBRX: experts flat, transformer.blocks.L.ffn.experts.mlp.{w1,v1,w2} [E*I, H] (w2 turned)
    "dbrx": (
        "DbrxConfig",
        "DbrxForCausalLM",
        # (its sizes under DBRX's own names: DbrxConfig copies d_model, not hidden_size, into
        # the experts' config); I 256: I/TP a multiple of 128 at TP 1 and 2, which vLLM 0.33's
        # DbrxExperts.weight_loader needs on TRT-LLM BF16 (it fills the parameters unpadded)
        dict(
            d_model=64,
            n_heads=4,
            n_layers=2,
            max_seq_len=128,
            attn_config=dict(kv_n_heads=2, clip_qkv=8, rope_theta=1e4),
            ffn_config=dict(ffn_hidden_size=256, moe_num_experts=4, moe_top_k=2),
        ),
    ),
    # Jamba: layer 0 attention + dense MLP, layer 1 Mamba + MoE (softmax, no renormalization)
    "jamba": (
        "JambaConfig",
        "JambaForCausalLM",
        dict(
            intermediate_size=128,
            num_experts=4,
            num_experts_per_tok=2,
            expert_layer_period=2,
            expert_layer_offset=1,
            attn_layer_period=2,
            attn_layer_offset=0,
            mamba_d_state=8,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_dt_rank=8,
        ),
    ),
    # the families proven through the servers' model classes by tests/test_vllm_families.py
    # and tests/test_sglang_families.py (issue 32): config keys the servers read that
    # transformers' config classes do not write are the released configs' (beside them)
    "phimoe": (  # Phi-3.5-MoE: block_sparse_moe.experts.E.w{1,2,3}, sparsemixer routing
        "PhimoeConfig",
        "PhimoeForCausalLM",
        # attention and lm_head biases as released (vLLM's PhiMoE always builds them)
        dict(
            intermediate_size=128,
            num_local_experts=4,
            num_experts_per_tok=2,
            attention_bias=True,
            lm_head_bias=True,
        ),
    ),
    "exaone_moe": (  # K-EXAONE: layer 0 dense, sigmoid + bias routing, a shared expert
        "ExaoneMoeConfig",
        "ExaoneMoeForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=128,
            num_experts=4,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            is_moe_layer=[False, True],  # the released config's key (SGLang's model reads it)
        ),
    ),
    "afmoe": (  # Arcee Trinity: layer 0 dense, sigmoid + expert_bias routing
        "AfmoeConfig",
        "AfmoeForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=128,
            num_experts=4,
            num_experts_per_tok=2,
            num_shared_experts=1,
            num_dense_layers=1,
            global_attn_every_n_layers=2,
            sliding_window=64,
            score_func="sigmoid",  # released (Trinity-Mini's config.json)
            route_norm=True,
            n_group=1,
            topk_group=1,
        ),
    ),
    "hy_v3": (  # HY v3: sigmoid + bias routing, a shared expert
        "HYV3Config",
        "HYV3ForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=128,
            expert_hidden_dim=128,  # the key vLLM's and SGLang's HY v3 read
            num_experts=4,
            num_experts_per_tok=2,
            num_shared_experts=1,
            route_norm=True,
            first_k_dense_replace=1,  # as mlp_layer_types (vLLM's HY v3 reads it)
            qk_norm=True,
        ),
    ),
    "hy_v4": (  # HY v4: MLA + indexer, hyper-connections; fused experts, SwiGLU clamp
        "HYV4Config",
        "HYV4ForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=128,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            pad_token_id=0,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            index_head_dim=16,
            index_n_heads=2,
        ),
    ),
    "beam": (  # Beam: a dense layer then a MoE one, sigmoid + bias routing in groups
        "BeamConfig",
        "BeamForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=128,
            num_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            mlp_layer_types=["dense", "sparse"],
            pad_token_id=0,
        ),
    ),
    "hunyuan_v1_moe": (  # Hunyuan-A13B: softmax top-k renormalized, a shared MLP
        "HunYuanMoEV1Config",
        "HunYuanMoEV1ForCausalLM",
        dict(intermediate_size=96, num_experts=4, moe_topk=2),
    ),
    "flex_olmo": (  # FlexOlmo: OLMoE's layout, softmax routing (vLLM: Transformers backend)
        "FlexOlmoConfig",
        "FlexOlmoForCausalLM",
        dict(intermediate_size=128, num_experts=4, num_experts_per_tok=2, pad_token_id=0),
    ),
    "kolibri1": (  # Kolibri1: its own router (top-k of logits + bias), shared experts
        "Kolibri1Config",
        "Kolibri1ForCausalLM",
        dict(
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            num_local_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
        ),
    ),
    "mellum": (  # Mellum: Qwen3-MoE's layout, a dense layer then a MoE one (mlp_layer_types)
        "MellumConfig",
        "MellumForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=96,
            num_local_experts=4,
            num_experts_per_tok=2,
            mlp_layer_types=["dense", "sparse"],
        ),
    ),
    "granitemoe_swa": (  # Granite-MoE SWA: fused experts as transformers 5 names them, sinks
        "GraniteMoeSWAConfig",
        "GraniteMoeSWAForCausalLM",
        dict(intermediate_size=96, num_local_experts=4, num_experts_per_tok=2),
    ),
    # Granite 4.0 hybrid: a Mamba2 layer, then an attention layer, each with Granite-MoE's
    # experts (block_sparse_moe.input_linear / output_linear) and a shared MLP
    "granitemoehybrid": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        dict(
            intermediate_size=96,
            shared_intermediate_size=96,
            num_local_experts=4,
            num_experts_per_tok=2,
            layer_types=["mamba", "attention"],
            mamba_n_heads=4,
            mamba_d_head=16,
            mamba_n_groups=1,
            mamba_d_state=16,
            mamba_expand=1,
        ),
    ),
    "laguna": (  # Laguna: sigmoid + bias routing (the bias under mlp.experts), a shared expert
        "LagunaConfig",
        "LagunaForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=96,
            shared_expert_intermediate_size=96,
            num_experts=4,
            num_experts_per_tok=2,
        ),
    ),
    "lfm2_moe": (  # LFM2-MoE: feed_forward.experts.E.w{1,2,3}, conv and attention layers
        "Lfm2MoeConfig",
        "Lfm2MoeForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=128,
            num_experts=4,
            num_experts_per_tok=2,
            num_dense_layers=1,
            layer_types=["conv", "full_attention"],
        ),
    ),
    "cohere2_moe": (  # Cohere2-MoE: softmax routing, renormalized
        "Cohere2MoeConfig",
        "Cohere2MoeForCausalLM",
        dict(
            intermediate_size=128,
            num_experts=4,
            num_experts_per_tok=2,
            sliding_window=64,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    "mimo_v2_flash": (  # MiMo-V2-Flash: layer 0 dense, sigmoid + bias routing
        "MiMoV2FlashConfig",
        "MiMoV2FlashForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=128,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            v_head_dim=16,
            sliding_window=64,
            mlp_layer_types=["dense", "sparse"],
            # the released config's keys for the same (vLLM's and SGLang's MiMo-V2 read them)
            hybrid_layer_pattern=[0, 1],
            moe_layer_freq=[0, 1],
            swa_num_attention_heads=4,
            swa_num_key_value_heads=2,
            swa_head_dim=16,
            swa_v_head_dim=16,
            sliding_window_size=64,
            add_swa_attention_sink_bias=True,
            add_full_attention_sink_bias=False,
            layernorm_epsilon=1e-5,
        ),
    ),
    "deepseek_v32": (  # DeepSeek-V3.2: DeepSeek-V3's layers with the DSA indexer's tensors
        "DeepseekV32Config",
        "DeepseekV32ForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=128,
            n_routed_experts=4,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            index_topk=8,
            index_head_dim=16,
            index_n_heads=2,
            # the released config's keys, which transformers' class does not write
            topk_method="noaux_tc",
            scoring_func="sigmoid",
            moe_layer_freq=1,
        ),
    ),
    "gemma4": (  # Gemma 4 (text): experts fused beside each layer's dense MLP, gelu_tanh
        "Gemma4TextConfig",
        "Gemma4ForCausalLM",
        dict(
            intermediate_size=128,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=64,
            hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=128,
            layer_types=["sliding_attention", "full_attention"],
            global_head_dim=16,
        ),
    ),
    "axk1": (  # A.X K1: DeepSeek-V3's layout (layer 0 dense, MLA), sigmoid + bias routing
        "AXK1Config",
        "AXK1ForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=128,
            n_routed_experts=4,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            # the published head sizes (vLLM 0.33 has MLA prefill kernels for these only)
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
        ),
    ),
    "qwen3": (  # dense: no MoE layer at all
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(intermediate_size=128),
    ),
}
# where the released config.json names the architecture otherwise than transformers' class
# (the servers pick their model class by it): microsoft/Phi-3.5-MoE-instruct's
RELEASED_ARCHITECTURES = {"phimoe": ["PhiMoEForCausalLM"]}
# several shards for every model above (their BF16 weights are 0.2-1 MB)
MAX_SHARD_SIZE = "200KB"


@contextlib.contextmanager
def transformers_own_rope() -> Iterator[None]:
    """transformers' own `PretrainedConfig.standardize_rope_params` meanwhile, as a checkpoint
    is written beside SGLang in one process: SGLang's import replaces it
    (utils/hf_transformers_patches.py) with a wrapper of it, and 0.5.20-0.5.22's wrapper skips a
    config without max_position_embeddings, so that a vision tower's rope type stays "default"
    where transformers resolves "axial" (Qwen3-VL-MoE's, Qwen3-Omni's, GLM-4.5V's: their models
    refuse it). Restored after; the one SGLang's import left is kept where it wraps none."""
    from transformers import PretrainedConfig

    patched = PretrainedConfig.standardize_rope_params
    cells = [c.cell_contents for c in getattr(patched, "__closure__", None) or ()]
    own = [f for f in cells if getattr(f, "__module__", "").startswith("transformers.")]
    if own:
        PretrainedConfig.standardize_rope_params = own[0]
    try:
        yield
    finally:
        PretrainedConfig.standardize_rope_params = patched


def save(kind: str, root: Path, seed: int = 0, **sizes: object) -> Path:
    """Write model `kind` of MODELS (or SAVERS) with transformers' `save_pretrained` into
    `root`; `sizes` replace config arguments of COMMON and MODELS (a quantized scheme's
    sizes)."""

    with transformers_own_rope():
        if kind in SAVERS:  # (those that take sizes: _save_kimi_vl)
            return SAVERS[kind](root, seed, **sizes) if sizes else SAVERS[kind](root, seed)
        config_cls, model_cls, own = MODELS[kind]
        _save_plain(config_cls, model_cls, own | sizes, root, seed)
    if kind in RELEASED_ARCHITECTURES:
        cfg = json.loads((root / "config.json").read_text())
        cfg["architectures"] = RELEASED_ARCHITECTURES[kind]
        (root / "config.json").write_text(json.dumps(cfg, indent=2))
    if kind in RELEASED_CONFIG:
        path = root / "config.json"
        path.write_text(json.dumps(RELEASED_CONFIG[kind](json.loads(path.read_text())), indent=2))
    return root


def _save_plain(config_cls: str, model_cls: str, own: dict, root: Path, seed: int) -> Path:
    """transformers' model of these classes at COMMON's sizes and `own`, saved as it is."""
    import transformers

    return _write(getattr(transformers, config_cls)(**(COMMON | own)), model_cls, root, seed)


def _write(config: object, model_cls: str, root: Path, seed: int) -> Path:
    """transformers' model class `model_cls` of `config`, seeded, in BF16, saved into `root`."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(torch.bfloat16)
    model.save_pretrained(root, max_shard_size=MAX_SHARD_SIZE)
    return root


def _add_keys(root: Path, keys: dict[str, dict]) -> Path:
    """The checkpoint at `root` with `keys` added to config.json's sections (dotted paths:
    "thinker_config.text_config"): fields the servers' models read that transformers' config
    class does not write."""
    path = root / "config.json"
    cfg = json.loads(path.read_text())
    for where, values in keys.items():
        section = cfg
        for part in where.split("."):
            section = section[part]
        section |= values
    path.write_text(json.dumps(cfg, indent=2))
    return root


# Qwen3-Omni-MoE: the whole model (thinker with its audio and vision towers, talker with its
# own MoE layers, code2wav), each part's config tiny; fi-convert converts the thinker's experts
OMNI_TEXT = COMMON | dict(
    intermediate_size=128,
    moe_intermediate_size=128,
    num_experts=4,
    num_experts_per_tok=2,
    norm_topk_prob=True,
)
OMNI = dict(
    thinker_config=dict(
        text_config=OMNI_TEXT,
        audio_config=dict(
            num_mel_bins=16,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=32,
            d_model=32,
            output_dim=64,
            downsample_hidden_size=16,
            max_source_positions=64,
            n_window=4,
        ),
        vision_config=dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            num_position_embeddings=16,
            deepstack_visual_indexes=[0],
            patch_size=4,
        ),
    ),
    talker_config=dict(
        text_config=dict(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
        ),
        code_predictor_config=dict(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            num_code_groups=2,
        ),
        num_code_groups=2,
        thinker_hidden_size=64,
        accept_hidden_layer=1,
        spatial_merge_size=2,
    ),
    code2wav_config=dict(
        codebook_size=64,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        num_hidden_layers=1,
        num_quantizers=2,
        decoder_dim=32,
        upsample_rates=[2, 2],
        upsampling_ratios=[2],
    ),
)


# the thinker's vision_config keys vLLM's model reads (models/qwen3_omni_moe_thinker.py) that
# transformers' Qwen3OmniMoeVisionEncoderConfig does not write: image_size (its position grid
# image_size / patch_size a side: 768 / 16 = 48, a grid of its 2304 position embeddings; here
# 4 x 4, a grid of 16) and apply_vit_abs_pos_embed (the position embedding an nn.Embedding, as
# transformers' model stores it: pos_embed.weight)
OMNI_SERVER_KEYS = dict(image_size=16, apply_vit_abs_pos_embed=True)
# and the thinker's text_config key it reads (config.tie_word_embeddings), which transformers
# 4's configs wrote into every sub-config (false for Qwen3-Omni) and transformers 5.20's
# Qwen3OmniMoeTextConfig does not
OMNI_TEXT_SERVER_KEYS = dict(tie_word_embeddings=False)


def _save_qwen3_omni(root: Path, seed: int = 0) -> Path:
    import transformers

    _write(
        transformers.Qwen3OmniMoeConfig(**OMNI), "Qwen3OmniMoeForConditionalGeneration", root, seed
    )
    return _add_keys(
        root,
        {
            "thinker_config.vision_config": OMNI_SERVER_KEYS,
            "thinker_config.text_config": OMNI_TEXT_SERVER_KEYS,
        },
    )


# GLM-4.5V / GLM-4.6V (Glm4vMoeForConditionalGeneration): GLM-4.5's text MoE (layer 0 dense,
# layer 1 MoE with a shared expert) under model.language_model, beside a one-block vision tower
# (model.visual), each part's config tiny; fi-convert converts the language model's experts
GLM4V_TEXT = COMMON | dict(
    intermediate_size=128,
    moe_intermediate_size=128,
    n_routed_experts=4,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    # as published (zai-org/GLM-4.5V: M-RoPE over half of each head, its sections [8, 12, 12]
    # summing to half the rotary dimension, as vLLM asserts: here 16 x 0.5 / 2)
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 1e4,
        "mrope_section": [1, 1, 2],
        "partial_rotary_factor": 0.5,
    },
)
GLM4V_VISION = dict(
    depth=1,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    out_hidden_size=64,
    patch_size=4,
    image_size=16,
)


# the text_config key vLLM's model reads (models/glm4_moe.py: config.use_qk_norm) that
# transformers' Glm4vMoeTextConfig does not write: GLM-4.5-Air's config.json gives it false
GLM4V_SERVER_KEYS = dict(use_qk_norm=False)


def _save_glm4v_moe(root: Path, seed: int = 0) -> Path:
    import transformers

    _write(
        transformers.Glm4vMoeConfig(text_config=GLM4V_TEXT, vision_config=GLM4V_VISION),
        "Glm4vMoeForConditionalGeneration",
        root,
        seed,
    )
    return _add_keys(root, {"text_config": GLM4V_SERVER_KEYS})


# LongCat-Flash: one layer of two MLA attentions, two dense MLPs (mlps.0, mlps.1) and a MoE of
# 4 experts plus 2 zero-computation (identity) experts
LONGCAT = COMMON | dict(
    ffn_hidden_size=128,
    expert_ffn_hidden_size=128,
    n_routed_experts=4,
    zero_expert_num=2,
    moe_topk=2,
    kv_lora_rank=16,
    q_lora_rank=32,
    # the published head sizes (vLLM 0.33 has MLA prefill kernels for these only)
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
)

# the published config.json's keys that transformers 5.20's LongcatFlashConfig does not write:
# the zero experts' kind, and the MLA LoRA norms' scaling on load (vLLM's model reads both)
LONGCAT_RELEASED = dict(zero_expert_type="identity", mla_scale_q_lora=True, mla_scale_kv_lora=True)


def _save_longcat_flash(root: Path, seed: int = 0) -> Path:
    """As meituan-longcat/LongCat-Flash-Chat is published: transformers 5.20's LongcatFlashExperts
    holds a gate_up_proj for the zero experts too (n_routed_experts + zero_expert_num), which
    its save_pretrained writes as experts.4/5.{gate,up}_proj; the published checkpoints hold
    the routed experts alone (vLLM's and SGLang's loaders map n_routed_experts experts, and fail
    on any other `experts.E.` tensor), so those are left out. config.json gets the published
    keys transformers' config class does not write and both servers' models read
    (LONGCAT_RELEASED)."""
    import transformers
    from safetensors.torch import load_file, save_file

    _write(transformers.LongcatFlashConfig(**LONGCAT), "LongcatFlashForCausalLM", root, seed)
    n = LONGCAT["n_routed_experts"]
    zero = {f".mlp.experts.{e}." for e in range(n, n + LONGCAT["zero_expert_num"])}
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    total = 0
    for shard in sorted(set(index["weight_map"].values())):
        tensors = load_file(root / shard)
        kept = {k: v for k, v in tensors.items() if not any(z in k for z in zero)}
        if len(kept) < len(tensors):
            save_file(kept, root / shard, metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in kept.values())
    weight_map = {k: v for k, v in index["weight_map"].items() if not any(z in k for z in zero)}
    index |= {"metadata": index["metadata"] | {"total_size": total}, "weight_map": weight_map}
    index_path.write_text(json.dumps(index, indent=2))
    cfg = json.loads((root / "config.json").read_text()) | LONGCAT_RELEASED
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    return root


def _save_axk1(root: Path, seed: int = 0) -> Path:
    """As skt/A.X-K1 is published: transformers 5.20's AXK1 holds the post-MLP RMSNorm in its
    MoE layers only (AXK1MoE, written at the decoder layer, `layers.L.post_mlp_layernorm`),
    where vLLM 0.33's AXK1DecoderLayer has one in every layer, dense ones too, and its load
    refuses a checkpoint without it: the dense layers' norms are added (ones, RMSNorm's
    initial weight) to the last shard."""
    from safetensors.torch import load_file, save_file

    config_cls, model_cls, own = MODELS["axk1"]
    root = _save_plain(config_cls, model_cls, own, root, seed)
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    tensors = load_file(root / shard)
    hidden = COMMON["hidden_size"]
    for layer in range(own["first_k_dense_replace"]):
        name = f"model.layers.{layer}.post_mlp_layernorm.weight"
        tensors[name] = torch.ones(hidden, dtype=torch.bfloat16)
        index["weight_map"][name] = shard
        index["metadata"]["total_size"] += hidden * 2
    save_file(tensors, root / shard, metadata={"format": "pt"})
    index_path.write_text(json.dumps(index, indent=2))
    return root


# transformers 5.20's HY v4 names for tensors outside the experts, and the names vLLM 0.33's
# HYV4ForCausalLM reads (its modules: layers.L.hc_attn_layer.hc_pre, model.hc_head, the MLPs'
# gate_proj): the published checkpoints' names are the ones vLLM's own load takes
HY_V4_NAMES = (
    (re.compile(r"\.hc_pre\.(hc_attn_layer|hc_mlp_layer)\."), r".\1.hc_pre."),
    (re.compile(r"^model\.hc_pre\.hc_head\."), "model.hc_head."),
    (re.compile(r"\.(mlp|shared_experts)\.linear_gate\."), r".\1.gate_proj."),
)


def _save_hy_v4(root: Path, seed: int = 0) -> Path:
    """HY v4 as vLLM 0.33 reads it: transformers 5.20's model (its fused experts as written),
    the tensors outside the experts renamed as HY_V4_NAMES says (the experts' names are
    transformers' own)."""
    from safetensors.torch import load_file, save_file

    config_cls, model_cls, own = MODELS["hy_v4"]
    root = _save_plain(config_cls, model_cls, own, root, seed)
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for shard in sorted(set(index["weight_map"].values())):
        tensors = {_hy_v4_name(k): v for k, v in load_file(root / shard).items()}
        save_file(tensors, root / shard, metadata={"format": "pt"})
    index["weight_map"] = {_hy_v4_name(k): v for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index, indent=2))
    return root


def _hy_v4_name(name: str) -> str:
    for pattern, repl in HY_V4_NAMES:
        name = pattern.sub(repl, name)
    return name


# InternVL 3.5's MoE models (OpenGVLab/InternVL3_5-30B-A3B's form): config.json of model_type
# internvl_chat (InternVLChatConfig, which SGLang holds) with the language model's config in
# llm_config, a Qwen3-MoE language model under language_model., an InternViT vision model
# (vision_model.) and its projector (mlp1.), tiny
INTERNVL_VISION = dict(
    architectures=["InternVisionModel"],
    model_type="intern_vit_6b",
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=2,
    num_hidden_layers=1,
    image_size=28,
    patch_size=14,
    qkv_bias=True,
    qk_normalization=False,
    norm_type="layer_norm",
)
INTERNVL = dict(
    architectures=["InternVLChatModel"],
    model_type="internvl_chat",
    downsample_ratio=0.5,
    select_layer=-1,
    force_image_size=28,
    template="internvl2_5",
    ps_version="v2",
    torch_dtype="bfloat16",
)


def _internvl_vision(seed: int) -> dict[str, torch.Tensor]:
    """InternViT's and its projector's tensors as InternVL's checkpoints name them, at
    INTERNVL_VISION's sizes (one layer), seeded, in BF16."""
    v, llm = INTERNVL_VISION, COMMON["hidden_size"]
    h, i, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    shuffled = h * 4  # pixel shuffle by downsample_ratio 0.5
    patches = (v["image_size"] // p) ** 2 + 1
    layer = "vision_model.encoder.layers.0."
    shapes = {
        "vision_model.embeddings.class_embedding": (1, 1, h),
        "vision_model.embeddings.position_embedding": (1, patches, h),
        "vision_model.embeddings.patch_embedding.weight": (h, 3, p, p),
        "vision_model.embeddings.patch_embedding.bias": (h,),
        **{layer + n: (h,) for n in ("ls1", "ls2", "norm1.weight", "norm1.bias", "norm2.weight")},
        layer + "norm2.bias": (h,),
        layer + "attn.qkv.weight": (3 * h, h),
        layer + "attn.qkv.bias": (3 * h,),
        layer + "attn.proj.weight": (h, h),
        layer + "attn.proj.bias": (h,),
        layer + "mlp.fc1.weight": (i, h),
        layer + "mlp.fc1.bias": (i,),
        layer + "mlp.fc2.weight": (h, i),
        layer + "mlp.fc2.bias": (h,),
        "mlp1.0.weight": (shuffled,),
        "mlp1.0.bias": (shuffled,),
        "mlp1.1.weight": (llm, shuffled),
        "mlp1.1.bias": (llm,),
        "mlp1.3.weight": (llm, llm),
        "mlp1.3.bias": (llm,),
    }
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in shapes.items()}


def _save_internvl(root: Path, seed: int = 0) -> Path:
    """An InternVL 3.5 MoE checkpoint (INTERNVL): transformers' Qwen3-MoE as the language model
    (its tensors under language_model., its config as llm_config) beside _internvl_vision's."""
    return _save_multimodal(
        root,
        seed,
        "qwen3_moe",
        "llm_config",
        INTERNVL | {"vision_config": INTERNVL_VISION},
        _internvl_vision(seed),
    )


def _save_multimodal(
    root: Path, seed: int, llm_kind: str, section: str, config: dict, vision: dict, **sizes
) -> Path:
    """transformers' model `llm_kind` (MODELS, its arguments replaced by `sizes`) saved, its
    tensors under language_model. and its config as config.json's `section` of `config`,
    beside the `vision` tensors."""
    from safetensors.torch import load_file, save_file

    llm = save(llm_kind, root / "llm", seed, **sizes)
    weight_map: dict[str, str] = {}
    for shard in sorted(llm.glob("*.safetensors")):
        tensors = {f"language_model.{k}": t for k, t in load_file(shard).items()}
        save_file(tensors, root / shard.name, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, shard.name)
    save_file(vision, root / "vision.safetensors", metadata={"format": "pt"})
    weight_map |= dict.fromkeys(vision, "vision.safetensors")
    index = {"metadata": {}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = config | {section: json.loads((llm / "config.json").read_text())}
    (root / "config.json").write_text(json.dumps(config, indent=2))
    shutil.rmtree(llm)
    return root


# Kimi-VL (moonshotai/Kimi-VL-A3B-Instruct's form): config.json of model_type kimi_vl
# (KimiVLConfig, which SGLang holds) over a DeepSeek-V3 text_config, a DeepSeek-V3 language
# model under language_model., a MoonViT vision tower (vision_tower., its attention's wqkv/wo)
# and its projector (multi_modal_projector.), tiny
KIMI_VL_VISION = dict(
    model_type="moonvit",
    patch_size=14,
    init_pos_emb_height=4,
    init_pos_emb_width=4,
    num_attention_heads=2,
    num_hidden_layers=1,
    hidden_size=32,
    intermediate_size=64,
    merge_kernel_size=[2, 2],
)
# Kimi-VL-A3B's text_config routing keys (as recalled from its config.json, not re-read here)
# that transformers' DeepseekV3Config does not write and SGLang's DeepSeek-V2 config reads (its
# router's e_score_correction_bias with noaux_tc)
KIMI_VL_TEXT = dict(topk_method="noaux_tc", scoring_func="sigmoid")
KIMI_VL = dict(
    architectures=["KimiVLForConditionalGeneration"],
    model_type="kimi_vl",
    media_placeholder_token_id=100,
    torch_dtype="bfloat16",
)


def _kimi_vl_vision(seed: int) -> dict[str, torch.Tensor]:
    """MoonViT's and its projector's tensors as Kimi-VL's checkpoints name them, at
    KIMI_VL_VISION's sizes (one block), seeded, in BF16."""
    v, llm = KIMI_VL_VISION, COMMON["hidden_size"]
    h, i, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    merged = h * 4  # the 2x2 patch merger
    block = "vision_tower.encoder.blocks.0."
    shapes = {
        "vision_tower.patch_embed.proj.weight": (h, 3, p, p),
        "vision_tower.patch_embed.proj.bias": (h,),
        "vision_tower.patch_embed.pos_emb.weight": (4, 4, h),
        **{block + f"{n}.{w}": (h,) for n in ("norm0", "norm1") for w in ("weight", "bias")},
        block + "mlp.fc0.weight": (i, h),
        block + "mlp.fc0.bias": (i,),
        block + "mlp.fc1.weight": (h, i),
        block + "mlp.fc1.bias": (h,),
        block + "wqkv.weight": (3 * h, h),
        block + "wqkv.bias": (3 * h,),
        block + "wo.weight": (h, h),
        block + "wo.bias": (h,),
        "vision_tower.encoder.final_layernorm.weight": (h,),
        "vision_tower.encoder.final_layernorm.bias": (h,),
        "multi_modal_projector.pre_norm.weight": (h,),
        "multi_modal_projector.pre_norm.bias": (h,),
        "multi_modal_projector.linear_1.weight": (merged, merged),
        "multi_modal_projector.linear_1.bias": (merged,),
        "multi_modal_projector.linear_2.weight": (llm, merged),
        "multi_modal_projector.linear_2.bias": (llm,),
    }
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in shapes.items()}


def _save_kimi_vl(root: Path, seed: int = 0, **sizes: object) -> Path:
    """A Kimi-VL checkpoint (KIMI_VL): transformers' DeepSeek-V3 as the language model (its
    tensors under language_model., its config as text_config, `sizes` replacing its
    arguments) beside _kimi_vl_vision's."""
    _save_multimodal(
        root,
        seed,
        "deepseek_v3",
        "text_config",
        KIMI_VL | {"vision_config": KIMI_VL_VISION},
        _kimi_vl_vision(seed),
        q_lora_rank=None,  # as Kimi-VL-A3B's text_config: MLA's q_proj, no q LoRA
        **sizes,
    )
    return _add_keys(root, {"text_config": KIMI_VL_TEXT})


# Kimi-K2.5 (moonshotai/Kimi-K2.5's form): config.json of model_type kimi_k25 over a text_config
# of model_type kimi_k2 (DeepSeek-V3's), the language model under language_model., MoonViT 3D's
# tensors under vision_tower. (Kimi-VL's names) and its projector's as mm_projector.pre_norm /
# proj.0 / proj.2, tiny. Its vision_config holds the keys SGLang's KimiK25VisionConfig reads
# (init_pos_emb_*, vt_hidden_size for the projector, hidden_size for the tower) and those
# transformers' Kimi_K25VisionConfig reads (pos_emb_*), which vLLM's model is built from
KIMI_K25_VISION = dict(
    patch_size=14,
    init_pos_emb_height=4,
    init_pos_emb_width=4,
    init_pos_emb_time=4,
    pos_emb_height=4,
    pos_emb_width=4,
    pos_emb_time=4,
    pos_emb_type="divided_fixed",
    num_attention_heads=2,
    num_hidden_layers=1,
    hidden_size=32,
    intermediate_size=64,
    vt_num_attention_heads=2,
    vt_num_hidden_layers=1,
    vt_hidden_size=32,
    vt_intermediate_size=64,
    merge_kernel_size=[2, 2],
    video_attn_type="spatial_temporal",
    merge_type="sd2_tpool",
    mm_projector_type="patchmerger",
    mm_hidden_size=32,
    projector_hidden_act="gelu",
    projector_ln_eps=1e-5,
    text_hidden_size=COMMON["hidden_size"],
)
KIMI_K25 = dict(
    architectures=["KimiK25ForConditionalGeneration"],
    model_type="kimi_k25",
    media_placeholder_token_id=100,
    image_token_id=100,
    torch_dtype="bfloat16",
)
# its text_config's keys (Kimi-K2's config.json, as recalled) that transformers' DeepseekV3Config
# does not write and SGLang's DeepSeek-V2 model reads from the DeepseekV3Config SGLang's
# KimiK25Config builds (moe_layer_freq: every layer from first_k_dense_replace on is MoE)
KIMI_K25_TEXT = dict(model_type="kimi_k2", moe_layer_freq=1)
# the projector's names in Kimi-K2.5's checkpoints (Kimi-VL's: multi_modal_projector.)
KIMI_K25_PROJECTOR = {
    "multi_modal_projector.pre_norm.": "mm_projector.pre_norm.",
    "multi_modal_projector.linear_1.": "mm_projector.proj.0.",
    "multi_modal_projector.linear_2.": "mm_projector.proj.2.",
}


def _save_kimi_k25(root: Path, seed: int = 0) -> Path:
    """A Kimi-K2.5 checkpoint (KIMI_K25): transformers' DeepSeek-V3 as the language model (its
    tensors under language_model., its config as text_config, model_type kimi_k2 as
    published) beside Kimi-VL's MoonViT tensors with Kimi-K2.5's projector names."""
    vision = {}
    for name, tensor in _kimi_vl_vision(seed).items():
        for theirs, ours in KIMI_K25_PROJECTOR.items():
            name = name.replace(theirs, ours)
        vision[name] = tensor
    _save_multimodal(
        root,
        seed,
        "deepseek_v3",
        "text_config",
        KIMI_K25 | {"vision_config": KIMI_K25_VISION},
        vision,
        # the published head sizes (vLLM 0.33 has MLA prefill kernels for these only)
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
    )
    return _add_keys(root, {"text_config": KIMI_VL_TEXT | KIMI_K25_TEXT})


# dots.vlm (rednote-hilab/dots.vlm1.inst's form): config.json of model_type dots_vlm holding its
# DeepSeek-V3 language model's keys at its top level (SGLang's DotsVLMConfig reads them as its
# language_config) beside a vision_config, the language model's tensors under their own names
# (model.layers.L...), the vision tower's under vision_tower. (SGLang's DotsVisionTransformer's
# names, its attention's fused qkv as attn.qkv), tiny; no biases in the tower (use_bias false)
DOTS_VLM_VISION = dict(
    embed_dim=32,
    hidden_size=COMMON["hidden_size"],
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_channels=3,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=1,
    rms_norm_eps=1e-5,
    use_bias=False,
    post_norm=True,
)
DOTS_VLM = dict(
    architectures=["DotsVLMForCausalLM"],
    model_type="dots_vlm",
    image_token_id=100,
    video_token_id=101,
)


def _dots_vlm_vision(seed: int) -> dict[str, torch.Tensor]:
    """dots.vlm's vision tower's tensors at DOTS_VLM_VISION's sizes (one block), seeded, BF16."""
    v = DOTS_VLM_VISION
    e, i, p, out = v["embed_dim"], v["intermediate_size"], v["patch_size"], v["hidden_size"]
    merged = e * v["spatial_merge_size"] ** 2
    block, tower = "vision_tower.blocks.0.", "vision_tower."
    shapes = {
        tower + "patch_embed.patchifier.proj.weight": (e, 3, p, p),
        tower + "patch_embed.patchifier.proj.bias": (e,),
        tower + "patch_embed.patchifier.norm.weight": (e,),
        block + "attn.qkv.weight": (3 * e, e),
        block + "attn.proj.weight": (e, e),
        block + "norm1.weight": (e,),
        block + "norm2.weight": (e,),
        block + "mlp.fc1.weight": (i, e),
        block + "mlp.fc3.weight": (i, e),
        block + "mlp.fc2.weight": (e, i),
        tower + "post_trunk_norm.weight": (e,),
        tower + "merger.ln_q.weight": (e,),
        tower + "merger.ln_q.bias": (e,),
        tower + "merger.mlp.0.weight": (merged, merged),
        tower + "merger.mlp.0.bias": (merged,),
        tower + "merger.mlp.2.weight": (out, merged),
        tower + "merger.mlp.2.bias": (out,),
    }
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in shapes.items()}


def _save_dots_vlm(root: Path, seed: int = 0) -> Path:
    """A dots.vlm checkpoint (DOTS_VLM): transformers' DeepSeek-V3 saved as it is (its config's
    keys at config.json's top level, with KIMI_VL_TEXT's routing), _dots_vlm_vision's tensors
    in a shard of their own."""
    from safetensors.torch import save_file

    save("deepseek_v3", root, seed)
    vision = _dots_vlm_vision(seed)
    save_file(vision, root / "vision.safetensors", metadata={"format": "pt"})
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] |= dict.fromkeys(vision, "vision.safetensors")
    index_path.write_text(json.dumps(index, indent=2))
    path = root / "config.json"
    config = json.loads(path.read_text()) | KIMI_VL_TEXT | DOTS_VLM
    path.write_text(json.dumps(config | {"vision_config": DOTS_VLM_VISION}, indent=2))
    return root


# GLM-5 Next (Glm5NextForConditionalGeneration, model_type glm5_next): transformers' own model,
# tiny: a KDA layer (linear_attention) with a dense MLP, then an MLA layer with its indexer and
# DeepSeek-V3's MoE (4 experts, a shared expert, its SwiGLU clamped), hyper-connections (2
# streams), a one-block vision tower; config.json with the text_config fields the servers'
# models read that transformers' config class does not write (GLM5_NEXT_SERVER_KEYS)
GLM5_NEXT_TEXT = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_nope_head_dim=128,
    qk_rope_head_dim=0,
    v_head_dim=128,
    index_topk=16,
    index_head_dim=32,
    index_n_heads=2,
    linear_head_dim=16,
    linear_num_heads=4,
    layer_types=["linear_attention", "full_attention"],
    mlp_layer_types=["dense", "sparse"],
    max_position_embeddings=256,
    pad_token_id=0,
    eos_token_id=1,
    hc_mult=2,
)
GLM5_NEXT_SERVER_KEYS = dict(
    # SGLang's own config class and model: the hyper-connections the tensors hold, the
    # indexer's kpool compression tensors, the dense layers mlp_layer_types gives (SGLang's
    # default, 3, builds no MoE layer here)
    mhc=True,
    index_kpool_compress=True,
    first_k_dense_replace=1,
    # vLLM's model (vllm/models/glm5next), which reads each as config.<field>: MLA without RoPE
    # (qk_rope_head_dim 0), the indexer's rotary layout, no MTP layer, DeepSeek-V3's router
    mla_use_nope=True,
    indexer_rope_interleave=False,
    num_nextn_predict_layers=0,
    scoring_func="sigmoid",
    topk_method="noaux_tc",
)
GLM5_NEXT_VISION = dict(
    depth=1,
    hidden_size=32,
    num_heads=2,
    out_hidden_size=64,
    intermediate_size=64,
    image_size=28,
    patch_size=14,
    projection_intermediate_size=64,
)
GLM5_NEXT_TOKENS = dict(
    image_token_id=100,
    video_token_id=101,
    image_start_token_id=102,
    image_end_token_id=103,
    video_start_token_id=104,
    video_end_token_id=105,
)


def _save_glm5_next(root: Path, seed: int = 0) -> Path:
    import transformers

    config = transformers.Glm5NextConfig(
        text_config=GLM5_NEXT_TEXT, vision_config=GLM5_NEXT_VISION, **GLM5_NEXT_TOKENS
    )
    _write(config, "Glm5NextForConditionalGeneration", root, seed)
    return _add_keys(root, {"text_config": GLM5_NEXT_SERVER_KEYS})


# Kimi Linear (moonshotai/Kimi-Linear-48B-A3B-Instruct, KimiLinearForCausalLM): a KDA layer
# (linear attention) with a dense MLP, then an MLA layer with the MoE block (sigmoid + correction
# bias, grouped top-k, a shared expert); MLA's head sizes as published (vLLM has MLA prefill
# kernels for these only), moe_intermediate_size 512 so that vLLM's model pads no rank's share
# (its KimiMoE pads I / TP below min_moe_intermediate_per_partition, 256, up to it)
KIMI_LINEAR = COMMON | dict(
    num_key_value_heads=4,
    intermediate_size=128,
    moe_intermediate_size=512,
    num_experts=4,
    num_experts_per_token=2,
    num_shared_experts=1,
    first_k_dense_replace=1,
    moe_layer_freq=1,
    kv_lora_rank=16,
    q_lora_rank=None,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    linear_num_heads=4,
    linear_head_dim=16,
    layer_types=["linear_attention", "full_attention"],
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# ... and config.json as moonshotai publishes it (its remote code's keys, which both servers'
# own KimiLinearConfig read: linear_attn_config's 1-based kda_layers / full_attn_layers, not
# transformers' layer_types)
KIMI_LINEAR_PUBLISHED = (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
    "first_k_dense_replace", "moe_layer_freq", "num_experts", "num_experts_per_token",
    "num_shared_experts", "moe_renormalize", "num_expert_group", "topk_group",
    "routed_scaling_factor", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "rms_norm_eps", "tie_word_embeddings", "pad_token_id",
    "bos_token_id", "eos_token_id",
)  # fmt: skip


def _save_kimi_linear(root: Path, seed: int = 0, **sizes: object) -> Path:
    """Kimi Linear by transformers' save_pretrained (the published tensor names: q/k/v_conv1d,
    block_sparse_moe.experts.E.w1/w2/w3, ...; `sizes` over KIMI_LINEAR's), config.json in the
    published schema; transformers saves layer 0's dense MLP under the MoE block's name too,
    which the published checkpoint (and both servers) name mlp."""
    import transformers

    cfg = transformers.KimiLinearConfig(**(KIMI_LINEAR | sizes))
    _write(cfg, "KimiLinearForCausalLM", root, seed)
    ours = json.loads((root / "config.json").read_text())
    kda = [i + 1 for i, t in enumerate(KIMI_LINEAR["layer_types"]) if t == "linear_attention"]
    full = [i + 1 for i in range(ours["num_hidden_layers"]) if i + 1 not in kda]
    published = {k: ours[k] for k in KIMI_LINEAR_PUBLISHED} | dict(
        architectures=["KimiLinearForCausalLM"],
        model_type="kimi_linear",
        moe_router_activation_func="sigmoid",
        use_grouped_topk=True,
        mla_use_nope=True,
        linear_attn_config=dict(
            kda_layers=kda,
            full_attn_layers=full,
            num_heads=KIMI_LINEAR["linear_num_heads"],
            head_dim=KIMI_LINEAR["linear_head_dim"],
            short_conv_kernel_size=ours["linear_conv_kernel_dim"],
        ),
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=KIMI_LINEAR["max_position_embeddings"],
        model_max_length=KIMI_LINEAR["max_position_embeddings"],
        num_nextn_predict_layers=0,
        torch_dtype="bfloat16",
    )
    (root / "config.json").write_text(json.dumps(published, indent=2))
    dense = re.compile(r"^(model\.layers\.0\.)block_sparse_moe\.")
    _rename_tensors(root, lambda n: dense.sub(r"\1mlp.", n))
    return root


# Kimi K3 (KimiK3ForConditionalGeneration, model_type kimi_k3): transformers 5.20 has no model of
# it, so the names both servers' load_weights read. Its language model is Kimi Linear's
# (text_config, model_type kimi_linear: transformers' KimiLinear tensors, KIMI_LINEAR's sizes)
# with K3's latent MoE: the routed experts run in routed_expert_hidden_size (KIMI_K3_LATENT),
# between the MoE block's routed_expert_down_proj [latent, H] and routed_expert_up_proj
# [H, latent] and its routed_expert_norm (latent_moe_use_norm), their w1/w3 [I, latent] and w2
# [latent, I]; its decoder layers under language_model.layers.L (both servers' mappers make
# them language_model.model.layers.L), its embedding, norm and head under language_model.model.
# and language_model.; Kimi-K2.5's MoonViT 3D tensors beside it (KIMI_K25's), and K3's projector
KIMI_K3_HIDDEN, KIMI_K3_LATENT = 128, 64  # (TRT-LLM's BF16 layout takes sizes of 64s)
KIMI_K3_TEXT = dict(
    routed_expert_hidden_size=KIMI_K3_LATENT,
    latent_moe_use_norm=True,
    use_grouped_topk=True,
    moe_router_activation_func="sigmoid",
)
# the keys of K3's vision config (its servers' KimiK3VisionConfig) whose defaults are not
# Kimi-K2.5's tower (qkv_hidden_size 1536, RMSNorm, no biases), set to K2.5's tensors' form; its
# projector K3's (patchmergerv2, which both servers build: proj.0, proj.2, post_norm)
KIMI_K3_VISION = dict(
    qkv_hidden_size=KIMI_K25_VISION["hidden_size"],
    norm_type="layernorm",
    attn_bias=True,
    patch_embed_proj_bias=True,
    linear_bias=True,
    mlp_type="mlp2",
    mm_projector_type="patchmergerv2",
)
KIMI_K3 = dict(
    architectures=["KimiK3ForConditionalGeneration"],
    model_type="kimi_k3",
    media_placeholder_token_id=100,
    torch_dtype="bfloat16",
)


def _save_kimi_k3(root: Path, seed: int = 0, latent: int | None = KIMI_K3_LATENT) -> Path:
    """A Kimi K3 checkpoint (KIMI_K3): Kimi Linear's tensors (_save_kimi_linear) under K3's
    names, its MoE layer's routed experts of `latent` size with their projections (None: of the
    hidden size, no latent MoE), beside Kimi-K2.5's vision tensors."""
    from safetensors.torch import load_file, save_file

    text = _save_kimi_linear(root / "llm", seed, hidden_size=KIMI_K3_HIDDEN)
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(text.glob("*.safetensors")):
        tensors |= load_file(shard)
    cfg = json.loads((text / "config.json").read_text())
    gen = torch.Generator().manual_seed(seed + 1)
    if latent is not None:
        tensors = _latent_moe(tensors, cfg["hidden_size"], latent, gen)
    cfg |= KIMI_K3_TEXT | dict(routed_expert_hidden_size=latent)
    names = {n: _kimi_k3_name(n) for n in tensors}
    shutil.rmtree(text)
    vision = {}
    for name, tensor in _kimi_vl_vision(seed).items():
        for theirs, ours in KIMI_K25_PROJECTOR.items():
            name = name.replace(theirs, ours)
        vision[name] = tensor
    # K3's projector (patchmergerv2): no pre-norm, bias-free proj.0 and proj.2 (of the language
    # model's hidden size), a post-norm
    vision = {n: t for n, t in vision.items() if not n.startswith("mm_projector.")}
    merged = 4 * KIMI_K25_VISION["hidden_size"]
    vision["mm_projector.proj.0.weight"] = torch.randn(merged, merged, generator=gen)
    vision["mm_projector.proj.2.weight"] = torch.randn(KIMI_K3_HIDDEN, merged, generator=gen)
    vision["mm_projector.post_norm.weight"] = 1 + torch.randn(KIMI_K3_HIDDEN, generator=gen) / 8
    vision = {n: t.to(torch.bfloat16) for n, t in vision.items()}
    shard = root / "model-00001-of-00002.safetensors"
    save_file({names[n]: t for n, t in tensors.items()}, shard, metadata={"format": "pt"})
    save_file(vision, root / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    weight_map = dict.fromkeys(names.values(), "model-00001-of-00002.safetensors")
    weight_map |= dict.fromkeys(vision, "model-00002-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    vision_config = KIMI_K25_VISION | KIMI_K3_VISION | dict(text_hidden_size=KIMI_K3_HIDDEN)
    config = KIMI_K3 | {"text_config": cfg, "vision_config": vision_config}
    (root / "config.json").write_text(json.dumps(config, indent=2))
    return root


def _latent_moe(tensors: dict, hidden: int, latent: int, gen) -> dict:
    """Kimi Linear's `tensors` with each MoE block's routed experts of `latent` size (w1/w3
    [I, latent], w2 [latent, I]) and the block's routed_expert_down_proj, _norm and _up_proj."""
    expert = re.compile(r"\.block_sparse_moe\.experts\.\d+\.w([123])\.weight$")

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(torch.bfloat16)

    out = {}
    for name, t in tensors.items():
        m = expert.search(name)
        if m is None:
            out[name] = t
            continue
        out[name] = rand(latent, t.shape[1]) if m[1] == "2" else rand(t.shape[0], latent)
        block = name[: name.index(".experts.")]
        out.setdefault(f"{block}.routed_expert_down_proj.weight", rand(latent, hidden))
        out.setdefault(f"{block}.routed_expert_norm.weight", 1 + rand(latent) / 8)
        out.setdefault(f"{block}.routed_expert_up_proj.weight", rand(hidden, latent))
    return out


def _save_kimi_linear_latent(root: Path, seed: int = 0) -> Path:
    """A latent Kimi Linear (KimiLinearForCausalLM alone, config.json with
    routed_expert_hidden_size): Kimi Linear's tensors (_save_kimi_linear, Kimi K3's hidden
    size) with K3's latent MoE (_latent_moe: routed experts of KIMI_K3_LATENT beside the block's
    routed_expert_down_proj, _norm and _up_proj), config.json the published one with
    KIMI_K3_TEXT's keys. No such checkpoint is published; both servers' KimiLinearConfig read
    these keys, and vLLM 0.33's KimiLinearForCausalLM builds the latent MoE of them."""
    from safetensors.torch import load_file, save_file

    _save_kimi_linear(root, seed, hidden_size=KIMI_K3_HIDDEN)
    cfg = json.loads((root / "config.json").read_text())
    gen = torch.Generator().manual_seed(seed + 1)
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    where = index["weight_map"]
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(where.values())):
        tensors |= load_file(root / shard)
    tensors = _latent_moe(tensors, cfg["hidden_size"], KIMI_K3_LATENT, gen)
    for name in tensors:  # the block's projections in its first expert's shard
        block = name.rsplit(".routed_expert_", 1)[0]
        where.setdefault(name, where.get(f"{block}.experts.0.w1.weight"))
    for shard in sorted(set(where.values())):
        own = {n: t for n, t in tensors.items() if where[n] == shard}
        save_file(own, root / shard, metadata={"format": "pt"})
    index_path.write_text(json.dumps(index, indent=2))
    (root / "config.json").write_text(json.dumps(cfg | KIMI_K3_TEXT, indent=2))
    return root


def _kimi_k3_name(name: str) -> str:
    """A Kimi Linear tensor's name in Kimi K3's checkpoint."""
    if name.startswith("model.layers."):
        return "language_model." + name.removeprefix("model.")
    return "language_model." + name


# Qwen4 Exp (Qwen4ExpForConditionalGeneration, model_type qwen4_exp): transformers' own model,
# tiny: a gated-delta-net layer, then an attention layer with its indexer (QSA), each with
# Qwen2-MoE's sparse block (4 experts, a gated shared expert), hyper-connections (2 streams), no
# per-layer n-gram embedding, a one-block vision tower; config.json with the key SGLang's model
# reads that transformers' config class does not write (QWEN4_EXP_SERVER_KEYS)
QWEN4_EXP_TEXT = COMMON | dict(
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
    num_experts=4,
    num_experts_per_tok=2,
    layer_types=["linear_attention", "full_attention"],
    hc_count=2,
    # hc_lowrank + hc_count a multiple of 16: vLLM pads its fused hyper-connection projection
    # (input_mix_weight_down_block_inject) up to one, with rows no tensor fills (nvidia/
    # hyperconnection.py pad_size, split off unused; the published 320 + 4: 12 such rows)
    hc_lowrank=14,
    eos_token_id=1,
    pad_token_id=0,
    # the QSA indexer: SGLang's fast_topk_v2 takes indexer_budget / indexer_compress_ratio of
    # 512 or 2048 only (layers/attention/qsa/config.py)
    indexer_n_heads=2,
    indexer_kv_heads=1,
    indexer_head_dim=16,
    indexer_budget=2048,
    indexer_compress_ratio=4,
)
# SGLang's Qwen3.5 layers (models/qwen3_5.py) read text_config.full_attention_interval, which its
# config class (a Qwen3NextConfig) takes from config.json alone, as Qwen3.5's published
# config.json holds it; transformers' Qwen4ExpTextConfig reads it only without layer_types
# config.json's output_gate_type: transformers writes null (its gated-delta-net's output gate
# then takes hidden_act, silu), which vLLM's (layers/mamba/gdn/qwen_gdn_linear_attn.py: silu
# only where the key is absent) asserts against; "silu" says the same to all three
QWEN4_EXP_SERVER_KEYS = dict(full_attention_interval=2, output_gate_type="silu")
# both servers build Qwen3-VL's vision tower, which reads vision_config.deepstack_visual_indexes
# (vLLM's model asks it; SGLang's config class gives [8, 16, 24] where config.json does not):
# transformers' Qwen4ExpVisionConfig does not write it, and its model has no deepstack mergers,
# so none: []
QWEN4_EXP_VISION_SERVER_KEYS = dict(deepstack_visual_indexes=[])
QWEN4_EXP_VISION = dict(
    depth=1,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    out_hidden_size=64,
    patch_size=4,
    num_position_embeddings=16,
)
QWEN4_EXP_TOKENS = dict(
    image_token_id=100, video_token_id=101, vision_start_token_id=102, vision_end_token_id=103
)


def _save_qwen4_exp(root: Path, seed: int = 0) -> Path:
    import transformers

    config = transformers.Qwen4ExpConfig(
        text_config=QWEN4_EXP_TEXT, vision_config=QWEN4_EXP_VISION, **QWEN4_EXP_TOKENS
    )
    _write(config, "Qwen4ExpForConditionalGeneration", root, seed)
    return _add_keys(
        root,
        {
            "text_config": QWEN4_EXP_SERVER_KEYS,
            "vision_config": QWEN4_EXP_VISION_SERVER_KEYS,
        },
    )


# Qwen3.5 MoE (Qwen3_5MoeForConditionalGeneration, model_type qwen3_5_moe): transformers' own
# model, tiny: a gated-delta-net layer then a full-attention one, each with Qwen2-MoE's block (4
# experts, a gated shared expert), a one-block vision tower; config.json with the key SGLang's
# layers read that transformers' config class does not write (as Qwen3.5's published
# config.json holds it: full_attention_interval), and vision_config.deepstack_visual_indexes []
# as for Qwen4 Exp
QWEN3_5_MOE_TEXT = COMMON | dict(
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
    num_experts=4,
    num_experts_per_tok=2,
    layer_types=["linear_attention", "full_attention"],
    eos_token_id=1,
    pad_token_id=0,
)
QWEN3_5_MOE_SERVER_KEYS = dict(full_attention_interval=2)


def _save_qwen3_5_moe(root: Path, seed: int = 0) -> Path:
    import transformers

    config = transformers.Qwen3_5MoeConfig(
        text_config=QWEN3_5_MOE_TEXT, vision_config=QWEN4_EXP_VISION, **QWEN4_EXP_TOKENS
    )
    _write(config, "Qwen3_5MoeForConditionalGeneration", root, seed)
    return _add_keys(
        root,
        {
            "text_config": QWEN3_5_MOE_SERVER_KEYS,
            "vision_config": QWEN4_EXP_VISION_SERVER_KEYS,  # (no deepstack mergers either)
        },
    )


# LongCat-Flash-Lite (LongcatFlashNgramForCausalLM): LongCat-Flash's model (LONGCAT, written as
# _save_longcat_flash writes it) under an n-gram embedding input layer: config.json's
# ngram_vocab_size_ratio, emb_split_num and emb_neighbor_num, and per embedder
# model.ngram_embeddings.embedders.i.weight [m + 2i + 1, H / (k (n - 1))] and post_projs.i.weight
# [H, that], m = ratio x vocab_size. No public checkpoint was read here: the keys and names are
# those vLLM 0.33's model reads (models/longcat_flash_ngram.py), tiny
LONGCAT_NGRAM = dict(ngram_vocab_size_ratio=1, emb_split_num=2, emb_neighbor_num=2)


def _save_longcat_flash_ngram(root: Path, seed: int = 0) -> Path:
    from safetensors.torch import save_file

    _save_longcat_flash(root, seed)
    cfg = json.loads((root / "config.json").read_text())
    m = LONGCAT_NGRAM["ngram_vocab_size_ratio"] * cfg["vocab_size"]
    embedders = LONGCAT_NGRAM["emb_split_num"] * (LONGCAT_NGRAM["emb_neighbor_num"] - 1)
    dim = cfg["hidden_size"] // embedders
    gen = torch.Generator().manual_seed(seed)
    shapes = {}
    for i in range(embedders):
        shapes[f"model.ngram_embeddings.embedders.{i}.weight"] = (m + 2 * i + 1, dim)
        shapes[f"model.ngram_embeddings.post_projs.{i}.weight"] = (cfg["hidden_size"], dim)
    ngram = {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in shapes.items()}
    save_file(ngram, root / "ngram.safetensors", metadata={"format": "pt"})
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] |= dict.fromkeys(ngram, "ngram.safetensors")
    index_path.write_text(json.dumps(index, indent=2))
    cfg |= {"architectures": ["LongcatFlashNgramForCausalLM"], **LONGCAT_NGRAM}
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    return root


# MiMo-V2-Omni (MiMoV2OmniForCausalLM): vLLM's class reads MiMo-V2-Flash's config itself
# (the language model's keys at the top, vision_config beside them) and its tensors as
# transformers writes MiMo-V2-Flash's (model., lm_head.), beside a vision tower under visual.
# (its blocks' separate mlp.gate_proj / up_proj, which vLLM stacks). No public checkpoint was
# read here: the vision config's keys and the vision tensors' names are those vLLM 0.33's
# model reads (Mimo_VLVisionConfig and use_sink; MiMoVisionTransformer), tiny; no audio tower
# (audio_config absent: vLLM builds none)
MIMO_OMNI_VISION = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    num_key_value_heads=2,
    qk_channels=16,
    kv_channels=16,
    patch_size=14,
    temporal_patch_size=2,
    spatial_merge_size=2,
    out_hidden_size=COMMON["hidden_size"],
    fullatt_block_indexes=[1],
    vit_window_attn_types=[0, -1],
    visual_token_window_size=64,
    use_sink=False,
)


def _mimo_omni_vision(seed: int) -> dict[str, torch.Tensor]:
    """MIMO_OMNI_VISION's tensors under visual., seeded, in BF16."""
    v = MIMO_OMNI_VISION
    h, i, p, t = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["temporal_patch_size"]
    q, kv = v["num_heads"] * v["qk_channels"], v["num_key_value_heads"] * v["kv_channels"]
    merged = h * v["spatial_merge_size"] ** 2
    shapes: dict[str, tuple[int, ...]] = {"visual.patch_embed.proj.weight": (h, 3, t, p, p)}
    for b in range(v["depth"]):
        block = f"visual.blocks.{b}."
        shapes |= {
            block + "norm1.weight": (h,),
            block + "norm2.weight": (h,),
            block + "attn.qkv.weight": (q + 2 * kv, h),
            block + "attn.qkv.bias": (q + 2 * kv,),
            block + "attn.proj.weight": (h, v["num_heads"] * v["kv_channels"]),
            block + "attn.proj.bias": (h,),
            **{block + f"mlp.{n}_proj.weight": (i, h) for n in ("gate", "up")},
            **{block + f"mlp.{n}_proj.bias": (i,) for n in ("gate", "up")},
            block + "mlp.down_proj.weight": (h, i),
            block + "mlp.down_proj.bias": (h,),
        }
    shapes |= {
        "visual.merger.ln_q.weight": (h,),
        "visual.merger.mlp.0.weight": (merged, merged),
        "visual.merger.mlp.2.weight": (v["out_hidden_size"], merged),
    }
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in shapes.items()}


def _save_mimo_v2_omni(root: Path, seed: int = 0) -> Path:
    from safetensors.torch import save_file

    save("mimo_v2_flash", root, seed)
    vision = _mimo_omni_vision(seed)
    save_file(vision, root / "vision.safetensors", metadata={"format": "pt"})
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] |= dict.fromkeys(vision, "vision.safetensors")
    index_path.write_text(json.dumps(index, indent=2))
    path = root / "config.json"
    cfg = json.loads(path.read_text())
    cfg |= {"architectures": ["MiMoV2OmniForCausalLM"], "vision_config": MIMO_OMNI_VISION}
    path.write_text(json.dumps(cfg, indent=2))
    return root


# Nemotron Nano VL (NemotronH_Nano_VL_V2, as nvidia/NVIDIA-Nemotron-Nano-12B-v2-VL-BF16 is
# laid out): the Nemotron-H model of MODELS' "nemotron_h" under language_model (its config.json
# in llm_config), a RADIO vision tower under vision_model.radio_model (its timm names,
# model.patch_generator.* and model.blocks.B.*, which SGLang's and vLLM's RADIO loaders read;
# its config in vision_config.args), the projector mlp1.{0,1,3} (RMSNorm over the pixel-shuffled
# features, Linear, squared ReLU, Linear). The tower is RADIO's smallest ViT (vit_small_patch16_224:
# 384 wide, 12 blocks), the published model's vit_huge_patch16_224 at the same layout; its
# buffers the servers do not read (input_conditioner, summary_idxs) are not written
NANO_VL_VIT = dict(width=384, blocks=12, cls_tokens=8, patch=16, cpe_max_size=2048)


def _radio_tensors(seed: int, frames: int = 1) -> dict[str, torch.Tensor]:
    """RADIO's tensors; with `frames` > 1 its video embedder too (frames x patch x patch
    tubelets, Omni's)."""
    d, p = NANO_VL_VIT["width"], NANO_VL_VIT["patch"]
    positions = (NANO_VL_VIT["cpe_max_size"] // p) ** 2
    pre = "vision_model.radio_model.model."
    shapes = {
        f"{pre}patch_generator.pos_embed": (1, positions, d),
        f"{pre}patch_generator.embedder.weight": (d, 3 * p * p),
        f"{pre}patch_generator.cls_token.token": (NANO_VL_VIT["cls_tokens"], d),
    }
    if frames > 1:
        shapes[f"{pre}patch_generator.video_embedder.weight"] = (d, 3 * frames * p * p)
    for b in range(NANO_VL_VIT["blocks"]):
        block = f"{pre}blocks.{b}."
        shapes |= {block + n: (d,) for n in ("ls1", "ls2", "norm1.weight", "norm1.bias")}
        shapes |= {block + n: (d,) for n in ("norm2.weight", "norm2.bias", "attn.proj.bias")}
        shapes |= {block + "attn.qkv.weight": (3 * d, d), block + "attn.qkv.bias": (3 * d,)}
        shapes |= {block + "attn.proj.weight": (d, d), block + "mlp.fc2.bias": (d,)}
        shapes |= {block + "mlp.fc1.weight": (4 * d, d), block + "mlp.fc1.bias": (4 * d,)}
        shapes |= {block + "mlp.fc2.weight": (d, 4 * d)}
    gen = torch.Generator().manual_seed(seed + 1)
    return {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in shapes.items()}


def _save_nemotron_h_nano_vl(
    root: Path,
    seed: int = 0,
    architecture: str = "NemotronH_Nano_VL_V2",
    model_type: str = "NemotronH_Nano_VL_V2",
    frames: int = 1,
    text: dict | None = None,
) -> Path:
    from safetensors.torch import load_file, save_file

    save("nemotron_h", root / "lm", seed, **(text or {}))
    llm = json.loads((root / "lm" / "config.json").read_text())
    tensors = {
        f"language_model.{n}": t
        for f in sorted((root / "lm").glob("*.safetensors"))
        for n, t in load_file(f).items()
    }
    shutil.rmtree(root / "lm")
    tensors |= _radio_tensors(seed, frames)
    shuffled, projector = NANO_VL_VIT["width"] * 4, 64  # (downsample_ratio 0.5: 2 x 2 patches)
    gen = torch.Generator().manual_seed(seed + 2)
    for name, shape in (
        ("mlp1.0.weight", (shuffled,)),
        ("mlp1.1.weight", (projector, shuffled)),
        ("mlp1.3.weight", (llm["hidden_size"], projector)),
    ):
        tensors[name] = torch.randn(shape, generator=gen).to(torch.bfloat16)
    save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
    vision = dict(
        args=dict(model="vit_small_patch16_224", register_multiple=8, cpe_max_size=2048),
        preferred_resolution=[512, 512],
        patch_size=NANO_VL_VIT["patch"],
        max_resolution=2048,
        model_type="radio",
    ) | ({"video_temporal_patch_size": frames} if frames > 1 else {})
    config = dict(
        architectures=[architecture],
        model_type=model_type,
        auto_map={
            "AutoConfig": "configuration.NemotronH_Nano_VL_V2_Config",
            "AutoModel": "modeling.NemotronH_Nano_VL_V2",
            "AutoModelForCausalLM": "modeling.NemotronH_Nano_VL_V2",
        },
        downsample_ratio=0.5,
        force_image_size=512,
        patch_size=NANO_VL_VIT["patch"],
        ps_version="v2",
        template="nemotron-h-5p5",
        image_tag_type="internvl",
        norm_mean=[0.48145466, 0.4578275, 0.40821073],
        norm_std=[0.26862954, 0.26130258, 0.27577711],
        projector_hidden_size=projector,
        vit_hidden_size=NANO_VL_VIT["width"],
        img_context_token_id=18,
        torch_dtype="bfloat16",
        llm_config=llm,
        vision_config=vision,
    ) | ({"video_temporal_patch_size": frames} if frames > 1 else {})
    (root / "config.json").write_text(json.dumps(config, indent=2))
    return root


# Gemma 4 as published, whole (Gemma4ForConditionalGeneration): the text model of MODELS'
# "gemma4" under model.language_model, beside a one-layer vision tower (model.vision_tower,
# model.embed_vision), no audio tower (as google/gemma-4-26B-A4B), each part's config tiny
GEMMA4_VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    position_embedding_size=64,
)


def _save_gemma4_mm(root: Path, seed: int = 0) -> Path:
    import transformers

    text = COMMON | MODELS["gemma4"][2]
    config = transformers.Gemma4Config(text_config=text, vision_config=GEMMA4_VISION)
    return _write(config, "Gemma4ForConditionalGeneration", root, seed)


# Gemma 4 Unified (Gemma4UnifiedForConditionalGeneration) over Gemma 4's MoE text model: the
# encoder-free vision embedder (model.vision_embedder, model.embed_vision) of transformers'
# own class, and under model.language_model the text model of MODELS' "gemma4" (its experts,
# router and the MoE layers' norms), as vLLM's and SGLang's classes build it for a text_config
# with num_experts (enable_moe_block); config.json's text_config keeps those keys, which
# transformers 5.20's Gemma4UnifiedTextConfig holds without a field of its own. transformers'
# Gemma4UnifiedTextModel has no MoE block, so its language model is Gemma4TextModel's, saved by
# transformers' save_pretrained in its place (the same names outside the MoE layers)
GEMMA4_UNIFIED_VISION = dict(
    patch_size=4, pooling_kernel_size=2, mm_embed_dim=32, mm_posemb_size=16
)


def _save_gemma4_unified(root: Path, seed: int = 0) -> Path:
    import transformers

    text = COMMON | MODELS["gemma4"][2]
    config = transformers.Gemma4UnifiedConfig(text_config=text, vision_config=GEMMA4_UNIFIED_VISION)
    torch.manual_seed(seed)
    model = transformers.Gemma4UnifiedForConditionalGeneration(config)
    model.model.language_model = transformers.Gemma4TextModel(transformers.Gemma4TextConfig(**text))
    model.tie_weights()  # lm_head on the new model's embed_tokens, as the class ties them
    model.to(torch.bfloat16).save_pretrained(root, max_shard_size=MAX_SHARD_SIZE)
    return root


# Step-3.7 (Step3p7ForConditionalGeneration): transformers' own model, tiny (Step-3.5's text
# model, model_type step3p5, its experts packed per projection as model.layers.L.moe.{gate,up,
# down}_proj.weight [E, out, in], a dense layer then a MoE one whose SwiGLU is clamped, beside
# a one-layer vision tower). SGLang 0.5.23 reads its text_config with its own Step3p5Config,
# which takes the published config.json's keys, not the ones transformers' Step3p7TextConfig
# writes for them (its attribute_map reads both): those are added (STEP3P7_RELEASED). No
# family file names it (SGLang's reason: servers/sglang/target.py)
STEP3P7_TEXT = COMMON | dict(
    intermediate_size=64,
    moe_intermediate_size=32,
    n_routed_experts=4,
    num_experts_per_tok=2,
    share_expert_dim=32,
    mlp_layer_types=["dense", "sparse"],
    swiglu_limits=[0, 7.0],
)
STEP3P7_RELEASED = dict(
    moe_layers_enum="1",
    moe_num_experts=4,
    moe_top_k=2,
    num_attention_groups=2,
    share_expert_dims=32,
    rope_theta=[10000.0, 10000.0],
    partial_rotary_factors=[1.0, 1.0],
    layer_types=["full_attention", "full_attention"],
    use_head_wise_attn_gate=True,
    need_fp32_gate=True,
    use_moe_router_bias=True,
    swiglu_limits_shared=[0, 0],
    attention_other_setting=dict(num_attention_heads=4, num_attention_groups=2, head_dim=16),
)


# a user's family file for Step-3.7 (no family file names it): transformers' packed experts
STEP3P7_FAMILY = {
    "name": "step3p7",
    "title": "Step-3.7",
    "model_types": ["step3p7"],
    "architectures": ["Step3p7ForConditionalGeneration"],
    "config_keys": {
        "num_experts": ["moe_num_experts"],
        "intermediate_size": ["moe_intermediate_size"],
        "hidden_size": ["hidden_size"],
    },
    "routing": {"scoring": "sigmoid", "bias": True, "renormalize": True},
    "activation": "silu",
    "forms": [
        {
            "kind": "stacked",
            "pattern": (
                r"^(?P<prefix>.*\.moe)\.(?P<proj>gate_proj|up_proj|down_proj)\.(?P<param>\w+)$"
            ),
            "projections": {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"},
            "module": ".experts",
        }
    ],
}


def _save_step3p7(root: Path, seed: int = 0) -> Path:
    import transformers

    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    config = transformers.Step3p7Config(
        text_config=STEP3P7_TEXT, vision_config=vision | dict(image_size=28, patch_size=14)
    )
    _write(config, "Step3p7ForConditionalGeneration", root, seed)
    return _add_keys(root, {"text_config": STEP3P7_RELEASED})


# MiniMax-M3 (MiniMaxM3SparseForConditionalGeneration, model_type minimax_m3_vl): transformers'
# own model, tiny (a dense layer, then a MoE layer with 4 experts and a shared expert, a
# one-block vision tower), whose save_pretrained writes the published names (language_model.
# model.layers.L.block_sparse_moe.experts.E.w{1,2,3}.weight, block_sparse_moe.
# e_score_correction_bias); config.json's text_config with the published keys the servers'
# models read that transformers' config class does not write or rewrites (MINIMAX_M3_RELEASED:
# hidden_act swigluoai, which it writes as silu; moe_layer_freq, which it turns into
# mlp_layer_types; the router's scoring_func and use_routing_bias; n_shared_experts, swiglu_beta)
MINIMAX_M3_TEXT = COMMON | dict(
    intermediate_size=32,
    dense_intermediate_size=64,
    shared_intermediate_size=32,
    num_local_experts=4,
    num_experts_per_tok=2,
    mlp_layer_types=["dense", "sparse"],
    index_n_heads=2,
    index_head_dim=16,
    rotary_dim=8,
)
MINIMAX_M3_RELEASED = dict(
    hidden_act="swigluoai",
    moe_layer_freq=[0, 1],
    scoring_func="sigmoid",
    use_routing_bias=True,
    n_shared_experts=1,
    swiglu_beta=1.0,
    use_gemma_norm=True,
    qk_norm_type="per_head",
)


# the published vision_config's keys the servers' vision towers read that transformers' config
# class does not write (it keeps spatial_merge_size and temporal_patch_size at its top level;
# SGLang's CLIPVisionConfig requires the others, its tower runs 3D RoPE only)
MINIMAX_M3_VISION_RELEASED = dict(
    img_token_compression_config=dict(spatial_merge_size=2, temporal_patch_size=2),
    position_embedding_type="rope",
    rope_mode="3d",
    vision_segment_max_frames=None,
)
MINIMAX_M3_MLP = re.compile(r"\.block_sparse_moe\.(?=(gate_proj|up_proj|down_proj|fc1|fc2)\.)")


def _save_minimax_m3(root: Path, seed: int = 0) -> Path:
    import transformers

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    config = transformers.MiniMaxM3VLConfig(
        text_config=MINIMAX_M3_TEXT,
        vision_config=vision | dict(image_size=28, patch_size=14),
        projector_hidden_size=64,
    )
    _write(config, "MiniMaxM3SparseForConditionalGeneration", root, seed)
    # (transformers' save turns every .mlp. into .block_sparse_moe., its reading of the
    # published MoE blocks: the dense layers' and the vision tower's MLPs are published as .mlp.)
    _rename_tensors(root, lambda n: MINIMAX_M3_MLP.sub(".mlp.", n))
    return _add_keys(
        root, {"text_config": MINIMAX_M3_RELEASED, "vision_config": MINIMAX_M3_VISION_RELEASED}
    )


# Muse Spark (MuseSparkForConditionalGeneration): a latent MoE in every layer (experts of
# moe_hidden_size between mlp.pre_expert_proj and mlp.post_expert_proj, fused
# mlp.experts.gate_up_proj [E, 2I, moe_hidden_size] and down_proj), beside one-block vision and
# audio towers, each part's config tiny. No family file names it (vLLM's reason:
# servers/vllm/target.py OWN_MOE_METHOD)
MUSE_SPARK_TEXT = COMMON | dict(
    intermediate_size=128,
    moe_intermediate_size=64,
    moe_hidden_size=64,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=16,
)


def _save_muse_spark(root: Path, seed: int = 0) -> Path:
    import transformers

    config = transformers.MuseSparkConfig(
        text_config=MUSE_SPARK_TEXT,
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2),
        audio_config=dict(hidden_sizes=[8, 8, 8, 16], out_hidden_size=COMMON["hidden_size"]),
        out_hidden_size=32,
        projector_hidden_size=32,
    )
    return _write(config, "MuseSparkForConditionalGeneration", root, seed)


# Intern-S2 Preview (InternS2PreviewForConditionalGeneration, model_type intern_s2_preview):
# Qwen3.5 MoE's model under its own names, as SGLang's config class reads it (configs/
# interns2preview.py: Qwen3_5MoeConfig's subclass, its vision_config model_type intern_s2_preview
# too, text_config Qwen3.5 MoE's own); transformers has no class of it, so Qwen3.5 MoE's tensors
# under config.json's own model_type and architecture. Its config class is remote code where
# published (configuration_interns2_preview.py, config.json's auto_map), which vLLM reads with
# --trust-remote-code: our module's stand-in for it is SGLang's, transformers' Qwen3_5MoeConfig
# under that model_type (INTERN_S2_PREVIEW_MODULE). (The published checkpoint's time-series
# tensors, model.time_series.*, are left out: both servers' classes skip them.)
INTERN_S2_PREVIEW_MODULE = '''"""Intern-S2 Preview's configuration class (fi-convert's tests)."""

from transformers import Qwen3_5MoeConfig, Qwen3_5MoeVisionConfig


class InternS2PreviewVisionConfig(Qwen3_5MoeVisionConfig):
    model_type = "intern_s2_preview"


class InternS2PreviewConfig(Qwen3_5MoeConfig):
    model_type = "intern_s2_preview"
    sub_configs = dict(Qwen3_5MoeConfig.sub_configs, vision_config=InternS2PreviewVisionConfig)
'''


def _save_intern_s2_preview(root: Path, seed: int = 0) -> Path:
    _save_qwen3_5_moe(root, seed)
    path = root / "config.json"
    cfg = json.loads(path.read_text())
    cfg |= dict(
        model_type="intern_s2_preview",
        architectures=["InternS2PreviewForConditionalGeneration"],
        auto_map={"AutoConfig": "configuration_interns2_preview.InternS2PreviewConfig"},
    )
    cfg["vision_config"]["model_type"] = "intern_s2_preview"
    path.write_text(json.dumps(cfg, indent=2))
    (root / "configuration_interns2_preview.py").write_text(INTERN_S2_PREVIEW_MODULE)
    return root


# Cohere2 Vision (Cohere2VisionForConditionalGeneration, model_type cohere2_vision) over a
# Cohere2-MoE language model (text_config model_type cohere2_moe, the language model SGLang's
# models/cohere2_vision.py builds): transformers' own model, tiny, a one-layer SigLIP tower, its
# tensors under model.vision_tower.vision_model. as published (transformers 5.20 writes them
# without vision_model.; SGLang's load reads either, vLLM's the published names only)
def _save_cohere2_vision(root: Path, seed: int = 0) -> Path:
    import transformers

    _, _, own = MODELS["cohere2_moe"]
    config = transformers.Cohere2VisionConfig(
        # (transformers' own class: SGLang registers a config class of its own for cohere2_moe)
        text_config=transformers.Cohere2MoeConfig(**(COMMON | own)),
        vision_config=dict(
            model_type="siglip_vision_model",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        alignment_intermediate_size=64,
        image_token_id=100,
    )
    _write(config, "Cohere2VisionForConditionalGeneration", root, seed)
    tower = "model.vision_tower."
    _rename_tensors(
        root, lambda n: n.replace(tower, tower + "vision_model.", 1) if n.startswith(tower) else n
    )
    return root


# MiniCPM-V 4.6 and 4.7 (MiniCPMV4_6ForConditionalGeneration, MiniCPMV4_7ForConditionalGeneration,
# model_type minicpmv4_6, minicpmv4_7) over a Qwen3.5 MoE language model (text_config model_type
# qwen3_5_moe_text, which SGLang's models/minicpmv.py builds as Qwen3_5MoeForCausalLM):
# transformers' own model, tiny, a one-layer vision tower (its window attention after layer
# insert_layer_id 0); the key SGLang's Qwen3.5 layers read that transformers' config class does
# not write (full_attention_interval, as for Qwen3.5 MoE)
def _save_minicpmv(root: Path, seed: int = 0, version: str = "4_6") -> Path:
    import transformers

    config = getattr(transformers, f"MiniCPMV{version}Config")(
        text_config=transformers.Qwen3_5MoeTextConfig(**QWEN3_5_MOE_TEXT),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
            insert_layer_id=0,
        ),
        insert_layer_id=0,
        image_size=32,
        patch_size=8,
        image_token_id=100,
        video_token_id=101,
    )
    _write(config, f"MiniCPMV{version}ForConditionalGeneration", root, seed)
    return _add_keys(root, {"text_config": QWEN3_5_MOE_SERVER_KEYS})


# MiniCPM-OCR (MiniCPMOcrForConditionalGeneration, model_type minicpm_ocr): MiniCPM-V 4.6's
# model and tensors under a config.json of its own model type, less drop_vision_last_layer (vLLM
# 0.33's models/minicpm_ocr.py: a plain subclass of 4.6's model in transformers too, its config
# 4.6's with that field deleted); transformers 5.20 has no class of it, so MiniCPM-V 4.6's tiny
# model is written and its config.json named so (MINICPM_OCR_CONFIG reads it)
def _save_minicpm_ocr(root: Path, seed: int = 0) -> Path:
    _save_minicpmv(root, seed)
    path = root / "config.json"
    cfg = json.loads(path.read_text())
    cfg.pop("drop_vision_last_layer", None)  # (written where not the default)
    cfg |= {"model_type": "minicpm_ocr", "architectures": ["MiniCPMOcrForConditionalGeneration"]}
    path.write_text(json.dumps(cfg, indent=2))
    return root


def minicpm_ocr_config() -> type:
    """A config class for model_type minicpm_ocr, which transformers 5.20 lacks: MiniCPM-V 4.6's
    (what MiniCPMOcrConfig subclasses; the field it deletes is read by no OCR code)."""
    import transformers

    return type(
        "MiniCPMOcrConfig", (transformers.MiniCPMV4_6Config,), {"model_type": "minicpm_ocr"}
    )


# DiffusionGemma (DiffusionGemmaForBlockDiffusion, model_type diffusion_gemma): Gemma 4's MoE
# decoder layers (text_config diffusion_gemma_text) in a block-diffusion model whose encoder's
# text layers are tied to the decoder's (transformers writes model.decoder.layers.L.experts
# alone), beside a one-layer vision tower; transformers' own model, tiny
def _save_diffusion_gemma(root: Path, seed: int = 0) -> Path:
    import transformers

    _, _, own = MODELS["gemma4"]
    text = {k: v for k, v in own.items() if k != "enable_moe_block"}  # (its MoE by num_experts)
    config = transformers.DiffusionGemmaConfig(
        text_config=transformers.DiffusionGemmaTextConfig(**(COMMON | text)),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
            patch_size=4,
            position_embedding_size=16,
        ),
    )
    return _write(config, "DiffusionGemmaForBlockDiffusion", root, seed)


# Inkling (InklingForConditionalGeneration, model_type inkling_mm_model: thinkingmachines/
# Inkling): transformers' whole model, whose save writes the published names back (its
# conversion mapping's reverse: model.llm.layers.L.mlp.experts.w13_weight [E, 2I, H] with gate
# and up rows interleaved [g0, u0, g1, u1, ...], w2_weight [E, H, I], the shared "sink" experts'
# shared_w13_weight / shared_w2_weight, the dense layer's w13_dn / w2_md, attn.wq_du ..., the
# audio tower's model.audio.encoder). Its config.json is written in the published keys, which
# both servers' config classes read (vLLM's vllm/models/inkling/configs.py says which are the
# published ones: intermediate_size the experts' width beside dense_intermediate_size,
# sconv_kernel_size, dense_mlp_idx; SGLang's configs/inkling.py reads those alone), in place of
# transformers' own (moe_intermediate_size, mlp_layer_types). The vision tower (an HMLP patch
# encoder: model.visual.layers.linear_N / norm_N, final_norm) is written here in those names:
# transformers 5.20 plans its temporal layers' widths 64 times those both servers build
# (ceil(x) * 64 channels where vLLM's common/towers.py and SGLang's inkling_common/hmlp.py round
# x up to a multiple of 64), so its tower would fit neither
INKLING_TEXT = COMMON | dict(
    intermediate_size=128,
    moe_intermediate_size=32,
    n_routed_experts=4,
    n_shared_experts=2,
    num_experts_per_tok=2,
    mlp_layer_types=["dense", "sparse"],
    swa_num_attention_heads=4,
    swa_num_key_value_heads=2,
    swa_head_dim=16,
    sliding_window_size=16,
    d_rel=4,
    rel_extent=16,
)
# transformers' own tower, written and then replaced: the smallest it builds without scipy
# (absent here: as many layers as its scales)
INKLING_TF_VISION = dict(
    hidden_size=32, num_hidden_layers=3, num_attention_heads=2, patch_size=2, temporal_patch_size=2
)
# the published tower's fields at 2 x 2 x 2 patches in two layers, whose scales are (t, h, w,
# channels) (1, 1, 1, 3) -> (1, 2, 2, 64) -> (2, 2, 2, 64) (each layer folds a 2 x 2 or a 2 x 1
# x 1 block of the last into its input; channels rounded up to 64), the last into the text
# model's width
INKLING_VISION = dict(patch_size=2, temporal_patch_size=2, n_layers=2)


def inkling_published_config(text: dict, vision: dict) -> dict:
    """config.json in the published keys (INKLING_TEXT's and INKLING_VISION's sizes)."""
    h = text["hidden_size"]
    dense = [i for i, t in enumerate(text["mlp_layer_types"]) if t == "dense"]
    kept = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "swa_num_attention_heads",
        "swa_num_key_value_heads",
        "swa_head_dim",
        "sliding_window_size",
        "d_rel",
        "rel_extent",
        "n_routed_experts",
        "n_shared_experts",
        "num_experts_per_tok",
    )
    text_config = {k: text[k] for k in kept} | dict(
        model_type="inkling_model",
        intermediate_size=text["moe_intermediate_size"],
        dense_intermediate_size=text["intermediate_size"],
        dense_mlp_idx=len(dense),
        local_layer_ids=[i for i in range(text["num_hidden_layers"]) if (i + 1) % 6],
        rms_norm_eps=1e-6,
        hidden_act="silu",
        use_embed_norm=True,
        use_sconv=True,
        sconv_kernel_size=4,
        route_scale=8.0,
        use_gate_bias=True,
        use_global_scale=True,
        norm_after_topk=True,
        gate_activation="sigmoid",
        shared_expert_sink=True,
        inference_moe_w13_interleaved=True,
        logits_mup_width_multiplier=24.0,
        tie_word_embeddings=False,
    )
    return dict(
        architectures=["InklingForConditionalGeneration"],
        model_type="inkling_mm_model",
        torch_dtype="bfloat16",
        tie_word_embeddings=False,
        text_config=text_config,
        vision_config=dict(
            model_type="inkling_vision_model",
            vision_encoder_type="hmlp",
            decoder_dmodel=h,
            n_channels=3,
            use_vision_norm=True,
        )
        | vision,
        audio_config=dict(
            model_type="inkling_audio_model",
            decoder_dmodel=h,
            n_mel_bins=80,
            mel_vocab_size=256,
            dmel_min_value=-1.0,
            dmel_max_value=1.0,
            use_audio_norm=True,
            audio_mode="dmel",
        ),
    )


def _inkling_vision(seed: int, h: int) -> dict[str, torch.Tensor]:
    """The HMLP tower of INKLING_VISION in its published names, seeded, in BF16: layer 0 folds
    2 x 2 pixels of 3 channels into 64, layer 1 two frames of 64 into the text width `h`."""
    g = torch.Generator().manual_seed(seed + 1)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    v = "model.visual."
    return {
        f"{v}layers.linear_0.weight": rand(64, 2 * 2 * 3),
        f"{v}layers.norm_0.weight": rand(64),
        f"{v}layers.linear_1.weight": rand(h, 2 * 64),
        f"{v}final_norm.weight": rand(h),
    }


def _save_inkling(root: Path, seed: int = 0) -> Path:
    import transformers
    from safetensors.torch import load_file, save_file

    config = transformers.InklingConfig(text_config=INKLING_TEXT, vision_config=INKLING_TF_VISION)
    _write(config, "InklingForConditionalGeneration", root, seed)
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for shard in sorted(set(index["weight_map"].values())):
        tensors = load_file(root / shard)
        kept = {k: t for k, t in tensors.items() if not k.startswith("model.visual.")}
        if len(kept) < len(tensors):
            save_file(kept, root / shard, metadata={"format": "pt"})
    vision = _inkling_vision(seed, INKLING_TEXT["hidden_size"])
    save_file(vision, root / "vision.safetensors", metadata={"format": "pt"})
    weight_map = {k: v for k, v in index["weight_map"].items() if not k.startswith("model.visual.")}
    index["weight_map"] = weight_map | dict.fromkeys(vision, "vision.safetensors")
    index_path.write_text(json.dumps(index, indent=2))
    published = inkling_published_config(INKLING_TEXT, INKLING_VISION)
    (root / "config.json").write_text(json.dumps(published, indent=2))
    return root


def _save_inkling_text(root: Path, seed: int = 0) -> Path:
    """Inkling's text model alone (InklingForCausalLM, model_type inkling_model, vLLM's
    text-only entry point): the whole model's checkpoint less its towers' tensors, config.json
    its text_config."""
    from safetensors.torch import load_file, save_file

    _save_inkling(root, seed)
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    towers = ("model.visual.", "model.audio.")
    for shard in sorted(set(index["weight_map"].values())):
        tensors = load_file(root / shard)
        kept = {k: t for k, t in tensors.items() if not k.startswith(towers)}
        if kept:
            save_file(kept, root / shard, metadata={"format": "pt"})
        else:
            (root / shard).unlink()
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith(towers)}
    index_path.write_text(json.dumps(index, indent=2))
    cfg = json.loads((root / "config.json").read_text())
    text = cfg["text_config"] | dict(architectures=["InklingForCausalLM"], torch_dtype="bfloat16")
    (root / "config.json").write_text(json.dumps(text, indent=2))
    return root


def _rename_tensors(root: Path, rename) -> None:
    """Each shard of the checkpoint at `root` (and its index) with its tensors renamed."""
    from safetensors.torch import load_file, save_file

    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for shard in sorted(set(index["weight_map"].values())):
        tensors = {rename(k): t for k, t in load_file(root / shard).items()}
        save_file(tensors, root / shard, metadata={"format": "pt"})
    index["weight_map"] = {rename(k): v for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index, indent=2))


SAVERS = {
    "inkling": _save_inkling,
    "inkling_text": _save_inkling_text,
    "minimax_m3": _save_minimax_m3,
    "glm5_next": _save_glm5_next,
    "qwen4_exp": _save_qwen4_exp,
    "qwen3_5_moe": _save_qwen3_5_moe,
    "intern_s2_preview": _save_intern_s2_preview,
    "cohere2_vision": _save_cohere2_vision,
    "minicpmv4_6": _save_minicpmv,
    "diffusion_gemma": _save_diffusion_gemma,
    "minicpmv4_7": functools.partial(_save_minicpmv, version="4_7"),
    "minicpm_ocr": _save_minicpm_ocr,
    "kimi_linear": _save_kimi_linear,
    "kimi_linear_latent": _save_kimi_linear_latent,
    "kimi_k3": _save_kimi_k3,
    "kimi_vl": _save_kimi_vl,
    "kimi_k25": _save_kimi_k25,
    "dots_vlm": _save_dots_vlm,
    "internvl_chat": _save_internvl,
    "hy_v4": _save_hy_v4,
    "axk1": _save_axk1,
    "qwen3_omni_moe": _save_qwen3_omni,
    "glm4v_moe": _save_glm4v_moe,
    "longcat_flash": _save_longcat_flash,
    "muse_spark": _save_muse_spark,
    "gemma4_mm": _save_gemma4_mm,
    "gemma4_unified": _save_gemma4_unified,
    "step3p7": _save_step3p7,
    "mimo_v2_omni": _save_mimo_v2_omni,
    "nemotron_h_nano_vl": _save_nemotron_h_nano_vl,
    "nemotron_h_nano_omni": functools.partial(
        _save_nemotron_h_nano_vl,
        architecture="NemotronH_Nano_Omni_Reasoning_V3",
        model_type="NemotronH_Nano_Omni_Reasoning_V3",
    ),
    # Nemotron Omni: Nano VL's layout (mlp1.{0,1,3} and radio_model.model.*, the names
    # transformers' conversion mapping for NemotronH_Omni_Reasoning_V3 reads as published),
    # model_type nemotron_h_omni, its video embedder over tubelets of 2 frames (transformers'
    # config class asks vision_config's video_temporal_patch_size to equal its own, 2)
    "nemotron_h_omni": functools.partial(
        _save_nemotron_h_nano_vl,
        architecture="NemotronH_Omni_Reasoning_V3",
        model_type="nemotron_h_omni",
        frames=2,
    ),
    # Nemotron Super Omni (NemotronH_Super_Omni_Reasoning_V3): Omni's layout over a latent-MoE
    # Nemotron-H (Nemotron-3 Super's: the routed experts run in moe_latent_size, between the
    # MoE mixer's fc1_latent_proj and fc2_latent_proj, transformers' own names)
    "nemotron_h_super_omni": functools.partial(
        _save_nemotron_h_nano_vl,
        architecture="NemotronH_Super_Omni_Reasoning_V3",
        model_type="NemotronH_Super_Omni_Reasoning_V3",
        frames=2,
        text=dict(hidden_size=128, moe_latent_size=64),
    ),
    "longcat_flash_ngram": _save_longcat_flash_ngram,
}


def _nemotron_h_pattern(cfg: dict) -> dict:
    """Nemotron-H's layer kinds as NVIDIA's published config.json gives them,
    `hybrid_override_pattern` ("M" Mamba, "E" MoE, "*" attention, "-" MLP), where transformers
    5 writes `layers_block_type` with names (`full_attention`) SGLang 0.5.23's own
    NemotronHConfig refuses; transformers' config class reads either."""
    letters = {"mamba": "M", "linear_attention": "M", "moe": "E", "attention": "*"}
    letters |= {"full_attention": "*", "mlp": "-"}
    kinds = cfg.pop("layers_block_type")
    return cfg | {"hybrid_override_pattern": "".join(letters[k] for k in kinds)}


def _hunyuan_per_layer(cfg: dict) -> dict:
    """Hunyuan-A13B's config.json as tencent/Hunyuan-A13B-Instruct publishes it (its remote
    code's config class): the experts' size, top-k and shared-expert count one per decoder
    layer (SGLang's HunYuanSparseMoeBlock reads moe_intermediate_size, where transformers' model
    sizes its experts by intermediate_size), its shared MLP and QK norms switched on by flags
    transformers' class does not write, and the head size also as attention_head_dim."""
    layers = cfg["num_hidden_layers"]
    per_layer = dict(
        moe_intermediate_size=[cfg["intermediate_size"]] * layers,
        moe_topk=[cfg["moe_topk"]] * layers,
        num_shared_expert=[1] * layers,
    )
    flags = dict(use_mixed_mlp_moe=True, use_qk_norm=True, use_cla=False)
    return cfg | per_layer | flags | {"attention_head_dim": cfg["head_dim"]}


# config.json as the released checkpoints write it, where transformers writes it otherwise
RELEASED_CONFIG = {"nemotron_h": _nemotron_h_pattern, "hunyuan_v1_moe": _hunyuan_per_layer}

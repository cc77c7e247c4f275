"""Tiny checkpoints in Mistral's own format, as Mistral Large 3 is published
(mistralai/Mistral-Large-3-675B-Instruct-2512-BF16 and, in FP8, -Instruct-2512): `params.json`
(Mistral's field names: `dim`, `n_layers`, the `moe` section with shared experts, `yarn`,
`llama_4_scaling`; no config.json), `consolidated-0000K-of-0000N.safetensors` shards and
`consolidated.safetensors.index.json`, and Mistral's tensor names (`tok_embeddings`,
`layers.L.attention.wkv_a_with_mqa`, `layers.L.experts.E.w1`, `layers.L.shared_experts.w1`,
`layers.L.gate`; FP8: `qscale_weight` and `qscale_act`, one float32 scale per tensor).

Text only by default; `write(..., vision=True)` is the model as published whole: params.json's
`vision_encoder` section (VISION_ENCODER, tiny; vLLM and SGLang then build
PixtralForConditionalGeneration around MistralLarge3ForCausalLM) and its tensors
(`vision_encoder.*`, `pre_mm_projector_norm`, `patch_merger.*`, `vision_language_adapter.*`:
non-expert tensors fi-convert carries over as they are).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

FP8 = torch.float8_e4m3fn
# small sizes of Mistral Large 3's shape: MLA attention (its head sizes, DeepSeek-V3's, which
# vLLM's MLA prefill kernels require), one dense layer, then MoE layers with one shared expert;
# expert_hidden_dim 96: padded per TP rank
PARAMS = {
    "dim": 128,
    "n_layers": 3,
    "head_dim": 192,
    "hidden_dim": 256,
    "n_heads": 2,
    "n_kv_heads": 2,
    "rope_theta": 10000.0,
    "norm_eps": 1e-06,
    "vocab_size": 256,
    "tied_embeddings": False,
    "max_position_embeddings": 4096,
    "q_lora_rank": 64,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "kv_lora_rank": 64,
    "v_head_dim": 128,
    "moe": {
        "expert_hidden_dim": 96,
        "route_every_n": 1,
        "first_k_dense_replace": 1,
        "num_experts_per_tok": 2,
        "num_experts": 4,
        "num_expert_groups": 1,
        "num_expert_groups_per_tok": 1,
        "routed_scale": 1.0,
        "num_shared_experts": 1,
    },
    "yarn": {
        "original_max_position_embeddings": 1024,
        "factor": 4.0,
        "apply_scale": False,
        "beta": 32.0,
        "alpha": 1.0,
    },
    "llama_4_scaling": {"original_max_position_embeddings": 1024, "beta": 0.1},
}
FP8_QUANTIZATION = {"qformat_weight": "fp8_e4m3", "qscheme_act": "TENSOR"}
# params.json's vision_encoder section (Mistral Large 3's keys as recalled from its published
# params.json, not re-read here: Pixtral's encoder with a patch merger and a norm before it, an
# adapter without biases), tiny: one block
VISION_ENCODER = {
    "hidden_size": 32,
    "num_channels": 3,
    "image_size": 56,
    "max_image_size": 56,
    "patch_size": 14,
    "rope_theta": 10000.0,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_token_id": 10,
    "image_break_token_id": 12,
    "image_end_token_id": 13,
    "adapter_bias": False,
    "spatial_merge_size": 2,
    "add_pre_mm_projector_layer_norm": True,
    "mm_projector_id": "patch_merge",
}


def tensors(params: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of the text model, in BF16, named as Mistral's format names them."""
    g = torch.Generator().manual_seed(seed)
    p, moe = params, params["moe"]
    dim, heads = p["dim"], p["n_heads"]
    qk = p["qk_nope_head_dim"] + p["qk_rope_head_dim"]

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    def norm(n: int) -> torch.Tensor:
        return (1 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)

    out = {
        "tok_embeddings.weight": w(p["vocab_size"], dim),
        "norm.weight": norm(dim),
        "output.weight": w(p["vocab_size"], dim),
    }
    for layer in range(p["n_layers"]):
        a = f"layers.{layer}."
        out |= {
            a + "attention_norm.weight": norm(dim),
            a + "ffn_norm.weight": norm(dim),
            a + "attention.wq_a.weight": w(p["q_lora_rank"], dim),
            a + "attention.q_a_norm.weight": norm(p["q_lora_rank"]),
            a + "attention.wq_b.weight": w(heads * qk, p["q_lora_rank"]),
            a + "attention.wkv_a_with_mqa.weight": w(
                p["kv_lora_rank"] + p["qk_rope_head_dim"], dim
            ),
            a + "attention.kv_a_norm.weight": norm(p["kv_lora_rank"]),
            a + "attention.wkv_b.weight": w(
                heads * (p["qk_nope_head_dim"] + p["v_head_dim"]), p["kv_lora_rank"]
            ),
            a + "attention.wo.weight": w(dim, heads * p["v_head_dim"]),
        }
        if layer < moe["first_k_dense_replace"]:
            f = p["hidden_dim"]
            out |= {
                a + "feed_forward.w1.weight": w(f, dim),
                a + "feed_forward.w2.weight": w(dim, f),
                a + "feed_forward.w3.weight": w(f, dim),
            }
            continue
        i, shared = moe["expert_hidden_dim"], moe["expert_hidden_dim"] * moe["num_shared_experts"]
        out[a + "gate.weight"] = w(moe["num_experts"], dim)
        for e in range(moe["num_experts"]):
            out |= {
                f"{a}experts.{e}.w1.weight": w(i, dim),
                f"{a}experts.{e}.w2.weight": w(dim, i),
                f"{a}experts.{e}.w3.weight": w(i, dim),
            }
        out |= {
            a + "shared_experts.w1.weight": w(shared, dim),
            a + "shared_experts.w2.weight": w(dim, shared),
            a + "shared_experts.w3.weight": w(shared, dim),
        }
    return out


def vision_tensors(params: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """The vision encoder's, its patch merger's and its adapter's tensors, in BF16, named as
    Mistral's format names them (VISION_ENCODER's sizes)."""
    g = torch.Generator().manual_seed(seed + 1)
    v, dim = params["vision_encoder"], params["dim"]
    h, i, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    merged = h * v["spatial_merge_size"] ** 2
    block = "vision_encoder.transformer.layers.0."
    shapes = {
        "vision_encoder.patch_conv.weight": (h, v["num_channels"], p, p),
        "vision_encoder.ln_pre.weight": (h,),
        **{f"{block}attention.{w}.weight": (h, h) for w in ("wq", "wk", "wv", "wo")},
        block + "attention_norm.weight": (h,),
        block + "ffn_norm.weight": (h,),
        block + "feed_forward.w1.weight": (i, h),
        block + "feed_forward.w3.weight": (i, h),
        block + "feed_forward.w2.weight": (h, i),
        "pre_mm_projector_norm.weight": (h,),
        "patch_merger.merging_layer.weight": (h, merged),
        "vision_language_adapter.w_in.weight": (dim, h),
        "vision_language_adapter.w_out.weight": (dim, dim),
    }
    return {n: (torch.randn(s, generator=g) * 0.05).to(torch.bfloat16) for n, s in shapes.items()}


def _fp8(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The routed experts in FP8 with per-tensor scales, as Mistral's FP8 format stores them:
    `weight` E4M3, `qscale_weight` its dequantization scale, `qscale_act` the static input
    scale (float32 scalars)."""
    out = dict(t)
    for name in [n for n in t if ".experts." in n and n.endswith(".weight")]:
        head = name.removesuffix(".weight")
        x = t[name].float()
        scale = x.abs().amax().clamp(min=1e-12) / torch.finfo(FP8).max
        out[name] = (x / scale).clamp(-448, 448).to(FP8)
        out[head + ".qscale_weight"] = scale.reshape(())
        out[head + ".qscale_act"] = torch.tensor(0.02 + 0.001 * (len(head) % 7))
    return out


def write(
    root: Path, quant: str | None = None, shards: int = 2, vision: bool = False, **moe: object
) -> Path:
    """A Mistral-format tiny Mistral Large 3 (BF16, or `quant` "fp8" as the FP8 release) in
    `root`: params.json, `shards` consolidated shards and their index; with `vision`, the
    model as published whole (its vision encoder too)."""
    params = json.loads(json.dumps(PARAMS))
    params["moe"].update(moe)
    t = tensors(params)
    if vision:
        params["vision_encoder"] = dict(VISION_ENCODER)
        t |= vision_tensors(params)
    if quant == "fp8":
        params["quantization"] = dict(FP8_QUANTIZATION)
        t = _fp8(t)
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.json").write_text(json.dumps(params, indent=2))
    (root / "tekken.json").write_text(json.dumps({"config": {"pattern": "tiny"}, "vocab": []}))
    names = sorted(t)
    weight_map = {}
    for k in range(shards):
        part = names[k::shards]
        shard = f"consolidated-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: t[n].contiguous() for n in part}, str(root / shard))
        weight_map |= {n: shard for n in part}
    index = {"metadata": {"total_size": sum(v.nbytes for v in t.values())}}
    (root / "consolidated.safetensors.index.json").write_text(
        json.dumps(index | {"weight_map": weight_map}, indent=2)
    )
    return root

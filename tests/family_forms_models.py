"""Test support for the tensor forms' families (fi_convert/forms.py): tiny checkpoints of
Llama-4 and Qwen3-VL-MoE written by transformers' own `save_pretrained`, in the form their
public checkpoints have, and vLLM 0.33's own model code loading them.

- Llama-4 (`Llama4ForConditionalGeneration`): transformers writes it as published
  (`language_model.model.layers.L.feed_forward.experts.gate_up_proj [E, H, 2I]`,
  `down_proj [E, I, H]`, the sizes in `text_config`).
- Qwen3-VL-MoE (`Qwen3VLMoeForConditionalGeneration`): transformers 5.20 writes the fused
  experts in its own orientation (`gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`) and the
  expert count as `num_local_experts`; the public checkpoints (Qwen/Qwen3-VL-30B-A3B-Instruct)
  store them `[E, H, 2I]` / `[E, I, H]` with `num_experts`, which is what vLLM's and SGLang's
  loaders read (both transpose). `save(..., published=True)` rewrites the two as published.

vLLM's side: its MoE layer built as the model's MoE block builds it (`FusedMoEFactory` with
the block's arguments), loaded by the model class's own `load_weights` run on a stand-in model
that holds only that layer at its place (`Llama4Model.load_weights`, `Qwen3MoeModel.
load_weights`: their name and expert mappings, their transposes), then vLLM's post-load driver.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

# per family: transformers' config and model classes, the text config's own arguments, the
# vision config (as small as it goes), the MoE layer, and the prefix vLLM's text model drops
TEXT = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
MODELS: dict[str, dict] = {
    # H 64, I 128 (2I 256; I/TP a multiple of 32 for MXFP8): no size equals another; layer 0
    # dense (interleave_moe_layer_step 2,
    # as Maverick), layer 1 MoE with its shared expert
    "llama4": dict(
        config="Llama4Config",
        model="Llama4ForConditionalGeneration",
        text=dict(
            intermediate_size=128,
            intermediate_size_mlp=96,
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
        ),
        vision=dict(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            image_size=28,
            patch_size=14,
            vision_output_dim=32,
            projector_input_dim=32,
            projector_output_dim=32,
        ),
        moe="language_model.model.layers.1.feed_forward.experts",
        strip="language_model.model.",
    ),
    "qwen3_vl_moe": dict(
        config="Qwen3VLMoeConfig",
        model="Qwen3VLMoeForConditionalGeneration",
        text=dict(
            intermediate_size=96,
            moe_intermediate_size=128,
            num_experts=4,
            num_experts_per_tok=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
        ),
        vision=dict(
            hidden_size=32,
            depth=1,
            num_heads=2,
            intermediate_size=64,
            out_hidden_size=64,
            deepstack_visual_indexes=[0],
        ),
        moe="model.language_model.layers.1.mlp.experts",
        strip="model.language_model.",
    ),
    # Aria: experts.fc1 [E, H, 2I] ([gate | up] along its last dimension: transformers' Aria
    # chunks x @ fc1 into gate, then up) and fc2 [E, I, H], beside a shared expert; every
    # layer MoE; the smallest image-to-query map its projector takes
    "aria": dict(
        config="AriaConfig",
        model="AriaForConditionalGeneration",
        text=dict(
            model_type="aria_text",
            intermediate_size=128,
            moe_num_experts=4,
            moe_topk=2,
            moe_num_shared_experts=1,
        ),
        vision=dict(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            image_size=28,
            patch_size=14,
        ),
        extra=dict(projector_patch_to_query_dict={4: 4, 1: 1}),
        moe="language_model.model.layers.1.mlp.experts",
        strip="language_model.model.",
    ),
    # a text model (no vision config); H 64, I 128; input_linear [E, 2I, H] beside the router
    "granitemoe": dict(
        config="GraniteMoeConfig",
        model="GraniteMoeForCausalLM",
        text=dict(intermediate_size=128, num_local_experts=4, num_experts_per_tok=2),
        moe="model.layers.1.block_sparse_moe.experts",
        strip="model.",
        # the layer's tensors, where their names are not under the MoE module's
        tensors=(
            "model.layers.1.block_sparse_moe.input_linear.",
            "model.layers.1.block_sparse_moe.output_linear.",
        ),
    ),
}
MAX_SHARD_SIZE = "200KB"
# Mixtral with its experts named gate_proj/up_proj/down_proj (W8A8 compressed-tensors exports;
# vLLM's MixtralModel maps the names to w1/w3/w2): fi-convert's synthetic Mixtral renamed
MIXTRAL = dict(moe="model.layers.0.block_sparse_moe.experts", strip="model.")
MIXTRAL_NAMES = {".w1.": ".gate_proj.", ".w3.": ".up_proj.", ".w2.": ".down_proj."}


def save_mixtral_named(root: Path, quant: str = "bf16") -> Path:
    """fi-convert's synthetic Mixtral (one MoE layer: H 128, I 192, 4 experts; `quant` its
    format: bf16, or ModelOpt fp8-tensor) with its experts' projections renamed."""
    from fi_convert.testing.synthetic import Spec, write_checkpoint

    q = {} if quant == "bf16" else {"quant": quant}
    spec = Spec("mixtral", layers=1, experts=4, hidden=128, intermediate=192, shards=1, **q)
    write_checkpoint(root, spec)
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    renamed = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors = load_file(root / shard)
        new = {_rename(n): t for n, t in tensors.items()}
        renamed |= {n: shard for n in new}
        save_file(new, root / shard, metadata={"format": "pt"})
    index["weight_map"] = renamed
    index_path.write_text(json.dumps(index, indent=2))
    return root


# Step-3 (Step3TextForCausalLM): transformers has no such model; the names and config keys
# vLLM's models/step3_text.py reads, experts packed per projection [E, out, in]
STEP3 = dict(
    moe="model.layers.1.moe.experts",
    strip="model.",
    tensors=tuple(f"model.layers.1.moe.{p}_proj." for p in ("gate", "up", "down")),
)
STEP3_CONFIG = dict(
    model_type="step3_text",
    architectures=["Step3TextForCausalLM"],
    hidden_size=64,
    moe_intermediate_size=128,
    moe_num_experts=4,
    moe_top_k=2,
    norm_expert_weight=True,
    share_expert_dim=96,
    share_q_dim=64,
    head_dim=16,
    num_hidden_layers=2,
    moe_layers_enum="1",
    vocab_size=128,
)


def save_step3(root: Path, seed: int = 0) -> Path:
    """A tiny Step-3 text checkpoint in the names vLLM's Step3TextModel reads: layer 0 dense,
    layer 1 MoE (its packed experts, router and shared expert), in two shards."""
    g = torch.Generator().manual_seed(seed)
    h, i, e, s = 64, 128, 4, 96

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    moe = "model.layers.1.moe"
    shards = {
        "model-00001-of-00002.safetensors": {
            "model.embed_tokens.weight": w(128, h),
            "model.layers.0.mlp.gate_proj.weight": w(s, h),
            "model.layers.0.mlp.up_proj.weight": w(s, h),
            "model.layers.0.mlp.down_proj.weight": w(h, s),
        },
        "model-00002-of-00002.safetensors": {
            f"{moe}.gate_proj.weight": w(e, i, h),
            f"{moe}.up_proj.weight": w(e, i, h),
            f"{moe}.down_proj.weight": w(e, h, i),
            f"{moe}.gate.weight": w(e, h),
            "model.layers.1.share_expert.gate_proj.weight": w(s, h),
            "model.layers.1.share_expert.up_proj.weight": w(s, h),
            "model.layers.1.share_expert.down_proj.weight": w(h, s),
            "lm_head.weight": w(128, h),
        },
    }
    root.mkdir(parents=True)
    index = {}
    for shard, tensors in shards.items():
        save_file(tensors, root / shard, metadata={"format": "pt"})
        index |= {n: shard for n in tensors}
    total = sum(t.numel() * 2 for ts in shards.values() for t in ts.values())
    meta = {"metadata": {"total_size": total}, "weight_map": index}
    (root / "model.safetensors.index.json").write_text(json.dumps(meta, indent=2))
    (root / "config.json").write_text(json.dumps(STEP3_CONFIG, indent=2))
    return root


def _rename(name: str) -> str:
    if ".block_sparse_moe.experts." not in name:
        return name
    for old, new in MIXTRAL_NAMES.items():
        name = name.replace(old, new)
    return name


def save(kind: str, root: Path, published: bool = True, seed: int = 0, **text: object) -> Path:
    """Model `kind` written by transformers' `save_pretrained` (several shards), BF16; `text`
    replaces text-config arguments. Qwen3-VL-MoE's experts as published unless `published`
    is False (transformers' own orientation)."""
    import transformers

    from tests.hf_checkpoints import transformers_own_rope

    m = MODELS[kind]
    cls = getattr(transformers, m["config"])
    with transformers_own_rope():  # (beside an SGLang that patched transformers' own)
        if "vision" in m:
            config = cls(
                text_config=TEXT | m["text"] | text,
                vision_config=m["vision"],
                **m.get("extra", {}),
            )
        else:
            config = cls(**(TEXT | m["text"] | text))
        torch.manual_seed(seed)
        model = getattr(transformers, m["model"])(config).to(torch.bfloat16)
        model.save_pretrained(root, max_shard_size=MAX_SHARD_SIZE)
    if kind == "qwen3_vl_moe" and published:
        _as_published(root)
    return root


def _as_published(root: Path) -> None:
    """Qwen3-VL-MoE's fused experts turned to the public checkpoints' [E, H, 2I] / [E, I, H]
    (where transformers 5.20 writes [E, 2I, H] / [E, H, I]), and the expert count under the
    public config's key `num_experts`."""
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    for shard in sorted(set(index.values())):
        tensors = load_file(root / shard)
        fused = [n for n in tensors if n.endswith((".experts.gate_up_proj", ".experts.down_proj"))]
        if fused:
            for n in fused:
                tensors[n] = tensors[n].transpose(-1, -2).contiguous()
            save_file(tensors, root / shard, metadata={"format": "pt"})
    cfg = json.loads((root / "config.json").read_text())
    cfg["text_config"]["num_experts"] = cfg["text_config"].pop("num_local_experts")
    (root / "config.json").write_text(json.dumps(cfg, indent=2))


def text_config(ckpt: Path) -> dict:
    cfg = json.loads((ckpt / "config.json").read_text())
    return cfg.get("text_config", cfg)


def make_runner(
    kind: str, ckpt: Path, tp: int, quant_config=None, prefix: str | None = None
) -> torch.nn.Module:
    """vLLM's MoE layer (its MoERunner) as the model's MoE block builds it (call inside
    tests.vllm_moe.vllm_context): Llama4MoE's arguments (top-1, Llama-4's custom routing
    function, router weight on the input, no renormalization), or Qwen3MoeSparseMoeBlock's
    with Qwen3VLMoeDecoderLayer's `is_fused_checkpoint_transposed=True`."""
    from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory
    from vllm.model_executor.models import llama4

    if kind == "step3":  # Step3TextMoEMLP's arguments
        cfg = STEP3_CONFIG
        return _runner(ckpt, tp, quant_config, prefix or STEP3["moe"], cfg)
    if kind in ("mixtral", "granitemoe"):  # MixtralMoE's or GraniteMoeMoE's arguments
        return _mixtral_runner(
            ckpt, tp, quant_config, prefix or spec(kind)["moe"], kind == "mixtral"
        )
    cfg = text_config(ckpt)
    if kind == "llama4":
        num, inter = cfg["num_local_experts"], cfg["intermediate_size"]
        own = dict(
            custom_routing_function=llama4.Llama4MoE.custom_routing_function,
            apply_router_weight_on_input=True,
            renormalize=False,
        )
    else:
        num, inter = (
            cfg.get("num_experts") or cfg["num_local_experts"],
            cfg["moe_intermediate_size"],
        )
        own = dict(renormalize=cfg.get("norm_topk_prob", True), is_fused_checkpoint_transposed=True)
    return FusedMoEFactory(
        num_experts=num,
        top_k=cfg["num_experts_per_tok"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=inter,
        params_dtype=torch.bfloat16,
        quant_config=quant_config,
        tp_size=tp,
        dp_size=1,
        pcp_size=1,
        prefix=prefix or MODELS[kind]["moe"],
        **own,
    )


def _runner(ckpt: Path, tp: int, quant_config, prefix: str, cfg: dict) -> torch.nn.Module:
    from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory

    return FusedMoEFactory(
        num_experts=cfg["moe_num_experts"],
        top_k=cfg["moe_top_k"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["moe_intermediate_size"],
        params_dtype=torch.bfloat16,
        renormalize=cfg["norm_expert_weight"],
        quant_config=quant_config,
        tp_size=tp,
        dp_size=1,
        pcp_size=1,
        prefix=prefix,
    )


def _mixtral_runner(ckpt: Path, tp: int, quant_config, prefix: str, w123: bool) -> torch.nn.Module:
    """MixtralMoE's arguments (models/mixtral.py: renormalized top-k, `w123`: its w1/w2/w3
    names) and GraniteMoeMoE's (models/granitemoe.py: renormalized top-k)."""
    from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory

    cfg = json.loads((ckpt / "config.json").read_text())
    return FusedMoEFactory(
        num_experts=cfg["num_local_experts"],
        top_k=cfg["num_experts_per_tok"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        params_dtype=torch.bfloat16,
        renormalize=True,
        quant_config=quant_config,
        tp_size=tp,
        dp_size=1,
        pcp_size=1,
        prefix=prefix,
        **({"ckpt_names": ("w1", "w2", "w3")} if w123 else {}),
    )


# DBRX (tests/hf_checkpoints.py's "dbrx", written by transformers): flat experts [E*I, H]
DBRX = dict(
    moe="transformer.blocks.1.ffn.experts",
    strip="transformer.",
    tensors=tuple(f"transformer.blocks.1.ffn.experts.mlp.{p}" for p in ("w1", "v1", "w2")),
)


def spec(kind: str) -> dict:
    return {"mixtral": MIXTRAL, "step3": STEP3, "dbrx": DBRX}.get(kind) or MODELS[kind]


def _stand_in(kind: str, runner: torch.nn.Module) -> torch.nn.Module:
    """A text model holding only the MoE layer, where the real one holds it
    (layers[L].feed_forward.experts or layers[L].mlp.experts)."""
    from vllm.model_executor.models import granitemoe, llama4, mixtral, qwen3_moe

    path = spec(kind)["moe"].removeprefix(spec(kind)["strip"]).split(".")
    _, index, block, leaf = path
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(int(index) + 1))
    holder = torch.nn.Module()
    holder.add_module(leaf, runner)
    model.layers[int(index)].add_module(block, holder)
    if kind == "llama4":
        model.num_experts = runner.routed_experts.global_num_experts
        model.n_redundant_experts = 0
        model.load_moe_expert_weights = llama4.Llama4Model.load_moe_expert_weights.__get__(model)
    elif kind == "mixtral":
        model.hf_to_vllm_mapper = mixtral.MixtralModel.hf_to_vllm_mapper
    elif kind == "granitemoe":
        model.hf_to_vllm_mapper = granitemoe.GraniteMoeModel.hf_to_vllm_mapper
    elif kind == "step3":  # what Step3TextModel.load_weights reads of its config
        model.config = types.SimpleNamespace(**STEP3_CONFIG)
    else:
        model.hf_to_vllm_mapper = qwen3_moe.Qwen3MoeModel.hf_to_vllm_mapper
    return model


def expert_weights(kind: str, ckpt: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The MoE layer's checkpoint tensors, named as the multimodal model hands them to its
    text model (`language_model.model.` / `model.language_model.` dropped)."""
    strip = spec(kind)["strip"]
    prefixes = spec(kind).get("tensors", (spec(kind)["moe"] + ".",))
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    for name, shard in sorted(index.items()):
        if name.startswith(prefixes):
            with safe_open(ckpt / shard, framework="pt") as f:
                yield name.removeprefix(strip), f.get_tensor(name)


def vllm_load(kind: str, runner: torch.nn.Module, ckpt: Path) -> set[str]:
    """The text model class's own `load_weights` over the layer's tensors, on a stand-in
    holding the layer; returns the parameters it says it loaded."""
    from vllm.model_executor.models import granitemoe, llama4, mixtral, qwen3_moe, step3_text

    model = _stand_in(kind, runner)
    models = {
        "step3": step3_text.Step3TextModel,
        "llama4": llama4.Llama4Model,
        "mixtral": mixtral.MixtralModel,
        "granitemoe": granitemoe.GraniteMoeModel,
    }
    cls = models.get(kind, qwen3_moe.Qwen3MoeModel)
    return set(cls.load_weights(model, expert_weights(kind, ckpt)))


# ERNIE-4.5-VL (Ernie4_5_VLMoeForConditionalGeneration): transformers 5.20's ernie4_5_vl_moe
# reads another config (its text_config, one expert count) that vLLM's model does not, so the
# checkpoint is written here in the published names and config.json fields vLLM's
# models/ernie45_vl_moe.py reads: each MoE layer's 2N experts model.layers.L.mlp.experts.E.*
# (E < N text, N <= E < 2N vision), the routers mlp.gate.weight / gate.weight_1 stored [H, N],
# both sets' correction biases in mlp.moe_statics.e_score_correction_bias [2, N]; the vision
# tower vision_model.* and the resampler model.resampler_model.* (spatial_linear.0, ...) as
# both servers' models read them
ERNIE_VL = dict(
    moe="model.layers.1.mlp.text_experts",
    vision_moe="model.layers.1.mlp.vision_experts",
    strip="",
)
ERNIE_VL_CONFIG = dict(
    architectures=["Ernie4_5_VLMoeForConditionalGeneration"],
    model_type="ernie4_5_moe_vl",
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=[128, 64],
    moe_num_experts=[4, 4],
    moe_k=2,
    moe_layer_start_index=[1, 1],
    moe_layer_end_index=[1, 1],
    moe_layer_interval=1,
    moe_num_shared_experts=1,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    hidden_act="silu",
    rms_norm_eps=1e-5,
    vocab_size=128,
    max_position_embeddings=128,
    rope_theta=500000,
    rope_3d=True,
    freq_allocation=2,
    im_patch_id=100,
    tie_word_embeddings=False,
    use_bias=False,
    torch_dtype="bfloat16",
    # the vision tower and resampler the multimodal models build
    rope_scaling={"type": "default", "mrope_section": [2, 3, 3]},
    pixel_hidden_size=32,
    spatial_conv_size=2,
    temporal_conv_size=2,
    use_temporal_conv=True,
    vision_config=dict(
        patch_size=14,
        spatial_merge_size=2,
        in_chans=3,
        in_channels=3,
        hidden_size=32,
        embed_dim=32,
        depth=1,
        num_heads=2,
        mlp_ratio=2,
    ),
)


def save_ernie45_vl(root: Path, seed: int = 0) -> Path:
    """A tiny ERNIE-4.5-VL checkpoint as published (above): layer 0 dense, layer 1 MoE with
    its text and vision experts (I 128 and 64), routers and shared expert, in two shards."""
    g = torch.Generator().manual_seed(seed)
    cfg = ERNIE_VL_CONFIG
    h, d, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["moe_num_experts"][0]
    i_text, i_vision = cfg["moe_intermediate_size"]

    def w(*shape: int, dtype=torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)

    def attn(layer: int) -> dict:
        p = f"model.layers.{layer}"
        return {
            f"{p}.self_attn.q_proj.weight": w(64, h),
            f"{p}.self_attn.k_proj.weight": w(32, h),
            f"{p}.self_attn.v_proj.weight": w(32, h),
            f"{p}.self_attn.o_proj.weight": w(h, 64),
            f"{p}.input_layernorm.weight": w(h),
            f"{p}.post_attention_layernorm.weight": w(h),
        }

    moe = "model.layers.1.mlp"
    experts = {}
    for e in range(2 * n):
        i = i_text if e < n else i_vision
        experts |= {
            f"{moe}.experts.{e}.gate_proj.weight": w(i, h),
            f"{moe}.experts.{e}.up_proj.weight": w(i, h),
            f"{moe}.experts.{e}.down_proj.weight": w(h, i),
        }
    shards = {
        "model-00001-of-00002.safetensors": {
            **_ernie45_vl_towers(w),
            "model.embed_tokens.weight": w(128, h),
            **attn(0),
            "model.layers.0.mlp.gate_proj.weight": w(d, h),
            "model.layers.0.mlp.up_proj.weight": w(d, h),
            "model.layers.0.mlp.down_proj.weight": w(h, d),
        },
        "model-00002-of-00002.safetensors": {
            **attn(1),
            **experts,
            f"{moe}.gate.weight": w(h, n, dtype=torch.float32),
            f"{moe}.gate.weight_1": w(h, n, dtype=torch.float32),
            f"{moe}.moe_statics.e_score_correction_bias": w(2, n, dtype=torch.float32),
            f"{moe}.shared_experts.gate_proj.weight": w(i_text, h),
            f"{moe}.shared_experts.up_proj.weight": w(i_text, h),
            f"{moe}.shared_experts.down_proj.weight": w(h, i_text),
            "model.norm.weight": w(h),
            "lm_head.weight": w(128, h),
        },
    }
    root.mkdir(parents=True)
    index = {}
    for shard, tensors in shards.items():
        save_file(tensors, root / shard, metadata={"format": "pt"})
        index |= {n: shard for n in tensors}
    total = sum(t.numel() * t.element_size() for ts in shards.values() for t in ts.values())
    meta = {"metadata": {"total_size": total}, "weight_map": index}
    (root / "model.safetensors.index.json").write_text(json.dumps(meta, indent=2))
    (root / "config.json").write_text(json.dumps(ERNIE_VL_CONFIG, indent=2))
    return root


def _ernie45_vl_towers(w) -> dict[str, torch.Tensor]:
    """ERNIE-4.5-VL's vision tower (one block) and resampler, in the published names, of
    ERNIE_VL_CONFIG's sizes (`w(*shape)`: a random tensor)."""
    v = ERNIE_VL_CONFIG["vision_config"]
    e, p = v["embed_dim"], v["patch_size"]
    m = int(e * v["mlp_ratio"])
    pix, h = ERNIE_VL_CONFIG["pixel_hidden_size"], ERNIE_VL_CONFIG["hidden_size"]
    sp = pix * ERNIE_VL_CONFIG["spatial_conv_size"] ** 2
    tmp = sp * ERNIE_VL_CONFIG["temporal_conv_size"]
    b = "vision_model.blocks.0"
    out = {
        "vision_model.patch_embed.proj.weight": w(e, v["in_chans"] * p * p),
        f"{b}.attn.qkv.weight": w(3 * e, e),
        f"{b}.attn.qkv.bias": w(3 * e),
        f"{b}.attn.proj.weight": w(e, e),
        f"{b}.attn.proj.bias": w(e),
        f"{b}.mlp.fc1.weight": w(m, e),
        f"{b}.mlp.fc1.bias": w(m),
        f"{b}.mlp.fc2.weight": w(e, m),
        f"{b}.mlp.fc2.bias": w(e),
    }
    for norm in (f"{b}.norm1", f"{b}.norm2", "vision_model.ln"):
        out |= {f"{norm}.weight": w(e), f"{norm}.bias": w(e)}
    r = "model.resampler_model"
    for name, (rows, cols) in {
        "spatial_linear.0": (sp, sp),
        "spatial_linear.2": (sp, sp),
        "temporal_linear.0": (sp, tmp),
        "temporal_linear.2": (sp, sp),
        "mlp": (h, sp),
    }.items():
        out |= {f"{r}.{name}.weight": w(rows, cols), f"{r}.{name}.bias": w(rows)}
    for norm in ("spatial_linear.3", "temporal_linear.3"):
        out |= {f"{r}.{norm}.weight": w(sp), f"{r}.{norm}.bias": w(sp)}
    return out | {f"{r}.after_norm.weight": w(h)}


def register_ernie45_vl_config() -> None:
    """transformers' AutoConfig reads ERNIE-4.5-VL's config.json (model_type
    ernie4_5_moe_vl, which the published checkpoints' remote code defines and transformers
    5.20 does not know) as a plain PretrainedConfig of its fields, as vLLM's ModelConfig then
    hands them to the model; once per process."""
    from transformers import AutoConfig, PretrainedConfig

    mt = ERNIE_VL_CONFIG["model_type"]

    class Ernie45VLConfig(PretrainedConfig):
        model_type = mt

        def __init__(self, vision_config: dict | None = None, **kwargs: object) -> None:
            super().__init__(**kwargs)
            self.vision_config = PretrainedConfig(**(vision_config or {}))

    try:
        AutoConfig.for_model(mt)
    except ValueError:
        AutoConfig.register(mt, Ernie45VLConfig)


# Step3-VL (stepfun-ai/step3, Step3VLForConditionalGeneration, model_type step3_vl): Step-3's
# text model under model. (its packed experts model.layers.L.moe.{gate,up,down}_proj.weight
# [E, out, in], its attention's q/k/v_proj, inter_norm and wq, a shared expert share_expert), a
# vision tower vision_model. (embeddings, transformer.layers.N with a fused self_attn.qkv_proj
# and out_proj), the projector's vit_downsampler, vit_downsampler2 and vit_large_projector, and
# lm_head: the names stepfun-ai/step3 publishes (its README's key_mapping for transformers) and
# SGLang's Step3VLForConditionalGeneration reads, with SGLang's own config classes (configs/
# step3_vl.py), no remote code; tiny sizes, layer 0 dense, layer 1 MoE
STEP3_VL_CONFIG = dict(
    model_type="step3_vl",
    architectures=["Step3VLForConditionalGeneration"],
    understand_projector_stride=1,
    projector_bias=True,
    image_token_id=100,
    torch_dtype="bfloat16",
    vision_config=dict(
        model_type="step3_vision_encoder",
        hidden_size=32,
        intermediate_size=64,
        output_hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_channels=3,
        image_size=28,
        patch_size=14,
        hidden_act="quick_gelu",
    ),
    text_config=dict(
        model_type="step3_text",
        # (vLLM 0.33's Step3-VL builds its language model by this: absent, it finds no
        # architecture; SGLang takes config.json's own)
        architectures=["Step3TextForCausalLM"],
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_attention_groups=1,
        num_hidden_layers=2,
        max_seq_len=128,
        vocab_size=128,
        rms_norm_eps=1e-5,
        moe_intermediate_size=128,
        moe_num_experts=4,
        moe_top_k=2,
        rope_theta=500000,
        max_position_embedding=128,
        share_expert_dim=96,
        share_q_dim=64,
        head_dim=16,
        norm_expert_weight=True,
        moe_layers_enum="1",
        pad_token_id=1,
        torch_dtype="bfloat16",
    ),
)


def save_step3_vl(root: Path, seed: int = 0) -> Path:
    """A tiny Step3-VL checkpoint in two shards (the MoE layer and the head in the second)."""
    g = torch.Generator().manual_seed(seed)
    t, v = STEP3_VL_CONFIG["text_config"], STEP3_VL_CONFIG["vision_config"]
    h, e, i, d = t["hidden_size"], t["moe_num_experts"], t["moe_intermediate_size"], t["head_dim"]
    q, kv, n = t["share_q_dim"], t["num_attention_groups"] * d, t["num_attention_heads"] * d

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    def mlp(p: str, size: int) -> dict[str, torch.Tensor]:
        return {
            p + "gate_proj.weight": w(size, h),
            p + "up_proj.weight": w(size, h),
            p + "down_proj.weight": w(h, size),
        }

    first: dict[str, torch.Tensor] = {"model.embed_tokens.weight": w(t["vocab_size"], h)}
    second: dict[str, torch.Tensor] = {"model.norm.weight": w(h), "lm_head.weight": w(128, h)}
    for layer, shard in ((0, first), (1, second)):
        p = f"model.layers.{layer}."
        shard |= {
            p + "input_layernorm.weight": w(h),
            p + "post_attention_layernorm.weight": w(h),
            p + "self_attn.q_proj.weight": w(q, h),
            p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h),
            p + "self_attn.inter_norm.weight": w(q),
            p + "self_attn.wq.weight": w(n, q),
            p + "self_attn.o_proj.weight": w(h, n),
        }
        if layer == 0:
            shard |= mlp(p + "mlp.", t["intermediate_size"])
            continue
        shard |= mlp(p + "share_expert.", t["share_expert_dim"])
        shard |= {
            p + "moe.gate_proj.weight": w(e, i, h),
            p + "moe.up_proj.weight": w(e, i, h),
            p + "moe.down_proj.weight": w(e, h, i),
            p + "moe.gate.weight": w(e, h),
        }
    vh, vi, out = v["hidden_size"], v["intermediate_size"], v["output_hidden_size"]
    patches = (v["image_size"] // v["patch_size"]) ** 2
    ve = "vision_model.embeddings."
    first |= {
        ve + "class_embedding": w(1, vh),
        ve + "patch_embedding.weight": w(vh, v["num_channels"], v["patch_size"], v["patch_size"]),
        ve + "patch_embedding.bias": w(vh),
        ve + "position_embedding.weight": w(patches + 1, vh),
        "vit_downsampler.weight": w(out, vh, 2, 2),
        "vit_downsampler.bias": w(out),
        "vit_downsampler2.weight": w(2 * out, out, 3, 3),
        "vit_downsampler2.bias": w(2 * out),
        "vit_large_projector.weight": w(h, 2 * out),
        "vit_large_projector.bias": w(h),
    }
    for k in range(v["num_hidden_layers"]):
        p = f"vision_model.transformer.layers.{k}."
        for m, shape in (
            ("layer_norm1", (vh,)),
            ("layer_norm2", (vh,)),
            ("self_attn.qkv_proj", (3 * vh, vh)),
            ("self_attn.out_proj", (vh, vh)),
            ("mlp.fc1", (vi, vh)),
            ("mlp.fc2", (vh, vi)),
        ):
            first |= {p + m + ".weight": w(*shape), p + m + ".bias": w(shape[0])}
    root.mkdir(parents=True)
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    index = {}
    for shard, tensors in shards.items():
        save_file(tensors, root / shard, metadata={"format": "pt"})
        index |= {name: shard for name in tensors}
    total = sum(x.numel() * 2 for ts in shards.values() for x in ts.values())
    meta = {"metadata": {"total_size": total}, "weight_map": index}
    (root / "model.safetensors.index.json").write_text(json.dumps(meta, indent=2))
    (root / "config.json").write_text(json.dumps(STEP3_VL_CONFIG, indent=2))
    return root

"""Synthetic checkpoints that are real in form: tensor names, dtypes and config files of
DeepSeek-V3, Qwen3-MoE (per-expert and fused), Mixtral, gpt-oss and Nemotron-H (non-gated
experts, MoE layers only), at small sizes.

Used by `make demo`, `make bench` and the tests. Weights are random; each scheme makes its
own format's tensors and quantization config (`Scheme.synthetic`), this module the families'
names, configs and files.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..schemes import REGISTRY
from ..schemes.base import Synthetic
from ..schemes.bf16 import synthetic_bf16 as _bf16

FAMILIES = ("deepseek-v3", "qwen3-moe", "qwen3-moe-fused", "mixtral", "gpt-oss", "nemotron-h")


@dataclass
class Spec:
    family: str = "deepseek-v3"
    layers: int = 3
    dense_layers: int = 1  # leading layers with a dense MLP (DeepSeek's first_k_dense_replace)
    experts: int = 6
    hidden: int = 256
    intermediate: int = 256
    shards: int = 3
    vocab: int = 64
    seed: int = 0
    # weight format, a key of SOURCES (each scheme's `synthetic`): "bf16", "fp8-block"
    # (DeepSeek), "mxfp8" / "fp8-tensor" / "nvfp4" (ModelOpt), "fp8-tensor-ct" and the other
    # "-ct" (compressed-tensors), "mxfp4" (gpt-oss); default: fp8-block for DeepSeek, mxfp4
    # for gpt-oss, bf16 otherwise
    quant: str | None = None
    # config.json fields of the family's model beside the generated ones, e.g. a SwiGLU clamp
    # ({"swiglu_limit": 10.0}: what SGLang's DeepSeek MoE passes its experts)
    config: dict = field(default_factory=dict)
    # the attention's linears as (name, (out, in)), e.g. a real model's (the benchmarks'
    # whole models); default: q, k, v and o projections of (hidden, hidden)
    attention: tuple[tuple[str, tuple[int, int]], ...] | None = None
    dense_intermediate: int | None = None  # a dense MLP's (DeepSeek's layers before the MoE)
    # only the MoE layers' expert tensors (no embeddings, attention, norms, routers, shared
    # experts): the load-time proof's two-expert layer at a real model's sizes
    moe_only: bool = False


# each scheme's synthetic sources (`Scheme.synthetic`), by `Spec.quant` name
SOURCES: dict[str, Synthetic] = {
    quant: made for scheme in REGISTRY.values() for quant, made in scheme.synthetic.items()
}


def _config(spec: Spec, quant: str) -> dict:
    h, i, e = spec.hidden, spec.intermediate, spec.experts
    base = {
        "hidden_size": h,
        "num_hidden_layers": spec.layers,
        "vocab_size": spec.vocab,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    if spec.family == "deepseek-v3":
        cfg = {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "intermediate_size": spec.dense_intermediate or 2 * i,
            "moe_intermediate_size": i,
            "n_routed_experts": e,
            "n_shared_experts": 1,
            "num_experts_per_tok": min(2, e),
            "first_k_dense_replace": spec.dense_layers,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 2.5,
            **base,
        }
    elif spec.family == "gpt-oss":
        cfg = {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "intermediate_size": i,
            "num_local_experts": e,
            "num_experts_per_tok": min(4, e),
            "swiglu_limit": 7.0,
            "head_dim": 64,
            "sliding_window": 128,
            **base,
        }
    elif spec.family == "nemotron-h":  # every layer a MoE ("E"), no Mamba or attention
        cfg = {
            "architectures": ["NemotronHForCausalLM"],
            "model_type": "nemotron_h",
            "hybrid_override_pattern": "E" * spec.layers,
            "intermediate_size": 2 * i,
            "moe_intermediate_size": i,
            "moe_shared_expert_intermediate_size": i,
            "n_routed_experts": e,
            "n_shared_experts": 1,
            "num_experts_per_tok": min(2, e),
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "mlp_hidden_act": "relu2",
            "layer_norm_epsilon": 1e-5,
            **base,
        }
    elif spec.family == "mixtral":
        cfg = {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "intermediate_size": i,
            "num_local_experts": e,
            "num_experts_per_tok": min(2, e),
            **base,
        }
    else:
        cfg = {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "intermediate_size": 2 * i,
            "moe_intermediate_size": i,
            "num_experts": e,
            "num_experts_per_tok": min(2, e),
            "decoder_sparse_step": 1,
            "norm_topk_prob": True,
            **base,
        }
    made = SOURCES.get(quant)
    if made is not None and made.quantization_config is not None:
        cfg["quantization_config"] = copy.deepcopy(made.quantization_config)
    return cfg | copy.deepcopy(spec.config)


def _tensors(spec: Spec, quant: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors in order, made one layer (or one expert) at a time."""
    made = _all_tensors(spec, quant)
    if not spec.moe_only:
        return made
    return ((n, t) for n, t in made if ".experts." in n)


def _all_tensors(spec: Spec, quant: str) -> Iterator[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(spec.seed)
    h, i, e = spec.hidden, spec.intermediate, spec.experts
    made = SOURCES.get(quant)
    expert = made.make if made is not None and made.make is not None else _bf16
    mk = expert if made is not None and made.dense_too else _bf16  # non-expert linears
    bf = lambda *s: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16)  # noqa: E731
    bf_experts = bf
    if spec.moe_only:  # the other tensors are dropped (`_tensors`): not made at full size
        mk = lambda shape, g: {}  # noqa: E731
        bf = lambda *s: torch.zeros(0, dtype=torch.bfloat16)  # noqa: E731

    def parts(prefix: str, made: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        for k, v in made.items():
            yield f"{prefix}.{k}", v

    if spec.family == "nemotron-h":
        yield from _nemotron_h(spec, expert, mk, bf, g)
        return
    yield "model.embed_tokens.weight", bf(spec.vocab, h)
    for layer in range(spec.layers):
        p = f"model.layers.{layer}"
        yield f"{p}.input_layernorm.weight", torch.ones(h, dtype=torch.bfloat16)
        yield f"{p}.post_attention_layernorm.weight", torch.ones(h, dtype=torch.bfloat16)
        for proj, shape in spec.attention or [(n, (h, h)) for n in ("q", "k", "v", "o")]:
            name = proj if spec.attention else f"{proj}_proj"
            yield from parts(f"{p}.self_attn.{name}", mk(shape, g))
        moe = layer >= spec.dense_layers or spec.family != "deepseek-v3"
        if not moe:
            di = spec.dense_intermediate or 2 * i
            yield from parts(f"{p}.mlp.gate_proj", mk((di, h), g))
            yield from parts(f"{p}.mlp.up_proj", mk((di, h), g))
            yield from parts(f"{p}.mlp.down_proj", mk((h, di), g))
            continue
        if spec.family == "gpt-oss":
            yield from _gpt_oss_experts(p, e, h, i, g).items()
            continue
        if spec.family == "mixtral":
            yield f"{p}.block_sparse_moe.gate.weight", bf(e, h)
            for x in range(e):
                for w, shape in (("w1", (i, h)), ("w2", (h, i)), ("w3", (i, h))):
                    yield from parts(f"{p}.block_sparse_moe.experts.{x}.{w}", expert(shape, g))
            continue
        yield f"{p}.mlp.gate.weight", bf(e, h)
        if spec.family == "deepseek-v3":
            yield f"{p}.mlp.gate.e_score_correction_bias", torch.randn(e, generator=g)
            yield from parts(f"{p}.mlp.shared_experts.gate_proj", mk((i, h), g))
            yield from parts(f"{p}.mlp.shared_experts.up_proj", mk((i, h), g))
            yield from parts(f"{p}.mlp.shared_experts.down_proj", mk((h, i), g))
        if spec.family == "qwen3-moe-fused":
            yield f"{p}.mlp.experts.gate_up_proj", bf_experts(e, 2 * i, h)
            yield f"{p}.mlp.experts.down_proj", bf_experts(e, h, i)
            continue
        for x in range(e):
            one: dict[str, torch.Tensor] = {}
            for w, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
                one.update(parts(f"{p}.mlp.experts.{x}.{w}", expert(shape, g)))
            _share_global_scale(one, f"{p}.mlp.experts.{x}", differ=x == e - 1)
            yield from one.items()
    yield "model.norm.weight", torch.ones(h, dtype=torch.bfloat16)
    yield "lm_head.weight", bf(spec.vocab, h)


def _nemotron_h(spec: Spec, expert, mk, bf, g) -> Iterator[tuple[str, torch.Tensor]]:
    """Nemotron-H's names (transformers' NemotronHForCausalLM): MoE mixers of non-gated
    experts (up_proj, down_proj), a router with a correction bias and a shared expert."""
    h, i, e = spec.hidden, spec.intermediate, spec.experts
    yield "backbone.embeddings.weight", bf(spec.vocab, h)
    for layer in range(spec.layers):
        p = f"backbone.layers.{layer}"
        yield f"{p}.norm.weight", torch.ones(h, dtype=torch.bfloat16)
        yield f"{p}.mixer.gate.weight", bf(e, h)
        yield f"{p}.mixer.gate.e_score_correction_bias", torch.randn(e, generator=g)
        yield from _parts(f"{p}.mixer.shared_experts.up_proj", mk((i, h), g))
        yield from _parts(f"{p}.mixer.shared_experts.down_proj", mk((h, i), g))
        for x in range(e):
            one: dict[str, torch.Tensor] = {}
            for w, shape in (("up_proj", (i, h)), ("down_proj", (h, i))):
                one.update(_parts(f"{p}.mixer.experts.{x}.{w}", expert(shape, g)))
            yield from one.items()
    yield "backbone.norm_f.weight", torch.ones(h, dtype=torch.bfloat16)
    yield "lm_head.weight", bf(spec.vocab, h)


def _parts(prefix: str, made: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    for k, v in made.items():
        yield f"{prefix}.{k}", v


def _share_global_scale(t: dict, prefix: str, differ: bool) -> None:
    """NVFP4 exporters give gate and up one global scale; keep the last expert different.
    FP8 per-tensor exporters give them one activation scale (both read the same input), and
    vLLM keeps only one of the two: always shared."""
    for name in ("weight_scale_2", "weight_global_scale"):
        gate, up = f"{prefix}.gate_proj.{name}", f"{prefix}.up_proj.{name}"
        if gate in t and not differ:
            t[up] = t[gate].clone()
    gate, up = f"{prefix}.gate_proj.input_scale", f"{prefix}.up_proj.input_scale"
    scale = t.get(f"{prefix}.gate_proj.weight_scale")
    if gate in t and scale is not None and scale.dtype == torch.float32:
        t[up] = t[gate].clone()


def _gpt_oss_experts(p: str, e: int, h: int, i: int, g: torch.Generator) -> dict:
    """gpt-oss MXFP4 experts: rows of gate_up_proj interleave gate (even) and up (odd)."""

    def u8(*shape: int, lo: int = 0, hi: int = 256) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.uint8)

    def bias(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * 0.1).to(torch.bfloat16)

    x = f"{p}.mlp.experts"
    return {
        f"{p}.mlp.router.weight": (torch.randn(e, h, generator=g) * 0.02).to(torch.bfloat16),
        f"{p}.mlp.router.bias": bias(e),
        f"{x}.gate_up_proj_blocks": u8(e, 2 * i, h // 32, 16),
        f"{x}.gate_up_proj_scales": u8(e, 2 * i, h // 32, lo=118, hi=130),
        f"{x}.gate_up_proj_bias": bias(e, 2 * i),
        f"{x}.down_proj_blocks": u8(e, h, i // 32, 16),
        f"{x}.down_proj_scales": u8(e, h, i // 32, lo=118, hi=130),
        f"{x}.down_proj_bias": bias(e, h),
    }


def write_checkpoint(out: str | Path, spec: Spec | None = None) -> Path:
    """Write a checkpoint folder: sharded safetensors, index, config and tokenizer files."""
    spec = spec or Spec()
    if spec.family not in FAMILIES:
        raise ValueError(f"unknown family {spec.family!r}; one of {', '.join(FAMILIES)}")
    default = {"deepseek-v3": "fp8-block", "gpt-oss": "mxfp4"}
    quant = spec.quant or default.get(spec.family, "bf16")
    if quant not in SOURCES:
        raise ValueError(f"unknown quant {quant!r}; one of {', '.join(SOURCES)}")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    # the names first, from the same spec at a tiny size (the names do not depend on it), so
    # that each shard is made, written and let go in turn: never the whole checkpoint in memory
    small = tuple((n, (128, 128)) for n, _ in spec.attention) if spec.attention else None
    tiny = replace(spec, hidden=128, intermediate=128, vocab=8, attention=small)
    tiny = replace(tiny, dense_intermediate=None)
    count = sum(1 for _ in _tensors(tiny, quant))
    n = max(1, min(spec.shards, count))
    per = -(-count // n)
    weight_map, total = {}, 0
    made = _tensors(spec, quant)
    for k in range(n):
        part = {nm: v.contiguous() for nm, v in islice(made, per)}
        fname = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        save_file(part, root / fname, metadata={"format": "pt"})
        for nm, v in part.items():
            weight_map[nm] = fname
            total += v.numel() * v.element_size()
        del part
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    cfg = _config(spec, quant)
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    if cfg.get("quantization_config", {}).get("quant_method") == "modelopt":
        algo = cfg["quantization_config"]["quant_algo"]
        hq = {
            "producer": {"name": "modelopt", "version": "0.37.0"},
            "quantization": {
                "quant_algo": algo,
                "kv_cache_quant_algo": None,
                "exclude_modules": ["lm_head"],
                # as ModelOpt writes it (nvidia/DeepSeek-R1-FP4): vLLM requires it for NVFP4
                **({"group_size": 16} if algo == "NVFP4" else {}),
            },
        }
        (root / "hf_quant_config.json").write_text(json.dumps(hq, indent=2))
    (root / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    (root / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"})
    )
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    return root

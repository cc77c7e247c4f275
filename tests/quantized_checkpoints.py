"""Tiny quantized checkpoints of whole models: transformers writes the model (tests/
hf_checkpoints.py: its own tensor names, config keys and shards), then its linears are
replaced by a scheme's synthetic tensors (fi_convert.testing.synthetic: each scheme's own
format) and the config gets the scheme's quantization config, as the exporters write them:
DeepSeek FP8 block (every linear but the router and lm_head, as DeepSeek-V3 ships), ModelOpt
NVFP4, MXFP8 and FP8 per-tensor (the experts, the rest listed as ModelOpt lists them: `ignore`
in config.json, `exclude_modules` in hf_quant_config.json), gpt-oss MXFP4 (the fused experts
as `*_blocks` / `*_scales`, biases kept; gpt-oss's own `modules_to_not_convert`).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from fi_convert.testing.synthetic import SOURCES, _share_global_scale
from tests import hf_checkpoints

# (MiniMax-M2's experts are named as Mixtral's: w1, w2, w3)
EXPERT = re.compile(r"^(.*\.experts\.\d+)\.((gate|up|down)_proj|w1|w2|w3)\.weight$")
# the other linears DeepSeek-V3's FP8 checkpoints quantize (attention, dense and shared MLPs)
DENSE = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\..*_proj(_with_mqa)?\.weight$")
# DeepSeek-V3.2's indexer as its FP8 checkpoint holds it: wq_b and wk quantized, weights_proj
# not (vLLM builds wq_b with the checkpoint's quantization, weights_proj without)
INDEXER_FP8 = re.compile(r"\.self_attn\.indexer\.(wq_b|wk)\.weight$")
INDEXER_BF16 = re.compile(r"\.self_attn\.indexer\.weights_proj\.weight$")
# keys of the released models' config.json that transformers' config classes do not write,
# and SGLang's model classes read (DeepSeek-V3's `moe_layer_freq`)
RELEASED_KEYS = {
    "deepseek_v32": {"moe_layer_freq": 1, "ep_size": 1},
    "deepseek_v3": {
        "moe_layer_freq": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "ep_size": 1,
    },
}
# ModelOpt: what the exporters leave unquantized here (SGLang's fnmatch-style patterns), and
# per model the dense MLPs (DeepSeek-V3's layer 0; Qwen3-MoE's layer 0 is MoE, its experts
# quantized: SGLang's ModelOpt FP8 would build them unquantized if listed)
MODELOPT_EXCLUDE = [
    "lm_head",
    "model.layers.*.self_attn*",
    "model.layers.*.mlp.gate",
    "model.layers.*.mlp.shared_experts*",
]
DENSE_EXCLUDE = {
    "deepseek_v3": ["model.layers.0.mlp*"],
    "deepseek_v32": ["model.layers.0.mlp*"],
    "glm4_moe": ["model.layers.0.mlp*"],
    # Nemotron-H's names (backbone.layers.L.mixer.*): the Mamba and attention mixers (tests/
    # hf_checkpoints.py's layers 0 and 2: vLLM fuses q, k, v, which it matches by the module),
    # the router and the shared expert
    "nemotron_h": [
        "backbone.layers.0.mixer*",
        "backbone.layers.2.mixer*",
        "backbone.layers.*.mixer.gate",
        "backbone.layers.*.mixer.shared_experts*",
    ],
}


def write(
    kind: str,
    root: Path,
    quant: str,
    in_config: bool = True,
    nextn: bool = False,
    **sizes: object,
) -> Path:
    """transformers' model `kind` (hf_checkpoints.MODELS) at `sizes`, its linears in the
    format `quant` (a key of fi_convert.testing.synthetic.SOURCES). `in_config`: ModelOpt's
    quantization config in config.json too (newer exports), else in hf_quant_config.json only
    (older ones, nvidia/DeepSeek-R1-FP4). `nextn`: with DeepSeek-V3's multi-token-prediction
    layer after the decoder layers (its layer 61), which transformers does not write."""
    hf_checkpoints.save(kind, root, **sizes)
    g = torch.Generator().manual_seed(1)
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard_of: dict[str, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        for name, t in load_file(root / shard).items():
            for new, v in _quantized(name, t, quant, g).items():
                tensors[new], shard_of[new] = v, shard
    _share_scales(tensors)
    if nextn:
        _add_nextn(tensors, shard_of)
    for shard in sorted(set(shard_of.values())):
        part = {n: t.contiguous() for n, t in tensors.items() if shard_of[n] == shard}
        save_file(part, root / shard, metadata={"format": "pt"})
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    index_path.write_text(
        json.dumps({"metadata": {"total_size": size}, "weight_map": shard_of}, indent=2)
    )
    exclude = MODELOPT_EXCLUDE + DENSE_EXCLUDE.get(kind, [])
    _write_config(root, quant, RELEASED_KEYS.get(kind, {}), in_config, exclude)
    return root


def _quantized(name: str, t: torch.Tensor, quant: str, g: torch.Generator) -> dict:
    """One checkpoint tensor as the quantized checkpoint holds it (one or several)."""
    made = SOURCES[quant]
    if quant == "mxfp4":
        return _gpt_oss(name, t, g)
    dense = (DENSE.match(name) and not INDEXER_BF16.search(name)) or INDEXER_FP8.search(name)
    if EXPERT.match(name) or (made.dense_too and dense):
        stem = name.removesuffix(".weight")
        assert made.make is not None
        return {f"{stem}.{k}": v for k, v in made.make(tuple(t.shape), g).items()}
    return {name: t}


def _gpt_oss(name: str, t: torch.Tensor, g: torch.Generator) -> dict:
    """gpt-oss's fused BF16 experts ([E, H, 2I], [E, I, H]) as its MXFP4 checkpoints hold
    them: `*_blocks` [E, N, K/32, 16] and UE8M0 `*_scales` [E, N, K/32] over [E, N, K]."""
    if not name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
        return {name: t}
    e, k, n = t.shape
    blocks = torch.randint(0, 256, (e, n, k // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(118, 130, (e, n, k // 32), generator=g, dtype=torch.uint8)
    return {f"{name}_blocks": blocks, f"{name}_scales": scales}


def _share_scales(tensors: dict[str, torch.Tensor]) -> None:
    """NVFP4: gate and up share their global scale but in the last expert of each layer, as
    the synthetic writer has them (fi_convert.testing.synthetic); NVFP4 and FP8 per-tensor:
    always their input scale, as ModelOpt exports the linears that read one input. (SGLang's
    DeepSeek loader runs the weight loaders of host tensors on a thread pool, and gate's and
    up's input scales land in one slot of `w13_input_scale`: where they differ, which one
    SGLang keeps is a race.)"""
    layers: dict[str, list[str]] = {}
    for name in tensors:
        if m := GATE_SCALE.match(name):
            layers.setdefault(m.group(1), []).append(m.group(2))
    for layer, ids in layers.items():
        last = max(ids, key=int)
        for x in ids:
            stem = f"{layer}.{x}"
            one = {n: t for n, t in tensors.items() if n.startswith(stem + ".")}
            _share_global_scale(one, stem, differ=x == last)
            one[f"{stem}.up_proj.input_scale"] = one[f"{stem}.gate_proj.input_scale"].clone()
            tensors.update(one)


GATE_SCALE = re.compile(r"^(.*\.experts)\.(\d+)\.gate_proj\.input_scale$")


def _add_nextn(tensors: dict[str, torch.Tensor], shard_of: dict[str, str]) -> None:
    """DeepSeek-V3's NextN layer, `model.layers.N` of N decoder layers, in the last shard: a
    decoder layer (here a copy of the last one, its MoE experts included) and the NextN
    module's own tensors, named as DeepSeek-V3's checkpoint names them."""
    n = 1 + max(int(m.group(1)) for name in tensors if (m := _LAYER.match(name)))
    vocab, h = tensors["model.embed_tokens.weight"].shape
    last, shard = f"model.layers.{n - 1}.", max(shard_of.values())
    layer = {
        f"model.layers.{n}.{name[len(last) :]}": t.clone()
        for name, t in tensors.items()
        if name.startswith(last)
    }
    own = {"enorm.weight": (h,), "hnorm.weight": (h,), "eh_proj.weight": (h, 2 * h)}
    own |= {"shared_head.norm.weight": (h,), "shared_head.head.weight": (vocab, h)}
    own |= {"embed_tokens.weight": (vocab, h)}
    g = torch.Generator().manual_seed(2)
    for name, shape in own.items():
        layer[f"model.layers.{n}.{name}"] = torch.randn(shape, generator=g).to(torch.bfloat16)
    tensors.update(layer)
    shard_of.update(dict.fromkeys(layer, shard))


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _write_config(
    root: Path, quant: str, released: dict, in_config: bool, exclude: list[str]
) -> None:
    """The quantization config: ModelOpt's in hf_quant_config.json (`exclude_modules`) and,
    `in_config`, in config.json as ModelOpt's export converts it there (its
    `convert_hf_quant_config_format`: the list as `ignore`, which SGLang's ModelOpt FP8 config
    reads alone)."""
    cfg = json.loads((root / "config.json").read_text()) | released
    qc = copy.deepcopy(SOURCES[quant].quantization_config) or {}
    if qc.get("quant_method") == "modelopt":
        if qc["quant_algo"] == "NVFP4":
            qc["group_size"] = 16
        section = {k: v for k, v in qc.items() if k != "quant_method"}
        hq = {
            "producer": {"name": "modelopt", "version": "0.37.0"},
            "quantization": section | {"exclude_modules": exclude},
        }
        (root / "hf_quant_config.json").write_text(json.dumps(hq, indent=2))
        qc["ignore"] = exclude
    if in_config or qc.get("quant_method") != "modelopt":
        cfg["quantization_config"] = qc
    (root / "config.json").write_text(json.dumps(cfg, indent=2))


# Quantized forms of the families as their publishers write them, by the public checkpoint
# each follows: which linears are quantized (`EXPERT`, and `DENSE` with `dense`), the tensors of
# each, and config.json's `quantization_config`
@dataclass(frozen=True)
class Published:
    make: Callable[[tuple[int, int], torch.Generator, torch.dtype], dict[str, torch.Tensor]]
    quantization_config: dict
    # the other linears quantized too (`DENSE`: attention, dense and shared MLPs; not routers)
    dense: re.Pattern | None = None


def _fp8_static(shape: tuple[int, int], g: torch.Generator, _: torch.dtype) -> dict:
    """One linear of FP8 static per tensor: E4M3 weight, F32 weight_scale and input_scale."""
    return SOURCES["fp8-tensor"].make(shape, g)  # type: ignore[misc]


def _fp8_block_ct(shape: tuple[int, int], g: torch.Generator, dtype: torch.dtype) -> dict:
    """One linear of compressed-tensors' FP8 block strategy: E4M3 weight, a weight_scale per
    128x128 block (no weight_scale_inv: compressed-tensors names it weight_scale)."""
    n, k = shape
    w = (torch.randn(shape, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand((-(-n // 128), -(-k // 128)), generator=g) * 1e-3 + 1e-4
    return {"weight": w, "weight_scale": s.to(dtype)}


def _nvfp4_ct(shape: tuple[int, int], g: torch.Generator, _: torch.dtype) -> dict:
    return SOURCES["nvfp4-ct"].make(shape, g)  # type: ignore[misc]


_CT_GROUP = {"targets": ["Linear"], "output_activations": None}
PUBLISHED = {
    # tencent/Hunyuan-A13B-Instruct-FP8: AngelSlim's fp8_static (weights and activations per
    # tensor, calibrated) over every linear but the routers and lm_head, saved for vLLM's "fp8"
    # method (AngelSlim's PTQ save: quant_method fp8, activation_scheme static, ignored_layers)
    "fp8-static": Published(
        _fp8_static,
        {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]},
        dense=DENSE,
    ),
    # poolside/Laguna-XS.2-FP8: LLM Compressor's FP8_BLOCK (compressed-tensors: weights per
    # 128x128 block, activations dynamic per group of 128) on the routed experts, the rest BF16
    "fp8-block-ct": Published(
        _fp8_block_ct,
        {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": _CT_GROUP
                | {
                    "format": "float-quantized",
                    "weights": {
                        "num_bits": 8,
                        "type": "float",
                        "symmetric": True,
                        "strategy": "block",
                        "block_structure": [128, 128],
                        "dynamic": False,
                    },
                    "input_activations": {
                        "num_bits": 8,
                        "type": "float",
                        "symmetric": True,
                        "strategy": "group",
                        "group_size": 128,
                        "dynamic": True,
                    },
                }
            },
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$", "re:.*shared_expert.*"],
        },
    ),
    # poolside/Laguna-XS.2-NVFP4: compressed-tensors NVFP4 (LLM Compressor's preset) on the
    # MLPs' linears, the routed experts, the shared expert and the dense MLP (vLLM's
    # models/laguna.py loads the dense MLP's gate and up "per-Linear" NVFP4 global scales), the
    # attention and routers BF16
    "nvfp4-ct": Published(
        _nvfp4_ct,
        copy.deepcopy(SOURCES["nvfp4-ct"].quantization_config or {})
        | {"ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$"]},
        dense=re.compile(
            r"^model\.layers\.\d+\.mlp\.(shared_expert\.)?(gate|up|down)_proj\.weight$"
        ),
    ),
}


def write_published(
    kind: str, root: Path, form: str, scale_dtype: torch.dtype = torch.bfloat16, **sizes: object
) -> Path:
    """transformers' model `kind` at `sizes`, its linears as the public checkpoint of `form`
    (a key of PUBLISHED) holds them; `scale_dtype`: that of compressed-tensors' block scales."""
    pub = PUBLISHED[form]
    hf_checkpoints.save(kind, root, **sizes)
    g = torch.Generator().manual_seed(1)
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    weight_map: dict[str, str] = {}
    size = 0
    for shard in sorted(set(index["weight_map"].values())):
        out: dict[str, torch.Tensor] = {}
        for name, t in load_file(root / shard).items():
            dense = pub.dense and pub.dense.match(name)
            if EXPERT.match(name) or dense:
                stem = name.removesuffix(".weight")
                made = pub.make(tuple(t.shape), g, scale_dtype)  # type: ignore[arg-type]
                out |= {f"{stem}.{k}": v.contiguous() for k, v in made.items()}
            else:
                out[name] = t
        save_file(out, root / shard, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(out, shard)
        size += sum(t.numel() * t.element_size() for t in out.values())
    index_path.write_text(json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map}))
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization_config"] = copy.deepcopy(pub.quantization_config)
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    return root

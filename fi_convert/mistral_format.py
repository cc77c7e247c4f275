"""Mistral's own checkpoint format, as Mistral Large 3 is published (mistralai/Mistral-Large-
3-675B-*): `params.json` in place of `config.json`, `consolidated-0000K-of-0000N.safetensors`
shards indexed by `consolidated.safetensors.index.json`, and Mistral's tensor names
(`layers.L.experts.E.w1.weight`; FP8 per-tensor scales `qscale_weight`, `qscale_act`).

fi-convert reads `params.json` as it is: a family's `config_keys` name its fields (dotted
where nested: `moe.num_experts`). Two things `params.json` implies rather than says are added,
as Mistral's format defines them and both vLLM's reader
(`vllm/transformers_utils/configs/mistral.py`, `adapt_config_dict`) and TensorRT-LLM's apply
them: the architecture (a `moe` section with shared experts is Mistral Large 3,
`MistralLarge3ForCausalLM`; with a vision encoder, `vision_encoder` or
`multimodal.vision_encoder_args`, the model as published whole, which both servers build as
`PixtralForConditionalGeneration` around it), and the quantization
(`quantization.qformat_weight` "fp8_e4m3": FP8 with per-tensor scales, static activation
scales unless `qscheme_act` is "NO_SCALES"; a compressed-tensors config as it is). The output
keeps the format's `params.json` (marked, `format.config_marker.mark_params`) beside the
format's usual shards.
"""

from __future__ import annotations

from pathlib import Path

from .errors import SourceError

PARAMS_NAME = "params.json"
INDEX_NAME = "consolidated.safetensors.index.json"
SHARD_GLOB = "consolidated*.safetensors"
QUANT_KEY = "quantization"
# the fields of params.json fi-convert needs of a Mistral MoE checkpoint, and what each is
REQUIRED = {
    "dim": "the hidden size",
    "moe": "the MoE section",
    "moe.num_experts": "the routed expert count",
    "moe.expert_hidden_dim": "the experts' intermediate size",
}
LARGE_3 = "MistralLarge3ForCausalLM"
PIXTRAL = "PixtralForConditionalGeneration"


def is_mistral(root: Path) -> bool:
    """A folder in Mistral's format: params.json and no config.json."""
    cfg = root / "config.json"
    return not (cfg.exists() or cfg.is_symlink()) and (root / PARAMS_NAME).is_file()


def _get(params: dict, key: str) -> object:
    node: object = params
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def config(params: dict, path: Path) -> dict:
    """The config fi-convert reads for a Mistral-format checkpoint whose params.json (at
    `path`) holds `params`: its own fields, with `architectures` and `quantization_config` as
    the format implies them. A MoE params.json without a field fi-convert needs is refused,
    naming it."""
    cfg = dict(params)
    moe = params.get("moe")
    if moe is not None:
        for key, what in REQUIRED.items():
            value = _get(params, key)
            kind = dict if key == "moe" else int
            if not isinstance(value, kind) or isinstance(value, bool):
                have = "no" if value is None else f"a {type(value).__name__} for"
                raise SourceError(
                    f"{path}: {have} '{key}' ({what}); Mistral's format keeps it there - "
                    "restore the model's params.json (e.g. `hf download <repo> params.json "
                    f"--local-dir {path.parent}`)"
                )
        shared = _get(params, "moe.num_shared_experts")
        if isinstance(shared, int) and shared > 0:
            vision = params.get("vision_encoder") or _get(params, "multimodal.vision_encoder_args")
            cfg["architectures"] = [PIXTRAL if vision else LARGE_3]
    quant = params.get(QUANT_KEY)
    if quant:
        cfg["quantization_config"] = _quantization(quant, path)
    return cfg


def _quantization(quant: object, path: Path) -> dict:
    """params.json's `quantization` as the quantization config it stands for."""
    if isinstance(quant, dict) and quant.get("qformat_weight") == "fp8_e4m3":
        act = quant.get("qscheme_act")
        if act not in ("NO_SCALES", "TENSOR", None):
            raise SourceError(
                f"{path}: quantization.qscheme_act {act!r} is no activation scheme of "
                "Mistral's FP8 format (TENSOR or NO_SCALES); restore the model's params.json"
            )
        dynamic = act == "NO_SCALES"
        return {"quant_method": "fp8", "activation_scheme": "dynamic" if dynamic else "static"}
    method = str(quant.get("quant_method", "")) if isinstance(quant, dict) else ""
    if isinstance(quant, dict) and method.lower().replace("_", "-") == "compressed-tensors":
        return {**quant, "quant_method": "compressed-tensors"}
    raise SourceError(
        f"{path}: quantization {quant!r} is no format of Mistral's fi-convert reads (FP8: "
        'qformat_weight "fp8_e4m3"; compressed-tensors); restore the model\'s params.json'
    )

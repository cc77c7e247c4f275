"""The output's `config.json`: the source's, with one change that keeps a server from loading
FlashInfer layouts as if they were the source's weights.

Stock vLLM (and transformers) given an output would build the source's model, find no tensor
named as the source's experts, and serve uninitialized experts without a word (measured with
vLLM 0.32: token 0 at every step). So the output's `quantization_config` names a method no
server has, `fi-convert`, which stock vLLM and transformers refuse at once ("Unknown
quantization method: fi-convert"), and keeps the source's own under
`source_quantization_config`. Every other field, and the file's validity for any config
reader, is the source's. fi-convert's vLLM plugin puts the source's back, for
`--load-format fi-convert` only. The facts about serving an output are its server's
(`fi_convert/servers/<name>/target.py`).
"""

from __future__ import annotations

import json
from typing import Any

METHOD = "fi-convert"
SOURCE_KEY = "source_quantization_config"
# the field of a Mistral-format params.json that holds its quantization (marked like config.json's)
PARAMS_QUANT_KEY = "quantization"


def mark(config: dict, note: str) -> bytes:
    """The output's config.json for the source's parsed `config` (the checkpoint's), with the
    server's `note` on how to serve it (`ServerTarget.marker_note`)."""
    cfg = dict(config)
    cfg["quantization_config"] = {
        "quant_method": METHOD,
        "note": note,
        SOURCE_KEY: config.get("quantization_config"),
    }
    return (json.dumps(cfg, indent=2) + "\n").encode()


def mark_params(params: dict, note: str) -> bytes:
    """The output's params.json for a source in Mistral's own format (`params`, its
    params.json as read): its `quantization` marked the same way, the source's kept under
    `source_quantization_config` (Mistral's own form, or None). Stock vLLM refuses a
    quantization it does not know ("Found unknown quantization"); fi-convert's plugin puts the
    source's back (servers/vllm/mistral.py)."""
    cfg = dict(params)
    cfg[PARAMS_QUANT_KEY] = {
        "quant_method": METHOD,
        "note": note,
        SOURCE_KEY: params.get(PARAMS_QUANT_KEY) or None,
    }
    return (json.dumps(cfg, indent=2) + "\n").encode()


def is_marked(quant_config: Any) -> bool:
    return isinstance(quant_config, dict) and quant_config.get("quant_method") == METHOD


def source_quantization_config(quant_config: dict) -> dict | None:
    """The source's quantization config a marked one keeps (None for an unquantized source)."""
    return quant_config.get(SOURCE_KEY)

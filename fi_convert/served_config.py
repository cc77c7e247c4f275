"""The output's `config.json`: the source's, with one change that keeps a server from loading
FlashInfer layouts as if they were the source's weights.

Stock vLLM (and transformers) given an output would build the source's model, find no tensor
named as the source's experts, and serve uninitialized experts without a word (measured with
vLLM 0.32: token 0 at every step). So the output's `quantization_config` names a method no
server has, `fi-convert`, which stock vLLM and transformers refuse at once ("Unknown
quantization method: fi-convert"), and keeps the source's own under
`source_quantization_config`. Every other field, and the file's validity for any config
reader, is the source's. fi-convert's vLLM plugin puts the source's back, for
`--load-format fi-convert` only.
"""

from __future__ import annotations

import json
from typing import Any

METHOD = "fi-convert"
SOURCE_KEY = "source_quantization_config"
NOTE = (
    "MoE experts pre-shuffled into FlashInfer kernel layouts by fi-convert: serve with "
    "`vllm serve DIR --load-format fi-convert` (fi-convert's vLLM plugin: fi-convert installed "
    "with its vllm extra)"
)


def mark(config: dict) -> bytes:
    """The output's config.json for the source's parsed `config` (the checkpoint's)."""
    cfg = dict(config)
    cfg["quantization_config"] = {
        "quant_method": METHOD,
        "note": NOTE,
        SOURCE_KEY: config.get("quantization_config"),
    }
    return (json.dumps(cfg, indent=2) + "\n").encode()


def is_marked(quant_config: Any) -> bool:
    return isinstance(quant_config, dict) and quant_config.get("quant_method") == METHOD


def source_quantization_config(quant_config: dict) -> dict | None:
    """The source's quantization config a marked one keeps (None for an unquantized source)."""
    return quant_config.get(SOURCE_KEY)


MOE_BACKEND_FLAG = {"trtllm": "flashinfer_trtllm", "cutlass": "flashinfer_cutlass"}
# mxfp4/cutlass is vLLM's MXFP8-activation CUTLASS path, which vLLM picks from this override
MXFP8_ACTIVATION = """--quantization-config '{"moe": {"activation": "mxfp8"}}'"""


# Schemes whose experts fi-convert's vLLM plugin serves under expert parallelism, from a
# --tp-size 1 output at any EP size (vllm_plugin.checks says why the others are refused).
EP_SCHEMES = ("bf16", "fp8-block")


def serve_command(where: str, scheme: str, backend: str, tp: int, ep: int = 0) -> str:
    """The `vllm serve` line for an output (a folder or a Hub repo id) with fi-convert's plugin;
    with `ep`, on that many GPUs with expert parallelism (a tp 1 output of EP_SCHEMES)."""
    cmd = f"vllm serve {where} --load-format fi-convert -tp {ep or tp} "
    if ep:
        cmd += "--enable-expert-parallel "
    cmd += f"--moe-backend {MOE_BACKEND_FLAG.get(backend, backend)}"
    if (scheme, backend) == ("mxfp4", "cutlass"):
        cmd += " " + MXFP8_ACTIVATION
    return cmd

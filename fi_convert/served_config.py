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
# --tp-size 1 output at any EP size (servers.vllm.checks says why the others are refused).
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


# What an output targets: the vLLM and FlashInfer releases whose load-time processing gives its
# bytes, and the GPUs where vLLM runs its backend.
TARGET = {
    "vllm": "0.33.0",
    "flashinfer": "0.7.2.post1",
    "flashinfer_layouts": "0.6.18-0.7.4",
    # PEP 440 specifiers of the releases whose load-time processing gives these bytes: a
    # loader refuses any other (a layout can change in any release, patch releases included)
    "vllm_versions": "==0.33.0",
    "flashinfer_versions": ">=0.6.18,<0.7.5",
}
# Where vLLM 0.33 runs each FlashInfer backend and scheme: TRT-LLM on the SM10x family only
# (is_device_capability_family(100)); CUTLASS (FlashInferExperts._supports_current_device and
# _supports_quant_scheme) on SM90, SM10x and SM12x, never SM11x: block FP8 on SM90 only, NVFP4
# and MXFP4 x MXFP8 on SM100 and later ("sm100+": SM10x, SM12x), BF16 and static per-tensor
# FP8 on SM90 and later ("sm90+": SM90, SM10x, SM12x). vLLM has no CUTLASS MXFP8 path.
GPU_FAMILY = {
    ("trtllm", None): "sm100",
    ("cutlass", "fp8-block"): "sm90",
    ("cutlass", "nvfp4"): "sm100+",
    ("cutlass", "mxfp4"): "sm100+",  # FLASHINFER_CUTLASS_MXFP4_MXFP8
    ("cutlass", None): "sm90+",  # bf16, fp8-tensor
}


def gpu_family_of(backend: str, scheme: str) -> str:
    return GPU_FAMILY.get((backend, scheme)) or GPU_FAMILY[(backend, None)]

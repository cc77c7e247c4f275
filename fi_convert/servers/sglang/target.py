"""What an SGLang output is, as facts: the manifest field that names an output's server, the
SGLang and FlashInfer releases whose bytes an SGLang output holds, the flags that serve it, and
what the plugin loads today. It imports no SGLang (the converter and the tests read it without
SGLang installed).

An output is for one server: the manifest's top-level `server` field ("vllm" or "sglang").
A manifest without it was written before the field existed, by the vLLM-only converter: it is
a vLLM output (`server_of`). The converter writes `server` and SGLang's `target` below once it
has `--server sglang`; until then the tests mark a converted output as SGLang's themselves
(`sglang_fields`), only in the cases whose bytes are proven equal to SGLang's own
(tests/test_sglang.py: BF16 on FlashInfer CUTLASS at every TP, on TRT-LLM where I/TP is a
multiple of 128).
"""

from __future__ import annotations

SERVER_FIELD = "server"  # the manifest's top-level field naming the output's server
SGLANG = "sglang"
VLLM = "vllm"
DEFAULT_SERVER = VLLM  # a manifest without SERVER_FIELD: written before it existed, for vLLM

LOAD_FORMAT = "fi-convert"  # python -m sglang.launch_server ... --load-format fi-convert
ENTRY_POINT_GROUP = "sglang.srt.plugins"  # SGLang's general-plugin entry points
ENV_ALLOW_LIST = "SGLANG_PLUGINS"  # SGLang's optional allow-list of plugin names
PLUGIN_NAME = "fi_convert"  # the entry point's name (what SGLANG_PLUGINS must list, if set)

# The releases whose load-time processing gives an SGLang output's bytes, as the manifest's
# `target` holds them (PEP 440 specifiers: the plugin refuses any other release).
# SGLang 0.5.23 pins flashinfer-python 0.7.2; FlashInfer's MoE byte layouts are the same from
# 0.6.18 through 0.7.4 (shared/SPEC.md).
TARGET = {
    "sglang": "0.5.23",
    "sglang_versions": "==0.5.23",
    "flashinfer": "0.7.2",
    "flashinfer_layouts": "0.6.18-0.7.4",
    "flashinfer_versions": ">=0.6.18,<0.7.5",
}

# --moe-runner-backend for each fi-convert backend
MOE_RUNNER_BACKEND = {"trtllm": "flashinfer_trtllm", "cutlass": "flashinfer_cutlass"}

# What the plugin loads, by (scheme, backend): the SGLang MoE method whose end state it builds
# (class name), each proven against SGLang's own processing (tests/test_sglang_plugin.py).
METHODS = {
    ("bf16", "trtllm"): "UnquantizedFusedMoEMethod",
    ("bf16", "cutlass"): "UnquantizedFusedMoEMethod",
}

# Where SGLang 0.5.23 runs FlashInfer's MoE kernels (as fi-convert's manifests name families):
# TRT-LLM-gen on the SM10x family only; CUTLASS BF16 on SM90, SM10x and SM12x.
GPU_FAMILY = {("bf16", "trtllm"): "sm100", ("bf16", "cutlass"): "sm90+"}


def server_of(manifest: dict) -> str:
    """The server an output is for (a manifest without the field: vLLM's)."""
    return str(manifest.get(SERVER_FIELD, DEFAULT_SERVER))


def sglang_fields(scheme: str, backend: str) -> dict:
    """The manifest fields that make an output SGLang's: `server` and `target` (the converter
    writes them with --server sglang; today the tests add them to a converted output)."""
    target = dict(TARGET)
    family = GPU_FAMILY.get((scheme, backend))
    if family is not None:
        target["gpu_family"] = family
    return {SERVER_FIELD: SGLANG, "target": target}


def launch_command(where: str, backend: str, tp: int) -> str:
    """The SGLang line that serves an output (a folder or a Hub repo id)."""
    cmd = f"python -m sglang.launch_server --model-path {where} --load-format {LOAD_FORMAT} "
    cmd += f"--moe-runner-backend {MOE_RUNNER_BACKEND.get(backend, backend)}"
    return cmd + (f" --tp {tp}" if tp != 1 else "")

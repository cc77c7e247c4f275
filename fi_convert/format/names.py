"""The files of an fi-convert output folder, and the format's name and version."""

from __future__ import annotations

FORMAT = "fi-convert"
# 2: nvfp4 g1_scale_c is vLLM's g1_alphas * (1 / a2) and CUTLASS scale_2 are folded;
# target.vllm_versions / flashinfer_versions say which releases the layouts match.
FORMAT_VERSION = 2
MANIFEST_NAME = "fi-convert-manifest.json"  # written last: no manifest, no finished output
STATE_DIR = ".fi-convert"  # a run's journal and lock, inside the out-dir
INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"

# The manifest's top-level field naming the server whose load-time result the bytes are
# ("vllm", "sglang"). A manifest without it was written before it existed, for vLLM.
SERVER_FIELD = "server"
DEFAULT_SERVER = "vllm"


def server_of(manifest: dict) -> str:
    """The server an output is for (a manifest without the field: vLLM's)."""
    return str(manifest.get(SERVER_FIELD, DEFAULT_SERVER))

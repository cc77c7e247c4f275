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


# An output for several servers whose bytes are the same (`--server vllm,sglang`) lists them
# all, the first being `server`, with each one's target.
SERVERS_FIELD = "servers"
TARGETS_FIELD = "targets"


def servers_of(manifest: dict) -> list[str]:
    """Every server an output is for (its `servers`, else its one `server`)."""
    names = manifest.get(SERVERS_FIELD)
    if isinstance(names, list) and names:
        return [str(n) for n in names]
    return [server_of(manifest)]


def target_of(manifest: dict, name: str) -> dict:
    """The `target` (releases, version ranges, GPU family) of server `name` in the manifest:
    its entry of `targets` in an output for several servers, else `target`."""
    targets = manifest.get(TARGETS_FIELD)
    if isinstance(targets, dict) and isinstance(targets.get(name), dict):
        return targets[name]
    target = manifest.get("target")
    return target if isinstance(target, dict) else {}

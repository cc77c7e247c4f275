"""The servers that load fi-convert's outputs, one package each (`vllm/`: the vLLM plugin and
every vLLM fact; `sglang/`: the same for SGLang), and the registry of their facts by name.

A server's package holds a facts module (`<name>/target.py`, a `fi_convert.target.
ServerTarget`) that imports no server, and the server's plugin, which imports it at run time.
The core never imports this package: it names a server, and `fi_convert.server_lookup` looks
it up here. A server's package imports the core's `format/`, `target` and leaf modules only,
and its plugin `hub.fetch` (a repo id served: the Hub's small modules, no converter code).
"""

from __future__ import annotations

from ..errors import FiConvertError
from ..target import ServerTarget
from .sglang.target import SGLANG_TARGET
from .vllm.target import VLLM

TARGETS: dict[str, ServerTarget] = {"vllm": VLLM, "sglang": SGLANG_TARGET}


def get(name: str) -> ServerTarget:
    server, sep, release = name.partition("==")
    if sep and server in TARGETS:  # `--server sglang==0.5.22`: one output serves many releases
        raise FiConvertError(
            f"--server takes a server's name, not a release: drop '=={release}'. An output for "
            f"--server {server} serves every {server} release proven to hold its layout (its "
            f"manifest lists them; `fi-convert inspect SRC --server {server}` shows them before "
            "converting), and a release it does not list is proven at load on its own code"
        )
    if name not in TARGETS:
        raise FiConvertError(
            f"server {name!r} is not one fi-convert converts for (available: {', '.join(TARGETS)})"
        )
    return TARGETS[name]

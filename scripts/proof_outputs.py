"""Small fi-convert outputs of every scheme x backend a server's plugin loads, for proving a
server release on them (`fi-convert verify OUT --server SERVER`; examples/ci/release-watch.yml):

    python scripts/proof_outputs.py vllm OUT_ROOT [--tp-size 2]

Writes OUT_ROOT/src-SCHEME (a synthetic source, fi_convert.testing) and OUT_ROOT/SCHEME-BACKEND
(its output for SERVER), then prints each output folder on a line. Sizes are small (H 256) but
need the padding rules of each scheme at TP 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.testing.synthetic import Spec, write_checkpoint

# The source of each scheme: (family, quant, intermediate size); H 256, three experts
SOURCES = {
    "bf16": ("qwen3-moe", "bf16", 384),
    "fp8-block": ("deepseek-v3", "fp8-block", 512),
    "fp8-tensor": ("qwen3-moe", "fp8-tensor", 384),
    "mxfp8": ("qwen3-moe", "mxfp8", 256),
    "nvfp4": ("deepseek-v3", "nvfp4", 256),
    "mxfp4": ("gpt-oss", "mxfp4", 256),
}


def pairs(server: str) -> list[tuple[str, str]]:
    """The (scheme, backend) pairs the server's plugin loads (its checks; no server import)."""
    if server == "vllm":
        from fi_convert.servers.vllm.checks import SUPPORTED
    else:
        from fi_convert.servers.sglang.checks import METHODS as SUPPORTED
    return sorted(SUPPORTED)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("server", choices=("vllm", "sglang"))
    ap.add_argument("root", type=Path)
    ap.add_argument("--tp-size", type=int, default=2)
    args = ap.parse_args()
    sources: dict[str, Path] = {}
    for scheme, backend in pairs(args.server):
        family, quant, inter = SOURCES[scheme]
        if scheme not in sources:
            spec = Spec(family, layers=2, experts=3, hidden=256, intermediate=inter, quant=quant)
            sources[scheme] = write_checkpoint(args.root / f"src-{scheme}", spec)
        out = args.root / f"{scheme}-{backend}"
        opts = Options(SchemeName(scheme), Backend(backend), args.tp_size, server=args.server)
        convert(sources[scheme], out, opts, device="cpu", overwrite=True)
        print(out, flush=True)


if __name__ == "__main__":
    main()

"""Write a small synthetic MoE checkpoint: `python scripts/make_checkpoint.py FAMILY OUT [k=v ...]`.

FAMILY is one of deepseek-v3, qwen3-moe, qwen3-moe-fused, mixtral, gpt-oss; k=v set fields of
`fi_convert.testing.synthetic.Spec` (layers, experts, hidden, intermediate, shards, seed, and quant:
bf16, fp8-block, fp8-tensor, fp8-tensor-ct, mxfp8, nvfp4, nvfp4-ct).
"""

import sys

from fi_convert.testing.synthetic import Spec, write_checkpoint

if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    kw = {k: int(v) if v.isdigit() else v for k, v in (a.split("=", 1) for a in sys.argv[3:])}
    print(write_checkpoint(sys.argv[2], Spec(family=sys.argv[1], **kw)))

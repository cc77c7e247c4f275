"""fi-convert's stand-in for vLLM's compiled ops, which scripts/carry_for_device.sh leaves behind
(92 MB): vLLM's CUDA platform imports this module at its top. The capability probes vLLM calls
while its modules import (`*_supports_*`) answer False; any other op is missing, as without the
library, and a test that needs one fails naming it."""

import torch
from torch._ops import _OpNamespace


class _NotCarried(_OpNamespace):
    def __getattr__(self, op: str):
        try:
            return super().__getattr__(op)
        except AttributeError:
            if "_supports_" in op:
                return lambda *args, **kwargs: False
            raise AttributeError(
                f"vLLM's compiled op {self.name}.{op} was not carried to this machine"
            ) from None


for _ns in ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar"):
    setattr(torch.ops, _ns, _NotCarried(_ns))

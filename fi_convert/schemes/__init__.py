"""The scheme registry: one module per scheme, looked up by its `SchemeName`."""

from __future__ import annotations

from ..errors import SchemeMismatchError
from ..source import Checkpoint, ExpertLayer
from .base import Backend, LayerPlan, OutputTensor, Scheme, SchemeName, unread_fp8
from .bf16 import Bf16Scheme
from .fp8_block import Fp8BlockScheme
from .fp8_tensor import Fp8TensorScheme
from .mxfp4 import Mxfp4Scheme
from .mxfp8 import Mxfp8Scheme
from .nvfp4 import Nvfp4Scheme

REGISTRY: dict[SchemeName, Scheme] = {
    SchemeName.BF16: Bf16Scheme(),
    SchemeName.FP8_BLOCK: Fp8BlockScheme(),
    SchemeName.FP8_TENSOR: Fp8TensorScheme(),
    SchemeName.MXFP8: Mxfp8Scheme(),
    SchemeName.NVFP4: Nvfp4Scheme(),
    SchemeName.MXFP4: Mxfp4Scheme(),
}

__all__ = [
    "REGISTRY",
    "Backend",
    "LayerPlan",
    "OutputTensor",
    "Scheme",
    "SchemeName",
    "detect",
    "get",
]


def get(name: SchemeName) -> Scheme:
    if name not in REGISTRY:
        have = ", ".join(s.value for s in REGISTRY)
        raise SchemeMismatchError(
            f"scheme {name.value!r} is not implemented in this version of fi-convert "
            f"(available: {have}, auto)"
        )
    return REGISTRY[name]


def detect(ckpt: Checkpoint, layers: list[ExpertLayer]) -> SchemeName:
    """The scheme whose source format the checkpoint holds (`--scheme auto`)."""
    for name, scheme in REGISTRY.items():
        if scheme.matches(ckpt, layers):
            return name
    if why := unread_fp8(layers[0], ckpt.config):
        raise SchemeMismatchError(why)
    w = layers[0].params[sorted(layers[0].params)[0]]
    raise SchemeMismatchError(
        f"{w.name}: cannot tell the scheme from dtype {w.dtype} and config.json; "
        f"pass --scheme ({', '.join(s.value for s in REGISTRY)})"
    )

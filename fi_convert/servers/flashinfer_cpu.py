"""FlashInfer's CUDA-only layout functions on a machine without CUDA, for a server's own MoE
processing run on CPU (the load-time proof's `verify --server` on a CI runner, the tests).

Each is fi-convert's index math for the same move (`fi_convert.layout`), which
tests/test_gpu.py and tests/test_sglang_gpu.py check against FlashInfer's CUDA functions. So a
proof on CPU proves the server's own processing up to these moves, which are FlashInfer's (its
layouts are pinned by the manifest's `flashinfer_versions`), not the server release's. Where
CUDA is there, the server's processing calls FlashInfer's own.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from unittest import mock

import torch

from .. import layout as L


def block_scale_interleave(sf: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """FlashInfer's `block_scale_interleave` (alias `nvfp4_block_scale_interleave`): the 128x4
    swizzle of a [M, K/g] (or [E, M, K/g]) scale tensor, M padded to 128 and K/g to 4 with
    zeros, returned flat (E * Mp * Kp entries)."""
    e = sf.shape[0] if sf.ndim == 3 else 1
    x = sf.reshape(e, sf.shape[-2], sf.shape[-1])
    idx = L.swizzle_128x4_index(x.shape[1], x.shape[2]).to(sf.device)
    zero = torch.zeros(e, 1, dtype=x.dtype, device=sf.device)
    res = torch.cat([x.reshape(e, -1), zero], dim=1)[:, idx].reshape(-1)
    return res if out is None else out.copy_(res)


def interleave_moe_weights_for_sm90_mixed_gemm(
    weight: torch.Tensor, quant_type: str = "fp4"
) -> torch.Tensor:
    """FlashInfer's SM90 mixed-input weight interleave of [E, n, K/2] packed FP4 bytes."""
    if quant_type != "fp4" or weight.dtype != torch.uint8 or weight.ndim != 3:
        raise NotImplementedError(
            f"the CPU interleave takes fp4 [E, n, K/2] uint8, not {quant_type}"
        )
    return L.sm90_interleave_weights(weight)


STAND_INS: dict[str, Callable[..., torch.Tensor]] = {
    "block_scale_interleave": block_scale_interleave,
    "nvfp4_block_scale_interleave": block_scale_interleave,
    "interleave_moe_weights_for_sm90_mixed_gemm": interleave_moe_weights_for_sm90_mixed_gemm,
}


@contextlib.contextmanager
def installed(packages: tuple[str, ...]) -> Iterator[None]:
    """The stand-ins wherever a loaded module of `packages` (and FlashInfer) binds one of these
    names, for the block; nothing where CUDA is available."""
    if torch.cuda.is_available():
        yield
        return
    with contextlib.suppress(ImportError):  # the servers import FlashInfer's names lazily
        import flashinfer  # noqa: F401
        import flashinfer.fused_moe  # noqa: F401
    with contextlib.ExitStack() as stack:
        for name, module in list(sys.modules.items()):
            if module is None or not name.startswith(("flashinfer", *packages)):
                continue
            for attr, fake in STAND_INS.items():
                if callable(vars(module).get(attr)):
                    stack.enter_context(mock.patch.object(module, attr, fake))
        yield

"""Quantization arithmetic that must match vLLM's bit for bit, with every precision explicit.

The same code gives the same bytes on CPU and CUDA: each step states the dtype it computes
in, and no step relies on a device's type-promotion rules. One rule matters most: PyTorch on
CUDA evaluates `tensor / python_float` as `tensor * float32(1 / python_float)`, while on the
CPU it divides. Every such division is spelled out here as the operation the GPU performs.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
MX_BLOCK = 32
UE8M0_ONE = 127  # the UE8M0 scale byte of 2**0
F32_TINY = torch.finfo(torch.float32).tiny  # smallest normal float32, 2**-126
# float32(1 / 448): what CUDA PyTorch multiplies by for `x / 448.0`
RECIP_E4M3_MAX = (torch.tensor(1.0) / torch.tensor(E4M3_MAX)).item()


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    """A 0-dim float32 tensor on `like`'s device (never a CPU scalar in a CUDA expression)."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def mx_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP MX quantization to E4M3 with a UE8M0 scale per 32 values along the last dim.

    For each block: amax = max|x| in float32, clamped below to the smallest normal float32;
    e = clamp(ceil(log2(amax / 448)) + 127, 0, 254) (the scale byte); values are divided by
    2**(e - 127) in float32 and cast to E4M3 (round to nearest even; |value| <= 448 by
    construction). Returns (E4M3 values of x's shape, uint8 scales [..., K/32]).

    As vLLM's `_mxfp8_e4m3_quantize_torch` runs on the GPU: `amax / 448` is
    amax * float32(1/448); log2 is taken in float64 and rounded to float32 (the correctly
    rounded float32 log2), so CPU and CUDA agree.
    """
    *lead, k = x.shape
    if k % MX_BLOCK:
        raise ValueError(f"MX quantization needs K % {MX_BLOCK} == 0, got {k}")
    blocks = x.to(torch.float32).reshape(*lead, k // MX_BLOCK, MX_BLOCK)
    amax = blocks.abs().amax(dim=-1).clamp(min=F32_TINY)
    ratio = amax * _f32(RECIP_E4M3_MAX, amax)
    exp = torch.ceil(torch.log2(ratio.to(torch.float64)).to(torch.float32)) + UE8M0_ONE
    scale = exp.clamp(0, 254).to(torch.uint8)
    div = torch.exp2(scale.to(torch.float32) - UE8M0_ONE)
    q = (blocks / div.unsqueeze(-1)).to(torch.float8_e4m3fn)
    return q.reshape(*lead, k), scale


def fp8_dequantize_f16(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """vLLM's `per_tensor_dequantize` as its GPU computes it: float16(float(w16) * float(s16)).

    vLLM multiplies `w.to(float16)` by a 0-dim float32 scale; on CUDA the scale is rounded to
    float16 first and the product is rounded once to float16. We do that explicitly.
    """
    s16 = scale.to(torch.float16).to(torch.float32)
    return (w.to(torch.float16).to(torch.float32) * s16).to(torch.float16)


def fp8_quantize_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """vLLM's static `scaled_fp8_quant` kernel: float(x) * (1.0f / scale), clamped to +-448,
    rounded to nearest even E4M3. The reciprocal is an IEEE float32 division (on the CPU)."""
    inv = (torch.ones((), dtype=torch.float32) / scale.to(torch.float32).cpu()).to(x.device)
    y = (x.to(torch.float32) * inv).clamp(-E4M3_MAX, E4M3_MAX)
    return y.to(torch.float8_e4m3fn)


def fp8_dynamic_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-tensor dynamic scale of vLLM's `scaled_fp8_quant` kernel: absmax / 448, an IEEE
    float32 division (the kernel divides in CUDA C; done on the CPU here). 0-dim, on CPU."""
    amax = x.to(torch.float32).abs().amax().cpu()
    return amax / torch.tensor(E4M3_MAX, dtype=torch.float32)


def rescale_e4m3(scales: torch.Tensor, ratio: torch.Tensor) -> None:
    """E4M3 bytes (uint8 `[n, rows, k]`) times a float32 `ratio` per leading index, in place:
    float32(e4m3) * ratio, rounded back to E4M3 as PyTorch casts (SGLang 0.5.23's NVFP4 clamp
    rescale: `block_scales.copy_(block_scales.float().mul_(ratios))`)."""
    e4m3 = scales.view(torch.float8_e4m3fn)
    scaled = e4m3.float().mul_(ratio.to(torch.float32).reshape(-1, 1, 1))
    e4m3.copy_(scaled)

"""The [M, K/16] (NVFP4) and [M, K/32] (MXFP4, MXFP8) scale shapes SGLang 0.5.23's own processing
passes to FlashInfer's CUDA-only `block_scale_interleave` in the CPU tests (tests/test_sglang.py,
tests/test_sglang_plugin.py, tests/test_sglang_models.py), where the CPU version in
tests/sglang_moe.py stands in for it.

The CPU version refuses any shape not listed here, and tests/test_gpu.py checks it against
FlashInfer's own function on CUDA for every shape listed: so SGLang's scale bytes, proven on CPU
up to the stand-in, are proven in full once the GPU tier has run. A new case with a new shape
fails on CPU until its shape is added here and `pytest -m gpu tests/test_gpu.py -k
block_scale_interleave` has run on the GPU machine (docs/development.md, "GPU tests").
"""

from __future__ import annotations

SGLANG_SCALE_SHAPES: frozenset[tuple[int, ...]] = frozenset(
    {
        (128, 4),
        (128, 8),
        (128, 24),
        (256, 4),
        (256, 8),
        (256, 12),
        (256, 16),
        (256, 24),
        (384, 4),
        (384, 8),
        (384, 12),
        (384, 16),
        (384, 24),
        (512, 4),
        (512, 8),
        (512, 12),
        (512, 16),
        (768, 12),
        (768, 16),
    }
)

# The per-expert [n, K/2] packed-FP4 weight shapes SGLang 0.5.23's own SM90 processing (gpt-oss
# MXFP4 on flashinfer_mxfp4, Hopper) passes to FlashInfer's CUDA-only
# `interleave_moe_weights_for_sm90_mixed_gemm` in the CPU tests, where tests/sglang_moe.py's CPU
# version stands in for it: w13 [2*I_p, H_p/2] and w2 [H_p, I_p/2] of H 320 I 192 at TP 1, 2
# and H 576 I 384 at TP 1, 2, 4. The same rule: any other shape is refused there, and
# tests/test_sglang_gpu.py checks each listed one against FlashInfer's kernel on CUDA.
SGLANG_SM90_WEIGHT_SHAPES: frozenset[tuple[int, int]] = frozenset(
    {
        (512, 256),
        (512, 128),
        (256, 256),
        (512, 64),
        (768, 384),
        (768, 192),
        (512, 384),
        (768, 128),
        (256, 384),
        (768, 64),
    }
)

# The [M, K] scale shapes (M rows of an expert, K scale columns: K/16 for NVFP4, K/32 for MXFP8)
# vLLM's own processing passes to FlashInfer's CUDA-only `block_scale_interleave` in the CPU
# tests of every proven vLLM release (tests/test_vllm_scales.py, where tests/vllm_moe.py's CPU
# version stands in for it). The same rule: any other shape is refused there, and
# tests/test_gpu.py checks each listed one against FlashInfer's function on CUDA.
VLLM_SCALE_SHAPES: frozenset[tuple[int, int]] = frozenset(
    {
        # vLLM 0.30-0.32 pass MXFP8's w13 scales unpadded (H 320: 10 columns), and their own
        # reshape after the swizzle fails (tests/test_vllm_scales.py proves it there)
        (192, 10),
        (384, 10),
        (768, 10),
        # ... and a non-gated w13's at TP 4 (Nemotron-H: I 384 / 4; not yet checked on the GPU)
        (96, 10),
        # non-gated w13s (Nemotron-H: I_p 128 or 384, H_p 512; NVFP4's K/16, MXFP8's K/32)
        (128, 16),
        (128, 32),
        (384, 16),
        (256, 16),
        (256, 32),
        (384, 32),
        (512, 4),
        (512, 8),
        (512, 12),
        (512, 16),
        (512, 24),
        (768, 16),
        (768, 32),
    }
)

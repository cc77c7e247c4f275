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

"""fi_convert/layout.py: each layout function against FlashInfer's own (CPU), on shapes that need
care."""

from __future__ import annotations

import pytest
import torch
from flashinfer import reorder_rows_for_gated_act_gemm, shuffle_matrix_a
from flashinfer.fused_moe import convert_to_block_layout
from flashinfer.fused_moe.core import (
    _maybe_get_cached_w3_w1_permute_indices,
    get_w2_permute_indices_with_cache,
)

from fi_convert import layout as L
from fi_convert.verify.flashinfer_reference import pad_contiguous_seed, pad_per_half, same_bytes


def _rand(m: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, 256, (m, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


@pytest.mark.parametrize("tile", [64, 128])
@pytest.mark.parametrize("m", [32, 64, 96, 256, 768])
def test_shuffle_matches_shuffle_matrix_a(m, tile):
    x = _rand(m, 40)
    assert torch.equal(x[L.shuffle_row_index(m, tile)], shuffle_matrix_a(x, tile))


def test_shuffle_rejects_rows_flashinfer_rejects():
    with pytest.raises(ValueError, match="rows % 32"):
        L.shuffle_row_index(48, 128)


@pytest.mark.parametrize("m", [2, 64, 258, 1024])
def test_gated_interleave_matches_reorder_rows(m):
    x = _rand(m, 24, seed=m)
    assert torch.equal(x[L.gated_interleave_index(m)], reorder_rows_for_gated_act_gemm(x))


@pytest.mark.parametrize("m", [256, 512, 1536])
def test_composed_index_matches_permute_helpers(m):
    """swap + interleave + shuffle == vLLM's (w3_w1 indices + M/2) % M; w2 == its helper."""
    x = _rand(m, 64, seed=1)
    cache: dict = {}
    ref = _maybe_get_cached_w3_w1_permute_indices(cache, x, 128, is_gated_act_gemm=True)
    ref = (ref + m // 2) % m
    ours = L.compose(
        L.swap_halves_index(m), L.gated_interleave_index(m), L.shuffle_row_index(m, 128)
    )
    assert torch.equal(ours, ref)
    assert torch.equal(
        L.shuffle_row_index(m, 128), get_w2_permute_indices_with_cache(cache, x, 128)
    )


@pytest.mark.parametrize("block", [64, 128])
def test_block_major_gather_matches_convert_to_block_layout(block):
    e, m, k = 3, 64, 256
    src = torch.randint(0, 256, (e, m, k), dtype=torch.uint8)
    idx = L.shuffle_row_index(m, 64)
    out = torch.empty(e, k // block, m, block, dtype=torch.uint8)
    L.gather_rows_block_major(src, idx, block, out)
    for i in range(e):
        assert torch.equal(out[i], convert_to_block_layout(shuffle_matrix_a(src[i], 64), block))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16])
def test_block_major_gather_with_padding_rows(dtype):
    """More output rows than source rows (per-half padding from a zero row), odd experts."""
    e, r, k, block = 5, 97, 384, 128 // torch.empty((), dtype=dtype).element_size()
    src = torch.randint(0, 200, (e, r, k)).to(dtype)
    src[:, -1] = 0
    idx = L.pad_halves_index(48, 64, zero_row=r - 1)
    out = torch.empty(e, k // block, idx.numel(), block, dtype=dtype)
    L.gather_rows_block_major(src, idx, block, out)
    expect = src[:, idx].view(e, idx.numel(), k // block, block).permute(0, 2, 1, 3)
    assert torch.equal(out, expect)


def test_pad_halves_is_per_half_not_contiguous():
    """vLLM 0.33 pads each half; the seed code padded the fused tensor as one block."""
    i, p, h = 96, 128, 8
    w13 = torch.arange(2 * i * h, dtype=torch.float32).view(1, 2 * i, h) + 1
    w2 = torch.ones(1, h, i)
    src = torch.cat([w13[0], torch.zeros(1, h)])
    ours = src[L.pad_halves_index(i, p, zero_row=2 * i)]
    per_half, _ = pad_per_half(w13, w2, p)
    seed, _ = pad_contiguous_seed(w13, w2, p)
    assert same_bytes(ours, per_half[0])
    assert not torch.equal(ours, seed[0])
    # the seed code puts up's first rows into gate's padded tail
    assert torch.equal(seed[0, i:p], w13[0, i : i + p - i])
    assert torch.count_nonzero(ours[i:p]) == 0


def _swizzle_loop(sf: torch.Tensor) -> torch.Tensor:
    """FlashInfer's C++ computeSFIndex / blockScaleInterleaveHost, as a literal loop."""
    m, ks = sf.shape
    mp, kp = -(-m // 128) * 128, -(-ks // 4) * 4
    out = torch.zeros(mp * kp, dtype=sf.dtype)
    for r in range(mp):
        for c in range(kp):
            off = (
                (r // 128) * 128 * kp
                + (c // 4) * 512
                + (r % 32) * 16
                + ((r % 128) // 32) * 4
                + c % 4
            )
            out[off] = sf[r, c] if r < m and c < ks else 0
    return out


@pytest.mark.parametrize("m,ks", [(128, 4), (200, 7), (256, 12), (96, 3)])
def test_swizzle_index_matches_formula_loop(m, ks):
    sf = torch.randint(1, 255, (m, ks), dtype=torch.uint8)
    flat = torch.cat([sf.reshape(-1), torch.zeros(1, dtype=torch.uint8)])
    assert torch.equal(flat[L.swizzle_128x4_index(m, ks)], _swizzle_loop(sf))

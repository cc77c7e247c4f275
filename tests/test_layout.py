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


# ---- SGLang's SM90 CUTLASS MXFP4 (FlashInfer's mixed-input MoE GEMM) ----

# FlashInfer 0.7.2's `interleave_fp4_weights_for_sm90_mixed_gemm_kernel` (moe_gemm_mixed_utils.cu):
# its 18 (mask, shift) lines on the 32-bit word of 4 gathered bytes (negative: right shift)
KERNEL_MOVES = [
    *((0x80, 24), (0x70, 18), (0x08, 12), (0x07, 6), (0x8000, 13), (0x7000, 7)),
    *((0x0800, 1), (0x0700, -5), (0x800000, 2), (0x700000, -4), (0x080000, -10)),
    *((0x070000, -16), (0x80000000, -1), (0x10000000, 1), (0x60000000, -3)),
    *((0x08000000, -13), (0x01000000, -11), (0x06000000, -15)),
]


def sm90_kernel_loop(w: torch.Tensor) -> torch.Tensor:
    """A literal Python port of that kernel's loops (per thread: block, partition, lane), on
    one expert's [n, K/2] bytes: the independent check of fi_convert's vectorized form."""
    n, kb = w.shape
    cols, src = 2 * kb, w.reshape(-1).tolist()
    out = [0] * len(src)
    for block_id in range(n // 2):
        for partition in range(cols // 64):
            for lane in range(16):
                row = block_id // 8 * 16 + block_id % 8
                mma = lane // 4
                col = partition * 32 + mma * 8 + lane % 4
                first, second = row * kb + col, (row + 8) * kb + col
                raw = src[first] | src[second] << 8 | src[first + 4] << 16 | src[second + 4] << 24
                word = 0
                for mask, shift in KERNEL_MOVES:
                    word |= (raw & mask) << shift if shift >= 0 else (raw & mask) >> -shift
                dst = (row + (mma % 2) * 8) * kb + partition * 32 + lane // 8 * 16 + lane % 4 * 4
                for b in range(4):
                    out[dst + b] = (word >> (8 * b)) & 0xFF
    return torch.tensor(out, dtype=torch.uint8).view(n, kb)


def sm90_interleave(w: torch.Tensor) -> torch.Tensor:
    return L.sm90_interleave_weights(w[None])[0]


@pytest.mark.parametrize(("n", "kb"), [(16, 32), (32, 64), (48, 96), (256, 160)])
def test_sm90_weight_interleave_matches_kernel_loop(n, kb):
    w = torch.randint(
        0, 256, (n, kb), dtype=torch.uint8, generator=torch.Generator().manual_seed(n)
    )
    assert torch.equal(sm90_interleave(w), sm90_kernel_loop(w))


def test_sm90_weight_interleave_moves_every_bit_once():
    """The index is a permutation of the bytes and the bit step of the bits (no byte lost,
    none read twice): each single set bit lands on exactly one bit."""
    assert sorted(L.SM90_FP4_BIT_SOURCE) == list(range(32))
    idx = L.sm90_mixed_weight_index(32, 64)
    assert torch.equal(idx.sort().values, torch.arange(32 * 64))
    for bit in range(32):
        word = torch.tensor([1 << bit], dtype=torch.int64).to(torch.int32)
        out = L.sm90_fp4_bits_(word.clone())
        assert int(out.view(torch.uint32)) == 1 << L.SM90_FP4_BIT_SOURCE.index(bit)


def test_sm90_weight_interleave_control():
    """The check can fail: without the bit step the bytes are not the kernel's."""
    w = torch.randint(
        0, 256, (16, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    moved = w.reshape(-1)[L.sm90_mixed_weight_index(16, 32)].view(16, 32)
    assert not torch.equal(moved, sm90_kernel_loop(w))


@pytest.mark.parametrize(("rows", "kgs"), [(64, 4), (128, 16), (192, 12), (512, 24)])
def test_sm90_scale_fold_matches_flashinfer(rows, kgs):
    """FlashInfer's own (pure-PyTorch) `interleave_moe_scales_for_sm90_mixed_gemm`."""
    from flashinfer.fused_moe import interleave_moe_scales_for_sm90_mixed_gemm

    s = torch.randint(0, 256, (3, rows, kgs), dtype=torch.uint8)
    want = interleave_moe_scales_for_sm90_mixed_gemm(s, group_size=32)
    ours = s.reshape(3, -1)[:, L.sm90_scale_fold_index(rows, kgs)]
    assert want.shape == (3, rows // 64, kgs // 4, 16, 16)
    assert torch.equal(ours.reshape(want.shape), want)


def test_sm90_shapes_flashinfer_rejects():
    with pytest.raises(ValueError, match="rows % 16"):
        L.sm90_mixed_weight_index(24, 32)
    with pytest.raises(ValueError, match="K % 64"):
        L.sm90_mixed_weight_index(16, 48)
    with pytest.raises(ValueError, match="rows % 64"):
        L.sm90_scale_fold_index(96, 4)


def test_sm90_bit_step_in_blocks():
    """The CPU's blocked passes (a partial last block included) give the one-pass words."""
    g = torch.Generator().manual_seed(2)
    words = torch.randint(-(2**31), 2**31 - 1, (5000,), dtype=torch.int32, generator=g)
    one = L.sm90_fp4_bits_(words.clone(), block=10**6)
    assert torch.equal(L.sm90_fp4_bits_(words.clone(), block=1000), one)
    assert not torch.equal(one, words)

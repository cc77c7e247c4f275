"""Layout math: FlashInfer's MoE weight transforms as row-index maps and views.

Every transform that reorders rows is an int64 index `idx` with `out[i] = x[idx[i]]`.
Composition follows indexing: applying `a` then `b` is `a[b]` (see `compose`). A scheme
composes its transforms into one index per tensor and applies it with a single
`index_select` into a preallocated output, batched over experts; block layouts are views
of that output, so nothing is gathered twice. The same code runs on CPU and CUDA.

Formulas (from FlashInfer 0.6.18-0.7.4, `flashinfer/utils.py`, `fused_moe/core.py`):

* row shuffle (`shuffle_matrix_a`, epilogue tile T): B = 32 if T % 128 == 0 else 16;
  idx[b*B + j] = b*B + (j % 8) * (B // 8) + j // 8.
* gated interleave (`reorder_rows_for_gated_act_gemm`) of [X1; X2] with M rows:
  out[2i] = X1[i], out[2i+1] = X2[i], i.e. idx[2i] = i, idx[2i+1] = M/2 + i.
* half swap (vLLM `swap_w13_to_w31`, [gate; up] -> [up; gate]): idx[i] = (i + M/2) % M.
* per-half padding of [A; B] (n rows each) to [A; 0; B; 0] (p rows each), with zero rows
  taken from a zero row at index `zero_row` of the source.
* BlockMajorK (`convert_to_block_layout`, block of bK elements): out[b, m, k] = x[m, b*bK + k].
* 128x4 scale swizzle (`block_scale_interleave`), see `swizzle_128x4`.
"""

from __future__ import annotations

import functools

import torch


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def shuffle_row_index(m: int, epilogue_tile_m: int) -> torch.Tensor:
    """Row index of FlashInfer's `shuffle_matrix_a` for an M-row matrix."""
    b = 32 if epilogue_tile_m % 128 == 0 else 16
    if m % b:
        raise ValueError(f"row shuffle with tile {epilogue_tile_m} needs rows % {b} == 0, got {m}")
    j = torch.arange(b)
    within = (j % 8) * (b // 8) + j // 8
    return (torch.arange(0, m, b)[:, None] + within[None, :]).reshape(-1)


def gated_interleave_index(m: int) -> torch.Tensor:
    """Row index of FlashInfer's `reorder_rows_for_gated_act_gemm` ([X1; X2] -> X1/X2 pairs)."""
    if m % 2:
        raise ValueError(f"gated interleave needs an even row count, got {m}")
    return torch.arange(m).view(2, m // 2).t().reshape(-1)


def swap_halves_index(m: int) -> torch.Tensor:
    """Row index of [A; B] -> [B; A] (vLLM's `swap_w13_to_w31`)."""
    return (torch.arange(m) + m // 2) % m


def pad_halves_index(n: int, padded: int, zero_row: int, parts: int = 2) -> torch.Tensor:
    """Row index of [A; B] (n rows each) -> [A; 0; B; 0] (padded rows each); with `parts`
    1, of A alone -> [A; 0] (a non-gated w13: the up projection).

    Padding rows point at `zero_row`, a row of zeros the caller keeps in the source buffer.
    Each half is padded separately, as vLLM 0.33 does (not the fused tensor as one block).
    """
    q = torch.arange(padded)
    zero = torch.full_like(q, zero_row)
    return torch.cat([torch.where(q < n, q + k * n, zero) for k in range(parts)])


def compose(*steps: torch.Tensor) -> torch.Tensor:
    """One index for `steps` applied in order: x[s1][s2]... == x[compose(s1, s2, ...)]."""
    idx = steps[0]
    for s in steps[1:]:
        idx = idx[s]
    return idx


def _wide(t: torch.Tensor, unit_bytes: int) -> torch.Tensor:
    """The same bytes viewed with the widest type that divides `unit_bytes` (the bytes each
    gathered row or block moves) and the tensor's alignment: index_select moves one element
    per thread on CUDA, so 16-byte elements (complex128, used only as a byte carrier) make it
    run at about copy speed on an H200 (`make bench`)."""
    for dt in (torch.complex128, torch.int64, torch.int32, torch.int16):
        size = torch.empty((), dtype=dt).element_size()
        aligned = t.data_ptr() % size == 0 and (t.storage_offset() * t.element_size()) % size == 0
        if unit_bytes % size == 0 and t.element_size() <= size and aligned:
            return t.view(dt)
    return t


def gather_rows(src: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[e, i, :] = src[e, idx[i], :] for a batch of experts, in one `index_select`."""
    res = out
    idx = idx.to(src.device)
    if src.is_contiguous() and out.is_contiguous():
        row = src.shape[-1] * src.element_size()
        src, out = _wide(src, row), _wide(out, row)
        if src.device.type == "cpu" and src.dtype == out.dtype:
            # on CPU, index_select along dim 0 of a 2-D tensor copies whole rows (memcpy):
            # index all experts' rows at once
            e, r = src.shape[0], src.shape[1]
            flat = (torch.arange(e)[:, None] * r + idx[None, :]).reshape(-1)
            torch.index_select(src.view(e * r, -1), 0, flat, out=out.view(flat.numel(), -1))
            return res
    torch.index_select(src, 1, idx, out=out)
    return res


def gather_rows_block_major(
    src: torch.Tensor, idx: torch.Tensor, block: int, out: torch.Tensor
) -> torch.Tensor:
    """Row gather fused with BlockMajorK: out[e, b, i, k] = src[e, idx[i], b*block + k].

    `src` is [E, R, K] and `out` is [E, K/block, M, block], with block counted in elements
    of src's dtype (FlashInfer counts 128 bytes: 128 fp8 or 64 bf16 values).
    """
    e, r, k = src.shape
    if k % block:
        raise ValueError(f"block layout needs K % {block} == 0, got K={k}")
    res = out
    if src.is_contiguous() and out.is_contiguous():
        unit = block * src.element_size()
        src, out = _wide(src, unit), _wide(out, unit)
    per = out.shape[-1]  # the block in (possibly wider) elements
    blocks = src.view(e, r, src.shape[-1] // per, per).permute(0, 2, 1, 3)
    torch.index_select(blocks, 2, idx.to(src.device), out=out)
    return res


def gather_flat(src: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[e].flatten() = src[e].flatten()[idx] for each expert e (byte-sized elements). On
    CPU one 1-D `index_select` per expert (an index over all experts' bytes would be 8 bytes per
    byte moved: 14x slower for SM90 weights here, and that much memory); on CUDA one call."""
    n = src.shape[0]
    if src.device.type == "cpu":
        flat, dst = src.reshape(n, -1).view(torch.uint8), out.view(torch.uint8).view(n, -1)
        for e in range(n):
            torch.index_select(flat[e], 0, idx, out=dst[e])
        return out
    gather_rows(src.reshape(n, -1, 1), idx, out.view(torch.uint8).view(n, -1, 1))
    return out


def swizzle_128x4_index(m: int, ks: int) -> torch.Tensor:
    """Flat source index of the 128x4 scale swizzle (`block_scale_interleave`) of [m, ks].

    The output has Mp*Kp entries (Mp = round_up(m, 128), Kp = round_up(ks, 4)); the entry for
    source (r, c) sits at (r//128)*128*Kp + (c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4.
    Padding entries hold the index m*ks, which the caller points at a zero (or other pad) value.
    """
    mp, kp = round_up(m, 128), round_up(ks, 4)
    r = torch.arange(mp).view(mp // 128, 4, 32, 1, 1)
    c = torch.arange(kp).view(1, 1, 1, kp // 4, 4)
    src = r * ks + c
    src = torch.where((r < m) & (c < ks), src, torch.full_like(src, m * ks))
    # [Mp/128, 4, 32, Kp/4, 4] -> [Mp/128, Kp/4, 32, 4, 4] == the output's order
    return src.permute(0, 3, 2, 1, 4).reshape(-1)


# ---- SGLang's SM90 CUTLASS MXFP4 (FlashInfer's mixed-input GEMM, `cutlass_fused_moe` with
# use_w4_group_scaling): the weight interleave is a CUDA op, the scale fold pure PyTorch ----

# FlashInfer's `interleave_fp4_weights_for_sm90_mixed_gemm_kernel` (csrc/nv_internal/.../
# moe_gemm_mixed_utils.cu) moves 4 bytes (8 FP4 values) into one little-endian 32-bit word and
# permutes its bits: output bit j holds input bit SM90_FP4_BIT_SOURCE[j] (read off its 18
# mask-and-shift lines). Input byte 0 is the word's low byte.
SM90_FP4_BIT_SOURCE: tuple[int, ...] = (
    *(16, 17, 18, 8, 9, 10, 0, 1, 2, 19, 25, 26, 11, 24, 27, 3),
    *(20, 21, 22, 12, 13, 14, 4, 5, 6, 23, 29, 30, 15, 28, 31, 7),
)


def sm90_mixed_weight_index(n: int, kb: int) -> torch.Tensor:
    """Flat source index of the byte move of FlashInfer's `interleave_moe_weights_for_sm90_
    mixed_gemm(w, "fp4")` on one expert's [n, kb] packed-FP4 bytes (kb = K/2): out.flat[j] =
    src.flat[idx[j]]; then `sm90_fp4_bits_` permutes each 32-bit word's bits.

    With source row = 16*R + 8*a + r and column = 32*p + 16*m1 + 8*m0 + 4*b + l (a, m1, m0, b
    in {0, 1}; r < 8, l < 4), the byte sits at row 16*R + 8*m0 + r, column 32*p + 16*m1 + 4*l
    + a + 2*b: a permutation of the axes of the [n/16, 2, 8, kb/32, 2, 2, 2, 4] view.
    Needs n % 16 == 0 and K % 64 == 0 (as FlashInfer's op)."""
    if n % 16 or kb % 32:
        raise ValueError(f"SM90 weight interleave needs rows % 16 == 0, K % 64 == 0: {n}, {2 * kb}")
    src = torch.arange(n * kb).view(n // 16, 2, 8, kb // 32, 2, 2, 2, 4)
    # [R, a, r, p, m1, m0, b, l] -> [R, m0, r, p, m1, l, b, a]
    return src.permute(0, 5, 2, 3, 4, 7, 6, 1).reshape(-1)


@functools.cache
def _bit_moves() -> list[tuple[int, int]]:
    """SM90_FP4_BIT_SOURCE as (shift, source mask) pairs: out |= (x & mask) shifted left by
    `shift` (right where negative), one pair per distinct distance."""
    moves: dict[int, int] = {}
    for dst, src in enumerate(SM90_FP4_BIT_SOURCE):
        moves[dst - src] = moves.get(dst - src, 0) | (1 << src)
    return sorted(moves.items())


def sm90_fp4_bits_(words: torch.Tensor, block: int = 1 << 15) -> torch.Tensor:
    """In place, each 32-bit word w (an int32 tensor) becomes the word whose bit j is bit
    SM90_FP4_BIT_SOURCE[j] of w: the bit step of FlashInfer's SM90 FP4 weight interleave.
    Shifts are written for int32's arithmetic right shift (shift, then mask) and never carry a
    set bit past bit 31. On CPU, `block` words at a time (128 KiB: the temporaries stay in
    cache, 10x faster than whole-tensor passes); on CUDA, one pass."""
    if words.dtype != torch.int32:
        raise ValueError(f"sm90_fp4_bits_ permutes int32 words, got {words.dtype}")
    flat = words.view(-1)
    step = flat.numel() if words.is_cuda else block
    x = torch.empty(min(step, flat.numel()), dtype=torch.int32, device=words.device)
    t = torch.empty_like(x)
    for a in range(0, flat.numel(), step):
        w = flat[a : a + step]
        xs, ts = x[: w.numel()], t[: w.numel()]
        xs.copy_(w)
        w.zero_()
        for shift, mask in _bit_moves():
            if shift >= 0:  # mask < 2**(31 - shift): stays in 32 bits
                torch.bitwise_and(xs, mask, out=ts).bitwise_left_shift_(shift)
            else:
                torch.bitwise_right_shift(xs, -shift, out=ts).bitwise_and_(mask >> -shift)
            w |= ts
    return words


def sm90_interleave_weights(w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """FlashInfer's `interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")` on [E, n, K/2]
    packed-FP4 bytes, into `out` (new when None): one gather (`sm90_mixed_weight_index`), then
    the bit step in place (`sm90_fp4_bits_`). The converter composes the same two with its
    row maps; this is the op as FlashInfer names it (tests: a CPU stand-in, a GPU check)."""
    e, n, kb = w.shape
    out = torch.empty_like(w) if out is None else out
    gather_flat(w.contiguous(), sm90_mixed_weight_index(n, kb), out)
    sm90_fp4_bits_(out.view(torch.int32))
    return out


def sm90_scale_fold_index(rows: int, kgs: int) -> torch.Tensor:
    """Flat source index of FlashInfer's `interleave_moe_scales_for_sm90_mixed_gemm(s,
    group_size=32)` on one expert's [rows, kgs] UE8M0 scales (uint8): the output is
    [rows/64, kgs/4, 16, 16] with out[R, B, f, 4*s + g] = src[64*R + 16*s + f, 4*B + g]
    (s, g < 4; f < 16): each 64x128 block of the weight's scales as 16 rows of 16 bytes.
    Needs rows % 64 == 0 and kgs % 4 == 0."""
    if rows % 64 or kgs % 4:
        raise ValueError(f"SM90 scale fold needs rows % 64 == 0, K/32 % 4 == 0: {rows}, {kgs}")
    src = torch.arange(rows * kgs).view(rows // 64, 4, 16, kgs // 4, 4)
    return src.permute(0, 3, 2, 1, 4).reshape(-1)


def remap_rows(flat: torch.Tensor, cols: int, rows: torch.Tensor) -> torch.Tensor:
    """A flat index over an [len(rows), cols] matrix made one over the source matrix it takes
    its rows from: the entry at source row rows[i] of the same column, for entry flat[j] ->
    (i, c) = divmod(flat[j], cols)."""
    return rows[flat // cols] * cols + flat % cols

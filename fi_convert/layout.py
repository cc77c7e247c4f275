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


def pad_halves_index(n: int, padded: int, zero_row: int) -> torch.Tensor:
    """Row index of [A; B] (n rows each) -> [A; 0; B; 0] (padded rows each).

    Padding rows point at `zero_row`, a row of zeros the caller keeps in the source buffer.
    Each half is padded separately, as vLLM 0.33 does (not the fused tensor as one block).
    """
    q = torch.arange(padded)
    half = torch.where(q < n, q, torch.full_like(q, zero_row))
    return torch.cat([half, torch.where(q < n, q + n, torch.full_like(q, zero_row))])


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
    """out[e].flatten() = src[e].flatten()[idx] for each expert e (byte-sized elements)."""
    n = src.shape[0]
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

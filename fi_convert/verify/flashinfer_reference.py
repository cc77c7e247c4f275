"""The reference: vLLM 0.33's load-time MoE pipeline, step by step, with FlashInfer's functions.

It mirrors what vLLM runs in `process_weights_after_loading` (per expert, in a Python loop,
calling FlashInfer), starting from the checkpoint as read by the `safetensors` library. The
converter shares no code with it: the tests and `fi-convert verify --against-flashinfer`
compare the two byte for byte. Importing it needs FlashInfer (`pip install flashinfer-python`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from flashinfer import reorder_rows_for_gated_act_gemm, shuffle_matrix_a
from flashinfer.fused_moe import convert_to_block_layout
from flashinfer.fused_moe.core import (
    _maybe_get_cached_w3_w1_permute_indices,
    get_w2_permute_indices_with_cache,
)
from flashinfer.utils import get_shuffle_matrix_sf_a_row_indices
from safetensors import safe_open

from ..dtypes import same_bytes  # noqa: F401  (the tests compare with it)

NAMES = {
    "per_expert": ("gate_proj", "up_proj", "down_proj"),
    "mixtral": ("w1", "w3", "w2"),
}


def _names(root: Path, prefix: str) -> tuple[str, str, str]:
    """The layer's gate, up and down names: w1/w3/w2 for Mixtral's block_sparse_moe, unless it
    names them gate_proj/up_proj/down_proj (W8A8 exports, which vLLM's Mixtral maps)."""
    index = json.loads((Path(root) / "model.safetensors.index.json").read_text())["weight_map"]
    named = any(n.startswith(f"{prefix}.0.gate_proj.") for n in index)
    return NAMES["mixtral" if "block_sparse_moe" in prefix and not named else "per_expert"]


def _get(root: Path, name: str) -> torch.Tensor:
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(root / index[name], "pt") as f:
        return f.get_tensor(name)


def stacked(
    root: Path,
    prefix: str,
    num_experts: int,
    param: str = "weight",
    transposed: bool = False,
    interleaved: bool = False,
):
    """vLLM's stacking: w13 = [gate; up] per expert, w2 = down. Returns (w13, w2).
    `transposed`: the model class's fused tensors are stored [E, in, out] (Llama-4,
    Qwen3-VL-MoE), which vLLM's loader turns (`is_fused_checkpoint_transposed`);
    `interleaved`: the fused w13 holds gate and up rows interleaved, [g0, u0, g1, u1, ...]
    (Inkling's), which the model's loader de-interleaves (InklingMoE.load_expert_weight)."""
    root = Path(root)
    if interleaved:
        w13, w2 = stacked(root, prefix, num_experts, param, transposed)
        e, two_i, h = w13.shape
        return w13.reshape(e, two_i // 2, 2, h).transpose(1, 2).reshape(e, two_i, h), w2
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    if f"{prefix}.w13_{param}" in index:  # Inkling: mlp.experts.w13_weight, w2_weight
        return _get(root, f"{prefix}.w13_{param}"), _get(root, f"{prefix}.w2_{param}")
    if f"{prefix}.gate_up_proj" in index:  # transformers-v5 fused form
        fused = _get(root, f"{prefix}.gate_up_proj"), _get(root, f"{prefix}.down_proj")
        return tuple(t.transpose(-1, -2).contiguous() for t in fused) if transposed else fused
    if f"{prefix}.fc1.weight" in index:  # Aria: fc1 [E, H, 2I], fc2 [E, I, H], turned
        fused = _get(root, f"{prefix}.fc1.weight"), _get(root, f"{prefix}.fc2.weight")
        return tuple(t.transpose(-1, -2).contiguous() for t in fused) if transposed else fused
    if f"{prefix}.mlp.w1" in index:  # DBRX: [E*I, H] w1, v1 and w2, w2 [I, H] per expert
        w1, v1, w2 = (_get(root, f"{prefix}.mlp.{n}") for n in ("w1", "v1", "w2"))
        i = w1.shape[0] // num_experts
        w13 = torch.cat([w1.reshape(num_experts, i, -1), v1.reshape(num_experts, i, -1)], dim=1)
        return w13, w2.reshape(num_experts, i, -1).transpose(1, 2).contiguous()
    granite = prefix.removesuffix(".experts")
    if f"{granite}.input_linear.{param}" in index:  # Granite-MoE: [E, 2I, H] and [E, H, I]
        return _get(root, f"{granite}.input_linear.{param}"), _get(
            root, f"{granite}.output_linear.{param}"
        )
    if f"{granite}.gate_proj.{param}" in index:  # Step-3: one [E, out, in] per projection
        gate, up, down = (_get(root, f"{granite}.{n}.{param}") for n in NAMES["per_expert"])
        return torch.cat([gate, up], dim=1), down
    g, u, d = _names(root, prefix)
    first = 0
    if prefix.endswith((".text_experts", ".vision_experts")):
        # ERNIE-4.5-VL: the layer's mlp.experts.E are N text experts, then N vision experts
        # (vLLM's Ernie4_5_VLMoeForCausalLM.load_weights; its two sets are of one size)
        first = num_experts if prefix.endswith(".vision_experts") else 0
        prefix = prefix.rsplit(".", 1)[0] + ".experts"
    experts = range(first, first + num_experts)
    w13 = torch.stack(
        [
            torch.cat(
                [_get(root, f"{prefix}.{e}.{g}.{param}"), _get(root, f"{prefix}.{e}.{u}.{param}")]
            )
            for e in experts
        ]
    )
    w2 = torch.stack([_get(root, f"{prefix}.{e}.{d}.{param}") for e in experts])
    return w13, w2


def tp_slice(w13: torch.Tensor, w2: torch.Tensor, tp: int, rank: int):
    """vLLM's TP narrowing: w13 output rows of each half, w2 input columns."""
    i = w13.shape[1] // 2
    n, n2 = i // tp, w2.shape[2] // tp
    gate = w13[:, rank * n : (rank + 1) * n]
    up = w13[:, i + rank * n : i + (rank + 1) * n]
    return torch.cat([gate, up], dim=1), w2[:, :, rank * n2 : (rank + 1) * n2].contiguous()


def pad_per_half(w13: torch.Tensor, w2: torch.Tensor, align: int):
    """vLLM 0.33: pad I to `align`, each half of w13 separately; w2 on its columns."""
    e, two_i, h = w13.shape
    i = two_i // 2
    p = -(-i // align) * align
    out13 = w13.new_zeros((e, 2 * p, h))
    out13[:, :i] = w13[:, :i]
    out13[:, p : p + i] = w13[:, i:]
    out2 = w2.new_zeros((e, w2.shape[1], p))
    out2[:, :, :i] = w2
    return out13, out2


def pad_contiguous_seed(w13: torch.Tensor, w2: torch.Tensor, align: int):
    """The older seed code's `align_moe_weights_for_fi`: w13 padded as one block."""
    e, two_i, h = w13.shape
    i = two_i // 2
    p = -(-i // align) * align
    out13 = w13.new_zeros((e, 2 * p, h))
    out13[:, :two_i] = w13
    out2 = w2.new_zeros((e, w2.shape[1], p))
    out2[:, :, :i] = w2
    return out13, out2


def swap_w13_to_w31(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], 2, x.shape[1] // 2, *x.shape[2:]).flip(dims=[1]).reshape(x.shape)


def bf16_trtllm(w13: torch.Tensor, w2: torch.Tensor):
    """`convert_moe_weights_to_flashinfer_trtllm_block_layout` (after per-half padding)."""
    cache: dict = {}
    o13, o2 = [], []
    for i in range(w13.shape[0]):
        x = w13[i].view(torch.uint8)
        idx = _maybe_get_cached_w3_w1_permute_indices(cache, x, 128, is_gated_act_gemm=True)
        idx = (idx + x.shape[0] // 2) % x.shape[0]
        o13.append(convert_to_block_layout(x[idx.to(x.device)].contiguous(), 128))
        y = w2[i].view(torch.uint8)
        idx2 = get_w2_permute_indices_with_cache(cache, y, 128)
        o2.append(convert_to_block_layout(y[idx2.to(y.device)].contiguous(), 128))
    return torch.stack(o13).view(torch.bfloat16), torch.stack(o2).view(torch.bfloat16)


def bf16_trtllm_public(w13: torch.Tensor, w2: torch.Tensor):
    """The same with FlashInfer's public functions: swap, reorder, shuffle_matrix_a, block."""
    w31 = swap_w13_to_w31(w13)
    o13 = [
        convert_to_block_layout(
            shuffle_matrix_a(reorder_rows_for_gated_act_gemm(w31[i]).view(torch.uint8), 128), 128
        )
        for i in range(w31.shape[0])
    ]
    o2 = [
        convert_to_block_layout(shuffle_matrix_a(w2[i].view(torch.uint8), 128), 128)
        for i in range(w2.shape[0])
    ]
    return torch.stack(o13).view(torch.bfloat16), torch.stack(o2).view(torch.bfloat16)


def fp8_block_trtllm(w13: torch.Tensor, w2: torch.Tensor):
    """`_shuffle_deepseek_fp8_moe_weights` on already-swapped weights: tile 64, BlockMajorK 128."""
    o13, o2 = [], []
    for i in range(w13.shape[0]):
        o13.append(convert_to_block_layout(shuffle_matrix_a(w13[i].view(torch.uint8), 64), 128))
        o2.append(convert_to_block_layout(shuffle_matrix_a(w2[i].view(torch.uint8), 64), 128))
    return torch.stack(o13).view(torch.float8_e4m3fn), torch.stack(o2).view(torch.float8_e4m3fn)


def swizzle_128x4_ref(sf: torch.Tensor) -> torch.Tensor:
    """FlashInfer's `block_scale_interleave` of one [M, K] matrix: on CUDA FlashInfer's own;
    on CPU (where FlashInfer cannot run it) the C++ `computeSFIndex` formula, scattered."""
    if sf.is_cuda:
        from flashinfer import block_scale_interleave

        return block_scale_interleave(sf).reshape(-1)
    m, ks = sf.shape
    mp, kp = -(-m // 128) * 128, -(-ks // 4) * 4
    r = torch.arange(mp).view(-1, 1)
    c = torch.arange(kp).view(1, -1)
    off = (r // 128) * 128 * kp + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    padded = sf.new_zeros((mp, kp))
    padded[:m, :ks] = sf
    out = sf.new_zeros(mp * kp)
    out[off.reshape(-1)] = padded.reshape(-1)
    return out


def shuffle_sf_ref(sf: torch.Tensor, tile: int) -> torch.Tensor:
    """`shuffle_matrix_sf_a`: FlashInfer's on CUDA; its row indices + the swizzle on CPU."""
    if sf.is_cuda:
        from flashinfer import shuffle_matrix_sf_a

        return shuffle_matrix_sf_a(sf, tile, 32).reshape(-1)
    rows = get_shuffle_matrix_sf_a_row_indices(sf, tile, 32)
    return swizzle_128x4_ref(sf[rows])


def mx_quantize_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The OCP MX rule (vLLM's online MXFP8), by frexp instead of log2: an independent check."""
    *lead, k = x.shape
    b = x.float().reshape(*lead, k // 32, 32)
    amax = b.abs().amax(-1).clamp(min=torch.finfo(torch.float32).tiny)
    # vLLM's `amax / 448.0`: on CUDA PyTorch multiplies by float32(1/448), so do that on CPU
    ratio = amax / 448.0 if amax.is_cuda else amax * (torch.tensor(1.0) / 448.0)
    mant, exp = torch.frexp(ratio)  # ratio = mant * 2**exp, mant in [0.5, 1)
    ceil_log2 = torch.where(mant == 0.5, exp - 1, exp)
    scale = (ceil_log2 + 127).clamp(0, 254).to(torch.uint8)
    q = (b / torch.exp2(scale.float() - 127).unsqueeze(-1)).to(torch.float8_e4m3fn)
    return q.reshape(*lead, k), scale


def pad_mx(w13, s13, w2, s2, i_align=128, h_align=256):
    """vLLM 0.33 `align_mxfp8_moe_weights_for_fi_trtllm`: I per half to 128, H to 256;
    weights padded with 0, scales with 127."""
    e, two_i, h = w13.shape
    i = two_i // 2
    ip, hp = -(-i // i_align) * i_align, -(-h // h_align) * h_align

    def pad13(t, cols, value):
        out = t.new_full((e, 2 * ip, cols), value)
        out[:, :i, : t.shape[2]] = t[:, :i]
        out[:, ip : ip + i, : t.shape[2]] = t[:, i:]
        return out

    def pad2(t, cols, value):
        out = t.new_full((e, hp, cols), value)
        out[:, :h, : t.shape[2]] = t
        return out

    u8 = torch.uint8
    return (
        pad13(w13.view(u8), hp, 0),
        pad13(s13, hp // 32, 127),
        pad2(w2.view(u8), ip, 0),
        pad2(s2, ip // 32, 127),
    )


def mxfp8_trtllm(w13, s13, w2, s2):
    """`_shuffle_mxfp8_moe_weights` on swapped, padded tensors (per expert, as vLLM)."""
    o13, os13, o2, os2 = [], [], [], []
    for i in range(w13.shape[0]):
        o13.append(shuffle_matrix_a(reorder_rows_for_gated_act_gemm(w13[i]), 128))
        os13.append(shuffle_sf_ref(reorder_rows_for_gated_act_gemm(s13[i]), 128))
        o2.append(shuffle_matrix_a(w2[i], 128))
        os2.append(shuffle_sf_ref(s2[i], 128))
    return (
        torch.stack(o13).view(torch.float8_e4m3fn),
        torch.stack(os13).reshape(s13.shape),
        torch.stack(o2).view(torch.float8_e4m3fn),
        torch.stack(os2).reshape(s2.shape),
    )


def fp8_requant_w13(w13, s1, s3):
    """vLLM's per-expert w13 requantization to max(s1, s3), as written there: dequantize with
    `w.to(float16) * scale` (float16 scale: what the GPU does), `scaled_fp8_quant` with the max."""
    i = w13.shape[1] // 2
    smax = torch.maximum(s1, s3)
    out = torch.empty_like(w13)
    for e in range(w13.shape[0]):
        for half, s in ((slice(0, i), s1[e]), (slice(i, 2 * i), s3[e])):
            # on CUDA: vLLM's expression as written (0-dim float32 scale); on CPU, where
            # PyTorch would keep the scale in float32, the float16 scale the GPU uses
            dq = w13[e, half].to(torch.float16) * (s if w13.is_cuda else s.to(torch.float16))
            out[e, half] = fp8_quant(dq, smax[e])
    return out, smax


def fp8_quant(x, scale):
    """vLLM's static `scaled_fp8_quant` kernel: x * (1/scale), clamp to +-448, round to E4M3."""
    inv = 1.0 / scale.float()
    return (x.float() * inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def scalars(root, prefix, num_experts, role_names, param):
    return torch.stack(
        [
            _get(root, f"{prefix}.{e}.{n}.{param}").reshape(())
            for e in range(num_experts)
            for n in role_names
        ]
    ).view(num_experts, len(role_names))


def fp8_tensor(root, prefix, num_experts, backend, tp, rank, device):
    g, u, d = _names(root, prefix)
    w13, w2 = (t.to(device) for t in stacked(root, prefix, num_experts))
    w13, w2 = tp_slice(w13, w2, tp, rank)
    out = {}
    if w13.dtype == torch.bfloat16:  # vLLM online FP8: a dynamic per-tensor scale per expert
        # the kernel's absmax / FP8_MAX is an IEEE division (CUDA C), so divide on the CPU
        def dyn(t):  # floored at the smallest normal float32 (an all-zero expert: 0 in vLLM)
            return (t.float().abs().max().cpu() / torch.tensor(448.0)).clamp(min=2.0**-126)

        s13 = torch.stack([dyn(w13[e]) for e in range(w13.shape[0])]).to(device)
        s2 = torch.stack([dyn(w2[e]) for e in range(w2.shape[0])]).to(device)
        w13 = torch.stack([fp8_quant(w13[e], s13[e]) for e in range(w13.shape[0])])
        w2 = torch.stack([fp8_quant(w2[e], s2[e]) for e in range(w2.shape[0])])
        a13 = a2 = None
    else:
        s = scalars(root, prefix, num_experts, (g, u, d), "weight_scale").to(device)
        a = scalars(root, prefix, num_experts, (g, u, d), "input_scale").to(device)
        w13, s13 = fp8_requant_w13(w13, s[:, 0], s[:, 1])
        s2 = s[:, 2]
        a13, a2 = a[:, :2].max(), a[:, 2].max()
    w13, w2 = pad_per_half(w13.view(torch.uint8), w2.view(torch.uint8), 16)
    w13 = swap_w13_to_w31(w13)
    if backend == "trtllm":
        w13 = torch.stack([shuffle_matrix_a(reorder_rows_for_gated_act_gemm(x), 128) for x in w13])
        w2 = torch.stack([shuffle_matrix_a(x, 128) for x in w2])
    out["w13_weight"] = w13.view(torch.float8_e4m3fn)
    out["w2_weight"] = w2.view(torch.float8_e4m3fn)
    out["w13_weight_scale"], out["w2_weight_scale"] = s13, s2
    if a13 is None:
        return out
    out["w13_input_scale"], out["w2_input_scale"] = a13, a2
    g1, g2 = (s13 * a13).squeeze(), (s2 * a2).squeeze()
    a2_inv = 1.0 / a2
    if backend == "trtllm":
        out |= {
            "output1_scales_gate_scalar": g1,
            "output1_scales_scalar": g1 / a2,  # 0.33 trtllm_fp8_moe.py: g1_alphas / a2
            "output2_scales_scalar": g2,
        }
    else:
        out |= {"g1_alphas": g1, "g2_alphas": g2, "a2_gscale": a2_inv}
    return out


def _param_name(root, prefix, *names):
    index = json.loads((Path(root) / "model.safetensors.index.json").read_text())["weight_map"]
    g = _names(root, prefix)[0]
    return next(n for n in names if f"{prefix}.0.{g}.{n}" in index)


def pad_to(t, rows=None, cols=None):
    """Zero-pad the last two dims of [E, R, C] at the end."""
    e, r, c = t.shape
    out = t.new_zeros((e, rows or r, cols or c))
    out[:, :r, :c] = t
    return out


def pad_halves_to(t, rows_per_half):
    e, two_r, c = t.shape
    r = two_r // 2
    out = t.new_zeros((e, 2 * rows_per_half, c))
    out[:, :r] = t[:, :r]
    out[:, rows_per_half : rows_per_half + r] = t[:, r:]
    return out


def nvfp4(root, prefix, num_experts, backend, tp, rank, device):
    g, u, d = _names(root, prefix)
    wname = _param_name(root, prefix, "weight", "weight_packed")
    w13, w2 = (t.to(device) for t in stacked(root, prefix, num_experts, wname))
    s13, s2 = (
        t.to(device).view(torch.uint8) for t in stacked(root, prefix, num_experts, "weight_scale")
    )
    w13, w2 = tp_slice(w13, w2, tp, rank)
    s13, s2 = tp_slice(s13, s2, tp, rank)
    gname = _param_name(root, prefix, "weight_scale_2", "weight_global_scale")
    aname = _param_name(root, prefix, "input_scale", "input_global_scale")
    gs = scalars(root, prefix, num_experts, (g, u, d), gname)
    a = scalars(root, prefix, num_experts, (g, u, d), aname)
    if gname == "weight_global_scale":  # compressed-tensors: vLLM inverts the reciprocals
        gs = 1 / gs
    if aname == "input_global_scale":
        a = 1 / a
    a13, a2 = a[:, :2].max(), a[:, 2].max()  # global max (use_global_sf)
    e = num_experts
    w31, s31 = swap_w13_to_w31(w13), swap_w13_to_w31(s13)  # reorder_w1w3_to_w3w1
    out = {"w13_input_scale": a13.expand(e), "w2_input_scale": a2.expand(e)}
    if backend == "cutlass":
        out["w13_weight"], out["w2_weight"] = w31, w2
        for name, s in (("w13_weight_scale", s31), ("w2_weight_scale", s2)):
            mp, kp = -(-s.shape[1] // 128) * 128, -(-s.shape[2] // 4) * 4
            sw = torch.stack([swizzle_128x4_ref(s[i]) for i in range(e)])
            out[name] = sw.reshape(e, mp, kp).view(torch.float8_e4m3fn)
        g1, g2 = gs[:, 0] * a13, gs[:, 2] * a2
        out |= {
            # FlashInferExperts.process_weights_after_loading folds these in place
            "w13_weight_scale_2": g1,
            "w2_weight_scale_2": g2,
            "g1_alphas": g1,
            "g2_alphas": g2,
            "a1_gscale": (1 / a13).expand(e),
            "a2_gscale": (1 / a2).expand(e),
        }
        return out
    h = w2.shape[1]
    hp = -(-h // 256) * 256  # align_fp4_moe_hidden_dim_for_fi
    ip = -(-(w2.shape[2] * 2) // 64) * 64  # align_fp4_moe_weights_for_fi, per half
    w31 = pad_halves_to(pad_to(w31, cols=hp // 2), ip)
    s31 = pad_halves_to(pad_to(s31, cols=hp // 16), ip)
    w2 = pad_to(w2, rows=hp, cols=ip // 2)
    s2 = pad_to(s2, rows=hp, cols=ip // 16)
    cache: dict = {}
    o13, os13, o2, os2 = [], [], [], []
    for i in range(e):
        idx = _maybe_get_cached_w3_w1_permute_indices(cache, w31[i], 128)
        o13.append(w31[i][idx.to(w31.device)])
        sidx = _maybe_get_cached_w3_w1_permute_indices(cache, s31[i], 128, num_elts_per_sf=16)
        os13.append(swizzle_128x4_ref(s31[i][sidx.to(s31.device)].contiguous()))
        idx2 = get_w2_permute_indices_with_cache(cache, w2[i], 128)
        o2.append(w2[i][idx2.to(w2.device)])
        sidx2 = get_w2_permute_indices_with_cache(cache, s2[i], 128, num_elts_per_sf=16)
        os2.append(swizzle_128x4_ref(s2[i][sidx2.to(s2.device)].contiguous()))
    out["w13_weight"], out["w2_weight"] = torch.stack(o13), torch.stack(o2)
    out["w13_weight_scale"] = torch.stack(os13).reshape(s31.shape).view(torch.float8_e4m3fn)
    out["w2_weight_scale"] = torch.stack(os2).reshape(s2.shape).view(torch.float8_e4m3fn)
    g1 = gs[:, 0] * a13  # TrtLlmNvFp4Experts: w13_scale_2 *= a13 (w1's global scale)
    out |= {
        "w13_weight_scale_2": g1,
        "w2_weight_scale_2": gs[:, 2] * a2,
        "g1_scale_c": g1 * (1 / a2),
    }
    return out


def mxfp4(root, prefix, tp, rank, device, backend="trtllm"):
    """vLLM's gpt-oss loader (TP narrowing into padded params) + its TRT-LLM MXFP4 processing,
    or its FLASHINFER_CUTLASS_MXFP4_MXFP8 one (de-interleave to [up; gate], swizzled scales)."""
    get = lambda n: _get(Path(root), f"{prefix}.{n}").to(device)  # noqa: E731
    b13, s13, bias13 = (
        get("gate_up_proj_blocks"),
        get("gate_up_proj_scales"),
        get("gate_up_proj_bias"),
    )
    b2, s2, bias2 = get("down_proj_blocks"), get("down_proj_scales"), get("down_proj_bias")
    e, two_i, hb, _ = b13.shape
    i, h = two_i // 2, hb * 32
    i_r = ((i // 32 + tp - 1) // tp) * 32  # ceil(I / 32 / tp) * 32
    start, end = rank * i_r, min(i, (rank + 1) * i_r)
    n = max(0, end - start)
    h_align = 256 if backend == "trtllm" else 128
    i_a, h_a = -(-i_r // 128) * 128, -(-h // h_align) * h_align
    # allocation (zeros) and the loader's copy of this rank's slice into its corner
    w13 = b13.new_zeros((e, 2 * i_a, h_a // 32, 16))
    w13[:, : 2 * n, :hb] = b13[:, 2 * start : 2 * start + 2 * n]
    sc13 = s13.new_zeros((e, 2 * i_a, h_a // 32))
    sc13[:, : 2 * n, :hb] = s13[:, 2 * start : 2 * start + 2 * n]
    bb13 = bias13.new_zeros((e, 2 * i_a))
    bb13[:, : 2 * n] = bias13[:, 2 * start : 2 * start + 2 * n]
    w2 = b2.new_zeros((e, h_a, i_a // 32, 16))
    w2[:, :h, : n // 32] = b2[:, :, start // 32 : start // 32 + n // 32]
    sc2 = s2.new_zeros((e, h_a, i_a // 32))
    sc2[:, :h, : n // 32] = s2[:, :, start // 32 : start // 32 + n // 32]
    bb2 = bias2.new_zeros((e, h_a))
    if rank == 0:
        bb2[:, :h] = bias2

    if backend == "cutlass":
        return _mxfp4_cutlass(w13, sc13, bb13, w2, sc2, bb2)

    def swap_pairs(t):  # [gate0, up0, gate1, up1, ...] -> [up0, gate0, ...] along dim 1
        s = t.shape
        return t.reshape(s[0], s[1] // 2, 2, *s[2:]).flip(2).reshape(s)

    w13, sc13, bb13 = swap_pairs(w13), swap_pairs(sc13), swap_pairs(bb13)
    cache: dict = {}
    out: dict[str, list] = {k: [] for k in ("w13", "s13", "b13", "w2", "s2", "b2")}
    for x in range(e):
        m13 = w13[x].reshape(2 * i_a, -1)
        idx = get_w2_permute_indices_with_cache(cache, m13, 128).to(device)
        out["w13"].append(m13[idx])
        sidx = get_w2_permute_indices_with_cache(cache, sc13[x], 128, num_elts_per_sf=16)
        out["s13"].append(swizzle_128x4_ref(sc13[x][sidx.to(device)].contiguous()))
        bidx = get_w2_permute_indices_with_cache(cache, bb13[x].reshape(-1, 1), 128)
        out["b13"].append(bb13[x].float()[bidx.to(device)])
        m2 = w2[x].reshape(h_a, -1)
        idx2 = get_w2_permute_indices_with_cache(cache, m2, 128).to(device)
        out["w2"].append(m2[idx2])
        sidx2 = get_w2_permute_indices_with_cache(cache, sc2[x], 128, num_elts_per_sf=16)
        out["s2"].append(swizzle_128x4_ref(sc2[x][sidx2.to(device)].contiguous()))
        out["b2"].append(bb2[x].float()[idx2])
    st = {k: torch.stack(v) for k, v in out.items()}
    return {
        "w13_weight": st["w13"],
        "w13_weight_scale": st["s13"].reshape(sc13.shape),
        "w13_bias": st["b13"],
        "w2_weight": st["w2"],
        "w2_weight_scale": st["s2"].reshape(sc2.shape),
        "w2_bias": st["b2"],
    }


def _mxfp4_cutlass(w13, sc13, bb13, w2, sc2, bb2):
    e = w13.shape[0]

    def up_gate(t):  # de-interleave [gate, up] rows, then [w3; w1]
        gate, up = t[:, ::2], t[:, 1::2]
        w1, w3 = torch.chunk(torch.cat([gate, up], dim=1), 2, dim=1)
        return torch.cat([w3, w1], dim=1)

    s13 = up_gate(sc13)
    sw13 = torch.stack([swizzle_128x4_ref(s13[x].contiguous()) for x in range(e)])
    sw2 = torch.stack([swizzle_128x4_ref(sc2[x].contiguous()) for x in range(e)])
    return {
        "w13_weight": up_gate(w13).reshape(e, w13.shape[1], -1),
        "w13_weight_scale": sw13.reshape(s13.shape),
        "w13_bias": up_gate(bb13.float()).to(torch.bfloat16),
        "w2_weight": w2.reshape(e, w2.shape[1], -1),
        "w2_weight_scale": sw2.reshape(sc2.shape),
        "w2_bias": bb2,
    }


def expected(
    root,
    prefix,
    num_experts,
    scheme,
    backend,
    tp,
    rank,
    device="cpu",
    transposed=False,
    interleaved=False,
):
    """What vLLM 0.33 holds for this layer and rank after load-time preprocessing.

    `device` is where the checkpoint tensors go before the FlashInfer steps run on them;
    `transposed`: the model's fused expert tensors are stored [E, in, out]; `interleaved`: its
    fused w13's gate and up rows interleave (`stacked`).
    """

    def load(param="weight"):
        stack = stacked(root, prefix, num_experts, param, transposed, interleaved)
        return tuple(t.to(device) for t in stack)

    if scheme == "bf16":
        w13, w2 = tp_slice(*load(), tp, rank)
        if backend == "cutlass":
            return {"w13_weight": swap_w13_to_w31(w13), "w2_weight": w2}
        w13, w2 = pad_per_half(w13, w2, 128)
        o13, o2 = bf16_trtllm(w13, w2)
        return {"w13_weight": o13, "w2_weight": o2}
    if scheme == "mxfp4":
        return mxfp4(root, prefix, tp, rank, device, backend)
    if scheme == "nvfp4":
        return nvfp4(root, prefix, num_experts, backend, tp, rank, device)
    if scheme == "fp8-tensor":
        return fp8_tensor(root, prefix, num_experts, backend, tp, rank, device)
    if scheme == "mxfp8":
        w13, w2 = load()
        if w13.dtype == torch.bfloat16:
            (w13, s13), (w2, s2) = mx_quantize_ref(w13), mx_quantize_ref(w2)
        else:
            s13, s2 = load("weight_scale")
        w13, w2 = tp_slice(w13, w2, tp, rank)
        s13, s2 = tp_slice(s13, s2, tp, rank)
        w13, s13, w2, s2 = pad_mx(w13, s13, w2, s2)
        w13, s13 = swap_w13_to_w31(w13), swap_w13_to_w31(s13)
        o = mxfp8_trtllm(w13, s13, w2, s2)
        names = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")
        return dict(zip(names, o, strict=True))
    w13, w2 = load()
    s13, s2 = load("weight_scale_inv")
    w13, w2 = tp_slice(w13, w2, tp, rank)
    s13, s2 = tp_slice(s13, s2, tp, rank)  # the same narrowing on the 128x128 block grid
    w13, s13 = swap_w13_to_w31(w13), swap_w13_to_w31(s13)
    if backend == "trtllm":
        w13, w2 = fp8_block_trtllm(w13, w2)
    return {
        "w13_weight": w13,
        "w2_weight": w2,
        "w13_weight_scale_inv": s13.float().clamp(min=1e-10),
        "w2_weight_scale_inv": s2.float().clamp(min=1e-10),
    }

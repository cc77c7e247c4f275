"""fi_convert's outputs against SGLang 0.5.23's own MoE code, a test authority (issue 26,
step 1): real FusedMoE layers built by SGLang on CPU with `--moe-runner-backend
flashinfer_trtllm` (gpt-oss MXFP4: `flashinfer_mxfp4`; BF16 also `flashinfer_cutlass`), the raw
checkpoint through SGLang's own weight loader and its `process_weights_after_loading`, one
process playing TP rank r of N (tests/sglang_moe.py says what is not SGLang's own).

(a) SGLang's processed bytes equal an expectation built here from the raw checkpoint tensors
    with fi_convert.layout's functions and SGLang's rules (sharding by the padded size, w13
    as [up; gate], which transforms), for every TP rank; where SGLang's layout is vLLM's (BF16
    TRT-LLM at I/TP a multiple of 128), they also equal fi-convert's current output.
(b) Where SGLang's bytes are not vLLM 0.33's, the tensors that differ from fi-convert's current
    (vLLM-target) output, first one first: the SGLang target's expected layouts.
"""

from __future__ import annotations

import json
import os
import re
import sys
from importlib import metadata

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert, load_moe_layer
from fi_convert import layout as L
from fi_convert.servers.sglang import checks, releases
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests import hf_checkpoints
from tests import sglang_moe as sm

E4M3 = torch.float8_e4m3fn
RELEASE = metadata.version("sglang")  # the release whose own code is the authority here
TILE = 128  # FlashInfer TRT-LLM's epilogue tile M for BF16 (SGLang and vLLM alike)
BF16_BLOCK = 64  # BlockMajorK: 128 bytes of BF16
FP8_BLOCK = 128  # DeepSeek's 128x128 weight blocks

# (scheme, spec, layer prefix)
CASES = {
    # I per rank 512, 256, 128: a multiple of 128 at every TP size
    "qwen3-bf16": (
        "bf16",
        Spec("qwen3-moe", layers=1, experts=6, hidden=128, intermediate=512, shards=1),
        "model.layers.0.mlp.experts",
    ),
    # I per rank 192, 96, 48: padded to 256, 128, 128; an odd expert count
    "mixtral-bf16-7": (
        "bf16",
        Spec("mixtral", layers=1, experts=7, hidden=128, intermediate=192, shards=1),
        "model.layers.0.block_sparse_moe.experts",
    ),
    "deepseek-fp8-block": (
        "fp8-block",
        Spec("deepseek-v3", layers=2, experts=8, hidden=256, intermediate=512, shards=2),
        "model.layers.1.mlp.experts",
    ),
    # ModelOpt NVFP4; I per rank 384, 192, 96 (96: padded to 128 by both servers); H a multiple
    # of 128 (SGLang's w2 scale shuffle asserts it: H=320 fails in FlashInfer's index helper)
    "deepseek-nvfp4": (
        "nvfp4",
        Spec("deepseek-v3", layers=2, experts=5, hidden=256, intermediate=384, quant="nvfp4"),
        "model.layers.1.mlp.experts",
    ),
    # ModelOpt NVFP4, 3 experts, H 384 (a multiple of 128, not of 256: vLLM pads it, SGLang
    # does not), I 192: I per rank 192, 96, 48, padded to 192, 128, 64 and sharded by it
    # (TP 2: rank 1 holds 64 rows; TP 4: rank 3 none)
    "deepseek-nvfp4-h384": (
        "nvfp4",
        Spec("deepseek-v3", layers=2, experts=3, hidden=384, intermediate=192, quant="nvfp4"),
        "model.layers.1.mlp.experts",
    ),
    # ModelOpt NVFP4 on CUTLASS where the 128x4 swizzle pads: H 336 (w2's rows to 384, w13's
    # columns 21 to 24: SGLang keeps both swizzles apart, beside the scales as loaded), I 256
    # (I/TP 256, 128, 64); H 320 (w2's only; w13's swizzle in place)
    "deepseek-nvfp4-h336": (
        "nvfp4",
        Spec("deepseek-v3", layers=2, experts=3, hidden=336, intermediate=256, quant="nvfp4"),
        "model.layers.1.mlp.experts",
    ),
    "deepseek-nvfp4-h320": (
        "nvfp4",
        Spec("deepseek-v3", layers=2, experts=3, hidden=320, intermediate=128, quant="nvfp4"),
        "model.layers.1.mlp.experts",
    ),
    # ModelOpt NVFP4 with a SwiGLU clamp (config.json swiglu_limit, which SGLang's DeepSeek
    # MoE passes its experts): on CUTLASS it changes no byte; on TRT-LLM SGLang rescales the
    # block scales of the half with the smaller alpha: expert 1's gate half (its up global
    # scale 1.3 times its gate's), expert 4's up half (0.7 times); the others' gate and up
    # global scales are equal (TIED), as the synthetic NVFP4 checkpoints make them
    "deepseek-nvfp4-clamp": (
        "nvfp4",
        Spec(
            "deepseek-v3",
            layers=2,
            experts=5,
            hidden=256,
            intermediate=384,
            quant="nvfp4",
            config={"swiglu_limit": 10.0},
        ),
        "model.layers.1.mlp.experts",
    ),
    # ModelOpt MXFP8 (SGLang's native mxfp8 method), 3 experts, H 384 (vLLM pads it to 512,
    # SGLang does not), I 320: I per rank 320, 160 padded to 384 and 256 (scales padded with
    # 0 by SGLang, 127 by vLLM) and sharded by it (TP 2: rank 1 holds 64 rows)
    "qwen3-mxfp8": (
        "mxfp8",
        Spec("qwen3-moe", layers=1, experts=3, hidden=384, intermediate=320, quant="mxfp8"),
        "model.layers.0.mlp.experts",
    ),
    # ... 5 experts, H 256, I 256: I per rank 256, 128, 64 (padded to 128, sharded by it: at
    # TP 4 ranks 2 and 3 hold none of I)
    "qwen3-mxfp8-5": (
        "mxfp8",
        Spec("qwen3-moe", layers=1, experts=5, hidden=256, intermediate=256, quant="mxfp8"),
        "model.layers.0.mlp.experts",
    ),
    # ModelOpt FP8 per-tensor (ModelOptFp8MoEMethod), 5 experts, I 200: I per rank 200, 100,
    # 50, none a multiple of 16. TRT-LLM: padded to 256 and 128 by FusedMoE and sharded by it
    # (TP 2: rank 1 holds 72 rows; TP 4: ranks 2 and 3 none); CUTLASS: each half padded to 16
    "qwen3-fp8-tensor": (
        "fp8-tensor",
        Spec("qwen3-moe", layers=1, experts=5, hidden=128, intermediate=200, quant="fp8-tensor"),
        "model.layers.0.mlp.experts",
    ),
    # transformers-written (tests/hf_checkpoints.py): H 64, I 128 (I per rank 128, 64, 32)
    "hf-qwen3-moe": ("bf16", "qwen3_moe", "model.layers.0.mlp.experts"),
    "hf-mixtral": ("bf16", "mixtral", "model.layers.0.block_sparse_moe.experts"),
    # gpt-oss MXFP4 (SGLang's --moe-runner-backend flashinfer_mxfp4); H 320 and I 192 padded
    "gpt-oss-mxfp4": (
        "mxfp4",
        Spec("gpt-oss", layers=2, experts=3, hidden=320, intermediate=192),
        "model.layers.1.mlp.experts",
    ),
    # gpt-oss MXFP4 for SGLang's SM90 CUTLASS path (c only): 5 experts, H 576 (not a multiple
    # of 128 nor 256: padded to 768), I 384 (I/TP 384, 192, 96: padded to 384, 256, 128)
    "gpt-oss-mxfp4-h576": (
        "mxfp4",
        Spec("gpt-oss", layers=2, experts=5, hidden=576, intermediate=384),
        "model.layers.1.mlp.experts",
    ),
}
# SGLang's names for the parameters vLLM (and fi-convert) name otherwise
SGLANG_NAMES = {"w13_weight_bias": "w13_bias", "w2_weight_bias": "w2_bias"}
PARAMS = [(case, tp, rank) for case in CASES for tp in (1, 2, 4) for rank in range(tp)]
ONLY_C = ("deepseek-nvfp4-h384", "deepseek-nvfp4-h336", "deepseek-nvfp4-h320")
ONLY_C += ("deepseek-nvfp4-clamp",)
ONLY_C += ("qwen3-mxfp8", "qwen3-mxfp8-5", "qwen3-fp8-tensor")
ONLY_C += ("gpt-oss-mxfp4-h576",)
PARAMS = [p for p in PARAMS if p[0] not in ONLY_C]  # (c) only
# (a) has an expectation of its own for these (NVFP4 and MXFP4: (b) shows their weights and
# block scales against vLLM's, with the CPU stand-in of the scale swizzle)
PARAMS_A = [p for p in PARAMS if CASES[p[0]][0] not in ("nvfp4", "mxfp4")]
# (b) against fi-convert's output: every case on TRT-LLM; BF16 on FlashInfer CUTLASS too
# (SGLang's FP8 block falls back to Triton there: test_fp8_block_cutlass_falls_back_to_triton)
PARAMS_B = [(*p, "trtllm") for p in PARAMS]
PARAMS_B += [(*p, "cutlass") for p in PARAMS if p[0] in ("qwen3-bf16", "mixtral-bf16-7")]

FP8_ALL = ["w13_weight", "w13_weight_scale_inv", "w2_weight", "w2_weight_scale_inv"]
# (b): the tensors of SGLang 0.5.23 that differ from vLLM 0.33's (fi-convert's output), in
# the output's order, as measured with SGLang's own code; (case, tp) -> names
DIFFERS_FROM_VLLM = {
    ("qwen3-bf16", 1): [],
    ("qwen3-bf16", 2): [],
    ("qwen3-bf16", 4): [],
    # TP 1: both pad each half 192 -> 256 (SGLang's one shard is the whole padded size)
    ("mixtral-bf16-7", 1): [],
    # SGLang shards by the padded size: rank r holds rows [r*128, (r+1)*128) of I=192
    ("mixtral-bf16-7", 2): ["w13_weight", "w2_weight"],
    ("mixtral-bf16-7", 4): ["w13_weight", "w2_weight"],
    # transformers-written, I 128: equal at TP 1; at TP 2 and 4 SGLang shards by 128, so rank
    # 0 holds all of I and the other ranks only zeros
    **{(c, 1): [] for c in ("hf-qwen3-moe", "hf-mixtral")},
    **{
        (c, tp): ["w13_weight", "w2_weight"]
        for c in ("hf-qwen3-moe", "hf-mixtral")
        for tp in (2, 4)
    },
    # SGLang keeps MajorK [up; gate] unshuffled, vLLM shuffles into BlockMajorK; SGLang keeps
    # the scales as loaded, vLLM clamps them to >= 1e-10: the synthetic checkpoint's 1e-23 lies
    # in expert 0's first blocks of up and down, which rank 0 holds at every TP size
    ("deepseek-fp8-block", 1): FP8_ALL,
    ("deepseek-fp8-block", 2): FP8_ALL,
    ("deepseek-fp8-block", 4): FP8_ALL,
}
FP8_OTHER_RANKS = ["w13_weight", "w2_weight"]  # no scale below 1e-10 there
# NVFP4: every scalar differs (SGLang keeps [E, 2] gate/up weight and input scales, the
# per-expert w2 input scale, its own g1_scale_c, and holds five more: the alphas and the
# inverse input scales); the weights and block scales agree at TP 1 and 2, not at TP 4
NV_SCALARS = ["g1_scale_c", "w13_input_scale", "w13_weight_scale_2", "w2_input_scale"]
NV_SCALARS += ["w2_weight_scale_2"]
NV_SGLANG_ONLY = ["g1_alphas", "g1_alphas_up", "g2_alphas", "w13_input_scale_quant"]
NV_SGLANG_ONLY += ["w2_input_scale_quant"]
NV_ALL = ["g1_scale_c", "w13_input_scale", "w13_weight", "w13_weight_scale"]
NV_ALL += ["w13_weight_scale_2", "w2_input_scale", "w2_weight", "w2_weight_scale"]
NV_ALL += ["w2_weight_scale_2"]
MX_DIFFERS = ["w13_weight_scale", "w2_weight_scale", "gemm1_alpha", "gemm1_beta"]
MX_DIFFERS += ["gemm1_clamp_limit"]
DIFFERS_FROM_VLLM.update(
    {
        ("deepseek-nvfp4", 1): NV_SCALARS + NV_SGLANG_ONLY,
        ("deepseek-nvfp4", 2): NV_SCALARS + NV_SGLANG_ONLY,
        # I/TP = 96 padded to 128: SGLang shards by 128 (rank 3 holds zeros), vLLM by 96
        ("deepseek-nvfp4", 4): NV_ALL + NV_SGLANG_ONLY,
        # weights and biases are vLLM's byte for byte; the scales (UE8M0, viewed as
        # float8_e4m3fn by both) only in their padding: SGLang fills it with 127 (2^0), vLLM
        # with 0 (test_mxfp4_scales_differ_only_in_padding); SGLang holds its SwiGLU constants
        # as parameters besides
        **{("gpt-oss-mxfp4", tp): MX_DIFFERS for tp in (1, 2, 4)},
    }
)


def proven_here(out) -> None:
    """Skip a test of how SGLang 0.5.23's layout of an output differs from vLLM's where the
    installed release is not proven for that output's layout (releases.py): there
    test_sglang_output_equals_sglangs_own_bytes shows that its bytes are other."""
    m = json.loads((out / "fi-convert-manifest.json").read_text())
    if RELEASE not in releases.proven_for(m):
        pytest.skip(f"SGLang {RELEASE} is not proven for this layout (its own bytes differ)")


def differs_from_vllm(case: str, tp: int, rank: int) -> list[str]:
    if case == "deepseek-fp8-block" and rank > 0:
        return FP8_OTHER_RANKS
    return DIFFERS_FROM_VLLM[case, tp]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-src")
    return {
        name: (
            write_checkpoint(root / name, spec)
            if isinstance(spec, Spec)
            else hf_checkpoints.save(spec, root / name)
        )
        for name, (_, spec, _) in CASES.items()
    } | {"deepseek-nvfp4-clamp": _tied(root)}


TIED = (0, 2, 3)


def _tied(root):
    """The clamp case's checkpoint: expert 1's up global scale the larger, expert 4's the
    smaller, the TIED experts' equal to their gate's."""
    ckpt = root / "deepseek-nvfp4-clamp"
    sm.set_up_scales(ckpt, CASES["deepseek-nvfp4-clamp"][2], {1: 1.3, 4: 0.7})
    return ckpt


@pytest.fixture(scope="module")
def sglang_layers(checkpoints):
    """SGLang's processed layer for (case, tp, rank), each built once."""
    done: dict = {}

    def get(case: str, tp: int, rank: int, backend: str = "trtllm"):
        key = (case, tp, rank, backend)
        if key not in done:
            scheme, _, prefix = CASES[case]
            ours = f"mxfp4-{backend}" if scheme == "mxfp4" else backend
            done[key] = sm.build(ours, tp, rank, checkpoints[case], prefix)
        return done[key]

    return get


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, checkpoints):
    """fi-convert's output for (case, tp, backend, server): the vLLM 0.33-target one by
    default, SGLang's with server "sglang"."""
    root = tmp_path_factory.mktemp("sglang-out")
    done: dict = {}

    def get(case: str, tp: int, backend: str = "trtllm", server: str = "vllm"):
        key = (case, tp, backend, server)
        if key not in done:
            out = root / "-".join(map(str, key))
            scheme = SchemeName(CASES[case][0])
            opts = Options(scheme=scheme, backend=Backend(backend), tp_size=tp, server=server)
            convert(checkpoints[case], out, opts, device="cpu")
            done[key] = out
        return done[key]

    return get


# ---- the expectation: SGLang's rules, fi_convert.layout's transforms, the raw tensors ----


def raw(ckpt, prefix: str) -> dict[str, torch.Tensor]:
    """The layer's checkpoint tensors stacked over experts: {"gate_proj.weight": [E, ...], ...}."""
    per: dict[str, dict[int, torch.Tensor]] = {}
    for name, t in sm.source_tensors(ckpt, prefix):
        e, rest = name.split(".", 1)
        per.setdefault(rest, {})[int(e)] = t
    return {k: torch.stack([v[e] for e in sorted(v)]) for k, v in per.items()}


def shard(t: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    """SGLang's TP slice (`narrow_padded_param_and_loaded_weight`): `size` entries from
    rank * size along `dim`, as many as the tensor holds, then zeros up to `size`."""
    start = min(rank * size, t.shape[dim])
    part = t.narrow(dim, start, min(size, t.shape[dim] - start))
    pad = list(t.shape)
    pad[dim] = size - part.shape[dim]
    return torch.cat([part, torch.zeros(pad, dtype=t.dtype)], dim=dim)


def expected(case: str, ckpt, tp: int, rank: int) -> dict[str, torch.Tensor]:
    scheme, _, prefix = CASES[case]
    src = raw(ckpt, prefix)
    cfg = json.loads((ckpt / "config.json").read_text())
    inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    i_p = L.round_up(inter // tp, 128)  # FusedMoE pads I per rank on TRT-LLM
    gate, up, down = (src[f"{p}.weight"] for p in ("gate_proj", "up_proj", "down_proj"))
    e, h = gate.shape[0], gate.shape[2]
    if scheme == "bf16":
        # [up; gate] (swapped at load), the gated interleave and the row shuffle of FlashInfer's
        # w3/w1 permute indices, BlockMajorK of 128 bytes; w2 row shuffle and BlockMajorK
        w13 = torch.cat([shard(up, 1, rank, i_p), shard(gate, 1, rank, i_p)], dim=1)
        idx = L.compose(L.gated_interleave_index(2 * i_p), L.shuffle_row_index(2 * i_p, TILE))
        out13 = torch.empty((e, h // BF16_BLOCK, 2 * i_p, BF16_BLOCK), dtype=torch.bfloat16)
        w2 = shard(down, 2, rank, i_p).contiguous()
        out2 = torch.empty((e, i_p // BF16_BLOCK, h, BF16_BLOCK), dtype=torch.bfloat16)
        return {
            "w13_weight": L.gather_rows_block_major(w13, idx, BF16_BLOCK, out13),
            "w2_weight": L.gather_rows_block_major(
                w2, L.shuffle_row_index(h, TILE), BF16_BLOCK, out2
            ),
        }
    # fp8-block: [up; gate] weights and block scales as loaded, MajorK, nothing shuffled
    sk = "weight_scale_inv"
    gs, us, ds = (src[f"{p}.{sk}"] for p in ("gate_proj", "up_proj", "down_proj"))
    b = i_p // FP8_BLOCK
    return {
        "w13_weight": torch.cat([shard(up, 1, rank, i_p), shard(gate, 1, rank, i_p)], dim=1),
        "w2_weight": shard(down, 2, rank, i_p),
        "w13_weight_scale_inv": torch.cat([shard(us, 1, rank, b), shard(gs, 1, rank, b)], dim=1),
        "w2_weight_scale_inv": shard(ds, 2, rank, b),
    }


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().view(-1).view(torch.uint8).numpy())


def differing(theirs: dict[str, torch.Tensor], ours: dict[str, torch.Tensor]) -> list[str]:
    """Names (in `ours`' order) whose dtype, element count or bytes differ; a name missing on
    either side differs."""
    names = list(ours) + [n for n in theirs if n not in ours]
    out = []
    for n in names:
        a, b = theirs.get(n), ours.get(n)
        # both servers view MXFP4's UE8M0 scale bytes as float8_e4m3fn for the kernel
        viewed = a is not None and b is not None and (b.dtype, a.dtype) == (torch.uint8, E4M3)
        same = (
            a is not None
            and b is not None
            and (a.dtype == b.dtype or viewed)
            and a.numel() == b.numel()
            and _bytes(a) == _bytes(b)
        )
        if not same:
            out.append(n)
    return out


def assert_same(theirs: dict[str, torch.Tensor], ours: dict[str, torch.Tensor], what: str) -> None:
    diff = differing(theirs, ours)
    assert not diff, f"{diff[0]} differs from {what} (all differing: {diff})"


# ---- (a) ----


@pytest.mark.parametrize(("case", "tp", "rank"), PARAMS_A)
def test_sglang_bytes_equal_the_expected_layout(case, tp, rank, checkpoints, sglang_layers):
    layer = sglang_layers(case, tp, rank)
    assert (layer.moe_tp_size, layer.moe_tp_rank) == (tp, rank)  # SGLang played this rank
    assert_same(sm.params(layer), expected(case, checkpoints[case], tp, rank), "the expectation")


# ---- (b), and (a) where the layouts coincide ----


@pytest.mark.parametrize(("case", "tp", "rank", "backend"), PARAMS_B)
def test_sglang_against_vllm_target_output(case, tp, rank, backend, sglang_layers, outputs):
    proven_here(outputs(case, tp, backend, "sglang"))
    prefix = CASES[case][2]
    ours = load_moe_layer(outputs(case, tp, backend), prefix, tp_rank=rank)
    layer = sglang_layers(case, tp, rank, backend)
    mx = CASES[case][0] == "mxfp4"
    assert checks.runner_of(layer) == sm.BACKEND["mxfp4-trtllm" if mx else backend]
    theirs = sm.params(layer)
    diff = differing({SGLANG_NAMES.get(n, n): t for n, t in theirs.items()}, ours)
    # BF16 on FlashInfer CUTLASS: [up; gate] MajorK, I/TP unpadded, as vLLM
    want = [] if backend == "cutlass" else differs_from_vllm(case, tp, rank)
    assert diff == want, (
        f"SGLang vs fi-convert's vLLM-target output: differing {diff}, first "
        f"{diff[0] if diff else None}; expected {want}"
    )


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_fp8_block_vllm_is_sglang_shuffled_and_clamped(tp, sglang_layers, outputs):
    """(b), how they differ: vLLM's FP8 block bytes are SGLang's with FlashInfer's row shuffle
    (epilogue tile 64) and BlockMajorK (128 bytes) applied to the same [up; gate] weights, and
    the same scales clamped to >= 1e-10: the rows, their order and the scale layout agree."""
    prefix = CASES["deepseek-fp8-block"][2]
    for rank in range(tp):
        theirs = sm.params(sglang_layers("deepseek-fp8-block", tp, rank))
        derived = {}
        for name in ("w13_weight", "w2_weight"):
            w = theirs[name].view(torch.uint8)
            e, m, k = w.shape
            out = torch.empty((e, k // FP8_BLOCK, m, FP8_BLOCK), dtype=torch.uint8)
            idx = L.shuffle_row_index(m, 64)
            derived[name] = L.gather_rows_block_major(w, idx, FP8_BLOCK, out).view(w.dtype)
            derived[name] = derived[name].view(torch.float8_e4m3fn)
        for name in ("w13_weight_scale_inv", "w2_weight_scale_inv"):
            # the clamp matters on rank 0 (see DIFFERS_FROM_VLLM)
            assert bool((theirs[name] < 1e-10).any()) == (rank == 0)
            derived[name] = theirs[name].clamp(min=1e-10)
        ours = load_moe_layer(outputs("deepseek-fp8-block", tp), prefix, tp_rank=rank)
        assert_same(derived, ours, "vLLM's")


def test_nvfp4_scalars(checkpoints, sglang_layers, outputs):
    """(b), how the NVFP4 scalars differ: SGLang's w2 alpha is vLLM's (g2_alphas is the bytes
    of vLLM's w2_weight_scale_2); its w13 input scale holds, for each expert, the input scale
    loaded last (up_proj, after gate_proj) in both columns, where vLLM takes the max over all
    experts' gate and up input scales, so the two alphas differ when a checkpoint's gate and
    up input scales differ (this synthetic one's do)."""
    prefix = CASES["deepseek-nvfp4"][2]
    src = raw(checkpoints["deepseek-nvfp4"], prefix)
    for tp in (1, 2):
        for rank in range(tp):
            theirs = sm.params(sglang_layers("deepseek-nvfp4", tp, rank))
            ours = load_moe_layer(outputs("deepseek-nvfp4", tp), prefix, tp_rank=rank)
            name = "w2_weight_scale_2"
            assert_same({name: theirs["g2_alphas"]}, {name: ours[name]}, "vLLM's w2 alpha")
            a13 = theirs["w13_input_scale"]
            up = src["up_proj.input_scale"].float().reshape(-1)
            assert torch.equal(a13[:, 0], up) and torch.equal(a13[:, 1], up)
            gate = src["gate_proj.input_scale"].float().reshape(-1)
            assert not torch.equal(gate, up)  # the case where the two servers' alphas differ
            vllm_a1 = torch.maximum(gate, up).max()
            assert torch.equal(ours["w13_input_scale"], vllm_a1.expand(len(up)))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_mxfp4_scales_differ_only_in_padding(tp, sglang_layers, outputs):
    """(b), how gpt-oss MXFP4 scales differ (H 320 padded to 512 by both servers, so scale
    columns 10 -> 16): every differing byte is 127 (UE8M0 1.0) in SGLang's and 0 in vLLM's,
    and there are such bytes on every rank."""
    prefix = CASES["gpt-oss-mxfp4"][2]
    for rank in range(tp):
        theirs = sm.params(sglang_layers("gpt-oss-mxfp4", tp, rank))
        ours = load_moe_layer(outputs("gpt-oss-mxfp4", tp), prefix, tp_rank=rank)
        for name in ("w13_weight_scale", "w2_weight_scale"):
            a, b = theirs[name].view(torch.uint8), ours[name]
            assert a.shape == b.shape, name
            d = a != b
            assert bool(d.any()), name
            assert bool((a[d] == 127).all()) and bool((b[d] == 0).all()), name


@pytest.mark.parametrize("tp", [1, 2])
def test_fp8_block_cutlass_falls_back_to_triton(tp, checkpoints, sglang_layers):
    """SGLang 0.5.23 has no FlashInfer CUTLASS path for DeepSeek FP8 block: asked for
    flashinfer_cutlass, it runs Triton, holding [gate; up] as loaded (an SGLang output must
    refuse this case at plan time)."""
    prefix = CASES["deepseek-fp8-block"][2]
    src = raw(checkpoints["deepseek-fp8-block"], prefix)
    for rank in range(tp):
        layer = sglang_layers("deepseek-fp8-block", tp, rank, "cutlass")
        assert checks.runner_of(layer) == "triton"
        i_r = src["gate_proj.weight"].shape[1] // tp
        w13 = torch.cat(
            [shard(src[f"{p}.weight"], 1, rank, i_r) for p in ("gate_proj", "up_proj")], 1
        )
        assert_same(
            {"w13_weight": sm.params(layer)["w13_weight"]}, {"w13_weight": w13}, "[gate; up]"
        )


def test_mixtral_tp4_high_ranks_hold_only_zeros(sglang_layers):
    """I=192 at TP 4: SGLang shards by the padded 128, so ranks 0 and 1 hold all of I and
    ranks 2 and 3 only zeros (vLLM: 48 rows each, padded)."""
    for rank, zero in ((0, False), (1, False), (2, True), (3, True)):
        p = sm.params(sglang_layers("mixtral-bf16-7", 4, rank))
        assert all(bool((t == 0).all()) == zero for t in p.values()), rank


def test_nvfp4_tp4_last_rank_holds_zero_weights(sglang_layers):
    """NVFP4 I=384 at TP 4: I/TP 96 is padded to 128 and SGLang shards by it, so rank 3's
    weights and block scales are all zeros (vLLM: 96 rows each, padded)."""
    names = ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale")
    for rank in range(4):
        p = sm.params(sglang_layers("deepseek-nvfp4", 4, rank))
        zero = [bool((p[n].view(torch.uint8) == 0).all()) for n in names]
        assert zero == [rank == 3] * 4, (rank, zero)


def test_sglang_layer_state(sglang_layers):
    """What SGLang's processing leaves on the layer (the plugin must leave the same)."""
    state = sm.layer_state(sglang_layers("mixtral-bf16-7", 2, 1))
    assert state["layer.intermediate_size_per_partition"] == 128  # 96 padded
    assert state["layer.moe_runner_config.intermediate_size_per_partition"] == 128
    assert state["layer.hidden_size"] == 128
    assert checks.runner_of(sglang_layers("mixtral-bf16-7", 2, 1)) == "flashinfer_trtllm"
    assert state["layer.quant_method"] == "UnquantizedFusedMoEMethod"
    fp8 = sm.layer_state(sglang_layers("deepseek-fp8-block", 2, 0))
    assert fp8["layer.quant_method"] == "Fp8MoEMethod"
    assert fp8["layer.intermediate_size_per_partition"] == 256


# ---- (c) fi-convert's --server sglang output: SGLang's own bytes ----

# Every TP size and rank. BF16 on both backends: Qwen3-MoE (I/TP a multiple of 128), Mixtral
# with 7 experts and I 192 (I/TP 192, 96, 48: padded, and sharded by the padded size on
# TRT-LLM), the transformers-written ones (I/TP 128, 64, 32) on TRT-LLM. DeepSeek FP8 block on
# TRT-LLM (MajorK, unshuffled, unclamped: rank 0 holds a scale of 1e-23). gpt-oss MXFP4 on
# TRT-LLM (SGLang's flashinfer_mxfp4), 3 experts, H 320 and I 192: I/TP 192, 96, 64 padded to
# 256 and 128, rank 3 of 4 holding none of I (its scales only SGLang's 127 padding); on CUTLASS
# (flashinfer_mxfp4 on SM90) at TP 1 and 2 (I/TP 192, 96 padded to 256, 128; H to 512), and
# 5 experts H 576 I 384 at TP 1, 2, 4 (H to 768; I/TP 384, 192, 96 to 384, 256, 128). ModelOpt
# NVFP4 on TRT-LLM: H 256 I 384 (I/TP 96 padded to 128, sharded by it) and H 384 I 192 (H not
# padded by SGLang, I/TP 96 and 48 padded to 128 and 64), gate and up input scales differing.
# ModelOpt FP8 per-tensor on both backends, 5 experts, I 200 (I/TP 200, 100, 50: TRT-LLM pads
# to 256 and 128 and shards by it, CUTLASS pads each half to 16)
SM90_OK = {("gpt-oss-mxfp4", 1), ("gpt-oss-mxfp4", 2)}
SM90_OK |= {("gpt-oss-mxfp4-h576", tp) for tp in (1, 2, 4)}
SGLANG_CASES = [
    (case, tp, rank, backend)
    for case in (
        "qwen3-bf16",
        "mixtral-bf16-7",
        "hf-qwen3-moe",
        "hf-mixtral",
        "deepseek-fp8-block",
        "gpt-oss-mxfp4",
        "deepseek-nvfp4",
        "deepseek-nvfp4-h384",
        "deepseek-nvfp4-h336",
        "deepseek-nvfp4-h320",
        "deepseek-nvfp4-clamp",
        "qwen3-mxfp8",
        "qwen3-mxfp8-5",
        "qwen3-fp8-tensor",
        "gpt-oss-mxfp4-h576",
    )
    for backend in ("trtllm", "cutlass")
    for tp in (1, 2, 4)
    for rank in range(tp)
    if (
        backend == "trtllm"
        and (case, tp) != ("qwen3-mxfp8", 4)  # I/TP 80: not MX blocks
        and case not in ("deepseek-nvfp4-h336", "deepseek-nvfp4-h320")  # H % 128: refused
        and case != "gpt-oss-mxfp4-h576"
    )
    # gpt-oss MXFP4 on SM90 (CUTLASS) where SGLang loads it: I/32 % TP == 0 (I 192 at TP 4:
    # test_sm90_mxfp4_refused_where_sglang_cannot_load)
    or (backend == "cutlass" and (case, tp) in SM90_OK)
    or case in ("qwen3-bf16", "mixtral-bf16-7", "qwen3-fp8-tensor")
    # NVFP4 on CUTLASS where 2*I/TP is a multiple of 128 (both servers refuse to pad it)
    or (case, tp) in (("deepseek-nvfp4", 1), ("deepseek-nvfp4", 2), ("deepseek-nvfp4-h384", 1))
    # ... and where H is not a multiple of 128 (the swizzles apart)
    or (backend, case) == ("cutlass", "deepseek-nvfp4-h336")
    or (backend, case, tp) == ("cutlass", "deepseek-nvfp4-h320", 1)
    # ... and with a SwiGLU clamp (on TRT-LLM above, every TP)
    or (backend, case) == ("cutlass", "deepseek-nvfp4-clamp")
    and tp < 4
]
# What SGLang's processing makes from the layer's config alone, not from the checkpoint: not in
# the output, the plugin's kernel setup sets them (tests/test_sglang_plugin.py): gpt-oss
# MXFP4's SwiGLU constants, one per expert (TRT-LLM's names; SM90's)
FROM_CONFIG = {"gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit"}
FROM_CONFIG |= {"swiglu_alpha", "swiglu_beta", "swiglu_limit"}
PADDED_SPLIT = ("mixtral-bf16-7", "hf-qwen3-moe", "hf-mixtral")


def refuted(case: str, tp: int, rank: int, backend: str, sglang_layers, ours) -> bool:
    """Whether the installed release, left out of an output's releases, truly is not its: its
    own processing runs the layer on another MoE runner, holds other bytes, or swizzles scales
    of another shape than the output's (the CPU stand-in of FlashInfer's swizzle names it)."""
    try:
        layer = sglang_layers(case, tp, rank, backend)
    except AssertionError as e:
        return "block_scale_interleave of" in str(e)
    runner = f"mxfp4-{backend}" if CASES[case][0] == "mxfp4" else backend
    theirs = {n: t for n, t in sm.params(layer).items() if n not in FROM_CONFIG}
    return checks.runner_of(layer) != sm.BACKEND[runner] or bool(differing(theirs, ours))


@pytest.mark.parametrize(("case", "tp", "rank", "backend"), SGLANG_CASES)
def test_sglang_output_equals_sglangs_own_bytes(case, tp, rank, backend, sglang_layers, outputs):
    """`--server sglang`: every tensor of the rank is the bytes SGLang's own FusedMoE holds
    after its weight loading and processing of the source (names, dtypes, sizes, bytes)."""
    prefix = CASES[case][2]
    out = outputs(case, tp, backend, "sglang")
    ours = load_moe_layer(out, prefix, tp_rank=rank)
    m = json.loads((out / "fi-convert-manifest.json").read_text())
    if RELEASE not in releases.proven_for(m):
        assert refuted(case, tp, rank, backend, sglang_layers, ours)
        return
    layer = sglang_layers(case, tp, rank, backend)
    runner = f"mxfp4-{backend}" if CASES[case][0] == "mxfp4" else backend
    skip = FROM_CONFIG if CASES[case][0] == "mxfp4" else set()
    theirs = {n: t for n, t in sm.params(layer).items() if n not in skip}
    assert checks.runner_of(layer) == sm.BACKEND[runner]
    if runner == "mxfp4-cutlass":
        assert layer.quant_method._fi_kernel == "cutlass_sm90"  # SGLang took its SM90 branch
    assert_same(theirs, ours, "SGLang's own")
    assert m["server"] == "sglang" and m["target"]["sglang"] == "0.5.23"
    # recorded where SGLang's split is not the even one: I/TP padded (Mixtral at TP 2 and 4,
    # the transformers-written ones at TP 2 and 4; NVFP4 I/TP 96 and 48 padded to 64s), on
    # TRT-LLM
    split = m["layers"][prefix].get("tp_split")
    padded = backend == "trtllm" and tp > 1 and case in PADDED_SPLIT
    padded |= (case, tp) in (("deepseek-nvfp4", 4), ("deepseek-nvfp4-h384", 2))
    padded |= (case, tp) == ("deepseek-nvfp4-clamp", 4)
    padded |= (case, tp) in (("deepseek-nvfp4-h384", 4), ("qwen3-mxfp8", 2), ("qwen3-mxfp8-5", 4))
    padded |= backend == "trtllm" and (case, tp) in (
        ("qwen3-fp8-tensor", 2),
        ("qwen3-fp8-tensor", 4),
    )
    assert split == ("padded" if padded else None)


def test_sglang_output_control_vllm_split_differs(outputs, sglang_layers):
    """The control: where SGLang shards by the padded size (Mixtral I 192 at TP 2), the vLLM
    output's rank 1 is not SGLang's, the SGLang output's is; and rank 0's SGLang bytes are
    not rank 1's."""
    prefix = CASES["mixtral-bf16-7"][2]
    theirs = sm.params(sglang_layers("mixtral-bf16-7", 2, 1))
    vllm = load_moe_layer(outputs("mixtral-bf16-7", 2), prefix, tp_rank=1)
    assert differing(theirs, vllm) == ["w13_weight", "w2_weight"]
    sgl = outputs("mixtral-bf16-7", 2, "trtllm", "sglang")
    assert differing(theirs, load_moe_layer(sgl, prefix, tp_rank=1)) == []
    assert differing(theirs, load_moe_layer(sgl, prefix, tp_rank=0)) == ["w13_weight", "w2_weight"]


def test_sm90_mxfp4_refused_where_sglang_cannot_load(checkpoints, outputs):
    """SGLang 0.5.23's SM90 path allocates I/TP rows, and its gpt-oss loader slices
    ceil(I/32/TP)*32 rows into them: I 192 at TP 4 (64 rows into 48) fails in SGLang's own
    loading; fi-convert refuses it at plan time, naming the TP sizes that load."""
    from fi_convert.errors import LayoutError

    prefix = CASES["gpt-oss-mxfp4"][2]
    with pytest.raises(RuntimeError, match="must match the size"):
        sm.build("mxfp4-cutlass", 4, 0, checkpoints["gpt-oss-mxfp4"], prefix)
    with pytest.raises(LayoutError, match=r"I 192 at --tp-size 4: SGLang .* use --tp-size 1, 2,"):
        outputs("gpt-oss-mxfp4", 4, "cutlass", "sglang")


def test_sm90_mxfp4_controls(sglang_layers, outputs):
    """The SM90 comparison can fail: another rank's bytes, and vLLM's CUTLASS layout of the same
    checkpoint (SM100, MXFP8 activations), are not SGLang's SM90 bytes, but for vLLM's w13 bias
    (the same [up; gate] halves padded to round_up(I/TP, 128), in the checkpoint's BF16)."""
    prefix = CASES["gpt-oss-mxfp4-h576"][2]
    layer = sglang_layers("gpt-oss-mxfp4-h576", 2, 1, "cutlass")
    theirs = {n: t for n, t in sm.params(layer).items() if n not in FROM_CONFIG}
    sgl = outputs("gpt-oss-mxfp4-h576", 2, "cutlass", "sglang")
    rank0 = differing(theirs, load_moe_layer(sgl, prefix, tp_rank=0))
    # the down bias is rank 0's only: zeros on rank 1 and in SGLang's rank 1
    assert set(rank0) == set(theirs), rank0
    vllm = load_moe_layer(outputs("gpt-oss-mxfp4-h576", 2, "cutlass"), prefix, tp_rank=1)
    names = {"w13_bias": "w13_weight_bias", "w2_bias": "w2_weight_bias"}
    diff = differing(theirs, {names.get(n, n): t for n, t in vllm.items()})
    assert set(diff) == set(theirs) - {"w13_weight_bias"}, diff


# ---- negative controls: the comparisons can fail ----


def test_control_another_rank_is_caught(checkpoints, sglang_layers):
    theirs = sm.params(sglang_layers("qwen3-bf16", 2, 1))
    with pytest.raises(AssertionError, match="w13_weight differs"):
        assert_same(theirs, expected("qwen3-bf16", checkpoints["qwen3-bf16"], 2, 0), "rank 0")


def test_control_one_byte_is_caught(checkpoints, sglang_layers):
    theirs = {k: v.clone() for k, v in sm.params(sglang_layers("deepseek-fp8-block", 1, 0)).items()}
    theirs["w2_weight"].view(torch.uint8).view(-1)[12345] ^= 1
    want = expected("deepseek-fp8-block", checkpoints["deepseek-fp8-block"], 1, 0)
    with pytest.raises(AssertionError, match=r"w2_weight differs .*\['w2_weight'\]"):
        assert_same(theirs, want, "the expectation")


def test_stand_ins_leave_no_trace(sglang_layers):
    """After SGLang ran, this process has no triton, IPython or torchvision stand-in (vLLM's
    tests in the same pytest process probe for Triton)."""
    sglang_layers("qwen3-bf16", 1, 0)
    assert not [n for n in sys.modules if n.split(".")[0] in ("triton", "IPython", "torchvision")]
    import importlib.util

    assert importlib.util.find_spec("triton") is None
    assert torch.get_default_dtype() == torch.float32
    # SGLang's import points these caches at its own folder (setdefault): undone after
    caches = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")
    assert "sglang" not in " ".join(os.environ.get(k, "") for k in caches).lower()


def test_the_triton_stand_in_has_no_active_driver_as_triton_without_a_gpu():
    """`triton.runtime.driver.active` raises in the stand-in, as real Triton's DriverConfig does
    where no driver is active; SGLang's code that asks Triton for the device takes its CPU
    fallback (kernels/ops/attention/fla/utils.py, which models/qwen3_5.py's Mamba kernels
    import: before, `getattr(torch, <stand-in>)` failed their import)."""
    import importlib

    from fi_convert.servers.sglang.stand_ins import NO_DRIVER, _StubModule, installed

    with installed():  # (only SGLang's own imports get the stand-ins)
        fla = importlib.import_module("sglang.kernels.ops.attention.fla.utils")
        assert (fla.get_available_device(), fla.device_torch_lib) == ("cpu", torch.cpu)
        assert importlib.import_module("sglang.srt.models.qwen3_5").Qwen3_5ForCausalLM
    driver = _StubModule("triton.runtime.driver")  # as `import triton.runtime.driver` gives it
    for active in (lambda: fla.triton.runtime.driver.active, lambda: driver.active):
        with pytest.raises(RuntimeError, match=re.escape(NO_DRIVER)):
            active()
    assert callable(fla.triton.runtime.driver.set_active)  # anything else answers


def test_the_cpu_scale_swizzle_refuses_a_shape_not_checked_on_the_gpu():
    """The CPU version of FlashInfer's `block_scale_interleave` that SGLang's processing runs
    here is proven equal to FlashInfer's on the GPU machine for tests/swizzle_shapes.py's
    shapes only (tests/test_gpu.py): any other shape stops the test that passes it."""
    from tests.swizzle_shapes import SGLANG_SCALE_SHAPES

    shape = (640, 20)
    assert shape not in SGLANG_SCALE_SHAPES
    with pytest.raises(AssertionError, match=r"block_scale_interleave of \(640, 20\).*swizzle"):
        sm._block_scale_interleave(torch.zeros(shape, dtype=torch.uint8))
    listed = sorted(SGLANG_SCALE_SHAPES)[0]
    assert sm._block_scale_interleave(torch.ones(listed, dtype=torch.uint8)).numel() >= 128 * 4


def test_nvfp4_cutlass_padded_swizzles_apart(checkpoints, sglang_layers, outputs):
    """NVFP4 on CUTLASS where the swizzle pads (H 320: w2's rows to 384; H 336: w13's columns
    21 to 24 too): SGLang holds the padded swizzle as `w*_blockscale_swizzled` (vLLM's
    `w*_weight_scale` bytes) and `w*_weight_scale` as loaded (w2's: the checkpoint's rows,
    w13's: [up; gate]); a swizzle that does not pad stays in place, aliased."""
    prefix = CASES["deepseek-nvfp4-h320"][2]
    for case, apart in (("deepseek-nvfp4-h320", ["w2"]), ("deepseek-nvfp4-h336", ["w13", "w2"])):
        layer = sglang_layers(case, 1, 0, "cutlass")
        theirs = sm.params(layer)
        vllm = load_moe_layer(outputs(case, 1, "cutlass"), prefix)
        src = raw(checkpoints[case], prefix)
        for w in ("w13", "w2"):
            swz = getattr(layer, f"{w}_blockscale_swizzled")
            assert (swz is getattr(layer, f"{w}_weight_scale")) == (w not in apart), (case, w)
            assert _bytes(swz.data) == _bytes(vllm[f"{w}_weight_scale"])
        if "w13" in apart:
            up_gate = torch.cat([src["up_proj.weight_scale"], src["gate_proj.weight_scale"]], 1)
            assert _bytes(theirs["w13_weight_scale"]) == _bytes(up_gate)
        assert _bytes(theirs["w2_weight_scale"]) == _bytes(src["down_proj.weight_scale"])


def test_nvfp4_swiglu_clamp(checkpoints, sglang_layers, outputs, tmp_path):
    """A SwiGLU clamp (DeepSeek's config.json `swiglu_limit`, which SGLang's DeepseekV2MoE
    passes its experts as the runner config's `swiglu_limit`). On CUTLASS SGLang's parameters
    are those without it, byte for byte (the clamp goes to `_cutlass_swiglu_params`, from the
    config: the plugin's). On TRT-LLM its processing multiplies the w13 block scales of the
    half with the smaller GEMM1 alpha by smaller/larger (experts whose alphas differ: not the
    TIED ones), ties g1_alphas and g1_alphas_up to the larger and adds gemm1_clamp_limit =
    limit / g1_alphas: the output holds that (test_sglang_output_equals_sglangs_own_bytes,
    every rank), and an output converted without the clamp is caught. (SGLang 0.5.23's: an
    older release is not proven for it, its own bytes differ.)"""
    proven_here(outputs("deepseek-nvfp4-clamp", 1, "trtllm", "sglang"))
    prefix = CASES["deepseek-nvfp4-clamp"][2]
    ckpt = checkpoints["deepseek-nvfp4-clamp"]
    for tp, rank in ((1, 0), (2, 1)):
        with_clamp = sm.params(sglang_layers("deepseek-nvfp4-clamp", tp, rank, "cutlass"))
        without = sm.build("cutlass", tp, rank, _unclamped(ckpt, tmp_path), prefix)
        assert differing(with_clamp, sm.params(without)) == []
    limit = sglang_layers("deepseek-nvfp4-clamp", 1, 0, "cutlass")._cutlass_swiglu_params[2]
    assert limit.tolist() == [10.0] * 5
    theirs = sm.params(sglang_layers("deepseek-nvfp4-clamp", 1, 0))
    assert torch.equal(theirs["g1_alphas"], theirs["g1_alphas_up"])
    out = outputs("deepseek-nvfp4-clamp", 1, "trtllm", "sglang")
    m = json.loads((out / "fi-convert-manifest.json").read_text())
    assert m["layers"][prefix]["swiglu_limit"] == 10.0
    ours = load_moe_layer(out, prefix)
    opts = Options(scheme=SchemeName.NVFP4, backend=Backend.TRTLLM, server="sglang")
    convert(_unclamped(ckpt, tmp_path), tmp_path / "plain", opts, device="cpu")
    plain = load_moe_layer(tmp_path / "plain", prefix)
    want = ["w13_weight_scale", "g1_alphas", "g1_alphas_up", "gemm1_clamp_limit", "g1_scale_c"]
    assert sorted(differing(theirs, plain)) == sorted(want)
    moved = [
        x
        for x in range(5)
        if _bytes(ours["w13_weight_scale"][x]) != _bytes(plain["w13_weight_scale"][x])
    ]
    assert moved == [x for x in range(5) if x not in TIED]


def _unclamped(ckpt, tmp_path):
    """A copy of the checkpoint without config.json's swiglu_limit."""
    import shutil

    src = tmp_path / "unclamped-src"
    if not src.exists():
        shutil.copytree(ckpt, src)
        cfg = json.loads((src / "config.json").read_text())
        del cfg["swiglu_limit"]
        (src / "config.json").write_text(json.dumps(cfg))
    return src


def _with_larger_gate_input_scale(ckpt, prefix: str, expert: int) -> float:
    """Rewrite the checkpoint's shard so that one expert's gate_proj input scale is the
    largest of the layer's gate and up ones (exporters give gate and up one scale: this is the
    case where the two servers' rules differ). Returns that scale."""
    from safetensors.torch import load_file, save_file

    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    name = f"{prefix}.{expert}.gate_proj.input_scale"
    shard = ckpt / index[name]
    tensors = load_file(shard)
    top = max(float(t) for n, t in tensors.items() if n.endswith("proj.input_scale"))
    tensors[name] = torch.tensor(top * 2, dtype=torch.float32).reshape(tensors[name].shape)
    save_file(tensors, shard, metadata={"format": "pt"})
    return top * 2


@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_fp8_tensor_w13_input_scale_is_the_one_loaded_last(backend, tmp_path):
    """ModelOpt FP8: SGLang's loader keeps one w13 input scale per expert, the last one it reads
    (up_proj, after gate_proj), and its processing takes the max over experts; vLLM takes the
    max over gate and up. With a gate scale the largest, SGLang's own bytes are the --server
    sglang output's (every scalar made from it too), and vLLM's w13_input_scale is that gate
    scale."""
    spec = Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=128, quant="fp8-tensor")
    prefix = "model.layers.0.mlp.experts"
    ckpt = write_checkpoint(tmp_path / "src", spec)
    gate = _with_larger_gate_input_scale(ckpt, prefix, 1)
    layer = sm.build(backend, 1, 0, ckpt, prefix)
    theirs = sm.params(layer)
    assert float(theirs["w13_input_scale"]) < gate
    for server in ("sglang", "vllm"):
        out = tmp_path / server
        opts = Options(SchemeName.FP8_TENSOR, Backend(backend), 1, server=server)
        convert(ckpt, out, opts, device="cpu")
        ours = load_moe_layer(out, prefix)
        if server == "sglang":
            assert_same(theirs, ours, "SGLang's own")
        else:
            assert float(ours["w13_input_scale"]) == gate
            assert "w13_input_scale" in differing(theirs, ours)


@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_fp8_tensor_from_bf16_sglang_has_no_flashinfer_layout(backend, checkpoints, outputs):
    """BF16 experts served as FP8 by SGLang (`--quantization fp8`: Fp8MoEMethod quantizes them
    on load, one dynamic scale per expert's w13 and w2): on flashinfer_cutlass it runs Triton;
    on flashinfer_trtllm its weights stay [up; gate] as loaded, unshuffled, and it makes none of
    the output scales its TRT-LLM path reads, so there is no FlashInfer layout of SGLang's to
    write (fi-convert refuses BF16 -> fp8-tensor for SGLang: test_server_option); the bytes are
    not fi-convert's offline quantization for vLLM either."""
    _, spec, prefix = CASES["qwen3-bf16"]
    ckpt = checkpoints["qwen3-bf16"]
    with sm.sglang_context(backend, 1, 0), sm.fp8_quant():
        from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
        from sglang.srt.layers.quantization.fp8 import Fp8Config

        layer = FusedMoE(
            num_experts=spec.experts,
            hidden_size=spec.hidden,
            intermediate_size=spec.intermediate,
            layer_id=0,
            top_k=2,
            params_dtype=torch.bfloat16,
            quant_config=Fp8Config(is_checkpoint_fp8_serialized=False),
            prefix=prefix,
        )
        sm.load(layer, ckpt, prefix)
        sm.process(layer)
    theirs = sm.params(layer)
    assert theirs["w13_weight"].dtype == E4M3 and theirs["w13_weight_scale"].shape == (6,)
    if backend == "cutlass":
        assert checks.runner_of(layer) == "triton"
        return
    assert checks.runner_of(layer) == "flashinfer_trtllm"
    assert not hasattr(layer, "output1_scales_scalar")
    # [up; gate] as loaded: each expert's up rows quantized with the expert's one scale
    up = raw(ckpt, prefix)["up_proj.weight"]
    s13 = theirs["w13_weight_scale"].view(-1, 1, 1)
    want = (up.float() * (1 / s13)).clamp(-448, 448).to(E4M3)
    got = theirs["w13_weight"][:, : spec.intermediate]
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    opts = Options(SchemeName.FP8_TENSOR, Backend.TRTLLM, 1, allow_unservable=True)
    out = outputs("qwen3-bf16", 1).parent / "bf16-fp8t"
    convert(ckpt, out, opts, device="cpu")
    ours = load_moe_layer(out, prefix)
    assert "w13_weight" in differing(theirs, ours)


# SGLang's ModelOpt FP8 CUTLASS quant scales and the vLLM-target output's tensors of the same
# values (fi-convert's --server vllm names)
FP8T_CUTLASS_NAMES = {
    "fc1_dequant": "g1_alphas",
    "fc2_quant": "a2_gscale",
    "fc2_dequant": "g2_alphas",
    "fc1_input_dequant": "w13_input_scale",
}


@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_fp8_tensor_against_vllm_target_output(backend, tp, sglang_layers, outputs):
    """(b) for ModelOpt FP8 (I 200: I/TP 200, 100, 50), what SGLang holds against fi-convert's
    vLLM-target output. TRT-LLM: the weights (SGLang pads I/TP to 128, vLLM to 16) and
    output1_scales_scalar (SGLang g1 * (1/a2), vLLM g1 / a2: another rounding, in some
    experts); the other scalars are vLLM's. CUTLASS: w13 is vLLM's with its halves swapped
    ([gate; up]), w2 is vLLM's, and the four quant scales are vLLM's values under other
    names."""
    prefix = CASES["qwen3-fp8-tensor"][2]
    for rank in range(tp):
        theirs = sm.params(sglang_layers("qwen3-fp8-tensor", tp, rank, backend))
        ours = load_moe_layer(outputs("qwen3-fp8-tensor", tp, backend), prefix, tp_rank=rank)
        if backend == "trtllm":
            assert differing(theirs, ours) == ["output1_scales_scalar", "w13_weight", "w2_weight"]
            g1, a2 = ours["output1_scales_gate_scalar"], ours["w2_input_scale"]
            assert torch.equal(theirs["output1_scales_scalar"], g1 * (1.0 / a2))
            assert torch.equal(ours["output1_scales_scalar"], g1 / a2)
            continue
        renamed = {FP8T_CUTLASS_NAMES.get(n, n): t for n, t in theirs.items()}
        assert differing(renamed, ours) == ["w13_weight"]
        w13 = ours["w13_weight"].view(torch.uint8)
        half = w13.shape[1] // 2
        swapped = torch.cat([w13[:, half:], w13[:, :half]], dim=1)
        assert torch.equal(theirs["w13_weight"].view(torch.uint8), swapped)


def test_fp8_tensor_control_cpu_dequantize_is_caught(tmp_path):
    """The control of the stand-in for CUDA's evaluation of SGLang's `per_tensor_dequantize`
    (tests/sglang_moe.py `fp8_quant`): with the CPU's own evaluation (the 0-dim scale kept
    unrounded), SGLang's requantized w13 is not the output's (a few bytes of one expert), so
    the comparison sees one rounding."""
    from unittest import mock

    spec = Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=128, quant="fp8-tensor")
    prefix = "model.layers.0.mlp.experts"
    ckpt = write_checkpoint(tmp_path / "src", spec)
    with sm.sglang_context("cutlass", 1, 0):
        from sglang.kernels.ops.quantization import fp8_kernel

        kernel = mock.patch.object(
            fp8_kernel, "sgl_per_tensor_quant_fp8", sm._per_tensor_quant_fp8, create=True
        )
        with kernel:
            layer = sm.make_layer(prefix, ckpt)
            sm.load(layer, ckpt, prefix)
            sm.process(layer)
    out = tmp_path / "out"
    convert(ckpt, out, Options(SchemeName.FP8_TENSOR, Backend.CUTLASS, 1, server="sglang"))
    ours = load_moe_layer(out, prefix)
    assert differing(sm.params(layer), ours) == ["w13_weight"]
    assert_same(sm.params(sm.build("cutlass", 1, 0, ckpt, prefix)), ours, "SGLang's own")

"""The SGLang plugin (fi_convert/servers/sglang/), with SGLang 0.5.23's own code as the authority
on CPU (tests/sglang_moe.py: SGLang's FusedMoE, built, loaded and processed by SGLang).

- Layers: SGLang's own layer loads the source through its own weight loader and processing; a
  second SGLang layer gets the output through the plugin's path (experts.install + finish).
  Every parameter and every attribute of the layer and its method must be equal, and the
  plugin must fill the parameters SGLang allocated, in place. Negative controls: another
  rank's bytes, and a layer without the kernel setup, are caught.
- A whole tiny model through SGLang's `get_model_loader`, the plugin's loader for the output
  against SGLang's default loader for the source.
- Each refusal (one line starting "fi-convert: ", naming the fix), the registration of the
  load format and hooks, and the entry point as pyproject.toml declares it.

The outputs are fi-convert's BF16, DeepSeek FP8 block, gpt-oss MXFP4, ModelOpt NVFP4, MXFP8 and
FP8 outputs converted with --server sglang (tests/test_sglang.py proves their bytes against
SGLang's own at every TP rank).
"""

from __future__ import annotations

import contextlib
import gc
import json
import subprocess
import sys
import threading
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.format.names import MANIFEST_NAME
from fi_convert.format.reader import OutputReader
from fi_convert.servers.sglang import checks, releases, target
from fi_convert.servers.sglang.checks import PluginError
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests import hf_checkpoints
from tests import sglang_moe as sm
from tests.conftest import files_open, reader_threads

ROOT = Path(__file__).resolve().parents[1]
QWEN = "model.layers.0.mlp.experts"
MIXTRAL = "model.layers.0.block_sparse_moe.experts"
CASES = {
    # I 512: I/TP 512, 256, 128, a multiple of 128 at every TP
    "qwen3": (Spec("qwen3-moe", layers=1, experts=6, hidden=128, intermediate=512, shards=1), QWEN),
    # I 192, 7 experts: I/TP 192 (TRT-LLM pads it to 256 at TP 1), 96, 48 (CUTLASS, unpadded)
    "mixtral": (Spec("mixtral", layers=1, experts=7, hidden=128, intermediate=192), MIXTRAL),
    # DeepSeek FP8 128x128 block (fp8-block): I/TP 512, 256, 128
    "deepseek": (
        Spec("deepseek-v3", layers=2, experts=8, hidden=256, intermediate=512, shards=2),
        "model.layers.1.mlp.experts",
    ),
    # gpt-oss MXFP4 (flashinfer_mxfp4), 3 experts, H 320 (padded to 512), I 192: I/TP 192, 96,
    # 64, padded to 256 and 128; rank 3 of 4 holds none of I
    "gpt-oss": (
        Spec("gpt-oss", layers=2, experts=3, hidden=320, intermediate=192),
        "model.layers.1.mlp.experts",
    ),
    # ... for SGLang's SM90 CUTLASS path: 5 experts, H 576 (padded to 768), I 384: I/TP 96 at
    # TP 4, padded to 128
    "gpt-oss-h576": (
        Spec("gpt-oss", layers=2, experts=5, hidden=576, intermediate=384),
        "model.layers.1.mlp.experts",
    ),
    # ModelOpt NVFP4, 5 experts, H 256, I 384: I/TP 384, 192, 96 (padded to 128, sharded by
    # it: rank 3 of 4 holds none of I)
    "nvfp4": (
        Spec("deepseek-v3", layers=2, experts=5, hidden=256, intermediate=384, quant="nvfp4"),
        "model.layers.1.mlp.experts",
    ),
    # ... 3 experts, H 384 (vLLM pads it, SGLang does not), I 192: I/TP 192, 96, 48
    "nvfp4-h384": (
        Spec("deepseek-v3", layers=2, experts=3, hidden=384, intermediate=192, quant="nvfp4"),
        "model.layers.1.mlp.experts",
    ),
    # ... on CUTLASS where the scale swizzle pads: H 336 (w13's and w2's swizzles apart), I 256
    # (I/TP 256, 128); H 320 (w2's apart), I 128
    "nvfp4-h336": (
        Spec("deepseek-v3", layers=2, experts=3, hidden=336, intermediate=256, quant="nvfp4"),
        "model.layers.1.mlp.experts",
    ),
    "nvfp4-h320": (
        Spec("deepseek-v3", layers=2, experts=3, hidden=320, intermediate=128, quant="nvfp4"),
        "model.layers.1.mlp.experts",
    ),
    # ... with a SwiGLU clamp (config.json swiglu_limit 10, as SGLang's DeepSeek MoE reads it;
    # on TRT-LLM SGLang rescales expert 1's gate half and expert 4's up half: CLAMP_UP)
    "nvfp4-clamp": (
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
    # ModelOpt MXFP8 (SGLang's native mxfp8 method): H 384 (unpadded), I 320 (I/TP 320, 160
    # padded to 384 and 256, sharded by it); H 256, I 256, 5 experts (I/TP 64 padded to 128 at
    # TP 4: ranks 2 and 3 hold none of I)
    "mxfp8": (
        Spec("qwen3-moe", layers=1, experts=3, hidden=384, intermediate=320, quant="mxfp8"),
        QWEN,
    ),
    "mxfp8-5": (
        Spec("qwen3-moe", layers=1, experts=5, hidden=256, intermediate=256, quant="mxfp8"),
        QWEN,
    ),
    # ModelOpt FP8 per-tensor, 5 experts, I 200: I/TP 200, 100, 50 (TRT-LLM: padded to 256 and
    # 128 by FusedMoE, sharded by it; CUTLASS: SGLang's processing pads each half to 16)
    "fp8-tensor": (
        Spec("qwen3-moe", layers=1, experts=5, hidden=128, intermediate=200, quant="fp8-tensor"),
        QWEN,
    ),
}
MX8 = {"mxfp8", "mxfp8-5"}
CLAMP_UP = {1: 1.3, 4: 0.7}  # nvfp4-clamp: up global scales, times the gate's
# SGLang runs them on its flashinfer_mxfp4 runner: on SM100 (sm.blackwell) for trtllm outputs,
# on SM90 (sm.hopper) for cutlass ones
OSS = {"gpt-oss", "gpt-oss-h576"}
FP4 = (
    OSS | {"nvfp4", "nvfp4-h384", "nvfp4-h336", "nvfp4-h320", "nvfp4-clamp"} | MX8
)  # on SM100 (sm.blackwell)
# transformers-written (tests/hf_checkpoints.py): H 64, I 128, two MoE layers
HF = {"hf-qwen3": "qwen3_moe", "hf-mixtral": "mixtral"}
# (case, backend, tp): Mixtral's I/TP 96 and 48 are padded to 128 and sharded by it on TRT-LLM
LAYER_CASES = [
    ("qwen3", "trtllm", 1),
    ("qwen3", "trtllm", 2),
    ("qwen3", "trtllm", 4),
    ("mixtral", "trtllm", 1),
    ("mixtral", "trtllm", 2),
    ("mixtral", "trtllm", 4),
    ("qwen3", "cutlass", 2),
    ("mixtral", "cutlass", 4),
    ("deepseek", "trtllm", 1),
    ("deepseek", "trtllm", 2),
    ("deepseek", "trtllm", 4),
    ("gpt-oss", "trtllm", 1),
    ("gpt-oss", "trtllm", 2),
    ("gpt-oss", "trtllm", 4),
    # SM90 (SGLang loads it where I/32 % TP == 0): H 320 I 192 at TP 1 and 2, H 576 I 384 at 4
    ("gpt-oss", "cutlass", 1),
    ("gpt-oss", "cutlass", 2),
    ("gpt-oss-h576", "cutlass", 4),
    ("nvfp4", "trtllm", 1),
    ("nvfp4", "trtllm", 2),
    ("nvfp4", "trtllm", 4),
    ("nvfp4-h384", "trtllm", 2),
    ("nvfp4-h384", "trtllm", 4),
    ("nvfp4", "cutlass", 1),
    ("nvfp4", "cutlass", 2),
    ("nvfp4-h384", "cutlass", 1),
    ("nvfp4-h336", "cutlass", 1),
    ("nvfp4-h336", "cutlass", 2),
    ("nvfp4-h320", "cutlass", 1),
    ("nvfp4-clamp", "cutlass", 1),
    ("nvfp4-clamp", "cutlass", 2),
    ("nvfp4-clamp", "trtllm", 1),
    ("nvfp4-clamp", "trtllm", 2),
    ("mxfp8", "trtllm", 1),
    ("mxfp8", "trtllm", 2),
    ("mxfp8-5", "trtllm", 4),
    ("fp8-tensor", "trtllm", 1),
    ("fp8-tensor", "trtllm", 2),
    ("fp8-tensor", "trtllm", 4),
    ("fp8-tensor", "cutlass", 1),
    ("fp8-tensor", "cutlass", 4),
]


def sgl(case: str, backend: str) -> str:
    """tests/sglang_moe.py's name of the SGLang runner for the case on fi-convert's backend."""
    return f"mxfp4-{backend}" if case in OSS else backend


def platform(case: str, backend: str = "trtllm"):
    """What SGLang's own path needs on CPU for the case (tests/sglang_moe.py `blackwell`,
    `hopper`)."""
    stack = contextlib.ExitStack()
    if case in OSS and backend == "cutlass":
        stack.enter_context(sm.hopper())
    elif case in FP4:
        stack.enter_context(sm.blackwell(cuda_noop=case in OSS))
    if case in MX8:
        stack.enter_context(sm.cuda_gate())
    if case in FP8T:
        stack.enter_context(sm.fp8_quant())
    return stack


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sgl-plugin-src")
    done: dict = {}

    def get(case: str) -> Path:
        if case not in done:
            if case in HF:
                done[case] = hf_checkpoints.save(HF[case], root / case)
            else:
                done[case] = write_checkpoint(root / case, CASES[case][0])
            if case == "nvfp4-clamp":
                sm.set_up_scales(done[case], CASES[case][1], CLAMP_UP)
        return done[case]

    return get


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, sources):
    """fi-convert's output (scheme detected: bf16, or fp8-block for DeepSeek) of (case,
    backend, tp) for SGLang (--server sglang), or for vLLM (`sglang=False`)."""
    root = tmp_path_factory.mktemp("sgl-plugin-out")
    done: dict = {}

    def get(case: str, backend: str, tp: int, sglang: bool = True, server: str = "") -> Path:
        server = server or ("sglang" if sglang else "vllm")
        key = (case, backend, tp, server)
        if key not in done:
            out = root / "-".join(map(str, key)).replace(",", "+")
            opts = Options(SchemeName.AUTO, Backend(backend), tp, server=server)
            convert(sources(case), out, opts, device="cpu")
            done[key] = out
        return done[key]

    return get


allocated: dict[int, dict[str, int]] = {}
# by layer: the parameters whose memory the plugin's path gave up, and of them those whose memory
# is still held
given_back: dict[int, tuple[list[str], list[str]]] = {}
# gpt-oss MXFP4: the float32 biases (bfloat16 as allocated) and the SwiGLU constants
NEW_STORAGE = {"w13_weight_bias", "w2_weight_bias", "gemm1_alpha", "gemm1_beta"}
NEW_STORAGE |= {"gemm1_clamp_limit"}
# gpt-oss MXFP4 on SM90: every expert parameter is new storage of the padded size (both sides:
# the plugin drops the unpadded ones SGLang allocated), and the SwiGLU constants
SM90_NEW = {"w13_weight", "w13_weight_scale", "w13_weight_bias", "w2_weight", "w2_weight_scale"}
SM90_NEW |= {"w2_weight_bias", "swiglu_alpha", "swiglu_beta", "swiglu_limit"}
# NVFP4: what SGLang's processing makes from the scalars (new parameters on both sides)
NVFP4_DERIVED = {"g1_alphas", "g1_alphas_up", "g2_alphas", "w13_input_scale_quant"}
NVFP4_DERIVED |= {"w2_input_scale_quant", "g1_scale_c", "gemm1_clamp_limit"}
# ... and the CUTLASS scale-swizzle placeholders SGLang allocates, aliased to the scales after
NVFP4_DERIVED |= {"w13_blockscale_swizzled", "w2_blockscale_swizzled"}
# ModelOpt FP8: the scales its processing reduces (new parameters of another size on both
# sides) and the products it makes from them; on CUTLASS the weights it pads to 16 per half
FP8T = {"fp8-tensor"}
FP8T_NEW = {"w13_weight_scale", "w13_input_scale", "w2_input_scale", "output1_scales_scalar"}
FP8T_NEW |= {"output1_scales_gate_scalar", "output2_scales_scalar", "fc1_dequant", "fc2_quant"}
FP8T_NEW |= {"fc2_dequant", "fc1_input_dequant"}


def fresh_storage(case: str, backend: str) -> set[str]:
    """The parameters the plugin puts in new storage, as SGLang's own processing does."""
    if case in OSS:
        return SM90_NEW if backend == "cutlass" else NEW_STORAGE
    if case in FP8T:
        return FP8T_NEW | ({"w13_weight", "w2_weight"} if backend == "cutlass" else set())
    return NVFP4_DERIVED if case in FP4 - MX8 else set()


def plugin_layer(out: Path, ckpt: Path, prefix: str, backend: str, tp: int, rank: int, **kw):
    """SGLang's FusedMoE for the rank, the output's experts installed by the plugin's path.
    `read_rank` (negative control): the rank whose bytes are read; `finish`: kernel setup."""
    from fi_convert.servers.sglang import experts

    case = kw.get("case", "")
    with sm.sglang_context(sgl(case, backend), tp, rank), platform(case, backend):
        layer = sm.make_layer(prefix, ckpt)
        before = {n: p.data.data_ptr() for n, p in layer.named_parameters()}
        memory = {
            n: (p.untyped_storage()._cdata, StorageWeakRef(p.untyped_storage()))
            for n, p in layer.named_parameters()
        }
        with OutputReader(out) as reader:
            experts.install(layer, reader, prefix, kw.get("read_rank", rank))
        if kw.get("finish", True):
            experts.finish(layer)
    allocated[id(layer)] = before  # where SGLang allocated each parameter
    gc.collect()
    now = {p.untyped_storage()._cdata for p in layer.parameters()}
    # the memory of each parameter the plugin put elsewhere, and of it what is still held
    gone = [n for n, (key, _) in memory.items() if key not in now]
    given_back[id(layer)] = (gone, [n for n in gone if not memory[n][1].expired()])
    return layer


def param_attrs(layer) -> dict:
    """The attributes SGLang set on each parameter (weight_loader, quant_method, ...): by name,
    plain values as they are, callables by qualified name."""
    return {
        n: {k: getattr(v, "__qualname__", v) for k, v in sorted(vars(p).items())}
        for n, p in layer.named_parameters()
    }


def differing(theirs: dict, ours: dict) -> list[str]:
    names = list(theirs) + [n for n in ours if n not in theirs]
    return [
        n
        for n in names
        if n not in theirs
        or n not in ours
        or (theirs[n].dtype, theirs[n].shape) != (ours[n].dtype, ours[n].shape)
        or not torch.equal(_u8(theirs[n]), _u8(ours[n]))
    ]


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)  # (0-dim ones too: NVFP4's inverse input scales)


def state_diff(ours: dict, theirs: dict) -> list[str]:
    """The attributes (`sm.layer_state` keys) set on one side only, or to other values."""
    keys = set(ours) | set(theirs)
    return sorted(k for k in keys if k not in ours or k not in theirs or ours[k] != theirs[k])


# ---- the layer: the plugin's path against SGLang's own ----


@pytest.mark.parametrize(("case", "backend", "tp"), LAYER_CASES)
def test_layer_equals_sglangs_own_loading_and_processing(case, backend, tp, sources, outputs):
    ckpt, prefix = sources(case), CASES[case][1]
    out = outputs(case, backend, tp)
    m = json.loads((out / MANIFEST_NAME).read_text())
    sm90 = case in OSS and backend == "cutlass"  # an H200's
    gpu = {"capability": (9, 0)} if sm90 else {}
    _check(m, tp_size=tp, moe_runner_backend=sm.BACKEND[sgl(case, backend)], **gpu)
    for rank in range(tp):
        theirs = sm.build(sgl(case, backend), tp, rank, ckpt, prefix)
        ours = plugin_layer(out, ckpt, prefix, backend, tp, rank, case=case)
        assert checks.runner_of(ours) == sm.BACKEND[sgl(case, backend)]
        if sm90:  # SGLang took its SM90 branch on both sides
            assert theirs.quant_method._fi_kernel == ours.quant_method._fi_kernel == "cutlass_sm90"
        checks.check_layer(m, str(out), prefix, ours)  # the plugin's checks pass it
        assert differing(sm.params(theirs), sm.params(ours)) == [], (backend, tp, rank)
        diff = state_diff(sm.layer_state(ours), sm.layer_state(theirs))
        assert diff == [], f"rank {rank}: attributes differ from SGLang's: {diff}"
        assert param_attrs(ours) == param_attrs(theirs)
        # read in place: the parameters SGLang allocated, no new memory (but where SGLang's
        # processing makes a tensor of another dtype: gpt-oss's float32 biases; where it
        # makes a parameter from the config or the scalars: gpt-oss's SwiGLU constants,
        # NVFP4's alphas; where it aliases: NVFP4's swizzled scales, placeholders dropped)
        now = {n: p.data.data_ptr() for n, p in ours.named_parameters()}
        fresh = fresh_storage(case, backend)
        assert {n: v for n, v in now.items() if n not in fresh} == {
            n: v for n, v in allocated[id(ours)].items() if n not in fresh
        }
        assert set(now) - set(allocated[id(ours)]) <= fresh
        # NVFP4 on CUTLASS, a padded swizzle apart: read into the placeholder SGLang allocated
        for n in {"w13_blockscale_swizzled", "w2_blockscale_swizzled"} & set(now):
            assert now[n] == allocated[id(ours)][n], n
        # and what SGLang allocated where the plugin put new storage is freed, not kept beside
        gone, kept = given_back[id(ours)]
        assert kept == [], f"the memory of {kept} is held after the layer gave it up"
        assert set(gone) <= fresh


@pytest.mark.parametrize(
    ("case", "backend", "tp"), [("mixtral", "trtllm", 1), ("qwen3", "cutlass", 2)]
)
def test_an_output_for_both_servers_loads_as_sglangs_own(case, backend, tp, sources, outputs):
    """`--server vllm,sglang` (where both servers' bytes are the same): the plugin loads it,
    every parameter and attribute equal to SGLang's own loading and processing."""
    ckpt, prefix = sources(case), CASES[case][1]
    out = outputs(case, backend, tp, server="vllm,sglang")
    m = json.loads((out / MANIFEST_NAME).read_text())
    assert m["servers"] == ["vllm", "sglang"]
    _check(m, tp_size=tp, moe_runner_backend=sm.BACKEND[backend])
    for rank in range(tp):
        theirs = sm.build(backend, tp, rank, ckpt, prefix)
        ours = plugin_layer(out, ckpt, prefix, backend, tp, rank)
        assert differing(sm.params(theirs), sm.params(ours)) == []
        assert state_diff(sm.layer_state(ours), sm.layer_state(theirs)) == []


def test_older_releases_own_code_leaves_sglangs_state_on_any_release(sources, outputs):
    """older_releases' code for what SGLang 0.5.20-0.5.22 lack (their rule for an expert's
    canonical rows, their inline FlashInfer row permutations of BF16 TRT-LLM), run on the
    installed release whatever it has: the rows SGLang allocated, and the permutation cache its
    own processing leaves (0.5.23's by its `_canonical_expert_weight_shape` and
    `_trtllm_bf16_row_permutation`); Mixtral at TP 2, I/TP 96 padded to 128."""
    from fi_convert.servers.sglang import older_releases as older

    ckpt, out = sources("mixtral"), outputs("mixtral", "trtllm", 2)
    theirs = sm.build("trtllm", 2, 1, ckpt, MIXTRAL)
    with sm.sglang_context("trtllm", 2, 1):
        allocated = sm.make_layer(MIXTRAL, ckpt)
    ours = plugin_layer(out, ckpt, MIXTRAL, "trtllm", 2, 1, finish=False)
    ours.quant_method._cache_permute_indices.clear()
    for name in ("w13_weight", "w2_weight"):
        rows = older.canonical_rows(ours, name)
        assert rows == getattr(allocated, name).shape[1]
        tile = getattr(ours, name).data[0].view(torch.uint8).reshape(rows, -1)
        older.flashinfer_row_permutation(ours, ours.quant_method, name, tile)
    key = "layer.quant_method._cache_permute_indices"
    ours_cache = {k: v for k, v in sm.layer_state(ours).items() if k.startswith(key)}
    assert len(ours_cache) == 2  # (w3_w1 and w2, one shape each)
    assert ours_cache == {k: v for k, v in sm.layer_state(theirs).items() if k.startswith(key)}


def test_control_another_ranks_bytes_are_caught(sources, outputs):
    ckpt, out = sources("qwen3"), outputs("qwen3", "trtllm", 2)
    theirs = sm.build("trtllm", 2, 1, ckpt, QWEN)
    ours = plugin_layer(out, ckpt, QWEN, "trtllm", 2, 1, read_rank=0)
    assert differing(sm.params(theirs), sm.params(ours)) == ["w13_weight", "w2_weight"]
    assert sm.layer_state(ours) == sm.layer_state(theirs)  # the state alone does not tell


@pytest.mark.parametrize(
    ("case", "backend"),
    [
        ("qwen3", "trtllm"),
        ("qwen3", "cutlass"),
        ("deepseek", "trtllm"),
        ("gpt-oss", "trtllm"),
        ("nvfp4", "trtllm"),
        ("nvfp4", "cutlass"),
        ("mxfp8", "trtllm"),
    ],
)
def test_control_a_layer_without_kernel_setup_is_caught(case, backend, sources, outputs):
    ckpt, out, prefix = sources(case), outputs(case, backend, 1), CASES[case][1]
    layer = sm.build(sgl(case, backend), 1, 0, ckpt, prefix)
    theirs = sm.layer_state(layer)
    ours_layer = plugin_layer(out, ckpt, prefix, backend, 1, 0, finish=False, case=case)
    ours = sm.layer_state(ours_layer)
    diff = state_diff(ours, theirs)
    want = {
        ("qwen3", "trtllm"): ["layer.quant_method._cache_permute_indices"],
        ("qwen3", "cutlass"): ["layer._cutlass_swiglu_params"],
        # Fp8MoEMethod's TRT-LLM SwiGLU parameters (None for DeepSeek's plain SiLU)
        ("deepseek", "trtllm"): ["layer._flashinfer_trtllm_gemm1_"],
        # Mxfp4MoEMethod's routing-bias cache (its SwiGLU constants are parameters: below)
        ("gpt-oss", "trtllm"): ["layer._situ_routing_bias_bf16"],
        # the block-scale aliases TRT-LLM reads (None until set), the hidden padding record
        ("nvfp4", "trtllm"): ["layer.w13_blockscale_swizzled", "layer.w2_blockscale_swizzled"],
        ("nvfp4", "cutlass"): ["layer._cutlass_swiglu_params"],
        ("mxfp8", "trtllm"): ["layer._flashinfer_trtllm_gemm1_"],  # as for FP8 block
    }[case, backend] + ["layer.use_padded_loading", "layer.trtllm_padded_hidden_size"]
    if want[0] == "layer._cutlass_swiglu_params" and not sm.makes_cutlass_swiglu_params():
        want = want[1:]  # SGLang 0.5.20's processing makes none: the loader's state alone
    assert diff and all(any(d.startswith(w) for w in want) for d in diff), diff
    assert any(d.startswith(want[0]) for d in diff), diff
    if case in OSS:  # the constants missing, the scales not viewed as float8_e4m3fn
        want_p = ["w13_weight_scale", "w2_weight_scale", "gemm1_alpha", "gemm1_beta"]
        want_p += ["gemm1_clamp_limit"]
        assert differing(sm.params(layer), sm.params(ours_layer)) == want_p


def test_nvfp4_clamp_other_than_the_outputs_is_refused(sources, outputs):
    """On TRT-LLM the block scales depend on the SwiGLU clamp: a layer SGLang gives a clamp
    the output was not converted with (here none) is refused by the plugin's layer checks, and
    a SwiGLU alpha (gemm1_alpha and gemm1_beta, not written) by the kernel setup."""
    from fi_convert.servers.sglang import experts

    ckpt, prefix = sources("nvfp4-clamp"), CASES["nvfp4-clamp"][1]
    out = outputs("nvfp4", "trtllm", 1)  # the same sizes, converted without a clamp
    m = json.loads((out / MANIFEST_NAME).read_text())
    layer = plugin_layer(out, ckpt, prefix, "trtllm", 1, 0, case="nvfp4-clamp", finish=False)
    with pytest.raises(PluginError, match="converted with SwiGLU clamp limit None, and SGLang"):
        checks.check_layer(m, str(out), prefix, layer)
    layer.moe_runner_config.gemm1_alpha = 1.702
    with pytest.raises(PluginError, match="on FlashInfer TRT-LLM without a SwiGLU alpha") as e:
        experts.finish(layer)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_control_fp8_tensor_without_kernel_setup_is_caught(backend, sources, outputs):
    """ModelOpt FP8: without `finish`, the expert parameters keep the loader's attributes
    (SGLang's processing puts each in a new Parameter without them), and on CUTLASS the SwiGLU
    parameters are missing; the bytes alone do not tell."""
    ckpt, out, prefix = sources("fp8-tensor"), outputs("fp8-tensor", backend, 1), QWEN
    theirs = sm.build(backend, 1, 0, ckpt, prefix)
    ours = plugin_layer(out, ckpt, prefix, backend, 1, 0, finish=False, case="fp8-tensor")
    assert differing(sm.params(theirs), sm.params(ours)) == []
    a, b = param_attrs(theirs), param_attrs(ours)
    kept = ["w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"]
    kept += ["w13_input_scale", "w2_input_scale"]
    assert [n for n in a if a[n] != b.get(n)] == kept
    diff = state_diff(sm.layer_state(ours), sm.layer_state(theirs))
    assert "layer.use_padded_loading" in diff
    swiglu = backend == "cutlass" and sm.makes_cutlass_swiglu_params()  # (not on 0.5.20)
    assert any(d.startswith("layer._cutlass_swiglu_params") for d in diff) == swiglu


def test_fp8_tensor_on_a_model_without_a_routing_method_is_refused(tmp_path):
    """SGLang's Mixtral declares no routing method, so ModelOptFp8MoEMethod runs it on Triton
    even with --moe-runner-backend flashinfer_trtllm (fi-convert refuses to plan it:
    test_server_option): were an output's manifest to say TRT-LLM, the plugin's layer check
    refuses the layer, naming the fix (CUTLASS, where SGLang runs FlashInfer for it)."""
    spec = Spec("mixtral", layers=1, experts=3, hidden=128, intermediate=256, quant="fp8-tensor")
    ckpt = write_checkpoint(tmp_path / "src", spec)
    out = tmp_path / "out"
    convert(ckpt, out, Options(SchemeName.AUTO, Backend.CUTLASS, 1, server="sglang"), device="cpu")
    m = json.loads((out / MANIFEST_NAME).read_text()) | {"backend": "trtllm"}
    with sm.sglang_context("trtllm", 1, 0), sm.fp8_quant():
        layer = sm.make_layer(MIXTRAL, ckpt)
    assert checks.runner_of(layer) == "triton"
    with pytest.raises(PluginError, match="declares no routing method for it, so Model"):
        checks.check_layer(m, str(out), MIXTRAL, layer)


def test_sm90_mxfp4_controls(sources, outputs):
    """gpt-oss MXFP4 on SM90: another rank's bytes are caught; without the kernel setup the
    SwiGLU constants are missing (FusedMoE's plain `swiglu_alpha` attribute, the config's
    alpha, stays where processing makes it a parameter) and the expert parameters keep the
    loader's attributes."""
    case, prefix = "gpt-oss", CASES["gpt-oss"][1]
    ckpt, out = sources(case), outputs(case, "cutlass", 2)
    theirs = sm.build("mxfp4-cutlass", 2, 1, ckpt, prefix)
    other = plugin_layer(out, ckpt, prefix, "cutlass", 2, 1, read_rank=0, case=case)
    diff = differing(sm.params(theirs), sm.params(other))
    assert set(diff) == {"w13_weight", "w13_weight_scale", "w13_weight_bias", "w2_weight"} | {
        "w2_weight_scale",
        "w2_weight_bias",
    }
    bare = plugin_layer(out, ckpt, prefix, "cutlass", 2, 1, finish=False, case=case)
    assert differing(sm.params(theirs), sm.params(bare)) == ["swiglu_alpha", "swiglu_beta"] + [
        "swiglu_limit"
    ]
    assert state_diff(sm.layer_state(bare), sm.layer_state(theirs)) == ["layer.swiglu_alpha"]
    assert param_attrs(bare)["w13_weight"] != param_attrs(theirs)["w13_weight"] == {}


def test_sm90_mxfp4_refusals(sources, outputs):
    """An SM90 output of another TP size (its sizes are not the ones SGLang's processing
    makes), and FP8 activations (Humming, which rewrites the weights), are refused."""
    from fi_convert.servers.sglang import experts

    case, prefix = "gpt-oss", CASES["gpt-oss"][1]
    ckpt, out = sources(case), outputs(case, "cutlass", 1)
    with pytest.raises(PluginError, match=r"w13_weight is torch.uint8 \[3, 512, 256\] in the "):
        plugin_layer(out, ckpt, prefix, "cutlass", 2, 0, case=case)
    layer = plugin_layer(out, ckpt, prefix, "cutlass", 1, 0, finish=False, case=case)
    layer.quant_method._use_sm90_humming = True  # as --flashinfer-mxfp4-moe-precision fp8
    with (
        sm.sglang_context("mxfp4-cutlass", 1, 0),
        pytest.raises(PluginError, match="without --flashinfer-mxfp4-moe-precision fp8"),
    ):
        experts.finish(layer)


def test_an_output_of_another_split_is_refused_at_install(sources, outputs):
    ckpt, out = sources("qwen3"), outputs("qwen3", "trtllm", 1)
    with pytest.raises(PluginError, match=r"w13_weight is torch.bfloat16 \[6, 2, 1024, 64\]"):
        plugin_layer(out, ckpt, QWEN, "trtllm", 2, 0)


# ---- the layers SGLang built, against the manifest ----


def _layer(**kw):
    method = type(kw.pop("method", "UnquantizedFusedMoEMethod"), (), {})()
    attrs = dict(
        quant_method=method,
        runner_backend=types.SimpleNamespace(value="flashinfer_trtllm"),
        num_fused_shared_experts=0,
        num_experts=6,
        num_local_experts=6,
        moe_ep_size=1,
        moe_tp_size=2,
        hidden_size=128,
        intermediate_size_per_partition=256,
    )
    return types.SimpleNamespace(**(attrs | kw))


@pytest.fixture(scope="module")
def manifest(outputs):
    return json.loads((outputs("qwen3", "trtllm", 2) / MANIFEST_NAME).read_text())


def test_the_layers_sglang_built_match(manifest):
    checks.check_layers(manifest, "OUT", {QWEN: _layer()})  # the control


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (dict(method="Fp8MoEMethod"), "SGLang built Fp8MoEMethod for it"),
        (
            dict(runner_backend=types.SimpleNamespace(value="triton")),
            "on its triton MoE runner, the output is for FlashInfer trtllm; pass "
            "--moe-runner-backend flashinfer_trtllm",
        ),
        (dict(num_fused_shared_experts=1), "--disable-shared-experts-fusion"),
        (dict(num_experts=8, num_local_experts=8), "has 6 experts in the output and 8"),
        # EP 2 over a TP 2 output: 3 experts per rank, not 6 (tests/test_sglang_ep.py has
        # the rest)
        (dict(moe_ep_size=2), "has 6 experts in the output and 6 (6 on this rank)"),
        (dict(moe_tp_size=4), "split model.layers.0.mlp.experts over 4 ranks"),
        (dict(intermediate_size_per_partition=384), "convert the source again for SGLang"),
    ],
)
def test_a_layer_unlike_the_outputs_is_refused(manifest, change, words):
    with pytest.raises(PluginError) as e:
        checks.check_layers(manifest, "OUT", {QWEN: _layer(**change)})
    assert str(e.value).startswith("fi-convert: OUT: ") and "\n" not in str(e.value)
    assert words in str(e.value)


def test_a_per_tensor_fp8_layer_is_refused_for_an_fp8_block_output(manifest):
    m = manifest | {"scheme": "fp8-block"}
    layer = _layer(method="Fp8MoEMethod")
    layer.quant_method.block_quant = False
    with pytest.raises(PluginError, match="SGLang built per-tensor FP8 for it, the output is"):
        checks.check_layers(m, "OUT", {QWEN: layer})
    layer.quant_method.block_quant = True  # the control
    checks.check_layers(m, "OUT", {QWEN: layer})


def test_moe_layers_not_the_outputs_are_refused(manifest):
    with pytest.raises(PluginError, match="has no MoE layer model.layers.0.mlp.experts in"):
        checks.check_layers(manifest, "OUT", {})
    extra = {QWEN: _layer(), "model.layers.1.mlp.experts": _layer()}
    with pytest.raises(PluginError, match="has a MoE layer model.layers.1.mlp.experts not in"):
        checks.check_layers(manifest, "OUT", extra)


def test_the_nextn_layers_sglang_does_not_build_are_skipped(manifest):
    """A DeepSeek-V3/R1 output holds its NextN layer (model.layers.61 of 61), which SGLang's
    loader skips for the model it serves: not required among the layers SGLang built
    (tests/test_sglang_models.py loads such a whole model)."""
    nextn = "model.layers.1.mlp.experts"
    m = manifest | {"layers": manifest["layers"] | {nextn: manifest["layers"][QWEN]}}
    deepseek = types.SimpleNamespace(num_hidden_layers=1, num_nextn_predict_layers=1)
    assert checks.nextn_layers(m, deepseek) == {nextn}
    checks.check_layers(m, "OUT", {QWEN: _layer()}, skipped=checks.nextn_layers(m, deepseek))
    # the controls: no NextN layers in the config, or the layer among the decoder layers
    for config in (
        types.SimpleNamespace(num_hidden_layers=1, num_nextn_predict_layers=0),
        types.SimpleNamespace(num_hidden_layers=2, num_nextn_predict_layers=1),
        types.SimpleNamespace(num_hidden_layers=1),
        None,
    ):
        assert checks.nextn_layers(m, config) == set()
        with pytest.raises(PluginError, match=f"has no MoE layer {nextn} in"):
            checks.check_layers(m, "OUT", {QWEN: _layer()}, skipped=checks.nextn_layers(m, config))
    with pytest.raises(PluginError, match=f"has no MoE layer {QWEN} in"):  # a decoder layer
        checks.check_layers(m, "OUT", {nextn: _layer()}, skipped=checks.nextn_layers(m, deepseek))


# ---- the manifest, the arguments and the machine ----


def _check(m, **kw):
    args = dict(tp_size=2, moe_runner_backend="flashinfer_trtllm", sglang_version="0.5.23")
    device = {k: kw.pop(k) for k in ("flashinfer_version", "capability") if k in kw}
    checks.check_manifest(m, "OUT", **(args | kw))
    checks.check_device(
        m, "OUT", **(dict(flashinfer_version="0.7.2.post1", capability=(10, 0)) | device)
    )


def test_a_matching_runtime_passes(manifest):
    _check(manifest)  # the control: every refusal below changes one fact


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (dict(tp_size=4), "tensor-parallel size 2, SGLang runs 4; pass --tp 2"),
        (dict(sglang_version="0.5.24"), "this is SGLang 0.5.24, whose layout may differ"),
        (
            dict(sglang_version="0.5.19"),
            "proven for SGLang 0.5.20, 0.5.21, 0.5.22, 0.5.23, this is SGLang 0.5.19",
        ),
        (
            dict(moe_runner_backend="auto"),
            "started with --moe-runner-backend auto; pass --moe-runner-backend flashinfer_trtllm",
        ),
        (dict(moe_runner_backend="flashinfer_cutlass"), "converted for FlashInfer trtllm"),
        (dict(ep_size=4), "has 6 experts, which --ep-size 4 does not divide"),
        (
            dict(tp_size=1, ep_size=2),
            "MoE TP size is 1 (--tp / --ep-size); start SGLang with --tp 4",
        ),
        (dict(eplb=True), "start SGLang without --enable-eplb"),
        (dict(flashinfer_version=None), "FlashInfer is not installed"),
        (dict(flashinfer_version="0.7.5"), "this is FlashInfer 0.7.5"),
        (dict(capability=None), "need a CUDA GPU"),
        (dict(capability=(9, 0)), "need an SM100-family"),
        (dict(capability=(12, 0)), "this GPU is SM120"),
    ],
)
def test_refusals_name_the_fix(manifest, change, words):
    with pytest.raises(PluginError) as e:
        _check(manifest, **change)
    msg = str(e.value)
    assert msg.startswith("fi-convert: OUT: ") and "\n" not in msg
    assert words in msg


def test_another_servers_output_is_refused(manifest, outputs):
    assert manifest[target.SERVER_FIELD] == "sglang"  # as the converter wrote it
    vllm = {k: v for k, v in manifest.items() if k != target.SERVER_FIELD}  # older outputs
    converted = json.loads(
        (outputs("qwen3", "trtllm", 2, sglang=False) / MANIFEST_NAME).read_text()
    )
    assert converted[target.SERVER_FIELD] == "vllm"
    for m in (vllm, manifest | {target.SERVER_FIELD: "vllm"}, converted):
        with pytest.raises(PluginError, match="OUT: converted for vllm, whose layouts differ"):
            _check(m)
    assert target.server_of(vllm) == "vllm"


def test_the_manifest_is_sglangs(manifest):
    """What --server sglang writes: SGLang's target (the helper gives the same fields)."""
    assert {k: manifest[k] for k in ("server", "target")} == target.sglang_fields(manifest)
    assert manifest["target"]["sglang_versions"] == ">=0.5.20,<=0.5.23"
    assert manifest["target"]["sglang_releases"] == ["0.5.20", "0.5.21", "0.5.22", "0.5.23"]
    assert "tp_split" not in manifest["layers"][QWEN]  # I/TP 256: SGLang's split is vLLM's


def test_cutlass_bf16_runs_on_sm90_sm10x_and_sm12x(outputs):
    m = json.loads((outputs("qwen3", "cutlass", 2) / MANIFEST_NAME).read_text())
    for cap in ((9, 0), (10, 0), (12, 0)):
        _check(m, moe_runner_backend="flashinfer_cutlass", capability=cap)
    with pytest.raises(PluginError, match="need an SM90, SM10x or SM12x GPU"):
        _check(m, moe_runner_backend="flashinfer_cutlass", capability=(11, 0))


def test_cutlass_nvfp4_runs_on_sm10x_and_sm12x(manifest):
    m = manifest | {"scheme": "nvfp4", "backend": "cutlass"}
    m = m | {"target": target.SGLANG_TARGET.target_fields("nvfp4", "cutlass")}
    assert m["target"]["gpu_family"] == "sm100+"
    for cap in ((10, 0), (12, 0)):
        _check(m, moe_runner_backend="flashinfer_cutlass", capability=cap)
    with pytest.raises(PluginError, match=r"need an SM10x or SM12x \(Blackwell\) GPU"):
        _check(m, moe_runner_backend="flashinfer_cutlass", capability=(9, 0))


def test_cutlass_mxfp4_runs_on_sm90_only(manifest):
    """gpt-oss MXFP4's CUTLASS layout is SGLang's SM90 one (flashinfer_mxfp4 runs TRT-LLM on
    SM100 and another CUTLASS layout on SM120)."""
    m = manifest | {"scheme": "mxfp4", "backend": "cutlass"}
    m = m | {"target": target.SGLANG_TARGET.target_fields("mxfp4", "cutlass")}
    assert m["target"]["gpu_family"] == "sm90"
    _check(m, moe_runner_backend="flashinfer_mxfp4", capability=(9, 0))
    for cap in ((10, 0), (12, 0), (8, 9)):
        with pytest.raises(PluginError, match=r"need an SM90 \(Hopper H100/H200\) GPU"):
            _check(m, moe_runner_backend="flashinfer_mxfp4", capability=cap)
    with pytest.raises(PluginError, match="pass --moe-runner-backend flashinfer_mxfp4"):
        _check(m, moe_runner_backend="flashinfer_cutlass", capability=(9, 0))


def test_schemes_the_plugin_does_not_load_yet_are_refused(manifest):
    with pytest.raises(PluginError, match="does not load mxfp8/cutlass outputs yet"):
        _check(manifest | {"scheme": "mxfp8", "backend": "cutlass"})
    with pytest.raises(PluginError, match="does not load fp8-block/cutlass outputs yet"):
        _check(manifest | {"scheme": "fp8-block", "backend": "cutlass"})


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("", "proven for SGLang 0.5.20, 0.5.21, 0.5.22, 0.5.23, this is SGLang 0.5.24"),
        ("0.5 or so", "the manifest's SGLang range '0.5 or so' is unreadable; convert again"),
    ],
)
def test_a_missing_or_unreadable_version_range_is_refused(manifest, spec, words):
    """Without the list (an older output), an empty or unreadable range serves the releases
    proven for the layout, and refuses any other in one line."""
    t = {k: v for k, v in manifest["target"].items() if k != "sglang_releases"}
    m = manifest | {"target": t | {"sglang_versions": spec}}
    _check(m)  # 0.5.23: proven for the layout
    with pytest.raises(PluginError) as e:
        _check(m, sglang_version="0.5.24")
    assert words in str(e.value) and "\n" not in str(e.value)


# ---- registration: the load format, the hooks, the entry point ----


@pytest.fixture(scope="module")
def registered():
    """fi-convert's plugin registered and SGLang's hooks applied, as SGLang's `load_plugins`
    does in every process (the hooks stay applied: each is a no-op for other load formats)."""
    from fi_convert.servers.sglang import register

    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.plugins.hook_registry import HookRegistry

        register()
        register()  # SGLang may load plugins more than once per process: idempotent
        HookRegistry.apply_hooks()
    return HookRegistry


def test_register_adds_the_load_format_and_its_loader(registered):
    from fi_convert.servers.sglang import config

    with sm.sglang_context("trtllm", 1, 0):  # (the loader imports SGLang's MoE: its stand-ins)
        from sglang.srt.configs.load_config import LoadConfig, LoadFormat
        from sglang.srt.model_loader import get_model_loader
        from sglang.srt.model_loader.loader import DefaultModelLoader
        from sglang.srt.server_args import LOAD_FORMAT_CHOICES

        from fi_convert.servers.sglang.loader import FiConvertModelLoader

        assert LOAD_FORMAT_CHOICES.count("fi-convert") == 1
        ours = {h for hooks in registered._hooks.values() for _, h, _ in hooks}
        assert [h for h in ours if h.__module__ == config.__name__] and len(ours) == len(
            config.HOOKS
        )
        for name in ("fi-convert", "FI-CONVERT"):
            lc = LoadConfig(load_format=name)
            assert lc.load_format is FiConvertModelLoader
            loader = get_model_loader(lc)
            assert type(loader) is FiConvertModelLoader
            assert loader.load_config.load_format == LoadFormat.SAFETENSORS
        lc = LoadConfig(load_format="auto")  # other formats: SGLang's own, untouched
        assert lc.load_format == LoadFormat.AUTO
        assert type(get_model_loader(lc)) is DefaultModelLoader
        with pytest.raises(ValueError, match="'not-a-format' is not a valid LoadFormat"):
            LoadConfig(load_format="not-a-format")


def test_the_launch_line_parses_and_is_checked_before_anything_starts(registered, outputs):
    """SGLang's own argument parser and resolution, then its check_server_args (the launcher
    and the engine run it before any scheduler process starts)."""
    out = outputs("hf-qwen3", "trtllm", 1)
    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.server_args import prepare_server_args

        line = f"--model-path {out} --load-format fi-convert --device cpu"
        ok = prepare_server_args([*line.split(), "--moe-runner-backend", "flashinfer_trtllm"])
        assert ok.load_format == "fi-convert"
        ok.resolve_once()
        ok.check_server_args()
        bad = prepare_server_args([*line.split(), "--moe-runner-backend", "flashinfer_cutlass"])
        bad.resolve_once()
        with pytest.raises(PluginError, match="pass --moe-runner-backend flashinfer_trtllm"):
            bad.check_server_args()


def test_stock_sglang_refuses_an_output_and_the_plugin_restores_the_source_config(
    registered, outputs
):
    from fi_convert.servers.sglang import config

    out = outputs("hf-qwen3", "trtllm", 1)
    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.server_args import ServerArgs

        # without --load-format fi-convert, the hooks leave the marker: SGLang refuses it
        with pytest.raises(ValueError, match="Unknown quantization method: fi-convert"):
            ModelConfig(model_path=str(out))
        args = dict(model_path=str(out), moe_runner_backend="flashinfer_trtllm", device="cpu")
        with pytest.raises(ValueError, match="Unknown quantization method: fi-convert"):
            ModelConfig.from_server_args(ServerArgs(**args))
        mc = ModelConfig.from_server_args(ServerArgs(**args, load_format="fi-convert"))
        assert mc.quantization is None  # the source's: BF16
        assert getattr(mc.hf_config, "quantization_config", None) is None
    # a quantized source's config comes back, and get_config's cached object is not changed
    source = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    cached = types.SimpleNamespace(
        quantization_config={"quant_method": "fi-convert", "source_quantization_config": source}
    )
    token = config._LOADING.set(True)
    try:
        got = config.get_config(lambda: cached)
    finally:
        config._LOADING.reset(token)
    assert got.quantization_config == source and got is not cached
    assert cached.quantization_config["quant_method"] == "fi-convert"
    assert config.get_config(lambda: cached) is cached  # outside an fi-convert load


def test_the_entry_point_is_declared():
    """pyproject.toml's entry point (what `pip install .[sglang]` installs) names `register`.
    (The installed metadata is not checked here: this venv's fi-convert is another checkout.)"""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    eps = project["entry-points"][target.ENTRY_POINT_GROUP]
    assert eps == {target.PLUGIN_NAME: "fi_convert.servers.sglang:register"}
    import pkgutil

    from fi_convert.servers.sglang import register

    assert pkgutil.resolve_name(eps[target.PLUGIN_NAME]) is register
    want = "sglang" + releases.plugin_specifier()
    assert project["optional-dependencies"]["sglang"] == [want] == ["sglang>=0.5.20,<=0.5.23"]


def test_the_facts_and_the_checks_import_no_sglang():
    code = (
        "import sys\n"
        "import fi_convert.servers.sglang, fi_convert.servers.sglang.target\n"
        "import fi_convert.servers.sglang.checks, fi_convert.servers.sglang.config\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'vllm')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


# ---- a whole model through SGLang's get_model_loader ----


def _model(
    registered,
    path: Path | str,
    load_format: str,
    backend: str,
    revision: str | None = None,
    download_dir: Path | None = None,
    trust_remote_code: bool = False,
):
    """SGLang's ModelConfig and get_model_loader for `path`, as its scheduler loads a model
    (`download_dir`: --download-dir, into the LoadConfig, as SGLang's model runner does;
    `trust_remote_code`: --trust-remote-code)."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model_loader
    from sglang.srt.server_args import ServerArgs

    dl = str(download_dir) if download_dir else None
    args = ServerArgs(
        model_path=str(path),
        load_format=load_format,
        moe_runner_backend=sm.BACKEND[backend],
        revision=revision,
        download_dir=dl,
        trust_remote_code=trust_remote_code,
    )
    mc = ModelConfig.from_server_args(args)
    loader = get_model_loader(LoadConfig(load_format=load_format, download_dir=dl), mc)
    return loader.load_model(model_config=mc, device_config=DeviceConfig("cpu"))


@pytest.mark.parametrize(
    ("case", "backend"), [("hf-qwen3", "trtllm"), ("hf-qwen3", "cutlass"), ("hf-mixtral", "trtllm")]
)
def test_a_whole_model_equals_sglangs_default_load_of_the_source(
    case, backend, registered, sources, outputs, monkeypatch
):
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")  # no GPU here: skip its checks
    out = outputs(case, backend, 1)
    with sm.sglang_context(backend, 1, 0):
        from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

        ours = _model(registered, out, "fi-convert", backend)
        theirs = _model(registered, sources(case), "auto", backend)
    p, q = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert sorted(p) == sorted(q)
    assert differing(q, p) == []
    # SGLang 0.5.20's loop over the modules to process (older_releases): the same modules as
    # the installed release's (no LoRA here)
    from fi_convert.servers.sglang import older_releases as older

    every = [m for m, _ in older.every_module_with_quant_method(theirs)]
    assert every == [m for m, _ in older.modules_with_quant_method(theirs)] and every
    moe = [n for n, m in theirs.named_modules() if isinstance(m, FusedMoE)]
    mlp = "block_sparse_moe" if case == "hf-mixtral" else "mlp"
    assert moe == [f"model.layers.{i}.{mlp}.experts" for i in (0, 1)]
    for name in moe:
        assert sm.layer_state(ours.get_submodule(name)) == sm.layer_state(
            theirs.get_submodule(name)
        )


def test_a_bad_header_opened_while_the_model_is_built_is_one_line_at_the_load(
    registered, outputs, monkeypatch, tmp_path
):
    """The output is opened (its headers read) while SGLang builds the model (`Ahead`): a
    shard's bad header is said by the load, in one line naming the shard, with no reader
    thread left and none of the output's files open."""
    import shutil

    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")
    out = Path(shutil.copytree(outputs("hf-qwen3", "trtllm", 1), tmp_path / "out"))
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    shard = out / index["model.embed_tokens.weight"]
    with open(shard, "r+b") as f:
        f.write((1 << 40).to_bytes(8, "little"))  # a header longer than the file
    with sm.sglang_context("trtllm", 1, 0), pytest.raises(PluginError) as e:
        _model(registered, out, "fi-convert", "trtllm")
    msg = str(e.value)
    assert msg.startswith(f"fi-convert: {shard}: ") and "\n" not in msg
    assert not reader_threads() and not files_open(out)


def test_a_weight_update_from_an_output_is_refused(registered):
    """SGLang's update_weights_from_disk reads through the loader's _get_weights_iterator, then
    DefaultModelLoader's processing, which would take the converted tensors for the source's."""
    from fi_convert.servers.sglang.loader import FiConvertModelLoader

    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.model_loader.loader import DefaultModelLoader

        loader = FiConvertModelLoader(LoadConfig())
        source = DefaultModelLoader.Source("OUT", None)
        with pytest.raises(PluginError, match="fi-convert: OUT: updating weights from an"):
            loader._get_weights_iterator(source)


def test_a_whole_model_refusal_comes_before_anything_is_built(registered, outputs):
    from fi_convert.servers.sglang import loader

    out = outputs("hf-qwen3", "trtllm", 1, sglang=False)  # a vLLM output
    with (
        sm.sglang_context("trtllm", 1, 0),
        mock.patch.object(loader, "_initialize_model", side_effect=AssertionError("built")),
        pytest.raises(PluginError, match="converted for vllm"),
    ):
        _model(registered, out, "fi-convert", "trtllm")
    # an SGLang output on this machine (no CUDA GPU): refused before the model is built too
    out = outputs("hf-qwen3", "trtllm", 1)
    with (
        sm.sglang_context("trtllm", 1, 0),
        mock.patch.object(loader, "_initialize_model", side_effect=AssertionError("built")),
        pytest.raises(PluginError, match="need a CUDA GPU"),
    ):
        _model(registered, out, "fi-convert", "trtllm")


@pytest.mark.parametrize("fault", ["build", "setting", "plan cache"])
def test_the_readers_started_for_a_build_that_fails_are_stopped(
    registered, outputs, monkeypatch, tmp_path, fault
):
    """The load starts its reader threads and opens the output before SGLang builds the
    model (`whole_read.Ahead`): a build that fails leaves none running and no file of the
    output open; a read or plan cache setting that is wrong is one line, before anything is
    built."""
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")
    out = outputs("hf-qwen3", "trtllm", 1)
    seen = []

    def build(*args, **kwargs):
        seen.append(reader_threads())
        raise RuntimeError("the model's build failed")

    if fault == "setting":
        monkeypatch.setenv("FI_CONVERT_READ_THREADS", "0")
        said = "fi-convert: FI_CONVERT_READ_THREADS='0': not a thread count; give 1 to 128"
    elif fault == "plan cache":
        (tmp_path / "a-file").write_text("")
        monkeypatch.setenv("FI_CONVERT_PLAN_CACHE", str(tmp_path / "a-file"))
        said = (
            f"fi-convert: FI_CONVERT_PLAN_CACHE={tmp_path / 'a-file'}: not a folder; set it to "
            "a folder for the plans of loads, or to 0 to ask the model at every load"
        )
    error = RuntimeError if fault == "build" else PluginError
    with sm.sglang_context("trtllm", 1, 0):
        from fi_convert.servers.sglang import loader  # (under SGLang's stand-ins)

        with (
            mock.patch.object(loader, "_initialize_model", side_effect=build),
            pytest.raises(error) as e,
        ):
            _model(registered, out, "fi-convert", "trtllm")
    if fault == "build":
        assert seen and seen[0]  # started ahead of the build
    else:
        assert not seen and str(e.value) == said
    for t in threading.enumerate():
        if t.name == "fi-convert-open":
            t.join()  # (it closes what it opened once done: close does not wait for it)
    assert not reader_threads() and not files_open(out)


# ---- a Hub repo id as --model-path (tests/hub_server.py's fake Hub) ----

HUB_REPO = "acme/qwen3-moe-fi-sglang"


def _publish(hub, out: Path, repo: str = HUB_REPO) -> str:
    """The output as a Hub repo (as `fi-convert push` leaves it, with a card and a file the
    manifest does not list, which a load never fetches); the commit."""
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    files |= {"README.md": b"# card\n", "extra/unlisted.safetensors": b"\0" * 64}
    return hub.add_repo(repo, files)


def test_a_repo_id_loads_as_its_folder(registered, outputs, hub, tmp_path, monkeypatch):
    """`--model-path ORG/REPO --load-format fi-convert`: SGLang's own config reading and
    get_model_loader, the plugin fetching the output (--revision, --download-dir): the same
    model as from the local folder, every parameter and both MoE layers' state."""
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")
    out = outputs("hf-qwen3", "trtllm", 1)
    commit = _publish(hub, out)
    hub.add_repo(HUB_REPO, {"config.json": b"{}"})  # main moves on: --revision keeps the output
    download_dir = tmp_path / "download-dir"
    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

        ours = _model(registered, HUB_REPO, "fi-convert", "trtllm", commit, download_dir)
        local = _model(registered, out, "fi-convert", "trtllm")
    p, q = dict(ours.named_parameters()), dict(local.named_parameters())
    assert sorted(p) == sorted(q) and differing(q, p) == []
    moe = [n for n, m in local.named_modules() if isinstance(m, FusedMoE)]
    for name in moe:
        assert sm.layer_state(ours.get_submodule(name)) == sm.layer_state(local.get_submodule(name))
    snap = download_dir / "models--acme--qwen3-moe-fi-sglang" / "snapshots" / commit
    m = json.loads((out / MANIFEST_NAME).read_text())
    got = {f.relative_to(snap).as_posix() for f in snap.rglob("*") if f.is_file()}
    assert got == {MANIFEST_NAME, *m["files"]}  # the output, nothing else


def test_a_repo_id_on_the_launch_line_is_checked_before_anything_starts(
    registered, outputs, hub, tmp_path
):
    """The launcher's check_server_args fetches the repo's manifest alone and refuses there."""
    _publish(hub, outputs("hf-qwen3", "trtllm", 1))
    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.server_args import prepare_server_args

        line = f"--model-path {HUB_REPO} --load-format fi-convert --device cpu"
        args = prepare_server_args([*line.split(), "--moe-runner-backend", "flashinfer_cutlass"])
        args.resolve_once()
        with pytest.raises(PluginError) as e:
            args.check_server_args()
    msg = str(e.value)
    assert msg.startswith(f"fi-convert: {HUB_REPO}: ") and "\n" not in msg
    assert "pass --moe-runner-backend flashinfer_trtllm" in msg
    # before any process starts: the manifest, and what SGLang's own argument resolution read
    # (config.json, generation_config.json), no shard
    snap = next((tmp_path / "hf" / "hub" / "models--acme--qwen3-moe-fi-sglang").glob("snapshots/*"))
    assert MANIFEST_NAME in {f.name for f in snap.iterdir()}
    assert not list(snap.glob("*.safetensors"))


@pytest.mark.parametrize(
    ("repo", "words"),
    [
        ("acme/no-such-repo", "no such model repo on the Hub"),
        ("acme/a-source", "not an fi-convert output (the repo holds no fi-convert-manifest.json)"),
        (HUB_REPO, "converted for vllm, whose layouts differ from SGLang's"),
    ],
)
def test_a_repo_id_that_cannot_be_served_is_one_line(
    registered, sources, outputs, hub, repo, words, monkeypatch
):
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")
    _publish(hub, outputs("hf-qwen3", "trtllm", 1, sglang=False))  # a vLLM output
    _publish(hub, sources("hf-qwen3"), "acme/a-source")
    from fi_convert.servers.sglang import loader

    with (
        sm.sglang_context("trtllm", 1, 0),
        mock.patch.object(loader, "_initialize_model", side_effect=AssertionError("built")),
        pytest.raises(PluginError) as e,
    ):
        from sglang.srt.configs.load_config import LoadConfig

        mc = types.SimpleNamespace(model_path=repo, revision=None)
        loader.FiConvertModelLoader(LoadConfig()).load_model(model_config=mc, device_config=None)
    msg = str(e.value)
    assert msg.startswith(f"fi-convert: {repo}: ") and "\n" not in msg and words in msg


def test_a_repo_id_offline_comes_from_the_cache(registered, outputs, hub, monkeypatch):
    from huggingface_hub import constants

    from fi_convert.servers.sglang.checks import local_output

    _publish(hub, outputs("hf-qwen3", "trtllm", 1))
    snap = local_output(HUB_REPO, revision=None, cache=None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    served = len(hub.log)
    assert local_output(HUB_REPO, revision=None, cache=None) == snap
    assert len(hub.log) == served
    with pytest.raises(PluginError) as e:
        local_output("acme/never-fetched", revision=None, cache=None)
    assert str(e.value).startswith("fi-convert: acme/never-fetched: no such local folder, and not")
    assert "HF_HUB_OFFLINE" in str(e.value)

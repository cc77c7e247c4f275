"""Whole tiny quantized models through SGLang 0.5.23's own `get_model_loader`, on CPU: the
plugin's loader (`--load-format fi-convert`, FiConvertModelLoader) of fi-convert's output
against SGLang's default load (`load_format auto`: its own weight loading and
`postprocess_weights`) of the source, at TP 1 and 2, every rank.

For each scheme the plugin loads besides BF16 (tests/test_sglang_plugin.py has BF16's whole
models): ModelOpt NVFP4 (DeepSeek-V3, TRT-LLM and CUTLASS), ModelOpt MXFP8 (Qwen3-MoE,
TRT-LLM), gpt-oss MXFP4 (`flashinfer_mxfp4` on SM100, and on SM90: FlashInfer's CUTLASS
mixed-input kernels), DeepSeek FP8 block (DeepSeek-V3, TRT-LLM) and ModelOpt FP8 per-tensor
(Qwen3-MoE and DeepSeek-V3, whose model classes declare a routing method: TRT-LLM and CUTLASS).
The sources are transformers-written models whose linears are replaced by the scheme's format
(tests/quantized_checkpoints.py), converted with `--server sglang`. Every parameter, buffer and
tensor a module holds as an attribute (DeepSeek's MLA `w_kc`, `w_vc`, ...) of the two models is
byte-equal (dtype, shape, bytes), and so is the state each MoE layer and its method carry
(tests/sglang_moe.layer_state). Negative controls: one byte changed in an output's expert
tensor (the shard's size kept: the load reads the manifest but does not hash the shards, which
`verify`'s check flags) is caught; a model whose MoE layers lack the plugin's kernel setup is
caught (and, for ModelOpt FP8 on CUTLASS and gpt-oss on SM90, what their setup makes).

SGLang's own path needs on CPU what its layer tests need (tests/sglang_moe.py: SGLang's SM100
platform hook and a CPU version of FlashInfer's CUDA-only scale swizzle for NVFP4, MXFP8 and
MXFP4; its SM90 hook and a CPU version of FlashInfer's CUDA-only SM90 weight interleave for
gpt-oss on Hopper; its `fp8._is_cuda` flag for MXFP8; a CPU version of its CUDA-only
per-tensor FP8 quantization and its `per_tensor_dequantize` as CUDA evaluates it for ModelOpt
FP8) and, for a whole gpt-oss model, its `mxfp4` method registered as SGLang registers it on
CUDA; during both loads alike.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from unittest import mock

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.format.manifest import check_files, read
from fi_convert.servers.sglang import older_releases
from tests import quantized_checkpoints as qc
from tests import sglang_moe as sm
from tests.test_sglang_plugin import _model, differing, registered, state_diff  # noqa: F401

# the plugin registered and SGLang's hooks applied, as in every SGLang process
pytestmark = pytest.mark.usefixtures("registered")

# case: (transformers' model, the source format, sizes); H a multiple of 128 (SGLang's NVFP4 and
# MXFP8 need it), I/TP a multiple of 128 (FP8 block)
CASES = {
    # I 192: I/TP 192 and 96 padded to 256 and 128, sharded by it (TP 2 rank 1 holds 64 rows)
    "mxfp8": ("qwen3_moe", "mxfp8", dict(hidden_size=128, moe_intermediate_size=192)),
    "nvfp4": ("deepseek_v3", "nvfp4", dict(hidden_size=128, moe_intermediate_size=128)),
    # I/TP 96 padded to 128 at TP 2, sharded by it (rank 1 holds 64 rows; CUTLASS refuses it)
    "nvfp4-i192": ("deepseek_v3", "nvfp4", dict(hidden_size=128, moe_intermediate_size=192)),
    # q_lora_rank 128: SGLang fuses q_a_proj with kv_a_proj_with_mqa, and their block scales;
    # with DeepSeek-V3's NextN layer (its layer 61, here 2), converted, which SGLang's model
    # does not build (its loader skips it)
    "fp8-block": (
        "deepseek_v3",
        "fp8-block",
        dict(
            hidden_size=128,
            intermediate_size=256,
            moe_intermediate_size=256,
            q_lora_rank=128,
            nextn=True,
        ),
    ),
    "mxfp4": ("gpt_oss", "mxfp4", dict(hidden_size=128)),
    # SM90 (CUTLASS): H 320 padded to 512, I 192 (I/TP 192, 96 padded to 256, 128), the
    # per-expert weight shapes FlashInfer's SM90 interleave was checked for on the GPU
    # (tests/swizzle_shapes.py)
    "mxfp4-sm90": ("gpt_oss", "mxfp4", dict(hidden_size=320, intermediate_size=192)),
    # ModelOpt FP8 per-tensor, I 200: I/TP 200, 100; TRT-LLM pads them to 256 and 128 and
    # shards by it (TP 2: rank 1 holds 72 rows), CUTLASS pads each half to 208, 112
    "fp8-tensor": ("qwen3_moe", "fp8-tensor", dict(hidden_size=128, moe_intermediate_size=200)),
    # ... DeepSeek-V3, whose model class declares its routing method (TRT-LLM runs FlashInfer)
    "fp8-tensor-ds": (
        "deepseek_v3",
        "fp8-tensor",
        dict(hidden_size=128, moe_intermediate_size=200),
    ),
    # ModelOpt's config in hf_quant_config.json only (older exports: nvidia/DeepSeek-R1-FP4)
    "nvfp4-hqc": (
        "deepseek_v3",
        "nvfp4",
        dict(hidden_size=128, moe_intermediate_size=128, in_config=False),
    ),
}
MOE = "model.layers.1.mlp.experts"
# the MoE layers of each model (DeepSeek-V3's layer 0 is dense), and SGLang's MoE method
MOE_LAYERS = {"mxfp8": (0, 1), "nvfp4": (1,), "nvfp4-hqc": (1,), "nvfp4-i192": (1,)}
MOE_LAYERS |= {"fp8-block": (1,)}
MOE_LAYERS |= {"mxfp4": (0, 1), "mxfp4-sm90": (0, 1)}
MOE_LAYERS |= {"fp8-tensor": (0, 1), "fp8-tensor-ds": (1,)}
# the output's MoE layers SGLang's model does not build (DeepSeek-V3's NextN layer)
NEXTN = {"fp8-block": ["model.layers.2.mlp.experts"]}
METHOD = {
    "mxfp8": "Fp8MoEMethod",
    "nvfp4": "ModelOptNvFp4FusedMoEMethod",
    "fp8-block": "Fp8MoEMethod",
    "mxfp4": "Mxfp4MoEMethod",
    "fp8-tensor": "ModelOptFp8MoEMethod",
}
# the kernel SGLang's MoE method takes (_kernels), where the runner backend does not say it
KERNEL = {
    (case, b): {sm.BACKEND[b]}
    for case in ("fp8-tensor", "fp8-tensor-ds")
    for b in ("trtllm", "cutlass")
}
KERNEL[("mxfp4-sm90", "cutlass")] = {"cutlass_sm90"}
# (case, fi-convert's backend, the scheme it converts to, TP size)
MODELS = [
    (case, backend, scheme, tp)
    for case, backend, scheme in (
        ("mxfp8", "trtllm", "mxfp8"),
        ("nvfp4", "trtllm", "nvfp4"),
        ("nvfp4", "cutlass", "nvfp4"),
        ("fp8-block", "trtllm", "fp8-block"),
        ("mxfp4", "trtllm", "mxfp4"),
        ("mxfp4-sm90", "cutlass", "mxfp4"),
        ("fp8-tensor", "trtllm", "fp8-tensor"),
        ("fp8-tensor", "cutlass", "fp8-tensor"),
        ("fp8-tensor-ds", "trtllm", "fp8-tensor"),
        ("fp8-tensor-ds", "cutlass", "fp8-tensor"),
    )
    for tp in (1, 2)
] + [("nvfp4-hqc", "trtllm", "nvfp4", 1), ("nvfp4-i192", "trtllm", "nvfp4", 2)]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sgl-models-src")
    done: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in done:
            kind, quant, sizes = CASES[case]
            done[case] = qc.write(kind, root / case, quant, **sizes)
        return done[case]

    return get


def _convert(src: Path, out: Path, scheme: str, backend: str, tp: int = 1) -> Path:
    convert(
        src, out, Options(SchemeName(scheme), Backend(backend), tp, server="sglang"), device="cpu"
    )
    return out


def platform(quant: str, runner: str):
    """What SGLang's own path needs on CPU for the format on SGLang's backend `runner`
    (tests/sglang_moe.py)."""
    stack = contextlib.ExitStack()
    if runner == "mxfp4-cutlass":
        stack.enter_context(sm.hopper())
    elif quant in ("nvfp4", "mxfp8", "mxfp4"):
        stack.enter_context(sm.blackwell(cuda_noop=quant == "mxfp4"))
    if quant == "mxfp4":
        stack.enter_context(sm.mxfp4_registered())
    if quant == "mxfp8":
        stack.enter_context(sm.cuda_gate())
    if quant == "fp8-tensor":
        stack.enter_context(sm.fp8_quant())
    return stack


def _both(src: Path, out: Path, quant: str, backend: str, tp: int = 1, rank: int = 0):
    """The plugin's load of `out` and SGLang's default load of `src`, on fi-convert's backend,
    as TP rank `rank` of `tp`."""
    runner = f"mxfp4-{backend}" if quant == "mxfp4" else backend
    with sm.sglang_context(runner, tp, rank), platform(quant, runner):
        ours = _model(None, out, "fi-convert", runner)
        theirs = _model(None, src, "auto", runner)
    return ours, theirs


def _tensors(model) -> dict:
    """Every parameter and buffer, and the tensors modules hold as plain attributes (what a
    model's own post-load step leaves: DeepSeek's MLA `w_kc`, `w_vc`, ...)."""
    held = {
        f"attr:{m}.{k}": v
        for m, mod in model.named_modules()
        for k, v in vars(mod).items()
        if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)
    }
    return (
        dict(model.named_parameters()) | {f"buffer:{n}": b for n, b in model.named_buffers()} | held
    )


def _moe(model) -> dict:
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    return {n: m for n, m in model.named_modules() if isinstance(m, FusedMoE)}


def _kernels(case: str, moe: dict) -> set[str]:
    """The kernel SGLang's MoE method took, where its runner backend alone does not say it:
    ModelOpt FP8 runs FlashInfer TRT-LLM only where the model class declares a routing method
    (else Triton); gpt-oss MXFP4 on `flashinfer_mxfp4` its SM90 CUTLASS branch on Hopper."""
    if CASES[case][1] == "fp8-tensor":
        return {older_releases.moe_runner_backend(m, m.quant_method).value for m in moe.values()}
    if case == "mxfp4-sm90":
        return {m.quant_method._fi_kernel for m in moe.values()}
    return set()


def _quantized_linears(model) -> list[str]:
    """The linears SGLang quantizes: none for ModelOpt NVFP4 and FP8 here, whose other
    linears the config lists as unquantized (BF16 in the checkpoint). (SGLang's native mxfp8
    config, which it reads ModelOpt MXFP8 into, does not expand the list's wildcards: it builds
    the attention linears as MXFP8, both loads alike.)"""
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    return [
        n
        for n, m in model.named_modules()
        if isinstance(m, LinearBase) and not isinstance(m.quant_method, UnquantizedLinearMethod)
    ]


def _differences(ours, theirs) -> tuple[list[str], dict[str, list[str]]]:
    """The parameters and buffers that differ, and per MoE layer the state that differs."""
    p, q = _tensors(ours), _tensors(theirs)  # (`differing` names those on one side only)
    a, b = _moe(ours), _moe(theirs)
    assert sorted(a) == sorted(b)
    states = {n: state_diff(sm.layer_state(a[n]), sm.layer_state(b[n])) for n in b}
    return differing(q, p), {n: d for n, d in states.items() if d}


def _flip_one_byte(out: Path, name: str) -> None:
    """One byte of tensor `name` changed in its shard, the file's size kept (the load reads
    the manifest but does not hash the shards: `fi-convert verify` does)."""
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shard = out / index["weight_map"][name]
    raw = bytearray(shard.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8 : 8 + n])[name]["data_offsets"]
    raw[8 + n + (begin + end) // 2] ^= 0x10
    shard.write_bytes(bytes(raw))


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    # no GPU here: the plugin skips its checks of it (loader.TEST_CPU_ENV)
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")


@pytest.mark.parametrize(("case", "backend", "scheme", "tp"), MODELS)
def test_a_whole_quantized_model_equals_sglangs_default_load(
    case, backend, scheme, tp, sources, tmp_path
):
    src = sources(case)
    in_config = "quantization_config" in json.loads((src / "config.json").read_text())
    assert in_config == (case != "nvfp4-hqc")
    out = _convert(src, tmp_path / "out", scheme, backend, tp)
    converted = sorted(read(out)["layers"])
    for rank in range(tp):
        ours, theirs = _both(src, out, CASES[case][1], backend, tp, rank)
        moe = _moe(theirs)
        assert sorted(moe) == [f"model.layers.{i}.mlp.experts" for i in MOE_LAYERS[case]]
        assert converted == sorted(moe) + NEXTN.get(case, [])
        assert {type(m.quant_method).__name__ for m in moe.values()} == {METHOD[scheme]}
        assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
        assert _kernels(case, moe) == KERNEL.get((case, backend), set())
        if CASES[case][1] in ("nvfp4", "fp8-tensor"):
            assert _quantized_linears(theirs) == []
        assert _differences(ours, theirs) == ([], {}), f"rank {rank} of {tp}"


def test_control_one_changed_byte_in_an_expert_shard_is_caught(sources, tmp_path):
    # (CUTLASS: a layout the plugin loads into every release, test-release's legs included)
    src = sources("nvfp4")
    out = _convert(src, tmp_path / "out", "nvfp4", "cutlass")
    name = f"{MOE}.w13_weight"
    _flip_one_byte(out, name)
    assert [p.rsplit(": ", 1)[-1] for p in check_files(out, read(out))] == [
        "SHA-256 differs from the manifest"
    ]
    ours, theirs = _both(src, out, "nvfp4", "cutlass")
    assert _differences(ours, theirs) == ([name], {})


def test_control_a_model_without_the_kernel_setup_is_caught(sources, tmp_path):
    """The plugin's kernel setup (experts.finish) skipped: the MoE layers' state differs."""
    from fi_convert.servers.sglang import experts

    src = sources("nvfp4")
    out = _convert(src, tmp_path / "out", "nvfp4", "cutlass")
    with mock.patch.object(experts, "finish", lambda layer: None):
        ours, theirs = _both(src, out, "nvfp4", "cutlass")
    params, states = _differences(ours, theirs)
    # the block-scale aliases CUTLASS reads are still SGLang's placeholders
    assert params == [f"{MOE}.w13_blockscale_swizzled", f"{MOE}.w2_blockscale_swizzled"]
    assert list(states) == [MOE]
    # CUTLASS's SwiGLU parameters (SGLang 0.5.20 makes none: the loader's state alone there)
    state = (
        "_cutlass_swiglu_params[0]" if sm.makes_cutlass_swiglu_params() else "use_padded_loading"
    )
    assert f"layer.{state}" in states[MOE]


# what each layout's kernel setup makes that SGLang's processing makes too: ModelOpt FP8 on
# CUTLASS its SwiGLU parameters (state), gpt-oss MXFP4 on SM90 its SwiGLU constants (parameters)
SETUP = {
    "fp8-tensor": ([], "layer._cutlass_swiglu_params[0]"),
    "mxfp4-sm90": ([f"{MOE}.swiglu_{k}" for k in ("alpha", "beta", "limit")], "layer.swiglu_alpha"),
}


@pytest.mark.parametrize("case", sorted(SETUP))
def test_control_a_new_layout_without_the_kernel_setup_is_caught(case, sources, tmp_path):
    """ModelOpt FP8 on CUTLASS and gpt-oss MXFP4 on SM90, the plugin's kernel setup
    (experts.finish) skipped: both MoE layers differ."""
    from fi_convert.servers.sglang import experts

    src, quant = sources(case), CASES[case][1]
    out = _convert(src, tmp_path / "out", quant, "cutlass")
    with mock.patch.object(experts, "finish", lambda layer: None):
        ours, theirs = _both(src, out, quant, "cutlass")
    params, states = _differences(ours, theirs)
    names, state = SETUP[case]
    if state == "layer._cutlass_swiglu_params[0]" and not sm.makes_cutlass_swiglu_params():
        state = "layer.use_padded_loading"  # SGLang 0.5.20 makes none: the loader's state alone
    assert [n for n in params if n.startswith(f"{MOE}.")] == names
    assert len(params) == 2 * len(names)  # layer 0's too
    assert sorted(states) == ["model.layers.0.mlp.experts", MOE]
    assert all(state in d for d in states.values())


def test_control_the_nextn_layer_of_an_output_was_refused(sources, tmp_path):
    """Before the plugin skipped it (checks.nextn_layers), an output with DeepSeek-V3's NextN
    layer was refused, every real DeepSeek-V3/R1 among them."""
    from fi_convert.servers.sglang import checks
    from fi_convert.servers.sglang.checks import PluginError

    src = sources("fp8-block")
    out = _convert(src, tmp_path / "out", "fp8-block", "trtllm")
    with (
        mock.patch.object(checks, "nextn_layers", lambda manifest, config: set()),
        pytest.raises(PluginError, match="has no MoE layer model.layers.2.mlp.experts"),
    ):
        _both(src, out, "fp8-block", "trtllm")


def test_each_rank_logs_its_whole_load_and_how_it_splits(sources, tmp_path):
    """One line per rank: the whole load's bytes, time and speed; the experts' and the
    non-expert bytes read at once; the non-expert tensors SGLang's load_weights took with their
    data (DeepSeek's q_a and kv_a projections, which its loader joins); asking the model; the
    post-load processing."""
    import re

    src = sources("fp8-block")
    out = _convert(src, tmp_path / "out", "fp8-block", "trtllm", 2)
    with sm.sglang_context("trtllm", 2, 1), platform("fp8-block", "trtllm"):
        from fi_convert.servers.sglang import loader  # (SGLang's stand-ins in place)

        with mock.patch.object(loader, "logger") as log:
            _model(None, out, "fi-convert", "trtllm")
    said = log.info.call_args.args
    line = said[0] % said[1:]
    assert re.fullmatch(
        r"fi-convert: MoE TP rank 1, EP rank 0/1 loaded [\d.]+ MB in [\d.]+ s \([\d.]+ GB/s\): "
        r"prepared in [\d.]+ s \(the experts' parameters, the read's plan\), "
        r"the experts of 1 MoE layers \([\d.]+ MB\) and non-expert tensors \([\d.]+ MB\) read "
        r"at once in [\d.]+ s \(\d+ threads?, \d+ MiB pinned\), then the model's load_weights "
        r"in [\d.]+ s \(non-expert [\d.]+ MB with their data, (\d+) tensors\); the model asked "
        r"where in [\d.]+ s \(not kept for the next load: its loading does more than copy "
        r"each tensor in one call\), post-load processing [\d.]+ s; "
        rf"from {re.escape(str(out))}",
        line,
    ), line
    joined = int(re.search(r"with their data, (\d+) tensors", line).group(1))
    assert joined >= 4  # q_a_proj and kv_a_proj_with_mqa of 2 layers (and their scales)


# models whose loading SGLang's own class does in one call that only copies (an answer kept)
LATER = [("mxfp4", "trtllm", "mxfp4"), ("fp8-tensor", "trtllm", "fp8-tensor")]


def _line(log) -> str:
    said = log.info.call_args.args
    return said[0] % said[1:]


@pytest.mark.parametrize(("case", "backend", "scheme"), LATER)
def test_a_later_load_takes_the_models_answer_and_equals_sglangs_default_load(
    case, backend, scheme, sources, tmp_path
):
    """format/plan_cache.py with SGLang's own model class, each rank of TP 2: the second load
    of a rank takes the answer the first one kept, without asking the model, and equals
    SGLang's default load; rank 1 does not take rank 0's."""
    src = sources(case)
    out = _convert(src, tmp_path / "out", scheme, backend, 2)
    quant = CASES[case][1]
    runner = f"mxfp4-{backend}" if quant == "mxfp4" else backend
    for rank in range(2):
        with sm.sglang_context(runner, 2, rank), platform(quant, runner):
            from fi_convert.servers.sglang import loader  # (SGLang's stand-ins in place)

            with mock.patch.object(loader, "logger") as log:
                _model(None, out, "fi-convert", runner)
            assert "(kept for the next load)" in _line(log)
            with (
                mock.patch.object(loader, "logger") as log,
                mock.patch("fi_convert.format.dense.probe", side_effect=AssertionError("asked")),
            ):
                ours = _model(None, out, "fi-convert", runner)
            assert "taken from the model's answer to an earlier load" in _line(log)
            theirs = _model(None, src, "auto", runner)
        assert _differences(ours, theirs) == ([], {}), f"rank {rank} of 2"

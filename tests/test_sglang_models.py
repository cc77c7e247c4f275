"""Whole tiny quantized models through SGLang 0.5.23's own `get_model_loader`, on CPU: the
plugin's loader (`--load-format fi-convert`, FiConvertModelLoader) of fi-convert's output
against SGLang's default load (`load_format auto`: its own weight loading and
`postprocess_weights`) of the source.

For each scheme the plugin loads besides BF16 (tests/test_sglang_plugin.py has BF16's whole
models): ModelOpt NVFP4 (DeepSeek-V3, TRT-LLM and CUTLASS), ModelOpt MXFP8 (Qwen3-MoE,
TRT-LLM), gpt-oss MXFP4 (`flashinfer_mxfp4`) and DeepSeek FP8 block (TRT-LLM). The sources are
transformers-written models whose linears are replaced by the scheme's format
(tests/quantized_checkpoints.py), converted with `--server sglang`. Every parameter and buffer
of the two models is byte-equal (dtype, shape, bytes), and so is the state each MoE layer and
its method carry (tests/sglang_moe.layer_state). Negative control: one byte changed in an
output's expert tensor (the shard rewritten and its manifest hash updated, so the load does not
refuse it) is caught; the hash check refuses the changed shard otherwise.

SGLang's own path needs on CPU what its layer tests need (tests/sglang_moe.py: SGLang's SM100
platform hook and a CPU version of FlashInfer's CUDA-only scale swizzle for NVFP4, MXFP8 and
MXFP4, its `fp8._is_cuda` flag for MXFP8), during both loads alike.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.format.manifest import check_files, read
from tests import quantized_checkpoints as qc
from tests import sglang_moe as sm
from tests.test_sglang_plugin import differing, registered, state_diff  # noqa: F401 (fixture)

# case: (transformers' model, the source format, sizes); H a multiple of 128 (SGLang's NVFP4 and
# MXFP8 need it), I/TP a multiple of 128 (FP8 block)
CASES = {
    "mxfp8": ("qwen3_moe", "mxfp8", dict(hidden_size=128, moe_intermediate_size=128)),
    "nvfp4": ("deepseek_v3", "nvfp4", dict(hidden_size=128, moe_intermediate_size=128)),
    # q_lora_rank 128: SGLang fuses q_a_proj with kv_a_proj_with_mqa, and their block scales
    "fp8-block": (
        "deepseek_v3",
        "fp8-block",
        dict(hidden_size=128, moe_intermediate_size=128, q_lora_rank=128),
    ),
    "mxfp4": ("gpt_oss", "mxfp4", dict(hidden_size=128)),
}
# the MoE layers of each model (DeepSeek-V3's layer 0 is dense), and SGLang's MoE method
MOE_LAYERS = {"mxfp8": (0, 1), "nvfp4": (1,), "fp8-block": (1,), "mxfp4": (0, 1)}
METHOD = {
    "mxfp8": "Fp8MoEMethod",
    "nvfp4": "ModelOptNvFp4FusedMoEMethod",
    "fp8-block": "Fp8MoEMethod",
    "mxfp4": "Mxfp4MoEMethod",
}
# (case, fi-convert's backend, the scheme it converts to)
MODELS = [
    ("mxfp8", "trtllm", "mxfp8"),
    ("nvfp4", "trtllm", "nvfp4"),
    ("nvfp4", "cutlass", "nvfp4"),
    ("fp8-block", "trtllm", "fp8-block"),
    ("mxfp4", "trtllm", "mxfp4"),
]


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


def _convert(src: Path, out: Path, scheme: str, backend: str) -> Path:
    convert(src, out, Options(SchemeName(scheme), Backend(backend), 1, server="sglang"), device="cpu")
    return out


def platform(quant: str):
    """What SGLang's own path needs on CPU for the format (tests/sglang_moe.py)."""
    stack = contextlib.ExitStack()
    if quant in ("nvfp4", "mxfp8", "mxfp4"):
        stack.enter_context(sm.blackwell(cuda_noop=quant == "mxfp4"))
    if quant == "mxfp4":
        stack.enter_context(sm.mxfp4_registered())
    if quant == "mxfp8":
        stack.enter_context(sm.cuda_gate())
    return stack


def _model(path: Path, load_format: str, runner: str):
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model_loader
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=str(path), load_format=load_format, moe_runner_backend=runner)
    mc = ModelConfig.from_server_args(args)
    loader = get_model_loader(LoadConfig(load_format=load_format), mc)
    return loader.load_model(model_config=mc, device_config=DeviceConfig("cpu"))


def _both(src: Path, out: Path, quant: str, backend: str):
    """The plugin's load of `out` and SGLang's default load of `src`, on fi-convert's backend."""
    runner = "mxfp4-trtllm" if quant == "mxfp4" else backend
    with sm.sglang_context(runner, 1, 0), platform(quant):
        ours = _model(out, "fi-convert", sm.BACKEND[runner])
        theirs = _model(src, "auto", sm.BACKEND[runner])
    return ours, theirs


def _tensors(model) -> dict:
    return dict(model.named_parameters()) | {f"buffer:{n}": b for n, b in model.named_buffers()}


def _moe(model) -> dict:
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    return {n: m for n, m in model.named_modules() if isinstance(m, FusedMoE)}


def _differences(ours, theirs) -> tuple[list[str], dict[str, list[str]]]:
    """The parameters and buffers that differ, and per MoE layer the state that differs."""
    p, q = _tensors(ours), _tensors(theirs)
    assert sorted(p) == sorted(q)
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


@pytest.mark.parametrize(("case", "backend", "scheme"), MODELS)
def test_a_whole_quantized_model_equals_sglangs_default_load(
    case, backend, scheme, registered, sources, tmp_path
):
    src = sources(case)
    out = _convert(src, tmp_path / "out", scheme, backend)
    ours, theirs = _both(src, out, CASES[case][1], backend)
    moe = _moe(theirs)
    assert sorted(moe) == [f"model.layers.{i}.mlp.experts" for i in MOE_LAYERS[case]]
    assert {type(m.quant_method).__name__ for m in moe.values()} == {METHOD[scheme]}
    assert _differences(ours, theirs) == ([], {})


def test_control_one_changed_byte_in_an_expert_shard_is_caught(registered, sources, tmp_path):
    src = sources("nvfp4")
    out = _convert(src, tmp_path / "out", "nvfp4", "trtllm")
    name = "model.layers.1.mlp.experts.w13_weight"
    _flip_one_byte(out, name)
    assert [p.rsplit(": ", 1)[-1] for p in check_files(out, read(out))] == [
        "SHA-256 differs from the manifest"
    ]
    ours, theirs = _both(src, out, "nvfp4", "trtllm")
    assert _differences(ours, theirs) == ([name], {})

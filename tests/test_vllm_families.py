"""The families fi-convert added (fi_convert/families/*.json) proven by vLLM 0.33's own model
classes, on CPU: a tiny checkpoint written by transformers' own `save_pretrained` (tests/
hf_checkpoints.py; quantized as ModelOpt's FP8 exporter writes it, tests/
quantized_checkpoints.py) is built as vLLM's own model (Glm4MoeForCausalLM,
MiniMaxM2ForCausalLM, Ernie4_5_MoeForCausalLM, OlmoeForCausalLM: their FusedMoE layers and
expert mappings) twice: vLLM's default load of the source (`DefaultModelLoader.load_weights`,
the model's own `load_weights`) and fi-convert's plugin's load of the output
(`FiConvertModelLoader`), each followed by vLLM's own post-load driver. Every parameter and
buffer, and each MoE layer's kernel and its state (tests/vllm_moe.assert_same_layer), must be
equal, at TP 1 and 2, every rank.

What is patched is what tests/vllm_moe.py patches (device checks, the capability, the TP rank)
and, to build a whole model on a CPU-less platform, the attention backend's name (Triton's:
the attention layers hold no weights it changes) and a one-process gloo group for vLLM's
pipeline-parallel checks.
"""

from __future__ import annotations

import contextlib
import socket
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from vllm.config import ModelConfig, get_current_vllm_config
from vllm.config.load import LoadConfig
from vllm.distributed import parallel_state as ps
from vllm.model_executor.layers.fused_moe.runner.moe_runner_interface import MoERunnerInterface
from vllm.model_executor.model_loader import get_model_loader
from vllm.model_executor.model_loader.utils import process_weights_after_loading
from vllm.platforms import current_platform

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.servers.vllm.loader import FiConvertModelLoader
from tests import family_forms_models as ffm
from tests import hf_checkpoints as hf
from tests import quantized_checkpoints as qc
from tests import vllm_moe as vm

ATTENTION = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
# case: (transformers' model, vLLM's model class, the source format or None for BF16, sizes)
CASES = {
    "glm-bf16": ("glm4_moe", "glm4_moe.Glm4MoeForCausalLM", None, {}),
    # ModelOpt FP8 per tensor (attention, dense and shared MLPs left BF16 as ModelOpt lists
    # them; DeepSeek-style FP8 block quantizes the attention too, whose FP8 linears vLLM has no
    # CPU kernel for), I 200: padded per rank
    "glm-fp8-tensor": (
        "glm4_moe",
        "glm4_moe.Glm4MoeForCausalLM",
        "fp8-tensor",
        dict(hidden_size=128, moe_intermediate_size=200),
    ),
    "minimax-bf16": ("minimax_m2", "minimax_m2.MiniMaxM2ForCausalLM", None, {}),
    "ernie-bf16": ("ernie4_5_moe", "ernie45_moe.Ernie4_5_MoeForCausalLM", None, {}),
    "olmoe-bf16": ("olmoe", "olmoe.OlmoeForCausalLM", None, {}),
    # Nemotron-H: a Mamba mixer, then non-gated experts (relu2_no_mul), then attention; I 192:
    # padded per rank
    "nemotron-bf16": (
        "nemotron_h",
        "nemotron_h.NemotronHForCausalLM",
        None,
        dict(moe_intermediate_size=192),
    ),
    # ModelOpt FP8 per tensor (as nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8), I 200
    "nemotron-fp8-tensor": (
        "nemotron_h",
        "nemotron_h.NemotronHForCausalLM",
        "fp8-tensor",
        dict(hidden_size=128, moe_intermediate_size=200),
    ),
    # flat experts [E*I, H], w2 turned (DbrxExperts' own weight loader splits them)
    "dbrx-bf16": ("dbrx", "dbrx.DbrxForCausalLM", None, {}),
    # fused experts stored turned (fc1 [E, H, 2I], fc2 [E, I, H]), beside a shared expert
    "aria-bf16": ("aria", "aria.AriaForConditionalGeneration", None, {}),
    # Mamba layers beside the MoE; softmax routing without renormalization (Default)
    "jamba-bf16": ("jamba", "jamba.JambaForCausalLM", None, {}),
    # ERNIE-4.5-VL, the whole multimodal model: its language model's load_weights splits each
    # layer's 2N experts into text_experts and vision_experts, and its mapper names the layers
    # language_model.model.layers.L (tests/family_forms_models.py)
    "ernie-vl-bf16": (
        "ernie4_5_moe_vl",
        "ernie45_vl.Ernie4_5_VLMoeForConditionalGeneration",
        None,
        {},
    ),
}
# (case, backend, scheme): ERNIE-4.5 (Unspecified routing), OLMoE and Jamba (Default) run BF16
# on CUTLASS only (vLLM's monolithic TRT-LLM BF16 kernels take neither routing)
RUNS = [
    ("glm-bf16", "trtllm", "bf16"),
    ("glm-bf16", "cutlass", "bf16"),
    ("glm-fp8-tensor", "trtllm", "fp8-tensor"),
    ("glm-fp8-tensor", "cutlass", "fp8-tensor"),
    ("minimax-bf16", "trtllm", "bf16"),
    ("minimax-bf16", "cutlass", "bf16"),
    ("ernie-bf16", "cutlass", "bf16"),
    ("olmoe-bf16", "cutlass", "bf16"),
    ("nemotron-bf16", "trtllm", "bf16"),
    ("nemotron-bf16", "cutlass", "bf16"),
    ("nemotron-fp8-tensor", "trtllm", "fp8-tensor"),
    ("nemotron-fp8-tensor", "cutlass", "fp8-tensor"),
    ("dbrx-bf16", "trtllm", "bf16"),
    ("dbrx-bf16", "cutlass", "bf16"),
    ("aria-bf16", "trtllm", "bf16"),
    ("aria-bf16", "cutlass", "bf16"),
    ("jamba-bf16", "cutlass", "bf16"),
    ("ernie-vl-bf16", "cutlass", "bf16"),
]
MODELS = [(*run, tp) for run in RUNS for tp in (1, 2)]


def _one_process_group() -> None:
    """vLLM's parallel groups of one process (its model classes ask the PP group's rank), made
    once, inside a vLLM config's context."""
    if ps._WORLD is not None:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ps.init_distributed_environment(
        world_size=1,
        rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{port}",
        local_rank=0,
        backend="gloo",
    )
    ps.initialize_model_parallel(1, 1)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-families-src")
    done: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in done:
            kind, _, quant, sizes = CASES[case]
            if kind == "ernie4_5_moe_vl":
                done[case] = ffm.save_ernie45_vl(root / case)
            elif quant is None:
                save = ffm.save if kind in ffm.MODELS else hf.save  # multimodal: text + vision
                done[case] = save(kind, root / case, **sizes)
            else:
                done[case] = qc.write(kind, root / case, quant, **sizes)
        return done[case]

    return get


@contextlib.contextmanager
def vllm_model(case: str, src: Path, backend: str, tp: int, rank: int):
    """vLLM's own model class for the case, built as rank `rank` of `tp` (inside its
    context: the MoE layers' kernel setup needs it), with the source's model config."""
    import importlib

    module, cls = CASES[case][1].split(".")
    ffm.register_ernie45_vl_config()
    model_cls = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), cls)
    attn = classmethod(lambda c, *a, **k: ATTENTION)
    with (
        vm.vllm_context(backend, tp, rank),
        mock.patch.object(type(current_platform), "get_attn_backend_cls", attn),
    ):
        _one_process_group()
        cfg = get_current_vllm_config()
        mc = ModelConfig(model=str(src), skip_tokenizer_init=True, dtype="bfloat16")
        cfg.model_config = mc
        cfg.quant_config = vm.quant_config(src)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = model_cls(vllm_config=cfg, prefix="")
        finally:
            torch.set_default_dtype(default)
        yield model, mc


def _tensors(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters()) | {f"buffer:{n}": b for n, b in model.named_buffers()}


def _moe(model) -> dict:
    return {n: m for n, m in model.named_modules() if isinstance(m, MoERunnerInterface)}


def _differing(theirs: dict, ours: dict) -> list[str]:
    names = list(theirs) + [n for n in ours if n not in theirs]
    return [
        n
        for n in names
        if n not in theirs
        or n not in ours
        or (theirs[n].dtype, theirs[n].shape) != (ours[n].dtype, ours[n].shape)
        or not torch.equal(
            theirs[n].reshape(-1).view(torch.uint8), ours[n].reshape(-1).view(torch.uint8)
        )
    ]


# Cases whose model's own `load_weights` looks its experts' parameters up under the MoE
# module's name (DbrxModel: `blocks.L.ffn.experts.w13_weight`), where vLLM 0.33's FusedMoEFactory
# returns a MoERunner that holds them one level down (`...experts.routed_experts.w13_weight`):
# vLLM 0.33's own load of a DBRX checkpoint fails there with a KeyError. For vLLM's side of the
# comparison each such parameter is also registered, for the load only, under the name the
# model asks (the same Parameter, so its own weight_loader, DbrxExperts', fills it); the
# plugin's side needs no such help (it reads the experts into the RoutedExperts itself).
EXPERTS_ASKED_ON_THE_RUNNER = ("dbrx-bf16",)


@contextlib.contextmanager
def _experts_under_the_runners_name(model, case: str):
    runners = list(_moe(model).values()) if case in EXPERTS_ASKED_ON_THE_RUNNER else []
    for r in runners:
        for n, p in list(r.routed_experts.named_parameters(recurse=False)):
            r.register_parameter(n, p)
    try:
        yield
    finally:
        for r in runners:
            for n, _ in list(r.routed_experts.named_parameters(recurse=False)):
                r._parameters.pop(n, None)


def test_vllms_own_dbrx_load_fails_without_the_alias(sources):
    """The reason for EXPERTS_ASKED_ON_THE_RUNNER: vLLM 0.33's DbrxModel.load_weights asks
    for `blocks.0.ffn.experts.w13_weight`, which its MoERunner does not hold."""
    src = sources("dbrx-bf16")
    with (
        vllm_model("dbrx-bf16", src, "cutlass", 1, 0) as (theirs, mc),
        pytest.raises(KeyError, match=r"blocks\.0\.ffn\.experts\.w13_weight"),
    ):
        get_model_loader(LoadConfig(load_format="auto")).load_weights(theirs, mc)


def _both(case: str, src: Path, out: Path, backend: str, tp: int, rank: int):
    """vLLM's default load of the source and the plugin's load of the output, each processed
    by vLLM's own post-load driver, as rank `rank` of `tp`."""
    with vllm_model(case, src, backend, tp, rank) as (theirs, mc):
        with _experts_under_the_runners_name(theirs, case):
            get_model_loader(LoadConfig(load_format="auto")).load_weights(theirs, mc)
        process_weights_after_loading(theirs, mc, torch.device("cpu"))
    with vllm_model(case, src, backend, tp, rank) as (ours, mc):
        served = types.SimpleNamespace(
            model=str(out), revision=None, quantization=mc.quantization, hf_config=mc.hf_config
        )
        FiConvertModelLoader(LoadConfig(load_format="fi-convert")).load_weights(ours, served)
        process_weights_after_loading(ours, mc, torch.device("cpu"))
    return ours, theirs


@pytest.mark.parametrize(("case", "backend", "scheme", "tp"), MODELS)
def test_a_whole_model_of_the_family_equals_vllms_default_load(
    case, backend, scheme, tp, sources, tmp_path
):
    src = sources(case)
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName(scheme), Backend(backend), tp), device="cpu")
    for rank in range(tp):
        ours, theirs = _both(case, src, out, backend, tp, rank)
        a, b = _moe(theirs), _moe(ours)
        assert sorted(a) == sorted(b) and a
        assert _differing(_tensors(theirs), _tensors(ours)) == [], f"rank {rank} of {tp}"
        for name in a:
            vm.assert_same_layer(a[name].routed_experts, b[name].routed_experts)  # kernel, state


def test_the_plugin_reads_vllms_bf16_backend_names():
    """vLLM 0.33 spells its unquantized MoE backends "FlashInfer TRTLLM" / "FlashInfer
    CUTLASS" (oracle/unquantized.py), its quantized ones FLASHINFER_TRTLLM: before the plugin
    read both, it refused every BF16 output on a whole model (the test above found it)."""
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

    from fi_convert.servers.vllm.checks import backend_of

    for backend, name in (("trtllm", "FLASHINFER_TRTLLM"), ("cutlass", "FLASHINFER_CUTLASS")):
        method = types.SimpleNamespace(unquantized_backend=UnquantizedMoeBackend[name])
        assert " " in UnquantizedMoeBackend[name].value
        assert backend_of(method) == backend

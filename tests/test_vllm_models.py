"""Whole models in vLLM 0.33's own model classes, on CPU: the plugin's load of fi-convert's
output (FiConvertModelLoader.load_weights, then vLLM's post-load driver) against vLLM's default
load of the source (DefaultModelLoader.load_weights over the source's shards, the same driver),
at TP 1 and 2, every rank. Every parameter and buffer of the two models is byte-equal.

The non-expert tensors are read by the plugin beside the experts (fi_convert/format/dense.py):
where the model's own loading only copies a tensor (asked of it with a data-less probe), its
byte ranges are read straight into the parameters, the rank's slices only; the rest go through
the model's `load_weights`. These tests also show which went which way.

The sources are transformers-written models (tests/hf_checkpoints.py), DeepSeek-V3's linears
in DeepSeek's FP8 block format (tests/quantized_checkpoints.py). What is patched is only where
vLLM asks what hardware it runs on (tests/vllm_moe.py) and which attention backend it picks (its
CPU one: none is chosen on this CPU-less platform); vLLM's process group is gloo, of one rank.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from vllm.config import LoadConfig
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.servers.vllm import loader as plugin_loader
from fi_convert.servers.vllm.loader import FiConvertModelLoader
from tests import hf_checkpoints
from tests import quantized_checkpoints as qc
from tests import vllm_moe as vm

# case: (transformers' model, the source format (None: BF16), sizes, fi-convert's scheme)
CASES = {
    # norm_topk_prob: Qwen3-30B-A3B's (renormalized routing, which TRT-LLM's BF16 MoE runs)
    "qwen3-bf16": ("qwen3_moe", None, dict(norm_topk_prob=True), "bf16"),
    "mixtral-bf16": ("mixtral", None, {}, "bf16"),
}


@pytest.fixture(scope="module")
def gloo():
    """vLLM's process groups, of one rank (its model classes ask for the PP group)."""
    with vm.one_process_group():
        yield


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-models-src")
    done: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in done:
            kind, quant, sizes, _ = CASES[case]
            if quant is None:
                done[case] = hf_checkpoints.save(kind, root / case, **sizes)
            else:
                done[case] = qc.write(kind, root / case, quant, **sizes)
        return done[case]

    return get


def _vllm(src: Path, tp: int, rank: int):
    """vLLM's config of the source as rank `rank` of `tp` (its model classes built here)."""
    return vm.model_context(src, tp, rank)


def vllms_load(src: Path, tp: int, rank: int) -> torch.nn.Module:
    """vLLM's default load of the source, then its post-load driver."""
    with _vllm(src, tp, rank) as cfg:
        model = initialize_model(vllm_config=cfg)
        DefaultModelLoader(LoadConfig()).load_weights(model, cfg.model_config)
        process_weights_after_loading(model, cfg.model_config, torch.device("cpu"))
    return model


def plugins_load(
    src: Path, out: Path, tp: int, rank: int, scribbled: bool = False
) -> tuple[torch.nn.Module, str]:
    """The plugin's load of the output into the same model, then vLLM's post-load driver;
    and the line the plugin logged. `scribbled`: each byte of the model's parameters set to
    0x5A first (a byte the load leaves is seen)."""
    with _vllm(src, tp, rank) as cfg:
        model = initialize_model(vllm_config=cfg)
        for p in model.parameters() if scribbled else ():
            p.data.view(-1).view(torch.uint8).fill_(0x5A)
        mc = cfg.model_config
        at = types.SimpleNamespace(
            model=str(out), revision=None, quantization=mc.quantization, hf_config=mc.hf_config
        )
        with mock.patch.object(plugin_loader, "logger") as log:
            FiConvertModelLoader(LoadConfig(load_format="fi-convert")).load_weights(model, at)
        process_weights_after_loading(model, mc, torch.device("cpu"))
    said = log.info.call_args.args
    return model, said[0] % said[1:]


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters()) | {f"buffer:{n}": b for n, b in model.named_buffers()}


def differing(theirs: dict, ours: dict) -> list[str]:
    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        if (a.dtype, a.shape) != (b.dtype, b.shape):
            return False
        return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))

    names = list(theirs) + [n for n in ours if n not in theirs]
    return [n for n in names if n not in theirs or n not in ours or not same(theirs[n], ours[n])]


def _convert(src: Path, out: Path, scheme: str, tp: int) -> Path:
    convert(src, out, Options(SchemeName(scheme), Backend.TRTLLM, tp), device="cpu")
    return out


@pytest.mark.usefixtures("gloo")
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_whole_model_equals_vllms_default_load(case, tp, sources, tmp_path):
    src = sources(case)
    out = _convert(src, tmp_path / "out", CASES[case][3], tp)
    for rank in range(tp):
        theirs = vllms_load(src, tp, rank)
        ours, line = plugins_load(src, out, tp, rank)
        assert differing(_tensors(theirs), _tensors(ours)) == [], f"rank {rank} of {tp}"
        assert re.search(rf"TP rank {rank}/{tp} loaded ", line), line
        # every non-expert tensor read straight in: the vocabulary embedding and head too,
        # whose loader zeroes the padding rows after the rank's (no byte of the copy)
        assert "non-expert 0.0 MB with their data, 0 tensors" in line, line


@pytest.mark.usefixtures("gloo")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_later_load_takes_the_models_answer_and_equals_vllms_default_load(case, tmp_path):
    """format/plan_cache.py with vLLM's own model class, each rank of TP 2: the first load
    asks the model and keeps its answer; the second of the same rank takes it without asking
    (vLLM's loading of the model is not called) and every tensor equals vLLM's default load's,
    the padding rows of the vocabulary embedding and head zeroed as its loading zeroes them.
    Rank 1 does not take rank 0's answer. (A vocabulary of 200: 100 rows a rank, padded to
    128.)"""
    kind, quant, sizes, _ = CASES[case]
    assert quant is None
    src = hf_checkpoints.save(kind, tmp_path / "src", vocab_size=200, **sizes)
    out = _convert(src, tmp_path / "out", CASES[case][3], 2)
    for rank in range(2):
        theirs = _tensors(vllms_load(src, 2, rank))
        _, first = plugins_load(src, out, 2, rank)
        assert "the model asked where in" in first and "(kept for the next load)" in first
        with mock.patch("fi_convert.format.dense.probe", side_effect=AssertionError("asked")):
            ours, second = plugins_load(src, out, 2, rank, scribbled=True)
        assert "taken from the model's answer to an earlier load" in second, second
        assert differing(theirs, _tensors(ours)) == [], f"rank {rank} of 2"

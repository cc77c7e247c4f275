"""fi_convert/servers/sglang/: weight updates into a model SGLang 0.5.23 loaded with
`--load-format fi-convert`, through SGLang's own `update_weights_from_disk` and
`update_weights_from_tensor` (model_runner_components/weight_updater.py, run as its model
runner runs them). A checkpoint-format update ends as SGLang's own: equal to the same update
of a model SGLang loaded from the source, and, from disk, to SGLang's own load of the new
checkpoint. An update from disk of an fi-convert output is refused in one line.

On SGLang 0.5.20-0.5.22 (their venvs, `make test-release`) SGLang's own `update_weights_from_disk`
of a BF16 model on TRT-LLM fails on its own load of the source too (its BF16 TRT-LLM processing
runs again over the weights it packed into blocks, and FlashInfer's row permutation refuses
them: `x should be a 2D tensor`); there the test shows the plugin's load failing as SGLang's own
does, and a release that fixes it (or breaks it) fails the test, which says so."""

from __future__ import annotations

import shutil
import types
from importlib import metadata
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests import sglang_moe as sm
from tests.test_sglang_plugin import _model, differing, outputs, registered, sources

__all__ = ["outputs", "registered", "sources"]  # the fixtures, shared with the plugin's tests

CASES = [("hf-qwen3", "trtllm"), ("hf-qwen3", "cutlass"), ("hf-mixtral", "trtllm")]
RELEASE = metadata.version("sglang")  # the release whose own code is the authority here
# The releases and backends where SGLang's own update from disk of a BF16 model fails on its
# own load (measured on each release: 0.5.23 restores the canonical layout before it loads)
OWN_UPDATE_FAILS = {(r, "trtllm") for r in ("0.5.20", "0.5.21", "0.5.22")}


def _later(ckpt: Path, dst: Path) -> Path:
    """The trainer's next checkpoint: the same files, names, dtypes and shapes, every
    floating-point tensor changed."""
    if dst.exists():
        return dst
    shutil.copytree(ckpt, dst)
    gen = torch.Generator().manual_seed(5)
    for shard in sorted(dst.glob("*.safetensors")):
        tensors = load_file(shard)
        for name, t in tensors.items():
            if t.is_floating_point():
                noise = torch.randn(t.shape, generator=gen).to(t.dtype)
                tensors[name] = (t.float() * 0.5 + noise.float() * 0.01).to(t.dtype)
        save_file(tensors, shard, metadata={"format": "pt"})
    return dst


def _runner(model: torch.nn.Module, path: Path, load_format: str, backend: str):
    """What SGLang's WeightUpdater reads of its model runner for an update (CPU, no CUDA
    graphs, no weight cache): the model, and SGLang's ModelConfig of the server's launch."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=str(path), load_format=load_format, moe_runner_backend=sm.BACKEND[backend]
    )
    runner = types.SimpleNamespace(
        device="cpu",
        gpu_id=0,
        tp_rank=0,  # (0.5.20's update_weights_from_tensor reads it)
        model_config=ModelConfig.from_server_args(args),
        custom_weight_loaders=[],
        get_model=lambda: model,
        update_model_fields=lambda *a, **k: None,
        _assert_weight_cache_inactive=lambda op: None,
    )
    for name in ("update_weights_from_disk", "update_weights_from_tensor"):
        setattr(runner, name, types.MethodType(getattr(WeightUpdater, name), runner))
    return runner


def _tensors(ckpt: Path) -> list[tuple[str, torch.Tensor]]:
    return [(n, t) for p in sorted(ckpt.glob("*.safetensors")) for n, t in load_file(p).items()]


@pytest.mark.parametrize(("case", "backend"), CASES)
def test_an_update_from_disk_of_a_checkpoint_ends_as_sglangs_own_load_of_it(
    case, backend, registered, sources, outputs, monkeypatch, tmp_path_factory
):
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")  # no GPU here: skip its checks
    src, out = sources(case), outputs(case, backend, 1)
    new = _later(src, tmp_path_factory.getbasetemp() / f"{case}-later")
    with sm.sglang_context(backend, 1, 0):
        ours = _model(registered, out, "fi-convert", backend)
        own = _model(registered, src, "auto", backend)  # SGLang's own load of the source
        theirs = _model(registered, new, "auto", backend)
        got = _update_from_disk(ours, out, "fi-convert", backend, new)
        got_own = _update_from_disk(own, src, "auto", backend, new)
    if (RELEASE, backend) in OWN_UPDATE_FAILS:  # SGLang's own fails: the plugin's load alike
        assert isinstance(got_own, str), f"SGLang {RELEASE}'s own update now works: {got_own}"
        assert got == got_own
        return
    assert got == got_own == (True, got_own[1]), (got, got_own)
    p, q = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert sorted(p) == sorted(q)
    assert differing(q, p) == []
    assert differing(q, dict(own.named_parameters())) == []


def _update_from_disk(model, path: Path, how: str, backend: str, new: Path):
    """SGLang's update_weights_from_disk of `new`: its (ok, message), or the exception it
    raises, as a line (its own rollback re-raises when the reload fails again)."""
    try:
        return _runner(model, path, how, backend).update_weights_from_disk(str(new), "auto")
    except Exception as e:  # noqa: BLE001  (SGLang's own failure, compared as it is)
        return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize(("case", "backend"), CASES)
def test_an_update_from_tensors_of_converted_experts_is_refused_in_one_line(
    case, backend, registered, sources, outputs, monkeypatch, tmp_path_factory
):
    """SGLang's update_weights_from_tensor loads through the experts' weight loader and runs no
    processing after: on SGLang's own load with TRT-LLM the layer then holds the checkpoint's
    layout, not what SGLang's load of the checkpoint holds (the control below). On a model
    served from an output the update is refused before anything is written; tensors of
    other modules, and the served layout copied by name (`direct`), go on."""
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")
    src, out = sources(case), outputs(case, backend, 1)
    new = _later(src, tmp_path_factory.getbasetemp() / f"{case}-later")
    tensors = _tensors(new)
    with sm.sglang_context(backend, 1, 0):
        ours = _model(registered, out, "fi-convert", backend)
        theirs = _model(registered, src, "auto", backend)
        fresh = _model(registered, new, "auto", backend)
        before = {n: p.data.clone() for n, p in ours.named_parameters()}
        ok, said = _runner(ours, out, "fi-convert", backend).update_weights_from_tensor(tensors)
        assert not ok and "\n" not in said
        expert = next(n for n, _ in tensors if ".experts." in n)
        assert said == (
            f"fi-convert: {expert}: an expert of a layer loaded from an fi-convert output, "
            "which holds kernel layouts that SGLang's update_weights_from_tensor writes into "
            "without its processing; update from a checkpoint with update_weights_from_disk "
            "(load_format 'auto'), or send the served layout with load_format 'direct'"
        )
        assert all(torch.equal(before[n], p.data) for n, p in ours.named_parameters())
        # the rest of the model updates as on SGLang's own load
        others = [(n, t) for n, t in tensors if ".experts." not in n]
        for model, path, how in ((ours, out, "fi-convert"), (theirs, src, "auto")):
            assert _runner(model, path, how, backend).update_weights_from_tensor(others)[0]
        assert differing(dict(theirs.named_parameters()), dict(ours.named_parameters())) == []
        # the served layout, by name: SGLang's own load of the new checkpoint, copied in
        direct = [(n, p.data) for n, p in fresh.named_parameters()]
        ok, said = _runner(ours, out, "fi-convert", backend).update_weights_from_tensor(
            direct, load_format="direct"
        )
        assert ok, said
    assert differing(dict(fresh.named_parameters()), dict(ours.named_parameters())) == []


def test_control_sglangs_own_update_from_tensors_on_trtllm_is_not_its_load(
    registered, sources, monkeypatch, tmp_path_factory
):
    src = sources("hf-qwen3")
    new = _later(src, tmp_path_factory.getbasetemp() / "hf-qwen3-later")
    with sm.sglang_context("trtllm", 1, 0):
        theirs = _model(registered, src, "auto", "trtllm")
        fresh = _model(registered, new, "auto", "trtllm")
        assert _runner(theirs, src, "auto", "trtllm").update_weights_from_tensor(_tensors(new))[0]
    assert differing(dict(fresh.named_parameters()), dict(theirs.named_parameters())) != []


def test_an_update_from_disk_of_an_output_is_refused(registered, sources, outputs, monkeypatch):
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")
    out = outputs("hf-qwen3", "trtllm", 1)
    with sm.sglang_context("trtllm", 1, 0):
        ours = _model(registered, out, "fi-convert", "trtllm")
        before = {n: p.data.clone() for n, p in ours.named_parameters()}
        ok, said = _runner(ours, out, "fi-convert", "trtllm").update_weights_from_disk(
            str(out), "fi-convert"
        )
    assert not ok and said == (
        f"Failed to get weights iterator: fi-convert: {out}: updating weights from an "
        "fi-convert output is not supported; update from a source checkpoint with "
        "load_format 'auto'."
    )
    assert all(torch.equal(before[n], p.data) for n, p in ours.named_parameters())

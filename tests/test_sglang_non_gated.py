"""Non-gated experts (Nemotron-H, relu2_no_mul) for the installed SGLang (0.5.23, and
0.5.20-0.5.22 in their venvs: `make test-release`), against its own MoE code: its FusedMoE
built as models/nemotron_h.py builds it (`is_gated=False`, DeepSeekV3 routing; tests/
sglang_moe.py), the checkpoint's up_proj through its own weight loader as that model maps it
(FusedMoE's w1), and its `process_weights_after_loading`, one process playing TP rank r of N.

(a) `--server sglang` BF16 and ModelOpt FP8 (per tensor) outputs hold SGLang's own bytes on
    both runners, every rank (TP 1, 2 and 4: BF16 I/TP 192, 96, 48, padded to 256, 128, 128 on
    TRT-LLM and sharded by the padded size; FP8 I/TP 200, 100, 50: on TRT-LLM padded to 256,
    128, 128 and sharded by it, its output1 scale ones * (1 / a2); on CUTLASS padded to 16, as
    for gated experts, where vLLM pads non-gated ones to 128);
(b) the plugin's path (the output's tensors into SGLang's layer, kernel setup only) leaves the
    layer as SGLang's own path does;
(c) what is not proven for SGLang is refused in one line.

Where releases.py leaves the installed release out of an output's list (ModelOpt FP8 on
TRT-LLM before 0.5.23, whose model classes run Triton there), the same tests show its own
processing running another runner or holding other bytes, and the plugin refusing the layer.
"""

from __future__ import annotations

import json
from importlib import metadata

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert, load_moe_layer
from fi_convert.servers.sglang import checks, releases
from fi_convert.servers.sglang.checks import PluginError
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests import sglang_moe as sm
from tests.conftest import cli
from tests.test_sglang_plugin import differing, param_attrs, plugin_layer, state_diff

PREFIX = "backbone.layers.0.mixer.experts"
SPECS = {
    "bf16": Spec("nemotron-h", layers=1, experts=5, hidden=128, intermediate=192, shards=1),
    "fp8-tensor": Spec(
        "nemotron-h", layers=1, experts=5, hidden=128, intermediate=200, shards=1,
        quant="fp8-tensor",
    ),
}  # fmt: skip
RUNS = [(s, b, tp) for s in SPECS for b in ("trtllm", "cutlass") for tp in (1, 2, 4)]
RELEASE = metadata.version("sglang")  # the release whose own code is the authority here


def releases_of(scheme: str, backend: str) -> list[str]:
    """The releases an output of non-gated experts lists: every proven one, but for ModelOpt
    FP8 on TRT-LLM, which SGLang runs on FlashInfer from 0.5.23 on (Triton before)."""
    if (scheme, backend) == ("fp8-tensor", "trtllm"):
        return ["0.5.23"]
    return list(releases.PROVEN)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-nemotron")
    return {s: write_checkpoint(root / s, spec) for s, spec in SPECS.items()}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, sources):
    root = tmp_path_factory.mktemp("sglang-nemotron-out")
    done: dict = {}

    def get(scheme: str, backend: str, tp: int):
        if (scheme, backend, tp) not in done:
            out = root / f"{scheme}-{backend}-{tp}"
            opts = Options(SchemeName(scheme), Backend(backend), tp, server="sglang")
            convert(sources[scheme], out, opts, device="cpu")
            done[scheme, backend, tp] = out
        return done[scheme, backend, tp]

    return get


@pytest.mark.parametrize(("scheme", "backend", "tp"), RUNS)
def test_sglang_output_equals_sglangs_own_non_gated_bytes(scheme, backend, tp, sources, outputs):
    src, out = sources[scheme], outputs(scheme, backend, tp)
    m = json.loads((out / "fi-convert-manifest.json").read_text())
    listed = releases_of(scheme, backend)
    assert m["server"] == "sglang" and m["target"]["sglang_releases"] == listed
    lay = m["layers"][PREFIX]
    assert lay["gated"] is False
    for rank in range(tp):
        layer = sm.build(backend, tp, rank, src, PREFIX)
        assert layer.moe_runner_config.is_gated is False  # SGLang built it non-gated
        theirs, ours = sm.params(layer), load_moe_layer(out, PREFIX, tp_rank=rank)
        if RELEASE not in listed:  # left out: its own runs another runner, or other bytes
            assert checks.runner_of(layer) != sm.BACKEND[backend] or differing(theirs, ours)
            continue
        assert checks.runner_of(layer) == sm.BACKEND[backend]
        assert differing(theirs, ours) == [], (backend, tp, rank)
        rows, spec = lay["padded_intermediate_size_per_rank"], SPECS[scheme]
        assert theirs["w13_weight"].numel() == spec.experts * rows * spec.hidden  # up alone


@pytest.mark.parametrize(
    ("scheme", "backend", "tp"),
    [(s, b, tp) for s in SPECS for b, tp in (("trtllm", 2), ("cutlass", 2), ("trtllm", 4))],
)
def test_the_plugin_path_leaves_the_layer_as_sglangs_own(scheme, backend, tp, sources, outputs):
    src, out = sources[scheme], outputs(scheme, backend, tp)
    m = json.loads((out / "fi-convert-manifest.json").read_text())
    for rank in range(tp):
        theirs = sm.build(backend, tp, rank, src, PREFIX)
        # (the case names tests/test_sglang_plugin.py gives SGLang's CPU stand-ins by)
        ours = plugin_layer(out, src, PREFIX, backend, tp, rank, case=scheme)
        if RELEASE not in releases_of(scheme, backend):  # the plugin refuses the layer there
            with pytest.raises(PluginError, match="runs it on Triton, not FlashInfer TRT-LLM"):
                checks.check_layer(m, str(out), PREFIX, ours)
            continue
        checks.check_layer(m, str(out), PREFIX, ours)
        assert differing(sm.params(theirs), sm.params(ours)) == [], (backend, tp, rank)
        assert state_diff(sm.layer_state(ours), sm.layer_state(theirs)) == []
        assert param_attrs(ours) == param_attrs(theirs)


def test_control_another_ranks_bytes_are_caught(sources, outputs):
    src, out = sources["bf16"], outputs("bf16", "trtllm", 2)
    theirs = sm.build("trtllm", 2, 0, src, PREFIX)
    ours = plugin_layer(out, src, PREFIX, "trtllm", 2, 0, read_rank=1)
    assert "w13_weight" in differing(sm.params(theirs), sm.params(ours))


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp8"])
def test_a_scheme_not_proven_for_sglangs_non_gated_experts_is_one_line(scheme, tmp_path):
    spec = Spec("nemotron-h", layers=1, experts=3, hidden=128, intermediate=256, quant=scheme)
    src = write_checkpoint(tmp_path / "src", spec)
    res = cli("convert", src, tmp_path / "out", "--server", "sglang")
    assert res.exit_code == 1
    assert res.stderr.count("\n") == 1, res.stderr
    assert (
        f"fi-convert has not proven SGLang 0.5.23's {scheme} layout of non-gated (relu2_no_mul) "
        "experts" in res.stderr
    )
    assert "convert with --scheme bf16 or fp8-tensor" in res.stderr


def test_the_layers_are_built_non_gated_only_for_nemotron_h(sources):
    """The control: the same harness builds a gated layer for a gated family."""
    qwen = write_checkpoint(
        sources["bf16"].parent / "qwen",
        Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=128),
    )
    layer = sm.build("trtllm", 1, 0, qwen, "model.layers.0.mlp.experts")
    assert layer.moe_runner_config.is_gated is True
    assert torch.is_tensor(sm.params(layer)["w13_weight"])

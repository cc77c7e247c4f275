"""The load-time proof of an SGLang release an output does not list (fi_convert/servers/proving.py,
servers/sglang/proof.py): SGLang's own FusedMoE for each distinct layer shape, two synthetic
experts, its own weight loader and processing, against fi-convert's layout of the same values.

A newer release is faked (SGLang read as 0.5.24), a layout change planted in SGLang's own
processing (its FP8 TRT-LLM alignment swaps two rows of w2): the plugin refuses naming the
first tensor that differs; without the plant it loads and logs one line. The plant needs the
proof in this process (`proof.OWN_PROCESS`); the plugin's own path, a process of its own, is
proven on the installed release too. Then `verify --server sglang` and every scheme x backend
the plugin serves, proven on the installed SGLang (0.5.23, or 0.5.20-0.5.22 in their venvs) at
small sizes: where releases.py leaves the installed release out of a pair's outputs (NVFP4 on
TRT-LLM before 0.5.23), the proof finds the tensor that differs.
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from unittest import mock

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.cache import CACHE_ENV
from fi_convert.format import manifest as mf
from fi_convert.servers.sglang import checks, proof, releases
from fi_convert.servers.sglang.checks import PluginError
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests import sglang_moe as sm
from tests.conftest import cli
from tests.test_sglang_plugin import registered  # noqa: F401  (a fixture)

SPEC = Spec("deepseek-v3", layers=3, experts=4, hidden=256, intermediate=512, shards=1)
RELEASE = metadata.version("sglang")  # the installed release, which the proof runs on


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """A DeepSeek fp8-block TRT-LLM output for SGLang at TP 2: two MoE layers of one shape."""
    root = tmp_path_factory.mktemp("sglang-proof")
    src = write_checkpoint(root / "src", SPEC)
    opts = Options(SchemeName.FP8_BLOCK, Backend.TRTLLM, 2, server="sglang")
    convert(src, root / "out", opts, device="cpu")
    return root / "out"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def here(monkeypatch):
    """The proof in this process, where a test can change SGLang's code."""
    monkeypatch.setattr(proof, "OWN_PROCESS", False)


@pytest.fixture
def newer(monkeypatch, here):
    monkeypatch.setattr(checks, "sglang_version", lambda: "0.5.24")


@pytest.fixture
def planted(monkeypatch):
    """A layout change in SGLang's own processing: its FP8 MoE method's post-load processing
    ends with the first two rows of every expert's w2 ([E, H, I]) swapped."""
    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.layers.quantization.fp8 import Fp8MoEMethod
    process = Fp8MoEMethod.process_weights_after_loading

    def changed(self, layer):
        process(self, layer)
        w2 = layer.w2_weight.data
        w2.copy_(w2[..., [1, 0, *range(2, w2.shape[-2])], :].clone())

    monkeypatch.setattr(Fp8MoEMethod, "process_weights_after_loading", changed)


def _check_output(out, rank=1, tp=2):
    """The plugin's check at load, in SGLang's parallel context of this rank."""
    with sm.sglang_context("trtllm", tp, rank):
        from fi_convert.servers.sglang import loader

        with (
            mock.patch.dict("os.environ", {loader.TEST_CPU_ENV: "1"}),
            mock.patch.object(loader, "logger") as log,
        ):
            loader.check_output(mf.read(out), str(out))
    return [c.args[0] % c.args[1:] for c in log.info.call_args_list]


def test_a_release_the_output_does_not_list_is_proven_then_loads(out, newer):
    (line,) = _check_output(out)
    assert re.fullmatch(
        r"fi-convert: SGLang 0\.5\.24 is not a release this output lists; its own MoE "
        r"processing proven on the output's 1 layer shape \(rank 1, cpu\) in [\d.]+ s: every "
        r"tensor equals fi-convert's",
        line,
    ), line


def test_a_layout_change_in_a_newer_release_is_refused_naming_the_tensor(out, newer, planted):
    with pytest.raises(PluginError) as e:
        _check_output(out)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"fi-convert: {out}: SGLang 0.5.24 is not a release this output lists")
    assert re.search(
        r"w2_weight of the layer shape fp8-block/trtllm H 256 I 512 TP 2 \(rank 1\) differs "
        r"from the output's, first at index \[0, 0, \d+\] \(\d+ of \d+ elements differ\)",
        msg,
    ), msg
    assert msg.endswith(
        "install an SGLang in 0.5.20, 0.5.21, 0.5.22, 0.5.23, or an fi-convert that lists "
        "SGLang 0.5.24"
    )


def test_a_listed_release_runs_no_proof(out, monkeypatch):
    monkeypatch.setattr(proof, "prove_installed", mock.Mock(side_effect=AssertionError))
    assert _check_output(out) == []


def test_the_other_refusals_come_first(out, newer, monkeypatch):
    monkeypatch.setattr(proof, "prove_installed", mock.Mock(side_effect=AssertionError))
    with pytest.raises(PluginError, match="converted for tensor-parallel size 2, SGLang runs 4"):
        _check_output(out, rank=0, tp=4)


def test_the_launcher_leaves_the_proof_to_the_schedulers(
    registered,  # noqa: F811  (the plugin's fixture)
    out,
    newer,
    monkeypatch,
):
    """SGLang's check_server_args (before any scheduler process starts) does not refuse an
    unlisted release (each scheduler proves it for its rank at load); the rest it still does."""
    monkeypatch.setattr(proof, "prove_installed", mock.Mock(side_effect=AssertionError))
    with sm.sglang_context("trtllm", 2, 0):
        from sglang.srt.server_args import prepare_server_args

        line = f"--model-path {out} --load-format fi-convert --device cpu".split()
        line += ["--moe-runner-backend", "flashinfer_trtllm"]
        ok = prepare_server_args([*line, "--tp", "2"])
        ok.resolve_once()
        ok.check_server_args()
        bad = prepare_server_args([*line, "--tp", "4"])
        bad.resolve_once()
        with pytest.raises(
            PluginError, match="converted for tensor-parallel size 2, SGLang runs 4"
        ):
            bad.check_server_args()


def test_the_plugins_proof_runs_in_a_process_of_its_own(out, cache):
    """The path the plugin takes: SGLang's runtime context is not this process's."""
    got = proof.prove_installed(mf.read(out), ranks=[1])
    assert got.ok and (got.server, got.release, got.device) == ("sglang", RELEASE, "cpu")
    assert [(r.rank, r.tensors, r.result) for r in got.rows] == [(1, 4, "proven")]
    assert len(list((cache / "proofs" / f"sglang-{RELEASE}").glob("*.json"))) == 1
    again = proof.prove_installed(mf.read(out), ranks=[1])
    assert [r.result for r in again.rows] == ["cached"]


def test_a_process_that_fails_is_one_line(out, monkeypatch):
    monkeypatch.setattr(proof, "__name__", "fi_convert.servers.sglang.no_such_module")
    got = proof.prove_installed(mf.read(out), ranks=[0])
    row = got.first_failure()
    assert row is not None and row.result == "cannot run"
    assert row.where.startswith("SGLang's own MoE processing did not run here (")
    assert "No module named" in row.where


def test_verify_server_sglang(out, here, planted):
    res = cli("verify", out, "--server", "sglang", "--rank", "0", "--json")
    assert res.exit_code == 1
    got = json.loads(res.stdout)
    assert (got["release"], got["shapes"][0]["tensor"]) == (RELEASE, "w2_weight")


def test_verify_server_sglang_table(out, here):
    res = cli("verify", out, "--server", "sglang")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["shape", "layers", "rank", "tensors", "result", "seconds"]
    assert [ln.split()[-5:-1] for ln in lines[1:3]] == [
        ["2", "0", "4", "proven"],
        ["2", "1", "4", "proven"],
    ]
    assert lines[3].startswith(
        f"ok: SGLang {RELEASE}'s own MoE processing gives the output's bytes"
    )


# (scheme, backend, source spec): every pair the SGLang plugin loads, at TP 2
PAIRS = [
    ("bf16", "trtllm", Spec("qwen3-moe", layers=1, experts=3, hidden=256, intermediate=384)),
    ("bf16", "cutlass", Spec("mixtral", layers=1, experts=3, hidden=256, intermediate=384)),
    ("fp8-block", "trtllm", Spec("deepseek-v3", layers=2, experts=3, hidden=256, intermediate=512)),
    (
        "fp8-tensor",
        "trtllm",
        Spec("qwen3-moe", layers=1, experts=3, hidden=256, intermediate=384, quant="fp8-tensor"),
    ),
    (
        "fp8-tensor",
        "cutlass",
        Spec("qwen3-moe", layers=1, experts=3, hidden=256, intermediate=384, quant="fp8-tensor"),
    ),
    (
        "mxfp8",
        "trtllm",
        Spec("qwen3-moe", layers=1, experts=3, hidden=256, intermediate=256, quant="mxfp8"),
    ),
    (
        "nvfp4",
        "trtllm",
        Spec("deepseek-v3", layers=2, experts=3, hidden=256, intermediate=384, quant="nvfp4"),
    ),
    (
        "nvfp4",
        "cutlass",
        Spec("deepseek-v3", layers=2, experts=3, hidden=256, intermediate=256, quant="nvfp4"),
    ),
    ("mxfp4", "trtllm", Spec("gpt-oss", layers=1, experts=3, hidden=256, intermediate=192)),
    # SM90: a size whose weight interleave the GPU tests checked (tests/swizzle_shapes.py: the
    # tests' CPU stand-in refuses any other)
    ("mxfp4", "cutlass", Spec("gpt-oss", layers=1, experts=3, hidden=320, intermediate=192)),
]


def test_the_pairs_are_every_one_the_plugin_loads():
    assert {(s, b) for s, b, _ in PAIRS} == set(checks.METHODS)


@pytest.mark.parametrize(
    ("scheme", "backend", "spec"), PAIRS, ids=[f"{s}-{b}" for s, b, _ in PAIRS]
)
def test_every_scheme_and_backend_the_plugin_serves_is_proven_on_the_installed_sglang(
    tmp_path, here, scheme, backend, spec
):
    src = write_checkpoint(tmp_path / "src", spec)
    opts = Options(SchemeName(scheme), Backend(backend), 2, server="sglang")
    convert(src, tmp_path / "out", opts, device="cpu")
    m = mf.read(tmp_path / "out")
    got = proof.prove_installed(m, cache=False)
    if RELEASE not in releases.proven_for(m):  # left out: why, as the docs' table says
        kind, _ = releases.LEFT_OUT[scheme, backend]
        row = got.first_failure()
        if kind == "other bytes":  # its own processing holds other bytes: found
            assert not got.ok and row is not None and row.result == "differs", row
            assert row.tensor in m["layers"][next(iter(m["layers"]))]["tensors"]
        else:  # "not served": the same bytes, another MoE runner (the plugin refuses the layer)
            assert kind == "not served" and got.ok, row
        return
    assert got.ok, got.first_failure()
    assert [r.rank for r in got.rows] == [0, 1]
    (lay,) = m["layers"].values()
    assert {r.tensors for r in got.rows} == {len(lay["tensors"])}
    assert torch.cuda.is_available() or got.device == "cpu"

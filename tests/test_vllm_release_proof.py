"""The load-time proof of a vLLM release an output does not list (fi_convert/servers/proving.py,
servers/vllm/proof.py): vLLM's own MoE layer for each distinct layer shape, two synthetic
experts, its own loading and processing, against fi-convert's layout of the same values.

A newer release is faked (the installed version read as 0.35.0); a layout change in it is
planted in vLLM's own processing (its FP8 block shuffle swaps two rows): the plugin refuses
naming the first tensor that differs; without the plant it loads and logs one line. Then the
cache of passed proofs, `fi-convert verify OUT --server vllm`, and every scheme x backend the
plugin serves proven on the installed vLLM (0.33) at small sizes.
"""

from __future__ import annotations

import json
import re
import types
from unittest import mock

import pytest

from fi_convert.servers.vllm import checks, loader, moe_layer, proof  # isort: skip (vLLM first)
from vllm.config.load import LoadConfig
from vllm.model_executor.layers.quantization.utils import flashinfer_utils
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.cache import CACHE_ENV
from fi_convert.format import manifest as mf
from fi_convert.servers import proving
from fi_convert.servers.vllm.checks import PluginError
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests.conftest import cli, reader_threads

SPEC = Spec("deepseek-v3", layers=3, experts=4, hidden=256, intermediate=512, shards=1)


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """A DeepSeek fp8-block TRT-LLM output at TP 2: two MoE layers of one shape."""
    root = tmp_path_factory.mktemp("proof")
    src = write_checkpoint(root / "src", SPEC)
    convert(src, root / "out", Options(SchemeName.FP8_BLOCK, Backend.TRTLLM, 2), device="cpu")
    return root / "out"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def newer(monkeypatch):
    """vLLM reads as 0.35.0, a release no output lists."""
    monkeypatch.setattr(checks, "vllm_version", lambda: "0.35.0")


@pytest.fixture
def planted(monkeypatch):
    """A layout change in vLLM's own processing: its FP8 block shuffle swaps the first two rows
    of every expert's w2 (the BlockMajorK [E, K/128, M, 128] tensor's M)."""
    shuffle = flashinfer_utils._shuffle_deepseek_fp8_moe_weights

    def changed(w13, w2):
        w13, w2 = shuffle(w13, w2)
        return w13, w2[:, :, [1, 0, *range(2, w2.shape[2])], :].contiguous()

    monkeypatch.setattr(flashinfer_utils, "_shuffle_deepseek_fp8_moe_weights", changed)


def _load_model(out, rank=1, tp=2, build=None):
    """The plugin's `load_model` at TP 2 on this rank, with vLLM's own model building (the
    part after the checks and the proof) recorded, not run (or `build` run in its place)."""
    pc = types.SimpleNamespace(
        tensor_parallel_size=tp,
        enable_expert_parallel=False,
        data_parallel_size=1,
        data_parallel_rank=0,
        enable_eplb=False,
    )
    model_config = types.SimpleNamespace(model=str(out), revision=None, quantization="fp8")
    built = mock.Mock(return_value="model", side_effect=build)
    with (
        mock.patch.object(DefaultModelLoader, "load_model", built),
        mock.patch.object(loader, "_capability", lambda: (10, 0)),
        mock.patch("vllm.distributed.get_tensor_model_parallel_rank", lambda: rank),
        mock.patch.object(loader, "logger") as log,
    ):
        got = loader.FiConvertModelLoader(LoadConfig(load_format="fi-convert")).load_model(
            types.SimpleNamespace(
                parallel_config=pc,
                device_config=types.SimpleNamespace(device="cpu"),
                load_config=LoadConfig(),
            ),
            model_config,
        )
    lines = [c.args[0] % c.args[1:] for c in log.info.call_args_list]
    return got, built, lines


@pytest.mark.parametrize("release", ["0.35.0", "0.33.1", "0.29.0"])
def test_a_release_the_output_does_not_list_is_proven_then_loads(out, monkeypatch, release):
    """Newer, a patch release, older than any proven: all go through the proof."""
    monkeypatch.setattr(checks, "vllm_version", lambda: release)
    got, built, lines = _load_model(out)
    assert got == "model" and built.called
    assert len(lines) == 1
    assert re.fullmatch(
        rf"fi-convert: vLLM {re.escape(release)} is not a release this output lists; its own "
        r"MoE processing proven on the output's 1 layer shape \(rank 1, cpu\) in [\d.]+ s: "
        r"every tensor equals fi-convert's",
        lines[0],
    ), lines[0]


# the releases the fp8-block output lists (servers/vllm/releases.py)
LISTED = "0.30.0, 0.31.0, 0.32.0, 0.33.0, 0.34.0"


def test_a_layout_change_in_a_newer_release_is_refused_naming_the_tensor(out, newer, planted):
    with pytest.raises(PluginError) as e:
        _load_model(out)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"fi-convert: {out}: vLLM 0.35.0 is not a release this output lists")
    # w13 and its scales are as before: w2's first two rows moved
    assert re.search(
        r"w2_weight of the layer shape fp8-block/trtllm H 256 I 512 TP 2 "
        r"\(rank 1\) differs from the output's, first at index \[0, 0, 0, \d+\] \(\d+ of "
        r"\d+ elements differ\)",
        msg,
    ), msg
    assert msg.endswith(f"install a vLLM in {LISTED}, or an fi-convert that lists vLLM 0.35.0")


def test_a_refusal_comes_before_vllm_builds_the_model(out, newer, planted):
    with pytest.raises(PluginError), mock.patch.object(DefaultModelLoader, "load_model") as built:
        _load_model(out)
    assert not built.called


def test_a_release_the_proof_cannot_run_on_is_refused_naming_why(out, newer, monkeypatch):
    """A hook the proof needs is missing in the release (here: vLLM's layer factory)."""

    def gone(*args, **kwargs):
        raise AttributeError("module 'vllm...layer' has no attribute 'FusedMoEFactory'")

    monkeypatch.setattr(moe_layer, "make_layer", gone)
    with pytest.raises(PluginError) as e:
        _load_model(out)
    assert str(e.value) == (
        f"fi-convert: {out}: vLLM 0.35.0 is not a release this output lists ({LISTED}), and "
        "fi-convert cannot prove it here: vLLM 0.35.0's own MoE processing did not run here "
        "(AttributeError: module 'vllm...layer' has no attribute 'FusedMoEFactory'); install a "
        f"vLLM in {LISTED}, or an fi-convert that lists vLLM 0.35.0"
    )


def test_a_listed_release_runs_no_proof(out, monkeypatch):
    monkeypatch.setattr(proof, "prove_installed", mock.Mock(side_effect=AssertionError))
    got, _, lines = _load_model(out)
    assert got == "model" and lines == []


def test_the_other_refusals_come_first(out, newer, monkeypatch):
    """A TP size that does not match is refused as before, without a proof."""
    monkeypatch.setattr(proof, "prove_installed", mock.Mock(side_effect=AssertionError))
    with pytest.raises(PluginError, match="tensor-parallel size 2, vLLM runs 4; pass -tp 2"):
        _load_model(out, rank=0, tp=4)
    with pytest.raises(checks.UnlistedRelease, match="this is vLLM 0.35.0") as e:
        checks.check_manifest(mf.read(out), "OUT", tp_size=2, use_ep=False, vllm_version="0.35.0")
    assert (e.value.release, e.value.listed) == ("0.35.0", LISTED)


def test_the_engine_process_leaves_the_proof_to_the_workers(out, newer, monkeypatch):
    """Before vLLM starts an engine, an unlisted release is not refused (each worker proves it
    for its rank at load); the other checks still refuse there."""
    from vllm.engine.arg_utils import EngineArgs

    from fi_convert.servers.vllm import register

    monkeypatch.setattr(proof, "prove_installed", mock.Mock(side_effect=AssertionError))
    register()
    args = dict(model=str(out), load_format="fi-convert")
    assert EngineArgs(**args, tensor_parallel_size=2).create_model_config()
    with pytest.raises(PluginError, match="tensor-parallel size 2, vLLM runs 4"):
        EngineArgs(**args, tensor_parallel_size=4).create_model_config()


def test_a_layer_this_fi_convert_lays_out_otherwise_is_not_proven(out):
    """The proof compares the output's own description of a layer with this fi-convert's:
    an output written by another fi-convert, whose layout this one does not write, is not
    proven (so not loaded on a release it does not list)."""
    m = mf.read(out)
    for lay in m["layers"].values():
        lay["tensors"]["w2_weight"]["epilogue_tile_m"] = 128
    got = proof.prove_installed(m, ranks=[0], cache=False)
    assert (got.rows[0].result, got.rows[0].where) == (
        "cannot run",
        "this fi-convert lays the layer out otherwise than the output's manifest says "
        "(converted by another fi-convert version?)",
    )


def test_a_layer_this_fi_convert_no_longer_converts_is_one_line(out, monkeypatch):
    from fi_convert.errors import LayoutError

    monkeypatch.setattr(proving, "_convert", mock.Mock(side_effect=LayoutError("no rule")))
    row = proof.prove_installed(mf.read(out), ranks=[0], cache=False).rows[0]
    assert (row.result, row.where) == ("cannot run", "fi-convert's conversion of it: no rule")


# ---------------------------------------------------------------- the cache


def test_a_passed_proof_is_cached_per_release_and_layout(out, newer, cache):
    first = proof.prove_installed(mf.read(out))
    assert [r.result for r in first.rows] == ["proven", "proven"]  # ranks 0 and 1
    files = sorted((cache / "proofs" / "vllm-0.35.0").glob("*.json"))
    assert len(files) == 2
    again = proof.prove_installed(mf.read(out))
    assert [r.result for r in again.rows] == ["cached", "cached"]
    assert [r.tensors for r in again.rows] == [4, 4]


def test_a_failed_proof_is_not_cached(out, newer, planted, cache):
    assert not proof.prove_installed(mf.read(out), ranks=[0]).ok
    assert not list(cache.glob("proofs/*/*.json"))


@pytest.mark.parametrize(
    "damage",
    [
        lambda rec: "not json",
        lambda rec: json.dumps({**rec, "result": "differs"}),
        lambda rec: json.dumps({**rec, "key": {**rec["key"], "rank": 1}}),
        lambda rec: json.dumps({**rec, "tensors": "4"}),
    ],
)
def test_a_damaged_cache_entry_is_not_trusted(out, newer, cache, damage):
    proof.prove_installed(mf.read(out), ranks=[0])
    (entry,) = (cache / "proofs" / "vllm-0.35.0").glob("*.json")
    entry.write_text(damage(json.loads(entry.read_text())))
    assert proof.prove_installed(mf.read(out), ranks=[0]).rows[0].result == "proven"
    assert json.loads(entry.read_text())["result"] == "proven"  # written again, whole


def test_a_cache_entry_of_another_fi_convert_is_not_used(out, newer, monkeypatch):
    proof.prove_installed(mf.read(out), ranks=[0])
    monkeypatch.setattr(proving, "__version__", "0.2.0")
    assert proof.prove_installed(mf.read(out), ranks=[0]).rows[0].result == "proven"


def test_a_cache_that_cannot_be_written_is_skipped(out, newer, tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocked))
    assert proof.prove_installed(mf.read(out), ranks=[0]).ok


# ---------------------------------------------------------------- fi-convert verify --server


def test_verify_server_prints_a_table_and_exits_0(out):
    res = cli("verify", out, "--server", "vllm")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["shape", "layers", "rank", "tensors", "result", "seconds"]
    for rank, line in enumerate(lines[1:3]):
        assert re.fullmatch(
            rf"fp8-block/trtllm H 256 I 512 TP 2\s+2\s+{rank}\s+4\s+proven\s+"
            r"[\d.]+\s*",
            line,
        ), line
    assert re.fullmatch(
        r"ok: vLLM 0\.33\.0's own MoE processing gives the output's bytes on 2 shape x rank "
        r"proofs \(cpu, [\d.]+ s\)",
        lines[3],
    )
    cached = cli("verify", out, "--server", "vllm", "--rank", "1")
    assert cached.exit_code == 0 and " cached " in cached.stdout.splitlines()[1]


def test_verify_server_json(out):
    res = cli("verify", out, "--server", "vllm", "--json", "--no-cache", "--rank", "0")
    assert res.exit_code == 0
    got = json.loads(res.stdout)
    assert (got["server"], got["release"], got["device"], got["ok"]) == (
        "vllm",
        "0.33.0",
        "cpu",
        True,
    )
    (row,) = got["shapes"]
    assert (row["rank"], row["tensors"], row["result"], row["tensor"]) == (0, 4, "proven", None)


def test_verify_server_exits_1_naming_the_first_tensor_that_differs(out, planted):
    res = cli("verify", out, "--server", "vllm", "--json", "--rank", "0")
    assert res.exit_code == 1
    got = json.loads(res.stdout)
    assert not got["ok"] and got["shapes"][0]["tensor"] == "w2_weight"
    res = cli("verify", out, "--server", "vllm", "--rank", "0")
    assert res.exit_code == 1
    assert " differs " in res.stdout.splitlines()[1]
    assert re.fullmatch(
        r"mismatch: vLLM 0\.33\.0 on fp8-block/trtllm H 256 I 512 TP 2 \(rank "
        r"0\): w2_weight differs, first at index \[0, 0, 0, \d+\] \(\d+ of \d+ elements "
        r"differ\)\n",
        res.stderr,
    ), res.stderr


def test_verify_server_not_installed_is_one_line(out, monkeypatch):
    real = proving.importlib.util.find_spec
    monkeypatch.setattr(
        proving.importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a)
    )
    res = cli("verify", out, "--server", "vllm")
    assert res.exit_code == 1
    assert res.stderr == (
        "error: vLLM is not installed here, so no release of it can be proven; install it "
        "beside fi-convert (pip install vllm) or run this where it serves\n"
    )


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("--server", "sglang"), 1, "converted for vllm, whose layouts differ from SGLang's"),
        (("--server", "vllm", "--rank", "2"), 1, "which has no rank 2; pass --rank 0 to 1"),
        (("--server", "trt"), 2, "vllm or sglang"),
        (("--server", "vllm", "--source", "x"), 2, "--source goes without it"),
        (("--rank", "0"), 2, "--rank goes with --server"),
    ],
)
def test_verify_server_usage(out, args, code, words):
    res = cli("verify", out, *args)
    assert res.exit_code == code
    assert words in " ".join(res.stderr.split())


# ---------------------------------------------------------------- every scheme x backend

# (scheme, source spec) at sizes the plugin serves on both backends where it has both;
# I 384 at TP 2 pads I/TP 192 on TRT-LLM (bf16 to 256, fp8-tensor to 208)
SOURCES = {
    "bf16": Spec("qwen3-moe", layers=1, experts=3, hidden=256, intermediate=384),
    "fp8-block": Spec("deepseek-v3", layers=2, experts=3, hidden=256, intermediate=512),
    "fp8-tensor": Spec(
        "qwen3-moe", layers=1, experts=3, hidden=256, intermediate=384, quant="fp8-tensor"
    ),
    "mxfp8": Spec("qwen3-moe", layers=1, experts=3, hidden=256, intermediate=256, quant="mxfp8"),
    "nvfp4": Spec("deepseek-v3", layers=2, experts=3, hidden=256, intermediate=256, quant="nvfp4"),
    "mxfp4": Spec("gpt-oss", layers=1, experts=3, hidden=256, intermediate=192),
}


@pytest.mark.parametrize(("scheme", "backend"), sorted(checks.SUPPORTED))
def test_every_scheme_and_backend_the_plugin_serves_is_proven_on_the_installed_vllm(
    tmp_path, scheme, backend
):
    src = write_checkpoint(tmp_path / "src", SOURCES[scheme])
    convert(src, tmp_path / "out", Options(SchemeName(scheme), Backend(backend), 2), device="cpu")
    m = mf.read(tmp_path / "out")
    got = proof.prove_installed(m, cache=False)
    assert got.ok, got.first_failure()
    assert [r.rank for r in got.rows] == [0, 1]
    (lay,) = m["layers"].values()
    assert {r.tensors for r in got.rows} == {len(lay["tensors"])}


def test_an_output_fi_convert_quantized_from_bf16_is_proven(tmp_path):
    """The proof's source is a checkpoint of the output's scheme (ModelOpt MXFP8); an output
    fi-convert quantized from BF16 (`fi-convert model-dir out-dir --scheme mxfp8`: its manifest
    says so, `source_format`) is laid out as one, and proven."""
    spec = Spec("qwen3-moe", layers=1, experts=3, hidden=256, intermediate=256, shards=1)
    src = write_checkpoint(tmp_path / "src", spec)
    convert(src, tmp_path / "out", Options(SchemeName.MXFP8, Backend.TRTLLM, 1), device="cpu")
    m = mf.read(tmp_path / "out")
    (lay,) = m["layers"].values()
    assert lay["source_format"].startswith("bf16, quantized")
    got = proof.prove_installed(m, cache=False)
    assert got.ok, got.first_failure()


NEMOTRON = {  # non-gated experts (relu2_no_mul): w13 the up projection alone
    "bf16": Spec("nemotron-h", layers=1, experts=3, hidden=128, intermediate=192, shards=1),
    "fp8-tensor": Spec(
        "nemotron-h", layers=1, experts=3, hidden=128, intermediate=192, shards=1,
        quant="fp8-tensor",
    ),
    "nvfp4": Spec(
        "nemotron-h", layers=1, experts=3, hidden=256, intermediate=256, shards=1, quant="nvfp4",
    ),
    "mxfp8": Spec(
        "nemotron-h", layers=1, experts=3, hidden=256, intermediate=256, shards=1, quant="mxfp8",
    ),
    "fp8-block": Spec(
        "nemotron-h", layers=1, experts=4, hidden=256, intermediate=256, shards=1,
        quant="fp8-block",
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("scheme", "backend"),
    [
        (s, b)
        for s in sorted(NEMOTRON)
        for b in ("trtllm", "cutlass")
        if (s, b) != ("mxfp8", "cutlass")
    ],
)
def test_a_non_gated_output_is_proven_on_the_installed_vllm(tmp_path, scheme, backend):
    """A Nemotron-H output: the load-time proof of a release it does not list builds vLLM's own
    non-gated layer (relu2_no_mul) for it, and the installed release holds its bytes."""
    src = write_checkpoint(tmp_path / "src", NEMOTRON[scheme])
    convert(src, tmp_path / "out", Options(SchemeName(scheme), Backend(backend), 2), device="cpu")
    m = mf.read(tmp_path / "out")
    (lay,) = m["layers"].values()
    assert lay["gated"] is False and lay["tensors"]["w13_weight"]["row_order"] == "up"
    got = proof.prove_installed(m, cache=False)
    assert got.ok, got.first_failure()
    assert [r.rank for r in got.rows] == [0, 1]
    assert {r.tensors for r in got.rows} == {len(lay["tensors"])}


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("scheme", "backend"),
    [
        ("nvfp4", "trtllm"),
        ("nvfp4", "cutlass"),
        ("mxfp8", "trtllm"),
        ("mxfp4", "trtllm"),
        ("mxfp4", "cutlass"),
    ],
)
def test_on_a_gpu_the_proof_runs_flashinfers_own_swizzles(tmp_path, scheme, backend):
    """Where CUDA is there, vLLM's processing calls FlashInfer's CUDA-only swizzles themselves
    (no CPU stand-in is installed), with the layer on the GPU."""
    src = write_checkpoint(tmp_path / "src", SOURCES[scheme])
    convert(src, tmp_path / "out", Options(SchemeName(scheme), Backend(backend), 2), device="cpu")
    got = proof.prove_installed(mf.read(tmp_path / "out"), cache=False)
    assert got.device == "cuda"
    assert got.ok, got.first_failure()


def test_distinct_layer_shapes_are_proven_once_each():
    """Layers of one shape are one proof; another size, a SwiGLU clamp or a layout is another."""
    m = {
        "scheme": "nvfp4",
        "backend": "trtllm",
        "tp_size": 1,
        "source": {"model_type": "deepseek_v3"},
        "layers": {},
    }
    lay = {
        "hidden_size": 256,
        "intermediate_size": 256,
        "num_experts": 8,
        "tensors": {"w13_weight": {"shape_per_rank": [8, 256, 128], "dtype": "U8"}},
    }
    m["layers"]["a"] = lay
    m["layers"]["b"] = {
        **lay,
        "num_experts": 16,
        "tensors": {"w13_weight": {"shape_per_rank": [16, 256, 128], "dtype": "U8"}},
    }
    m["layers"]["c"] = {**lay, "swiglu_limit": 10.0}
    m["layers"]["d"] = {**lay, "intermediate_size": 512}
    got = proving.shapes(m)
    assert [s.layers for s in got] == [("a", "b"), ("c",), ("d",)]
    assert got[1].config == (("swiglu_limit", 10.0),)
    assert got[0].family == "deepseek-v3"


def test_a_refusal_names_the_releases_the_output_lists():
    """From the plugin's UnlistedRelease where it carries them, else from the manifest: its
    list of releases (`target.vllm_releases`) or, as older outputs hold, its range."""
    old = {"server": "vllm", "target": {"vllm_versions": "==0.33.0"}}
    new = {"server": "vllm", "target": {"vllm_releases": ["0.30.0", "0.34.0"]}}
    assert proof.listed_releases(old) == "==0.33.0"
    assert proof.listed_releases(new) == "0.30.0, 0.34.0"


@pytest.mark.parametrize("fault", [RuntimeError("the model's build failed"), KeyboardInterrupt])
def test_a_build_that_fails_stops_the_readers_started_for_it(out, fault):
    """`load_model` starts the reader threads before vLLM builds the model
    (`whole_read.Ahead`): a build that fails, or is interrupted, leaves none running."""
    seen = []

    def build(*args):
        seen.append(len(reader_threads()))
        raise fault

    with pytest.raises(type(fault) if isinstance(fault, BaseException) else fault):
        _load_model(out, build=build)
    assert seen and seen[0] > 0  # started ahead of the build
    assert not reader_threads()


def test_a_read_setting_that_is_wrong_is_one_line_before_the_build(out, monkeypatch):
    """`FI_CONVERT_READ_THREADS` is read as the load sets up its readers, before vLLM builds
    the model: a wrong one is the plugin's one line, and nothing is built or left running."""
    monkeypatch.setenv("FI_CONVERT_READ_THREADS", "many")
    built = []
    with pytest.raises(PluginError) as e:
        _load_model(out, build=lambda *a: built.append(1))
    assert str(e.value) == (
        "fi-convert: FI_CONVERT_READ_THREADS='many': not a thread count; give 1 to 128"
    )
    assert not built
    assert not reader_threads()

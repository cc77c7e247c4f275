"""fi_convert/servers/vllm/: the vLLM plugin: its refusals (each one line, naming the fix),
its entry point, and its loader on a model holding vLLM 0.33's own MoE layer, processed by
vLLM's own post-load driver."""

from __future__ import annotations

import copy
import json
import re
import types
from importlib import metadata
from pathlib import Path

import pytest
import torch
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader import get_model_loader

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.servers.vllm import checks, register
from fi_convert.servers.vllm.checks import PluginError
from fi_convert.servers.vllm.loader import FiConvertModelLoader
from fi_convert.servers.vllm.target import MXFP8_ACTIVATION
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests import vllm_moe as vm
from tests.conftest import files_open, reader_threads

PREFIX = "model.layers.1.mlp.experts"
SPEC = Spec("deepseek-v3", layers=2, experts=8, hidden=256, intermediate=256, shards=2)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("plugin-src") / "ds", SPEC)


@pytest.fixture(scope="module")
def out(tmp_path_factory, src):
    out = tmp_path_factory.mktemp("plugin-out") / "ds-fi"
    convert(src, out, Options(SchemeName.FP8_BLOCK, Backend.TRTLLM, 2), device="cpu")
    return out


@pytest.fixture
def manifest(out):
    return json.loads((out / "fi-convert-manifest.json").read_text())


def _check(m, **kw):
    args = dict(
        tp_size=2,
        use_ep=False,
        vllm_version="0.33.0",
        flashinfer_version="0.7.2.post1",
        capability=(10, 0),
    )
    checks.check_output(m, "OUT", **(args | kw))


def test_vllms_parameter_types_hand_each_call_on_to_torch():
    """Asking a model where its tensors go watches each call on a tensor type with a
    __torch_function__ of its own at torch's operators (it could write): vLLM's parameter types
    (its linear layers' weights) only hand each call on, and are let through as torch's own
    (a fifth of the asking on its Qwen3-MoE class: `scripts/bench_probe.py --vllm`). A release
    whose types do more is watched, and this fails to say the asking got slower."""
    from vllm.model_executor import parameter as vp

    from fi_convert.format.probe import _plain

    kinds = [
        t for t in vars(vp).values() if isinstance(t, type) and issubclass(t, vp.BasevLLMParameter)
    ]
    assert len(kinds) >= 5 and all(_plain(t) for t in kinds), [t for t in kinds if not _plain(t)]


def test_a_matching_runtime_passes(manifest):
    _check(manifest)  # the control: every refusal below changes one fact


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (dict(tp_size=4), "tensor-parallel size 2, vLLM runs 4; pass -tp 2"),
        (
            dict(use_ep=True),
            "under expert parallelism each rank holds whole experts: convert "
            "again with --tp-size 1",
        ),
        (dict(tp_size=2, dp_size=2), "-tp 2 x data-parallel 2): convert again with --tp-size 4"),
        (dict(vllm_version="0.33.1"), "this is vLLM 0.33.1"),
        (dict(vllm_version="0.29.0"), "install one of those (pip install vllm==0.34.0)"),
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


def test_cutlass_block_fp8_runs_on_sm90_only(manifest):
    m = manifest | {"backend": "cutlass", "target": manifest["target"] | {"gpu_family": "sm90"}}
    _check(m, capability=(9, 0))
    with pytest.raises(PluginError, match="need an SM90 .Hopper. GPU"):
        _check(m, capability=(10, 0))


def test_the_old_pin_is_not_what_the_plugin_judges_by(manifest):
    """`vllm_versions` is for plugins that read no `vllm_releases` (tests/test_vllm_releases.py
    has the list's cases): this plugin serves the output on every release proven for it."""
    m = copy.deepcopy(manifest)
    m["target"]["vllm_versions"] = "0.33 or so"
    for version in ("0.30.0", "0.34.0"):
        _check(m, vllm_version=version)


def test_the_plugin_loads_every_scheme_and_backend_fi_convert_writes():
    from fi_convert.schemes import REGISTRY

    written = {(s.name.value, b.value) for s in REGISTRY.values() for b in s.backends}
    assert written == checks.SUPPORTED


def test_a_scheme_and_backend_the_plugin_does_not_know_is_refused(manifest):
    with pytest.raises(PluginError, match="does not load mxfp8/cutlass outputs yet"):
        _check(manifest | {"scheme": "mxfp8", "backend": "cutlass"})


def test_mxfp4_cutlass_needs_vllms_mxfp8_activation_path(manifest):
    m = manifest | {"scheme": "mxfp4", "backend": "cutlass"}
    prefix = "model.layers.0.mlp.experts"
    bf16 = type("GptOssMxfp4MoEMethod", (), {"mxfp4_backend": "FLASHINFER_CUTLASS_MXFP4_BF16"})()
    with pytest.raises(
        PluginError,
        match=re.escape("pass --moe-backend flashinfer_cutlass " + MXFP8_ACTIVATION),
    ):
        checks.check_layer(m, "OUT", prefix, bf16)
    mx = type("GptOssMxfp4MoEMethod", (), {"mxfp4_backend": "FLASHINFER_CUTLASS_MXFP4_MXFP8"})()
    checks.check_layer(m, "OUT", prefix, mx)


def _fp8_tensor(manifest, activation_scheme):
    layers = {
        k: v | {"activation_scheme": activation_scheme} for k, v in manifest["layers"].items()
    }
    return manifest | {"scheme": "fp8-tensor", "layers": layers}


def test_fp8_tensor_without_static_activation_scales_is_refused(manifest):
    _check(_fp8_tensor(manifest, "static"))
    with pytest.raises(PluginError, match="no static activation scales .* need them"):
        _check(_fp8_tensor(manifest, "dynamic"))


def test_expert_parallelism_takes_a_tp1_output_of_the_schemes_proven_for_it(manifest):
    tp1 = manifest | {"tp_size": 1}
    for tp in (1, 2, 8):  # one --tp-size 1 output serves every EP size
        _check(tp1, tp_size=tp, use_ep=True)
    _check(manifest, tp_size=1, dp_size=2)  # TP 1 x DP 2 without EP: the MoE runs at TP 2
    with pytest.raises(PluginError, match="does not load redundant experts .EPLB.; start vLLM "):
        _check(tp1, use_ep=True, eplb=True)
    for scheme in ("fp8-tensor", "nvfp4", "mxfp8", "mxfp4"):
        m = _fp8_tensor(tp1, "static") | {"scheme": scheme}
        with pytest.raises(PluginError) as e:
            _check(m, use_ep=True)
        msg = str(e.value)
        assert f"does not load {scheme} experts under expert parallelism yet" in msg, msg
        assert "only bf16 and fp8-block; start vLLM without --enable-expert-parallel" in msg
        _check(m | {"tp_size": 2})  # the same output without EP: the refusal is EP's


def test_the_split_vllm_built_is_checked_against_the_output(manifest):
    """The layer's own MoE parallel config is the authority, whatever the flags said."""
    split = types.SimpleNamespace
    tp2 = split(use_ep=False, tp_size=2, enable_eplb=False)
    ep = split(use_ep=True, tp_size=1, enable_eplb=False)
    checks.check_split(manifest, "OUT", PREFIX, tp2, 8)
    with pytest.raises(PluginError, match="over 4 ranks; convert again with --tp-size 4"):
        checks.check_split(manifest, "OUT", PREFIX, split(use_ep=False, tp_size=4), 8)
    with pytest.raises(PluginError, match="convert again with --tp-size 1"):
        checks.check_split(manifest, "OUT", PREFIX, ep, 8)
    tp1 = manifest | {"tp_size": 1}
    checks.check_split(tp1, "OUT", PREFIX, ep, 8)
    # a model with more experts than the output: under EP its ranks would read other experts
    for parallel in (tp2, ep):
        with pytest.raises(PluginError, match="8 experts in the output and 16 in the model vLLM"):
            checks.check_split(
                manifest | {"tp_size": 2 - parallel.use_ep}, "OUT", PREFIX, parallel, 16
            )


@pytest.mark.parametrize(
    ("scheme", "method"), [(s, m) for s, ms in checks.NOT_YET.items() for m in ms]
)
def test_layers_of_vllm_methods_the_plugin_does_not_set_up_are_refused(manifest, scheme, method):
    m = _fp8_tensor(manifest, "static") | {"scheme": scheme}
    attrs = {"fp8_backend": "FLASHINFER_TRTLLM", "nvfp4_backend": "FLASHINFER_TRTLLM"}
    with pytest.raises(PluginError, match=f"vLLM built {method} .* does not run yet"):
        checks.check_layer(m, "OUT", "model.layers.0.mlp.experts", type(method, (), attrs)())
    ok = type(checks.METHODS[scheme][0], (), attrs)()
    checks.check_layer(m, "OUT", "model.layers.0.mlp.experts", ok)


def _loader():
    return FiConvertModelLoader(LoadConfig(load_format="fi-convert"))


def _model_config(path, hf_config=None):
    return types.SimpleNamespace(
        model=str(path), revision=None, quantization="fp8", hf_config=hf_config
    )


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (None, "no manifest"),
        ({"format_version": 99}, "format version 99"),
        ({"format": "other"}, "not an fi-convert manifest"),
    ],
)
def test_unfinished_or_foreign_outputs_are_refused(tmp_path, out, edit, words):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    path = bad / "fi-convert-manifest.json"
    if edit is None:
        path.unlink()
    else:
        path.write_text(json.dumps(json.loads(path.read_text()) | edit))
    with pytest.raises(PluginError) as e:
        _loader().download_model(_model_config(bad))
    assert str(e.value).startswith("fi-convert: ") and words in str(e.value)


def test_entry_point_registers_the_load_format():
    eps = metadata.entry_points(group="vllm.general_plugins")
    ep = next(e for e in eps if e.name == "fi_convert")
    assert ep.load() is register
    register()
    assert isinstance(get_model_loader(LoadConfig(load_format="fi-convert")), FiConvertModelLoader)


class TinyModel(torch.nn.Module):
    """A model with one vLLM MoE layer; the rest of its tensors are taken by name."""

    def __init__(self, experts: torch.nn.Module) -> None:
        super().__init__()
        self.seen: dict[str, torch.Tensor] = {}
        self.add_module("moe", experts)

    def load_weights(self, weights):
        for name, t in weights:
            self.seen[name] = t
        return set()


@pytest.mark.parametrize("rank", [0, 1])
def test_loader_puts_experts_in_and_processes_only_the_kernel(src, out, rank):
    with vm.vllm_context("trtllm", 2, rank):
        theirs = vm.make_layer(PREFIX, src, 2)
        vm.vllm_load_and_process(theirs, src, PREFIX)
    with vm.vllm_context("trtllm", 2, rank):
        model = TinyModel(vm.make_layer(PREFIX, src, 2))
        _loader().load_weights(model, _model_config(out))
        vm.process(model)  # vLLM's own driver: our layer's setup replaces its processing
    ours = model.moe
    vm.assert_same_layer(theirs, ours)  # parameters, MoE sizes, kernel and its state
    assert "process_weights_after_loading" not in vars(ours.quant_method)  # vLLM's again
    # the non-expert tensors went to the model, byte for byte; no expert tensor did
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    dense = {n for n in index if not n.startswith(PREFIX + ".")}
    assert set(model.seen) == dense
    from safetensors import safe_open

    shard = index["model.embed_tokens.weight"]
    with safe_open(out / shard, framework="pt") as f:
        assert torch.equal(
            model.seen["model.embed_tokens.weight"], f.get_tensor("model.embed_tokens.weight")
        )


@pytest.fixture(scope="module")
def out_tp1(tmp_path_factory, src):
    out = tmp_path_factory.mktemp("plugin-out-tp1") / "ds-fi"
    convert(src, out, Options(SchemeName.FP8_BLOCK, Backend.TRTLLM, 1), device="cpu")
    return out


@pytest.mark.parametrize(("ep", "rank"), [(2, 0), (2, 1), (4, 3)])
def test_loader_under_expert_parallelism_loads_the_ranks_experts(src, out_tp1, ep, rank):
    from unittest import mock

    from fi_convert.servers.vllm import loader

    with vm.vllm_context("trtllm", ep, rank, ep="linear"):
        theirs = vm.make_layer(PREFIX, src, ep)
        vm.vllm_load_and_process(theirs, src, PREFIX)
    with vm.vllm_context("trtllm", ep, rank, ep="linear"):
        model = TinyModel(vm.make_layer(PREFIX, src, ep))
        with mock.patch.object(loader, "logger") as log:
            _loader().load_weights(model, _model_config(out_tp1))
        vm.process(model)
    ours = model.moe
    assert ours.local_num_experts == 8 // ep
    vm.assert_same_layer(theirs, ours)  # parameters, MoE sizes, kernel and its state
    said = log.info.call_args.args
    line = said[0] % said[1:]
    # one line per rank at the end: who, the whole load's bytes, time and speed, and how it
    # splits (the experts' and the non-expert bytes read at once, the model's load_weights then
    # with the tensors it takes with their data, asking the model, kernel setup)
    assert re.fullmatch(
        rf"fi-convert: EP rank {rank}/{ep} loaded [\d.]+ MB in [\d.]+ s \([\d.]+ GB/s\): "
        r"prepared in [\d.]+ s \(the experts' parameters, the read's plan\), "
        r"the experts of 1 MoE layers \(([\d.]+) MB\) and non-expert tensors \([\d.]+ MB\) "
        r"read at once in [\d.]+ s \(\d+ threads, \d+ MiB pinned\), then the model's "
        r"load_weights in [\d.]+ s \(non-expert [\d.]+ MB with their data, \d+ tensors\); the "
        r"model asked where in [\d.]+ s(?: \((?:not )?kept for the next load.*\))?, kernel "
        r"setup [\d.]+ s; "
        rf"from {re.escape(str(out_tp1))}",
        line,
    ), line
    moe = sum(p.numel() * p.element_size() for p in ours.parameters(recurse=False))
    assert f"the experts of 1 MoE layers ({moe / 1e6:.1f} MB)" in line


def test_loader_refuses_a_layer_on_another_backend(src, out):
    with vm.vllm_context("cutlass", 2, 0, sm=90):
        model = TinyModel(vm.make_layer(PREFIX, src, 2))
        with pytest.raises(PluginError) as e:
            _loader().load_weights(model, _model_config(out))
    msg = str(e.value)
    assert f"layer {PREFIX}: vLLM selected the FLASHINFER_CUTLASS MoE backend" in msg
    assert msg.endswith("pass --moe-backend flashinfer_trtllm")


def test_loader_refuses_a_quant_method_of_another_scheme(src, out, tmp_path):
    with vm.vllm_context("trtllm", 2, 0):
        model = TinyModel(vm.make_layer(PREFIX, src, 2, unquantized=True))
        with pytest.raises(PluginError, match="vLLM built UnquantizedFusedMoEMethod for it"):
            _loader().load_weights(model, _model_config(out))


def test_loader_refuses_a_model_without_the_outputs_layers(src, out):
    with vm.vllm_context("trtllm", 2, 0):
        model = TinyModel(vm.make_layer("model.layers.7.mlp.experts", src, 2))
        with pytest.raises(PluginError, match="has no MoE layer model.layers.1.mlp.experts"):
            _loader().load_weights(model, _model_config(out))


def test_the_mtp_layer_vllm_does_not_build_is_left_to_its_draft_model(tmp_path):
    """A DeepSeek-V3/R1 checkpoint ships its multi-token-prediction layer after the decoder
    layers (model.layers.61 of 61, config `num_nextn_predict_layers` 1): fi-convert converts
    it, and vLLM's model builds no layer for it (its own rule, a draft model's). The plugin
    loads the layers vLLM built and hands that layer's other tensors to the model's
    `load_weights` as vLLM's default load does (vLLM's skips them); without the config's
    `num_nextn_predict_layers` the missing layer is refused."""
    import types

    spec = Spec("deepseek-v3", layers=3, experts=4, hidden=256, intermediate=256)
    src = write_checkpoint(tmp_path / "src", spec)
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.FP8_BLOCK, Backend.TRTLLM, 1), device="cpu")
    mtp = "model.layers.2.mlp.experts"
    assert mtp in json.loads((out / "fi-convert-manifest.json").read_text())["layers"]
    served = types.SimpleNamespace(num_hidden_layers=2, num_nextn_predict_layers=1)
    with vm.vllm_context("trtllm", 1, 0):
        theirs = vm.make_layer(PREFIX, src, 1)
        vm.vllm_load_and_process(theirs, src, PREFIX)
    with vm.vllm_context("trtllm", 1, 0):
        model = TinyModel(vm.make_layer(PREFIX, src, 1))
        _loader().load_weights(model, _model_config(out, hf_config=served))
        vm.process(model)
    vm.assert_same_layer(theirs, model.moe)
    assert not [n for n in model.seen if n.startswith(mtp + ".")]  # its experts: not read
    assert "model.layers.2.mlp.gate.weight" in model.seen  # the rest: the model's to skip
    plain = types.SimpleNamespace(num_hidden_layers=2)
    with vm.vllm_context("trtllm", 1, 0):
        model = TinyModel(vm.make_layer(PREFIX, src, 1))
        with pytest.raises(PluginError, match=f"has no MoE layer {mtp} of the output"):
            _loader().load_weights(model, _model_config(out, hf_config=plain))


def _engine_model_config(path, **kw):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(path), **kw).create_model_config()


def test_stock_vllm_refuses_an_output_loudly(out):
    """Without --load-format fi-convert, vLLM must not build the source's model over FlashInfer
    layouts (it would serve uninitialized experts): the output's config names a quantization
    method that stock vLLM does not know."""
    with pytest.raises(Exception, match="Unknown quantization method: fi-convert"):
        _engine_model_config(out)


@pytest.mark.parametrize(
    "spec",
    [
        SPEC,  # fp8-block: config.json's quantization_config
        Spec("qwen3-moe", layers=1, experts=4, hidden=128, intermediate=128, shards=1),  # none
        Spec("qwen3-moe", layers=1, experts=3, hidden=256, intermediate=256, quant="nvfp4"),
    ],
    ids=["fp8-block", "bf16", "modelopt-nvfp4"],
)
def test_with_the_plugin_vllm_sees_the_sources_quantization(tmp_path, spec):
    src = write_checkpoint(tmp_path / "src", spec)
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.AUTO, Backend.TRTLLM, 1), device="cpu")
    register()
    got = _engine_model_config(out, load_format="fi-convert")
    want = _engine_model_config(src)
    assert got.quantization == want.quantization
    assert getattr(got.hf_config, "quantization_config", None) == getattr(
        want.hf_config, "quantization_config", None
    )
    import pickle  # vLLM pickles its config into the engine process

    pickle.loads(pickle.dumps(got.hf_overrides))(got.hf_config)
    # the user's own overrides still apply
    got = _engine_model_config(out, load_format="fi-convert", hf_overrides={"num_hidden_layers": 1})
    assert got.hf_config.num_hidden_layers == 1 and got.quantization == want.quantization


def test_the_marked_config_stays_valid_for_other_readers(out, src):
    from transformers import AutoConfig

    theirs = json.loads((src / "config.json").read_text())
    ours = json.loads((out / "config.json").read_text())
    qc = ours.pop("quantization_config")
    assert qc["quant_method"] == "fi-convert" and "--load-format fi-convert" in qc["note"]
    assert qc["source_quantization_config"] == theirs.pop("quantization_config")
    assert ours == theirs  # nothing else changed
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.model_type == theirs["model_type"]


def test_a_repo_id_that_cannot_be_downloaded_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(PluginError) as e:
        _loader().download_model(_model_config("acme/not-cached-anywhere"))
    msg = str(e.value)
    assert msg.startswith("fi-convert: acme/not-cached-anywhere: no such local folder, and not")
    assert "\n" not in msg and "`hf download acme/not-cached-anywhere` first" in msg


def _publish(hub, out: Path, repo: str) -> str:
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    return hub.add_repo(repo, files | {"README.md": b"# card\n", "notes.bin": b"\x80\x04"})


def test_a_repo_id_loads_as_its_folder(src, out, hub, tmp_path):
    """`vllm serve ORG/REPO --load-format fi-convert --revision R --download-dir D`: the
    output fetched (hub/fetch.py: the manifest, then the files it lists, at R, into D) and
    loaded as from the folder, every parameter and the kernel state."""
    repo = "acme/ds-fi"
    commit = _publish(hub, out, repo)
    hub.add_repo(repo, {"config.json": b"{}"})  # main moves on
    loader = FiConvertModelLoader(
        LoadConfig(load_format="fi-convert", download_dir=str(tmp_path / "dl"))
    )
    mc = types.SimpleNamespace(model=repo, revision=commit, quantization="fp8")
    with vm.vllm_context("trtllm", 2, 1):
        local = TinyModel(vm.make_layer(PREFIX, src, 2))
        _loader().load_weights(local, _model_config(out))
        vm.process(local)
    with vm.vllm_context("trtllm", 2, 1):
        ours = TinyModel(vm.make_layer(PREFIX, src, 2))
        loader.download_model(mc)
        loader.load_weights(ours, mc)
        vm.process(ours)
    vm.assert_same_layer(local.moe, ours.moe)
    assert sorted(ours.seen) == sorted(local.seen)
    assert all(torch.equal(ours.seen[n], t) for n, t in local.seen.items())
    snap = tmp_path / "dl" / "models--acme--ds-fi" / "snapshots" / commit
    got = {f.relative_to(snap).as_posix() for f in snap.rglob("*") if f.is_file()}
    assert got == {
        "fi-convert-manifest.json",
        *json.loads((out / "fi-convert-manifest.json").read_text())["files"],
    }


@pytest.mark.parametrize(
    ("repo", "words"),
    [
        ("acme/nothing-here", "no such model repo on the Hub"),
        ("acme/a-source", "not an fi-convert output (the repo holds no fi-convert-manifest.json)"),
    ],
)
def test_a_repo_id_that_is_not_an_output_is_one_line(src, hub, repo, words):
    _publish(hub, src, "acme/a-source")
    with pytest.raises(PluginError) as e:
        _loader().download_model(_model_config(repo))
    msg = str(e.value)
    assert msg.startswith(f"fi-convert: {repo}: ") and "\n" not in msg and words in msg


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(tensor_parallel_size=4), "tensor-parallel size 2, vLLM runs 4; pass -tp 2"),
        (
            dict(tensor_parallel_size=2, enable_expert_parallel=True),
            "convert again with --tp-size 1",
        ),
        (dict(tensor_parallel_size=2, data_parallel_size=2), "x data-parallel 2.: convert again"),
        (
            dict(tensor_parallel_size=2, enable_expert_parallel=True, enable_eplb=True),
            "does not load redundant experts",
        ),
    ],
)
def test_manifest_refusals_come_before_vllm_starts_an_engine(out, kw, words):
    register()
    with pytest.raises(PluginError, match=words):
        _engine_model_config(out, load_format="fi-convert", **kw)


def test_data_parallel_ranks_count_in_the_moes_tp_size(out):
    """Without EP vLLM splits the MoE over TP x DP ranks: -tp 1 with DP 2 serves a tp 2 output."""
    register()
    assert _engine_model_config(
        out, load_format="fi-convert", tensor_parallel_size=1, data_parallel_size=2
    )


def test_an_unfinished_output_is_refused_before_vllm_starts_an_engine(out, tmp_path):
    import shutil

    bad = tmp_path / "unfinished"
    shutil.copytree(out, bad)
    (bad / "fi-convert-manifest.json").unlink()
    register()
    with pytest.raises(PluginError, match="no manifest"):
        _engine_model_config(bad, load_format="fi-convert", tensor_parallel_size=2)


def test_a_repo_id_is_checked_on_its_manifest_before_vllm_starts_an_engine(out, hub, tmp_path):
    """`vllm serve ORG/REPO`: the manifest alone is fetched (into --download-dir) and checked
    in the process that parses the arguments; the refusal names the repo."""
    _publish(hub, out, "acme/ds-fi")
    register()
    dl = tmp_path / "dl"
    with pytest.raises(PluginError) as e:
        kw = dict(load_format="fi-convert", tensor_parallel_size=4, download_dir=str(dl))
        _engine_model_config("acme/ds-fi", **kw)
    msg = str(e.value)
    assert msg.startswith("fi-convert: acme/ds-fi: ") and "\n" not in msg
    assert "tensor-parallel size 2, vLLM runs 4; pass -tp 2" in msg
    (snap,) = (dl / "models--acme--ds-fi" / "snapshots").iterdir()
    assert [f.name for f in snap.iterdir()] == ["fi-convert-manifest.json"]


def test_the_core_never_imports_vllm():
    import subprocess
    import sys

    code = (
        "import sys, fi_convert, fi_convert.pipeline, fi_convert.format.reader, fi_convert.cli, "
        "fi_convert.verify, fi_convert.hub, fi_convert.servers.vllm, "
        "fi_convert.servers.vllm.checks\n"
        "print('vllm' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_the_gpu_family_comes_from_scheme_and_backend_not_the_manifests_claim(manifest):
    """An nvfp4 output on CUTLASS that an older fi-convert wrote claims `sm90+`; the path
    needs SM10x or SM12x, and the plugin refuses it on an H200 all the same."""
    m = manifest | {
        "scheme": "nvfp4",
        "backend": "cutlass",
        "target": manifest["target"] | {"gpu_family": "sm90+"},
    }
    with pytest.raises(PluginError, match=r"need an SM10x or SM12x .Blackwell. GPU .gpu_family "):
        _check(m, capability=(9, 0))
    _check(m, capability=(10, 0))


def test_an_expert_map_that_is_not_one_slot_per_local_expert_is_refused():
    from fi_convert.servers.vllm.experts import local_experts

    def layer(emap, n):
        mpc = types.SimpleNamespace(use_ep=True)
        return types.SimpleNamespace(
            _expert_map=torch.tensor(emap, dtype=torch.int32),
            local_num_experts=n,
            moe_config=types.SimpleNamespace(moe_parallel_config=mpc),
            layer_name="model.layers.1.mlp.experts",
        )

    assert local_experts(layer([-1, 1, -1, 0], 2)) == [3, 1]  # local slot order, not global
    with pytest.raises(PluginError, match="slots \\[0, 2\\] for 2 local experts .* --enable-eplb"):
        local_experts(layer([0, -1, 2, -1], 2))


# -- faults while reading: one line, threads stopped ----------------------------------------


@pytest.fixture
def out_copy(tmp_path, out):
    import shutil

    return Path(shutil.copytree(out, tmp_path / "ds-fi"))


def _expert_shard(out_dir):
    index = json.loads((out_dir / "model.safetensors.index.json").read_text())["weight_map"]
    return out_dir / index[f"{PREFIX}.w13_weight"]


@pytest.mark.parametrize("when", ["before the load", "after the checks"])
def test_a_shard_truncated_is_one_line_naming_it(src, out_copy, monkeypatch, when):
    from fi_convert import bulk_read

    shard = _expert_shard(out_copy)
    size = shard.stat().st_size

    def cut():
        with open(shard, "r+b") as f:
            f.truncate(size - 4096)

    if when == "before the load":
        cut()
    else:  # the headers were read and checked; the file shrinks before the reads start
        real = bulk_read.BulkRead.start

        def start(self, more=False):
            cut()
            real(self, more)

        monkeypatch.setattr(bulk_read.BulkRead, "start", start)
    with vm.vllm_context("trtllm", 2, 0):
        model = TinyModel(vm.make_layer(PREFIX, src, 2))
        with pytest.raises(PluginError) as e:
            _loader().load_weights(model, _model_config(out_copy))
    msg = str(e.value)
    assert msg.startswith(f"fi-convert: {shard}: ") and "\n" not in msg
    assert "truncated" in msg
    assert not reader_threads()


def test_a_bad_header_opened_while_the_model_is_built_is_one_line_at_the_load(src, out_copy):
    """The output is opened (its headers read) while vLLM builds the model (`Ahead`, as
    load_model sets it up): a shard's bad header is said by the load, in one line naming the
    shard, with no reader thread left and none of the output's files open."""
    from fi_convert.format import whole_read

    shard = _expert_shard(out_copy)
    with open(shard, "r+b") as f:
        f.write((1 << 40).to_bytes(8, "little"))  # a header longer than the file
    plugin = _loader()
    plugin._ahead = whole_read.Ahead("cpu", plugin._output(_model_config(out_copy)))
    try:
        with vm.vllm_context("trtllm", 2, 0):
            model = TinyModel(vm.make_layer(PREFIX, src, 2))
            with pytest.raises(PluginError) as e:
                plugin.load_weights(model, _model_config(out_copy))
    finally:
        plugin._ahead.close()
    msg = str(e.value)
    assert msg.startswith(f"fi-convert: {shard}: ") and "\n" not in msg
    assert not reader_threads()
    assert not files_open(out_copy)


@pytest.mark.parametrize(
    "when,order",
    [
        ("in the read", "ask-first"),
        ("while the model is asked", "ask-first"),
        ("while the model is asked", "threads-ahead"),
        ("while the model is asked", "ask-under-read"),
        ("while the model is asked", "ask-under-read-at-build"),
        ("in the read", "threads-at-build"),
        ("while the model is asked", "threads-at-build"),
    ],
)
def test_ctrl_c_during_the_load_stops_the_readers_and_says_so(src, out, monkeypatch, when, order):
    """In the read's wait, or while the model is asked where its other tensors go, in each
    order of a load (`whole_read.ORDER`: asked first; or with the reader threads started
    ahead, while the model was built or before it was asked, waiting for their work, or
    reading the experts: they end too)."""
    from unittest import mock

    from fi_convert import bulk_read
    from fi_convert.format import dense, whole_read
    from fi_convert.servers.vllm import loader

    monkeypatch.setattr(whole_read, "ORDER", order)

    def interrupted(*args, **kwargs):
        if when == "while the model is asked":  # started ahead, they wait for their work
            readers = reader_threads()
            assert bool(readers) == (order != "ask-first")
        raise KeyboardInterrupt

    if when == "in the read":
        monkeypatch.setattr(bulk_read.BulkRead, "wait", interrupted)
    else:
        monkeypatch.setattr(dense, "probe", interrupted)
    aborted = []
    real_abort = bulk_read.BulkRead.abort
    monkeypatch.setattr(
        bulk_read.BulkRead, "abort", lambda self: aborted.append(1) or real_abort(self)
    )
    plugin = _loader()
    if order.endswith("at-build"):  # as load_model sets up before vLLM builds the model
        plugin._ahead = whole_read.Ahead("cpu")
    with vm.vllm_context("trtllm", 2, 0):
        model = TinyModel(vm.make_layer(PREFIX, src, 2))
        with mock.patch.object(loader, "logger") as log, pytest.raises(KeyboardInterrupt):
            plugin.load_weights(model, _model_config(out))
    assert aborted
    said = log.error.call_args.args
    assert said[0] % said[1:] == (
        f"fi-convert: loading {out} interrupted; its reader threads are stopped and their "
        "pinned memory freed: start the server again"
    )
    assert not reader_threads()


def test_the_plugin_loads_no_converter_code():
    """A vLLM worker imports the output format and the small leaves, none of the converter
    (planning, schemes, layouts, the pipeline, the Hub)."""
    import subprocess
    import sys

    code = (
        "import sys, fi_convert.servers.vllm.loader, fi_convert.servers.vllm.experts\n"
        "print(sorted(m for m in sys.modules if m.startswith('fi_convert')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    loaded = set(eval(r.stdout.strip().splitlines()[-1]))  # noqa: S307 (our subprocess's list)
    converter = {"plan", "pipeline", "schemes", "layout", "source", "outdir", "verify", "hub"}
    assert {m.split(".")[1] for m in loaded if "." in m} & converter == set(), sorted(loaded)
    assert "fi_convert.format.reader" in loaded


@pytest.fixture(scope="module")
def mistral_out(tmp_path_factory):
    """An output of a Mistral-format source (tests/mistral_checkpoints.py: params.json, no
    config.json, consolidated shards, tekken.json), BF16, TP 2; and the source."""
    from tests import mistral_checkpoints

    root = tmp_path_factory.mktemp("plugin-mistral")
    src = mistral_checkpoints.write(root / "src")
    out = root / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.TRTLLM, 2), device="cpu")
    return src, out


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        # auto: Mistral's format only beside consolidated*.safetensors, and no config.json
        ({}, "Invalid repository ID or local directory specified"),
        # Mistral's parser: params.json's quantization is fi-convert's mark
        (dict(config_format="mistral"), "Found unknown quantization=.*'quant_method': 'fi-con"),
        (dict(config_format="mistral", load_format="mistral"), "Found unknown quantization="),
        (dict(config_format="hf"), "config.json"),
    ],
    ids=["auto", "mistral", "mistral-load-format", "hf"],
)
def test_stock_vllm_refuses_an_output_of_a_mistral_format_source(mistral_out, kw, words):
    """Stock vLLM (the plugin registered, as an installed entry point is, but no
    `--load-format fi-convert`) builds no model from an output of a Mistral-format source,
    whatever --config-format says."""
    _, out = mistral_out
    register()
    with pytest.raises(Exception, match=words):
        _engine_model_config(out, skip_tokenizer_init=True, **kw)


def test_a_mistral_format_output_gets_the_plugins_parser_and_mistrals_tokenizer(mistral_out):
    """With --load-format fi-convert (--config-format auto or mistral) the plugin's config
    parser reads the output, and the tokenizer is Mistral's, as vLLM's `auto` picks it for the
    source (tekken.json beside consolidated shards); a tokenizer the user names is left alone.
    The model config equals the source's (tests/test_vllm_families.py builds and loads it)."""
    from vllm.tokenizers.registry import resolve_tokenizer_args

    from fi_convert.servers.vllm.mistral import CONFIG_FORMAT

    src, out = mistral_out
    register()
    theirs = _engine_model_config(src, skip_tokenizer_init=True)
    for fmt in ("auto", "mistral"):
        got = _engine_model_config(
            out, load_format="fi-convert", tensor_parallel_size=2, config_format=fmt
        )
        assert got.config_format == CONFIG_FORMAT
        assert got.hf_config.to_dict() == theirs.hf_config.to_dict()

    def mode(mc):
        return resolve_tokenizer_args(
            mc.tokenizer, runner_type="generate", tokenizer_mode=mc.tokenizer_mode
        )[0]

    assert mode(got) == mode(theirs) == "mistral"
    named = _engine_model_config(
        out, load_format="fi-convert", tensor_parallel_size=2, tokenizer=str(src)
    )
    assert named.tokenizer_mode == "auto" and mode(named) == "mistral"


def _mistral_copy(out: Path, tmp_path: Path, edit) -> Path:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    edit(bad)
    return bad


@pytest.mark.parametrize(
    ("kw", "edit", "words"),
    [
        (
            dict(config_format="hf"),
            None,
            "read by fi-convert's own config parser, not --config-format hf; drop --config-f",
        ),
        (
            {},
            lambda d: (d / "params.json").write_text(
                (d.parent / "src" / "params.json").read_text()
            ),
            "its params.json's quantization is not fi-convert's mark",
        ),
        ({}, lambda d: (d / "params.json").write_text("{not json"), "params.json (unreadable:"),
        ({}, lambda d: (d / "params.json").write_text("[]"), "params.json (not a JSON object)"),
        ({}, lambda d: (d / "params.json").unlink(), "params.json (missing)"),
    ],
    ids=["config-format-hf", "source-params", "garbled", "not-an-object", "missing"],
)
def test_a_bad_mistral_format_output_is_one_line(mistral_out, tmp_path, kw, edit, words):
    """Refused before vLLM reads its config (inside it, vLLM would retry the parse and wrap
    the error in its own lines)."""
    src, out = mistral_out
    if edit is not None:
        import shutil

        shutil.copytree(src, tmp_path / "src")
        out = _mistral_copy(out, tmp_path, edit)
    register()
    with pytest.raises(PluginError) as e:
        _engine_model_config(out, load_format="fi-convert", tensor_parallel_size=2, **kw)
    msg = str(e.value)
    assert msg.startswith("fi-convert: ") and "\n" not in msg and words in msg, msg

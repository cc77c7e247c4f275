"""fi_convert/servers/<server>/architectures.json: which releases of each server have a model
class for a source's architecture (its registry), and whose class refuses a family's
config.json; the manifest's `source.architectures`, and its release lists narrowed by them (an
output written before the field judged by its layout alone, as before); the plugins' refusal
of a release whose registry has none. The installed release's entry is checked against its
own registry and config loading (`make test`: vLLM 0.33 and SGLang 0.5.23; each release's leg,
`make test-release`: that release)."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.format import manifest as mf
from fi_convert.manifest import check_fields
from fi_convert.servers import architectures, installed_registry
from fi_convert.servers.sglang import releases as sglang_releases
from fi_convert.servers.vllm import checks as vllm_checks
from fi_convert.servers.vllm import releases as vllm_releases
from fi_convert.testing.synthetic import Spec, write_checkpoint

ROOT = Path(__file__).resolve().parents[1]
VLLM = list(vllm_releases.PROVEN)
SGLANG = list(sglang_releases.PROVEN)


def _script():
    spec = importlib.util.spec_from_file_location(
        "release_architectures", ROOT / "scripts" / "release_architectures.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "server",
    [
        pytest.param("vllm", marks=pytest.mark.vllm),
        pytest.param("sglang", marks=pytest.mark.sglang),
    ],
)
def test_the_installed_releases_entry_is_its_own_registry_and_config_loading(server):
    """The file's entry for the installed release is what the script reads from it now."""
    release = installed_registry.version(server)
    data = json.loads((ROOT / "fi_convert" / "servers" / server / architectures.FILE).read_text())
    assert release in data["releases"], (
        f"no entry for {server} {release}: run scripts/release_architectures.py {server} there"
    )
    assert data["releases"][release] == _script().entry(server)


@pytest.mark.parametrize(("server", "proven"), [("vllm", VLLM), ("sglang", SGLANG)])
def test_every_release_proven_has_an_entry_read_from_it(server, proven):
    facts = architectures.facts(server)
    assert list(facts.releases) == proven
    # each entry is a whole registry, not a hand-typed list of the families' architectures
    assert all(len(r.architectures) > 250 for r in facts.releases.values())


def test_what_the_releases_own_code_says_of_the_known_cases():
    sg = architectures.facts("sglang")
    # K-EXAONE's class is ExaoneMoEForCausalLM before 0.5.22; config.json names ExaoneMoe...
    for release in ("0.5.20", "0.5.21"):
        why = sg.why_not(release, ["ExaoneMoeForCausalLM"])
        assert why == "its model registry has no ExaoneMoeForCausalLM"
        assert sg.why_not(release, ["ExaoneMoEForCausalLM"]) is None
        # HY v4's config as transformers writes it (layer_types indexed_attention)
        why = sg.why_not(release, ["HYV4ForCausalLM"])
        assert why is not None and "deepseek_sparse_attention" in why, why
    for release in ("0.5.22", "0.5.23"):
        assert sg.why_not(release, ["ExaoneMoeForCausalLM"]) is None
        assert sg.why_not(release, ["HYV4ForCausalLM"]) is None
    v = architectures.facts("vllm")
    for arch in ("Kolibri1ForCausalLM", "BeamForCausalLM"):
        assert v.serving([arch], VLLM) == ["0.33.0", "0.34.0"]
    assert v.serving(["ExaoneMoEForCausalLM"], VLLM) == ["0.32.0", "0.33.0", "0.34.0"]
    assert v.serving(["ExaoneMoeForCausalLM"], VLLM) == VLLM
    # the first of config.json's architectures the registry holds is the one it takes
    assert sg.why_not("0.5.21", ["ExaoneMoeForCausalLM", "ExaoneMoEForCausalLM"]) is None


def _m(scheme: str, backend: str, archs: list[str] | None) -> dict:
    layer = {"hidden_size": 256, "intermediate_size_per_rank": 128}
    layer["padded_intermediate_size_per_rank"] = 128
    m: dict = {"scheme": scheme, "backend": backend, "layers": {"x": layer}}
    if archs is not None:
        m["source"] = {"architectures": archs}
    return m


@pytest.mark.parametrize(
    ("archs", "want"),
    [
        (None, SGLANG),  # an output written before the field: its layout alone, as before
        ([], SGLANG),  # a config.json without architectures: nothing to narrow by
        (["ExaoneMoeForCausalLM"], ["0.5.22", "0.5.23"]),
        (["HYV4ForCausalLM"], ["0.5.22", "0.5.23"]),
        (["BeamForCausalLM"], ["0.5.23"]),
        (["Qwen3MoeForCausalLM"], SGLANG),
    ],
)
def test_sglangs_list_takes_the_architecture(archs, want):
    assert sglang_releases.proven_for(_m("bf16", "trtllm", archs)) == want


def test_vllms_list_takes_the_architecture_and_says_why():
    m = _m("bf16", "trtllm", ["Kolibri1ForCausalLM"])
    assert vllm_releases.proven_for(m) == ["0.33.0", "0.34.0"]
    assert vllm_releases.left_out(m) == (
        "vLLM 0.30.0, 0.31.0, 0.32.0: its model registry has no Kolibri1ForCausalLM"
    )
    # beside a left-out reason of the layer's sizes
    m = _m("mxfp8", "trtllm", ["Kolibri1ForCausalLM"])
    m["layers"]["x"]["hidden_size"] = 320
    assert vllm_releases.proven_for(m) == ["0.33.0", "0.34.0"]
    assert vllm_releases.left_out(m).startswith("vLLM 0.30-0.32 do not pad H to 256")
    assert vllm_releases.proven_for(_m("bf16", "trtllm", None)) == VLLM
    assert vllm_releases.left_out(_m("bf16", "trtllm", None)) == ""


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    root = tmp_path_factory.mktemp("archs")
    src = write_checkpoint(root / "src", Spec("qwen3-moe", layers=1, experts=3, shards=1))
    out = root / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.TRTLLM, 1), device="cpu")
    return src, out


def test_the_manifest_records_config_jsons_architectures(output):
    src, out = output
    m = mf.read(out)
    want = json.loads((src / "config.json").read_text())["architectures"]
    assert m["source"]["architectures"] == want == ["Qwen3MoeForCausalLM"]
    assert m["target"]["vllm_releases"] == VLLM
    assert check_fields(m) == []


@pytest.fixture
def no_qwen3_on_030(monkeypatch):
    """vLLM's facts with 0.30.0's registry lacking Qwen3MoeForCausalLM."""
    real = architectures.facts("vllm")
    rel = real.releases["0.30.0"]
    fake = architectures.Facts(
        "vllm",
        real.registry,
        {
            **real.releases,
            "0.30.0": architectures.Release(
                rel.architectures - {"Qwen3MoeForCausalLM"}, rel.refuses
            ),
        },
    )
    monkeypatch.setattr(architectures, "facts", lambda s: fake if s == "vllm" else real)


def test_a_release_without_the_class_is_left_out_of_a_new_output(output, tmp_path, no_qwen3_on_030):
    src, _ = output
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.TRTLLM, 1), device="cpu")
    t = mf.read(out)["target"]
    assert t["vllm_releases"] == VLLM[1:]
    assert t["vllm_releases_left_out"] == (
        "vLLM 0.30.0: its model registry has no Qwen3MoeForCausalLM"
    )
    assert check_fields(mf.read(out)) == []


def _older(m: dict) -> dict:
    """The manifest as fi-convert wrote it before `source.architectures`."""
    old = copy.deepcopy(m)
    del old["source"]["architectures"]
    return old


def test_an_output_written_before_the_field_reads_verifies_and_serves_as_before(
    output, tmp_path, no_qwen3_on_030
):
    _, out = output
    old = _older(mf.read(out))  # its list made before: every release
    assert old["target"]["vllm_releases"] == VLLM
    assert check_fields(old) == []  # the list is judged by its layout alone
    assert vllm_releases.proven_for(old) == VLLM
    for release in VLLM:
        vllm_checks.check_manifest(old, "OUT", tp_size=1, use_ep=False, vllm_version=release)
    # and the reader takes the manifest without the key
    (tmp_path / "o").mkdir()
    for f in out.iterdir():
        (tmp_path / "o" / f.name).symlink_to(f)
    (tmp_path / "o" / "fi-convert-manifest.json").unlink()
    (tmp_path / "o" / "fi-convert-manifest.json").write_text(json.dumps(old))
    assert mf.read(tmp_path / "o")["source"].get("architectures") is None


def test_a_damaged_architectures_field_is_one_line_of_verify(output):
    m = mf.read(output[1])
    m["source"]["architectures"] = "Qwen3MoeForCausalLM"
    assert 'source.architectures is "Qwen3MoeForCausalLM", not a list of strings' in check_fields(m)


def test_the_vllm_plugin_refuses_a_release_whose_registry_has_no_class(output):
    m = mf.read(output[1])
    archs = ["Kolibri1ForCausalLM"]
    with pytest.raises(vllm_checks.PluginError) as e:
        vllm_checks.check_architecture(m, "OUT", archs, "0.30.0", {"Qwen3MoeForCausalLM"})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("fi-convert: OUT: vLLM 0.30.0's model registry")
    assert "has no Kolibri1ForCausalLM (config.json's architectures)" in msg
    assert msg.endswith("serve it on vLLM 0.33.0, 0.34.0 (pip install vllm==0.34.0)")
    # a registry that has it, or a config.json that names none: nothing to refuse
    vllm_checks.check_architecture(m, "OUT", archs, "0.33.0", {"Kolibri1ForCausalLM"})
    vllm_checks.check_architecture(m, "OUT", [], "0.30.0", set())


@pytest.mark.vllm
def test_the_vllm_plugins_load_refuses_first_where_the_registry_has_no_class(output, monkeypatch):
    """The plugin's load_model reads config.json's architectures from vLLM's model config and
    the running vLLM's registry, and refuses before any other check or the model's build."""
    import types

    from vllm.config.load import LoadConfig

    from fi_convert.servers.vllm import loader

    out = output[1]
    # the installed registry has the source's class: nothing refused
    vllm_checks.check_architecture(
        mf.read(out),
        "OUT",
        ["Qwen3MoeForCausalLM"],
        vllm_checks.vllm_version(),
        installed_registry.architectures("vllm"),
    )
    monkeypatch.setattr(
        loader.installed_registry, "architectures", lambda server: frozenset({"LlamaForCausalLM"})
    )
    hf_config = types.SimpleNamespace(architectures=["Qwen3MoeForCausalLM"])
    model_config = types.SimpleNamespace(model=str(out), revision=None, hf_config=hf_config)
    vllm_config = types.SimpleNamespace(parallel_config=None)  # read only after the refusal
    with pytest.raises(vllm_checks.PluginError) as e:
        loader.FiConvertModelLoader(LoadConfig(load_format="fi-convert")).load_model(
            vllm_config, model_config
        )
    msg = str(e.value)
    assert "\n" not in msg and "model registry has no Qwen3MoeForCausalLM" in msg
    assert msg.endswith(f"serve it on vLLM {', '.join(VLLM)} (pip install vllm==0.34.0)")

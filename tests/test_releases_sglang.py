"""Which SGLang releases an output's bytes are proven for (fi_convert/servers/sglang/releases.py):
the table, the list the converter writes into the manifest, the plugin's judgement of an output
by the layout it holds (one written before the list existed included), `verify` of such an
output, and the docs' table made from it. The proofs themselves are SGLang's own code per
release (tests/test_sglang.py in each release's venv); nothing here imports SGLang."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from fi_convert.format.names import MANIFEST_NAME
from fi_convert.servers.sglang import checks, releases
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import cli

ROOT = Path(__file__).resolve().parent.parent
ALL = ["0.5.20", "0.5.21", "0.5.22", "0.5.23"]


def _m(scheme: str, backend: str, **layer) -> dict:
    entry = {"padded_intermediate_size_per_rank": 128, **layer}
    return {"scheme": scheme, "backend": backend, "tp_size": 1, "layers": {"x": entry}}


@pytest.mark.parametrize(
    ("scheme", "backend", "want"),
    [
        ("bf16", "trtllm", ALL),
        ("fp8-block", "trtllm", ALL),
        ("mxfp4", "cutlass", ALL),
        ("nvfp4", "cutlass", ALL),
        ("nvfp4", "trtllm", ["0.5.23"]),
        ("fp8-tensor", "trtllm", ["0.5.23"]),
        ("fp8-tensor", "cutlass", ALL),
        ("fp8-block", "cutlass", []),  # no SGLang layout of it
    ],
)
def test_proven_for_reads_the_table(scheme, backend, want):
    assert releases.proven_for(_m(scheme, backend)) == want
    assert list(releases.PROVEN) == sorted(releases.PROVEN) == ALL


def test_a_conditional_row_holds_only_where_every_layer_meets_it(monkeypatch):
    row = releases.Row("nvfp4", "trtllm", ("0.5.22",), when=("i_p_128", "no_clamp"))
    monkeypatch.setattr(releases, "TABLE", (*releases.TABLE, row))
    assert releases.proven_for(_m("nvfp4", "trtllm")) == ["0.5.22", "0.5.23"]
    m = _m("nvfp4", "trtllm", padded_intermediate_size_per_rank=64)
    assert releases.proven_for(m) == ["0.5.23"]
    assert releases.proven_for(_m("nvfp4", "trtllm", swiglu_limit=10.0)) == ["0.5.23"]


@pytest.mark.parametrize(
    ("listed", "spec"),
    [
        (ALL, ">=0.5.20,<=0.5.23"),
        (["0.5.23"], "==0.5.23"),
        (["0.5.20", "0.5.23"], ">=0.5.20,<=0.5.23,!=0.5.21,!=0.5.22"),
        ([], "<0"),
    ],
)
def test_the_range_admits_exactly_the_listed_releases(listed, spec):
    assert releases.specifier(listed) == spec
    admitted = [r for r in releases.PROVEN if SpecifierSet(spec).contains(r)]
    assert admitted == listed


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """--server sglang outputs: BF16 (every release), ModelOpt NVFP4 on TRT-LLM (0.5.23)."""
    root = tmp_path_factory.mktemp("releases")
    specs = {
        "bf16": Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=256, shards=1),
        "nvfp4": Spec(
            "deepseek-v3", layers=2, experts=3, hidden=256, intermediate=256, quant="nvfp4"
        ),  # fmt: skip
    }
    outs = {}
    for name, spec in specs.items():
        src = write_checkpoint(root / f"{name}-src", spec)
        res = cli("convert", src, root / name, "--server", "sglang", "--device", "cpu")
        assert res.exit_code == 0, res.stderr
        outs[name] = root / name
    return outs


def _manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST_NAME).read_text())


def test_conversion_writes_the_proven_releases(outputs):
    t = _manifest(outputs["bf16"])["target"]
    assert t["sglang_releases"] == ALL and t["sglang_versions"] == ">=0.5.20,<=0.5.23"
    assert t["sglang"] == "0.5.23"  # the release whose processing the layout follows
    t = _manifest(outputs["nvfp4"])["target"]
    assert t["sglang_releases"] == ["0.5.23"] and t["sglang_versions"] == "==0.5.23"


def _as_old_code_wrote_it(m: dict) -> dict:
    """The manifest as fi-convert wrote it before the releases were proven one by one."""
    t = {k: v for k, v in m["target"].items() if k != "sglang_releases"}
    return m | {"target": t | {"sglang_versions": "==0.5.23"}}


def test_an_older_output_is_served_by_every_release_proven_for_its_layout(outputs):
    old = _as_old_code_wrote_it(_manifest(outputs["bf16"]))
    for release in ALL:  # (the bytes; where the plugin loads into them: PLUGIN, below)
        checks.check_releases_bytes(old, "OUT", release)
    checks.check_release(old, "OUT", "0.5.23")
    nv = _as_old_code_wrote_it(_manifest(outputs["nvfp4"]))
    checks.check_release(nv, "OUT", "0.5.23")
    with pytest.raises(checks.UnlistedRelease) as e:
        checks.check_release(nv, "OUT", "0.5.22")
    msg = str(e.value)
    assert msg.startswith("fi-convert: OUT: its bytes are proven for SGLang 0.5.23, this is ")
    assert "SGLang 0.5.22" in msg and "install SGLang 0.5.23" in msg and "\n" not in msg


def test_a_listed_release_is_served_and_others_raise_unlisted_release(outputs):
    m = _manifest(outputs["bf16"])
    for release in ALL:
        checks.check_releases_bytes(m, "OUT", release)
    # a newer release the manifest lists (a newer fi-convert proved it) is served
    newer = m | {"target": m["target"] | {"sglang_releases": [*ALL, "0.5.24"]}}
    checks.check_release(newer, "OUT", "0.5.24")
    # the plugin's load is proven on every release that holds the layout's bytes
    for release in ALL:
        checks.check_release(_m("mxfp8", "trtllm"), "OUT", release)
    assert releases.plugin_specifier() == ">=0.5.20,<=0.5.23"
    for release in ("0.5.19", "0.5.24", "0.6.0"):
        with pytest.raises(checks.UnlistedRelease, match="0.5.20, 0.5.21, 0.5.22, 0.5.23, this"):
            checks.check_release(m, "OUT", release)
    assert issubclass(checks.UnlistedRelease, checks.PluginError)


def test_verify_accepts_an_older_outputs_target_and_refuses_a_wrong_list(outputs, tmp_path):
    old = tmp_path / "old"
    import shutil

    shutil.copytree(outputs["nvfp4"], old)
    path = old / MANIFEST_NAME
    m = _manifest(old)
    path.write_text(json.dumps(_as_old_code_wrote_it(m), indent=2, sort_keys=True) + "\n")
    res = cli("verify", old)
    assert res.exit_code == 0, res.stdout + res.stderr
    wrong = m | {"target": m["target"] | {"sglang_releases": ALL}}
    path.write_text(json.dumps(wrong, indent=2, sort_keys=True) + "\n")
    res = cli("verify", old)
    assert res.exit_code == 1
    assert "target.sglang_releases" in res.stdout + res.stderr


def test_the_docs_table_is_the_releases_table():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import sglang_support_table as script
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    page = script.PAGE.read_text()
    assert script.render(page) == page, "run scripts/sglang_support_table.py"
    assert "| `nvfp4` / trtllm | other bytes (" in page
    # the control: a changed table gives another page
    row = releases.Row("nvfp4", "trtllm", ("0.5.22",))
    old = releases.TABLE
    releases.TABLE = (*old, row)
    try:
        assert script.render(page) != page
    finally:
        releases.TABLE = old


def test_the_plugin_loads_every_layout_into_every_release_that_holds_its_bytes():
    """PLUGIN: for each layout, the releases of the table's rows, but those PLUGIN_WHY says
    why not (none today: tests/test_sglang_plugin.py, test_sglang_models.py and
    test_sglang_ep.py pass in each release's venv for every layout it holds)."""
    assert releases.PLUGIN_WHY == {}
    for row in releases.TABLE:
        assert set(row.releases) <= set(releases.plugin_releases(row.scheme, row.backend))
    assert releases.plugin_releases("bf16", "trtllm") == tuple(ALL)
    assert releases.plugin_releases("nvfp4", "trtllm") == ("0.5.23",)  # (other bytes before)
    assert releases.plugin_specifier() == ">=0.5.20,<=0.5.23"


def test_an_older_release_holding_the_bytes_is_refused_where_the_plugin_does_not_load(
    outputs, monkeypatch
):
    """Were the plugin's load not proven on a release that holds an output's bytes (here
    SGLang 0.5.22 for BF16, listed): one line naming where it loads, and the docs' table says
    why; a release the manifest lists beyond every proven one is left to the load-time proof
    (no refusal here)."""
    m = _manifest(outputs["bf16"])
    assert "0.5.22" in m["target"]["sglang_releases"]
    checks.check_release(m, "OUT", "0.5.22")  # the control: it loads there
    why = {("bf16", "trtllm", "0.5.22"): "a reason"}
    monkeypatch.setattr(releases, "PLUGIN_WHY", why)
    loads = ("0.5.20", "0.5.21", "0.5.23")
    monkeypatch.setitem(releases.PLUGIN, ("bf16", "trtllm"), loads)
    with pytest.raises(checks.PluginError) as e:
        checks.check_release(m, "OUT", "0.5.22")
    msg = str(e.value)
    assert not isinstance(e.value, checks.UnlistedRelease) and "\n" not in msg
    assert msg.startswith("fi-convert: OUT: SGLang 0.5.22 holds its bytes, but this ")
    assert "loads bf16/trtllm outputs into SGLang 0.5.20, 0.5.21, 0.5.23 only" in msg
    newer = m | {"target": m["target"] | {"sglang_releases": [*ALL, "0.5.24"]}}
    checks.check_release(newer, "OUT", "0.5.24")
    table = releases.support_table({})
    assert "| `bf16` / trtllm | proven | proven | same bytes, no plugin (" in table
    assert "`bf16` / trtllm on 0.5.22: a reason" in table

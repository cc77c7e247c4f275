"""fi_convert/servers/vllm/releases.py: the vLLM releases an output's bytes are proven for, as the
manifest lists them (`target.vllm_releases`), as `inspect`, `verify` and the model card say them,
and as the plugin judges an output by the layout it holds: an output written before the list
(`vllm_versions: "==0.33.0"` only) is served by every release proven for its layout, a release in
neither is refused in one line (UnlistedRelease). No vLLM is needed: the releases themselves are
proven by tests/test_vllm*.py run in each release's venv (`make test-release RELEASE=X`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import tomllib

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.format import manifest as mf
from fi_convert.servers.vllm import checks, releases
from fi_convert.servers.vllm.checks import PluginError, UnlistedRelease
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import cli

ALL = ["0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]
ROOT = Path(__file__).resolve().parents[1]


def _layer(h: int, i_rank: int) -> dict:
    return {"hidden_size": h, "intermediate_size_per_rank": i_rank}


def _m(scheme: str, backend: str, *layers: dict) -> dict:
    return {"scheme": scheme, "backend": backend, "layers": dict(enumerate(layers))}


def test_proven_is_every_release_of_the_table_sorted():
    assert list(releases.PROVEN) == ALL
    assert {r for row in releases.TABLE for r in row.releases} == set(releases.PROVEN)
    assert all(releases.REFERENCE in row.releases for row in releases.TABLE)


@pytest.mark.parametrize(
    ("m", "want"),
    [
        (_m("bf16", "trtllm", _layer(320, 96)), ALL),
        (_m("fp8-block", "cutlass", _layer(256, 128)), ALL),
        (_m("mxfp8", "trtllm", _layer(512, 128), _layer(256, 256)), ALL),
        (_m("mxfp8", "trtllm", _layer(320, 128)), ["0.33.0", "0.34.0"]),  # H % 256
        (_m("mxfp8", "trtllm", _layer(512, 96)), ["0.33.0", "0.34.0"]),  # I per rank % 128
        # one layer that does not fit takes the releases of the whole output
        (_m("mxfp8", "trtllm", _layer(512, 128), _layer(512, 64)), ["0.33.0", "0.34.0"]),
        (_m("mxfp8", "cutlass", _layer(512, 128)), []),  # vLLM has no such path
        (_m("bf16", "trtllm"), []),  # no layers: nothing proven
        # a layer without its sizes: proven only where the sizes do not matter
        ({"scheme": "bf16", "backend": "trtllm", "layers": {"x": {}}}, ALL),
        ({"scheme": "mxfp8", "backend": "trtllm", "layers": {"x": {}}}, []),
    ],
)
def test_proven_for_takes_scheme_backend_and_every_layers_sizes(m, want):
    assert releases.proven_for(m) == want


def test_left_out_says_why_only_where_a_proven_release_is_left_out():
    assert releases.left_out(_m("mxfp8", "trtllm", _layer(512, 128))) == ""
    why = releases.left_out(_m("mxfp8", "trtllm", _layer(320, 128)))
    assert "0.30-0.32" in why and "pad" in why


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Two tiny outputs: bf16 (every release) and MXFP8 at H 320 (0.33 and 0.34 only)."""
    root = tmp_path_factory.mktemp("releases")
    made = {}
    for name, scheme, spec in (
        ("bf16", SchemeName.BF16, Spec("qwen3-moe", layers=1, experts=3, hidden=128, shards=1)),
        (
            "mxfp8",
            SchemeName.MXFP8,
            Spec("qwen3-moe", layers=1, experts=3, hidden=320, intermediate=256, shards=1),
        ),
    ):
        src = write_checkpoint(root / f"{name}-src", spec)
        convert(src, root / name, Options(scheme, Backend.TRTLLM, 1), device="cpu")
        made[name] = root / name
    return made


def _manifest(out: Path) -> dict:
    return json.loads((out / "fi-convert-manifest.json").read_text())


def _as_before(m: dict) -> dict:
    """The manifest as fi-convert wrote it before `vllm_releases`: the one pin."""
    old = copy.deepcopy(m)
    for key in ("vllm_releases", "vllm_releases_left_out"):
        del_ = old["target"].pop(key, None)
        assert key == "vllm_releases_left_out" or del_ is not None
    assert old["target"]["vllm_versions"] == "==0.33.0"
    return old


def _check(m: dict, version: str) -> None:
    checks.check_manifest(m, "OUT", tp_size=1, use_ep=False, vllm_version=version)


def test_conversion_lists_the_releases_its_bytes_are_proven_for(outputs):
    t = _manifest(outputs["bf16"])["target"]
    assert t["vllm_releases"] == ALL and "vllm_releases_left_out" not in t
    t = _manifest(outputs["mxfp8"])["target"]
    assert t["vllm_releases"] == ["0.33.0", "0.34.0"]
    assert "0.30-0.32" in t["vllm_releases_left_out"]
    assert t["vllm"] == "0.33.0" and t["vllm_versions"] == "==0.33.0"  # for older plugins


@pytest.mark.parametrize("version", ALL)
def test_every_listed_release_is_served(outputs, version):
    _check(_manifest(outputs["bf16"]), version)


@pytest.mark.parametrize("version", ALL)
def test_an_output_written_before_the_list_is_served_by_every_release_proven_for_it(
    outputs, version
):
    _check(_as_before(_manifest(outputs["bf16"])), version)


@pytest.mark.parametrize("version", ["0.30.0", "0.32.0"])
def test_an_older_output_whose_sizes_a_release_cannot_serve_is_refused_there(outputs, version):
    old = _as_before(_manifest(outputs["mxfp8"]))
    _check(old, "0.34.0")  # proven for its layout: served without a reconversion
    with pytest.raises(UnlistedRelease) as e:
        _check(old, version)
    msg = str(e.value)
    assert msg.startswith("fi-convert: OUT: ") and "\n" not in msg
    assert f"this is vLLM {version}" in msg and "proven for vLLM 0.33.0, 0.34.0 only" in msg
    assert "pip install vllm==0.34.0" in msg
    assert (e.value.release, e.value.listed) == (version, "0.33.0, 0.34.0")


@pytest.mark.parametrize("version", ["0.29.0", "0.33.1", "0.35.0", "0.34.0rc1"])
def test_a_release_in_neither_list_is_refused_in_one_line_naming_the_listed(outputs, version):
    with pytest.raises(PluginError) as e:
        _check(_manifest(outputs["bf16"]), version)
    assert isinstance(e.value, UnlistedRelease)  # what the load-time proof catches
    msg = str(e.value)
    assert "\n" not in msg and f"this is vLLM {version}" in msg
    assert f"proven for vLLM {', '.join(ALL)} only" in msg


def test_a_release_the_manifest_lists_is_served_though_this_fi_convert_does_not_prove_it(outputs):
    m = _manifest(outputs["bf16"])
    m["target"]["vllm_releases"] = [*ALL, "0.35.0"]  # written by a newer fi-convert
    _check(m, "0.35.0")
    _check(m, "0.35.0+cpu")  # a local build label is the same release


def test_no_release_proven_and_none_listed_says_convert_again(outputs):
    m = _manifest(outputs["bf16"]) | {"layers": {}}
    m["target"]["vllm_releases"] = []
    with pytest.raises(UnlistedRelease, match="proven for no vLLM release .*convert the source"):
        _check(m, "0.33.0")


@pytest.mark.parametrize("bad", ["0.33.0", [0.33], {"a": 1}])
def test_a_list_that_is_not_one_is_refused(outputs, bad):
    m = _manifest(outputs["bf16"])
    m["target"]["vllm_releases"] = bad
    with pytest.raises(PluginError, match="vllm_releases .* is not a list of releases; convert"):
        _check(m, "0.33.0")


def test_verify_passes_the_list_and_an_output_written_before_it(outputs, tmp_path):
    import shutil

    assert cli("verify", outputs["mxfp8"]).exit_code == 0
    old = tmp_path / "old"
    shutil.copytree(outputs["mxfp8"], old)
    path = old / "fi-convert-manifest.json"
    path.write_text(json.dumps(_as_before(_manifest(old)), indent=2, sort_keys=True) + "\n")
    assert mf.read(old)  # the format reads it
    r = cli("verify", old)
    assert r.exit_code == 0, r.stdout + r.stderr


def test_verify_refuses_a_list_that_is_not_the_proven_one(outputs, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(outputs["mxfp8"], bad)
    m = _manifest(bad)
    m["target"]["vllm_releases"] = ALL  # claims releases whose processing fails on its sizes
    (bad / "fi-convert-manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    r = cli("verify", bad)
    assert r.exit_code == 1
    assert "target.vllm_releases" in r.stdout + r.stderr


def test_the_card_and_inspect_say_which_releases(outputs):
    from fi_convert.hub.card import model_card

    card = model_card(mf.read(outputs["mxfp8"]), repo_id="acme/x-fi")
    assert "| vLLM releases that serve it | 0.33.0, 0.34.0 |" in card
    assert "It serves on vLLM 0.33.0 or 0.34.0" in card and "0.30-0.32 do not pad" in card
    card = model_card(mf.read(outputs["bf16"]), repo_id="acme/x-fi")
    assert "It serves on vLLM 0.30.0, 0.31.0, 0.32.0, 0.33.0 or 0.34.0" in card
    r = cli("inspect", outputs["mxfp8"].with_name("mxfp8-src"), "--scheme", "mxfp8")
    assert "vllm_releases: 0.33.0, 0.34.0" in r.stdout
    assert "vllm_releases_left_out: vLLM 0.30-0.32" in r.stdout
    r = cli("inspect", outputs["mxfp8"].with_name("mxfp8-src"), "--scheme", "mxfp8", "--json")
    vllm = next(s for s in json.loads(r.stdout)["servers"] if s["server"] == "vllm")
    assert vllm["releases"]["vllm_releases"] == ["0.33.0", "0.34.0"]


def test_the_vllm_extra_accepts_the_proven_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    first, last = releases.PROVEN[0], releases.PROVEN[-1]
    assert project["optional-dependencies"]["vllm"] == [f"vllm>={first},<={last}"]


def test_the_docs_support_table_is_the_proven_tables():
    """docs/serving.md holds what scripts/support_table.py makes of releases.py, not a table
    written by hand; and the script's --check fails on a page that differs."""
    import runpy

    script = runpy.run_path(str(ROOT / "scripts" / "support_table.py"))
    page = (ROOT / "docs" / "serving.md").read_text()
    assert script["with_table"](page) == page
    assert releases.support_table() in page
    edited = page.replace("| mxfp8 | trtllm | other sizes | fails (1)", "| mxfp8 | trtllm | x")
    assert edited != page and script["with_table"](edited) == page


def test_the_support_table_marks_each_release_of_each_row():
    table = releases.support_table()
    assert "| bf16 | trtllm | any size | " + " | ".join(["proven"] * 5) + " |" in table
    row = "| mxfp8 | trtllm | other sizes | " + " | ".join(["fails (1)"] * 3 + ["proven"] * 2)
    assert row in table
    assert "(1) vLLM 0.30-0.32 do not pad" in table
    for backend in ("trtllm", "cutlass"):  # gpt-oss MXFP4: every release (test_vllm_mxfp4.py)
        assert f"| mxfp4 | {backend} | any size | " + " | ".join(["proven"] * 5) + " |" in table
    assert "(2) vLLM has no" in table

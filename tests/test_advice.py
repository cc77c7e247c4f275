"""fi_convert/plan.py (choices, unservable outputs), fi_convert/servers/vllm/ (checks, target):
what fi-convert tells a user before any long work: the output vLLM 0.33 cannot serve is
refused at plan time (unless asked for), `inspect` lists what else a checkpoint takes and
which schemes quantize, the manifest's GPU families are vLLM's, and `make install` says a
successful install is one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from fi_convert import FiConvertError
from fi_convert import manifest as mf
from fi_convert.plan import Options, choices, make_plan
from fi_convert.servers.vllm.checks import PluginError, check_gpu, check_manifest
from fi_convert.servers.vllm.target import VLLM
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import ANSI_RE, cli

ROOT = Path(__file__).resolve().parent.parent
UNSERVABLE = (
    "so the output has no static activation scales, which vLLM 0.33's FlashInfer FP8 "
    "per-tensor kernels need (fi-convert's vLLM plugin refuses such an output)"
)


def lines(text: str) -> list[str]:
    return ANSI_RE.sub("", text).splitlines()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("advice")
    qwen = write_checkpoint(root / "qwen3", Spec("qwen3-moe", layers=2, experts=4, hidden=128))
    ds = write_checkpoint(root / "ds", Spec("deepseek-v3", layers=2, experts=8, hidden=256))
    fp8 = write_checkpoint(
        root / "fp8", Spec("mixtral", layers=1, experts=3, hidden=128, quant="fp8-tensor")
    )
    # a per-tensor FP8 checkpoint without activation scales (dynamic activations)
    dyn = write_checkpoint(
        root / "dyn", Spec("qwen3-moe", layers=1, experts=3, hidden=128, quant="fp8-tensor")
    )
    index_path = dyn / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for shard in dyn.glob("*.safetensors"):
        t = load_file(shard)
        save_file({k: v for k, v in t.items() if "input_scale" not in k}, shard, {"format": "pt"})
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if "input_scale" not in k}
    index_path.write_text(json.dumps(index))
    return {"qwen3": qwen, "ds": ds, "fp8": fp8, "dyn": dyn}


# ---------------------------------------------------------------- the unservable output


@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_bf16_to_fp8_tensor_is_refused_with_the_servable_alternatives(ckpts, tmp_path, backend):
    out = tmp_path / "out"
    res = cli("convert", ckpts["qwen3"], out, "--scheme", "fp8-tensor", "--backend", backend)
    assert res.exit_code == 1
    assert lines(res.stderr) == [
        f"error: --scheme fp8-tensor --backend {backend}: the experts are BF16, {UNSERVABLE}; "
        "servable instead: --scheme bf16 (trtllm, cutlass), mxfp8 (trtllm), or a source with "
        "static activation scales (ModelOpt FP8); --allow-unservable converts it anyway"
    ]
    assert not out.exists()


def test_fp8_without_input_scales_is_refused_too(ckpts, tmp_path):
    """Detected as fp8-tensor, and no other scheme reads per-tensor FP8: no alternative
    from this checkpoint, only another source."""
    res = cli("convert", ckpts["dyn"], tmp_path / "out")
    assert res.exit_code == 1
    assert lines(res.stderr)[-1] == (
        f"error: --scheme fp8-tensor --backend trtllm: the experts have no input_scale, "
        f"{UNSERVABLE}; servable instead: a source with static activation scales (ModelOpt "
        "FP8); --allow-unservable converts it anyway"
    )


def test_allow_unservable_converts_what_the_plugin_then_refuses(ckpts, tmp_path):
    out = tmp_path / "out"
    res = cli("convert", ckpts["qwen3"], out, "--scheme", "fp8-tensor", "--allow-unservable")
    assert res.exit_code == 0, res.stderr
    m = json.loads((out / "fi-convert-manifest.json").read_text())
    assert {lay["activation_scheme"] for lay in m["layers"].values()} == {"dynamic"}
    with pytest.raises(PluginError, match="no static activation scales"):
        check_manifest(m, str(out), tp_size=1, use_ep=False, vllm_version="0.33.0")
    # and verify re-derives it from the source (it plans with the refusal lifted)
    res = cli("verify", out, "--source", ckpts["qwen3"])
    assert res.exit_code == 0, res.stdout + res.stderr


@pytest.mark.parametrize("name", ["qwen3", "ds", "fp8", "dyn"])
def test_what_plan_calls_unservable_is_what_the_plugin_refuses(ckpts, name):
    """Every scheme x backend that plans: its manifest passes the plugin's checks exactly when
    fi-convert calls it servable."""
    plan = make_plan(ckpts[name], Options(allow_unservable=True))
    planned = [c for c in choices(plan) if c.why_not is None or c.unservable]
    assert planned
    for c in planned:
        opts = Options(c.scheme, c.backend, allow_unservable=True)
        m = mf.build(make_plan(ckpts[name], opts), {})
        refused = False
        try:
            check_manifest(m, "out", tp_size=1, use_ep=False, vllm_version="0.33.0")
        except PluginError:
            refused = True
        assert refused == c.unservable, (c.scheme, c.backend)


# ---------------------------------------------------------------- inspect's advice


def test_inspect_bf16_qwen3_lists_what_it_takes(ckpts):
    res = cli("inspect", ckpts["qwen3"])
    assert res.exit_code == 0, res.stderr
    got = lines(res.stdout)
    start = got.index("precision: BF16 -> bf16 keeps the source's bytes")
    assert got[start + 1 : start + 5] == [
        "this checkpoint takes (--scheme, --backend; tp 1):",
        "  bf16 (trtllm, cutlass): BF16 -> bf16 keeps the source's bytes",
        "  mxfp8 (trtllm): BF16 -> mxfp8 quantizes: loses precision",
        "and cannot take:",
    ]
    servers = got.index("servers (--server; bf16, trtllm, tp 1):")
    cannot = got[start + 5 : servers]
    assert (
        f"  fp8-tensor (trtllm, cutlass): the experts are BF16, {UNSERVABLE}; "
        "--allow-unservable converts it anyway"
    ) in cannot
    assert "  mxfp8 (cutlass): vLLM 0.33 has no FlashInfer CUTLASS MXFP8 path" in cannot
    # one line for each of the others, saying why (the scheme's own check)
    for scheme in ("fp8-block", "nvfp4", "mxfp4"):
        (line,) = [x for x in cannot if x.startswith(f"  {scheme} (trtllm, cutlass): ")]
        assert "BF16" in line or "gpt-oss" in line, line
    assert len(cannot) == 5
    # what each server would get: at TP 1 SGLang's BF16 bytes are vLLM's
    assert got[servers + 1 :] == [
        "  vllm: this plan; serve with `vllm serve OUT --load-format fi-convert -tp 1 "
        "--moe-backend flashinfer_trtllm`",
        "    vllm_releases: 0.30.0, 0.31.0, 0.32.0, 0.33.0, 0.34.0",  # releases.py
        "  sglang: the same bytes as for vllm (one output serves both: --server vllm,sglang); "
        "serve with `python -m sglang.launch_server "
        "--model-path OUT --load-format fi-convert --moe-runner-backend flashinfer_trtllm`",
        "    sglang_releases: 0.5.20, 0.5.21, 0.5.22, 0.5.23",  # servers/sglang/releases.py
        "    sglang_versions: >=0.5.20,<=0.5.23",
    ]


def test_inspect_fp8_deepseek_keeps_the_bytes(ckpts):
    res = cli("inspect", ckpts["ds"], "--tp-size", "2")
    assert res.exit_code == 0, res.stderr
    got = lines(res.stdout)
    start = got.index("precision: FP8 -> fp8-block keeps the source's bytes")
    assert got[start + 1 : start + 4] == [
        "this checkpoint takes (--scheme, --backend; tp 2):",
        "  fp8-block (trtllm, cutlass): FP8 -> fp8-block keeps the source's bytes",
        "and cannot take:",
    ]
    servers = got.index("servers (--server; fp8-block, trtllm, tp 2):")
    cannot = got[start + 4 : servers]
    assert [x.split(":")[0] for x in cannot] == [
        "  bf16 (trtllm, cutlass)",
        "  fp8-tensor (trtllm, cutlass)",
        "  mxfp8 (trtllm)",
        "  mxfp8 (cutlass)",
        "  nvfp4 (trtllm, cutlass)",
        "  mxfp4 (trtllm, cutlass)",
    ]
    assert "would requantize (lossy)" in cannot[2]


def test_inspect_json_has_precision_and_every_choice(ckpts):
    for name, want_ok, want_unservable, precision in [
        (
            "qwen3",
            {("bf16", "trtllm"), ("bf16", "cutlass"), ("mxfp8", "trtllm")},
            {("fp8-tensor", "trtllm"), ("fp8-tensor", "cutlass")},
            "BF16 -> bf16 keeps the source's bytes",
        ),
        (
            "ds",
            {("fp8-block", "trtllm"), ("fp8-block", "cutlass")},
            set(),
            "FP8 -> fp8-block keeps the source's bytes",
        ),
        (
            "fp8",
            {("fp8-tensor", "trtllm"), ("fp8-tensor", "cutlass")},
            set(),
            "FP8 -> fp8-tensor requantizes w13 to one scale per expert (gate and up share it), "
            "as vLLM does when it loads the source",
        ),
    ]:
        res = cli("inspect", ckpts[name], "--json")
        assert res.exit_code == 0, res.stderr
        s = json.loads(res.stdout)
        assert s["precision"] == precision
        cs = s["choices"]
        assert len(cs) == 12  # 6 schemes x 2 backends
        assert {(c["scheme"], c["backend"]) for c in cs if c["ok"]} == want_ok
        assert {(c["scheme"], c["backend"]) for c in cs if c["unservable"]} == want_unservable
        for c in cs:
            assert (c["why_not"] is None) == c["ok"]
            assert (c["precision"] is None) == (not c["ok"] and not c["unservable"])
    mx = [c for c in json.loads(cli("inspect", ckpts["qwen3"], "--json").stdout)["choices"]]
    (m,) = [c for c in mx if (c["scheme"], c["backend"]) == ("mxfp8", "trtllm")]
    assert m["precision"] == "BF16 -> mxfp8 quantizes: loses precision"


def test_inspect_of_the_unservable_plan_needs_the_opt_in(ckpts):
    res = cli("inspect", ckpts["qwen3"], "--scheme", "fp8-tensor")
    assert res.exit_code == 1
    assert "--allow-unservable converts it anyway" in lines(res.stderr)[-1]
    res = cli("inspect", ckpts["qwen3"], "--scheme", "fp8-tensor", "--allow-unservable")
    assert res.exit_code == 0, res.stderr
    assert "precision: BF16 -> fp8-tensor quantizes: loses precision" in lines(res.stdout)


# ---------------------------------------------------------------- GPU families


# vLLM 0.33: TRT-LLM on the SM10x family only; FlashInfer CUTLASS on SM90, SM10x, SM12x: block
# FP8 SM90 only, NVFP4 and MXFP4 x MXFP8 SM100 and later, BF16 and static FP8 per tensor SM90+
GPU_FAMILIES = {
    ("bf16", "trtllm"): "sm100",
    ("bf16", "cutlass"): "sm90+",
    ("fp8-block", "trtllm"): "sm100",
    ("fp8-block", "cutlass"): "sm90",
    ("fp8-tensor", "trtllm"): "sm100",
    ("fp8-tensor", "cutlass"): "sm90+",
    ("mxfp8", "trtllm"): "sm100",
    ("nvfp4", "trtllm"): "sm100",
    ("nvfp4", "cutlass"): "sm100+",
    ("mxfp4", "trtllm"): "sm100",
    ("mxfp4", "cutlass"): "sm100+",
}
RUNS_ON = {  # the capabilities each family admits, of (8,9) (9,0) (10,0) (10,3) (11,0) (12,0)
    "sm100": {(10, 0), (10, 3)},
    "sm90": {(9, 0)},
    "sm90+": {(9, 0), (10, 0), (10, 3), (12, 0)},
    "sm100+": {(10, 0), (10, 3), (12, 0)},
}


def test_gpu_family_of_every_scheme_and_backend():
    got = {(s, b): VLLM.gpu_family(b, s) for s, b in GPU_FAMILIES}
    assert got == GPU_FAMILIES


def test_the_options_name_a_server_whose_facts_the_registry_holds(ckpts):
    assert Options().server == "vllm" and Options().target is VLLM
    assert make_plan(ckpts["qwen3"], Options("bf16")).target is VLLM
    with pytest.raises(FiConvertError, match=r"^server 'nope' is not one fi-convert converts "):
        make_plan(ckpts["qwen3"], Options("bf16", server="nope"))


def test_gpu_family_in_the_manifest(ckpts):
    m = mf.build(make_plan(ckpts["ds"], Options("fp8-block", "cutlass")), {})
    assert m["target"]["gpu_family"] == "sm90"
    m = mf.build(make_plan(ckpts["qwen3"], Options("bf16", "cutlass")), {})
    assert m["target"]["gpu_family"] == "sm90+"


@pytest.mark.parametrize("family", sorted(RUNS_ON))
def test_the_plugin_admits_each_family_where_vllm_runs_it(family):
    for cap in [(8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0)]:
        try:
            check_gpu(family, "cutlass", cap, "out")
            ok = True
        except PluginError:
            ok = False
        assert ok == (cap in RUNS_ON[family]), (family, cap)


# ---------------------------------------------------------------- install and docs


def test_pyproject_license_is_an_spdx_string():
    import tomllib

    p = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert p["project"]["license"] == "Apache-2.0"
    assert not [c for c in p["project"].get("classifiers", []) if c.startswith("License ::")]
    assert "setuptools>=77" in p["build-system"]["requires"][0]  # the first to read PEP 639


def test_make_install_resolves_dependencies_before_the_no_deps_installs():
    """pip checks installed packages' requirements after each install that resolves any, and
    would list FlashInfer's and vLLM's CUDA-only ones as missing: those two go in last."""
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("$(VENV)/.installed:", 1)[1].split("\ntest:", 1)[0]
    pips = [ln.strip() for ln in recipe.splitlines() if "$(PIP) install" in ln]
    no_deps = [k for k, ln in enumerate(pips) if "--no-deps" in ln]
    assert no_deps == [len(pips) - 1], pips
    assert "$(FLASHINFER)" in pips[-1] and "$(VLLM)" in pips[-1]


def test_makefile_scripts_and_tests_point_to_doc_sections_that_exist():
    """A pointer to a section (see, then README or docs/<page>.md, then the heading in double
    quotes) names a heading of that page."""
    cited = [
        (page, name)
        for f in [
            ROOT / "Makefile",
            *(f for f in ROOT.glob("scripts/**/*") if f.is_file() and "__pycache__" not in f.parts),
            *ROOT.glob("tests/*.py"),
            *ROOT.glob("examples/**/*.yml"),
        ]
        for page, name in re.findall(r'see (README|docs/[\w.-]+\.md), "([^"]+)"', f.read_text())
    ]
    assert ("docs/development.md", "Install and test") in cited
    for page, name in cited:
        path = ROOT / ("README.md" if page == "README" else page)
        headings = {
            m.group(1).strip("`") for m in re.finditer(r"^#+ (.+)$", path.read_text(), re.M)
        }
        assert name in headings, (page, name, sorted(headings))


def _slug(heading: str) -> str:
    """A heading's anchor, as GitHub and the docs site (mkdocs' toc) make it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_point_to_pages_and_headings_that_exist():
    """The docs site's strict build checks the pages' links; this checks README's."""
    targets = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    assert "docs/converting.md#schemes" in targets
    for target in targets:
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        page = ROOT / path
        assert page.is_file(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, (target, headings)

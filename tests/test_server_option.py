"""`--server`: an output for SGLang (`fi-convert SRC OUT --server sglang`) against one for vLLM
(the default), through the command line: what the manifest, config.json, the card and
`inspect` say, what `verify` proves of it, and the one-line refusals. Its bytes are proven
against SGLang's own processing in tests/test_sglang.py, its loading in
tests/test_sglang_plugin.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fi_convert import load_moe_layer
from fi_convert.format.names import MANIFEST_NAME
from fi_convert.hub.card import model_card
from fi_convert.plan import Options, make_plan
from fi_convert.servers.vllm import checks as vllm_checks
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import ANSI_RE, cli

MIXTRAL = "model.layers.0.block_sparse_moe.experts"
LAUNCH = (
    "python -m sglang.launch_server --model-path DIR --load-format fi-convert "
    "--moe-runner-backend flashinfer_trtllm --tp 2"
)


def lines(text: str) -> list[str]:
    return ANSI_RE.sub("", text).splitlines()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    # I 192: I/TP 96 at TP 2, padded to 128, which SGLang shards by on TRT-LLM
    mixtral = Spec("mixtral", layers=1, experts=7, hidden=128, intermediate=192, shards=1)
    ds = Spec("deepseek-v3", layers=2, experts=8, hidden=256, intermediate=512)
    oss = Spec("gpt-oss", layers=2, experts=3, hidden=320, intermediate=192)
    nv = Spec("deepseek-v3", layers=2, experts=3, hidden=384, intermediate=192, quant="nvfp4")
    nv320 = Spec("deepseek-v3", layers=2, experts=3, hidden=320, intermediate=192, quant="nvfp4")
    ct = Spec("qwen3-moe", layers=1, experts=3, hidden=256, intermediate=256, quant="nvfp4-ct")
    # a SwiGLU clamp, as DeepSeek's config.json gives one (SGLang's DeepseekV2MoE reads it)
    nvclamp = Spec("deepseek-v3", layers=2, experts=3, hidden=256, intermediate=128, quant="nvfp4")
    nvclamp.config = {"swiglu_limit": 10.0}
    mx8 = Spec("qwen3-moe", layers=1, experts=3, hidden=384, intermediate=320, quant="mxfp8")
    # ModelOpt FP8 per-tensor, I 256: I/TP 256, 128 (a multiple of 128: no padding either way)
    fp8t = Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=256, quant="fp8-tensor")
    return {
        "fp8t": write_checkpoint(root / "fp8t", fp8t),
        "mx8": write_checkpoint(root / "mx8", mx8),
        "nv": write_checkpoint(root / "nv", nv),
        "nv320": write_checkpoint(root / "nv320", nv320),
        "ct": write_checkpoint(root / "ct", ct),
        "nvclamp": write_checkpoint(root / "nvclamp", nvclamp),
        "mixtral": write_checkpoint(root / "mixtral", mixtral),
        "ds": write_checkpoint(root / "ds", ds),
        "oss": write_checkpoint(root / "oss", oss),
    }


@pytest.fixture(scope="module")
def converted(ckpts, tmp_path_factory):
    """The Mixtral checkpoint converted at TP 2 for each server, by the command line."""
    root = tmp_path_factory.mktemp("server-out")
    outs = {}
    for server in ("vllm", "sglang"):
        out = root / server
        args = [ckpts["mixtral"], out, "--tp-size", "2", "--device", "cpu", "--json"]
        res = cli("convert", *args, *(["--server", server] if server != "vllm" else []))
        assert res.exit_code == 0, res.stderr
        assert json.loads(res.stdout)["server"] == server
        outs[server] = out
    return outs


def manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST_NAME).read_text())


def test_the_manifest_names_the_server_and_its_releases(converted):
    m = manifest(converted["sglang"])
    assert m["server"] == "sglang"
    assert m["target"] == {
        "sglang": "0.5.23",
        "sglang_releases": ["0.5.20", "0.5.21", "0.5.22", "0.5.23"],
        "sglang_versions": ">=0.5.20,<=0.5.23",
        "flashinfer": "0.7.2",
        "flashinfer_layouts": "0.6.18-0.7.4",
        "flashinfer_versions": ">=0.6.18,<0.7.5",
        "gpu_family": "sm100",
    }
    assert m["layers"][MIXTRAL]["tp_split"] == "padded"
    assert m["expert_parallel"].startswith("any EP size that divides the expert count")
    v = manifest(converted["vllm"])
    assert v["server"] == "vllm" and v["target"]["vllm"] == "0.33.0"
    assert "tp_split" not in v["layers"][MIXTRAL]
    # the same shapes, other bytes: rank 1 holds I rows 128-191 for SGLang, 96-191 for vLLM
    a = load_moe_layer(converted["sglang"], MIXTRAL, tp_rank=1)
    b = load_moe_layer(converted["vllm"], MIXTRAL, tp_rank=1)
    assert a["w13_weight"].shape == b["w13_weight"].shape
    assert not a["w13_weight"].equal(b["w13_weight"])


def test_config_json_and_the_card_say_how_to_serve_it(converted):
    qc = json.loads((converted["sglang"] / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "fi-convert"
    assert LAUNCH in qc["note"] and "vllm serve" not in qc["note"]
    card = model_card(manifest(converted["sglang"]), repo_id="org/mixtral-sglang")
    assert LAUNCH.replace("DIR", "org/mixtral-sglang") in card  # the repo id serves as is
    assert "--tp-size 2 --server sglang" in card
    assert "| target SGLang | 0.5.23 |" in card and "vllm serve" not in card
    assert "| SGLang releases holding these bytes | 0.5.20, 0.5.21, 0.5.22, 0.5.23 |" in card
    vcard = model_card(manifest(converted["vllm"]), repo_id="org/mixtral")
    assert "vllm serve org/mixtral" in vcard and "--server" not in vcard


def test_verify_proves_an_sglang_output(converted, ckpts):
    res = cli("verify", converted["sglang"], "--source", ckpts["mixtral"], "--full")
    assert res.exit_code == 0, res.stdout + res.stderr


def _tampered(converted, tmp_path, edit) -> Path:
    out = tmp_path / "out"
    shutil.copytree(converted["sglang"], out)
    m = manifest(out)
    edit(m)
    (out / MANIFEST_NAME).write_text(json.dumps(m))
    return out


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        # an SGLang output's manifest claiming vLLM: vLLM's target and split are not these
        (lambda m: m.update(server="vllm"), "target.sglang is not a field of the target"),
        (lambda m: m.pop("server"), "target.sglang is not a field of the target"),
        (lambda m: m.update(server="tgi"), "server is \"tgi\", server 'tgi' is not one"),
        (lambda m: m["layers"][MIXTRAL].pop("tp_split"), "tp_split is missing"),
    ],
)
def test_verify_catches_a_manifest_of_another_server(converted, tmp_path, edit, words):
    res = cli("verify", _tampered(converted, tmp_path, edit))
    assert res.exit_code == 1
    assert words in res.stdout + res.stderr, res.stdout + res.stderr


def test_verify_against_flashinfer_refuses_an_sglang_output(converted, ckpts):
    res = cli("verify", converted["sglang"], "--source", ckpts["mixtral"], "--against-flashinfer")
    assert res.exit_code == 1
    (line,) = lines(res.stderr)
    assert "an output for sglang, and --against-flashinfer re-derives vLLM 0.33's" in line
    assert "Traceback" not in res.stdout + res.stderr


def test_each_plugin_refuses_the_other_servers_output(converted):
    with pytest.raises(vllm_checks.PluginError, match="converted for sglang, whose layouts"):
        vllm_checks.check_manifest(
            manifest(converted["sglang"]), "OUT", tp_size=2, use_ep=False, vllm_version="0.33.0"
        )
    vllm_checks.check_manifest(  # the control
        manifest(converted["vllm"]), "OUT", tp_size=2, use_ep=False, vllm_version="0.33.0"
    )


def test_a_different_server_is_another_conversion(converted, ckpts, tmp_path):
    """The server is part of what a conversion is: an out-dir done for vLLM is not up to date
    for SGLang (the plan's key differs): it is kept unless --overwrite replaces it."""
    a = make_plan(ckpts["mixtral"], Options(tp_size=2))
    b = make_plan(ckpts["mixtral"], Options(tp_size=2, server="sglang"))
    assert a.key() != b.key()
    out = tmp_path / "out"
    shutil.copytree(converted["vllm"], out)
    args = ["convert", ckpts["mixtral"], out, "--tp-size", "2", "--server", "sglang"]
    res = cli(*args)
    assert res.exit_code == 1
    assert "holds a finished fi-convert output with other options" in res.stderr
    res = cli(*args, "--overwrite")
    assert res.exit_code == 0, res.stderr
    assert manifest(out)["server"] == "sglang"
    assert (out / MANIFEST_NAME).read_bytes() == (converted["sglang"] / MANIFEST_NAME).read_bytes()


# ---- refusals: one line, exit code 1, the fix named ----


@pytest.mark.parametrize(
    ("case", "args", "words"),
    [
        ("mixtral", ["--server", "tgi"], "server 'tgi' is not one fi-convert converts for"),
        (
            "mixtral",
            ["--server", "sglang==0.5.22"],
            "--server takes a server's name, not a release: drop '==0.5.22'. An output for "
            "--server sglang serves every sglang release proven to hold its layout",
        ),
        ("mixtral", ["--server", "vllm==0.31.0"], "drop '==0.31.0'"),
        (
            "mixtral",
            ["--server", "sglang", "--scheme", "fp8-tensor"],
            "--scheme fp8-tensor --backend trtllm --server sglang: BF16 experts: SGLang "
            "0.5.23 quantizes them itself on load (--quantization fp8, Fp8MoEMethod's online "
            "FP8), which lays out no FlashInfer kernel bytes (Triton on flashinfer_cutlass; on "
            "flashinfer_trtllm the weights unshuffled and no output scales); fi-convert writes "
            "SGLang's layout of ModelOpt FP8 checkpoints; servable for sglang instead: --scheme "
            "bf16 (trtllm, cutlass); or convert for vLLM (--server vllm)",
        ),
        (
            "ds",
            ["--server", "sglang", "--backend", "cutlass"],
            "--scheme fp8-block --backend cutlass --server sglang: SGLang 0.5.23 has no "
            "FlashInfer CUTLASS path for block FP8 (asked for flashinfer_cutlass, it runs its "
            "Triton MoE runner",
        ),
        (
            "oss",
            ["--server", "sglang", "--backend", "cutlass", "--tp-size", "4"],
            "model.layers.0.mlp.experts: I 192 at --tp-size 4: SGLang 0.5.23's SM90 CUTLASS "
            "MXFP4 path cannot load it (its gpt-oss loader slices ceil(I/32/TP)*32 rows into a "
            "buffer of I/TP rows); use --tp-size 1, 2, or --backend trtllm (SM100)",
        ),
        (
            "mixtral",
            ["--server", "sglang", "--scheme", "mxfp8"],
            "BF16 experts: SGLang quantizes them to MXFP8 on the GPU at load",
        ),
        (
            "mixtral",
            ["--server", "sglang", "--scheme", "mxfp8", "--backend", "cutlass"],
            "--scheme mxfp8 --backend cutlass: SGLang 0.5.23 has no FlashInfer CUTLASS path "
            "for MXFP8 experts (it runs them on FlashInfer TRT-LLM, or on its own kernels); use "
            "--backend trtllm",
        ),
        (
            "nv320",
            ["--server", "sglang"],
            "model.layers.1.mlp.experts: hidden size 320 is not a multiple of 128; SGLang 0.5.23 "
            "does not pad H for NVFP4 on FlashInfer TRT-LLM and its w2 scale shuffle asserts it "
            "(FlashInfer's get_shuffle_matrix_sf_a_row_indices), so SGLang cannot serve it on "
            "flashinfer_trtllm; use --backend cutlass (flashinfer_cutlass), or --server vllm "
            "(vLLM pads H to 256)",
        ),
        (
            "ct",
            ["--server", "sglang"],
            "compressed-tensors NVFP4: SGLang loads it with a method of its own",
        ),
    ],
)
def test_refusals(ckpts, tmp_path, case, args, words):
    res = cli("convert", ckpts[case], tmp_path / "out", *args, "--device", "cpu")
    assert res.exit_code == 1, res.stdout
    (line,) = lines(res.stderr)
    assert words in line
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_inspect_shows_what_each_server_gets(ckpts):
    res = cli("inspect", ckpts["mixtral"], "--tp-size", "2", "--server", "sglang")
    assert res.exit_code == 0, res.stderr
    got = lines(res.stdout)
    assert got[0].endswith("backend trtllm, tp 2, server sglang")
    at = got.index("servers (--server; bf16, trtllm, tp 2):")
    assert got[at + 1].startswith("  vllm: other bytes, first model.layers.0.block_sparse_moe")
    assert (
        'tp_split (the rows of I each TP rank holds) is "padded" for sglang, absent for vllm'
        in (got[at + 1])
    )
    # the vLLM releases that would hold its bytes (servers/vllm/releases.py)
    assert got[at + 2] == "    vllm_releases: 0.30.0, 0.31.0, 0.32.0, 0.33.0, 0.34.0"
    assert got[at + 3].startswith("  sglang: this plan; serve with `python -m sglang.launch_")
    cut = cli("inspect", ckpts["mixtral"], "--tp-size", "2", "--backend", "cutlass", "--json")
    servers = {s["server"]: s for s in json.loads(cut.stdout)["servers"]}
    assert servers["sglang"]["layout"] == (
        "the same bytes as for vllm (one output serves both: --server vllm,sglang)"
    )
    assert servers["sglang"]["serve"].endswith(
        "--moe-runner-backend flashinfer_cutlass --tp 2 --disable-shared-experts-fusion"
    )
    # (on TRT-LLM SGLang turns shared-expert fusion off itself: LAUNCH does not say it)


def test_fp8_block_for_sglang_converts_and_verifies(ckpts, tmp_path):
    """DeepSeek FP8 block on TRT-LLM for SGLang: MajorK, unshuffled, unclamped scales (the
    manifest says so, and verify re-plans it so); its bytes are proven in test_sglang.py."""
    out = tmp_path / "out"
    res = cli("convert", ckpts["ds"], out, "--server", "sglang", "--tp-size", "2")
    assert res.exit_code == 0, res.stderr
    lay = manifest(out)["layers"]["model.layers.1.mlp.experts"]["tensors"]
    assert lay["w13_weight"]["layout"] == "MajorK" and lay["w13_weight"]["shape_per_rank"] == [
        8,
        512,
        256,
    ]
    assert "min" not in lay["w13_weight_scale_inv"]
    res = cli("verify", out, "--source", ckpts["ds"], "--full")
    assert res.exit_code == 0, res.stdout + res.stderr
    t = load_moe_layer(out, "model.layers.1.mlp.experts", tp_rank=0)
    assert float(t["w13_weight_scale_inv"].min()) < 1e-10  # the source's 1e-23, kept
    res = cli("inspect", ckpts["ds"], "--tp-size", "2")
    got = lines(res.stdout)
    (line,) = [x for x in got if x.startswith("  sglang: ")]
    first = 'w13_weight: layout (the element order) is "BlockMajorK" for vllm, "MajorK" for sglang'
    assert f"other bytes, first model.layers.1.mlp.experts.{first}" in line


# ---- one output for both servers, where their bytes are the same ----


@pytest.mark.parametrize(("backend", "tp"), [("cutlass", 2), ("trtllm", 1)])
def test_one_output_for_both_servers(ckpts, tmp_path, backend, tp):
    """BF16 on CUTLASS at any TP, on TRT-LLM at TP 1: both servers' plans give the same layer
    entries, so one output declares both; its bytes are each server's own output's (each
    proven against that server in test_sglang.py / test_vllm.py), and each plugin accepts it."""
    from fi_convert.servers.sglang import checks as sglang_checks

    outs = {}
    for server in ("vllm,sglang", "vllm", "sglang"):
        outs[server] = tmp_path / server
        args = ["--backend", backend, "--tp-size", str(tp), "--server", server]
        res = cli("convert", ckpts["mixtral"], outs[server], *args)
        assert res.exit_code == 0, res.stderr
    m = manifest(outs["vllm,sglang"])
    assert (m["server"], m["servers"]) == ("vllm", ["vllm", "sglang"])
    assert m["target"] == manifest(outs["vllm"])["target"]
    assert m["targets"] == {s: manifest(outs[s])["target"] for s in ("vllm", "sglang")}
    assert m["layers"] == manifest(outs["vllm"])["layers"] == manifest(outs["sglang"])["layers"]
    for rank in range(tp):
        both = load_moe_layer(outs["vllm,sglang"], MIXTRAL, tp_rank=rank)
        for server in ("vllm", "sglang"):
            one = load_moe_layer(outs[server], MIXTRAL, tp_rank=rank)
            assert all(both[n].equal(one[n]) for n in one) and both.keys() == one.keys()
    res = cli("verify", outs["vllm,sglang"], "--source", ckpts["mixtral"], "--full")
    assert res.exit_code == 0, res.stdout + res.stderr
    qc = json.loads((outs["vllm,sglang"] / "config.json").read_text())["quantization_config"]
    assert "vllm serve DIR" in qc["note"] and "sglang.launch_server" in qc["note"]
    card = model_card(m, repo_id="org/both")
    assert "vllm serve org/both" in card and "sglang.launch_server" in card
    assert "| target vLLM | 0.33.0 |" in card and "| target SGLang | 0.5.23 |" in card
    assert "--server vllm,sglang" in card
    vllm_checks.check_manifest(m, "OUT", tp_size=tp, use_ep=False, vllm_version="0.33.0")
    vllm_checks.check_device(m, "OUT", flashinfer_version="0.7.2.post1", capability=(10, 0))
    flag = f"flashinfer_{backend}"
    sglang_checks.check_manifest(
        m, "OUT", tp_size=tp, moe_runner_backend=flag, sglang_version="0.5.23"
    )
    sglang_checks.check_device(m, "OUT", flashinfer_version="0.7.2", capability=(10, 0))
    with pytest.raises(
        sglang_checks.UnlistedRelease,
        match="proven for SGLang 0.5.20, .*0.5.23, this is SGLang 0.5.24",
    ):
        sglang_checks.check_manifest(
            m, "OUT", tp_size=tp, moe_runner_backend=flag, sglang_version="0.5.24"
        )


def test_both_servers_are_refused_where_their_bytes_differ(ckpts, tmp_path):
    res = cli("convert", ckpts["mixtral"], tmp_path / "o", "--server", "vllm,sglang", "-tp", "2")
    assert res.exit_code == 1
    (line,) = lines(res.stderr)
    assert line == (
        "error: --scheme bf16 --backend trtllm --server vllm,sglang: vllm and sglang hold other "
        "bytes of this checkpoint (first model.layers.0.block_sparse_moe.experts.w13_weight: "
        'tp_split (the rows of I each TP rank holds) is absent for vllm, "padded" for sglang); '
        "convert once for each (--server vllm, --server sglang)"
    )
    res = cli("convert", ckpts["ds"], tmp_path / "o", "--server", "sglang,vllm", "-tp", "2")
    assert res.exit_code == 1
    assert "first model.layers.1.mlp.experts.w13_weight: layout" in res.stderr
    res = cli("convert", ckpts["ds"], tmp_path / "o", "--server", "vllm,sglang", "-b", "cutlass")
    assert res.exit_code == 1
    assert "not for sglang: SGLang 0.5.23 has no FlashInfer CUTLASS path" in res.stderr


def test_verify_catches_a_second_server_whose_bytes_differ(converted, tmp_path):
    """A vLLM output (TRT-LLM, TP 2, I/TP padded) edited to declare SGLang too, with SGLang's
    target: verify re-plans the layer for SGLang and finds other bytes."""
    from fi_convert.servers.sglang.target import SGLANG_TARGET

    out = tmp_path / "out"
    shutil.copytree(converted["vllm"], out)
    m = manifest(out)
    m["servers"] = ["vllm", "sglang"]
    m["targets"] = {"vllm": m["target"], "sglang": SGLANG_TARGET.target_fields("bf16", "trtllm")}
    (out / MANIFEST_NAME).write_text(json.dumps(m))
    res = cli("verify", out)
    assert res.exit_code == 1
    assert "declared for sglang too, which holds other bytes" in res.stdout + res.stderr
    m["servers"] = ["vllm"]  # a list of one: not an output for several
    (out / MANIFEST_NAME).write_text(json.dumps(m))
    res = cli("verify", out)
    assert "not two or more servers starting with vllm" in res.stdout + res.stderr


def test_mxfp4_sm90_for_sglang_converts_and_verifies(ckpts, tmp_path):
    """gpt-oss MXFP4 on CUTLASS for SGLang (flashinfer_mxfp4 on SM90): its own layout (the
    manifest's layouts, sizes and family say so), verify re-plans it so, the launch line names
    SGLang's runner; vLLM's CUTLASS output of it is another (SM100) one. Its bytes are proven in
    test_sglang.py, its loading in test_sglang_plugin.py."""
    out, prefix = tmp_path / "out", "model.layers.1.mlp.experts"
    args = ("--server", "sglang", "--backend", "cutlass", "--tp-size", "2")
    res = cli("convert", ckpts["oss"], out, *args)
    assert res.exit_code == 0, res.stderr
    m = manifest(out)
    entry = m["layers"][prefix]
    assert (entry["padded_hidden_size"], entry["padded_intermediate_size_per_rank"]) == (512, 128)
    assert entry["tensors"]["w13_weight"]["layout"] == "sm90_mixed_interleave"
    assert entry["tensors"]["w2_weight_scale"]["layout"] == "sm90_scale_fold_64x128"
    assert entry["tensors"]["w13_weight_bias"]["dtype"] == "BF16"
    assert m["target"]["gpu_family"] == "sm90"
    res = cli("verify", out, "--source", ckpts["oss"], "--full")
    assert res.exit_code == 0, res.stdout + res.stderr
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert "--moe-runner-backend flashinfer_mxfp4 --tp 2" in qc["note"]
    res = cli("convert", ckpts["oss"], tmp_path / "both", *args[2:], "--server", "vllm,sglang")
    assert res.exit_code == 1 and "convert once for each" in res.stderr


def test_mxfp4_for_sglang_converts_and_verifies(ckpts, tmp_path):
    """gpt-oss MXFP4 on TRT-LLM for SGLang (its flashinfer_mxfp4 runner): vLLM's bytes but the
    scale padding (127, UE8M0 1.0) and the biases' names; verify re-plans it so; its bytes are
    proven in test_sglang.py, its loading in test_sglang_plugin.py."""
    out, prefix = tmp_path / "out", "model.layers.1.mlp.experts"
    res = cli("convert", ckpts["oss"], out, "--server", "sglang", "--tp-size", "2")
    assert res.exit_code == 0, res.stderr
    m = manifest(out)
    lay = m["layers"][prefix]["tensors"]
    assert lay["w13_weight_scale"]["pad"] == 127 and "w13_weight_bias" in lay
    res = cli("verify", out, "--source", ckpts["oss"], "--full")
    assert res.exit_code == 0, res.stdout + res.stderr
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert "--moe-runner-backend flashinfer_mxfp4 --tp 2" in qc["note"]
    card = model_card(m, repo_id="org/oss")
    assert "--moe-runner-backend flashinfer_mxfp4 --tp 2" in card
    vllm = tmp_path / "vllm"
    assert cli("convert", ckpts["oss"], vllm, "--tp-size", "2").exit_code == 0
    for rank in range(2):
        a, b = load_moe_layer(out, prefix, tp_rank=rank), load_moe_layer(vllm, prefix, tp_rank=rank)
        for name in ("w13_weight", "w2_weight"):
            assert a[name].equal(b[name])
        for ours, theirs in (("w13_weight_bias", "w13_bias"), ("w2_weight_bias", "w2_bias")):
            assert a[ours].equal(b[theirs])
        for name in ("w13_weight_scale", "w2_weight_scale"):
            d = a[name] != b[name]
            assert bool(d.any()) and bool((a[name][d] == 127).all()) and not b[name][d].any()
    res = cli("convert", ckpts["oss"], tmp_path / "o", "--server", "vllm,sglang")
    assert res.exit_code == 1
    assert "first model.layers.0.mlp.experts.w13_weight_scale" in res.stderr


def test_nvfp4_for_sglang_converts_and_verifies(ckpts, tmp_path):
    """ModelOpt NVFP4 on TRT-LLM for SGLang: H 384 unpadded (vLLM pads it to 512), I/TP 96
    padded to 128 and sharded by it, SGLang's scalars; verify re-plans it so; its bytes are
    proven in test_sglang.py, its loading in test_sglang_plugin.py."""
    out, prefix = tmp_path / "out", "model.layers.1.mlp.experts"
    res = cli("convert", ckpts["nv"], out, "--server", "sglang", "--tp-size", "2")
    assert res.exit_code == 0, res.stderr
    entry = manifest(out)["layers"][prefix]
    assert entry["tp_split"] == "padded" and entry["padded_hidden_size"] == 384
    lay = entry["tensors"]
    assert lay["w13_weight"]["shape_per_rank"] == [3, 256, 192]
    assert lay["w13_weight_scale_2"]["shape_per_rank"] == [3, 2]
    assert lay["w13_input_scale_quant"]["shape_per_rank"] == []
    res = cli("verify", out, "--source", ckpts["nv"], "--full")
    assert res.exit_code == 0, res.stdout + res.stderr
    res = cli("convert", ckpts["nv"], tmp_path / "o", "--server", "vllm,sglang")
    assert res.exit_code == 1
    assert "vllm and sglang hold other bytes" in res.stderr


def test_nvfp4_cutlass_h320_for_sglang_converts_and_verifies(ckpts, tmp_path):
    """ModelOpt NVFP4 on CUTLASS for SGLang, H 320 (the w2 scale swizzle pads its rows to 384):
    the swizzle apart, `w2_blockscale_swizzled`, beside `w2_weight_scale` as loaded; w13's
    swizzle (H/16 = 20 columns, no padding) in place; verify re-plans it so. Its bytes are
    proven in test_sglang.py, its loading in test_sglang_plugin.py."""
    out, prefix = tmp_path / "out", "model.layers.1.mlp.experts"
    res = cli("convert", ckpts["nv320"], out, "--server", "sglang", "--backend", "cutlass")
    assert res.exit_code == 0, res.stderr
    lay = manifest(out)["layers"][prefix]["tensors"]
    assert lay["w2_weight_scale"]["shape_per_rank"] == [3, 320, 12]
    assert lay["w2_weight_scale"]["layout"] == "MajorK"
    assert lay["w2_blockscale_swizzled"]["shape_per_rank"] == [3, 384, 12]
    assert lay["w13_weight_scale"]["shape_per_rank"] == [3, 384, 20]
    assert "w13_blockscale_swizzled" not in lay
    res = cli("verify", out, "--source", ckpts["nv320"], "--full")
    assert res.exit_code == 0, res.stdout + res.stderr


def test_nvfp4_with_a_swiglu_clamp_for_sglang_converts_and_verifies(ckpts, tmp_path):
    """ModelOpt NVFP4 with DeepSeek's config.json swiglu_limit on TRT-LLM for SGLang: the layer
    entry records the clamp (the block scales and alphas depend on it) and holds
    gemm1_clamp_limit; verify re-plans it with config.json's clamp and re-derives every byte
    from the source. Its bytes are proven in test_sglang.py, its loading in
    test_sglang_plugin.py."""
    out, prefix = tmp_path / "out", "model.layers.1.mlp.experts"
    res = cli("convert", ckpts["nvclamp"], out, "--server", "sglang", "--tp-size", "2")
    assert res.exit_code == 0, res.stderr
    entry = manifest(out)["layers"][prefix]
    assert entry["swiglu_limit"] == 10.0
    assert entry["tensors"]["gemm1_clamp_limit"]["shape_per_rank"] == [3]
    res = cli("verify", out, "--source", ckpts["nvclamp"], "--full")
    assert res.exit_code == 0, res.stdout + res.stderr
    res = cli("convert", ckpts["nvclamp"], tmp_path / "c", "--server", "sglang", "-b", "cutlass")
    assert res.exit_code == 0, res.stderr
    assert "swiglu_limit" not in manifest(tmp_path / "c")["layers"][prefix]


def test_mxfp8_for_sglang_converts_and_verifies(ckpts, tmp_path):
    """ModelOpt MXFP8 on TRT-LLM for SGLang: H 384 unpadded, I/TP 160 padded to 256 and
    sharded by it, the scale padding 0, SGLang's scale names; verify re-plans it so; its bytes
    are proven in test_sglang.py, its loading in test_sglang_plugin.py."""
    out, prefix = tmp_path / "out", "model.layers.0.mlp.experts"
    res = cli("convert", ckpts["mx8"], out, "--server", "sglang", "--tp-size", "2")
    assert res.exit_code == 0, res.stderr
    entry = manifest(out)["layers"][prefix]
    assert entry["tp_split"] == "padded" and entry["padded_hidden_size"] == 384
    lay = entry["tensors"]
    assert lay["w13_weight_scale_inv"]["pad"] == 0 and "w13_weight_scale" not in lay
    res = cli("verify", out, "--source", ckpts["mx8"], "--full")
    assert res.exit_code == 0, res.stdout + res.stderr
    res = cli("convert", ckpts["mx8"], tmp_path / "o", "--server", "vllm,sglang")
    assert res.exit_code == 1
    assert "vllm and sglang hold other bytes" in res.stderr


# ---- the rule one output for both servers rests on ----


def test_where_both_servers_plan_the_same_entries_their_bytes_are_the_same(ckpts, tmp_path):
    """`--server vllm,sglang` is allowed where the two servers' planned layer entries are the
    same (plan.first_difference): that rests on every layout variant showing in the entries.
    Over every checkpoint here, scheme, backend and TP 1 and 2, wherever both servers plan
    the conversion and no entry differs, each server's own conversion has the same bytes."""
    from fi_convert import Backend, SchemeName, convert
    from fi_convert.errors import FiConvertError
    from fi_convert.plan import first_difference

    same = 0
    for key, src in ckpts.items():
        for scheme in [s for s in SchemeName if s is not SchemeName.AUTO]:
            for backend in Backend:
                for tp in (1, 2):
                    plans = []
                    for server in ("vllm", "sglang"):
                        opts = Options(scheme, backend, tp, server=server)
                        try:
                            plans.append(make_plan(src, opts))
                        except FiConvertError:
                            break
                    if len(plans) < 2:
                        continue
                    names = ("vllm", "sglang")
                    if first_difference(plans[0].layers, plans[1].layers, names) is not None:
                        continue
                    same += 1
                    outs = {}
                    for server in names:
                        outs[server] = (
                            tmp_path / f"{key}-{scheme.value}-{backend.value}-{tp}-{server}"
                        )
                        convert(src, outs[server], Options(scheme, backend, tp, server=server))
                    for lp in plans[0].layers:
                        for rank in range(tp):
                            a = load_moe_layer(outs["vllm"], lp.prefix, tp_rank=rank)
                            b = load_moe_layer(outs["sglang"], lp.prefix, tp_rank=rank)
                            assert a.keys() == b.keys(), (key, scheme, backend, tp)
                            for n in a:
                                assert (
                                    a[n]
                                    .view(-1)
                                    .view(torch.uint8)
                                    .equal(b[n].view(-1).view(torch.uint8))
                                ), (key, scheme, backend, tp, lp.prefix, n, rank)
                    for out in outs.values():
                        shutil.rmtree(out)
    assert same >= 2  # (BF16 on CUTLASS at TP 1 and 2 at least: the rule is exercised)


def test_a_source_format_not_proven_for_sglang_is_refused_at_plan_time(ckpts, tmp_path):
    """Compressed-tensors MXFP8: SGLang reads it with another method than ModelOpt MXFP8's,
    whose layout is not proven: refused before anything is written, while ModelOpt MXFP8
    converts for SGLang. (vLLM's bytes are proven, but vLLM builds
    CompressedTensorsW8A8Mxfp8MoEMethod for it, whose kernel setup its plugin does not run
    yet: refused for vLLM too unless --allow-unservable.)"""
    spec = Spec("qwen3-moe", layers=1, experts=3, hidden=384, intermediate=320, quant="mxfp8-ct")
    ct = write_checkpoint(tmp_path / "mx8-ct", spec)
    res = cli("convert", ct, tmp_path / "o", "--server", "sglang", "--device", "cpu")
    assert res.exit_code == 1, res.stdout
    (line,) = lines(res.stderr)
    assert "--scheme mxfp8 --backend trtllm --server sglang: a compressed-tensors MXFP8" in line
    assert "(--server vllm)" in line and not (tmp_path / "o").exists()
    res = cli("inspect", ct)  # for vLLM, refused as convert is
    assert res.exit_code == 1 and "CompressedTensorsW8A8Mxfp8MoEMethod" in res.stderr
    res = cli("inspect", ct, "--allow-unservable")  # each server's line: what it would get
    (said,) = [x for x in lines(res.stdout) if x.startswith("  sglang: ")]
    assert said.startswith("  sglang: cannot: a compressed-tensors MXFP8 source")
    res = cli("convert", ct, tmp_path / "v", "--server", "vllm", "--device", "cpu")
    assert res.exit_code == 1 and "CompressedTensorsW8A8Mxfp8MoEMethod" in res.stderr
    for src, server, out, *more in [
        (ct, "vllm", "v", "--allow-unservable"),
        (ckpts["mx8"], "sglang", "s"),
    ]:
        res = cli("convert", src, tmp_path / out, "--server", server, "--device", "cpu", *more)
        assert res.exit_code == 0, res.stderr


@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_fp8_tensor_for_sglang_converts_and_verifies(ckpts, tmp_path, backend):
    """ModelOpt FP8 for SGLang: on TRT-LLM I/TP padded to 128 (vLLM: 16), on CUTLASS w13
    [gate; up] and SGLang's scale names, SGLang's scalars on both (the entry says so); verify
    re-plans it so; one output for both servers is refused, naming the first tensor; inspect
    says it per server. Its bytes are proven in test_sglang.py, its loading in
    test_sglang_plugin.py."""
    out, prefix = tmp_path / "out", "model.layers.0.mlp.experts"
    args = ["--server", "sglang", "--backend", backend, "--tp-size", "2"]
    res = cli("convert", ckpts["fp8t"], out, *args)
    assert res.exit_code == 0, res.stderr
    entry = manifest(out)["layers"][prefix]
    assert entry["padded_intermediate_size_per_rank"] == 128
    lay = entry["tensors"]
    assert lay["w13_input_scale"]["formula"] == "sglang"
    if backend == "cutlass":
        assert lay["w13_weight"]["row_order"] == "gate_up"
        assert {"fc1_dequant", "fc2_quant", "fc2_dequant", "fc1_input_dequant"} <= set(lay)
        assert "g1_alphas" not in lay
    res = cli("verify", out, "--source", ckpts["fp8t"], "--full")
    assert res.exit_code == 0, res.stdout + res.stderr
    res = cli("convert", ckpts["fp8t"], tmp_path / "o", *args[2:], "--server", "vllm,sglang")
    assert res.exit_code == 1
    first = "w13_weight: row_order" if backend == "cutlass" else "w13_input_scale: formula"
    assert "vllm and sglang hold other bytes" in res.stderr
    assert f"first {prefix}.{first}" in res.stderr
    res = cli("inspect", ckpts["fp8t"], "--backend", backend, "--tp-size", "2")
    (said,) = [x for x in lines(res.stdout) if x.startswith("  sglang: ")]
    assert said.startswith(f"  sglang: other bytes, first {prefix}.{first}"), said


def test_fp8_tensor_mixtral_on_trtllm_is_refused_for_sglang(tmp_path):
    """SGLang's Mixtral declares no routing method, so its ModelOpt FP8 method runs Triton on
    flashinfer_trtllm (tests/test_sglang_plugin.py builds it): refused at plan time, naming
    CUTLASS, which converts."""
    spec = Spec("mixtral", layers=1, experts=3, hidden=128, intermediate=256, quant="fp8-tensor")
    src = write_checkpoint(tmp_path / "src", spec)
    res = cli("convert", src, tmp_path / "o", "--server", "sglang", "--device", "cpu")
    assert res.exit_code == 1, res.stdout
    (line,) = lines(res.stderr)
    assert "--scheme fp8-tensor --backend trtllm --server sglang: SGLang 0.5.23's Mixtral" in line
    assert "use --backend cutlass" in line and not (tmp_path / "o").exists()
    args = ["--server", "sglang", "--backend", "cutlass", "--device", "cpu"]
    assert cli("convert", src, tmp_path / "c", *args).exit_code == 0


def test_fp8_tensor_sources_sglang_reads_otherwise_are_refused_at_plan_time(tmp_path):
    """Compressed-tensors FP8 (tensor strategy): SGLang reads it with CompressedTensorsW8A8Fp8MoE,
    which has no FlashInfer per-tensor path: refused for SGLang before anything is written,
    converted for vLLM; a quant_method fp8 per-tensor source is refused too (another method,
    not proven)."""
    from fi_convert.servers.sglang.target import SGLANG_TARGET

    spec = Spec(
        "qwen3-moe", layers=1, experts=3, hidden=128, intermediate=256, quant="fp8-tensor-ct"
    )
    ct = write_checkpoint(tmp_path / "ct", spec)
    for backend in ("trtllm", "cutlass"):
        res = cli("convert", ct, tmp_path / "o", "--server", "sglang", "--backend", backend)
        assert res.exit_code == 1, res.stdout
        (line,) = lines(res.stderr)
        assert f"--scheme fp8-tensor --backend {backend} --server sglang: a compressed-" in line
        assert "CompressedTensorsW8A8Fp8MoE" in line and "(--server vllm)" in line
        assert not (tmp_path / "o").exists()
    res = cli("inspect", ct)
    (said,) = [x for x in lines(res.stdout) if x.startswith("  sglang: ")]
    assert said.startswith("  sglang: cannot: a compressed-tensors FP8 source")
    assert cli("convert", ct, tmp_path / "v", "--device", "cpu").exit_code == 0
    why = SGLANG_TARGET.refuses_source("fp8-tensor", "trtllm", "fp8")
    assert why and "Fp8MoEMethod" in why
    assert SGLANG_TARGET.refuses_source("fp8-tensor", "trtllm", "modelopt") is None


def test_fp8_tensor_without_activation_scales_is_refused_for_sglang(tmp_path):
    """A ModelOpt FP8 source without input_scale: SGLang's method would run with the 1.0 it
    allocates its input scales with; refused for SGLang in one line naming the layer."""
    from safetensors.torch import load_file, save_file

    spec = Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=256, quant="fp8-tensor")
    src = write_checkpoint(tmp_path / "dyn", spec)
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for shard in src.glob("*.safetensors"):
        t = load_file(shard)
        save_file({k: v for k, v in t.items() if "input_scale" not in k}, shard, {"format": "pt"})
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if "input_scale" not in k}
    index_path.write_text(json.dumps(index))
    res = cli("convert", src, tmp_path / "o", "--server", "sglang", "--device", "cpu")
    assert res.exit_code == 1, res.stdout
    (line,) = lines(res.stderr)
    assert "model.layers.0.mlp.experts: no static activation scales (input_scale); SGLang" in line

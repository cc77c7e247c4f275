"""fi_convert/cli/: end-to-end tests of the `fi-convert` command on small synthetic checkpoints.

A few tests run the installed console script as a real subprocess (the exact user-facing
form `fi-convert MODEL_DIR OUT_DIR --scheme ...`); the rest drive `fi_convert.cli.app`
in-process through typer's CliRunner, which needs the explicit `convert` subcommand
(the default-command rewriting lives in `fi_convert.cli.main`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from fi_convert.cli import app, main
from fi_convert.cli._options import parse_size
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import ANSI_RE, cli

# the installed console script (what `make install` puts in the venv); where the package is
# only on PYTHONPATH (the GPU machine), the same entry point through `python -m fi_convert`
_SCRIPT = Path(sys.executable).parent / "fi-convert"
FI_CONVERT = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "fi_convert"]
MANIFEST = "fi-convert-manifest.json"
INDEX = "model.safetensors.index.json"
SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json")
SHARD_RE = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")

SPECS = {
    "deepseek-v3": Spec(
        family="deepseek-v3", layers=3, dense_layers=1, experts=4, hidden=256, intermediate=256
    ),
    "qwen3-moe": Spec(family="qwen3-moe", layers=2, experts=4, hidden=128, intermediate=128),
    "qwen3-moe-fused": Spec(
        family="qwen3-moe-fused", layers=2, experts=4, hidden=128, intermediate=256
    ),
    "mixtral": Spec(family="mixtral", layers=2, experts=5, hidden=128, intermediate=128),
}
# Regular expressions of the source's routed-expert tensors, per family.
EXPERT_RE = {
    "deepseek-v3": re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\."),
    "qwen3-moe": re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\."),
    "qwen3-moe-fused": re.compile(r"\.mlp\.experts\.(gate_up_proj|down_proj)$"),
    "mixtral": re.compile(r"\.block_sparse_moe\.experts\.\d+\.w[123]\."),
}
SCHEME = {
    "deepseek-v3": "fp8-block",
    "qwen3-moe": "bf16",
    "qwen3-moe-fused": "bf16",
    "mixtral": "bf16",
}


# ----------------------------------------------------------------------------- helpers


def _clean(s: str) -> str:
    return ANSI_RE.sub("", s)


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FI_CONVERT_DEBUG"}
    return subprocess.run(
        [*FI_CONVERT, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a folder's safetensors shards, keyed by name (no duplicates allowed)."""
    out: dict[str, torch.Tensor] = {}
    for p in sorted(folder.glob("*.safetensors")):
        with safe_open(p, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                assert name not in out, f"{name} in two shards"
                out[name] = f.get_tensor(name)
    return out


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def check_output_complete(src: Path, out: Path) -> dict:
    """Everything a finished output folder must hold; returns the manifest."""
    names = {p.name for p in out.iterdir()}
    assert MANIFEST in names and INDEX in names
    assert not (out / ".fi-convert").exists(), "state dir left behind after success"
    assert not [n for n in names if n.endswith((".tmp", ".fi-convert-tmp"))]
    for side in SIDE_FILES:
        assert (out / side).read_bytes() == (src / side).read_bytes(), side
    # config.json: the source's, but for the quantization method no stock server loads
    ours, theirs = (json.loads((d / "config.json").read_text()) for d in (out, src))
    marker = ours.pop("quantization_config")
    assert marker["quant_method"] == "fi-convert"
    assert marker["source_quantization_config"] == theirs.pop("quantization_config", None)
    assert ours == theirs

    shards = sorted(n for n in names if n.endswith(".safetensors"))
    assert shards, "no output shards"
    for k, name in enumerate(shards, start=1):
        m = SHARD_RE.match(name)
        assert m, f"badly named shard {name}"
        assert (int(m[1]), int(m[2])) == (k, len(shards))

    index = json.loads((out / INDEX).read_text())
    total = 0
    held: dict[str, str] = {}
    for name in shards:
        with safe_open(out / name, framework="pt") as f:
            for t in f.keys():  # noqa: SIM118
                x = f.get_tensor(t)
                total += x.numel() * x.element_size()
                held[t] = name
    assert index["metadata"]["total_size"] == total
    assert index["weight_map"] == held

    manifest = json.loads((out / MANIFEST).read_text())
    assert set(manifest["files"]) == names - {MANIFEST}
    return manifest


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("src")
    return {fam: write_checkpoint(base / fam, spec) for fam, spec in SPECS.items()}


@pytest.fixture(scope="module")
def converted(ckpts, tmp_path_factory) -> dict[str, Path]:
    """Each family converted once with its own scheme (in-process, default options)."""
    base = tmp_path_factory.mktemp("out")
    outs = {}
    for fam, src in ckpts.items():
        out = base / fam
        res = cli("convert", src, out, "--scheme", SCHEME[fam], "--device", "cpu")
        assert res.exit_code == 0, res.output
        outs[fam] = out
    return outs


# ------------------------------------------------------------ the console script itself


@pytest.mark.parametrize(("family", "scheme"), [("deepseek-v3", "fp8-block"), ("mixtral", "bf16")])
def test_console_script_converts(ckpts, tmp_path, family, scheme):
    src, out = ckpts[family], tmp_path / "out"
    proc = run_script(src, out, "--scheme", scheme)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "done" in proc.stdout
    manifest = check_output_complete(src, out)
    assert manifest["scheme"] == scheme
    assert manifest["tp_size"] == 1
    assert manifest["backend"] == "trtllm"


def test_console_script_json_stdout_is_only_json(ckpts, tmp_path):
    proc = run_script(ckpts["deepseek-v3"], tmp_path / "out", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)  # fails if anything else is on stdout
    assert summary["scheme"] == "fp8-block"
    assert summary["scheme_detected"] is True
    assert summary["tp_size"] == 1
    assert (tmp_path / "out" / MANIFEST).is_file()


_LEAVE = """
import atexit, sys
from fi_convert.cli import main
atexit.register(lambda: print("atexit ran", flush=True))
sys.argv = ["fi-convert", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("ok", [True, False])
def test_the_process_exits_at_once_with_its_status_and_all_said(ckpts, tmp_path, ok):
    """The console script leaves without the interpreter's teardown once torch is loaded
    (about a second on a 2-core runner): its exit status, stdout and stderr are kept and
    atexit handlers still run."""
    out = tmp_path / "out"
    src = ckpts["deepseek-v3"] if ok else tmp_path / "missing"
    if not ok:
        src.mkdir()  # a folder without a checkpoint: an error after torch was imported
    args = [str(src), str(out), "--scheme", "fp8-block", "--json"]
    r = subprocess.run([sys.executable, "-c", _LEAVE, *args], capture_output=True, text=True)
    assert "atexit ran" in r.stdout
    if ok:
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.replace("atexit ran", ""))["scheme"] == "fp8-block"
        check_output_complete(src, out)
    else:
        assert r.returncode == 1, r.stderr
        assert "error:" in r.stderr and "Traceback" not in r.stderr
        assert not (out / MANIFEST).exists()


def test_leave_now_exits_as_system_exit_would(tmp_path):
    code = (
        "import atexit, sys\n"
        "from fi_convert.cli import _process\n"
        "atexit.register(lambda: sys.stdout.write('bye'))\n"
        "sys.stdout.write('unflushed ')\n"
        "_process._leave_now(sys.argv[1] if sys.argv[1] != 'none' else None)\n"
    )
    for arg, status in (("none", 0), ("a message", 1)):
        r = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True)
        assert r.returncode == status
        assert r.stdout == "unflushed bye"
        assert r.stderr == ("a message\n" if status else "")


def test_help_and_usage_errors_do_not_import_torch(tmp_path):
    """`--help`, `version` and a mistyped option answer without importing torch (seconds on a
    small machine); the library's names still load on use."""
    code = (
        "import sys\n"
        "from fi_convert.cli import main\n"
        "for argv in (['--help'], ['convert', '--help'], ['version'], ['m', 'o', '-s', 'x']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, 2), (argv, e.code)\n"
        "assert 'torch' not in sys.modules, 'the CLI imported torch before a command needed it'\n"
        "import fi_convert, fi_convert.pipeline\n"
        "assert callable(fi_convert.convert) and fi_convert.Options().max_memory > 0\n"
        "from fi_convert import convert\n"
        "assert convert is fi_convert.pipeline.convert\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout and "fp8-block" in r.stdout


def test_every_option_names_its_flags():
    """Each option spells out its flags ("--device", "--fsync/--no-fsync"): typer before 0.29
    derives a nameless option's flag from its metavar when the two match (metavar DEVICE gave
    `--DEVICE`, so `--device` was "no such option" on the GPU machine's typer 0.27.2)."""
    import ast

    import fi_convert.cli as cli

    options = [  # every typer.Option(...) of the CLI's modules (in aliases and parameters)
        (f"{f.name}:{c.lineno}", c)
        for f in Path(cli.__file__).parent.glob("*.py")
        for c in ast.walk(ast.parse(f.read_text()))
        if isinstance(c, ast.Call) and getattr(c.func, "attr", None) == "Option"
    ]
    assert len(options) > 20  # the walk found the commands' options
    for name, call in options:
        first = call.args[0] if call.args else None
        flags = first.value if isinstance(first, ast.Constant) else None
        assert isinstance(flags, str) and flags.startswith("--"), f"{name}: no flag names"
    # and what click was given: lower-case long flags only, each once per command
    from typer.main import get_command

    for sub in get_command(app).commands.values():
        longs = [o for p in sub.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
        assert all(o == o.lower() for o in longs), (sub.name, longs)
        assert len(longs) == len(set(longs)), (sub.name, longs)


def test_main_inserts_default_command(ckpts, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main([str(ckpts["mixtral"]), str(out), "--scheme", "bf16", "--json"])
    assert exc.value.code in (0, None)
    assert json.loads(capsys.readouterr().out)["scheme"] == "bf16"
    check_output_complete(ckpts["mixtral"], out)


# ------------------------------------------------------------------- options and output


@pytest.mark.parametrize(("family", "scheme"), [("deepseek-v3", "fp8-block"), ("mixtral", "bf16")])
def test_auto_reports_detected_scheme(ckpts, tmp_path, family, scheme):
    res = cli("convert", ckpts[family], tmp_path / "out", "--scheme", "auto")
    assert res.exit_code == 0, res.output
    assert f"detected {scheme}" in _clean(res.stderr)
    assert f"detected {scheme}" not in res.stdout
    assert json.loads((tmp_path / "out" / MANIFEST).read_text())["scheme"] == scheme


def test_json_summary(ckpts, tmp_path):
    res = cli("convert", ckpts["deepseek-v3"], tmp_path / "out", "--json", "--device", "cpu")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["scheme"] == "fp8-block"
    assert s["tp_size"] == 1
    assert s["backend"] == "trtllm"
    assert s["device"] == "cpu"
    assert s["moe_layers"] == 2
    assert s["num_experts"] == 4
    assert s["manifest"] == MANIFEST
    assert s["files"] == len(json.loads((tmp_path / "out" / MANIFEST).read_text())["files"])
    assert "detected" not in res.stderr


def test_inspect_prints_plan_and_writes_nothing(ckpts, tmp_path):
    src = ckpts["deepseek-v3"]
    before = tree(src)
    res = cli("inspect", src)
    assert res.exit_code == 0, res.output
    text = _clean(res.stdout)
    assert "deepseek-v3" in text
    assert "fp8-block" in text
    assert "w13_weight" in text and "w2_weight_scale_inv" in text
    assert "2 MoE layer(s)" in text
    assert tree(src) == before


def test_inspect_json(ckpts):
    res = cli("inspect", ckpts["mixtral"], "--json", "--tp-size", "2")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["scheme"] == "bf16"
    assert s["family"] == "mixtral"
    assert s["tp_size"] == 2
    assert s["moe_layers"] == 2
    assert s["num_experts"] == 5
    lay = s["layers"]["model.layers.0.block_sparse_moe.experts"]
    assert lay["intermediate_size_per_rank"] == 64
    assert lay["padded_intermediate_size_per_rank"] == 128
    assert set(lay["tensors"]) == {"w13_weight", "w2_weight"}


@pytest.mark.parametrize("as_json", [False, True])
def test_dry_run_writes_nothing(ckpts, tmp_path, as_json):
    src, out = ckpts["deepseek-v3"], tmp_path / "out"
    before = tree(src)
    res = cli("convert", src, out, "--dry-run", *(["--json"] if as_json else []))
    assert res.exit_code == 0, res.output
    if as_json:
        s = json.loads(res.stdout)
        from fi_convert import Options, make_plan

        assert s["scheme"] == "fp8-block"
        assert s["output_shards"] == len(make_plan(src, Options()).shards)
    else:
        assert "w13_weight" in res.stdout and "fp8-block" in res.stdout
    assert not out.exists()
    assert tree(src) == before


def test_tp_size_2(ckpts, tmp_path):
    out = tmp_path / "out"
    res = cli("convert", ckpts["deepseek-v3"], out, "--tp-size", "2", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["tp_size"] == 2
    m = check_output_complete(ckpts["deepseek-v3"], out)
    assert m["tp_size"] == 2
    lay = m["layers"]["model.layers.1.mlp.experts"]
    assert lay["intermediate_size_per_rank"] == 128
    t = read_tensors(out)
    # [tp, E, K/128, 2*I/tp, 128] for TRT-LLM BlockMajorK
    assert tuple(t["model.layers.1.mlp.experts.w13_weight"].shape) == (2, 4, 2, 256, 128)
    assert tuple(t["model.layers.1.mlp.experts.w13_weight_scale_inv"].shape) == (2, 4, 2, 2)


@pytest.mark.parametrize(
    ("family", "shapes"),
    [
        ("mixtral", {"w13_weight": (1, 5, 256, 128), "w2_weight": (1, 5, 128, 128)}),
        (
            "deepseek-v3",
            {
                "w13_weight": (1, 4, 512, 256),
                "w2_weight": (1, 4, 256, 256),
                "w13_weight_scale_inv": (1, 4, 4, 2),
                "w2_weight_scale_inv": (1, 4, 2, 2),
            },
        ),
    ],
)
def test_backend_cutlass(ckpts, tmp_path, family, shapes):
    out = tmp_path / "out"
    res = cli("convert", ckpts[family], out, "--scheme", SCHEME[family], "--backend", "cutlass")
    assert res.exit_code == 0, res.output
    m = check_output_complete(ckpts[family], out)
    assert m["backend"] == "cutlass"
    prefix = "model.layers.1." + ("block_sparse_moe" if family == "mixtral" else "mlp")
    lay = m["layers"][f"{prefix}.experts"]
    assert lay["tensors"]["w13_weight"]["layout"] == "MajorK"
    t = read_tensors(out)
    for name, shape in shapes.items():
        assert tuple(t[f"{prefix}.experts.{name}"].shape) == shape, name


def test_device_cpu(ckpts, tmp_path):
    res = cli("convert", ckpts["qwen3-moe"], tmp_path / "out", "--device", "cpu", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["device"] == "cpu"


def test_invalid_scheme_is_usage_error(ckpts, tmp_path):
    out = tmp_path / "out"
    res = cli("convert", ckpts["mixtral"], out, "--scheme", "nope")
    assert res.exit_code == 2
    assert "nope" in res.output
    assert not out.exists()


def test_tp_size_zero_is_usage_error(ckpts, tmp_path):
    res = cli("convert", ckpts["mixtral"], tmp_path / "o", "-tp", "0")
    assert res.exit_code == 2
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ content of outputs


@pytest.mark.parametrize("family", list(SPECS))
def test_passthrough_byte_identical_and_experts_replaced(ckpts, converted, family):
    src_t, out_t = read_tensors(ckpts[family]), read_tensors(converted[family])
    expert = EXPERT_RE[family]
    source_experts = {n for n in src_t if expert.search(n)}
    passthrough = set(src_t) - source_experts
    assert source_experts and passthrough
    # the families' non-expert tensors that must survive unchanged
    must = {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"}
    if family == "mixtral":
        must |= {"model.layers.1.block_sparse_moe.gate.weight"}
    else:
        must |= {"model.layers.1.mlp.gate.weight"}
    if family == "deepseek-v3":
        must |= {
            "model.layers.1.mlp.shared_experts.gate_proj.weight",
            "model.layers.1.mlp.shared_experts.down_proj.weight_scale_inv",
            "model.layers.1.mlp.gate.e_score_correction_bias",
            "model.layers.0.mlp.gate_proj.weight",  # dense layer
            "model.layers.0.mlp.down_proj.weight_scale_inv",
            "model.layers.2.self_attn.q_proj.weight_scale_inv",
        }
    assert must <= passthrough
    for name in sorted(passthrough):
        assert name in out_t, f"passthrough {name} missing from output"
        a, b = src_t[name], out_t[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(raw_bytes(a), raw_bytes(b)), f"{name} changed"
    leaked = source_experts & set(out_t)
    assert not leaked, f"source expert tensors in output: {sorted(leaked)[:3]}"
    produced = set(out_t) - passthrough
    prefix = "block_sparse_moe" if family == "mixtral" else "mlp"
    first = 1 if family == "deepseek-v3" else 0
    want = {"w13_weight", "w2_weight"}
    if family == "deepseek-v3":
        want |= {"w13_weight_scale_inv", "w2_weight_scale_inv"}
    layers = range(first, SPECS[family].layers)
    assert produced == {f"model.layers.{k}.{prefix}.experts.{w}" for k in layers for w in want}


def test_manifest_hashes_match_files(converted):
    for out in converted.values():
        m = json.loads((out / MANIFEST).read_text())
        assert m["format"] == "fi-convert"
        on_disk = {p.name for p in out.iterdir() if p.is_file()} - {MANIFEST}
        assert set(m["files"]) == on_disk
        for name, meta in m["files"].items():
            p = out / name
            assert meta["size"] == p.stat().st_size, name
            assert meta["sha256"] == sha256(p), name


def test_manifest_has_no_absolute_paths(ckpts, converted):
    text = (converted["deepseek-v3"] / MANIFEST).read_text()
    assert str(ckpts["deepseek-v3"]) not in text
    assert str(converted["deepseek-v3"]) not in text


def test_verify_ok(converted):
    res = cli("verify", converted["deepseek-v3"])
    assert res.exit_code == 0, res.output
    assert "ok" in res.stdout
    res = cli("verify", converted["deepseek-v3"], "--json")
    assert res.exit_code == 0
    v = json.loads(res.stdout)
    assert v["ok"] is True and v["problems"] == []


def test_verify_detects_flipped_byte(converted, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(converted["mixtral"], out)
    shard = next(out.glob("model-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))

    res = cli("verify", out)
    assert res.exit_code == 1
    assert shard.name in _clean(res.stderr)
    assert "Traceback" not in res.output

    res = cli("verify", out, "--json")
    assert res.exit_code == 1
    v = json.loads(res.stdout)
    assert v["ok"] is False
    assert len(v["problems"]) == 1 and shard.name in v["problems"][0]


def test_verify_detects_missing_file(converted, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(converted["qwen3-moe"], out)
    (out / "tokenizer.json").unlink()
    res = cli("verify", out)
    assert res.exit_code == 1
    assert "tokenizer.json" in _clean(res.stderr)


# ----------------------------------------------------------- determinism and re-running


def test_two_runs_give_identical_bytes(ckpts, tmp_path):
    src = ckpts["deepseek-v3"]
    for name in ("a", "b"):
        res = cli("convert", src, tmp_path / name, "--scheme", "fp8-block")
        assert res.exit_code == 0, res.output
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert MANIFEST in a
    assert set(a) == set(b)
    for name in a:
        assert a[name] == b[name], f"{name} differs between two runs"


def test_rerun_into_finished_out_dir(ckpts, tmp_path):
    src, out = ckpts["qwen3-moe-fused"], tmp_path / "out"
    res = cli("convert", src, out, "--scheme", "bf16")
    assert res.exit_code == 0, res.output
    first = tree(out)
    res = cli("convert", src, out, "--scheme", "bf16")
    assert res.exit_code == 0, res.output
    assert tree(out) == first
    assert cli("verify", out).exit_code == 0


def test_different_families_detect_and_convert(ckpts, converted):
    for fam, out in converted.items():
        m = check_output_complete(ckpts[fam], out)
        assert m["scheme"] == SCHEME[fam]
        assert m["source"]["family"] == ("qwen3-moe" if fam.startswith("qwen3") else fam)


@pytest.mark.parametrize(
    "text, nbytes",
    [
        ("1000000", 1_000_000),
        ("5GB", 5 * 10**9),  # as Hugging Face's max_shard_size
        ("4GiB", 4 * 2**30),
        ("4 gib", 4 * 2**30),
        ("1.5M", 3 * 2**19),
        ("512KiB", 2**19),
        ("2T", 2 * 2**40),
        ("0", 0),
    ],
)
def test_sizes_take_units(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "GiB", "4Gx", "-1G", "4 GiBs", "nan", "inf", "1e3X"])
def test_bad_sizes_say_what_a_size_is(ckpts, tmp_path, text):
    res = cli("convert", ckpts["deepseek-v3"], tmp_path / "out", "--max-memory", text)
    assert res.exit_code == 2
    assert "not a size: give bytes" in res.stderr and "4GiB" in res.stderr
    assert not (tmp_path / "out").exists()


def test_rerun_with_other_sharding_leaves_no_stale_shards(ckpts, tmp_path):
    src, out = ckpts["deepseek-v3"], tmp_path / "out"
    res = cli("convert", src, out, "--scheme", "fp8-block", "--max-shard-size", "1MB")
    assert res.exit_code == 0, res.output
    assert len(list(out.glob("*.safetensors"))) > 1
    res = cli("convert", src, out, "--scheme", "fp8-block")
    assert res.exit_code == 0, res.output
    assert cli("verify", out).exit_code == 0
    named = set(json.loads((out / INDEX).read_text())["weight_map"].values())
    on_disk = {p.name for p in out.glob("*.safetensors")}
    assert on_disk == named, f"stale shards: {sorted(on_disk - named)}"

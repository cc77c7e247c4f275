"""fi_convert/errors.py and the command's one error mapping (fi_convert/cli/_errors.py): each user
error is exit code 1, one `error:` line on stderr naming the culprit, no traceback, and never a
manifest in the out-dir. Plus the library's exception classes for a few cases."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

import fi_convert
from fi_convert import (
    FiConvertError,
    LayoutError,
    ManifestError,
    Options,
    OutputError,
    SchemeMismatchError,
    SchemeName,
    SourceError,
)
from fi_convert.schemes import REGISTRY
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import ANSI_RE, cli
from .test_cli import FI_CONVERT

MANIFEST = "fi-convert-manifest.json"
INDEX = "model.safetensors.index.json"

DS = Spec(family="deepseek-v3", layers=3, dense_layers=1, experts=6, hidden=256, intermediate=256)
MX = Spec(family="mixtral", layers=2, experts=4, hidden=128, intermediate=128)
# First MoE layer of each synthetic family.
DS_L = "model.layers.1.mlp.experts"
MX_L = "model.layers.0.block_sparse_moe.experts"


# ----------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("pristine")
    return {
        "ds": write_checkpoint(base / "ds", DS),
        "mx": write_checkpoint(base / "mx", MX),
        "mx96": write_checkpoint(
            base / "mx96", Spec(family="mixtral", layers=2, experts=4, hidden=96, intermediate=128)
        ),
    }


@pytest.fixture
def ckpt(pristine, tmp_path) -> Callable[[str], Path]:
    """A fresh, writable copy of a pristine checkpoint."""

    def make(kind: str) -> Path:
        dst = tmp_path / f"model-{kind}"
        shutil.copytree(pristine[kind], dst)
        return dst

    return make


def error_line(res, *needles: str, out: Path | None = None) -> str:
    """Assert `res` is a clean user error; returns its one stderr line."""
    exc = res.exception
    assert exc is None or isinstance(exc, SystemExit), f"uncaught {exc!r}"
    assert res.exit_code == 1, res.output
    stderr = ANSI_RE.sub("", res.stderr)
    assert "Traceback" not in stderr and "Traceback" not in res.stdout
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one stderr line, got {lines}"
    line = lines[0]
    assert line.startswith("error:"), line
    for n in needles:
        assert n in line, f"{n!r} not in {line!r}"
    assert res.stdout == ""
    if out is not None:
        assert not (out / MANIFEST).exists()
    return line


def convert(model: Path, out: Path, *args: str):
    return cli("convert", model, out, *args)


def load_index(root: Path) -> dict:
    return json.loads((root / INDEX).read_text())


def save_index(root: Path, index: dict) -> None:
    (root / INDEX).write_text(json.dumps(index, indent=2))


def drop_tensors(root: Path, names: set[str]) -> None:
    """Rewrite the shards holding `names` without them, and the index to match."""
    index = load_index(root)
    wm = index["weight_map"]
    assert names <= set(wm), sorted(names - set(wm))
    for shard in sorted({wm[n] for n in names}):
        tensors = load_file(root / shard)
        for n in names:
            tensors.pop(n, None)
        save_file(tensors, root / shard, metadata={"format": "pt"})
    for n in names:
        del wm[n]
    save_index(root, index)


def shard_of(root: Path, tensor: str) -> Path:
    return root / load_index(root)["weight_map"][tensor]


# -------------------------------------------------------------- model folder problems


@pytest.mark.parametrize("extra", [[], ["--json"], ["--dry-run"]])
def test_model_dir_missing(tmp_path, extra):
    model, out = tmp_path / "no-such-model", tmp_path / "out"
    res = convert(model, out, "--scheme", "bf16", *extra)
    error_line(res, "no-such-model", "no such folder", out=out)  # stdout stays empty
    assert not out.exists()


def test_inspect_model_dir_missing(tmp_path):
    error_line(cli("inspect", tmp_path / "gone", "--json"), "gone", "no such folder")


def test_model_dir_without_safetensors(tmp_path):
    model, out = tmp_path / "empty-model", tmp_path / "out"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "mixtral"}')
    error_line(convert(model, out), "empty-model", "safetensors", out=out)
    assert not out.exists()


def test_model_dir_with_only_pickle(tmp_path):
    model, out = tmp_path / "pickled", tmp_path / "out"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "mixtral"}')
    # not even a valid pickle: proves nothing tries to load it
    (model / "pytorch_model.bin").write_bytes(b"\x80\x04 not a pickle at all")
    line = error_line(convert(model, out), "pytorch_model.bin", out=out)
    assert "safetensors only" in line
    assert "never unpickles" in line
    assert not out.exists()


# ------------------------------------------------------------------ scheme mismatches


def test_fp8_block_on_bf16_checkpoint(ckpt, tmp_path):
    out = tmp_path / "out"
    line = error_line(convert(ckpt("mx"), out, "--scheme", "fp8-block"), "--scheme bf16", out=out)
    assert f"{MX_L}.0.w1.weight" in line
    assert not out.exists()


def test_bf16_on_fp8_checkpoint(ckpt, tmp_path):
    out = tmp_path / "out"
    line = error_line(convert(ckpt("ds"), out, "--scheme", "bf16"), "fp8-block", out=out)
    assert f"{DS_L}.0.gate_proj.weight" in line
    assert not out.exists()


NOT_FP8_BLOCK = [s.value for s in SchemeName if s not in (SchemeName.AUTO, SchemeName.FP8_BLOCK)]


def test_every_scheme_is_registered():
    assert {s for s in SchemeName if s is not SchemeName.AUTO} == set(REGISTRY)


@pytest.mark.parametrize("scheme", NOT_FP8_BLOCK)
def test_other_schemes_refused_on_fp8_block_checkpoint(ckpt, tmp_path, scheme):
    """Whatever the reason (mismatch, lossy requantization, not implemented), a clean error
    that points the user at fp8-block."""
    out = tmp_path / "out"
    error_line(convert(ckpt("ds"), out, "--scheme", scheme), "fp8-block", out=out)
    assert not out.exists()


def test_fp8_expert_missing_scale(ckpt, tmp_path):
    model, out = ckpt("ds"), tmp_path / "out"
    gone = "model.layers.2.mlp.experts.3.down_proj.weight_scale_inv"
    drop_tensors(model, {gone})
    for scheme in ("fp8-block", "auto"):
        error_line(convert(model, out, "--scheme", scheme), gone, out=out)
    assert not out.exists()


def test_fp8_expert_missing_scale_first_layer_auto(ckpt, tmp_path):
    model, out = ckpt("ds"), tmp_path / "out"
    gone = f"{DS_L}.4.up_proj.weight_scale_inv"
    drop_tensors(model, {gone})
    error_line(convert(model, out, "--scheme", "auto"), gone, out=out)


def test_fp8_expert_missing_scale_first_layer_explicit(ckpt, tmp_path):
    model, out = ckpt("ds"), tmp_path / "out"
    gone = f"{DS_L}.4.up_proj.weight_scale_inv"
    drop_tensors(model, {gone})
    error_line(convert(model, out, "--scheme", "fp8-block"), gone, out=out)


# ------------------------------------------------------------ damaged or odd checkpoints


def test_index_names_missing_shard(ckpt, tmp_path):
    model, out = ckpt("ds"), tmp_path / "out"
    shard = shard_of(model, "lm_head.weight")
    shard.unlink()
    error_line(convert(model, out, "--scheme", "fp8-block"), shard.name, "missing", out=out)
    assert not out.exists()


def test_truncated_shard(ckpt, tmp_path):
    model, out = ckpt("ds"), tmp_path / "out"
    shard = shard_of(model, f"{DS_L}.0.gate_proj.weight")
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    error_line(convert(model, out, "--scheme", "fp8-block"), shard.name, out=out)
    assert not out.exists()


@pytest.mark.parametrize("damage", ["huge-length", "garbage-json", "short-file"])
def test_corrupt_header(ckpt, tmp_path, damage):
    model, out = ckpt("mx"), tmp_path / "out"
    shard = shard_of(model, "model.embed_tokens.weight")
    data = bytearray(shard.read_bytes())
    if damage == "huge-length":
        data[:8] = struct.pack("<Q", 2**62)
    elif damage == "garbage-json":
        (n,) = struct.unpack("<Q", data[:8])
        data[8 : 8 + n] = b"\xff{not json" + b" " * (n - 10)
    else:
        data = data[:5]
    shard.write_bytes(bytes(data))
    error_line(convert(model, out, "--scheme", "bf16"), shard.name, "corrupt", out=out)
    assert not out.exists()


def test_index_escaping_model_folder(ckpt, tmp_path):
    model, out = ckpt("mx"), tmp_path / "out"
    # the file exists, so only the path check can refuse it
    shutil.copy(shard_of(model, "lm_head.weight"), tmp_path / "evil.safetensors")
    index = load_index(model)
    index["weight_map"]["lm_head.weight"] = "../evil.safetensors"
    save_index(model, index)
    error_line(
        convert(model, out, "--scheme", "bf16"),
        "../evil.safetensors",
        "outside the model folder",
        out=out,
    )
    assert not out.exists()


def test_expert_missing_in_layer(ckpt, tmp_path):
    model, out = ckpt("ds"), tmp_path / "out"
    wm = load_index(model)["weight_map"]
    gone = {n for n in wm if n.startswith("model.layers.2.mlp.experts.3.")}
    assert len(gone) == 6  # gate/up/down weight and weight_scale_inv
    drop_tensors(model, gone)
    error_line(
        convert(model, out, "--scheme", "fp8-block"),
        "model.layers.2.mlp.experts",
        "experts [3] are missing",
        out=out,
    )
    assert not out.exists()


def test_expert_projection_missing(ckpt, tmp_path):
    model, out = ckpt("mx"), tmp_path / "out"
    drop_tensors(model, {f"{MX_L}.2.w3.weight"})
    error_line(convert(model, out, "--scheme", "bf16"), f"{MX_L}.2", "w3", out=out)


def test_expert_count_disagrees_with_config(ckpt, tmp_path):
    model, out = ckpt("ds"), tmp_path / "out"
    cfg = json.loads((model / "config.json").read_text())
    cfg["n_routed_experts"] = 8
    (model / "config.json").write_text(json.dumps(cfg))
    line = error_line(convert(model, out, "--scheme", "fp8-block"), "config.json", out=out)
    assert "6 experts" in line and "8" in line
    assert not out.exists()


def test_unreadable_config(ckpt, tmp_path):
    model, out = ckpt("mx"), tmp_path / "out"
    (model / "config.json").write_text("{ this is not json")
    error_line(convert(model, out), "config.json", out=out)


# ----------------------------------------------------------------------- out-dir rules


def test_out_dir_not_ours_needs_overwrite(ckpt, tmp_path):
    model, out = ckpt("mx"), tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    error_line(convert(model, out, "--scheme", "bf16"), str(out), "--overwrite", out=out)
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]

    res = convert(model, out, "--scheme", "bf16", "--overwrite")
    assert res.exit_code == 0, res.output
    assert (out / MANIFEST).is_file()
    assert not (out / "notes.txt").exists()


def test_out_dir_error_with_auto_scheme_is_one_line(ckpt, tmp_path):
    model, out = ckpt("mx"), tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    error_line(convert(model, out), "--overwrite", out=out)


@pytest.mark.parametrize("where", ["same", "inside", "parent"])
def test_out_dir_overlapping_model_dir(ckpt, tmp_path, where):
    model = ckpt("mx")
    out = {"same": model, "inside": model / "converted", "parent": tmp_path}[where]
    before = sorted(p.name for p in model.iterdir())
    error_line(convert(model, out, "--scheme", "bf16"), "source folder", out=out)
    assert sorted(p.name for p in model.iterdir()) == before


def test_out_dir_is_a_file(ckpt, tmp_path):
    model, out = ckpt("mx"), tmp_path / "out.txt"
    out.write_text("x")
    error_line(convert(model, out, "--scheme", "bf16"), "out.txt", "not a folder")
    assert out.read_text() == "x"


# ------------------------------------------------------------------------- layout limits


@pytest.mark.parametrize(("kind", "scheme"), [("ds", "fp8-block"), ("mx", "bf16")])
def test_tp_size_not_dividing_intermediate(ckpt, tmp_path, kind, scheme):
    out = tmp_path / "out"
    error_line(
        convert(ckpt(kind), out, "--scheme", scheme, "--tp-size", "3"),
        "--tp-size 3",
        "not divisible",
        out=out,
    )
    assert not out.exists()


def test_fp8_block_rank_slice_not_multiple_of_128(ckpt, tmp_path):
    out = tmp_path / "out"
    line = error_line(
        convert(ckpt("ds"), out, "--scheme", "fp8-block", "--tp-size", "4"), "128", out=out
    )
    assert "64" in line  # I/tp = 256/4
    assert DS_L in line
    assert not out.exists()


def test_bf16_trtllm_hidden_not_multiple_of_64(ckpt, tmp_path):
    model, out = ckpt("mx96"), tmp_path / "out"
    error_line(convert(model, out, "--scheme", "bf16"), "96", "--backend cutlass", out=out)
    assert not out.exists()
    res = convert(model, out, "--scheme", "bf16", "--backend", "cutlass")
    assert res.exit_code == 0, res.output
    assert (out / MANIFEST).is_file()


def test_cuda_device_without_cuda(ckpt, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    error_line(
        convert(ckpt("mx"), out, "--scheme", "bf16", "--device", "cuda"), "--device", out=out
    )


# ---------------------------------------------------------------------------- verify


def test_verify_without_manifest(tmp_path):
    (tmp_path / "half").mkdir()
    error_line(cli("verify", tmp_path / "half"), MANIFEST)


def test_verify_unknown_manifest_version(ckpt, tmp_path):
    out = tmp_path / "out"
    assert convert(ckpt("mx"), out, "--scheme", "bf16").exit_code == 0
    m = json.loads((out / MANIFEST).read_text())
    m["format_version"] = 999
    (out / MANIFEST).write_text(json.dumps(m))
    error_line(cli("verify", out), MANIFEST, "999")


# ------------------------------------------------------------------ a real process, too


def test_error_from_real_process(ckpt, tmp_path):
    model, out = ckpt("ds"), tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "FI_CONVERT_DEBUG"}
    proc = subprocess.run(
        [*FI_CONVERT, str(model), str(out), "--scheme", "bf16"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = [ln for ln in ANSI_RE.sub("", proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "fp8-block" in lines[0]
    assert not out.exists()


def test_error_names_path_with_brackets(tmp_path):
    model, out = tmp_path / "ckpt[old]", tmp_path / "out"
    error_line(convert(model, out, "--scheme", "bf16"), "ckpt[old]", out=out)


# ----------------------------------------------------------------- library exceptions


def _lib_cases():
    def missing(ck, tmp):
        return tmp / "nope", tmp / "o", Options()

    def fp8_on_bf16(ck, tmp):
        return ck("mx"), tmp / "o", Options(scheme=SchemeName.FP8_BLOCK)

    def nvfp4(ck, tmp):
        return ck("ds"), tmp / "o", Options(scheme=SchemeName.NVFP4)

    def tp3(ck, tmp):
        return ck("ds"), tmp / "o", Options(tp_size=3)

    def hidden96(ck, tmp):
        return ck("mx96"), tmp / "o", Options()

    def same_dir(ck, tmp):
        m = ck("mx")
        return m, m, Options()

    def not_ours(ck, tmp):
        (tmp / "o").mkdir()
        (tmp / "o" / "x").write_text("x")
        return ck("mx"), tmp / "o", Options()

    def truncated(ck, tmp):
        m = ck("mx")
        p = shard_of(m, "lm_head.weight")
        p.write_bytes(p.read_bytes()[:100])
        return m, tmp / "o", Options()

    return [
        pytest.param(missing, SourceError, id="missing-dir"),
        pytest.param(truncated, SourceError, id="truncated"),
        pytest.param(fp8_on_bf16, SchemeMismatchError, id="fp8-on-bf16"),
        pytest.param(nvfp4, SchemeMismatchError, id="nvfp4"),
        pytest.param(tp3, LayoutError, id="tp3"),
        pytest.param(hidden96, LayoutError, id="hidden96"),
        pytest.param(same_dir, OutputError, id="same-dir"),
        pytest.param(not_ours, OutputError, id="not-ours"),
    ]


@pytest.mark.parametrize(("setup", "exc_type"), _lib_cases())
def test_library_raises_typed_errors(ckpt, tmp_path, setup, exc_type):
    model, out, opts = setup(ckpt, tmp_path)
    with pytest.raises(exc_type) as info:
        fi_convert.convert(model, out, opts, device="cpu")
    assert isinstance(info.value, FiConvertError)
    msg = str(info.value)
    assert msg and "\n" not in msg
    assert not (Path(out) / MANIFEST).exists()


def test_library_manifest_error(tmp_path):
    with pytest.raises(ManifestError):
        fi_convert.read_manifest(tmp_path)


def test_load_moe_layer_checks_scheme_backend_and_rank(tmp_path):
    from fi_convert import ManifestError, Options, SchemeName, convert, load_moe_layer
    from fi_convert.testing.synthetic import Spec, write_checkpoint

    src = write_checkpoint(tmp_path / "src", Spec("qwen3-moe", layers=1, experts=2, hidden=128))
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.BF16, tp_size=2), device="cpu")
    prefix = "model.layers.0.mlp.experts"
    assert load_moe_layer(out, prefix, tp_rank=1, scheme="bf16", backend="trtllm")
    with pytest.raises(ManifestError, match="scheme 'bf16', not 'mxfp8'"):
        load_moe_layer(out, prefix, scheme="mxfp8")
    with pytest.raises(ManifestError, match="backend 'trtllm'"):
        load_moe_layer(out, prefix, backend="cutlass")
    with pytest.raises(ManifestError, match="tp_rank 2 out of range"):
        load_moe_layer(out, prefix, tp_rank=2)
    with pytest.raises(ManifestError, match="no MoE layer"):
        load_moe_layer(out, "model.layers.9.mlp.experts")
    (out / "fi-convert-manifest.json").unlink()
    with pytest.raises(ManifestError, match="not a finished"):
        load_moe_layer(out, prefix)


def test_reading_experts_for_expert_parallelism(tmp_path):
    """OutputReader.read_experts_into: the listed experts' slices, in their order, of a tp 1
    output; a tp 2 output, an expert that is not there and a wrong buffer are refused."""
    import torch

    from fi_convert import ManifestError, Options, SchemeName, convert, load_moe_layer
    from fi_convert.format.reader import OutputReader
    from fi_convert.testing.synthetic import Spec, write_checkpoint

    src = write_checkpoint(tmp_path / "src", Spec("qwen3-moe", layers=1, experts=5, hidden=128))
    prefix = "model.layers.0.mlp.experts"
    for tp in (1, 2):
        convert(src, tmp_path / f"tp{tp}", Options(SchemeName.BF16, tp_size=tp), device="cpu")
    whole = load_moe_layer(tmp_path / "tp1", prefix)
    part = load_moe_layer(tmp_path / "tp1", prefix, experts=[4, 1])
    assert all(
        torch.equal(part[k].view(torch.uint8), t[[4, 1]].view(torch.uint8))
        for k, t in whole.items()
    )
    with pytest.raises(ManifestError, match="convert again with --tp-size 1"):
        load_moe_layer(tmp_path / "tp2", prefix, experts=[0])
    with OutputReader(tmp_path / "tp1") as r:
        for ids in ([3, 4], [4, 0, 2], [1]):
            for name, t in whole.items():
                got = torch.empty((len(ids), *t.shape[1:]), dtype=t.dtype)
                r.read_experts_into(prefix, name, ids, got)
                assert torch.equal(got.view(torch.uint8), t[ids].view(torch.uint8)), (name, ids)
        w13 = whole["w13_weight"]
        with pytest.raises(ManifestError, match="has experts 0..4, not 5"):
            r.read_experts_into(prefix, "w13_weight", [1, 5], torch.empty_like(w13[:2]))
        with pytest.raises(ValueError, match="wrong size"):
            r.read_experts_into(prefix, "w13_weight", [1, 2], torch.empty_like(w13[:1]))
    with (
        OutputReader(tmp_path / "tp2") as r,
        pytest.raises(ManifestError, match="convert again with --tp-size 1"),
    ):
        r.read_experts_into(prefix, "w13_weight", [0], torch.empty(1))
    # with a TP rank (SGLang's MoE TP size over 1 under EP): the experts of that rank's slice
    with OutputReader(tmp_path / "tp2") as r:
        for rank in (0, 1):
            split = load_moe_layer(tmp_path / "tp2", prefix, tp_rank=rank)
            for name, t in split.items():
                got = torch.empty((2, *t.shape[1:]), dtype=t.dtype)
                r.read_experts_into(prefix, name, [3, 4], got, tp_rank=rank)
                assert torch.equal(got.view(torch.uint8), t[[3, 4]].view(torch.uint8))
        with pytest.raises(ManifestError, match="tp_rank 2 out of range"):
            r.read_experts_into(prefix, "w13_weight", [0], torch.empty(1), tp_rank=2)
    # a manifest whose expert count is not the tensors' leading dimension
    m = fi_convert.read_manifest(tmp_path / "tp1")
    m["layers"][prefix]["num_experts"] = 4
    with (
        OutputReader(tmp_path / "tp1", m) as r,
        pytest.raises(ManifestError, match="no leading dimension of the layer's 4 experts"),
    ):
        r.read_experts_into(prefix, "w13_weight", [0], torch.empty(1))


def test_fp8_block_expert_count_warning(tmp_path):
    src = write_checkpoint(tmp_path / "src", Spec("deepseek-v3", layers=2, experts=6))
    r = cli("inspect", src)
    assert r.exit_code == 0
    assert "multiple of 4" in r.output


def test_an_output_given_as_the_source_is_refused(ckpt, tmp_path):
    out = tmp_path / "out"
    assert convert(ckpt("mx"), out).exit_code == 0
    error_line(convert(out, tmp_path / "again"), "already an fi-convert output (scheme", "tp 1")
    (out / "fi-convert-manifest.json").unlink()  # an unfinished one: its config says so too
    error_line(convert(out, tmp_path / "again2"), "already an fi-convert output: nothing to")
    assert not (tmp_path / "again").exists() and not (tmp_path / "again2").exists()


def test_nvfp4_cutlass_with_an_intermediate_vllm_cannot_pad_is_refused(tmp_path):
    src = write_checkpoint(
        tmp_path / "src",
        Spec("deepseek-v3", layers=2, experts=4, hidden=256, intermediate=384, quant="nvfp4"),
    )
    line = error_line(
        convert(src, tmp_path / "out", "--backend", "cutlass", "--tp-size", "4"),
        "intermediate size per rank 96",
        "use --backend trtllm",
    )
    assert "vLLM 0.33" in line


def test_a_side_file_linked_outside_the_model_folder_is_refused(ckpt, tmp_path):
    """It would be copied into the output and pushed to the Hub: a local secret leaked."""
    model, out = ckpt("mx"), tmp_path / "out"
    secret = tmp_path / "secret.txt"
    secret.write_text("hf_token")
    (model / "notes.txt").symlink_to(secret)
    error_line(convert(model, out), "notes.txt: links to", "outside the model folder")
    assert not out.exists()
    (model / "notes.txt").unlink()
    inner = model / "inner.txt"
    inner.write_text("fine")
    (model / "alias.txt").symlink_to(inner)  # a link inside the folder is fine
    assert convert(model, out).exit_code == 0
    assert (out / "alias.txt").read_text() == "fine"


@pytest.mark.parametrize("name", ["config.json", "readme.md"])
def test_a_fifo_in_the_model_folder_is_refused_not_read(ckpt, tmp_path, name):
    model, out = ckpt("mx"), tmp_path / "out"
    target = model / name
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    error_line(convert(model, out), name, "not a regular file but a FIFO")  # and no hang
    assert not out.exists()


# entries that hold no file, and what fi-convert calls each
NOT_FILES = {
    "loop": "a link loop",
    "loop-of-two": "a link loop",
    "dangling": "a link to nothing (nowhere does not exist)",
    "folder-inside": "a link to the folder",
    "folder-outside": "outside the model folder",
    "fifo": "a FIFO",
}


def _not_a_file(kind: str, where: Path, outside: Path) -> None:
    if kind == "loop":
        where.symlink_to(where.name)
    elif kind == "loop-of-two":
        where.symlink_to(where.name + ".b")
        where.with_name(where.name + ".b").symlink_to(where.name)
    elif kind == "dangling":
        where.symlink_to("nowhere")
    elif kind == "folder-inside":
        where.symlink_to("..")
    elif kind == "folder-outside":
        outside.mkdir()
        where.symlink_to(outside)
    else:
        os.mkfifo(where)


@pytest.mark.parametrize("kind", sorted(NOT_FILES))
def test_an_entry_of_a_subfolder_that_is_no_file_is_left_out_with_a_warning(ckpt, tmp_path, kind):
    """In a subfolder (which no server looks in by name) a link loop, a link to nothing or to a
    folder, or a FIFO is no file the output could carry: a warning names it and what it is,
    and the rest converts, verifies and is carried."""
    model, out = ckpt("mx"), tmp_path / "out"
    (model / "extra").mkdir()
    (model / "extra" / "notes.md").write_text("kept")
    _not_a_file(kind, model / "extra" / "entry", tmp_path / "elsewhere")
    res = convert(model, out)
    assert res.exit_code == 0, res.output
    warned = [ln for ln in ANSI_RE.sub("", res.stderr).splitlines() if ln.startswith("warning:")]
    assert any(
        ln.startswith(f"warning: {model / 'extra' / 'entry'}: a ")
        and NOT_FILES[kind] in ln
        and ln.endswith("not a file; left out of the output")
        for ln in warned
    ), warned
    assert "Traceback" not in res.output
    assert (out / "extra" / "notes.md").read_text() == "kept"
    assert not os.path.lexists(out / "extra" / "entry")
    assert cli("verify", out, "--source", model).exit_code == 0


@pytest.mark.parametrize("kind", sorted(NOT_FILES))
def test_an_entry_beside_config_json_that_is_no_file_is_refused(ckpt, tmp_path, kind):
    """Beside config.json, where servers look for files by name, it stops the run: one line
    saying what it is, so that the output never lacks a file the source seemed to have."""
    model, out = ckpt("mx"), tmp_path / "out"
    _not_a_file(kind, model / "entry.json", tmp_path / "elsewhere")
    error_line(convert(model, out), "entry.json: not a regular file but", NOT_FILES[kind])
    assert not out.exists()


@pytest.mark.parametrize("indexed", [True, False])
def test_a_shard_that_is_a_link_loop_is_named_so(ckpt, tmp_path, indexed):
    model, out = ckpt("mx"), tmp_path / "out"
    shard = shard_of(model, f"{MX_L}.0.w1.weight")
    if not indexed:
        (model / INDEX).unlink()
    shard.unlink()
    shard.symlink_to(shard.name)
    error_line(convert(model, out), f"{shard.name}: not a regular file but a link loop")


def test_overwrite_into_a_bind_mount_of_the_source_deletes_nothing(ckpt, tmp_path):
    """The out-dir is the model folder under another path (a bind mount): resolved paths
    differ, filesystem identity does not. Refused, and the source keeps every file."""
    import subprocess

    model, out = ckpt("mx"), tmp_path / "mnt"
    out.mkdir()
    r = subprocess.run(["mount", "--bind", str(model), str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"bind mounts are not permitted here: {r.stderr.strip()}")
    try:
        before = sorted(p.name for p in model.iterdir())
        error_line(convert(model, out, "--overwrite"), "must not be the source folder")
        error_line(convert(model, out / "sub", "--overwrite"), "must not be the source folder")
        assert sorted(p.name for p in model.iterdir()) == before
    finally:
        subprocess.run(["umount", str(out)], check=True)


DEEP = "[" * 100_000 + "]" * 100_000  # deeper than Python's json parser recurses


@pytest.mark.parametrize("name", ["config.json", INDEX, "hf_quant_config.json"])
def test_a_model_json_file_nested_too_deep_is_one_line(ckpt, tmp_path, name):
    model, out = ckpt("mx"), tmp_path / "out"
    (model / name).write_text(DEEP)
    error_line(convert(model, out), f"{model / name}: not readable JSON (nested too deep")


def test_an_output_json_file_nested_too_deep_is_one_line_or_ignored(ckpt, tmp_path):
    """The manifest of a finished output: one line from verify, and from a convert into it;
    the journal of a run (fi-convert's own scratch file): not read, the run goes on."""
    model, out = ckpt("mx"), tmp_path / "out"
    assert convert(model, out).exit_code == 0
    (out / MANIFEST).write_text(DEEP)
    error_line(cli("verify", out), f"{out / MANIFEST}: unreadable (nested too deep")
    error_line(convert(model, out), f"{out / MANIFEST}: unreadable (nested too deep")
    fresh = tmp_path / "fresh"
    (fresh / ".fi-convert").mkdir(parents=True)
    (fresh / ".fi-convert" / "state.json").write_text(DEEP)
    res = convert(model, fresh)
    assert res.exit_code == 0, res.output
    assert cli("verify", fresh).exit_code == 0

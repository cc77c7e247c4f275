"""fi_convert/outdir.py (and what fi_convert/pipeline.py writes through it): the out-dir
transaction: a resume never keeps files of an older source, a finished output stays finished
until it is really replaced (and is left alone when up to date), another conversion is never
replaced without --overwrite, and filesystem faults are one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fi_convert import FiConvertError, Options, OutputError, SchemeName, convert
from fi_convert.format import manifest as mf
from fi_convert.st_io import TMP_SUFFIX, SourceFiles, read_header
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import cli
from .test_errors import error_line

MANIFEST = "fi-convert-manifest.json"
FP8 = ["--scheme", "fp8-block", "--max-shard-size", "300000", "--quiet"]
SPEC = Spec("deepseek-v3", layers=2, experts=4, hidden=256, intermediate=256, shards=3)


def _opts(**kw) -> Options:
    return Options(SchemeName.FP8_BLOCK, max_shard_bytes=300_000, **kw)


def _tree(d: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `d` (hidden ones too): its bytes and mtime."""
    return {
        p.relative_to(d).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def _files(d: Path) -> dict[str, bytes]:
    return {k: v[0] for k, v in _tree(d).items()}


def _run(src: Path, out: Path, *extra: str, env: dict | None = None):
    cmd = [sys.executable, "-m", "fi_convert", str(src), str(out), *FP8, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("base") / "ds", SPEC)


@pytest.fixture
def src(base, tmp_path) -> Path:
    dst = tmp_path / "src"
    shutil.copytree(base, dst)
    return dst


def _change_expert_bytes(src: Path) -> None:
    """New data for one expert weight, in place: same names, shapes and header."""
    for shard in sorted(src.glob("*.safetensors")):
        infos, _ = read_header(shard)
        name = next((n for n in infos if n.endswith(".experts.1.down_proj.weight")), None)
        if name is None:
            continue
        info = infos[name]
        with open(shard, "r+b") as f:
            f.seek(info.start)
            data = bytearray(f.read(64))
            for k in range(len(data)):
                data[k] = (data[k] + 1) & 0x7E  # still E4M3, never NaN
            f.seek(info.start)
            f.write(data)
        return
    raise AssertionError("no expert weight found")


# --------------------------------------------------------------- item 1: a resume's source


def test_resume_after_the_source_changed_keeps_nothing_of_the_old_source(src, tmp_path):
    """Kill a run, change data bytes (same shapes) and tokenizer_config.json, rerun: the
    output is exactly a fresh conversion of the changed source."""
    out = tmp_path / "out"
    r = _run(src, out, env={"_FI_CONVERT_KILL_AFTER_WRITES": "12"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert list(out.glob("model-*.safetensors")), "expected finished shards before the kill"
    _change_expert_bytes(src)
    cfg = src / "tokenizer_config.json"
    cfg.write_text(cfg.read_text().replace("}", ', "updated": true}', 1))
    r = _run(src, out)
    assert r.returncode == 0, r.stderr
    fresh = tmp_path / "fresh"
    convert(src, fresh, _opts(), device="cpu")
    assert _files(out) == _files(fresh)
    assert (out / "tokenizer_config.json").read_bytes() == cfg.read_bytes()


def test_journal_records_the_source_identity(src, tmp_path, monkeypatch):
    from fi_convert import pipeline

    def boom(*a, **kw):
        raise OutputError("injected")

    monkeypatch.setattr(pipeline.OutDir, "write_index", boom)
    out = tmp_path / "out"
    with pytest.raises(OutputError, match="injected"):
        convert(src, out, _opts(), device="cpu")
    j = json.loads((out / ".fi-convert" / "state.json").read_text())
    st = os.stat(src / "model-00001-of-00003.safetensors")
    assert j["source"]["files"]["model-00001-of-00003.safetensors"] == [
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
        st.st_ino,
    ]
    assert j["source"]["location"] == str(src.resolve())


def test_a_source_changed_during_the_run_is_not_claimed(src, tmp_path, monkeypatch):
    from fi_convert import outdir

    real = outdir.OutDir.flush

    def flush_then_touch(self, files):
        real(self, files)
        _change_expert_bytes(src)

    monkeypatch.setattr(outdir.OutDir, "flush", flush_then_touch)
    out = tmp_path / "out"
    with pytest.raises(FiConvertError, match="changed while it was converted"):
        convert(src, out, _opts(), device="cpu")
    assert not (out / MANIFEST).exists()
    monkeypatch.setattr(outdir.OutDir, "flush", real)
    convert(src, out, _opts(), device="cpu")
    fresh = tmp_path / "fresh"
    convert(src, fresh, _opts(), device="cpu")
    assert _files(out) == _files(fresh)


# ---------------------------------------------------- item 5: rerunning a finished output


def test_identical_command_on_an_up_to_date_output_changes_nothing(src, tmp_path, monkeypatch):
    out = tmp_path / "out"
    r = cli("convert", src, out, *FP8)
    assert r.exit_code == 0, r.output
    before = _tree(out)
    from fi_convert import st_io

    def no_write(*a, **kw):
        raise AssertionError("an up-to-date output was written to")

    monkeypatch.setattr(st_io.ShardWriter, "__init__", no_write)
    r = cli("convert", src, out, *FP8)
    assert r.exit_code == 0, r.output
    assert "up to date" in r.stdout
    r = cli("convert", src, out, *FP8, "--json")
    assert json.loads(r.stdout)["up_to_date"] is True
    assert _tree(out) == before  # bytes and mtimes; no state folder left either


def test_a_kill_during_a_rerun_leaves_the_finished_output_claimed(src, tmp_path):
    out = tmp_path / "out"
    assert _run(src, out).returncode == 0
    before = _files(out)
    os.utime(src / "model-00002-of-00003.safetensors")  # may have changed: redo it all
    r = _run(src, out, "--overwrite", env={"_FI_CONVERT_KILL_AFTER_WRITES": "2"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert (out / MANIFEST).exists(), "a rerun killed before replacing anything"
    assert mf.check_files(out, mf.read(out)) == []  # still the finished output
    assert {k: v for k, v in _files(out).items() if k in before} == before
    r = _run(src, out, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert _files(out) == before
    assert not (out / ".fi-convert").exists()


def test_a_damaged_file_is_redone_and_the_rest_reused(src, tmp_path):
    out = tmp_path / "out"
    convert(src, out, _opts(), device="cpu")
    before = _files(out)
    shard = sorted(out.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-10])
    res = convert(src, out, _opts(), device="cpu")
    assert not res.up_to_date and shard.name not in res.reused_files
    assert sum(n.startswith("model-") for n in res.reused_files) >= 2
    assert _files(out) == before


# -------------------------------------------------- item 6: another source, other options


def test_another_source_or_other_options_are_refused_without_overwrite(src, tmp_path):
    out = tmp_path / "out"
    assert cli("convert", src, out, *FP8).exit_code == 0
    before = _tree(out)
    other = write_checkpoint(tmp_path / "other", Spec("mixtral", layers=1, experts=2))
    error_line(cli("convert", other, out), "another source", "--overwrite")
    error_line(cli("convert", src, out, *FP8, "--tp-size", "2"), "other options", "--overwrite")
    assert _tree(out) == before
    # another shard size is the same conversion, packed otherwise: redone in place
    res = convert(src, out, Options(SchemeName.FP8_BLOCK), device="cpu")
    assert not res.up_to_date and mf.check_files(out, res.manifest) == []


def test_overwrite_leaves_nothing_of_the_old_output(src, tmp_path):
    out = tmp_path / "out"
    (src / "extra_notes.md").write_text("only in the first model")
    (src / "sub").mkdir()
    (src / "sub" / "vocab.txt").write_text("nested")
    assert cli("convert", src, out, *FP8).exit_code == 0
    assert (out / "sub" / "vocab.txt").exists()
    other = write_checkpoint(tmp_path / "other", Spec("mixtral", layers=1, experts=2))
    r = cli("convert", other, out, "--overwrite", "--quiet")
    assert r.exit_code == 0, r.output
    names = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert names == set(mf.read(out)["files"]) | {MANIFEST}


def test_an_unfinished_output_of_another_conversion_is_refused(src, tmp_path):
    out = tmp_path / "out"
    r = _run(src, out, env={"_FI_CONVERT_KILL_AFTER_WRITES": "12"})
    assert r.returncode == -signal.SIGKILL
    other = write_checkpoint(tmp_path / "other", Spec("mixtral", layers=1, experts=2))
    error_line(cli("convert", other, out), "unfinished", "--overwrite")
    assert cli("convert", other, out, "--overwrite", "--quiet").exit_code == 0


# ------------------------------------------------------------- faults: one line, resumable


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs (root only; skipped elsewhere), resized with `resize(size, inodes)`."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)])
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")

    def resize(opts: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{opts}", str(mnt)], check=True)

    try:
        yield mnt, resize
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def _clean_failure(out: Path) -> None:
    if out.exists():
        assert not [p for p in out.rglob("*") if p.name.endswith(TMP_SUFFIX)], "temp files left"
        assert not (out / ".fi-convert" / "lock").exists(), "lock left"


def _empty(mnt: Path) -> None:
    for p in mnt.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


@pytest.mark.parametrize("what", ["size", "nr_inodes"])
def test_a_full_disk_at_any_point_is_one_error_and_the_rerun_resumes(tmpfs, tmp_path, what):
    """The out-dir on a tmpfs with room for k pages (or k inodes), for every k up to what the
    output needs: the lock, the journal, side files, shards, the index and the manifest each
    meet a full disk. Each run ends in a FiConvertError (one line in the CLI), leaves no
    temporary file and no lock, and with room again the same command finishes."""
    mnt, resize = tmpfs
    small = write_checkpoint(
        tmp_path / "small", Spec("qwen3-moe", layers=1, experts=2, hidden=64, intermediate=64)
    )
    ref = tmp_path / "ref"
    convert(small, ref, Options(), device="cpu")
    pages = sum(-(-p.stat().st_size // 4096) for p in ref.iterdir())
    top = pages + 4 if what == "size" else len(list(ref.iterdir())) + 4
    failures = 0
    for k in range(1, top + 1):
        _empty(mnt)
        resize(f"size={k * 4}k" if what == "size" else f"nr_inodes={k + 1}")
        out = mnt / "out"
        try:
            convert(small, out, Options(), device="cpu")
        except FiConvertError as e:
            failures += 1
            assert "\n" not in str(e)
            _clean_failure(out)
            resize("size=16m,nr_inodes=10000")
            convert(small, out, Options(), device="cpu")  # with room again: resumes
        assert _files(out) == _files(ref)
        resize("size=16m,nr_inodes=10000")
    assert failures >= top - 6  # every size short of the output failed
    _empty(mnt)
    resize("size=8k" if what == "size" else "nr_inodes=3")
    r = subprocess.run(
        [sys.executable, "-m", "fi_convert", str(small), str(mnt / "out"), "-q", "-s", "bf16"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert "No space left" in lines[0] and "run the same command again" in lines[0]


def test_a_read_only_filesystem_is_one_error_and_a_finished_output_stays_usable(
    tmpfs, src, tmp_path
):
    mnt, resize = tmpfs
    done = mnt / "done"
    assert cli("convert", src, done, *FP8).exit_code == 0
    resize("ro")
    error_line(cli("convert", src, mnt / "new", *FP8), "read-only")
    r = cli("convert", src, done, *FP8)  # up to date: nothing to write
    assert r.exit_code == 0 and "up to date" in r.stdout, r.output
    cfg = src / "tokenizer_config.json"
    cfg.write_text(cfg.read_text().replace("}", ', "updated": true}', 1))
    error_line(cli("convert", src, done, *FP8), "read-only")
    assert mf.check_files(done, mf.read(done)) == []
    resize("rw")
    assert cli("convert", src, done, *FP8).exit_code == 0
    assert (done / "tokenizer_config.json").read_bytes() == cfg.read_bytes()


def test_an_out_dir_under_a_file_is_one_error(src, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    error_line(cli("convert", src, f / "out", *FP8), "a file", "choose another out-dir")
    error_line(cli("convert", src, f, *FP8), "not a folder")


def test_an_unreadable_model_folder_is_one_error(src, tmp_path):
    """Run without the capabilities that let root read anything (setpriv), on a folder (and
    then a shard) that its owner may not read."""
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv")
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
    if subprocess.run([*drop, "true"]).returncode != 0:
        pytest.skip("cannot drop capabilities here")
    cmd = [*drop, sys.executable, "-m", "fi_convert", str(src), str(tmp_path / "out"), *FP8]
    shard = src / "model-00002-of-00003.safetensors"
    for victim in (src, shard):
        victim.chmod(0)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        finally:
            victim.chmod(0o755 if victim.is_dir() else 0o644)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        assert lines[0].startswith("error:") and "Permission denied" in lines[0], lines
    assert subprocess.run(cmd, capture_output=True).returncode == 0


# ------------------------------------------------------------------ NaN and Inf in scales


def test_a_nan_scale_is_named_in_a_warning(src, tmp_path):
    """A fp8-block checkpoint with a NaN in one expert's weight_scale_inv and an Inf in
    another's: converted, with one warning naming each."""
    bad = {"layers.1.mlp.experts.2.up_proj": float("nan"), "experts.3.down_proj": float("inf")}
    found = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors = load_file(shard)
        for n, t in tensors.items():
            for key, value in bad.items():
                if n.endswith(f"{key}.weight_scale_inv") and key not in found:
                    t.view(-1)[1] = value
                    found[key] = n
        save_file(tensors, shard, metadata={"format": "pt"})
    name, inf = found[next(iter(bad))], found["experts.3.down_proj"]
    r = cli("convert", src, tmp_path / "out", *FP8[:-1])  # without --quiet, which hides warnings
    assert r.exit_code == 0, r.output
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert any(name in ln and "NaN or Inf" in ln for ln in warned), r.stderr
    assert any(inf in ln for ln in warned), r.stderr
    assert sum(name in ln for ln in warned) == 1  # once per tensor, not once per read


def test_nonfinite_counts_each_scale_format():
    from fi_convert.pipeline import is_scale, nonfinite

    f32 = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert nonfinite(f32, "F32") == 3
    assert nonfinite(f32.to(torch.bfloat16), "BF16") == 3
    e4m3 = torch.tensor([0x7F, 0x01, 0xFF], dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert nonfinite(e4m3, "F8_E4M3") == 2
    assert nonfinite(torch.tensor([0xFF, 127], dtype=torch.uint8), "U8") == 1
    assert is_scale("a.weight_scale_inv") and is_scale("a.gate_up_proj_scales")
    assert not is_scale("a.scale_up.weight")


def test_many_nan_scales_are_said_in_one_line():
    """Past three scale tensors, one line says how many, not one line each (a checkpoint
    with a bad scale in every layer would print hundreds)."""
    from fi_convert.pipeline import _CheckedFiles

    files = _CheckedFiles(SourceFiles())
    files.bad = {"a.weight_scale": 2, "b.weight_scale": 1, "c.weight_scale": 1}
    assert [w.split(":")[0] for w in files.warnings()] == [
        "a.weight_scale", "b.weight_scale", "c.weight_scale"
    ]  # fmt: skip
    files.bad["d.weight_scale"] = 4
    assert files.warnings() == [
        "4 scale tensors hold NaN or Inf values (8 in all; first a.weight_scale, last "
        "d.weight_scale); the weights they scale are NaN or Inf in the output too - check the "
        "source checkpoint"
    ]

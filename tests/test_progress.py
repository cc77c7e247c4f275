"""fi_convert/pipeline.py's `Progress` and fi_convert/cli/_progress.py, progress and results: plain
progress lines in CI logs, an ETA only once it means something, the summary's time, size and
throughput, resumes that say so and reach 100 %, one display for Hub downloads, each warning
once, and --quiet."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from fi_convert.cli import _progress as cp
from fi_convert.pipeline import Progress
from fi_convert.plan import grouped_notes
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .conftest import cli

MANIFEST = "fi-convert-manifest.json"
SIZE = r"\d+(\.\d\d)? [KMGT]?B"
# `converting: 41% 2.31 GB/5.67 GB, 612 MB/s, ETA 0:05` (speed and ETA once they mean something)
LINE = re.compile(
    rf"^(converting|downloading): (\d+)% {SIZE}/{SIZE}(, [\d.]+ [KMGT]?B/s)?(, ETA \d+:\d\d)?$"
)
FP8 = ["--scheme", "fp8-block", "--max-shard-size", "600000", "--device", "cpu"]


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv(cp.SECONDS_ENV, raising=False)


def progress_lines(stderr: str) -> list[tuple[str, int]]:
    """(label, percent) of every progress line; every such line must be well-formed."""
    out = []
    for ln in stderr.splitlines():
        if ln.startswith(("converting", "downloading")):
            m = LINE.match(ln)
            assert m, f"malformed progress line: {ln!r}"
            out.append((m.group(1), int(m.group(2))))
    return out


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def display(how: str = "plain", **kw) -> tuple[cp.Display, io.StringIO, FakeClock]:
    buf, clock = io.StringIO(), FakeClock()
    console = Console(file=buf, width=200, highlight=False, soft_wrap=True)
    return cp.Display(console, how, clock=clock, **kw), buf, clock


def report(d: cp.Display, done: int, total: int = 1000, reused: int = 0, **kw) -> None:
    d.on_progress(Progress(done, total, 0, 10, "", reused, **kw))


# ---- 1. plain lines when stderr is not a terminal ----


def test_a_non_tty_run_prints_plain_progress_lines(src, tmp_path):
    """A real subprocess with stderr a pipe, as in CI: plain lines, increasing, the last 100%."""
    env = {k: v for k, v in os.environ.items() if k != "FI_CONVERT_DEBUG"}
    env[cp.SECONDS_ENV] = "0"  # every 5 %, not every 10 s: the run takes a second
    cmd = [sys.executable, "-m", "fi_convert", src, tmp_path / "out", *FP8, "--jobs", "1"]
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = progress_lines(proc.stderr)
    pcts = [p for _, p in lines]
    assert len(lines) >= 3 and {label for label, _ in lines} == {"converting"}
    assert pcts == sorted(pcts) and pcts[-1] == 100 and pcts.count(100) == 1
    steps = pcts[:-1]  # 5 % apart (rounded to whole percents); then 100 % however close
    assert all(b - a >= 4 for a, b in zip(steps, steps[1:], strict=False))
    assert "\r" not in proc.stderr and "\x1b[" not in proc.stderr  # no bar, no colour codes
    assert proc.stdout.startswith("done: ")


def test_plain_lines_come_every_5_percent_and_10_seconds_whichever_is_rarer():
    d, buf, clock = display()
    report(d, 0)
    for done in range(10, 1001, 10):  # 1 % a second
        clock.t += 1
        report(d, done)
    lines = buf.getvalue().splitlines()
    pcts = [int(LINE.match(ln).group(2)) for ln in lines]  # type: ignore[union-attr]
    assert pcts == [*range(10, 100, 10), 100]  # 10 s apart (5 % would be twice as often)

    d, buf, clock = display()
    report(d, 0)
    for done in range(10, 1001, 10):  # 1 % every 10 s: now 5 % is the rarer
        clock.t += 10
        report(d, done)
    pcts = [int(LINE.match(ln).group(2)) for ln in buf.getvalue().splitlines()]  # type: ignore[union-attr]
    assert pcts == [*range(5, 101, 5)]


def test_the_interval_is_overridable_and_a_bad_value_keeps_the_default(monkeypatch):
    assert cp.plain_seconds() == cp.PLAIN_MIN_SECONDS == 10.0 and cp.PLAIN_EVERY_PCT == 5.0
    monkeypatch.setenv(cp.SECONDS_ENV, "2.5")
    assert cp.plain_seconds() == 2.5 and display()[0].min_seconds == 2.5
    monkeypatch.setenv(cp.SECONDS_ENV, "soon")
    assert cp.plain_seconds() == 10.0
    assert display(min_seconds=0)[0].min_seconds == 0


def test_the_plain_line_reads_as_documented():
    d, buf, clock = display(min_seconds=0)
    report(d, 0, 5_670_000_000)
    clock.t += 4
    report(d, 2_310_000_000, 5_670_000_000)
    assert buf.getvalue().splitlines() == ["converting: 41% 2.31 GB/5.67 GB, 578 MB/s, ETA 0:06"]


def test_modes_bar_on_a_terminal_plain_elsewhere_and_off_with_quiet_or_json():
    tty = Console(file=io.StringIO(), force_terminal=True)
    pipe = Console(file=io.StringIO(), force_terminal=False)
    assert cp.progress_mode(tty, False, False) == "bar"
    assert cp.progress_mode(pipe, False, False) == "plain"
    assert cp.progress_mode(tty, True, False) == cp.progress_mode(pipe, False, True) == "off"
    d, buf, _ = display("off")
    assert d.callback() is None and d.bytes_callback() is None


# ---- 4. no ETA until the rate means something ----


def test_no_eta_before_2_seconds_and_5_percent():
    clock = FakeClock()
    r = cp.Rate(clock)
    r.update(0, 1000)
    clock.t += 1.9
    r.update(500, 1000)  # half done, but too early
    assert r.eta() is None
    clock.t += 0.1  # 2 s, 50 %: 250 B/s, 500 B to go
    assert r.eta() == pytest.approx(2.0)
    r = cp.Rate(clock)
    r.update(0, 1000)
    clock.t += 60
    r.update(49, 1000)  # a minute in, under 5 %
    assert r.eta() is None
    r.update(50, 1000)
    assert r.eta() == pytest.approx(950 / (50 / 60))
    r.update(1000, 1000)
    assert r.eta() is None  # done: nothing left to estimate


def test_reused_bytes_count_done_but_not_as_speed():
    clock = FakeClock()
    r = cp.Rate(clock)
    r.update(800, 1000, skipped=800)  # an earlier run's 80 %, found at the start
    clock.t += 2
    r.update(805, 1000, skipped=800)  # 5 B of 200 to make: under 5 %
    assert r.eta() is None
    r.update(820, 1000, skipped=800)  # 20 B in 2 s of this run's own work
    assert r.bps() == pytest.approx(10.0) and r.eta() == pytest.approx(18.0)


def test_the_display_shows_no_eta_early_in_a_short_job():
    d, buf, clock = display(min_seconds=0)
    report(d, 0)
    clock.t += 0.5
    report(d, 100)  # 10 % after half a second: the 7:54-for-10-seconds case
    clock.t += 2
    report(d, 600)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "converting: 10% 100 B/1.00 KB"
    assert lines[1] == "converting: 60% 600 B/1.00 KB, 240 B/s, ETA 0:02"


def test_the_terminal_bar_shows_no_eta_early():
    d, buf, clock = display("bar")
    with d:
        report(d, 0)
        clock.t += 0.5
        report(d, 100)
        assert d.bar is not None and d.task is not None
        task = d.bar.tasks[0]
        assert task.fields["eta"] == "" and task.completed == 100
        clock.t += 2
        report(d, 600)
        assert task.fields["eta"] == "ETA 0:02" and task.fields["tensors"] == "0/10 tensors"


# ---- 2. the summaries: elapsed time, size, throughput ----


def test_convert_summary_has_elapsed_size_and_throughput(src, tmp_path):
    r = cli("convert", src, tmp_path / "a", *FP8, "--json")
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)
    files = json.loads((tmp_path / "a" / MANIFEST).read_text())["files"]
    size = sum(m["size"] for m in files.values())
    assert s["bytes"] == s["bytes_written"] == size > 0
    # elapsed_s is rounded to the millisecond and the throughput is of the unrounded time: on a
    # fast run (0.04 s) that rounding alone moves the quotient by more than 1 %
    e = s["elapsed_s"]
    assert e > 0 and size / (e + 0.0005) <= s["throughput_bps"] <= size / max(e - 0.0005, 1e-9)
    r = cli("convert", src, tmp_path / "b", *FP8)
    assert r.exit_code == 0
    figures = rf"{SIZE} in \d+:\d\d \([\d.]+ [KMGT]?B/s\)"
    assert re.search(rf"; 16 files, {figures}, manifest {MANIFEST}$", r.stdout.strip()), r.stdout


def test_verify_summary_has_elapsed_size_and_throughput(src, tmp_path):
    out = tmp_path / "out"
    assert cli("convert", src, out, *FP8, "-q").exit_code == 0
    files = json.loads((out / MANIFEST).read_text())["files"]
    r = cli("verify", out, "--json")
    assert r.exit_code == 0, r.stdout
    s = json.loads(r.stdout)
    assert s["ok"] and s["bytes"] == sum(m["size"] for m in files.values())
    assert s["elapsed_s"] > 0 and s["throughput_bps"] > 0
    r = cli("verify", out)
    assert re.fullmatch(
        rf"ok: 16 files, .*; {SIZE} checked in \d+:\d\d \([\d.]+ [KMGT]?B/s\)\n", r.stdout
    ), r.stdout


def test_figures_text_and_units():
    f = {"elapsed_s": 9.2, "bytes": 5_670_000_000, "throughput_bps": 612_300_000.0}
    assert cp.figures_text(f) == "5.67 GB in 0:09 (612 MB/s)"
    assert cp.figures_text(f, "checked") == "5.67 GB checked in 0:09 (612 MB/s)"
    assert cp.convert_text({**f, "bytes_written": 1_200_000_000}) == (
        "5.67 GB (1.20 GB written) in 0:09 (612 MB/s)"
    )
    assert [cp.rate(x) for x in (5, 61.23, 612.3e3, 1.5e9)] == [
        "5.00 B/s",
        "61.2 B/s",
        "612 KB/s",
        "1.50 GB/s",
    ]
    assert [cp.duration(x) for x in (0.4, 65, 3 * 3600 + 61)] == ["0:00", "1:05", "3:01:01"]


# ---- 3. a resume says so, and reaches 100 % ----


def test_a_resume_says_what_it_reuses_and_reaches_100_percent(src, tmp_path):
    out = tmp_path / "out"
    assert cli("convert", src, out, *FP8, "-q").exit_code == 0
    shards = sorted(out.glob("model-*.safetensors"))
    gone = shards[len(shards) // 2]
    gone.unlink()  # a shard lost: the rest are reused
    kept = [p for p in shards if p != gone]
    r = cli("convert", src, out, *FP8, "--jobs", "1", env={cp.SECONDS_ENV: "0"})
    assert r.exit_code == 0, r.stderr
    err = r.stderr.splitlines()
    want = f"resuming: {len(kept)} files reused ({cp.size(sum(p.stat().st_size for p in kept))})"
    assert err[0] == want
    pcts = [p for _, p in progress_lines(r.stderr)]
    assert pcts and pcts[-1] == 100 and pcts == sorted(pcts)
    s = json.loads(cli("verify", out, "--json").stdout)
    assert s["ok"]


def test_a_killed_run_resumes_with_the_line_and_reaches_100_percent(src, tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "FI_CONVERT_DEBUG"}
    cmd = [sys.executable, "-m", "fi_convert", src, out, *FP8, "--jobs", "1"]
    cmd = list(map(str, cmd))
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**env, "_FI_CONVERT_KILL_AFTER_WRITES": "30"}
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (out / MANIFEST).exists()
    done = list(out.glob("model-*.safetensors"))
    assert done, "expected finished shards before the kill"
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**env, cp.SECONDS_ENV: "0"})
    assert proc.returncode == 0, proc.stderr
    nbytes = cp.size(sum(p.stat().st_size for p in done))
    assert proc.stderr.splitlines()[0] == f"resuming: {len(done)} files reused ({nbytes})"
    assert progress_lines(proc.stderr)[-1] == ("converting", 100)


def test_reused_bytes_reach_the_callback_as_done(src, tmp_path):
    from fi_convert import Options, SchemeName, convert

    opts = Options(SchemeName.FP8_BLOCK, max_shard_bytes=600_000)
    out = tmp_path / "out"
    convert(src, out, opts, device="cpu")
    next(iter(sorted(out.glob("model-*.safetensors")))).unlink()
    seen: list[Progress] = []
    convert(src, out, opts, device="cpu", progress=lambda p: seen.append(Progress(**vars(p))))
    first, last = seen[0], seen[-1]
    assert first.bytes_done == 0 and first.resume_files == len(list(out.glob("model-*"))) - 1
    assert last.bytes_done == last.bytes_total and last.tensors_done == last.tensors_total
    assert 0 < last.bytes_reused < last.bytes_total


# ---- 6. each warning once; --quiet ----


def _lp(prefix: str, *notes: str):
    return SimpleNamespace(prefix=prefix, notes=list(notes))


def test_per_layer_warnings_are_said_once_with_the_number_of_layers():
    lps = [_lp(f"model.layers.{k}.mlp.experts", f"model.layers.{k}.mlp.experts: no scales")
           for k in range(3, 61)]  # fmt: skip
    lps[0].notes.append("6 experts: not a multiple of 4")
    lps[1].notes.append("6 experts: not a multiple of 4")
    lps[2].notes.append("model.layers.5.mlp.experts: only here")
    assert grouped_notes(lps) == [  # type: ignore[arg-type]
        "58 layers (model.layers.3.mlp.experts to model.layers.60.mlp.experts): no scales",
        "6 experts: not a multiple of 4",
        "model.layers.5.mlp.experts: only here",
    ]


@pytest.fixture(scope="module")
def bf16(tmp_path_factory) -> Path:
    spec = Spec("qwen3-moe", layers=3, experts=4, hidden=128, intermediate=128)
    return write_checkpoint(tmp_path_factory.mktemp("bf16") / "q", spec)


def test_fp8_tensor_activation_scale_warning_is_said_once_and_quiet_silences_it(bf16, tmp_path):
    args = ["convert", bf16, tmp_path / "out", "--scheme", "fp8-tensor", "--device", "cpu"]
    args += ["--allow-unservable"]
    r = cli(*args)
    assert r.exit_code == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert warnings == [
        "warning: 3 layers (model.layers.0.mlp.experts to model.layers.2.mlp.experts): no "
        "static activation scales (input_scale), so none are written; vLLM's FlashInfer FP8 "
        "per-tensor kernels take static scales - the server must supply calibrated ones"
    ]
    assert json.loads(cli(*args, "--json").stdout)["warnings"] == [warnings[0][len("warning: ") :]]
    r = cli(*args, "-q")  # up to date now; the result is all that is said
    assert r.exit_code == 0 and r.stderr == ""
    assert r.stdout.startswith("up to date: ")
    r = cli(*args[:2], tmp_path / "other", *args[3:], "-q")
    assert r.exit_code == 0 and r.stderr == "" and r.stdout.startswith("done: ")


def test_quiet_leaves_errors(tmp_path):
    r = cli("convert", tmp_path / "nowhere", tmp_path / "out", "-q")
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and r.stdout == ""


# ---- 5. Hub downloads: one display ----


def _repo(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")}


def test_a_download_reports_to_our_display_and_hf_bars_stay_off(hub, bf16, capsys, monkeypatch):
    from fi_convert.hub import download

    monkeypatch.setenv("TQDM_POSITION", "-1")  # huggingface_hub's bars on, even in a pipe
    hub.add_repo("acme/tiny", _repo(bf16))
    seen: list[tuple[int, int]] = []
    src = download("acme/tiny", progress=lambda done, total: seen.append((done, total)))
    shards = sum(p.stat().st_size for p in bf16.glob("*.safetensors"))
    assert seen and seen[-1] == (shards, shards)
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False))
    assert capsys.readouterr().err == ""  # no bar of huggingface_hub's or hf_xet's
    assert sorted(p.name for p in src.path.glob("*.safetensors")) == sorted(
        p.name for p in bf16.glob("*.safetensors")
    )
    # the check can fail: huggingface_hub's own bars, where asked for, do print
    hub.add_repo("acme/tiny2", _repo(bf16))
    download("acme/tiny2", progress=True)
    assert capsys.readouterr().err != ""


def test_a_repo_id_conversion_prints_download_then_conversion_lines(hub, bf16, tmp_path):
    hub.add_repo("acme/tiny", _repo(bf16))
    args = ["convert", "acme/tiny", tmp_path / "out", "--scheme", "bf16", "--device", "cpu"]
    r = cli(*args, env={cp.SECONDS_ENV: "0"})
    assert r.exit_code == 0, r.stderr
    lines = progress_lines(r.stderr)
    labels = [label for label, _ in lines]
    assert labels == sorted(labels, key=["downloading", "converting"].index)  # one, then the other
    assert ("downloading", 100) in lines and lines[-1] == ("converting", 100)
    for ln in r.stderr.splitlines():  # nothing else on stderr: no bar, no stray fragment
        assert ln.startswith(("source: acme/tiny at ", "downloading: ", "converting: ")), ln
    r = cli(*args[:2], tmp_path / "quiet", *args[3:], "-q")  # the result, and nothing else
    assert r.exit_code == 0 and r.stderr == "" and r.stdout.startswith("done: ")


def test_push_summary_has_elapsed_size_and_throughput(hub, bf16, tmp_path):
    out = tmp_path / "out"
    assert cli("convert", bf16, out, "--scheme", "bf16", "--device", "cpu", "-q").exit_code == 0
    size = sum(m["size"] for m in json.loads((out / MANIFEST).read_text())["files"].values())
    r = cli("push", out, "acme/tiny-fi", "--base-model", "acme/tiny", "--json")
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["bytes"] == size and s["elapsed_s"] > 0 and s["throughput_bps"] > 0
    r = cli("push", out, "acme/tiny-fi2", "--base-model", "acme/tiny")
    assert r.exit_code == 0, r.stderr
    figures = rf"{SIZE} in \d+:\d\d \([\d.]+ [KMGT]?B/s\)"
    assert re.search(rf"^pushed: .*, {figures}\)$", r.stdout.strip()), r.stdout

"""fi_convert/pipeline.py, fi_convert/outdir.py and fi_convert/st_io.py: interrupted runs resume to
the same bytes; locks; write failures; hostile headers; links."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fi_convert import FiConvertError, Options, SchemeName, SourceError, convert, make_plan
from fi_convert.format.names import MANIFEST_NAME
from fi_convert.st_io import read_header
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .paused import Paused

MANIFEST = "fi-convert-manifest.json"


@pytest.fixture(scope="module")
def reference_out(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    convert(src, out, _opts(), device="cpu")
    return out


BUDGET = 2_400_000  # three workers' shares, each holding chunks of one expert


def _opts():  # small shards and chunks: many files and many writes to be killed between
    return Options(SchemeName.FP8_BLOCK, tp_size=2, max_shard_bytes=600_000, max_memory=BUDGET)


def _args(src: Path, out: Path, jobs: int = 0, tp: int = 2) -> list[str]:
    """`fi-convert`'s arguments for the options of `_opts` (with `tp`)."""
    args = [str(src), str(out), "--scheme", "fp8-block", "--tp-size", str(tp)]
    return args + [
        "--max-shard-size",
        "600000",
        "--max-memory",
        str(BUDGET),
        "--quiet",
        "-j",
        str(jobs),
    ]


def _run(
    src: Path, out: Path, env_extra: dict | None = None, jobs: int = 0, extra=(), **popen
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "fi_convert", *_args(src, out, jobs), *extra]
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, **popen)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.mark.parametrize(("kill_after", "jobs"), [(1, 1), (3, 1), (7, 3), (12, 1), (20, 3)])
def test_killed_run_resumes_to_identical_bytes(src, reference_out, tmp_path, kill_after, jobs):
    out = tmp_path / "out"
    r = _run(src, out, {"_FI_CONVERT_KILL_AFTER_WRITES": str(kill_after)}, jobs=jobs)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not (out / MANIFEST).exists(), "a killed run must not look complete"
    assert (out / ".fi-convert" / "lock").exists()  # the dead run's lock stays behind...
    r = _run(src, out, jobs=4 - jobs)  # ...and does not block the rerun, with other jobs
    assert r.returncode == 0, r.stderr
    assert _files(out) == _files(reference_out)
    assert not (out / ".fi-convert").exists()


def test_resume_reuses_finished_shards(src, tmp_path):
    out = tmp_path / "out"
    # one shard at a time: the shards before the 20th write are finished whatever the
    # machine's load (with several at once, all may still be in progress at the kill)
    r = _run(src, out, {"_FI_CONVERT_KILL_AFTER_WRITES": "20"}, jobs=1)
    assert r.returncode == -signal.SIGKILL
    done = [p.name for p in out.glob("model-*.safetensors")]
    assert done, "expected finished shards before the kill"
    r = _run(src, out, None)
    assert r.returncode == 0
    r = subprocess.run(
        [sys.executable, "-m", "fi_convert", "verify", str(out), "--json"],
        capture_output=True,
        text=True,
    )
    assert json.loads(r.stdout)["ok"] is True


def test_resume_recomputes_a_shard_changed_on_disk(src, reference_out, tmp_path):
    out = tmp_path / "out"
    killed = _run(src, out, {"_FI_CONVERT_KILL_AFTER_WRITES": "20"}, jobs=1)  # as above
    assert killed.returncode == -signal.SIGKILL
    shard = sorted(out.glob("model-*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert _run(src, out).returncode == 0
    assert _files(out) == _files(reference_out)


def test_second_run_into_same_out_dir_is_refused(src, tmp_path):
    out = tmp_path / "out"
    (out / ".fi-convert").mkdir(parents=True)
    lock = out / ".fi-convert" / "lock"
    hold = (  # another run: holds the flock and names itself in the file, as fi-convert does
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_CREAT | os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode())\n"
        "print('held', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = _run(src, out)
        assert r.returncode == 1
        assert f"another fi-convert (pid {holder.pid}) is writing here" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    finally:
        holder.kill()
        holder.wait()
    assert _run(src, out).returncode == 0  # the lock of a dead process does not block


def _busy(code: int, stderr: str, out: Path, pid: int) -> None:
    """A run's exit status and stderr: refused, in one line, since run `pid` writes `out`."""
    busy = f"error: {out}: another fi-convert (pid {pid}) is writing here; wait for it to finish"
    assert code == 1 and stderr.strip().splitlines() == [busy], stderr


def _snapshot(d: Path) -> dict[str, tuple[bytes, int] | None]:
    """Everything under `d`, hidden too: each file's bytes and mtime, each folder's name."""
    return {
        p.relative_to(d).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
        for p in sorted(d.rglob("*"))
    }


def test_a_refused_second_run_leaves_the_first_ones_work(src, reference_out, tmp_path):
    """A second run into an out-dir another run is writing is refused, and touches nothing:
    the first one's temporary file stays, and the first one finishes."""
    out = tmp_path / "out"
    with Paused(_args(src, out, jobs=1), {"write": "go"}) as first:
        first.wait_for("at write")  # holds the lock, and a shard's temporary file
        tmp = list(out.glob("*.fi-convert-tmp"))
        assert len(tmp) == 1
        r = _run(src, out)
        _busy(r.returncode, r.stderr, out, first.pid)
        assert tmp[0].exists(), "the refused run removed the first one's temporary file"
        first.go("write")
        code, _, stderr = first.finish()
    assert code == 0, stderr
    assert _files(out) == _files(reference_out)


def test_two_runs_started_together_one_finishes(src, reference_out, tmp_path):
    """Two runs that both found the out-dir empty: the one that takes the lock first finishes,
    the other is refused without touching its files."""
    out = tmp_path / "out"
    args = _args(src, out, jobs=1)
    with Paused(args, {"lock": "go", "write": "go"}) as a, Paused(args, {"lock": "go"}) as b:
        a.wait_for("at lock")
        b.wait_for("at lock")  # both looked at the out-dir: nothing there
        a.go("lock")
        a.wait_for("at write")
        tmp = list(out.glob("*.fi-convert-tmp"))
        b.go("lock")
        code, _, stderr = b.finish()
        _busy(code, stderr, out, a.pid)
        assert len(tmp) == 1 and tmp[0].exists()
        a.go("write")
        code, _, stderr = a.finish()
    assert code == 0, stderr
    assert _files(out) == _files(reference_out)


@pytest.mark.parametrize("tp", [2, 1])
def test_a_run_that_waited_for_the_lock_judges_the_out_dir_anew(src, tmp_path, tp):
    """A run that looked at the out-dir before another one finished there decides with the
    lock held: the same conversion is up to date, another one is refused; neither writes."""
    out = tmp_path / "out"
    with (
        Paused(_args(src, out), {"lock": "go"}) as a,
        Paused(_args(src, out, tp=tp), {"lock": "go"}) as b,
    ):
        a.wait_for("at lock")
        b.wait_for("at lock")
        a.go("lock")
        assert a.finish()[0] == 0
        before = _snapshot(out)
        b.go("lock")
        code, stdout, stderr = b.finish()
    if tp == 2:
        assert code == 0 and stdout.startswith("up to date"), stderr
    else:
        assert code == 1 and "holds a finished fi-convert output with other options" in stderr
        assert len(stderr.strip().splitlines()) == 1, stderr
    assert _snapshot(out) == before


def test_a_lock_naming_a_live_pid_that_holds_no_lock_does_not_block(src, tmp_path):
    """A container's killed PID 1 leaves a lock file naming PID 1, which the restarted
    container's PID 1 is again: only a held flock blocks, never a PID in a file."""
    out = tmp_path / "out"
    (out / ".fi-convert").mkdir(parents=True)
    (out / ".fi-convert" / "lock").write_text("1")  # alive (init), holds no lock
    r = _run(src, out)
    assert r.returncode == 0, r.stderr
    assert (out / MANIFEST).exists() and not (out / ".fi-convert").exists()


def _limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


@pytest.mark.parametrize("jobs", [1, 3])
def test_write_failure_ends_clearly_without_manifest(src, tmp_path, jobs):
    """A full disk, simulated by a file-size limit on the process. With several shards in
    flight, the failing one stops the others and each removes its temporary file."""
    out = tmp_path / "out"
    r = _run(src, out, jobs=jobs, preexec_fn=_limit_file_size)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "write failed" in lines[0]
    assert "run the same command again to resume" in lines[0]
    assert not (out / MANIFEST).exists()
    assert not list(out.glob("*.fi-convert-tmp")), "temporary files must be removed"
    assert _run(src, out).returncode == 0  # and, with room again, it finishes


def test_symlinked_shard_outside_the_folder_is_refused(tmp_path):
    src = write_checkpoint(tmp_path / "m", Spec("qwen3-moe", layers=1, experts=2, shards=2))
    shard = sorted(src.glob("*.safetensors"))[0]
    elsewhere = tmp_path / "elsewhere.safetensors"
    shard.rename(elsewhere)
    shard.symlink_to(elsewhere)
    with pytest.raises(SourceError, match="outside the model folder"):
        make_plan(src, Options())


def test_hf_cache_snapshot_symlinks_are_accepted(tmp_path):
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = write_checkpoint(repo / "snapshots" / "abc123", Spec("qwen3-moe", layers=1, experts=2))
    (repo / "blobs").mkdir()
    for p in snap.glob("*.safetensors"):
        blob = repo / "blobs" / p.name
        p.rename(blob)
        p.symlink_to(os.path.relpath(blob, p.parent))
    assert make_plan(snap, Options()).scheme is SchemeName.BF16


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_corrupt_headers_never_give_a_traceback(tmp_path, data):
    """Random corruption of a shard's header bytes: a SourceError naming the file, or a
    header that still parses - never another exception."""
    src = tmp_path / "one.safetensors"
    if not src.exists():
        import torch
        from safetensors.torch import save_file

        save_file({"a": torch.zeros(4, 4), "b.weight": torch.ones(3, dtype=torch.bfloat16)}, src)
    raw = bytearray(src.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, 8 + n - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(bytes(raw[:cut]))
    try:
        read_header(bad)
    except FiConvertError as e:
        assert str(bad) in str(e)


def test_shards_without_experts_are_carried_over_as_they_are(tmp_path):
    spec = Spec("deepseek-v3", layers=3, dense_layers=1, experts=4, shards=8)
    src = write_checkpoint(tmp_path / "src", spec)
    plan = make_plan(src, Options())
    copied = [s for s in plan.shards if s.copy_of is not None]
    assert len(copied) == 2  # the embedding and the dense layer's shards
    out = tmp_path / "out"
    convert(src, out, Options(), device="cpu")
    for s in copied:
        assert (out / s.name).read_bytes() == s.copy_of.read_bytes()
    r = subprocess.run(
        [sys.executable, "-m", "fi_convert", "verify", str(out), "--source", str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_scale_chunks_count_the_weights_they_read(tmp_path):
    """A BF16 -> mxfp8 scale tensor is made by quantizing the BF16 weights: its chunks are
    sized by that staging, not by its own small output (which would stage a whole layer)."""
    from fi_convert.pipeline import _chunk_experts as chunk

    src = write_checkpoint(tmp_path / "m", Spec("qwen3-moe", layers=1, experts=16, hidden=256))
    budget = 6 * 2**20
    plan = make_plan(src, Options(SchemeName.MXFP8, max_memory=budget))
    outs = {o.name: o for o in plan.layers[0].outputs}
    scale, weight = outs["w13_weight_scale"], outs["w13_weight"]
    assert scale.expert_nbytes * 16 < weight.expert_nbytes  # a small output...
    assert chunk(scale, budget) <= chunk(weight, budget) < 16  # ...chunked like the weights


@pytest.mark.parametrize("jobs", [1, 2, 5])
def test_jobs_do_not_change_the_bytes(src, reference_out, tmp_path, jobs):
    out = tmp_path / "out"
    res = convert(src, out, _opts(), device="cpu", jobs=jobs)
    assert res.jobs == min(jobs, 3)  # the budget allows three
    assert _files(out) == _files(reference_out)


def test_jobs_fit_the_memory_budget(src):
    from fi_convert.pipeline import MAX_JOBS, _chunk_need, _jobs

    plan = make_plan(src, _opts())
    need = max(_chunk_need(o) for lp in plan.layers for o in lp.outputs)
    assert 1 <= _jobs(plan, 0) <= MAX_JOBS
    assert _jobs(plan, 100) == min(len(plan.shards), plan.options.max_memory // need)
    tight = make_plan(src, Options(SchemeName.FP8_BLOCK, tp_size=2, max_memory=need + 1))
    assert _jobs(tight, 8) == 1  # a second worker's share could not hold one expert


def test_failing_shard_cancels_the_others(src, tmp_path, monkeypatch):
    """One worker's error ends the run with that error (not a cancellation), and no shard
    that was in flight is left under its final name or as a temporary file."""
    from fi_convert import pipeline as conv

    real = conv._produce_tensor
    calls = {"n": 0}

    def flaky(it, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 4:
            raise SourceError(f"{it.entry.name}: injected failure")
        return real(it, *a, **kw)

    monkeypatch.setattr(conv, "_produce_tensor", flaky)
    out = tmp_path / "out"
    with pytest.raises(SourceError, match="injected failure"):
        convert(src, out, _opts(), device="cpu", jobs=3)
    assert not (out / MANIFEST).exists()
    assert not list(out.glob("*.fi-convert-tmp"))
    journal = json.loads((out / ".fi-convert" / "state.json").read_text())["files"]
    finished = {p.name for p in out.glob("model-*.safetensors")}
    assert finished == {n for n in journal if n.startswith("model-")}  # complete, recorded
    for name in finished:
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == journal[name]["sha256"]


@pytest.mark.parametrize("fsync", [True, False])
def test_fsync_flushes_every_file_before_the_manifest(
    src, reference_out, tmp_path, monkeypatch, fsync
):
    from fi_convert import outdir as conv

    synced: list[tuple[str, bool]] = []
    real = conv._fsync

    def spy(path):
        synced.append((Path(path).name, (tmp_path / "out" / MANIFEST).exists()))
        real(path)

    monkeypatch.setattr(conv, "_fsync", spy)
    res = convert(src, tmp_path / "out", _opts(), device="cpu", fsync=fsync)
    files = set(res.manifest["files"])
    before = {name for name, after in synced if not after}
    assert (before == files | {"out"}) if fsync else not synced
    # after the manifest, only the folder (its rename of the manifest)
    assert {name for name, after in synced if after} <= {"out"}
    assert _files(tmp_path / "out") == _files(reference_out)


def test_cli_jobs_and_no_fsync(src, reference_out, tmp_path):
    out = tmp_path / "out"
    r = _run(src, out, jobs=2, extra=["--no-fsync", "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["jobs"] == 2
    assert _files(out) == _files(reference_out)


@pytest.fixture(scope="module")
def larger(tmp_path_factory):  # shards that take many writes: a signal lands in one
    spec = Spec("deepseek-v3", layers=4, experts=16, hidden=512, intermediate=1024, shards=4)
    return write_checkpoint(tmp_path_factory.mktemp("larger") / "ds", spec)


def _larger_args(src: Path, out: Path, jobs: int) -> list[str]:
    return [
        str(src),
        str(out),
        "--scheme",
        "fp8-block",
        "--max-memory",
        "30000000",
        "-j",
        str(jobs),
    ]


def _stopped_cleanly(code: int, stderr: str, out: Path, want: int = 130, word="interrupted"):
    """Exit `want`, one line saying how to resume, no manifest, no temporary file, no lock."""
    assert code == want, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "run the same command again to resume" in lines[0], stderr
    assert lines[0].startswith(word), stderr
    assert not (out / MANIFEST).exists()
    assert not list(out.rglob("*.fi-convert-tmp"))
    assert not (out / ".fi-convert" / "lock").exists()


@pytest.mark.parametrize(
    ("jobs", "sig", "code", "word"),
    [
        (1, signal.SIGINT, 130, "interrupted"),
        (3, signal.SIGINT, 130, "interrupted"),
        (3, signal.SIGTERM, 143, "terminated"),  # docker stop, a cancelled CI job
    ],
)
def test_ctrl_c_stops_cleanly_and_the_rerun_resumes(larger, tmp_path, jobs, sig, code, word):
    """SIGINT (or SIGTERM) in the middle of writing a shard: exit 130 (143), one line saying
    how to resume, no manifest, no temporary files, no lock; the same command then finishes
    the job."""
    out = tmp_path / "out"
    args = [*_larger_args(larger, out, jobs), "--json"]
    with Paused(args, {"write": "stop"}) as run:
        run.wait_for("at write")
        run.interrupt(sig)
        _stopped_cleanly(*run.finish()[::2], out, code, word)
    r = subprocess.run([sys.executable, "-m", "fi_convert", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["jobs"] == jobs
    assert (out / MANIFEST).exists()


def test_shards_are_packed_evenly(src):
    from fi_convert.plan import _pack

    limit = 600_000
    plan = make_plan(src, Options(SchemeName.FP8_BLOCK, tp_size=2, max_shard_bytes=limit))
    items = [it for s in plan.shards for it in s.items]
    greedy = _pack(items, limit, {s.copy_of for s in plan.shards if s.copy_of})
    assert len(plan.shards) == len(greedy)

    def largest(shards):  # of those that were packed (not one oversized tensor alone)
        return max(s.nbytes for s in shards if len(s.items) > 1)

    assert largest(plan.shards) < largest(greedy)  # more even than filling up to the limit
    assert largest(plan.shards) <= limit


def test_staging_buffers_are_reused_and_kept_apart():
    from fi_convert.schemes.base import Ctx
    from fi_convert.st_io import SourceFiles

    ctx = Ctx(SourceFiles(), torch.device("cpu"))
    a, b = ctx.stage((4, 8), torch.float32), ctx.stage((100,), torch.uint8)
    assert a.data_ptr() != b.data_ptr()  # both in use at once
    ptrs = {a.data_ptr(), b.data_ptr()}
    ctx.release()
    c, d = ctx.stage((50,), torch.uint8), ctx.stage((2, 16), torch.float32)
    assert {c.data_ptr(), d.data_ptr()} == ptrs  # the same memory again, best fit first
    assert c.data_ptr() == b.data_ptr() and d.data_ptr() == a.data_ptr()
    ctx.release()
    big = ctx.stage((1000,), torch.uint8)  # fits neither: one old buffer is given back
    assert big.data_ptr() not in ptrs and len(ctx._free) == 1


@pytest.mark.parametrize("works", ["copy_file_range", "sendfile", "neither"])
def test_carried_over_bytes_are_the_same_however_the_kernel_copies(
    src, reference_out, tmp_path, monkeypatch, works
):
    """Across filesystems copy_file_range fails with EXDEV, and elsewhere sendfile may not
    take files: the writer falls back, and the bytes and hashes stay the same."""
    import errno

    def refuse(*a, **kw):
        raise OSError(errno.EXDEV if works != "neither" else errno.EINVAL, "not here")

    if works != "copy_file_range":
        monkeypatch.setattr(os, "copy_file_range", refuse)
    if works == "neither":
        monkeypatch.setattr(os, "sendfile", refuse)
    res = convert(src, tmp_path / "out", _opts(), device="cpu")
    assert _files(tmp_path / "out") == _files(reference_out)
    for name, meta in res.manifest["files"].items():
        data = (tmp_path / "out" / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == meta["sha256"]


def test_full_disk_during_a_kernel_copy_is_a_write_failure(src, tmp_path, monkeypatch):
    import errno

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "copy_file_range", full)
    out = tmp_path / "out"
    with pytest.raises(FiConvertError, match="write failed .*No space left.*resume"):
        convert(src, out, _opts(), device="cpu")
    assert not (out / MANIFEST).exists()
    assert not list(out.glob("*.fi-convert-tmp"))


@pytest.mark.parametrize("pinned", [False, True])
def test_host_buffers_fit_the_budget(src, pinned):
    """A worker's ring (DEPTH + 1 buffers) and staging fit its share of the budget, also when
    pinned memory is rounded up to a power of two (PyTorch's caching host allocator)."""
    from fi_convert.pipeline import DEPTH, _chunk_experts, _chunk_need, _host_bytes

    def pow2(n: int) -> int:
        return 1 << (n - 1).bit_length()

    plan = make_plan(src, Options(SchemeName.FP8_BLOCK, tp_size=2))
    for o in (o for lp in plan.layers for o in lp.outputs if o.chunked):
        per = max(o.expert_nbytes, o.stage_nbytes)
        for budget in (_chunk_need(o, pinned), 3 * _chunk_need(o, pinned) + 12345, 10**9):
            n = _chunk_experts(o, budget, pinned)
            ring, stage = n * o.expert_nbytes, n * per
            if pinned:
                ring, stage = pow2(ring), pow2(stage)
            assert (DEPTH + 1) * ring + stage <= budget, (o.name, budget)
            if n < o.rank_shape[0]:  # and no more experts would fit: the most the budget allows
                assert _host_bytes((n + 1) * per, pinned) > budget, (o.name, budget)


def test_cpu_chunks_stay_small_whatever_the_budget(tmp_path):
    """On CPU a chunk holds at most CPU_CHUNK bytes (one expert when an expert is larger), so
    a large budget does not make the ring's buffers large (their first touch costs 0.9 s per
    GiB on a 2-core VM, and small ones stay in the caches); on CUDA the budget decides."""
    from fi_convert.pipeline import CPU_CHUNK, _Ring

    spec = Spec("qwen3-moe", layers=1, experts=64, hidden=1024, intermediate=1536, shards=1)
    plan = make_plan(write_checkpoint(tmp_path / "m", spec), Options(SchemeName.BF16))
    w13 = next(o for o in plan.layers[0].outputs if o.name == "w13_weight")
    assert w13.expert_nbytes == 2 * 1536 * 1024 * 2  # 6 MiB: two fit in CPU_CHUNK
    budget = 2**30
    cpu, cuda = _Ring(plan, budget, False, CPU_CHUNK), _Ring(plan, budget, False)
    assert cpu.experts(w13) == CPU_CHUNK // w13.expert_nbytes == 2
    assert cpu.capacity <= CPU_CHUNK
    assert cuda.experts(w13) > 8 and cuda.capacity > 8 * CPU_CHUNK // 2
    one = replace(w13, rank_shape=(64, 8 * 1536, 1024))  # 24 MiB per expert
    assert one.expert_nbytes > CPU_CHUNK and _Ring(plan, budget, False, CPU_CHUNK).experts(one) == 1


_RSS_CHILD = """
import sys
from pathlib import Path
from fi_convert import Options, SchemeName, convert
root, budget, dev = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def rss(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) << 10
convert(root / "small", root / "o-small", Options(SchemeName.FP8_BLOCK), device=dev)
base = rss("VmRSS")  # torch loaded, its kernels warm (and on CUDA, its context made)
opts = Options(SchemeName.FP8_BLOCK, max_memory=budget)
convert(root / "big", root / f"o-big-{budget}", opts, device=dev)  # a fresh out-dir each
print(rss("VmHWM") - base)
"""


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_memory_is_bounded_by_the_budget_not_the_layer(tmp_path, device):
    """A MoE layer six times the budget converts with a working set (peak resident memory
    minus resident memory before, in a fresh process) inside the budget; a larger budget lets
    it grow, so the budget is what bounds it. On CUDA the host buffers are pinned."""
    write_checkpoint(
        tmp_path / "small", Spec("deepseek-v3", layers=2, experts=4, hidden=256, intermediate=256)
    )
    big = Spec("deepseek-v3", layers=2, experts=64, hidden=2048, intermediate=768, shards=2)
    write_checkpoint(tmp_path / "big", big)
    layer = 64 * 3 * 768 * 2048  # FP8 bytes of one MoE layer's experts: 288 MiB
    budget = 48 * 2**20

    def working_set(max_memory: int) -> int:
        cmd = [sys.executable, "-c", _RSS_CHILD, str(tmp_path), str(max_memory), device]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.split()[-1])

    assert layer >= 6 * budget
    small = working_set(budget)
    assert small <= budget, f"working set {small / 2**20:.1f} MiB, budget 48 MiB"
    assert working_set(4 * budget) > budget  # the measure sees memory the budget allows


@pytest.mark.parametrize("family", ["qwen3-moe", "qwen3-moe-fused"])
def test_reading_a_chunk_prefetches_the_next(tmp_path, monkeypatch, family):
    """After reading a chunk of experts, the kernel is asked to read ahead exactly the bytes
    the next chunk of the same size will read, and nothing past the last expert."""
    from fi_convert import st_io
    from fi_convert.source import find_family, open_checkpoint

    spec = Spec(family, layers=1, experts=5, hidden=128, intermediate=256)
    ckpt = open_checkpoint(write_checkpoint(tmp_path / "m", spec))
    layer = find_family(ckpt)[1][0]
    advised: list[tuple[int, int]] = []
    read: list[tuple[int, int]] = []
    monkeypatch.setattr(st_io.os, "posix_fadvise", lambda fd, off, n, how: advised.append((off, n)))
    real = st_io.pread_into

    def pread_into(fd, offset, dst, path):
        read.append((offset, dst.numel() * dst.element_size()))
        real(fd, offset, dst, path)

    monkeypatch.setattr(st_io, "pread_into", pread_into)
    files = st_io.SourceFiles()
    rows = (64, 128)  # the second of two tensor-parallel ranks
    dst = torch.empty(2, 64, 128, dtype=torch.bfloat16)
    chunks = [range(0, 2), range(2, 4), range(4, 5)]
    seen = []
    for experts in chunks:
        advised.clear()
        read.clear()
        layer.read(files, "w1", "weight", experts, rows, None, dst[: len(experts)])
        seen.append((list(read), list(advised)))
    files.close()
    assert len(seen[0][1]) == 2 and seen[0][1] == seen[1][0]  # advised == what chunk 2 read
    assert len(seen[1][1]) == 1 and seen[1][1] == seen[2][0]  # the last chunk: one expert
    assert seen[2][1] == []  # nothing past the last expert
    assert all(n == 64 * 128 * 2 for _, n in seen[0][0] + seen[0][1])


@pytest.mark.parametrize("jobs", [1, 3])
def test_more_ctrl_c_during_the_cleanup_give_no_traceback(larger, tmp_path, jobs):
    """An impatient user presses Ctrl-C again and again while the first one's cleanup runs
    (while a shard's temporary file is removed, and while the out-dir's cleanup runs): still
    one line, exit 130, no temporary file, no lock; the rerun resumes."""
    out = tmp_path / "out"
    args = [*_larger_args(larger, out, jobs), "--quiet"]
    with Paused(args, {"write": "stop", "abort": "go", "cleanup": "go"}) as run:
        run.wait_for("at write")
        run.interrupt()
        for point in ("abort", "cleanup"):
            run.wait_for(f"at {point}")
            run.interrupt()
            run.interrupt()
            run.go(point)
        _stopped_cleanly(*run.finish()[::2], out)
    assert "workers 0" in run.said  # every worker had stopped before the cleanup
    r = subprocess.run([sys.executable, "-m", "fi_convert", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_ctrl_c_while_the_workers_start_stops_every_worker(larger, tmp_path):
    """Ctrl-C while the first shard worker is being started (inside `Thread.start`, before
    its pool counts it), with that worker writing already: every worker stops and removes its
    file before the out-dir's cleanup looks for temporary files (a worker left running made
    new ones after it, or died in one at the exit)."""
    out = tmp_path / "out"
    points = {"started": "go", "write": "stop", "cleanup": "go"}
    with Paused([*_larger_args(larger, out, 3), "--quiet"], points) as run:
        run.wait_for("at started")
        run.wait_for("at write")
        run.interrupt()
        run.go("started")
        run.wait_for("at cleanup")
        assert run.said[-2] == "workers 0"
        run.go("cleanup")
        _stopped_cleanly(*run.finish()[::2], out)


# ------------------------------------------- a finished output holds only what a clean run writes


def _verify(out: Path) -> dict:
    cmd = [sys.executable, "-m", "fi_convert", "verify", str(out), "--json"]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True).stdout)


def _all_files(d: Path) -> dict[str, bytes]:
    return {
        p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()
    }


def test_a_run_killed_after_its_manifest_is_finished_by_the_rerun(src, reference_out, tmp_path):
    """SIGKILL between the manifest's write and the state folder's removal: the folder holds
    the lock of a dead run; `verify` names it, and the rerun (up to date) removes it."""
    out = tmp_path / "out"
    with Paused(_args(src, out), {"committed": "go"}) as run:
        run.wait_for("at committed")
        run.interrupt(signal.SIGKILL)
        code, _, _ = run.finish()
    assert code == -signal.SIGKILL
    assert (out / MANIFEST).exists() and (out / ".fi-convert" / "lock").exists()
    said = _verify(out)
    assert said["ok"] is False
    assert [p for p in said["problems"] if ".fi-convert" in p] == [
        f"{out / '.fi-convert'}: a conversion's state folder, which a finished output does not "
        "hold (a run was killed after its manifest, or one is writing here); run the "
        "conversion's command again, which removes it (or remove it)"
    ], said
    r = _run(src, out)
    assert r.returncode == 0, r.stderr
    assert not (out / ".fi-convert").exists()
    assert _all_files(out) == _all_files(reference_out)
    assert _verify(out)["ok"] is True


@pytest.mark.parametrize("left", [["lock"], ["lock", "state.json"], []])
def test_a_stale_state_folder_in_a_finished_output_is_removed_by_a_rerun(
    src, reference_out, tmp_path, left
):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(reference_out, out)
    (out / ".fi-convert").mkdir()
    for name in left:
        (out / ".fi-convert" / name).write_text("{}" if name == "state.json" else "1")
    assert _verify(out)["ok"] is False
    r = _run(src, out, extra=["--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["up_to_date"] is True  # nothing of the output rewritten
    assert not (out / ".fi-convert").exists()
    assert _all_files(out) == _all_files(reference_out)
    assert _verify(out)["ok"] is True


def test_a_finished_output_whose_lock_a_live_run_holds_is_left_to_it(src, reference_out, tmp_path):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(reference_out, out)
    (out / ".fi-convert").mkdir()
    lock = out / ".fi-convert" / "lock"
    hold = (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(lock)!r}, os.O_CREAT | os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode())\n"
        "print('held', flush=True); sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        r = _run(src, out)
        _busy(r.returncode, r.stderr, out, holder.pid)
        assert lock.exists()
    finally:
        holder.communicate("")


@pytest.mark.parametrize("how", ["with", "set_default_device"])
@pytest.mark.parametrize(
    "scheme,spec",
    [
        (SchemeName.NVFP4, Spec("deepseek-v3", experts=5, hidden=320, intermediate=384)),
        (SchemeName.BF16, Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=192)),
    ],
    ids=["nvfp4", "bf16"],
)
def test_a_default_device_the_caller_set_changes_nothing(tmp_path, how, scheme, spec):
    """A Python caller's default device (`with torch.device(...)`, `set_default_device`: a
    server's load sets one) does not reach the conversion: its indices and buffers stay host
    tensors, and the output's bytes are a plain run's (it failed on "meta", as on "cuda", in
    the layouts' index gathers)."""
    if scheme is SchemeName.NVFP4:
        spec = replace(spec, quant="nvfp4")
    src = write_checkpoint(tmp_path / "src", spec)
    convert(src, tmp_path / "plain", Options(scheme), device="cpu")
    if how == "with":
        with torch.device("meta"):
            convert(src, tmp_path / "out", Options(scheme), device="cpu")
    else:
        torch.set_default_device("meta")
        try:
            convert(src, tmp_path / "out", Options(scheme), device="cpu")
        finally:
            torch.set_default_device(None)
    plain = json.loads((tmp_path / "plain" / MANIFEST_NAME).read_text())["files"]
    out = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["files"]
    assert out == plain

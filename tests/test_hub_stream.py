"""fi_convert/hub/stream.py: streaming conversions to the Hub within a disk budget, from a local
folder and from a Hub repo read by byte ranges (fi_convert.hub.remote), against the loopback Hub
look-alike with the real huggingface_hub client (see tests/test_hub.py)."""

from __future__ import annotations

import hashlib
import itertools
import json
from copy import copy
from pathlib import Path

import pytest

from fi_convert import Options
from fi_convert.hub import remote, stream
from fi_convert.hub.publish import TargetRepo
from fi_convert.plan import make_plan
from fi_convert.st_io import SourceFiles
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .test_hub import MANIFEST, TARGET, cli, repo_files

SRC = "acme/big-moe"
# 4 source shards, 4 MoE layers: several output shards, each a fraction of the whole
SPEC = Spec("qwen3-moe", layers=4, experts=16, hidden=128, intermediate=128, shards=4)
OPTS = Options(scheme="bf16", max_shard_bytes=1_000_000)
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("big") / "big-moe"
    write_checkpoint(d, SPEC)
    (d / "README.md").write_text("---\nlicense: mit\n---\n\n# big-moe\n")
    return d


@pytest.fixture(scope="module")
def local_out(big, tmp_path_factory) -> Path:
    """The same conversion written locally: what the streamed target must hold."""
    from fi_convert import convert

    out = tmp_path_factory.mktemp("local") / "out"
    convert(big, out, OPTS, device="cpu")
    return out


def _shards(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.safetensors"))}


def _target_shards(hub) -> dict[str, bytes]:
    return {p: b for p, b in hub.files(TARGET).items() if p.endswith(".safetensors")}


def _stream_local(big, tmp_path, **kw):
    plan = make_plan(big, OPTS)
    return stream.stream_to_hub(
        plan, SourceFiles(), tmp_path / "staging", TARGET, device="cpu", **kw
    )


def _stream_remote(hub, tmp_path, name="mirror", **kw):
    repo = remote.RemoteRepo.open(SRC)
    root = remote.mirror(repo, tmp_path / name)
    plan = make_plan(root, OPTS)
    files = remote.RemoteSourceFiles(repo, root)
    res = stream.stream_to_hub(
        plan, files, tmp_path / f"{name}-staging", TARGET, device="cpu", **kw
    )
    return res, repo, plan


def test_a_local_folder_streams_to_the_hub_as_the_local_conversion(hub, big, local_out, tmp_path):
    res = _stream_local(big, tmp_path)
    assert len(_shards(local_out)) >= 4
    assert _target_shards(hub) == _shards(local_out)
    files = hub.files(TARGET)
    assert (
        files["model.safetensors.index.json"]
        == (local_out / "model.safetensors.index.json").read_bytes()
    )
    assert files["config.json"] == (local_out / "config.json").read_bytes()
    m = json.loads(files[MANIFEST])
    for name, meta in m["files"].items():  # every file on the target is the manifest's
        assert hashlib.sha256(files[name]).hexdigest() == meta["sha256"], name
    # one commit per shard, then index, side files, card and manifest together, last
    messages = hub.repos[TARGET].messages
    assert MANIFEST in messages[-1][2] and "README.md" in messages[-1][2]
    assert sorted(res.uploaded) == sorted(_shards(local_out))
    assert not (tmp_path / "staging").exists()  # the staging folder is gone


def test_a_hub_repo_streams_by_byte_ranges_without_a_whole_shard_read(
    hub, big, local_out, tmp_path, monkeypatch
):
    made: list[remote.RemoteSourceFiles] = []
    init = remote.RemoteSourceFiles.__init__

    def kept(self, *a) -> None:
        init(self, *a)
        made.append(self)

    monkeypatch.setattr(remote.RemoteSourceFiles, "__init__", kept)
    hub.add_repo(SRC, repo_files(big))
    res, repo, plan = _stream_remote(hub, tmp_path)
    assert _target_shards(hub) == _shards(local_out)
    shard_oids = {f.sha256 for n, f in repo.files.items() if n.endswith(".safetensors")}
    reads = [(etag, rng) for etag, rng in hub.reads if etag in shard_oids]
    assert reads and all(rng is not None for _, rng in reads)  # only range reads
    # every byte of the source's shards read exactly once (and each header's length twice)
    total = sum(p.stat().st_size for p in plan.ckpt.shards)
    assert repo.bytes_read == total + 8 * len(plan.ckpt.shards)
    # and nearly all of them asked ahead, so the link kept busy while the converter worked:
    # here 11 of 223 reads wait (the first layer's, whose order the others follow, and the
    # first of each run of carried tensors); 17 when each call's first reads are not asked
    # ahead, 223 with no read-ahead at all
    data_reads = len(reads) - 2 * len(plan.ckpt.shards)  # less the headers
    assert made[0].waited < data_reads / 16, (made[0].waited, data_reads)
    # the mirror holds headers only: its shards are sparse
    for p in plan.ckpt.shards:
        assert p.stat().st_blocks * 512 < p.stat().st_size / 4, p.name


def test_the_staged_bytes_stay_within_the_disk_budget(hub, big, local_out, tmp_path):
    sizes = [len(b) for b in _shards(local_out).values()]
    budget = 2 * max(sizes) + (2 << 20)
    res = _stream_local(big, tmp_path, max_disk=budget)
    assert res.peak_disk <= budget
    assert _target_shards(hub) == _shards(local_out)


def test_the_next_shard_begins_while_uploads_hold_the_disk_and_its_writes_wait_for_room(
    hub, big, local_out, tmp_path
):
    """Shards made one at a time take their disk as they are written: with every upload after
    the first held, the next shard is begun although its whole size does not fit beside the
    staged ones (a reservation of it would have waited, and the source's reads with it), and
    its writes stop at the budget."""
    import threading
    import time

    plan = make_plan(big, OPTS)
    sizes = {s.name: stream._file_size(s) for s in plan.shards}
    budget = int(2.5 * max(sizes.values()))
    hold = hub.hold("PUT", r"^/lfs-upload/", after=1)
    got: list = []
    run = threading.Thread(
        target=lambda: got.append(_stream_local(big, tmp_path, max_disk=budget, jobs=1))
    )
    run.start()
    try:
        assert hold.reached.wait(60)
        staging = tmp_path / "staging"
        seen, still = None, 0
        deadline = time.monotonic() + 60
        while still < 5 and time.monotonic() < deadline:  # until the writes stop
            time.sleep(0.1)
            now = {p.name: p.stat().st_size for p in staging.glob("*.safetensors*")}
            still = still + 1 if now == seen else 0
            seen = now
        assert still == 5, "the staged files kept changing while the uploads were held"
        partial = [n for n in seen if n.endswith(".fi-convert-tmp")]
        assert len(partial) == 1, seen  # the shard being made, begun
        name = partial[0].removesuffix(".fi-convert-tmp")
        done = sum(v for n, v in seen.items() if n not in partial)
        assert done + sizes[name] > budget  # its whole size would not have fit
        assert sum(seen.values()) <= budget  # and what it wrote does
    finally:
        hold.release(serve=True)
        run.join(120)
    assert got and got[0].peak_disk <= budget
    assert _target_shards(hub) == _shards(local_out)


def test_a_write_waiting_for_room_gets_it_fails_with_the_run_or_gives_up_when_stopped():
    import threading

    from fi_convert.errors import HubError

    def sink():
        repo = TargetRepo(None, TARGET, "main", "")
        return stream.HubSink(repo, "k", None, 100, {}, by_write=True)

    def waiting(s, n, stop):
        out: list = []

        def take():
            try:
                s.take(n, stop)
                out.append("room")
            except BaseException as e:
                out.append(e)

        t = threading.Thread(target=take)
        t.start()
        t.join(0.3)
        assert t.is_alive() and not out  # it waits: n does not fit
        return t, out

    s, stop = sink(), threading.Event()
    s.take(80, stop)
    assert (s.staged, s.peak) == (80, 80)
    t, out = waiting(s, 40, stop)
    s.give(30)  # a shard's file went: room
    t.join(5)
    assert out == ["room"] and (s.staged, s.peak) == (90, 90)

    s = sink()
    s.take(80, stop)
    t, out = waiting(s, 40, stop)
    with s.cond:
        s.failed = HubError("the upload failed")
        s.cond.notify_all()
    t.join(5)
    assert len(out) == 1 and isinstance(out[0], HubError) and s.staged == 80

    s, stop = sink(), threading.Event()
    s.take(80, stop)
    t, out = waiting(s, 40, stop)
    stop.set()  # the run is being abandoned: the write gives up within the wait's period
    t.join(5)
    assert len(out) == 1 and not t.is_alive() and s.staged == 80


def test_uploads_follow_each_other_each_starting_shortly_before_the_one_before_ends():
    """The second upload starts only after the first ends (no speed known yet); later ones
    start before the one before them ends, not at once, and never more than two at a time."""
    import threading
    import time

    relay = stream.Relay()
    spans: dict[int, list[float]] = {}
    now_running = [0, 0]
    lock = threading.Lock()

    def upload(k: int) -> None:
        with relay.turn(1_000_000, lambda: None):
            with lock:
                spans[k] = [time.monotonic()]
                now_running[0] += 1
                now_running[1] = max(now_running[1], now_running[0])
            time.sleep(0.5)  # 1 MB at 2 MB/s
            with lock:
                now_running[0] -= 1
                spans[k].append(time.monotonic())

    threads = [threading.Thread(target=upload, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    order = sorted(spans.values())
    assert now_running[1] == 2
    assert order[1][0] >= order[0][1]  # the first is followed once done
    later = list(itertools.pairwise(order[1:]))
    assert any(nxt[0] < cur[1] for cur, nxt in later)  # then they overlap: the link never idles
    assert all(nxt[0] > cur[0] + 0.25 for cur, nxt in later)  # but only near the end


def test_a_budget_below_one_shard_is_refused_before_anything_is_written(hub, big, tmp_path):
    from fi_convert.errors import OutputError

    with pytest.raises(OutputError, match="--max-disk .* less than the largest output shard"):
        _stream_local(big, tmp_path, max_disk=100_000)
    assert TARGET not in hub.repos


def test_a_rerun_after_a_failed_upload_resumes_from_the_target(hub, big, local_out, tmp_path):
    """The third shard's commit fails; the rerun, in a fresh staging folder (a bare machine),
    converts and uploads only the shards the target does not hold, and ends as one run."""
    from fi_convert.errors import HubError

    hub.add_repo(SRC, repo_files(big))
    n = len(_shards(local_out))
    hub.fail("POST", f"/api/models/{TARGET}/commit/", status=500, times=1, after=2)
    with pytest.raises(HubError):
        _stream_remote(hub, tmp_path, "first")
    hub.rules.clear()
    first = set(_target_shards(hub))
    assert 0 < len(first) < n and MANIFEST not in hub.files(TARGET)
    seen = []
    res, _, _ = _stream_remote(hub, tmp_path, "second", progress=lambda p: seen.append(copy(p)))
    assert set(res.skipped) == first
    # said at the start (the CLI's "resuming: N files reused"), and counted done: 100 % at the end
    assert seen[0].resume_files == len(first) and seen[0].resume_bytes > 0
    assert seen[-1].bytes_done == seen[-1].bytes_total
    assert set(res.uploaded) == set(_shards(local_out)) - first
    assert _target_shards(hub) == _shards(local_out)
    assert MANIFEST in hub.files(TARGET)


def test_the_cli_streams_a_hub_source_with_push_to(hub, big, local_out, tmp_path):
    commit = hub.add_repo(SRC, repo_files(big))
    out = tmp_path / "out"
    r = cli(
        "convert", SRC, out, "--scheme", "bf16", "--device", "cpu", "--push-to", TARGET,
        "--max-shard-size", "1000000", "--max-disk", "64MiB", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["push"]["repo_id"] == TARGET and s["push"]["base_model"] == SRC
    assert s["push"]["peak_disk_bytes"] <= 64 << 20
    assert _target_shards(hub) == _shards(local_out)
    assert not out.exists()  # only a staging folder: gone
    m = json.loads(hub.files(TARGET)[MANIFEST])
    assert m["source"]["repo_id"] == SRC and m["source"]["revision"] == commit
    assert m["source"]["command"].startswith(f"fi-convert {SRC} OUT_DIR --revision {commit}")
    card = hub.files(TARGET)["README.md"].decode()
    assert f"base_model: {SRC}" in card and commit in card
    # nothing of the source was downloaded whole: only range reads of its shards
    shards = {
        hashlib.sha256(b).hexdigest()
        for n, b in repo_files(big).items()
        if n.endswith(".safetensors")
    }
    assert all(rng for etag, rng in hub.reads if etag in shards)
    # and the output verifies as a download
    from huggingface_hub import snapshot_download

    path = snapshot_download(TARGET, cache_dir=tmp_path / "dl")
    assert cli("verify", path).exit_code == 0
    # run again: nothing to convert or upload, said in our line, not huggingface_hub's
    r = cli(
        "convert", SRC, out, "--scheme", "bf16", "--device", "cpu", "--push-to", TARGET,
        "--max-shard-size", "1000000", "--max-disk", "64MiB",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert "0 shards uploaded" in r.stdout and "already there" in r.stdout
    assert "No files have been modified" not in r.stdout + r.stderr


def test_stream_source_is_the_streamed_command_for_a_python_caller(hub, big, local_out, tmp_path):
    """`fi_convert.stream_source` does what `fi-convert SRC STAGING --push-to TARGET` does."""
    import fi_convert

    commit = hub.add_repo(SRC, repo_files(big))
    done = fi_convert.stream_source(SRC, tmp_path / "staging", TARGET, OPTS, device="cpu")
    assert _target_shards(hub) == _shards(local_out)
    assert sorted(done.result.uploaded) == sorted(_shards(local_out))
    source = json.loads(hub.files(TARGET)[MANIFEST])["source"]
    assert (source["repo_id"], source["revision"]) == (SRC, commit)
    assert done.summary["scheme"] == "bf16" and not (tmp_path / "staging").exists()


def test_a_push_target_that_cannot_be_written_fails_before_any_work(hub, big, tmp_path):
    hub.add_repo(SRC, repo_files(big))
    hub.account["orgs"] = ["other"]
    r = cli("convert", SRC, tmp_path / "out", "--push-to", TARGET, "--device", "cpu")
    assert r.exit_code == 1
    assert "cannot create repos in acme (its namespaces: other, tester)" in r.stderr
    assert not hub.reads and not (tmp_path / "out").exists()
    hub.account.update(orgs=["acme"], role="read")
    r = cli("convert", SRC, tmp_path / "out", "--push-to", TARGET, "--device", "cpu")
    assert r.exit_code == 1 and "read-only" in r.stderr
    r = cli("convert", SRC, tmp_path / "out", "--push-to", "not a repo", "--device", "cpu")
    assert r.exit_code == 1 and "not a Hub repo id" in r.stderr
    assert not hub.reads


def _swap_two_experts(shard: bytes, name: str) -> bytes:
    """The shard with experts 0 and 1 of tensor `name` swapped, header unchanged."""
    n = int.from_bytes(shard[:8], "little")
    entry = json.loads(shard[8 : 8 + n])[name]
    a, b = (8 + n + x for x in entry["data_offsets"])
    per = (b - a) // entry["shape"][1]  # [tp, E, ...]: rows of rank 0 are its experts
    body = bytearray(shard)
    body[a : a + per], body[a + per : a + 2 * per] = (
        shard[a + per : a + 2 * per],
        shard[a : a + per],
    )
    return bytes(body)


def test_verify_checks_a_published_output_on_the_hub_without_downloading_it(
    hub, big, local_out, tmp_path
):
    hub.add_repo(SRC, repo_files(big))
    _stream_remote(hub, tmp_path)
    hub.reads.clear()
    r = cli("verify", TARGET, "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    read = json.loads(r.stdout)["hub_reads"][TARGET]
    out_bytes = sum(len(b) for b in _target_shards(hub).values())
    assert read["bytes"] < out_bytes / 10  # headers only: the shards are checked by metadata
    # with --source: a sample of experts re-derived, reading only their byte ranges
    r = cli("verify", TARGET, "--source", SRC, "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    read = json.loads(r.stdout)["hub_reads"]
    src_bytes = sum(len(b) for n, b in repo_files(big).items() if n.endswith(".safetensors"))
    assert 0 < read[TARGET]["bytes"] < out_bytes / 2 and 0 < read[SRC]["bytes"] < src_bytes / 2
    oids = {hashlib.sha256(b).hexdigest() for b in _target_shards(hub).values()}
    oids |= {hashlib.sha256(b).hexdigest() for b in repo_files(big).values()}
    assert all(rng for etag, rng in hub.reads if etag in oids)  # no shard read whole


def test_remote_verify_catches_a_corrupt_file_a_wrong_expert_and_an_extra_file(
    hub, big, local_out, tmp_path
):
    hub.add_repo(SRC, repo_files(big))
    _stream_remote(hub, tmp_path)
    shards = _target_shards(hub)
    name = sorted(shards)[1]
    # a flipped byte: the Hub's SHA-256 of the file is not the manifest's
    bad = bytearray(shards[name])
    bad[-1] ^= 0xFF
    good_commit = hub.repos[TARGET].branches["main"]
    hub.add_repo(TARGET, {name: bytes(bad), "notes.txt": b"x"})
    r = cli("verify", TARGET)
    assert r.exit_code == 1
    assert f"{TARGET}/{name}: SHA-256 on the Hub differs from the manifest" in r.stderr
    assert f"{TARGET}/notes.txt: on the Hub, but the manifest does not list it" in r.stderr
    # a wrong expert with a manifest that vouches for it: only --source can tell
    hub.repos[TARGET].branches["main"] = good_commit
    m = json.loads(hub.files(TARGET)[MANIFEST])
    header = json.loads(shards[name][8 : 8 + int.from_bytes(shards[name][:8], "little")])
    tensor = next(k for k in header if k.endswith("w13_weight"))
    swapped = _swap_two_experts(shards[name], tensor)
    m["files"][name] = {"sha256": hashlib.sha256(swapped).hexdigest(), "size": len(swapped)}
    manifest = (json.dumps(m, indent=2, sort_keys=True) + "\n").encode()
    hub.add_repo(TARGET, {name: swapped, MANIFEST: manifest})
    assert cli("verify", TARGET).exit_code == 0  # consistent, so the metadata cannot tell
    r = cli("verify", TARGET, "--source", SRC, "--device", "cpu")
    assert r.exit_code == 1 and f"{tensor} rank 0 differs from the source" in r.stderr


def test_the_ci_recipe_is_valid_and_uses_only_options_the_cli_has():
    import re

    import typer.main
    import yaml

    from fi_convert.cli import app

    root = Path(__file__).resolve().parent.parent
    wf = yaml.safe_load((root / "examples" / "ci" / "publish.yml").read_text())
    job = wf["jobs"]["publish"]
    assert wf["concurrency"]["group"].endswith("${{ inputs.target }}")
    script = "\n".join(s.get("run", "") for s in job["steps"]).replace("\\\n", " ")
    cmd = typer.main.get_command(app)
    calls = re.findall(r"fi-convert [^\n]*", script)
    assert len(calls) >= 3  # version, the streamed conversion, verify
    for line in calls:
        words = line.split()
        sub = words[1] if words[1] in cmd.commands else "convert"
        known = {o for p in cmd.commands[sub].params for o in p.opts + p.secondary_opts}
        for flag in (w for w in words if w.startswith("--")):
            assert flag in known, f"{sub} has no {flag}"
    assert "torch==2.13.0" in script  # pinned CPU torch


def test_parts_of_a_split_run_and_the_final_run_give_the_single_runs_target(
    hub, big, local_out, tmp_path
):
    hub.add_repo(SRC, repo_files(big))
    n = len(_shards(local_out))
    args = ("--scheme", "bf16", "--device", "cpu", "--push-to", TARGET, "--max-shard-size")
    args += ("1000000", "--json")
    done: set[str] = set()
    for k in (1, 2, 3):
        r = cli("convert", SRC, tmp_path / f"part{k}", *args, "--part", f"{k}/3")
        assert r.exit_code == 0, r.stderr
        mine = set(json.loads(r.stdout)["push"]["uploaded_shards"])
        assert mine and not mine & done  # disjoint
        done |= mine
        assert MANIFEST not in hub.files(TARGET)  # no part claims the whole
    assert len(done) == n
    r = cli("convert", SRC, tmp_path / "final", *args)
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)["push"]
    assert s["uploaded_shards"] == [] and len(s["skipped_shards"]) == n
    assert _target_shards(hub) == _shards(local_out)
    assert cli("verify", TARGET).exit_code == 0
    r = cli("convert", SRC, tmp_path / "x", *args, "--part", "4/3")
    assert r.exit_code == 2 and "1 <= K <= N" in r.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: the disk a streamed run must stay within (mounting needs root)."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def test_a_model_twice_the_disk_streams_hub_to_hub_within_it(hub, big, local_out, small_disk):
    import os
    import threading

    hub.add_repo(SRC, repo_files(big))
    total = sum(len(b) for b in _shards(local_out).values())
    assert total > 2 * (3 << 20)
    peak, stop = [0], threading.Event()

    def watch() -> None:  # what the filesystem itself says is used
        while not stop.is_set():
            st = os.statvfs(small_disk)
            peak[0] = max(peak[0], (st.f_blocks - st.f_bfree) * st.f_frsize)
            stop.wait(0.005)

    t = threading.Thread(target=watch)
    t.start()
    try:
        r = cli(
            "convert", SRC, small_disk / "staging", "--scheme", "bf16", "--device", "cpu",
            "--push-to", TARGET, "--max-shard-size", "1000000", "--max-disk", "2.5MiB", "--json",
        )  # fmt: skip
    finally:
        stop.set()
        t.join()
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["push"]["peak_disk_bytes"] <= 2.5 * 2**20
    assert peak[0] <= 3 << 20 and _target_shards(hub) == _shards(local_out)


def test_a_killed_stream_resumes_on_a_bare_machine_from_what_the_target_holds(
    hub, big, local_out, tmp_path
):
    from .hub_server import hf_env  # noqa: F401  (run_cli sets the environment)
    from .test_hub import run_cli

    hub.add_repo(SRC, repo_files(big))
    args = ("convert", SRC, None, "--scheme", "bf16", "--device", "cpu", "--push-to", TARGET)
    args += ("--max-shard-size", "1000000", "--json")
    first = run_cli(
        hub, tmp_path / "hf1", *[a if a else tmp_path / "out1" for a in args],
        _FI_CONVERT_KILL_AFTER_WRITES="20",
    )  # fmt: skip
    assert first.returncode == -9, first.stderr  # SIGKILL mid-run
    held = set(_target_shards(hub))
    assert MANIFEST not in hub.files(TARGET)
    # a fresh cache and a fresh out-dir: what a CI retry has
    second = run_cli(hub, tmp_path / "hf2", *[a if a else tmp_path / "out2" for a in args])
    assert second.returncode == 0, second.stderr
    s = json.loads(second.stdout)["push"]
    assert set(s["skipped_shards"]) == held and held
    assert _target_shards(hub) == _shards(local_out)


def test_source_shards_without_experts_stream_byte_for_byte(hub, tmp_path):
    """Shards without experts are carried over as they are: from a Hub source, read by range
    and written as the source's bytes (hashed as written)."""
    from fi_convert import convert

    src = write_checkpoint(
        tmp_path / "ds", Spec("deepseek-v3", layers=3, dense_layers=1, experts=4, shards=8)
    )
    hub.add_repo(SRC, repo_files(src))
    plan = make_plan(src, Options())
    assert len([s for s in plan.shards if s.copy_of is not None]) == 2
    convert(src, tmp_path / "local", Options(), device="cpu")
    repo = remote.RemoteRepo.open(SRC)
    root = remote.mirror(repo, tmp_path / "mirror")
    files = remote.RemoteSourceFiles(repo, root)
    stream.stream_to_hub(make_plan(root, Options()), files, tmp_path / "st", TARGET, device="cpu")
    assert _target_shards(hub) == _shards(tmp_path / "local")


def test_ctrl_c_while_uploads_are_under_way_stops_at_once_in_one_line(hub, big, tmp_path):
    """SIGINT while a shard's upload is stuck and the next shard's writes wait for room: the
    run stops within seconds (it does not wait out the uploads), says so in one line, exits
    130, and leaves no manifest on the target."""
    from .test_hub import interrupt_cli

    hub.add_repo(SRC, repo_files(big))
    hold = hub.hold("PUT", r"^/lfs-upload/", after=1)
    args = [
        "convert", SRC, tmp_path / "staging", "--scheme", "bf16", "--device", "cpu",
        "--push-to", TARGET, "--max-shard-size", "1000000", "--max-disk", "2.5MiB",
    ]  # fmt: skip
    # after a second the next shards are made until the disk is full
    code, stderr, took = interrupt_cli(hub, tmp_path, args, hold, settle=1.0)
    assert code == 130, stderr
    assert took < 10, took
    said = stderr.strip().splitlines()[-1]  # after the source's line
    assert said == (
        f"interrupted: {TARGET} holds no manifest yet; run the same command again to resume"
    ), stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 2
    assert not list((tmp_path / "staging").glob("*.safetensors*"))  # nothing staged is left
    assert MANIFEST not in hub.files(TARGET)


def test_a_second_streamed_run_into_the_same_staging_folder_is_refused(tmp_path):
    """The staging folder is held (an flock) before anything in it is touched: a second
    streamed run into it is refused in one line and deletes none of the first one's shards;
    once the first is done, the folder can be claimed again."""
    from fi_convert.errors import OutputError

    root = tmp_path / "stage"
    first = stream.Staging.claim(root, SourceFiles())
    staged = root / "model-00001-of-00002.safetensors.fi-convert-tmp"
    staged.write_bytes(b"the first run's shard, being written")
    done = root / "model-00002-of-00002.safetensors"
    done.write_bytes(b"the first run's shard, waiting for its upload")
    with pytest.raises(OutputError) as e:
        stream.Staging.claim(root, SourceFiles())
    assert str(e.value) == (
        f"{root}: another fi-convert is streaming through this staging folder; wait for it "
        "to finish, or choose another out-dir"
    )
    assert staged.read_bytes() == b"the first run's shard, being written"
    assert done.is_file()
    first.remove()
    again = stream.Staging.claim(root, SourceFiles())  # free again
    assert list(root.glob("*.safetensors*")) == []
    again.remove()

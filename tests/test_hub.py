"""fi_convert/hub/ (download, push, publish, card, preflight, convert), the Hugging Face Hub: a
repo id as the source, offline mode, errors, and publishing.

The real huggingface_hub client runs against `tests.hub_server.FakeHub`, a Hub look-alike on
127.0.0.1 (random port) started per test. Nothing leaves the machine: the client is pointed at
the fake (HF_ENDPOINT, and huggingface_hub's constants, which it reads at import), telemetry and
Xet are off, the cache and token live in tmp_path, and `loopback_only` makes any connection or
name lookup off loopback fail, in this process and in the CLI subprocesses.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fi_convert import Options, convert
from fi_convert.errors import SourceError
from fi_convert.format import manifest as mf
from fi_convert.source import open_checkpoint
from fi_convert.testing.synthetic import Spec, write_checkpoint

from . import conftest
from .hub_server import PROXIES as _PROXIES
from .hub_server import TOKEN, FakeHub
from .hub_server import hf_env as _hf_env

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = "fi-convert-manifest.json"
INDEX = "model.safetensors.index.json"
REPO = "acme/tiny-moe"
TARGET = "acme/tiny-moe-fi"
SOURCE_CARD = "---\nlicense: apache-2.0\npipeline_tag: text-generation\n---\n\n# tiny-moe\n"
# launches the CLI as `fi-convert ...` does, behind the same no-network guard as the tests
LAUNCH = (
    "from tests.hub_server import loopback_only; loopback_only(); "
    "from fi_convert.cli import main; main()"
)
# huggingface_hub's own LFS upload passes a file as `data=` to httpx2
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")


# ---- fixtures and helpers ----


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("src") / "tiny-moe"
    write_checkpoint(d, Spec("qwen3-moe", layers=1, experts=4, hidden=128, intermediate=128))
    (d / "README.md").write_text(SOURCE_CARD)
    (d / "inference").mkdir()  # a nested small file, as DeepSeek-V3 has
    (d / "inference" / "config_tiny.json").write_text("{}\n")
    return d


@pytest.fixture(scope="module")
def ref_out(src, tmp_path_factory) -> Path:
    """The local folder converted: what a repo-id conversion must equal."""
    out = tmp_path_factory.mktemp("ref") / "out"
    convert(src, out, Options(scheme="bf16"), device="cpu")
    return out


def repo_files(src: Path) -> dict[str, bytes]:
    """The source as a Hub repo, plus files a conversion must never download."""
    files = {p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    files["pytorch_model.bin"] = b"\x80\x04not-a-pickle-we-read"
    files["original/consolidated.00.pth"] = b"\x80\x04also-not"
    files["original/params.json"] = b"{}"
    files["consolidated.safetensors"] = b"\0" * 64  # not named by the index
    return files


def cli(*args):
    """The CLI in-process (conftest's); the token must never show in what it prints."""
    res = conftest.cli(*args)
    assert TOKEN not in res.stdout + res.stderr
    return res


def cli_env(hub: FakeHub, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: this one's without its Hub settings and proxies,
    pointed at the fake Hub (`home`: HF_HOME) and at this checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGING")) and k.lower() not in _PROXIES
    }
    env.update(_hf_env(hub, home), PYTHONPATH=str(ROOT), **extra)
    return env


def run_cli(hub: FakeHub, home: Path, *args, **extra_env) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess (environment read at import, as for a user)."""
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCH, *map(str, args)],
        cwd=ROOT,
        env=cli_env(hub, home, **extra_env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert TOKEN not in proc.stdout + proc.stderr
    return proc


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and "Traceback" not in stderr
    return lines[0]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def shard_shas(out: Path) -> set[str]:
    return {sha256(p.read_bytes()) for p in out.glob("*.safetensors")}


# ---- the source: a repo id ----


def interrupt_cli(hub, tmp_path: Path, args: list, hold, settle: float = 0.5):
    """Run the CLI in a process of its own until `hold` holds one of its requests, then
    SIGINT it: (exit code, stderr, seconds it took to stop)."""
    env = cli_env(hub, tmp_path / "hf")
    # a shell that starts a job in the background ignores SIGINT for it: undo that
    slow = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", slow + LAUNCH, *map(str, args)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert hold.reached.wait(120), "the run never reached the held request"
        time.sleep(settle)
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        return proc.returncode, stderr, time.monotonic() - t
    finally:
        proc.kill()
        hub.holds.clear()
        hold.release()


def test_no_test_reaches_off_loopback(hub):
    with pytest.raises(OSError, match="test guard"):
        socket.create_connection(("huggingface.co", 443), timeout=1)


def test_repo_id_source_converts_like_the_local_folder(hub, src, ref_out, tmp_path):
    commit = hub.add_repo(REPO, repo_files(src))
    out = tmp_path / "out"
    r = cli("convert", REPO, out, "--scheme", "bf16", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["source_repo"] == {"repo_id": REPO, "revision": None, "commit": commit}
    # the snapshot is in the user's cache (HF_HUB_CACHE)
    snapshot = Path(s["source"])
    assert snapshot == tmp_path / "hf" / "hub" / "models--acme--tiny-moe" / "snapshots" / commit
    # the same bytes as converting the local folder; the manifest also says where from
    m, ref = mf.read(out), mf.read(ref_out)
    cmd = (
        f"fi-convert {REPO} OUT_DIR --revision {commit} --scheme bf16 --backend trtllm --tp-size 1"
    )
    assert m["source"].pop("repo_id") == REPO and m["source"].pop("revision") == commit
    assert m["source"].pop("command") == cmd
    assert m == ref
    assert mf.check_files(out, mf.read(out)) == []
    # only what the conversion reads came down: no pickles, no original/, no unindexed shard
    cached = {p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()}
    assert cached == {p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()}
    assert (out / "inference" / "config_tiny.json").is_file()
    fetched = hub.requests(pattern=r"/resolve/")
    assert fetched and not [p for p in fetched if "bin" in p or "original" in p or "consol" in p]
    cdn = {p.rsplit("/", 1)[1] for p in hub.requests("GET", r"^/cdn/")}
    assert cdn == {sha256(p.read_bytes()) for p in src.glob("*.safetensors")}
    assert TOKEN and f"Bearer {TOKEN}" in hub.tokens_seen  # the token from HF_TOKEN was used


def test_revision_picks_a_branch_and_an_unknown_one_is_one_line(hub, src, tmp_path):
    hub.add_repo(REPO, repo_files(src))
    v2 = hub.add_repo(REPO, {"NOTES.md": b"branch v2\n"}, branch="v2")
    r = cli("convert", REPO, tmp_path / "a", "--revision", "v2", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["source_repo"] == {"repo_id": REPO, "revision": "v2", "commit": v2}
    assert (tmp_path / "a" / "NOTES.md").read_text() == "branch v2\n"

    r = cli("convert", REPO, tmp_path / "b", "--revision", "nope")
    assert r.exit_code == 1
    line = one_error_line(r.stderr)
    assert REPO in line and "no revision 'nope'" in line and "--revision" in line
    assert not (tmp_path / "b").exists()


def test_offline_mode_uses_the_cache(hub, src, ref_out, tmp_path, monkeypatch):
    from huggingface_hub import constants

    hub.add_repo(REPO, repo_files(src))
    assert cli("convert", REPO, tmp_path / "online", "--device", "cpu").exit_code == 0
    seen = len(hub.log)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    r = cli("convert", REPO, tmp_path / "offline", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    assert len(hub.log) == seen  # not one request
    same = (tmp_path / "offline" / MANIFEST).read_bytes()
    assert same == (tmp_path / "online" / MANIFEST).read_bytes()
    m = mf.read(tmp_path / "offline")
    assert {m["source"].pop(k) for k in ("repo_id", "revision", "command")} and m == mf.read(
        ref_out
    )


def test_offline_mode_without_the_cache_is_one_clear_line(hub, src, tmp_path):
    hub.add_repo(REPO, repo_files(src))
    proc = run_cli(hub, tmp_path / "hf", REPO, tmp_path / "out", HF_HUB_OFFLINE="1")
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    assert REPO in line and "HF_HUB_OFFLINE" in line
    assert "run without HF_HUB_OFFLINE" in line and f"`hf download {REPO}`" in line
    assert hub.log == []
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["missing", "private", "gated", "bad-token", "unreachable"])
def test_hub_failures_are_one_line_naming_the_repo_and_the_fix(
    case, hub, src, tmp_path, monkeypatch
):
    repo = {"missing": "acme/no-such-model"}.get(case, REPO)
    if case != "missing":
        hub.add_repo(REPO, repo_files(src), private=case == "private", gated=case == "gated")
    if case in ("private", "gated"):
        monkeypatch.delenv("HF_TOKEN")  # anonymous
    if case == "bad-token":
        monkeypatch.setenv("HF_TOKEN", "hf_notAValidToken")
    if case == "unreachable":
        with socket.socket() as s:  # a loopback port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    r = cli("convert", repo, tmp_path / "out")
    assert r.exit_code == 1
    line = one_error_line(r.stderr)
    assert repo in line
    want = {
        "missing": ("no such model repo on the Hub", "`hf auth login` or HF_TOKEN"),
        "private": ("or it is private", "`hf auth login` or HF_TOKEN"),
        "gated": ("a gated repo", "accept its conditions"),
        "bad-token": ("refused the token (401", "`hf auth login` or set a valid HF_TOKEN"),
        "unreachable": ("cannot reach the Hub", "check the network"),
    }[case]
    for w in want:
        assert w in line


def test_local_paths_and_ids_are_told_apart(hub, src, tmp_path):
    r = cli("convert", tmp_path / "nowhere" / "x" / "y", tmp_path / "out")
    assert "no such folder, and not a Hub repo id (org/name)" in one_error_line(r.stderr)
    r = cli("convert", src, tmp_path / "out", "--revision", "main")
    assert "--revision applies only to a Hub repo id" in one_error_line(r.stderr)
    assert hub.log == []


def test_cache_wide_xet_blob_store_links_are_accepted(src, tmp_path):
    """huggingface_hub links a snapshot's blobs to `<cache>/blobs/` when downloading Xet
    files; those links stay inside the cache and must be read."""
    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny-moe"
    snap = repo / "snapshots" / ("c" * 40)
    store = cache / "blobs"
    for d in (snap, repo / "blobs", store):
        d.mkdir(parents=True)
    (store / ".huggingface-shared-blobs").write_text("1\n")
    for p in src.iterdir():
        if p.is_dir():
            continue
        if p.suffix != ".safetensors":
            shutil.copy(p, snap / p.name)
            continue
        h = sha256(p.read_bytes())
        (store / h[:2]).mkdir(exist_ok=True)
        shutil.copy(p, store / h[:2] / h)
        os.symlink(f"../../blobs/{h[:2]}/{h}", repo / "blobs" / h)
        os.symlink(f"../../blobs/{h}", snap / p.name)
    assert len(open_checkpoint(snap).shards) == 3
    (store / ".huggingface-shared-blobs").unlink()  # not huggingface_hub's store: refused
    with pytest.raises(SourceError, match="outside the model folder"):
        open_checkpoint(snap)


# ---- publishing ----


def _expected_repo(out: Path) -> set[str]:
    return set(mf.read(out)["files"]) | {MANIFEST, "README.md", ".gitattributes"}


def _check_pushed(hub: FakeHub, out: Path, repo: str = TARGET) -> dict[str, bytes]:
    files = hub.files(repo)
    m = mf.read(out)
    assert set(files) == _expected_repo(out)
    for name in m["files"]:
        if name != "README.md":
            assert files[name] == (out / name).read_bytes(), name
    # the uploaded manifest: the local one, with README.md being the model card
    card = files["README.md"]
    want = json.loads((out / MANIFEST).read_text())
    want["files"]["README.md"] = {"sha256": sha256(card), "size": len(card)}
    assert json.loads(files[MANIFEST]) == want
    return files


def test_push_uploads_the_files_card_and_manifest_and_no_state(hub, ref_out, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)
    before = (out / MANIFEST).read_bytes()
    (out / ".fi-convert").mkdir()
    (out / ".fi-convert" / "state.json").write_text("{}")
    (out / ".fi-convert" / "lock").write_text("1")  # a run killed after its manifest
    (out / "model-00009-of-00009.safetensors.fi-convert-tmp").write_bytes(b"partial")
    (out / "notes.txt").write_text("not in the manifest")

    r = cli("push", out, TARGET, "--base-model", REPO, "--private", "--json")
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["repo_id"] == TARGET and s["url"] == f"{hub.url}/{TARGET}" and s["commit"]
    assert hub.repos[TARGET].private
    files = _check_pushed(hub, out)  # nothing from .fi-convert/, no temp file, no notes.txt
    # the manifest comes last, alone with the card
    assert hub.repos[TARGET].messages[-1][2] == ["README.md", MANIFEST]

    card = files["README.md"].decode()
    meta = front_matter(card)
    assert meta["base_model"] == REPO and meta["base_model_relation"] == "quantized"
    assert meta["library_name"] == "fi-convert"
    assert {"fi-convert", "bf16", "trtllm"} <= set(meta["tags"])
    assert meta["license"] == "apache-2.0"  # from the source's card
    for text in (f"fi-convert {REPO} OUT_DIR --scheme bf16", "load_moe_layer", "0.33.0"):
        assert text in card
    assert "0.7.2.post1" in card and "model.layers.0.mlp.experts" in card

    # the local folder is untouched and still verifies
    assert (out / MANIFEST).read_bytes() == before
    assert mf.check_files(out, mf.read(out)) == []
    # and a download of the pushed repo verifies too (the manifest lists the card)
    from huggingface_hub import snapshot_download

    path = snapshot_download(TARGET, endpoint=hub.url, cache_dir=tmp_path / "dl")
    r = cli("verify", path)
    assert r.exit_code == 0, r.stdout + r.stderr


def test_push_refuses_an_out_dir_that_verify_fails(hub, ref_out, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)
    shard = sorted(out.glob("*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert cli("verify", out).exit_code == 1
    r = cli("push", out, TARGET, "--base-model", REPO)
    assert r.exit_code == 1
    line = one_error_line(r.stderr)
    assert shard.name in line and "not pushing" in line and "fi-convert verify" in line
    assert [p for _, p in hub.log] == ["/api/whoami-v2"]  # the target checked, nothing sent
    (out / MANIFEST).unlink()
    hub.log.clear()
    assert "no manifest" in one_error_line(cli("push", out, TARGET, "--base-model", REPO).stderr)
    assert hub.log == []  # refused before any request


def test_push_without_a_token_says_how_to_log_in(hub, ref_out, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    r = cli("push", ref_out, TARGET, "--base-model", REPO)
    assert r.exit_code == 1
    assert "`hf auth login` or set HF_TOKEN" in one_error_line(r.stderr)
    assert hub.log == []
    monkeypatch.setenv("HF_TOKEN", "hf_notAValidToken")
    r = cli("push", ref_out, TARGET, "--base-model", REPO)
    assert "refused the token (401" in one_error_line(r.stderr)
    assert TARGET not in hub.repos


def test_push_to_a_branch(hub, ref_out):
    r = cli("push", ref_out, TARGET, "--base-model", REPO, "--revision", "fi-trtllm")
    assert r.exit_code == 0, r.stderr
    assert MANIFEST in hub.files(TARGET, "fi-trtllm")
    assert MANIFEST not in hub.files(TARGET, "main")


def test_a_failed_push_resumes_without_uploading_again(hub, ref_out, tmp_path):
    hub.fail("POST", r"/commit/", status=500)
    r = cli("push", ref_out, TARGET, "--base-model", REPO)
    assert r.exit_code == 1
    assert "run the same push again - it resumes" in r.stderr and TARGET in r.stderr
    uploaded = list(hub.puts)
    assert set(uploaded) == shard_shas(ref_out)  # the shards went up before the commit failed
    assert MANIFEST not in hub.files(TARGET)  # a repo without a manifest is not complete

    r = cli("push", ref_out, TARGET, "--base-model", REPO)
    assert r.exit_code == 0, r.stderr
    assert hub.puts == uploaded  # nothing uploaded twice
    _check_pushed(hub, ref_out)


def test_a_killed_push_resumes_and_skips_what_was_uploaded(hub, src, tmp_path):
    out = tmp_path / "out"
    convert(src, out, Options(scheme="bf16", max_shard_bytes=100_000), device="cpu")
    shards = shard_shas(out)
    assert len(shards) >= 4
    hold = hub.hold("PUT", r"^/lfs-upload/", after=2)  # the third upload never finishes
    env = cli_env(hub, tmp_path / "hf")
    args = ["push", out, TARGET, "--base-model", REPO]
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert hold.reached.wait(120), "the push never reached the third upload"
        deadline = time.monotonic() + 30
        while len(hub.puts) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    hub.holds.clear()
    hold.release()
    first = list(hub.puts)
    assert len(first) == 2 and set(first) < shards
    assert MANIFEST not in hub.files(TARGET)

    r = cli("push", out, TARGET, "--base-model", REPO)
    assert r.exit_code == 0, r.stderr
    again = hub.puts[2:]
    assert not set(again) & set(first)  # what the killed push uploaded was not sent again
    assert set(first) | set(again) == shards and len(again) == len(shards) - 2
    _check_pushed(hub, out)


def test_ctrl_c_during_a_push_stops_at_once_in_one_line_and_it_resumes(hub, src, tmp_path):
    """SIGINT while an upload is stuck: the push stops within seconds (huggingface_hub's
    upload threads would hold the exit until their transfer ends), says so in one line and
    exits 130; the target holds no manifest, and the same push then finishes."""
    out = tmp_path / "out"
    convert(src, out, Options(scheme="bf16", max_shard_bytes=100_000), device="cpu")
    hold = hub.hold("PUT", r"^/lfs-upload/", after=1)
    code, stderr, took = interrupt_cli(
        hub, tmp_path, ["push", out, TARGET, "--base-model", REPO], hold
    )
    assert code == 130 and took < 10, (took, stderr)
    assert stderr.strip() == (
        f"interrupted: {TARGET} holds no new manifest yet; run the same command again to "
        "resume (what is uploaded is kept)"
    )
    assert MANIFEST not in hub.files(TARGET)
    assert cli("push", out, TARGET, "--base-model", REPO).exit_code == 0
    _check_pushed(hub, out)


def test_ctrl_c_during_a_download_stops_at_once_in_one_line(hub, src, tmp_path):
    """SIGINT while a source shard's download is stuck: one line, exit 130, within seconds
    (huggingface_hub's download threads would hold the exit), and no output folder made."""
    hub.add_repo(REPO, repo_files(src))
    hold = hub.hold("GET", r"^/cdn/", after=0)
    out = tmp_path / "out"
    args = [REPO, out, "--scheme", "bf16", "--device", "cpu"]
    code, stderr, took = interrupt_cli(hub, tmp_path, args, hold)
    assert code == 130 and took < 10, (took, stderr)
    assert stderr.strip() == (
        f"interrupted: nothing was written to {out} yet; run the same command again to resume"
    )
    assert not out.exists()


def test_pushing_again_changes_nothing_and_a_new_conversion_replaces_the_old(hub, src, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    convert(src, a, Options(scheme="bf16", max_shard_bytes=100_000), device="cpu")
    convert(src, b, Options(scheme="bf16"), device="cpu")
    assert cli("push", a, TARGET, "--base-model", REPO).exit_code == 0
    commits = len(hub.repos[TARGET].commits)
    assert cli("push", a, TARGET, "--base-model", REPO).exit_code == 0
    assert len(hub.repos[TARGET].commits) == commits  # a no-op: no empty commits
    # other shards: the old ones and the old manifest go, in the first commit
    assert cli("push", b, TARGET, "--base-model", REPO).exit_code == 0
    _check_pushed(hub, b)
    first_commit_paths = hub.repos[TARGET].messages[-2][2]
    assert f"-{MANIFEST}" in first_commit_paths


def test_convert_push_to_publishes_with_the_source_as_base_model(hub, src, tmp_path):
    commit = hub.add_repo(REPO, repo_files(src))
    out = tmp_path / "out"
    r = cli(
        "convert", REPO, out, "--device", "cpu", "--push-to", TARGET, "--private", "--json",
        "--no-stream",  # download, convert into OUT, then push it (tests/test_hub_stream.py)
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["push"]["repo_id"] == TARGET and s["push"]["base_model"] == REPO
    files = _check_pushed(hub, out)
    card = files["README.md"].decode()
    assert front_matter(card)["base_model"] == REPO
    assert f"fi-convert {REPO} --revision {commit} OUT_DIR" in card
    assert hub.repos[TARGET].private

    r = cli("convert", src, tmp_path / "other", "--private")
    assert r.exit_code == 2  # a usage error: --private goes with --push-to


def test_convert_source_is_the_command_for_a_python_caller(hub, src, ref_out, tmp_path):
    """`fi_convert.convert_source` does what `fi-convert REPO OUT --push-to TARGET` does (the
    command is one call of it), telling its listener the steps."""
    import fi_convert
    from fi_convert.hub.convert import Silent

    commit = hub.add_repo(REPO, repo_files(src))
    heard: list[tuple] = []

    class Ear(Silent):
        def source(self, repo_id, commit, path):
            heard.append(("source", repo_id, commit, path is not None))

        def planned(self, plan):
            heard.append(("planned", plan.scheme.value))

    out = tmp_path / "out"
    done = fi_convert.convert_source(
        REPO, out, Options(scheme="bf16"), device="cpu", push_to=TARGET, listener=Ear()
    )
    assert heard == [("source", REPO, commit, True), ("planned", "bf16")]
    assert done.result is not None and done.pushed is not None
    assert done.source.commit == commit and done.pushed.base_model == REPO
    assert done.result.manifest["source"]["repo_id"] == REPO
    assert shard_shas(out) == shard_shas(ref_out)
    _check_pushed(hub, out)
    dry = fi_convert.convert_source(REPO, tmp_path / "dry", dry_run=True)
    assert dry.result is None and dry.plan.scheme.value == "bf16"
    assert not (tmp_path / "dry").exists()


def test_push_hashes_each_byte_once_and_a_repeated_push_commits_nothing(
    hub, ref_out, tmp_path, monkeypatch
):
    """verify's pass over the folder is the only hash: the upload uses the SHA-256s it proved
    (huggingface_hub would read every file once more to hash it). A push of what the target
    holds already sends and commits nothing, and says so."""
    import huggingface_hub.lfs

    from fi_convert.format import manifest as fm

    hashed: list[str] = []
    real = fm.sha256_file

    def counted(p):
        hashed.append(Path(p).relative_to(ref_out).as_posix())
        return real(p)

    def never(*a, **k):
        raise AssertionError("huggingface_hub hashed a file fi-convert had hashed")

    monkeypatch.setattr(fm, "sha256_file", counted)
    monkeypatch.setattr(huggingface_hub.lfs, "sha_fileobj", never)
    listed = [n for n in mf.read(ref_out)["files"]]
    r = cli("push", ref_out, TARGET, "--base-model", REPO, "--json")
    assert r.exit_code == 0, r.stderr
    assert sorted(hashed) == sorted(listed)  # each file once
    s = json.loads(r.stdout)
    assert s["uploaded_files"] == s["files"] == len(listed) + 1 and not s["up_to_date"]
    _check_pushed(hub, ref_out)

    commits, puts = len(hub.repos[TARGET].commits), list(hub.puts)
    r = cli("push", ref_out, TARGET, "--base-model", REPO)
    assert r.exit_code == 0, r.stderr
    assert len(hub.repos[TARGET].commits) == commits and hub.puts == puts
    assert r.stdout.startswith(f"up to date: {ref_out} -> {hub.url}/{TARGET} ")
    assert "No files have been modified" not in r.stdout + r.stderr
    assert "0 uploaded" not in r.stdout


@pytest.mark.parametrize(
    ("scheme", "tp", "ep_line"),
    [("bf16", 1, True), ("fp8-block", 1, True), ("bf16", 2, False), ("nvfp4", 1, False)],
)
def test_the_card_shows_expert_parallel_serving_where_the_plugin_does_it(
    ref_out, scheme, tp, ep_line
):
    from fi_convert.hub.card import model_card

    m = mf.read(ref_out) | {"scheme": scheme, "tp_size": tp}
    card = model_card(m, repo_id="acme/x-fi")
    assert f"vllm serve acme/x-fi --load-format fi-convert -tp {tp} --moe-backend" in card
    ep = "vllm serve acme/x-fi --load-format fi-convert -tp 8 --enable-expert-parallel --moe-"
    assert (ep in card) is ep_line


def test_the_card_installs_fi_convert_as_it_can_be_installed(ref_out):
    """fi-convert is not on PyPI: `pip install "fi-convert[vllm]"` would fail, or install
    another project's package of that name. The card shows a clone's and the wheel's lines."""
    from fi_convert.hub.card import model_card

    m = mf.read(ref_out)
    card = model_card(m, repo_id="acme/x-fi")
    assert 'pip install "fi-convert' not in card and "pip install 'fi-convert" not in card
    assert 'pip install ".[vllm]"' in card
    v = m["fi_convert_version"]
    assert f'pip install "dist/fi_convert-{v}-py3-none-any.whl[vllm]"' in card


def test_what_push_and_stream_delete_and_add_last():
    """fi_convert/hub/publish.py, shared by push and stream: the files an older output left
    (never the repo's hidden ones; a push of a folder deletes only shards), and the last
    commit's files, the manifest last."""
    from fi_convert.hub.publish import last_operations, stale_files

    held = ["model-1.safetensors", "old-1.safetensors", "notes.md", ".gitattributes"]
    held += [".fi-convert/progress.json", "README.md", "sub/.hidden/x.json"]
    keep = {"model-1.safetensors", "README.md"}
    assert stale_files(held, keep) == ["notes.md", "old-1.safetensors"]
    assert stale_files(held, keep, shards_only=True) == ["old-1.safetensors"]
    ops = last_operations(b"card", b"{}", record=(".fi-convert/progress.json", b"{}"))
    assert [op.path_in_repo for op in ops] == ["README.md", ".fi-convert/progress.json", MANIFEST]
    ops = last_operations(b"card", b"{}", unchanged=["README.md"])
    assert [op.path_in_repo for op in ops] == [MANIFEST]

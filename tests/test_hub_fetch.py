"""fi_convert/hub/fetch.py: a published output resolved to a local snapshot, what both server
plugins do with a Hub repo id as the model (the plugins' own tests load through it:
test_sglang_plugin.py, test_vllm_plugin.py).

Against tests.hub_server.FakeHub (conftest's `hub`): the real huggingface_hub client, nothing
off loopback. No server is imported here: this module runs in every server's CI leg.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.errors import HubError
from fi_convert.format import manifest as mf
from fi_convert.format.names import MANIFEST_NAME
from fi_convert.hub.fetch import fetch_output
from fi_convert.testing.synthetic import Spec, write_checkpoint

REPO = "acme/tiny-moe-fi"
# what a published repo holds besides the output, which a server never needs
EXTRA = {
    "README.md": b"---\nlicense: apache-2.0\n---\n# a model card\n",
    "pytorch_model.bin": b"\x80\x04not-a-pickle-we-read",
    "original/model.safetensors": b"\0" * 64,
    "notes/unlisted.json": b"{}",
}


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fetch")
    src = write_checkpoint(
        root / "src", Spec("qwen3-moe", layers=1, experts=4, hidden=128, intermediate=128)
    )
    (src / "tokenizer_config.json").write_text('{"model_max_length": 128}\n')
    (src / "tokenizer.model").write_bytes(b"\x0a\x05piece")  # carried over as is
    out = root / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.TRTLLM, 1), device="cpu")
    return out


def published(out: Path) -> dict[str, bytes]:
    """The output as `fi-convert push` leaves a repo: every file, plus a card and others."""
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    return files | EXTRA


def snapshot_files(snap: Path) -> set[str]:
    return {p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()}


def test_a_repo_id_fetches_the_manifest_and_exactly_the_files_it_lists(hub, out, tmp_path):
    commit = hub.add_repo(REPO, published(out))
    snap = fetch_output(REPO)
    assert snap == tmp_path / "hf" / "hub" / "models--acme--tiny-moe-fi" / "snapshots" / commit
    m = mf.read(snap)
    assert snapshot_files(snap) == {MANIFEST_NAME, *m["files"]}
    assert {"tokenizer.model", "tokenizer_config.json", "config.json"} <= set(m["files"])
    assert mf.check_files(snap, m) == []  # the bytes the manifest hashes
    assert m == mf.read(out)
    fetched = hub.requests("GET", r"/resolve/")
    assert not [p for p in fetched if any(x in p for x in EXTRA)], fetched
    # the manifest came first: a repo that is not an output costs one request
    assert MANIFEST_NAME in hub.requests(None, r"/resolve/")[0]


def test_manifest_only_fetches_the_manifest_alone(hub, out):
    hub.add_repo(REPO, published(out))
    snap = fetch_output(REPO, manifest_only=True)
    assert snapshot_files(snap) == {MANIFEST_NAME}


def test_revision_and_cache_folder(hub, out, tmp_path):
    first = hub.add_repo(REPO, published(out))
    hub.add_repo(REPO, {"config.json": b"{}"})  # main moves on; the old commit still serves
    cache = tmp_path / "download-dir"
    snap = fetch_output(REPO, revision=first, cache=str(cache))
    assert snap == cache / "models--acme--tiny-moe-fi" / "snapshots" / first
    assert mf.check_files(snap, mf.read(snap)) == []
    assert not (tmp_path / "hf" / "hub" / "models--acme--tiny-moe-fi").exists()


def test_offline_the_cache_serves_and_a_miss_is_one_line(hub, out, monkeypatch):
    from huggingface_hub import constants

    hub.add_repo(REPO, published(out))
    snap = fetch_output(REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    served = len(hub.log)
    assert fetch_output(REPO) == snap
    assert len(hub.log) == served  # nothing asked of the Hub
    with pytest.raises(HubError) as e:
        fetch_output("acme/never-fetched")
    msg = str(e.value)
    assert msg.startswith("acme/never-fetched: no such local folder, and not in the Hugging")
    assert "HF_HUB_OFFLINE=1" in msg and "`hf download acme/never-fetched`" in msg
    assert "\n" not in msg


def test_offline_a_cached_copy_without_a_listed_file_is_one_line(hub, out, monkeypatch):
    from huggingface_hub import constants

    hub.add_repo(REPO, published(out))
    snap = fetch_output(REPO)
    (snap / "config.json").unlink()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError) as e:
        fetch_output(REPO)
    msg = str(e.value)
    assert msg.startswith(f"{REPO}: the cached copy in {snap.parents[2]} is incomplete and ")
    assert msg.endswith("run without HF_HUB_OFFLINE, or `hf download acme/tiny-moe-fi` first")


def _one_line(repo: str, **kw) -> str:
    with pytest.raises(HubError) as e:
        fetch_output(repo, **kw)
    msg = str(e.value)
    assert msg.startswith(f"{repo}") and "\n" not in msg
    return msg


def test_failures_are_one_line_naming_the_repo_and_the_fix(hub, out, tmp_path):
    assert "no such model repo on the Hub" in _one_line("acme/nothing-here")
    files = published(out)
    hub.add_repo("acme/a-source", {k: v for k, v in files.items() if k != MANIFEST_NAME})
    msg = _one_line("acme/a-source")
    assert f"not an fi-convert output (the repo holds no {MANIFEST_NAME})" in msg
    assert "serve the source checkpoint with the server's own loader" in msg
    hub.add_repo(REPO, files)
    assert "no revision 'v9'; pass an existing branch" in _one_line(REPO, revision="v9")
    assert "not a Hub repo id (org/name)" in _one_line("./no-such-folder")
    # the manifest lists a shard the repo does not hold
    shard = next(n for n in files if n.endswith(".safetensors"))
    hub.add_repo("acme/half-pushed", {k: v for k, v in files.items() if k != shard})
    msg = _one_line("acme/half-pushed")
    assert f"lists {shard}, which the repo does not hold (1 missing)" in msg
    assert "push it again" in msg
    # a manifest of another format version
    old = files[MANIFEST_NAME].replace(b'"format_version": 2', b'"format_version": 1')
    hub.add_repo("acme/old", files | {MANIFEST_NAME: old})
    assert "format version 1, this fi-convert reads 2" in _one_line("acme/old")


def test_a_network_failure_is_one_line(hub, out):
    hub.add_repo(REPO, published(out))
    hub.fail("GET", r"/cdn/", status=503, times=50)  # every shard's bytes
    msg = _one_line(REPO)
    assert "503" in msg and "try again later" in msg


def test_a_server_fetching_a_repo_loads_no_converter_code():
    """What a server's process imports to serve a repo id (beside the output reader): the Hub
    package's small modules, none of planning, schemes, layouts, the pipeline, the source
    reader or verify, and no server."""
    import subprocess
    import sys

    code = (
        "import sys, fi_convert.format.reader, fi_convert.hub.fetch\n"
        "print(sorted(m for m in sys.modules if m.startswith(('fi_convert', 'vllm', 'sglang'))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    loaded = set(eval(r.stdout.strip().splitlines()[-1]))  # noqa: S307 (our subprocess's list)
    assert "fi_convert.hub.fetch" in loaded
    converter = {"plan", "pipeline", "schemes", "layout", "source", "outdir", "verify"}
    assert {m.split(".")[1] for m in loaded if "." in m} & converter == set(), sorted(loaded)
    assert not [m for m in loaded if not m.startswith("fi_convert")]

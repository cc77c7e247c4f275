"""fi_convert/hub/remote.py: faults on the link while a Hub repo is read by byte ranges, through
the loopback Hub look-alike: a connection that drops mid-read is retried, backing off; a
Content-Range for other bytes than those asked for is refused, never taken; an expired CDN
address is resolved again at the Hub. What cannot be survived is one line naming the repo, the
file and the fix, and the target is left without a manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fi_convert.errors import HubError
from fi_convert.hub import remote
from fi_convert.testing.synthetic import Spec, write_checkpoint

from .test_hub import MANIFEST, TARGET, cli, repo_files

SRC = "acme/faulty-moe"
SPEC = Spec("qwen3-moe", layers=2, experts=4, hidden=64, intermediate=64, shards=2)
CDN = r"^/cdn/"
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("faulty") / "faulty-moe", SPEC)


@pytest.fixture
def repo(hub, src) -> remote.RemoteRepo:
    hub.add_repo(SRC, repo_files(src))
    return remote.RemoteRepo.open(SRC)


def _shard(src: Path) -> tuple[str, bytes]:
    p = sorted(src.glob("*.safetensors"))[-1]
    return p.name, p.read_bytes()


def test_a_connection_dropped_mid_read_is_retried_and_the_bytes_are_right(
    hub, repo, src, monkeypatch
):
    monkeypatch.setattr(remote.time, "sleep", lambda s: None)
    name, data = _shard(src)
    hub.fault(CDN, "cut", times=2)
    assert repo.read(name, 100, 5000) == data[100:5100]
    assert len(hub.requests("GET", CDN)) == 3  # two cut short, the third whole
    assert repo.bytes_read == 5000  # a cut read's half is not counted as read


def test_a_link_that_keeps_dropping_is_one_line_after_backing_off(hub, repo, src, monkeypatch):
    sleeps: list[float] = []
    monkeypatch.setattr(remote.time, "sleep", sleeps.append)
    name, _ = _shard(src)
    hub.fault(CDN, "cut", times=100)
    with pytest.raises(HubError) as e:
        repo.read(name, 0, 5000)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{SRC}: lost the connection while reading {name} from ")
    assert msg.endswith("check the network, then run the same command again - it resumes")
    assert len(sleeps) == remote.RETRIES and sleeps == sorted(sleeps) and sleeps[0] > 0


def test_a_content_range_for_other_bytes_is_refused_not_taken(hub, repo, src):
    name, data = _shard(src)
    hub.fault(CDN, "range")
    with pytest.raises(HubError) as e:
        repo.read(name, 100, 5000)
    assert str(e.value) == (
        f"{SRC}: the Hub answered a read of {name} bytes 100-5099 with HTTP 206 "
        f"'bytes 101-5100/{len(data)}', not those bytes; run again later"
    )
    assert repo.bytes_read == 0


def test_an_expired_cdn_address_is_resolved_again_at_the_hub(hub, repo, src):
    name, data = _shard(src)
    assert repo.read(name, 0, 1000) == data[:1000]
    resolves = len(hub.requests("GET", "/resolve/"))
    assert len(hub.requests("GET", CDN)) == 1
    assert repo.read(name, 1000, 1000) == data[1000:2000]  # the CDN address is kept
    assert len(hub.requests("GET", "/resolve/")) == resolves
    hub.fail("GET", CDN, status=403)  # a signed address past its expiry
    assert repo.read(name, 2000, 1000) == data[2000:3000]
    assert len(hub.requests("GET", "/resolve/")) == resolves + 1  # asked the Hub once more


def test_spoiled_reads_in_a_streamed_run_are_one_line_and_a_rerun_completes(hub, src, tmp_path):
    hub.add_repo(SRC, repo_files(src))
    args = ["convert", SRC, tmp_path / "staging", "--scheme", "bf16", "--device", "cpu",
            "--push-to", TARGET, "--max-shard-size", "100000"]  # fmt: skip
    hub.fault(CDN, "range", times=1000, after=4)  # past the headers: every read of data
    r = cli(*args)
    assert r.exit_code == 1
    assert "Traceback" not in r.stderr
    line = r.stderr.splitlines()[-1]  # after the line naming the source and its commit
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error")] == [line]
    assert line.startswith(f"error: {SRC}: the Hub answered a read of ")
    assert line.endswith("not those bytes; run again later")
    assert MANIFEST not in hub.files(TARGET)  # the target claims no complete output

    hub.rules.clear()
    # one spoiled read, in the background (read ahead): taken again, and the run completes
    hub.fault(CDN, "range", times=1, after=6)
    r = cli(*args, "--json")
    assert r.exit_code == 0, r.stderr
    assert not any(rule.times for rule in hub.rules)  # the fault did happen
    assert json.loads(hub.files(TARGET)[MANIFEST])["source"]["repo_id"] == SRC

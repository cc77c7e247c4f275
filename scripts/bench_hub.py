"""`make bench`, the Hub part: a streamed Hub -> Hub conversion against the time to download
the source alone and to upload the output alone, over the same bandwidth-limited link, side
by side in one run; and the peak disk the stream staged.

    python scripts/bench_hub.py [--out DIR] [--mbps M] [--repeat R]

The Hub is tests/hub_server.FakeHub on loopback, in a process of its own, with the real
huggingface_hub client; its link is paced to --mbps megabytes per second each way (shared by
all connections). The source is a synthetic BF16 Qwen3-MoE checkpoint of about 235 MB. Times
are medians of --repeat runs. The goal (issue "Hub at real scale"): stream time <= 1.15 x the
larger of download and upload.
"""

from __future__ import annotations

import argparse
import atexit
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SRC, OUT = "bench/moe", "bench/moe-fi"
SHARD = 5_000_000  # output shards: many (about 40 here; DeepSeek-V3 has 163), so that filling
# the pipeline (the first shard's download) and draining it (the last one's upload) are the
# small part of the run they are at real scale
BUDGET = 4 * SHARD  # --max-disk: about 2.4 of the largest output shards (8.4 MB), as the
# default 12 GiB is of DeepSeek-V3's 5 GB shards


class HubProcess:
    """The loopback Hub in a process of its own, as the real Hub is on other machines: its
    serving does not share the conversion's interpreter lock (in-process, it slowed the
    streamed run's reads by a third on 2 cores)."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("fork")  # before torch or any thread is started
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()  # so that a child that dies is an EOF here, not a wait forever
        self.url = self.conn.recv()

    def _call(self, *msg):
        self.conn.send(msg)
        return self.conn.recv()

    def add_repo(self, repo_id: str, files: dict[str, bytes]) -> str:
        return self._call("add", repo_id, files)

    def pace(self, bps: int) -> None:
        """The link's speed each way, bytes per second (0: unpaced)."""
        self._call("pace", bps)

    def stop(self) -> None:
        self._call("stop")
        self.proc.join(10)


def _serve(conn) -> None:
    from tests.hub_server import FakeHub

    hub = FakeHub().start()
    conn.send(hub.url)
    while True:
        cmd, *args = conn.recv()
        if cmd == "add":
            conn.send(hub.add_repo(*args))
        elif cmd == "pace":
            hub.down_bps = hub.up_bps = args[0]
            conn.send(None)
        else:
            hub.stop()
            conn.send(None)
            return


def _env(hub, home: Path) -> None:
    """Point huggingface_hub at the fake before it is imported (it reads these at import)."""
    from tests.hub_server import hf_env

    for k in list(os.environ):
        if k.startswith(("HF_", "HUGGING")):
            del os.environ[k]
    os.environ.update(hf_env(hub, home))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--mbps", type=float, default=10.0, help="link speed, MB/s each way")
    ap.add_argument("--jobs", type=int, default=0, help="the streamed run's --jobs")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    hub = HubProcess()
    tmp = Path(tempfile.mkdtemp(prefix="fi-convert-bench-hub-"))
    atexit.register(shutil.rmtree, tmp, True)  # its checkpoints and copies: about 1.6 GB
    _env(hub, tmp / "hf")

    from huggingface_hub import HfApi, snapshot_download

    from fi_convert import Options, convert
    from fi_convert.hub import remote, stream
    from fi_convert.plan import make_plan
    from fi_convert.testing.synthetic import Spec, write_checkpoint

    opts = Options(scheme="bf16", max_shard_bytes=SHARD)
    api = HfApi()

    def source(k: int) -> tuple[str, Path]:
        """A checkpoint of its own per use (another seed): the fake Hub, as the Hub, keeps
        each LFS object once, so identical bytes would not be sent again."""
        spec = Spec(
            "qwen3-moe", layers=16, experts=8, hidden=512, intermediate=512, shards=8, seed=k
        )
        src = write_checkpoint(tmp / f"src-{k}", spec)
        repo = f"{SRC}-{k}"
        hub.add_repo(
            repo,
            {p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()},
        )
        return repo, src

    def download(repo: str) -> float:
        t = time.perf_counter()
        snapshot_download(repo, cache_dir=tmp / f"dl-{time.monotonic_ns()}")
        return time.perf_counter() - t

    def upload(src: Path, k: int) -> float:
        local = tmp / f"local-{k}"
        convert(src, local, opts, device="cpu")
        repo = f"bench/up-{k}"
        api.create_repo(repo, exist_ok=True)
        t = time.perf_counter()
        api.upload_folder(repo_id=repo, folder_path=local, allow_patterns=["*.safetensors"])
        return time.perf_counter() - t

    def streamed(repo_id: str, k: int) -> tuple[float, int]:
        t = time.perf_counter()
        repo = remote.RemoteRepo.open(repo_id)
        root = remote.mirror(repo, tmp / f"mirror-{k}")
        plan = make_plan(root, opts)
        res = stream.stream_to_hub(
            plan,
            remote.RemoteSourceFiles(repo, root),
            tmp / f"staging-{k}",
            f"{OUT}-{k}",
            device="cpu",
            max_disk=BUDGET,
            jobs=args.jobs,
        )
        return time.perf_counter() - t, res.peak_disk

    rows = []
    for k in range(args.repeat):  # interleaved, so that drift hits all three alike
        repo, src = source(k)
        _, other = source(100 + k)  # the upload alone sends other bytes than the stream
        hub.pace(int(args.mbps * 1e6))
        d = download(repo)
        u = upload(other, k)
        s, peak = streamed(repo, k)
        hub.pace(0)
        rows.append({"download_s": d, "upload_s": u, "stream_s": s, "peak_disk": peak})
    src_bytes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    out_bytes = sum(p.stat().st_size for p in (tmp / f"local-{k}").glob("*.safetensors"))
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    ratio = med["stream_s"] / max(med["download_s"], med["upload_s"])
    result = {
        "link_MBps_each_way": args.mbps,
        "source_bytes": src_bytes,
        "output_bytes": out_bytes,
        "median": med,
        "stream_over_larger": ratio,
        "stream_over_download": med["stream_s"] / med["download_s"],
        "stream_over_upload": med["stream_s"] / med["upload_s"],
        "stream_over_sum": med["stream_s"] / (med["download_s"] + med["upload_s"]),
        "runs": rows,
    }
    hub.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench-hub.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"Hub -> Hub, {src_bytes / 1e6:.0f} MB source, {out_bytes / 1e6:.0f} MB output, ")
    print(f"link {args.mbps:g} MB/s each way, medians of {args.repeat}:")
    print(f"  download alone  {med['download_s']:7.2f} s")
    print(f"  upload alone    {med['upload_s']:7.2f} s")
    print(
        f"  streamed        {med['stream_s']:7.2f} s   peak staged {med['peak_disk'] / 1e6:.0f} MB"
    )
    print(f"  streamed / larger {ratio:.2f} (goal <= 1.15); / sum {result['stream_over_sum']:.2f}")


if __name__ == "__main__":
    main()

"""Convert straight to a Hub repo within a disk budget: a 700 GB checkpoint on a CI runner
with 14 GB of disk.

The source is read where it is: a local folder, or a Hub repo by byte ranges (`remote`), so
it takes no disk. Output shards are written to a staging folder, each uploaded to the target
in a commit of its own as soon as it is complete and then deleted, while the next ones are
made; the staged bytes stay within `max_disk` (a shard's writes wait for room).

The target repo is the run's journal: each shard's commit also writes `PROGRESS_NAME`, the
plan's key and the SHA-256 and size of every shard uploaded so far. A rerun (on a bare machine,
after a killed job) reads it back and skips every shard the target holds with that SHA-256 (the
Hub's LFS metadata gives each file's), so only the rest is converted and uploaded. As a push,
the index, side files, model card and manifest go up last, in one commit that also removes
what an older output left there: a repo with a manifest is a complete one.

Each upload uses the SHA-256 computed while the shard was written: the bytes are never read
again to be hashed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import jsontext, outdir
from .. import manifest as mf
from ..errors import HubError, OutputError
from ..format.names import INDEX_NAME, MANIFEST_NAME
from ..pipeline import ProgressFn, Written, resolve_device, write_shards
from ..plan import Plan, ShardPlan
from ..st_io import WRITEBACK, DiskRoom, ShardWriter, SourceFiles, build_header
from ..version import __version__
from .card import CARD_NAME
from .common import endpoint, is_offline, is_repo_id
from .publish import (
    TargetRepo,
    card_and_manifest,
    commit_last,
    last_operations,
    stale_files,
    upload_errors,
)

PROGRESS_NAME = ".fi-convert/progress.json"
PROGRESS_DIR = ".fi-convert/"  # and progress-K-of-N.json, one per part of a split run
PROGRESS_FORMAT = "fi-convert-progress"
STAGING_MARK = ".fi-convert-staging"
DEFAULT_MAX_DISK = 12 << 30  # fits a standard hosted runner (about 14 GB free)
COPY_PIECE = 64 << 20


@dataclass
class StreamResult:
    repo_id: str
    url: str
    commit: str | None
    files: int
    uploaded: list[str]
    skipped: list[str]  # shards the target held already (a resumed run)
    peak_disk: int
    base_model: str | None = None
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "repo_id": self.repo_id,
            "base_model": self.base_model,
            "url": self.url,
            "commit": self.commit,
            "files": self.files,
            "uploaded_shards": self.uploaded,
            "skipped_shards": self.skipped,
            "peak_disk_bytes": self.peak_disk,
            "warnings": self.warnings,
        }


class Staging:
    """The staging folder: where a shard is written before its upload (a `ShardDir`). With
    `room`, every write draws on that disk budget."""

    def __init__(self, root: Path, source: SourceFiles, lock_fd: int | None = None) -> None:
        self.root, self.source = root, source
        self.room: DiskRoom | None = None
        self.writeback = False  # uploaded from the page cache and removed: never synced
        self._lock_fd = lock_fd

    @classmethod
    def claim(cls, root: Path, source: SourceFiles) -> Staging:
        """The staging folder, held by this run (an flock on its mark file, which the kernel
        releases when the run dies) before anything in it is touched: a second streamed run
        into the same folder is refused and deletes none of the first one's shards."""
        if root.exists() and not root.is_dir():
            raise OutputError(f"{root}: exists and is not a folder; choose another out-dir")
        if root.is_dir() and any(root.iterdir()) and not (root / STAGING_MARK).is_file():
            raise OutputError(
                f"{root}: not empty, and a streamed conversion stages its shards there and "
                "removes them; choose an empty or new out-dir"
            )
        root.mkdir(parents=True, exist_ok=True)
        fd = _hold(root / STAGING_MARK)
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"shards staged for upload by fi-convert; safe to delete\n", 0)
        for p in root.glob("*.safetensors*"):  # an interrupted run's: the Hub is the journal
            p.unlink()
        return cls(root, source, fd)

    def shard(self, shard: ShardPlan, write: Callable[[ShardPlan], ShardWriter]) -> dict:
        sha, size = write(shard).finish()
        return {"sha256": sha, "size": size}

    def copy_file(self, src: Path, rel: str) -> dict:
        """A source shard without experts, byte for byte, read through the source."""
        dst, tmp = self.root / rel, self.root / (rel + ".fi-convert-tmp")
        size = src.stat().st_size
        buf = torch.empty(min(COPY_PIECE, max(size, 1)), dtype=torch.uint8, device="cpu")
        h = hashlib.sha256()  # hashed as written, as every shard is
        taken, stop = 0, threading.Event()
        try:
            with open(tmp, "wb") as f:
                for off in range(0, size, COPY_PIECE):
                    piece = buf[: min(COPY_PIECE, size - off)]
                    self.source.read_bytes(src, off, piece)
                    data = piece.numpy().tobytes()
                    if self.room is not None:
                        self.room.take(len(data), stop)
                        taken += len(data)
                    h.update(data)
                    f.write(data)
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            if self.room is not None and taken:
                self.room.give(taken)
            raise
        return {"sha256": h.hexdigest(), "size": size}

    def remove(self) -> None:
        WRITEBACK.drain()  # no descriptor of a staged shard outlives the run
        shutil.rmtree(self.root, ignore_errors=True)
        self.release()

    def release(self) -> None:
        """Let go of the folder (what is staged stays, for a rerun); once."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _hold(mark: Path) -> int:
    """An exclusive flock on `mark` (made if missing); refused while another run holds it."""
    try:
        fd = os.open(mark, os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as e:
        raise OutputError(f"{mark}: cannot open ({e.strerror}); choose another out-dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OutputError(
            f"{mark.parent}: another fi-convert is streaming through this staging folder; "
            "wait for it to finish, or choose another out-dir"
        ) from None
    return fd


class HubSink:
    """Uploads each finished shard in a commit of its own and keeps the staged bytes within
    `max_disk` (a `ShardSink`).

    With `by_write` (shards made one at a time), the shard being made takes its bytes from the
    budget as they are written (a `DiskRoom`): it starts at once and waits only when the disk
    is full, so the source's reads go on while the uploads catch up. Shards made several at
    once each reserve their whole size before they start instead: partial shards waiting for
    each other's room could otherwise fill the budget and none finish.

    The bytes of one shard go up at a time, at the link's whole speed, so that each shard
    leaves the disk as soon as it can (two at once would share the link and stay staged twice
    as long); the next shard's upload starts shortly before this one is expected to end (see
    `Relay`), and each commit, small, is made on a thread of its own, so the link is not idle
    between shards."""

    def __init__(self, repo: TargetRepo, key: str, staging: Staging, max_disk: int,
                 held: dict[str, dict], record: str = PROGRESS_NAME,
                 by_write: bool = False) -> None:  # fmt: skip
        self.repo, self.key = repo, key
        self.by_write = by_write
        self.record = record  # where this run's progress goes on the target
        self.staging, self.max_disk = staging, max_disk
        self.held = held  # shard -> meta the target holds already, for this plan
        self.done: dict[str, dict] = dict(held)
        self.uploaded: list[str] = []
        self.skipped: list[str] = []
        self.staged = 0  # bytes on disk or reserved for a shard being made
        self.peak = 0
        self.cond = threading.Condition()  # staged bytes or the failure changed
        self.pool = Workers(2, "fi-convert-upload")
        self.relay = Relay()
        self.commits = Workers(1, "fi-convert-commit")
        self.pending: list[Future] = []
        self.failed: BaseException | None = None

    def before(self, shard: ShardPlan) -> dict | None:
        if shard.name in self.held:
            self.skipped.append(shard.name)
            return self.held[shard.name]
        if self.by_write:  # its writes take their room
            with self.cond:
                if self.failed is not None:
                    raise self.failed
            return None
        need = _file_size(shard)
        with self.cond:
            while self.staged and self.staged + need > self.max_disk and self.failed is None:
                self.cond.wait(1.0)
            if self.failed is not None:
                raise self.failed
            self.staged += need
        return None

    def take(self, n: int, stop: threading.Event) -> None:
        """Room for `n` more bytes of the shard being made (`by_write`)."""
        with self.cond:
            while self.staged + n > self.max_disk and self.failed is None and not stop.is_set():
                self.cond.wait(0.5)
            if self.failed is not None:
                raise self.failed
            if stop.is_set():
                raise OutputError("the run stopped")
            self.staged += n
            self.peak = max(self.peak, self.staged)

    def give(self, n: int) -> None:
        with self.cond:
            self.staged -= n
            self.cond.notify_all()

    def after(self, shard: ShardPlan, meta: dict) -> None:
        if shard.name in self.held:
            return
        with self.cond:
            if not self.by_write:  # the reservation becomes the file
                self.staged += meta["size"] - _file_size(shard)
                self.peak = max(self.peak, self.staged)
            if self.failed is not None:  # it will not go up: it goes
                self._drop(shard.name, meta)
                raise self.failed
            self.pending.append(self.pool.submit(self._upload, shard.name, meta))

    def _upload(self, name: str, meta: dict) -> None:
        """The shard's bytes to the Hub's storage; then its commit is queued."""
        from huggingface_hub import CommitOperationAdd

        try:
            path = str(self.staging.root / name)
            op = CommitOperationAdd(path_in_repo=name, path_or_fileobj=path)
            op.upload_info.sha256 = bytes.fromhex(meta["sha256"])  # hashed while written
            turn = self.relay.turn(meta["size"], lambda: self.failed)
            with turn, upload_errors(self.repo.repo_id):
                self.repo.api.preupload_lfs_files(
                    self.repo.repo_id,
                    [op],
                    repo_type="model",
                    revision=self.repo.revision,
                    num_threads=1,
                )
        except BaseException as e:
            self._fail(e, name, meta)
            raise
        # the bytes are in the Hub's storage: the commit names them by SHA-256 and size and
        # reads nothing, so the staged file goes now and makes room for the next shard (a
        # small file, committed by content, stays until its commit)
        stored = getattr(op, "_upload_mode", None) == "lfs"
        if stored:
            self._drop(name, meta)
        with self.cond:
            self.pending.append(self.commits.submit(self._commit, name, op, meta, not stored))

    def _commit(self, name: str, op, meta: dict, staged: bool = True) -> None:
        """The commit that adds the uploaded shard, with the run's progress record."""
        from huggingface_hub import CommitOperationAdd

        try:
            if self.failed is not None:
                raise self.failed
            self.done[name] = meta
            progress = _progress_bytes(self.key, self.done, complete=False)
            with upload_errors(self.repo.repo_id):
                self.repo.commit(
                    [op, CommitOperationAdd(self.record, progress)],
                    f"Upload {name} (fi-convert {__version__})",
                )
            self.uploaded.append(name)
        except BaseException as e:
            self.done.pop(name, None)
            if staged:
                self._fail(e, name, meta)
            else:
                with self.cond:
                    self.failed = self.failed or e
                    self.cond.notify_all()
            raise
        if staged:
            self._drop(name, meta)

    def _fail(self, e: BaseException, name: str, meta: dict) -> None:
        with self.cond:
            self.failed = self.failed or e
        self._drop(name, meta)

    def _drop(self, name: str, meta: dict) -> None:
        """The staged shard goes, and its bytes leave the budget."""
        (self.staging.root / name).unlink(missing_ok=True)
        with self.cond:
            self.staged -= meta["size"]
            self.cond.notify_all()

    def drain(self) -> None:
        """Wait for every upload and commit; raise the first failure."""
        i = 0
        while True:
            with self.cond:
                if i == len(self.pending):
                    break
                f = self.pending[i]
            f.exception()
            i += 1
        self.pool.shutdown(wait=True)
        self.commits.shutdown(wait=True)
        if self.failed is not None:
            raise self.failed

    def abandon(self) -> None:
        """Stop: uploads and commits not begun are dropped, and those under way are not
        waited for (an interrupted run stops at once; a shard's upload can take minutes).
        What they send is whole or nothing: the Hub stores an upload only once all its bytes
        came, and a commit at once."""
        with self.cond:
            self.failed = self.failed or OutputError("the run stopped")
            self.cond.notify_all()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.commits.shutdown(wait=False, cancel_futures=True)
        for p in self.staging.root.glob("*.safetensors"):
            p.unlink(missing_ok=True)


class Workers:
    """`n` daemon threads running submitted calls in order (a ThreadPoolExecutor whose
    threads do not hold the process at exit: an interrupted run must not wait out an upload
    under way)."""

    def __init__(self, n: int, name: str) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._work, name=f"{name}_{k}", daemon=True) for k in range(n)
        ]
        for t in self.threads:
            t.start()

    def submit(self, fn: Callable, *args: object) -> Future:
        f: Future = Future()
        self.jobs.put((f, fn, args))
        return f

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            f, fn, args = job
            if not f.set_running_or_notify_cancel():
                continue
            try:
                f.set_result(fn(*args))
            except BaseException as e:
                f.set_exception(e)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        if cancel_futures:
            while True:
                try:
                    job = self.jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
        for _ in self.threads:
            self.jobs.put(None)
        if wait:
            for t in self.threads:
                t.join()


class Relay:
    """Uploads that follow each other on the link: each one starts once the one before it is
    expected to end within `lead` (a fifth of its time, at most MAX_LEAD s), so that the next
    upload's API calls and the Hub's answer to the last bytes overlap the other's bytes and
    the link does not idle between shards; at most two are under way. The expected end comes
    from the speed measured over the uploads so far (the first is followed only when done)."""

    LEAD = 0.2
    MAX_LEAD = 2.0

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.running = 0
        self.ends = 0.0  # when the latest upload is expected to end (monotonic seconds)
        self.rate: float | None = None  # bytes per second, of the uploads so far
        self._lead = 0.0

    @contextlib.contextmanager
    def turn(self, size: int, failed: Callable[[], BaseException | None]):
        with self.cond:
            while True:
                if (e := failed()) is not None:
                    raise e
                now = time.monotonic()
                if self.running == 0 or (self.running == 1 and now >= self.ends - self._lead):
                    break
                wait = self.ends - self._lead - now if self.running == 1 else 0.5
                self.cond.wait(min(0.5, max(wait, 0.001)) if self.rate else 0.5)
            self.running += 1
            start = time.monotonic()
            took = size / self.rate if self.rate else float("inf")
            self.ends = max(self.ends, start) + took
            self._lead = min(self.LEAD * took, self.MAX_LEAD)
        try:
            yield
        finally:
            with self.cond:
                self.running -= 1
                seen = size / max(time.monotonic() - start, 1e-6)
                self.rate = seen if self.rate is None else 0.7 * self.rate + 0.3 * seen
                if self.running == 0:
                    self.ends = time.monotonic()
                self.cond.notify_all()


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _file_size(shard: ShardPlan) -> int:
    """The bytes the shard's file will take: its header and its tensors."""
    return len(build_header([it.entry for it in shard.items])) + shard.nbytes


def _progress_bytes(key: str, files: dict[str, dict], complete: bool) -> bytes:
    d = {
        "format": PROGRESS_FORMAT,
        "fi_convert_version": __version__,
        "plan_key": key,
        "complete": complete,
        "files": {k: files[k] for k in sorted(files)},
    }
    return (json.dumps(d, indent=2, sort_keys=True) + "\n").encode()


def _remote_state(repo: TargetRepo) -> tuple[dict[str, str | None], list[dict]]:
    """The target's files (path -> LFS SHA-256, or None for a regular file) and its progress
    records (the run's, and one per part of a split run; unreadable ones left out)."""
    from huggingface_hub import hf_hub_download

    files = {path: f.lfs_sha256 for path, f in repo.files().items()}
    records = []
    for name in sorted(files):
        if not (name.startswith(PROGRESS_DIR + "progress") and name.endswith(".json")):
            continue
        try:
            got = hf_hub_download(repo.repo_id, name, revision=repo.revision, endpoint=endpoint())
            d = jsontext.loads(Path(got).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and d.get("format") == PROGRESS_FORMAT:
            records.append(d)
    return files, records


def held_shards(plan: Plan, key: str, files: dict[str, str | None], records: list[dict]) -> dict:
    """The shards of `plan` the target holds already: recorded by a run (or a part) of the
    same plan and stored on the Hub with the recorded SHA-256."""
    held = {}
    for rec in records:
        if rec.get("plan_key") != key or not isinstance(rec.get("files"), dict):
            continue
        for s in plan.shards:
            meta = rec["files"].get(s.name)
            if isinstance(meta, dict) and files.get(s.name) == meta.get("sha256") is not None:
                held[s.name] = {"sha256": meta["sha256"], "size": meta["size"]}
    return held


def parse_part(text: str) -> tuple[int, int]:
    """`K/N` (1 <= K <= N) as (K, N)."""
    k, _, n = text.partition("/")
    try:
        part = int(k), int(n)
    except ValueError:
        part = (0, 0)
    if not 1 <= part[0] <= part[1]:
        raise ValueError(f"--part {text}: not K/N with 1 <= K <= N (e.g. 2/4)")
    return part


def part_of(plan: Plan, part: tuple[int, int]) -> Plan:
    """The plan restricted to part K of N: every N-th shard from the K-th (disjoint parts
    that together are the whole; each shard's bytes are those of a single run)."""
    k, n = part
    return dataclasses.replace(plan, shards=plan.shards[k - 1 :: n])


def stream_to_hub(
    plan: Plan,
    source: SourceFiles,
    staging_dir: Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str = "main",
    max_disk: int = DEFAULT_MAX_DISK,
    device: str = "auto",
    jobs: int = 0,
    base_model: str | None = None,
    base_revision: str | None = None,
    progress: ProgressFn | None = None,
    part: tuple[int, int] | None = None,
    staging: Staging | None = None,
) -> StreamResult:
    """Convert `plan` shard by shard into `repo_id` (see the module's docstring). With
    `part` (K, N), only part K of N of the shards, and no index, card or manifest: a run
    without `part` after all parts finds their shards on the target and writes those.
    `staging`: the folder `staging_dir` claimed already (a Hub source mirrored into it)."""
    _check(plan, repo_id, max_disk)
    dev = resolve_device(device)
    key = plan.key()
    repo, remote, held = _open_target(plan, key, repo_id, private=private, revision=revision)
    if staging is None:
        staging = Staging.claim(staging_dir, source)
    staging.source = source
    try:
        record = (
            PROGRESS_NAME if part is None else f"{PROGRESS_DIR}progress-{part[0]}-of-{part[1]}.json"
        )
        mine = plan if part is None else part_of(plan, part)
        # a source read over the link: one shard at a time (its reads run ahead in the
        # background), so each is done and goes up as soon as it can; shards made at once
        # would share the link and all finish late
        jobs = jobs if jobs > 0 or source.local else 1
        sink = HubSink(repo, key, staging, max_disk, held, record, jobs == 1)
        written = _write_and_upload(mine, staging, source, dev, progress, jobs, sink)
        commit, files = None, len(written.files)
        if part is None:  # a part leaves the index, card and manifest to the final run
            commit, files = _finish(repo, plan, written, remote, sink, base_model, base_revision)
        staging.remove()
        return StreamResult(
            repo_id,
            repo.url,
            commit,
            files,
            sorted(sink.uploaded),
            sorted(sink.skipped),
            sink.peak,
            base_model,
            written.warnings,
        )
    finally:
        staging.release()  # a failed run's staged shards stay for the rerun


def _check(plan: Plan, repo_id: str, max_disk: int) -> None:
    """What a stream into `repo_id` needs before any request: a repo id, online, and a disk
    budget that holds the largest output shard."""
    if not is_repo_id(repo_id):
        raise HubError(f"{repo_id}: not a Hub repo id; push to org/name")
    if is_offline():
        raise HubError(f"{repo_id}: HF_HUB_OFFLINE=1 forbids uploading; run without it")
    largest = max((_file_size(s) for s in plan.shards), default=0)
    if largest > max_disk:
        raise OutputError(
            f"--max-disk {_size(max_disk)} is less than the largest output shard "
            f"({_size(largest)}); raise --max-disk or lower --max-shard-size"
        )


def _open_target(
    plan: Plan, key: str, repo_id: str, *, private: bool, revision: str
) -> tuple[TargetRepo, dict[str, str | None], dict[str, dict]]:
    """The target repo (created when missing), its files (path -> LFS SHA-256) and the
    shards of `plan` it holds already. An older output's manifest goes at once, in a commit of
    its own: it must not vouch for a half-new repo."""
    from huggingface_hub import CommitOperationDelete

    with upload_errors(repo_id):
        repo = TargetRepo.open(repo_id, private=private, revision=revision)
        remote, records = _remote_state(repo)
        if MANIFEST_NAME in remote and not any(r.get("plan_key") == key for r in records):
            repo.commit(
                [CommitOperationDelete(MANIFEST_NAME)],
                "Remove the old fi-convert manifest: a new conversion begins",
            )
    return repo, remote, held_shards(plan, key, remote, records)


def _write_and_upload(
    plan: Plan,
    staging: Staging,
    source: SourceFiles,
    dev: torch.device,
    progress: ProgressFn | None,
    jobs: int,
    sink: HubSink,
) -> Written:
    """The shards of `plan` the target does not hold, written to `staging` and uploaded by
    `sink`, every upload and commit waited for; on any failure, those not begun dropped."""
    if sink.by_write:
        staging.room = sink
    try:
        on_target = [s for s in plan.shards if s.name in sink.held]  # an earlier run's: skipped
        resume = len(on_target), sum(s.nbytes for s in on_target)
        written = write_shards(plan, staging, source, dev, progress, jobs, sink, resume)
        sink.drain()
    except BaseException:
        sink.abandon()
        raise
    return written


def _finish(
    repo: TargetRepo,
    plan: Plan,
    written: Written,
    remote: dict[str, str | None],
    sink: HubSink,
    base_model: str | None,
    base_revision: str | None,
) -> tuple[str, int]:
    """The last commit of a whole run: the index, the side files, the model card, the
    complete progress record and the manifest, and what an older output left on the target
    deleted. Its id, and how many files the output has on the target."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    target = outdir.Target.of(plan)
    files = dict(written.files)
    first: list = []
    source_card = None
    for rel, src in target.side.items():
        data = src if isinstance(src, bytes) else Path(src).read_bytes()
        files[rel] = target.side_meta[rel]
        if rel == CARD_NAME:  # the source's card: the model card takes its place
            source_card = data.decode(errors="replace")
        else:
            first.append(CommitOperationAdd(rel, data))
    files[INDEX_NAME] = {"sha256": _sha(target.index), "size": len(target.index)}
    first.append(CommitOperationAdd(INDEX_NAME, target.index))
    m = mf.build(plan, files)  # plan.provenance: the source repo, commit and command
    card, manifest = card_and_manifest(
        m,
        repo.repo_id,
        base_model=base_model,
        base_revision=base_revision,
        source_card=source_card,
    )
    keep = {*files, CARD_NAME, MANIFEST_NAME, ".gitattributes"}
    first += [CommitOperationDelete(p) for p in stale_files(remote, keep)]
    record = (PROGRESS_NAME, _progress_bytes(sink.key, sink.done, complete=True))
    # a rerun of a finished stream changes nothing: huggingface_hub then logs that it skips
    # an empty commit, which the run's own line ("N already there") says already
    with upload_errors(repo.repo_id), _quiet("huggingface_hub.hf_api"):
        info = commit_last(
            repo, m, [*first, *last_operations(card, manifest, record=record)], index=True
        )
    return info.oid, len(files) + 2


@contextlib.contextmanager
def _quiet(name: str):
    """Logger `name` says only errors, for the duration."""
    import logging

    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

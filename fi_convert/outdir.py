"""The out-dir transaction: claim, lock, journal, temporary names, reuse, manifest last."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .errors import OutputError
from .plan import MANIFEST_NAME, STATE_DIR, Plan, ShardPlan, check_out_dir
from .st_io import TMP_SUFFIX, ShardWriter, sha256_file


class OutDir:
    """Claims an output folder: ownership check, a lock, a journal of finished files.

    The journal (`.fi-convert/state.json`) records each finished file's SHA-256 under the
    plan's key; a rerun with the same key reuses files whose bytes still match.
    """

    def __init__(self, root: Path, key: str, overwrite: bool, fsync: bool = True) -> None:
        self.root, self.key, self.overwrite, self.fsync = root, key, overwrite, fsync
        self.state_dir = root / STATE_DIR
        self.done: dict[str, dict] = {}
        self.reused: list[str] = []
        # finished files are flushed to disk in the background while the next ones are made
        # (several at once: files finished together are written to disk in parallel)
        self.syncer = ThreadPoolExecutor(4, thread_name_prefix="fi-convert-fsync")
        self.syncing: dict[str, Future] = {}
        self.lock = threading.Lock()  # the journal, written from the shard workers

    def __enter__(self) -> OutDir:
        self._claim()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        (self.root / MANIFEST_NAME).unlink(missing_ok=True)  # no longer complete
        self._load_journal()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.syncer.shutdown(wait=True, cancel_futures=True)
        if exc_type is None:
            self._unlock()
            shutil.rmtree(self.state_dir, ignore_errors=True)
        else:  # whatever was cut short (Ctrl-C can land anywhere) leaves no partial file
            for p in self.root.rglob("*" + TMP_SUFFIX):
                p.unlink(missing_ok=True)
            self._unlock()

    def _claim(self) -> None:
        r = self.root
        if not check_claimable(r, self.overwrite):
            r.mkdir(parents=True, exist_ok=True)
            return
        for p in r.iterdir():
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()

    def _lock(self) -> None:
        """An flock on `.fi-convert/lock`, held for the whole run: the kernel releases it when
        this process dies, however it dies, so a dead run (a killed container's PID 1
        included) never blocks the next one. The file names the holder's PID for the message."""
        lock = self.state_dir / "lock"
        for _ in range(3):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
            except OSError as e:
                raise OutputError(
                    f"{lock}: cannot open ({e.strerror}); check the out-dir"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                pid = _read_pid(lock)
                who = f" (pid {pid})" if pid is not None else ""
                raise OutputError(
                    f"{self.root}: another fi-convert{who} is writing here; wait for it to finish"
                ) from None
            except OSError as e:
                os.close(fd)
                raise OutputError(
                    f"{lock}: cannot lock ({e.strerror}); check the out-dir"
                ) from None
            try:  # a holder that finished unlinks the file: then ours is a stale inode
                same = os.fstat(fd).st_ino == os.stat(lock).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                self._lock_fd: int | None = fd
                return
            os.close(fd)
        raise OutputError(f"{lock}: cannot take the lock; run again")

    def _unlock(self) -> None:
        fd = getattr(self, "_lock_fd", None)
        if fd is not None:
            (self.state_dir / "lock").unlink(missing_ok=True)  # while still holding it
            os.close(fd)  # releases the flock
            self._lock_fd = None

    def _journal_path(self) -> Path:
        return self.state_dir / "state.json"

    def _load_journal(self) -> None:
        try:
            d = json.loads(self._journal_path().read_text())
        except (OSError, ValueError):
            d = {}
        if d.get("key") == self.key and isinstance(d.get("files"), dict):
            self.done = d["files"]

    def _sync_later(self, rel: str) -> None:
        if self.fsync:
            self.syncing[rel] = self.syncer.submit(_fsync, self.root / rel)

    def flush(self, files: dict[str, dict]) -> None:
        """Every file of `files` and the folder itself on disk (before the manifest)."""
        if not self.fsync:
            return
        try:
            for rel in files:
                if rel in self.syncing:
                    self.syncing[rel].result()
                else:
                    _fsync(self.root / rel)
            _fsync(self.root)
        except OSError as e:
            raise OutputError(
                f"{self.root}: cannot flush the output to disk ({e.strerror})"
            ) from None

    def _record(self, rel: str, meta: dict) -> dict:
        self._sync_later(rel)
        with self.lock:
            self.done[rel] = meta
            tmp = self._journal_path().with_name("state.json" + TMP_SUFFIX)
            tmp.write_text(json.dumps({"key": self.key, "files": self.done}, sort_keys=True))
            os.replace(tmp, self._journal_path())
        return meta

    def _reusable(self, rel: str) -> dict | None:
        meta = self.done.get(rel)
        p = self.root / rel
        if not (meta and p.is_file() and p.stat().st_size == meta["size"]):
            return None
        if sha256_file(p) != meta["sha256"]:
            return None
        self.reused.append(rel)
        self._sync_later(rel)
        return meta

    def shard(self, shard: ShardPlan, write: Callable[[ShardPlan], ShardWriter]) -> dict:
        if meta := self._reusable(shard.name):
            return meta
        sha, size = write(shard).finish()
        return self._record(shard.name, {"sha256": sha, "size": size})

    def remove_stale(self, keep: set[str]) -> None:
        """Delete weight files an earlier run left here that this output does not list."""
        for p in self.root.iterdir():
            stale = p.name.endswith((".safetensors", TMP_SUFFIX)) and p.name not in keep
            if stale and p.is_file():
                p.unlink()

    def write_small(self, rel: str, data: bytes) -> dict:
        p = self.root / rel
        tmp = p.with_name(p.name + TMP_SUFFIX)
        try:
            tmp.write_bytes(data)
            os.replace(tmp, p)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise OutputError(f"{p}: cannot write ({e.strerror}); check the disk") from None
        return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}

    def copy_side_file(self, src: Path, rel: str) -> dict:
        if meta := self._reusable(rel):
            return meta
        dst = self.root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + TMP_SUFFIX)
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise OutputError(
                f"{dst}: cannot copy from {src} ({e.strerror}); check the disk"
            ) from None
        return self._record(rel, {"sha256": sha256_file(dst), "size": dst.stat().st_size})


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_claimable(out_dir: Path, overwrite: bool) -> bool:
    """Raise unless `out_dir` may be written. True when it holds files that must be replaced."""
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"{out_dir}: exists and is not a folder; choose another out-dir")
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return False
    if (out_dir / STATE_DIR).is_dir() or (out_dir / MANIFEST_NAME).is_file():
        return False  # ours: resumed or redone in place
    if not overwrite:
        raise OutputError(
            f"{out_dir}: exists and is not an fi-convert output; pass --overwrite to replace "
            "its contents, or choose another out-dir"
        )
    return True


def _read_pid(p: Path) -> int | None:
    try:
        return int(p.read_text().strip())
    except (OSError, ValueError):
        return None


def preflight(plan: Plan, out_dir: Path, overwrite: bool = False) -> None:
    """The out-dir checks `run_plan` makes before it writes: placement and ownership."""
    check_out_dir(plan, out_dir)
    check_claimable(out_dir, overwrite)

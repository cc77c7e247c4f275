"""The out-dir transaction: claim, lock, journal, temporary names, reuse, manifest last.

A run first decides what the out-dir holds (`survey`): nothing, a folder that is not ours
(replaced only with --overwrite), an unfinished run (resumed when it is this conversion of
this source), or a finished output. A finished output of this conversion that is up to date
is left exactly as it is; one of another source or other options is replaced only with
--overwrite, and then entirely. Otherwise its manifest stays in place, so the output stays
finished, until the run first replaces or removes one of its files.

A run looks, takes an flock on `.fi-convert/lock`, and looks again: what it does with the
folder is decided with the lock held, and a run refused (another one writes there) touches
nothing. While a run writes, the lock keeps a second run out, and the journal
`.fi-convert/state.json` records each finished file (SHA-256 and size) under the plan's key
and the source's identity (each source shard's size, mtime, ctime and inode): a rerun reuses
only files made from the same source bytes, as far as those show. Every file is written under
a temporary name and renamed when complete; the manifest is written last. Every failure of
the filesystem (a full disk, no free inodes, a read-only mount) is an `OutputError` of one
line, and the temporary files are removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import jsontext
from . import manifest as mf
from .errors import ManifestError, OutputError, SourceError
from .format import manifest as fm
from .format.hashes import sha256_file
from .format.names import INDEX_NAME, MANIFEST_NAME, STATE_DIR
from .plan import Plan, ShardPlan, check_out_dir
from .st_io import TMP_SUFFIX, WRITEBACK, DiskRoom, ShardWriter

JOURNAL_NAME = "state.json"
LOCK_NAME = "lock"
RESUME = "run the same command again to resume"


def _error(path: Path, what: str, e: OSError) -> OutputError:
    """One line for a failed filesystem call on the out-dir, with what to do about it."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free space or inodes there and {RESUME}"
    elif e.errno == errno.EROFS:
        fix = "the filesystem is read-only; choose another out-dir"
    elif e.errno in (errno.EACCES, errno.EPERM):
        fix = "check the out-dir's permissions"
    elif e.errno in (errno.ENOTDIR, errno.EEXIST):
        fix = "a file stands where a folder must be; choose another out-dir"
    else:
        fix = f"check the out-dir and {RESUME}"
    return OutputError(f"{path}: cannot {what} ({e.strerror}); {fix}")


def _meta(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def index_bytes(plan: Plan) -> bytes:
    weight_map = {it.entry.name: s.name for s in plan.shards for it in s.items}
    d = {
        "metadata": {"total_size": plan.bytes_to_write},
        "weight_map": dict(sorted(weight_map.items())),
    }
    return (json.dumps(d, indent=2) + "\n").encode()


def source_identity(plan: Plan) -> dict[str, list[int]]:
    """Each source shard's [size, mtime_ns, ctime_ns, inode]: what changes whenever its bytes
    may have (a rewrite moves mtime and ctime, a replaced file has a new inode, and ctime
    cannot be set back), read without reading the data (a source can be 700 GB)."""
    out = {}
    for p in plan.ckpt.shards:
        try:
            st = os.stat(p)
        except OSError as e:
            raise SourceError(f"{p}: cannot read ({e.strerror}); check the model folder") from None
        out[p.name] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    return out


def source_location(plan: Plan) -> str:
    """Where the source lives: its folder, or for a Hugging Face cache snapshot the repo
    (another revision of the same repo is the same source, changed)."""
    real = plan.ckpt.root.resolve()
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return str(real.parent.parent)
    return str(real)


@dataclass
class Target:
    """What a plan writes besides its shards, and what its source is now."""

    side: dict[str, bytes | Path]  # side file -> its bytes (config.json) or the source file
    side_meta: dict[str, dict]
    index: bytes
    names: set[str]  # every file of the output, manifest aside
    source: dict[str, list[int]]
    location: str

    @classmethod
    def of(cls, plan: Plan) -> Target:
        side: dict[str, bytes | Path] = {}
        meta = {}
        for rel in plan.side_files:
            p = plan.ckpt.root / rel
            marked = plan.marked(rel)  # the config: marked so that no server loads it as the source
            if marked is not None:
                side[rel] = marked
                meta[rel] = _meta(marked)
                continue
            side[rel] = p
            try:  # side files are small: compared by content, never by the journal
                meta[rel] = {"sha256": sha256_file(p), "size": p.stat().st_size}
            except OSError as e:
                raise SourceError(
                    f"{p}: cannot read ({e.strerror}); check the model folder"
                ) from None
        index = index_bytes(plan)
        names = {*side, *(s.name for s in plan.shards), INDEX_NAME}
        return cls(side, meta, index, names, source_identity(plan), source_location(plan))


@dataclass
class Claim:
    """What `survey` found in the out-dir, and what the run does with it."""

    # "new", "wipe", "resume", "up_to_date", "redo" (a finished output, claimed until replaced)
    kind: str
    manifest: dict | None = None
    journal: dict = field(default_factory=dict)  # files reusable from an earlier run
    note: str | None = None  # for the user: why a finished output is converted again


def _placement(root: Path) -> None:
    """Refuse an out-dir that is a file, or under one."""
    for q in (root, *root.parents):
        try:
            is_dir = q.is_dir()
            exists = is_dir or q.exists() or q.is_symlink()
        except OSError as e:
            raise _error(q, "look at the out-dir", e) from None
        if exists:
            if not is_dir:
                what = "exists and is not a folder" if q == root else f"is under {q}, a file"
                raise OutputError(f"{root}: {what}; choose another out-dir")
            return


def survey(
    plan: Plan,
    root: Path,
    overwrite: bool,
    target: Target | None = None,
    *,
    held: bool = False,
    made_state: bool = False,
) -> Claim:
    """What `root` holds and what a run of `plan` may do with it; raises when it may not be
    written, or while another run writes it. Changes nothing. `held`: this run holds the
    lock (so no other run writes); `made_state`: it made the state folder to take it, which
    then says nothing about the folder."""
    t = target or Target.of(plan)
    _placement(root)
    try:
        entries = list(root.iterdir()) if root.exists() else []
    except OSError as e:
        raise _error(root, "list the out-dir", e) from None
    state = root / STATE_DIR
    if made_state:
        entries = [p for p in entries if p.name != STATE_DIR]
    elif not held and state.is_dir():
        _refuse_if_locked(root)  # the real cause first: what it holds is changing
    if not entries:
        return Claim("new")
    if (root / MANIFEST_NAME).is_file():
        return _finished(plan, root, overwrite, t)
    if not made_state and state.is_dir():
        return _unfinished(plan, root, overwrite, t)
    if not overwrite:
        raise OutputError(
            f"{root}: exists and is not an fi-convert output; pass --overwrite to replace "
            "its contents, or choose another out-dir"
        )
    return Claim("wipe")


def _differs(plan: Plan, m: dict, t: Target) -> str | None:
    """How the finished output `m` is not this plan's conversion (None when it is)."""
    want = json.loads(json.dumps(mf.build(plan, {})))
    if m.get("source") != want["source"]:
        src = m["source"] if isinstance(m.get("source"), dict) else {}
        return f"of another source (model_type {src.get('model_type')}, {src.get('shards')} shards)"
    opts = ("scheme", "backend", "tp_size")
    if any(m.get(k) != want[k] for k in opts):
        return "with other options ({})".format(", ".join(f"{k} {m.get(k)}" for k in opts))
    if m.get("fi_convert_version") != want["fi_convert_version"]:
        return f"made by fi-convert {m.get('fi_convert_version')}"
    if {k: v for k, v in m.items() if k != "files"} != {
        k: v for k, v in want.items() if k != "files"
    }:
        return "with other options"
    return None


def _finished(plan: Plan, root: Path, overwrite: bool, t: Target) -> Claim:
    try:
        m = fm.read(root)
        why = _differs(plan, m, t)
    except ManifestError as e:
        why, m = f"whose manifest cannot be read ({e})", {}
    if why is not None:
        if not overwrite:
            raise OutputError(
                f"{root}: holds a finished fi-convert output {why}; pass --overwrite to replace "
                "it, or choose another out-dir"
            )
        return Claim("wipe")
    stale = _stale_files(root, m, t)
    # the same tensors in the same shards (not another --max-shard-size): same shard bytes
    same_shards = set(m["files"]) == t.names and m["files"].get(INDEX_NAME) == _meta(t.index)
    if not same_shards:
        stale.insert(0, "the shard layout")
    older = _source_older(plan, root)
    if older is None:
        if not overwrite:
            raise OutputError(
                f"{root}: holds a finished fi-convert output of this conversion, but the source "
                "changed since it was made (or this is another checkpoint of the same shapes); "
                "pass --overwrite to convert it again, or choose another out-dir"
            )
        return Claim("redo", m, note=f"{root}: the source changed since; converting again")
    if not stale:
        return Claim("up_to_date", m)
    # this source, unchanged: its shards are reused where their SHA-256 still match
    files = m["files"] if same_shards else {}
    journal = {n: meta for n, meta in files.items() if n.endswith(".safetensors")}
    what = ", ".join(stale[:3]) + (", ..." if len(stale) > 3 else "")
    return Claim("redo", m, journal, f"{root}: out of date ({what}); updating it")


def _stale_files(root: Path, m: dict, t: Target) -> list[str]:
    """Files of the finished output `m` that are not what this run would write there, by
    content for side files, by size for the rest (`verify` hashes them)."""
    stale = [rel for rel, meta in t.side_meta.items() if m["files"].get(rel) != meta]
    for rel, meta in m["files"].items():
        p = root / rel
        try:
            ok = p.is_file() and not p.is_symlink() and p.stat().st_size == meta["size"]
        except OSError:
            ok = False
        if not ok and rel not in stale:
            stale.append(rel)
    return stale


def _source_older(plan: Plan, root: Path) -> bool | None:
    """True when no source shard changed since the manifest was written (its mtime and
    ctime are older: ctime cannot be set back, and a run checks its source after writing
    the manifest); None when one may have."""
    try:
        made = (root / MANIFEST_NAME).stat().st_mtime_ns
    except OSError:
        return None
    for p in plan.ckpt.shards:
        try:
            st = os.stat(p)
        except OSError:
            return None
        if max(st.st_mtime_ns, st.st_ctime_ns) >= made:
            return None
    return True


def _read_journal(state_dir: Path) -> dict:
    try:
        d = jsontext.loads((state_dir / JOURNAL_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) and isinstance(d.get("files"), dict) else {}


def _unfinished(plan: Plan, root: Path, overwrite: bool, t: Target) -> Claim:
    d = _read_journal(root / STATE_DIR)
    shards = [n for n in d.get("files", {}) if n.endswith(".safetensors")]
    src = d["source"] if isinstance(d.get("source"), dict) else {}
    if d.get("key") == plan.key() and src.get("files") == t.source:
        return Claim("resume", journal=d["files"])
    if not shards:  # nothing of value: no shard finished
        return Claim("resume")
    if d.get("key") == plan.key() and src.get("location") == t.location:
        # the same source changed since (a Hub repo that updated its weights): start over
        return Claim(
            "resume",
            note=f"{plan.ckpt.root}: changed since the interrupted run; "
            "converting everything again",
        )
    if not overwrite:
        raise OutputError(
            f"{root}: holds an unfinished fi-convert output of another source or other "
            f"options ({len(shards)} shards done); run its own command to resume it, pass "
            "--overwrite to replace it, or choose another out-dir"
        )
    return Claim("wipe")


def _refuse_if_locked(root: Path) -> None:
    """Refuse while another run holds the lock (without taking it: nothing is written)."""
    lock = root / STATE_DIR / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        _busy(root, lock)
    except OSError:
        pass
    finally:
        os.close(fd)


def _busy(root: Path, lock: Path) -> None:
    pid = _read_pid(lock)
    who = f" (pid {pid})" if pid is not None else ""
    raise OutputError(f"{root}: another fi-convert{who} is writing here; wait for it to finish")


def preflight(plan: Plan, out_dir: Path, overwrite: bool = False) -> Claim:
    """The out-dir checks `run_plan` makes before it writes: placement and ownership."""
    check_out_dir(plan, out_dir)
    return survey(plan, out_dir, overwrite)


class OutDir:
    """Claims an output folder for a run of `plan`: see the module's docstring."""

    room: DiskRoom | None = None  # no disk budget: a local conversion writes its whole output

    def __init__(self, root: Path, plan: Plan, overwrite: bool, fsync: bool = True) -> None:
        self.root, self.plan, self.overwrite, self.fsync = root, plan, overwrite, fsync
        self.key = plan.key()
        self.state_dir = root / STATE_DIR
        self.done: dict[str, dict] = {}
        self.reused: list[str] = []
        self.notes: list[str] = []
        self.up_to_date = False
        self.manifest: dict | None = None  # a finished output's, while it is claimed
        self.target = Target.of(plan)
        # finished files are flushed to disk in the background while the next ones are made
        # (several at once: files finished together are written to disk in parallel)
        self.syncer = ThreadPoolExecutor(4, thread_name_prefix="fi-convert-fsync")
        self.syncing: dict[str, Future] = {}
        self.lock = threading.Lock()  # the journal, written from the shard workers
        self.claim_lock = threading.Lock()
        self._lock_fd: int | None = None

    @property
    def writeback(self) -> bool:
        """Shards are made durable before the manifest: their bytes go on to the disk early."""
        return self.fsync

    def __enter__(self) -> OutDir:
        check_out_dir(self.plan, self.root)
        claim = survey(self.plan, self.root, self.overwrite, self.target)  # refuses early
        if claim.kind != "up_to_date" or self._state_left():
            claim = self._claim()
        if claim.note:
            self.notes.append(claim.note)
        if claim.kind == "up_to_date":
            self.up_to_date, self.manifest = True, claim.manifest
            self.syncer.shutdown()
            return self
        try:
            if claim.kind == "wipe":
                self._wipe()
            elif claim.kind == "redo":
                self.manifest = claim.manifest  # still finished until a file is replaced
            self.done = dict(claim.journal)
            self._write_journal()  # this run's source identity, before any file is made
        except BaseException:
            self._cleanup()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.syncer.shutdown(wait=True, cancel_futures=True)
        WRITEBACK.drain()  # the run's files are closed everywhere when it ends
        if self.up_to_date:
            return
        if exc_type is None:
            self._remove_state()
        else:
            self._cleanup()

    def _claim(self) -> Claim:
        """Take the lock, then survey the folder again: another run may have changed it since
        the first look, and none can now. Nothing is touched before the lock is held; a run
        refused now (or finding the output up to date) leaves it as it found it."""
        made = self._lock()
        try:
            claim = survey(
                self.plan, self.root, self.overwrite, self.target, held=True, made_state=made
            )
        except BaseException:
            self._release(made)
            raise
        if claim.kind == "up_to_date":
            if made:
                self._release(made)
            else:  # a killed run's state folder in a finished output: not part of it
                self._remove_state()
        return claim

    def _state_left(self) -> bool:
        """Whether the out-dir holds a state folder (`survey` refused already if a run holds
        its lock): a run killed after its manifest was written, before it removed it."""
        try:
            return self.state_dir.is_dir() and not self.state_dir.is_symlink()
        except OSError:
            return False

    def _release(self, made: bool) -> None:
        """Give up the lock without having written, and the state folder if this run made it
        (unless another run has opened its lock there since)."""
        self._unlock()
        if made:
            with contextlib.suppress(OSError):
                self.state_dir.rmdir()

    def _cleanup(self) -> None:
        """After a failure (Ctrl-C can land anywhere): no partial file, no lock. Only while
        this run holds the lock: the temporary files are then its own, else another run's."""
        if self._lock_fd is None:
            return
        try:
            for top, _, names in os.walk(self.root):
                for name in names:
                    if name.endswith(TMP_SUFFIX):
                        (Path(top) / name).unlink(missing_ok=True)
        except OSError:
            pass  # a rerun removes what is left
        self._unlock()

    def _mkdir(self, p: Path) -> None:
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _error(p, "create the folder", e) from None

    def _lock(self) -> bool:
        """An flock on `.fi-convert/lock`, held for the whole run: the kernel releases it when
        this process dies, however it dies, so a dead run (a killed container's PID 1
        included) never blocks the next one. The file names the holder's PID for the message.
        Returns whether this run made the state folder (a run that finished removes it)."""
        lock = self.state_dir / LOCK_NAME
        for _ in range(3):
            made = self._make_state_dir()
            try:
                fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
            except FileNotFoundError:  # the run that made it finished in between
                continue
            except OSError as e:
                raise _error(lock, "open the lock", e) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                _busy(self.root, lock)
            except OSError as e:
                os.close(fd)
                raise _error(lock, "lock", e) from None
            try:  # a holder that finished unlinks the file: then ours is a stale inode
                same = os.fstat(fd).st_ino == os.stat(lock).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._lock_fd = fd
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, str(os.getpid()).encode(), 0)
                except OSError:
                    pass  # the PID is for messages only; the flock is held
                return made
            os.close(fd)
        raise OutputError(f"{lock}: cannot take the lock; run again")

    def _make_state_dir(self) -> bool:
        """The out-dir and its state folder; whether this call made the state folder."""
        self._mkdir(self.root)
        try:
            self.state_dir.mkdir()
        except FileExistsError:
            return False
        except OSError as e:
            raise _error(self.state_dir, "create the folder", e) from None
        return True

    def _remove_state(self) -> None:
        """After success: the journal while the lock is held, then the lock, then the folder
        (left to a run that has opened a lock file in it since)."""
        with contextlib.suppress(OSError):
            for p in self.state_dir.iterdir():
                if p.name != LOCK_NAME:
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
        self._release(True)

    def _unlock(self) -> None:
        fd = self._lock_fd
        if fd is not None:
            with contextlib.suppress(OSError):  # while still holding it
                (self.state_dir / LOCK_NAME).unlink(missing_ok=True)
            os.close(fd)  # releases the flock
            self._lock_fd = None

    def _wipe(self) -> None:
        """--overwrite: the manifest first (the folder is no longer a finished output), then
        everything but the state folder."""
        try:
            (self.root / MANIFEST_NAME).unlink(missing_ok=True)
            for p in self.root.iterdir():
                if p.name == STATE_DIR:
                    continue
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except OSError as e:
            raise _error(Path(e.filename or self.root), "remove the old output", e) from None

    def replacing(self, rel: str | None = None, meta: dict | None = None) -> None:
        """Called before file `rel` is replaced with bytes of `meta` (or a file is removed):
        a finished output's manifest goes first (flushed), since the folder stops being that
        output - unless the new bytes are the ones the manifest lists."""
        with self.claim_lock:
            if self.manifest is None or (meta and self.manifest["files"].get(rel) == meta):
                return
            try:
                (self.root / MANIFEST_NAME).unlink(missing_ok=True)
                if self.fsync:
                    _fsync(self.root)
            except OSError as e:
                raise _error(self.root / MANIFEST_NAME, "remove the old manifest", e) from None
            self.manifest = None

    def _journal_path(self) -> Path:
        return self.state_dir / JOURNAL_NAME

    def _write_journal(self) -> None:
        source = {"location": self.target.location, "files": self.target.source}
        d = {"key": self.key, "source": source, "files": self.done}
        tmp = self._journal_path().with_name(JOURNAL_NAME + TMP_SUFFIX)
        try:
            tmp.write_text(json.dumps(d, sort_keys=True))
            os.replace(tmp, self._journal_path())
        except OSError as e:
            _unlink_quietly(tmp)
            raise _error(self._journal_path(), "write the journal", e) from None

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
            raise _error(self.root, "flush the output to disk", e) from None

    def _record(self, rel: str, meta: dict) -> dict:
        self._sync_later(rel)
        with self.lock:
            self.done[rel] = meta
            self._write_journal()
        return meta

    def _reusable(self, rel: str) -> dict | None:
        meta = self.done.get(rel)
        p = self.root / rel
        try:
            if not (meta and p.is_file() and p.stat().st_size == meta["size"]):
                return None
            if sha256_file(p) != meta["sha256"]:
                return None
        except OSError:
            return None
        self.reused.append(rel)
        self._sync_later(rel)
        return meta

    def resumable(self, shards: list[ShardPlan]) -> tuple[int, int]:
        """How many of `shards` (and their bytes) an earlier run left here for this one to
        reuse, as far as their sizes tell (`shard` checks each SHA-256 before reusing it)."""
        n = nbytes = 0
        for s in shards:
            meta = self.done.get(s.name)
            try:
                if meta and (self.root / s.name).stat().st_size == meta["size"]:
                    n, nbytes = n + 1, nbytes + meta["size"]
            except OSError:
                pass
        return n, nbytes

    def shard(self, shard: ShardPlan, write: Callable[[ShardPlan], ShardWriter]) -> dict:
        if meta := self._reusable(shard.name):
            return meta
        w = write(shard)
        try:  # every byte is written and hashed: the file's meta is known before its rename
            self.replacing(shard.name, {"sha256": w.sha.copy().hexdigest(), "size": w.total})
        except BaseException:
            w.abort()
            raise
        sha, size = w.finish()
        return self._record(shard.name, {"sha256": sha, "size": size})

    def write_side_files(self) -> dict[str, dict]:
        """The side files, each reused when the out-dir already holds its bytes."""
        files = {}
        for rel, src in self.target.side.items():
            meta = self.target.side_meta[rel]
            if self._holds(rel, meta):
                files[rel] = meta
            elif isinstance(src, bytes):
                files[rel] = self.write_small(rel, src)
            else:
                files[rel] = self._copy(src, rel)
        return files

    def _holds(self, rel: str, meta: dict) -> bool:
        p = self.root / rel
        try:
            ok = p.is_file() and not p.is_symlink() and p.stat().st_size == meta["size"]
            ok = ok and sha256_file(p) == meta["sha256"]
        except OSError:
            return False
        if ok:
            self.reused.append(rel)
            self._sync_later(rel)
        return ok

    def write_index(self) -> dict:
        meta = _meta(self.target.index)
        if self._holds(INDEX_NAME, meta):
            return meta
        return self.write_small(INDEX_NAME, self.target.index)

    def write_small(self, rel: str, data: bytes) -> dict:
        p = self.root / rel
        tmp = p.with_name(p.name + TMP_SUFFIX)
        try:
            self._mkdir(p.parent)
            tmp.write_bytes(data)
            self.replacing(rel, _meta(data))
            os.replace(tmp, p)
        except OSError as e:
            _unlink_quietly(tmp)
            raise _error(p, "write", e) from None
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return _meta(data)

    def copy_file(self, src: Path, rel: str) -> dict:
        """A source file carried over byte for byte (a shard without experts), reused from
        an earlier run of this source."""
        if meta := self._reusable(rel):
            return meta
        return self._record(rel, self._copy(src, rel))

    def _copy(self, src: Path, rel: str) -> dict:
        dst = self.root / rel
        tmp = dst.with_name(dst.name + TMP_SUFFIX)
        self._mkdir(dst.parent)
        try:
            try:
                src_fd = os.open(src, os.O_RDONLY)
            except OSError as e:
                raise SourceError(
                    f"{src}: cannot read ({e.strerror}); check the model folder"
                ) from None
            os.close(src_fd)
            shutil.copyfile(src, tmp)
            meta = {"sha256": sha256_file(tmp), "size": tmp.stat().st_size}
            self.replacing(rel, meta)
            os.replace(tmp, dst)
        except OSError as e:
            _unlink_quietly(tmp)
            raise _error(dst, f"copy {src} to", e) from None
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return meta

    def remove_stale(self, keep: set[str]) -> None:
        """Delete every file an earlier run or an older output left here that this output
        does not list, and the folders that leaves empty. Hidden entries (the state folder
        among them) are never the output's, and links are not followed."""
        keep = keep | {MANIFEST_NAME}
        try:
            for top, dirs, names in os.walk(self.root, topdown=False):
                here = Path(top)
                rel = here.relative_to(self.root)
                if any(part.startswith(".") for part in rel.parts):
                    continue
                for name in names + [d for d in dirs if (here / d).is_symlink()]:
                    if not name.startswith(".") and (rel / name).as_posix() not in keep:
                        self.replacing()
                        (here / name).unlink()
                if here != self.root and not any(here.iterdir()):
                    self.replacing()
                    here.rmdir()
        except OSError as e:
            raise _error(Path(e.filename or self.root), "remove a stale file", e) from None

    def commit(self, manifest: dict) -> None:
        """Write the manifest, last; then make sure the source did not change while it was
        read (so that a source older than the manifest is the one converted)."""
        self.replacing()
        path = self.root / MANIFEST_NAME
        try:
            mf.write(self.root, manifest)
            if self.fsync:
                _fsync(self.root)
        except OSError as e:
            _unlink_quietly(path.with_name(path.name + TMP_SUFFIX))
            raise _error(path, "write the manifest", e) from None
        try:
            now = source_identity(self.plan)
        except SourceError:  # a shard gone: not the source that was converted either
            path.unlink(missing_ok=True)
            raise
        changed = [n for n, ident in now.items() if self.target.source.get(n) != ident]
        if changed:
            path.unlink(missing_ok=True)
            raise SourceError(
                f"{self.plan.ckpt.root / changed[0]}: changed while it was converted; "
                "run the same command again to convert the new bytes"
            )


def _unlink_quietly(p: Path) -> None:
    with contextlib.suppress(OSError):
        p.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_pid(p: Path) -> int | None:
    try:
        return int(p.read_text().strip())
    except (OSError, ValueError):
        return None

"""Minimal safetensors reading and writing, without pickle and without loading whole files.

Reading parses and validates the header, then `pread`s exactly the bytes of a tensor (or a
contiguous run of its rows) into a caller's buffer. Writing lays out a shard whose header is
known up front, streams the tensors in order into a temporary file while hashing them, and
renames it into place when complete.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import queue
import stat
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open

from . import dtypes
from .errors import OutputError, SourceError
from .format.hashes import hash_mapped

# the safetensors library's limits (its MAX_HEADER_SIZE, and u64 sizes): stricter would
# refuse files it reads, looser would accept files it refuses
MAX_HEADER = 100_000_000
U64 = 2**64
# torch sizes are int64: a dimension the library allows but torch cannot hold is refused too
MAX_DIM = 2**63 - 1
TMP_SUFFIX = ".fi-convert-tmp"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int
    file: Path

    @property
    def row_bytes(self) -> int:
        """Bytes of one index along dim 0."""
        return self.nbytes // self.shape[0] if self.shape and self.shape[0] else self.nbytes


def _bad(path: Path, what: str) -> SourceError:
    return SourceError(f"{path}: {what}; the file is corrupt or truncated - download it again")


def read_header(
    path: Path, library_check: bool = True, fd: int | None = None
) -> tuple[dict[str, TensorInfo], bytes]:
    """Parse and validate a safetensors header. Returns the tensors and the raw header bytes.

    A header is accepted only when both our strict parse (`_tensor_infos`) and the safetensors
    library (`_library_check`) accept it and they find the same tensors: a file that loaders
    would refuse or read differently is never converted, nor accepted by `verify`. Without
    `library_check` (a reader that reads every byte by this parse alone, as the plugins' loads
    do: the library's opinion guards nothing there, and costs ~20 ms a shard), the strict parse
    alone. With `fd` (the file open already, for the reads that follow), read from it.
    """
    raw, size = _read_raw(path, fd)
    meta = _strict_json(path, raw)
    infos = _tensor_infos(path, meta, 8 + len(raw), size)
    if library_check:
        _library_check(path, set(infos))
    return infos, raw


def _read_raw(path: Path, fd: int | None = None) -> tuple[bytes, int]:
    """The header bytes (without the length prefix) and the file's size: from the open file
    `fd` (named `path`), else from `path`, opened for it."""
    try:
        if fd is not None:
            return _header_bytes(path, fd)
        _regular(path, os.stat(path))  # (before the open: a FIFO's would wait for a writer)
        own = os.open(path, os.O_RDONLY)
        try:
            return _header_bytes(path, own)
        finally:
            os.close(own)
    except OSError as e:
        raise SourceError(
            f"{path}: cannot read ({e.strerror}); check the path and permissions"
        ) from None


def _regular(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read forever
        raise SourceError(
            f"{path}: not a regular file (a FIFO, socket or device); replace it with the "
            "safetensors file"
        )


def _header_bytes(path: Path, fd: int) -> tuple[bytes, int]:
    st = os.fstat(fd)
    _regular(path, st)
    head = os.pread(fd, 8, 0)
    if len(head) < 8:
        raise _bad(path, "shorter than a safetensors header")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER:
        raise _bad(path, f"header length {n} is over the safetensors limit of {MAX_HEADER}")
    if n + 8 > st.st_size:
        raise _bad(path, f"header length {n} does not fit in a file of {st.st_size} bytes")
    raw = os.pread(fd, n, 8)
    if len(raw) != n:  # the file shrank since the stat
        raise _bad(path, f"ends inside its {n}-byte header")
    return raw, st.st_size


class _Duplicate(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: with a key twice, which one a reader takes
    is up to the reader (the library takes the last for some objects and refuses for others)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def _no_constant(word: str) -> None:
    raise ValueError(f"{word} is not JSON")  # Python's json takes NaN and Infinity


def _strict_json(path: Path, raw: bytes) -> dict:
    """The header as JSON is meant (RFC 8259, what the library's serde_json reads): UTF-8 only,
    no NaN or Infinity, no key twice in an object."""
    try:
        meta = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant
        )
    except _Duplicate as e:
        raise _bad(path, f"header has the key {e.args[0]!r} twice in one object") from None
    except UnicodeDecodeError:
        raise _bad(path, "header is not UTF-8") from None
    except RecursionError:
        raise _bad(path, "header is not valid JSON (nested too deep)") from None
    except ValueError as e:
        raise _bad(path, f"header is not valid JSON ({_one_line(str(e))})") from None
    if not isinstance(meta, dict):
        raise _bad(path, "header is not a JSON object")
    return meta


def _size(v: object, limit: int) -> bool:
    """`v` is a JSON integer in [0, limit] (a bool is not: Python's True is an int)."""
    return type(v) is int and 0 <= v <= limit


def _tensor_infos(path: Path, meta: dict, base: int, size: int) -> dict[str, TensorInfo]:
    """Every entry well formed, and the tensors' bytes exactly tile the data: contiguous from
    the end of the header, no gap, no overlap (no tensor reads another's bytes), no trailing
    bytes - the library's rules, checked again here on the bytes we read."""
    out: dict[str, TensorInfo] = {}
    for name, entry in meta.items():
        if name == "__metadata__":
            _check_metadata(path, entry)
            continue
        out[name] = _tensor_info(path, name, entry, base)
    end = base
    for info in sorted(out.values(), key=lambda i: (i.start, i.start + i.nbytes)):
        if info.start != end:
            what = "overlaps the tensor before it" if info.start < end else "leaves a gap"
            raise _bad(path, f"tensor {info.name!r} at byte {info.start} {what} (at {end})")
        end = info.start + info.nbytes
    if end != size:
        raise _bad(path, f"its tensors end at byte {end}, but the file has {size} bytes")
    return out


def _check_metadata(path: Path, entry: object) -> None:
    """`__metadata__` is absent, null or a map of strings to strings, as the library wants."""
    if entry is not None and not (
        isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())
    ):
        raise _bad(path, "header's __metadata__ is not a map of strings to strings")


def _tensor_info(path: Path, name: str, entry: object, base: int) -> TensorInfo:
    ok = False
    if isinstance(entry, dict):
        dt, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        ok = (
            isinstance(dt, str)
            and dtypes.known(dt)
            and isinstance(shape, list)
            and all(_size(d, MAX_DIM) for d in shape)
            and isinstance(offsets, list)
            and len(offsets) == 2
            and all(_size(o, U64 - 1) for o in offsets)
            and offsets[0] <= offsets[1]
        )
    if not ok:
        raise _bad(path, f"header entry for tensor {name!r} is malformed")
    assert isinstance(entry, dict)
    dt, shape, (s, e) = entry["dtype"], entry["shape"], entry["data_offsets"]
    n = _checked_nbytes(dt, shape)
    if n is None:
        raise _bad(path, f"tensor {name!r} has a shape {shape} too large for any file")
    if e - s != n:
        raise _bad(path, f"tensor {name!r} has {e - s} bytes, its shape needs {n}")
    return TensorInfo(name, dt, tuple(shape), base + s, n, path)


def _checked_nbytes(dt: str, shape: list[int]) -> int | None:
    """Bytes of the tensor, or None where the library's u64 arithmetic would overflow (it
    multiplies the dimensions in order, then by the item size)."""
    n = 1
    for d in shape:
        n *= d
        if n >= U64:
            return None
    n *= dtypes.ITEMSIZE[dt]
    return n if n < U64 else None


def _one_line(s: str, limit: int = 200) -> str:
    """`s` on one line (control characters escaped, as a tensor name may hold them), cut
    to `limit` characters."""
    s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _library_check(path: Path, names: set[str]) -> None:
    """The safetensors library opens the file (it parses the header and maps the file, reading
    no tensor data) and finds the tensors we found. The "numpy" framework: "pt" reads the whole
    file in safetensors 0.8."""
    try:
        with safe_open(path, framework="numpy") as f:
            theirs = set(f.keys())
    except OSError as e:
        raise SourceError(
            f"{path}: cannot read ({e.strerror}); check the path and permissions"
        ) from None
    except Exception as e:  # SafetensorError, or whatever else the library raises
        raise _bad(path, f"the safetensors library refuses it ({_library_says(e)})") from None
    except BaseException as e:  # a Rust panic arrives as pyo3's PanicException
        if type(e).__name__ != "PanicException":
            raise
        raise _bad(path, f"the safetensors library fails on it ({_library_says(e)})") from None
    if theirs != names:
        odd = sorted(theirs ^ names)[0]
        raise _bad(path, f"the safetensors library reads its tensors differently ({odd!r})")


def _library_says(e: BaseException) -> str:
    msg = str(e).removeprefix("Error while deserializing header: ")
    return _one_line(msg or type(e).__name__)


def _as_bytes(t: torch.Tensor) -> memoryview:
    if not t.is_contiguous():
        raise ValueError("buffer must be contiguous")
    arr: Any = t.reshape(-1).view(torch.uint8).numpy()
    return memoryview(arr).cast("B")


def pread_into(fd: int, offset: int, dst: torch.Tensor, path: Path) -> None:
    """Fill the contiguous CPU tensor `dst` with bytes read from `fd` at `offset`."""
    mv = _as_bytes(dst)
    done = 0
    while done < len(mv):
        n = os.preadv(fd, [mv[done:]], offset + done)
        if n <= 0:
            raise _bad(path, f"ends before byte {offset + len(mv)}")
        done += n


class SourceFiles:
    """Open file descriptors of source shards, shared by all reads of one run. (A streamed
    run's reads come from the Hub instead: `local` is False there, and `fd` has no file.)"""

    local = True
    read_ahead = 0  # reads asked ahead of the one taken (`prefetch`), for a remote source

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()  # shared by the shard workers

    def fd(self, path: Path) -> int:
        with self._lock:
            if path not in self._fds:
                try:
                    # (not blocked by a FIFO in a shard's place: its read refuses it)
                    self._fds[path] = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                except OSError as e:
                    raise SourceError(
                        f"{path}: cannot open ({e.strerror}); check the path"
                    ) from None
            return self._fds[path]

    def read_rows(self, info: TensorInfo, start: int, stop: int, dst: torch.Tensor) -> None:
        """Read rows [start, stop) of dim 0 of `info` into `dst` (contiguous, same byte size)."""
        want = (stop - start) * info.row_bytes
        if dst.numel() * dst.element_size() != want:
            raise ValueError(f"{info.name}: buffer of wrong size for rows {start}:{stop}")
        pread_into(self.fd(info.file), info.start + start * info.row_bytes, dst, info.file)

    def read_bytes(self, path: Path, offset: int, dst: torch.Tensor) -> None:
        """Fill the contiguous `dst` with the bytes of `path` from `offset`."""
        pread_into(self.fd(path), offset, dst, path)

    def prefetch_bytes(self, path: Path, offset: int, nbytes: int) -> None:
        """Bytes that will be read soon (a streamed run fetches them meanwhile; local files
        are copied in the kernel, which reads ahead by itself)."""

    def prefetch(self, info: TensorInfo, start: int, count: int) -> None:
        """Ask the kernel to start reading rows [start, start + count) of `info` into the page
        cache (returns at once; a no-op for pages already there)."""
        fd = self.fd(info.file)
        with contextlib.suppress(OSError):  # advice only
            os.posix_fadvise(
                fd,
                info.start + start * info.row_bytes,
                count * info.row_bytes,
                os.POSIX_FADV_WILLNEED,
            )

    def read(self, info: TensorInfo) -> torch.Tensor:
        t = torch.empty(info.shape, dtype=dtypes.to_torch(info.dtype), device="cpu")
        pread_into(self.fd(info.file), info.start, t, info.file)
        return t

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


@dataclass(frozen=True)
class OutEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return dtypes.nbytes(self.dtype, self.shape)


def build_header(entries: Iterable[OutEntry]) -> bytes:
    """The header bytes (length prefix included) of a shard holding `entries` in this order.

    Valid by construction: offsets tile the data from 0 in order, and `_check_entry` refuses
    what the library would (a name twice, a name that is not UTF-8, an unknown dtype, a size
    that is not a u64). The metadata is ours alone: nothing of a source's `__metadata__`
    reaches it. ShardWriter.finish also has the library open the finished file.
    """
    meta: dict[str, object] = {"__metadata__": {"format": "pt"}}
    off = 0
    for e in entries:
        _check_entry(e, meta)
        meta[e.name] = {
            "dtype": e.dtype,
            "shape": list(e.shape),
            "data_offsets": [off, off + e.nbytes],
        }
        off += e.nbytes
    if off >= U64:
        raise ValueError(f"{off} bytes of tensors do not fit in a safetensors file")
    raw = json.dumps(meta, separators=(",", ":"), allow_nan=False).encode()
    raw += b" " * (-len(raw) % 8)
    if len(raw) > MAX_HEADER:
        raise ValueError(f"a header of {len(raw)} bytes is over the library's {MAX_HEADER}")
    return struct.pack("<Q", len(raw)) + raw


def _check_entry(e: OutEntry, meta: dict[str, object]) -> None:
    if e.name in meta:
        raise ValueError(f"tensor {e.name!r} twice in one shard")
    try:
        e.name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"tensor name {e.name!r} is not UTF-8") from None
    if not dtypes.known(e.dtype):
        raise ValueError(f"tensor {e.name!r} has the unknown dtype {e.dtype!r}")
    if (
        not all(_size(d, MAX_DIM) for d in e.shape)
        or _checked_nbytes(e.dtype, list(e.shape)) is None
    ):
        raise ValueError(f"tensor {e.name!r} has the shape {list(e.shape)}, not u64 sizes")


# copy_file_range / sendfile cannot copy between these two files: copy another way
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_BOUNCE = 4 * 2**20


def _write_all(fd: int, data: bytes | memoryview) -> None:
    mv = memoryview(data)
    while mv:
        mv = mv[os.write(fd, mv) :]


_BUG = "; this is a bug in fi-convert - please report it"


def _libc_sync_file_range() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


class Writeback:
    """Asks the kernel to start writing ranges just written to disk (`sync_file_range` with
    SYNC_FILE_RANGE_WRITE), on a thread of its own so that no writer waits for the disk.
    Without it the kernel starts only once a tenth of the memory is dirty: on the 2-core VM
    the disk idled through the first 2-3 s of a conversion, then the end waited for it.
    Advisory: the fsync before the manifest makes the files durable and reports errors.
    Each writer gives it a duplicate of its file descriptor, closed here after its ranges."""

    START_WRITE = 2  # SYNC_FILE_RANGE_WRITE
    STEP = 8 * 2**20  # ranges of at least this many bytes

    def __init__(self) -> None:
        self.fn = _libc_sync_file_range()
        # (fd, offset, nbytes) ranges and closes; an Event is a barrier (`drain`)
        self.jobs: queue.SimpleQueue[tuple[int, int, int] | threading.Event] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def open(self, fd: int) -> int:
        """A descriptor for `start` and `close` (-1: none, where the kernel has no call)."""
        if self.fn is None:
            return -1
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="fi-convert-writeback", daemon=True
                )
                self.thread.start()
        try:
            return os.dup(fd)
        except OSError:  # out of descriptors: the kernel writes back on its own, later
            return -1

    def start(self, fd: int, offset: int, nbytes: int) -> None:
        self.jobs.put((fd, offset, nbytes))

    def close(self, fd: int) -> None:
        self.jobs.put((fd, -1, 0))

    def drain(self) -> None:
        """Until every range and close handed in so far is done: no descriptor of a file
        written before is held here then (a run does not end while this thread still holds
        its files open, which would keep a deleted file's space in use)."""
        if self.thread is None:
            return
        done = threading.Event()
        self.jobs.put(done)
        done.wait()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if isinstance(job, threading.Event):
                job.set()
                continue
            fd, offset, nbytes = job
            if offset < 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
            else:  # errors are the fsync's to report
                self.fn(fd, offset, nbytes, self.START_WRITE)


WRITEBACK = Writeback()


class DiskRoom(Protocol):
    """A disk budget a writer draws on as it writes (a streamed run's staging): `take` waits
    until `n` more bytes fit, and raises instead once the run failed or `stop` is set; `give`
    returns bytes whose file was removed."""

    def take(self, n: int, stop: threading.Event) -> None: ...

    def give(self, n: int) -> None: ...


class ShardWriter:
    """Writes one safetensors file sequentially under a temporary name, hashing as it goes.

    Bytes come from memory (`write`) or straight from a source file (`copy_from`, copied in the
    kernel: carried-over tensors never pass through this process's memory; `hash_written`
    then hashes them from the page cache). `finish()` checks every byte was written and
    renames into place; `abort()` removes the temporary file. The final name never holds a
    partial file. With `room`, each write first takes its bytes from that disk budget, and
    `abort` gives them back. With `writeback`, the disk starts writing the bytes behind the
    writes (`Writeback`), for a file that is to be made durable.
    """

    def __init__(
        self,
        path: Path,
        entries: list[OutEntry],
        room: DiskRoom | None = None,
        writeback: bool = False,
    ) -> None:
        self.path, self.room = path, room
        self.tmp = path.with_name(path.name + TMP_SUFFIX)
        try:
            self.header = build_header(entries)
        except ValueError as e:
            raise OutputError(
                f"{path}: cannot write a valid safetensors header ({e}){_BUG}"
            ) from None
        self.total = len(self.header) + sum(e.nbytes for e in entries)
        self.sha = hashlib.sha256()
        self.written = 0
        self.taken = 0  # bytes taken from `room`
        self.stop = threading.Event()  # set: a write waiting for room gives up
        self.error: OutputError | None = None
        self._copy = "copy_file_range"  # then "sendfile", then "bounce" if those cannot
        self._fd = self._wb = -1
        self._wb_from = 0  # bytes before this offset were given to WRITEBACK
        try:  # read too: hash_written maps what was written
            self._fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            raise OutputError(f"{self.tmp}: cannot create ({e.strerror})") from None
        try:
            if writeback:
                self._wb = WRITEBACK.open(self._fd)
            self.write_bytes(self.header)
        except BaseException:
            self.abort()
            raise

    def _failed(self, e: OSError) -> OutputError:
        self.error = OutputError(
            f"{self.path}: write failed ({e.strerror}); free disk space or choose another "
            "out-dir, then run the same command again to resume"
        )
        return self.error

    def write_bytes(self, data: bytes | memoryview, hash_it: bool = True) -> None:
        """Append `data`; `hash_it=False` leaves hashing to `hash_bytes`, called in order."""
        if self.error is not None:  # a failed writer stays failed
            raise self.error
        self._take(len(data))
        try:
            _write_all(self._fd, data)
        except OSError as e:
            raise self._failed(e) from None
        if hash_it:
            self.sha.update(data)
        self.written += len(data)
        self._start_writeback()

    def _start_writeback(self) -> None:
        if self._wb >= 0 and self.written - self._wb_from >= WRITEBACK.STEP:
            WRITEBACK.start(self._wb, self._wb_from, self.written - self._wb_from)
            self._wb_from = self.written

    def _end_writeback(self) -> None:
        if self._wb >= 0:
            WRITEBACK.close(self._wb)
            self._wb = -1

    def copy_from(self, src_fd: int, offset: int, nbytes: int, src_path: Path) -> None:
        """Append `nbytes` of `src_fd` from `offset`, copied in the kernel where it can be
        (not hashed: call `hash_written` for the same range, in order)."""
        if self.error is not None:
            raise self.error
        self._take(nbytes)
        done = 0
        try:
            while done < nbytes:
                n = self._copy_some(src_fd, offset + done, nbytes - done)
                if n <= 0:
                    raise _bad(src_path, f"ends before byte {offset + nbytes}")
                done += n
        except OSError as e:
            raise self._failed(e) from None
        self.written += nbytes
        self._start_writeback()

    def _take(self, n: int) -> None:
        if self.room is not None:
            self.room.take(n, self.stop)
            self.taken += n

    def _copy_some(self, src_fd: int, offset: int, n: int) -> int:
        if self._copy == "copy_file_range":
            try:
                return os.copy_file_range(src_fd, self._fd, n, offset)
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY:
                    raise
                self._copy = "sendfile"
        if self._copy == "sendfile":
            try:
                return os.sendfile(self._fd, src_fd, offset, n)
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY:
                    raise
                self._copy = "bounce"
        buf = memoryview(bytearray(min(n, _BOUNCE)))
        k = os.preadv(src_fd, [buf], offset)
        _write_all(self._fd, buf[:k])
        return k

    def hash_written(self, offset: int, nbytes: int) -> None:
        """Hash bytes [offset, offset + nbytes) of the file, already written."""
        hash_mapped(self.sha, self._fd, offset, nbytes)

    def hash_bytes(self, data: bytes | memoryview) -> None:
        self.sha.update(data)

    def write(self, t: torch.Tensor, hash_it: bool = True) -> None:
        self.write_bytes(_as_bytes(t.contiguous()), hash_it)

    def hash(self, t: torch.Tensor) -> None:
        self.hash_bytes(_as_bytes(t.contiguous()))

    def finish(self) -> tuple[str, int]:
        if self.written != self.total:
            self.abort()
            raise RuntimeError(f"{self.path}: wrote {self.written} of {self.total} bytes")
        self._end_writeback()
        try:  # durable later: the converter fsyncs every file before the manifest
            os.close(self._fd)
            self._fd = -1
            self._check_readable()
            os.replace(self.tmp, self.path)
        except OSError as e:
            self.abort()
            raise self._unfinishable(e) from None
        return self.sha.hexdigest(), self.total

    def _unfinishable(self, e: OSError) -> OutputError:
        if isinstance(e, FileNotFoundError):  # the safetensors library's has no strerror
            return OutputError(
                f"{self.path}: cannot finish: {self.tmp.name} was deleted while it was written; "
                "make sure no other program writes into the out-dir, then run the same command "
                "again to resume"
            )
        return OutputError(f"{self.path}: cannot finish ({e.strerror or e}); check the disk")

    def _check_readable(self) -> None:
        """The safetensors library opens the finished file as a loader would (it parses the
        header and checks the data covers the file exactly; it reads no tensor data), so the
        final name never holds a file that it refuses."""
        try:
            with safe_open(self.tmp, framework="numpy"):
                pass
        except OSError:
            raise
        except Exception as e:
            self.abort()
            raise OutputError(
                f"{self.path}: the safetensors library refuses the file written "
                f"({_library_says(e)}){_BUG}"
            ) from None

    def abort(self) -> None:
        self.stop.set()
        self._end_writeback()
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        self.tmp.unlink(missing_ok=True)
        if self.room is not None and self.taken:  # the file is gone: its bytes too
            self.room.give(self.taken)
            self.taken = 0

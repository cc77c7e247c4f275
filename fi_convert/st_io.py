"""Minimal safetensors reading and writing, without pickle and without loading whole files.

Reading parses and validates the header, then `pread`s exactly the bytes of a tensor (or a
contiguous run of its rows) into a caller's buffer. Writing lays out a shard whose header is
known up front, streams the tensors in order into a temporary file while hashing them, and
renames it into place when complete.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import mmap
import os
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import dtypes
from .errors import OutputError, SourceError

MAX_HEADER = 100 * 1024 * 1024
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


def read_header(path: Path) -> tuple[dict[str, TensorInfo], bytes]:
    """Parse and validate a safetensors header. Returns the tensors and the raw header bytes."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _bad(path, "shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or n + 8 > size:
                raise _bad(path, f"header length {n} does not fit in a file of {size} bytes")
            raw = f.read(n)
    except OSError as e:
        raise SourceError(
            f"{path}: cannot read ({e.strerror}); check the path and permissions"
        ) from None
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"header is not valid JSON ({e.__class__.__name__})") from None
    if not isinstance(meta, dict):
        raise _bad(path, "header is not a JSON object")
    return _tensor_infos(path, meta, 8 + n, size), raw


def _tensor_infos(path: Path, meta: dict, base: int, size: int) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for name, entry in meta.items():
        if name == "__metadata__":
            continue
        try:
            dt, shape, (s, e) = entry["dtype"], entry["shape"], entry["data_offsets"]
            ok = (
                isinstance(dt, str)
                and dtypes.known(dt)
                and isinstance(shape, list)
                and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(s, int)
                and isinstance(e, int)
                and 0 <= s <= e
            )
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise _bad(path, f"header entry for tensor {name!r} is malformed")
        if e - s != dtypes.nbytes(dt, shape):
            raise _bad(path, f"tensor {name!r} has {e - s} bytes, its shape needs another size")
        if base + e > size:
            raise _bad(path, f"tensor {name!r} ends at byte {base + e}, past the file's {size}")
        out[name] = TensorInfo(name, dt, tuple(shape), base + s, e - s, path)
    return out


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
    """Open file descriptors of source shards, shared by all reads of one run."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()  # shared by the shard workers

    def fd(self, path: Path) -> int:
        with self._lock:
            if path not in self._fds:
                try:
                    self._fds[path] = os.open(path, os.O_RDONLY)
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
        t = torch.empty(info.shape, dtype=dtypes.to_torch(info.dtype))
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
    """The header bytes (length prefix included) of a shard holding `entries` in this order."""
    meta: dict[str, object] = {"__metadata__": {"format": "pt"}}
    off = 0
    for e in entries:
        meta[e.name] = {
            "dtype": e.dtype,
            "shape": list(e.shape),
            "data_offsets": [off, off + e.nbytes],
        }
        off += e.nbytes
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


# copy_file_range / sendfile cannot copy between these two files: copy another way
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_BOUNCE = 4 * 2**20


def _write_all(fd: int, data: bytes | memoryview) -> None:
    mv = memoryview(data)
    while mv:
        mv = mv[os.write(fd, mv) :]


class ShardWriter:
    """Writes one safetensors file sequentially under a temporary name, hashing as it goes.

    Bytes come from memory (`write`) or straight from a source file (`copy_from`, copied in the
    kernel: carried-over tensors never pass through this process's memory; `hash_written`
    then hashes them from the page cache). `finish()` checks every byte was written and
    renames into place; `abort()` removes the temporary file. The final name never holds a
    partial file.
    """

    def __init__(self, path: Path, entries: list[OutEntry]) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + TMP_SUFFIX)
        self.header = build_header(entries)
        self.total = len(self.header) + sum(e.nbytes for e in entries)
        self.sha = hashlib.sha256()
        self.written = 0
        self.error: OutputError | None = None
        self._copy = "copy_file_range"  # then "sendfile", then "bounce" if those cannot
        self._fd = -1
        try:  # read too: hash_written maps what was written
            self._fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            raise OutputError(f"{self.tmp}: cannot create ({e.strerror})") from None
        try:
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
        try:
            _write_all(self._fd, data)
        except OSError as e:
            raise self._failed(e) from None
        if hash_it:
            self.sha.update(data)
        self.written += len(data)

    def copy_from(self, src_fd: int, offset: int, nbytes: int, src_path: Path) -> None:
        """Append `nbytes` of `src_fd` from `offset`, copied in the kernel where it can be
        (not hashed: call `hash_written` for the same range, in order)."""
        if self.error is not None:
            raise self.error
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
        _hash_mapped(self.sha, self._fd, offset, nbytes)

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
        try:  # durable later: the converter fsyncs every file before the manifest
            os.close(self._fd)
            self._fd = -1
            os.replace(self.tmp, self.path)
        except OSError as e:
            self.abort()
            raise OutputError(
                f"{self.path}: cannot finish ({e.strerror}); check the disk"
            ) from None
        return self.sha.hexdigest(), self.total

    def abort(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        self.tmp.unlink(missing_ok=True)


def _hash_mapped(h: Any, fd: int, offset: int, nbytes: int) -> None:
    """Add bytes [offset, offset + nbytes) of `fd` to the hash `h`, from the page cache
    through `mmap` (no copy into this process)."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    with mmap.mmap(
        fd, offset + nbytes - start, flags=flags, prot=mmap.PROT_READ, offset=start
    ) as m:
        view = memoryview(m)
        try:
            h.update(view[offset - start :])
        finally:
            view.release()


def sha256_file(path: Path, window: int = 1 << 28) -> str:
    """SHA-256 of a file, hashed from the page cache a window at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for offset in range(0, size, window):
            _hash_mapped(h, f.fileno(), offset, min(window, size - offset))
    return h.hexdigest()

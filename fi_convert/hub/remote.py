"""A Hub repo at one commit, read by byte ranges: a conversion that never downloads a whole
source shard.

`mirror` writes a local folder that reads as the checkpoint: its small files (config,
tokenizer, index) downloaded, each safetensors shard a sparse file of its real size that
holds only its header (the filesystem stores no data blocks for the rest). The plan is made
from that folder as from any other, headers checked as strictly as ever. The shards' data
then comes through `RemoteSourceFiles`, which answers every read the converter makes with an
HTTP range request for exactly those bytes, straight into the converter's buffer. So the
source takes no disk at all, whatever its size, and each byte is fetched once.

A sparse shard must never be read as if it held data (its data reads as zeros): only
`RemoteSourceFiles` reads the mirror's shards, and it has no file descriptor to give out.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import dtypes, jsontext
from ..errors import HubError, SourceError
from ..format.names import INDEX_NAME
from ..st_io import SourceFiles, TensorInfo, _as_bytes
from ..version import __version__
from .common import (
    LIBRARY,
    brief,
    endpoint,
    http_message,
    hub_url,
    is_offline,
    progress_bars,
    transport_errors,
)
from .download import IGNORE_PATTERNS, download_errors

HEADER_LIMIT = 100_000_000  # the safetensors library's own limit on a header
RETRIES = 4
STUBS = 8  # small files and shard headers fetched at once (DeepSeek-V3: 163 shards)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)$")


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    sha256: str | None  # LFS files: the SHA-256 of their content, as the Hub records it


class RemoteRepo:
    """The files of `repo_id` at `commit`, and reads of their byte ranges."""

    def __init__(self, repo_id: str, commit: str, files: dict[str, RemoteFile]) -> None:
        self.repo_id, self.commit, self.files = repo_id, commit, files
        self.requests = 0  # range requests made (the tests count them)
        self.bytes_read = 0
        self._count = threading.Lock()  # reads run on several threads
        self._located: dict[str, str] = {}  # file -> its CDN address, once redirected there

    @classmethod
    def open(cls, repo_id: str, revision: str | None = None) -> RemoteRepo:
        """Resolve `revision` (default: the main branch) to its commit and list the files."""
        if is_offline():
            raise HubError(
                f"{repo_id}: HF_HUB_OFFLINE=1 forbids reading the Hub, and streaming a repo "
                "reads it; run without it, or download the repo and convert the folder"
            )
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        api = HfApi(endpoint=endpoint(), library_name=LIBRARY, library_version=__version__)
        with download_errors(repo_id, revision, False):
            commit = api.model_info(repo_id, revision=revision).sha
            assert commit is not None
            files = {
                f.path: RemoteFile(f.path, f.size, f.lfs.sha256 if f.lfs else None)
                for f in api.list_repo_tree(repo_id, revision=commit, recursive=True)
                if isinstance(f, RepoFile)
            }
        return cls(repo_id, commit, files)

    def url(self, name: str) -> str:
        from huggingface_hub import hf_hub_url

        return hf_hub_url(self.repo_id, name, revision=self.commit, endpoint=endpoint())

    def read_into(self, name: str, offset: int, dst: memoryview) -> None:
        """Fill `dst` with bytes [offset, offset + len(dst)) of file `name`, retrying a lost
        connection (a read is idempotent)."""
        if not len(dst):
            return
        for attempt in range(RETRIES + 1):
            try:
                self._get(name, offset, dst)
                return
            except transport_errors() as e:
                if attempt == RETRIES:
                    raise HubError(
                        f"{self.repo_id}: lost the connection while reading {name} from "
                        f"{hub_url(self.repo_id)} ({type(e).__name__}: {brief(e)}); check the "
                        "network, then run the same command again - it resumes"
                    ) from None
                time.sleep(min(8.0, 0.5 * 2**attempt))

    def _get(self, name: str, offset: int, dst: memoryview, fresh: bool = False) -> None:
        """One range request. The Hub answers a file's URL with a redirect to its CDN: the
        CDN address is kept per file, so later reads of it take one request, not two (an
        expired one is dropped and the file resolved again)."""
        from huggingface_hub.utils import build_hf_headers, get_session

        end = offset + len(dst) - 1
        where = self._located.get(name)
        url = where or self.url(name)
        headers = {"Range": f"bytes={offset}-{end}"}
        if where is None:  # the token goes to the Hub only, never to the CDN
            headers.update(build_hf_headers(library_name=LIBRARY, library_version=__version__))
        with self._count:
            self.requests += 1
        with get_session().stream("GET", url, headers=headers, follow_redirects=False) as r:
            if r.is_redirect and where is None:
                location = str(r.url.join(r.headers["location"]))
                r.read()
                self._located[name] = location
                return self._get(name, offset, dst, fresh=True)
            if r.status_code >= 400 and where is not None and not fresh:  # an expired one
                r.read()
                self._located.pop(name, None)
                return self._get(name, offset, dst)
            done = self._body(r, name, offset, end, dst)
        if done != len(dst):
            raise ConnectionError(f"{name}: {done} of {len(dst)} bytes arrived")
        with self._count:
            self.bytes_read += done

    def _body(self, r, name: str, offset: int, end: int, dst: memoryview) -> int:
        from huggingface_hub import errors as he
        from huggingface_hub.utils import hf_raise_for_status

        if r.status_code >= 400:
            r.read()
            try:
                hf_raise_for_status(r)
            except he.HfHubHTTPError as e:
                raise HubError(http_message(self.repo_id, e, "download")) from None
        got = _CONTENT_RANGE.match(r.headers.get("content-range", ""))
        whole = r.status_code == 200 and offset == 0
        if not whole and (got is None or (int(got[1]), int(got[2])) != (offset, end)):
            raise HubError(
                f"{self.repo_id}: the Hub answered a read of {name} bytes {offset}-{end} "
                f"with HTTP {r.status_code} {r.headers.get('content-range', '')!r}, not "
                "those bytes; run again later"
            )
        done = 0
        for chunk in r.iter_bytes():
            n = min(len(chunk), len(dst) - done)
            dst[done : done + n] = chunk[:n]
            done += n
            if done == len(dst):
                break
        return done

    def read(self, name: str, offset: int, n: int) -> bytes:
        buf = bytearray(n)
        self.read_into(name, offset, memoryview(buf))
        return bytes(buf)


def _ignored(name: str) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(name, p) for p in IGNORE_PATTERNS)


def mirror(repo: RemoteRepo, dest: Path, *, progress: bool = False) -> Path:
    """Write `dest`: the repo's small files as they are (what `download` would fetch), its
    safetensors shards as sparse files holding only their headers (see the module's
    docstring)."""
    from huggingface_hub import hf_hub_download

    dest.mkdir(parents=True, exist_ok=True)
    top = {n: f for n, f in repo.files.items() if "/" not in n and not _ignored(n)}
    small = [n for n in repo.files if not n.endswith(".safetensors") and not _ignored(n)]

    def fetch(name: str) -> None:
        got = hf_hub_download(
            repo.repo_id,
            name,
            revision=repo.commit,
            endpoint=endpoint(),
            library_name=LIBRARY,
            library_version=__version__,
        )
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(got, dest / name)

    pool = ThreadPoolExecutor(STUBS, thread_name_prefix="fi-convert-small")
    with progress_bars(progress), download_errors(repo.repo_id, repo.commit, False), pool:
        for done in [pool.submit(fetch, n) for n in small]:
            done.result()
    names = _shards(repo, dest, top)
    with ThreadPoolExecutor(STUBS, thread_name_prefix="fi-convert-header") as pool:
        for got in [pool.submit(_stub, repo, top[n], dest / n) for n in names]:
            got.result()  # the first failure, in the index's order
    return dest


def _shards(repo: RemoteRepo, dest: Path, top: dict[str, RemoteFile]) -> list[str]:
    """The shards a conversion reads: those the index names, or every top-level one."""

    index = dest / INDEX_NAME
    if not index.is_file():
        return sorted(n for n in top if n.endswith(".safetensors"))
    try:
        names = sorted(set(jsontext.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []  # the checkpoint reader reports the index
    missing = [n for n in names if isinstance(n, str) and n not in top]
    if missing:
        raise HubError(
            f"{repo.repo_id}: {INDEX_NAME} at commit {repo.commit[:12]} names {missing[0]}, "
            f"which the repo does not hold ({len(missing)} missing); the repo is incomplete - "
            "ask its owner, or pick a complete commit with --revision"
        )
    return [n for n in names if isinstance(n, str)]


def _stub(repo: RemoteRepo, f: RemoteFile, path: Path) -> None:
    """A sparse file of `f`'s size whose first bytes are its header."""
    if f.size < 8:
        raise SourceError(f"{repo.repo_id}/{f.name}: shorter than a safetensors header")
    n = int.from_bytes(repo.read(f.name, 0, 8), "little")
    if n > min(HEADER_LIMIT, f.size - 8):
        raise SourceError(
            f"{repo.repo_id}/{f.name}: header length {n} does not fit the file "
            f"({f.size} bytes); the file is corrupt"
        )
    head = repo.read(f.name, 0, 8 + n)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as out:
        out.write(head)
        out.truncate(f.size)  # the rest is a hole: no disk blocks
    os.replace(tmp, path)


class RemoteSourceFiles(SourceFiles):
    """Reads of the mirror's shards, answered from the Hub by range requests.

    A read the converter announces (`prefetch`: the next chunk of experts) is fetched in the
    background, so the link keeps busy while the current chunk is transformed and written;
    a carried-over tensor's next piece (`prefetch_bytes`) while this one is written. At most
    AHEAD reads wait in memory; one nobody takes is dropped (and read again if asked)."""

    local = False
    AHEAD = 6  # reads waiting in memory at most (and fetched at once)
    read_ahead = AHEAD - 2  # the next experts' reads asked while one is taken

    def __init__(self, repo: RemoteRepo, root: Path) -> None:
        super().__init__()
        self.repo, self.root = repo, root.resolve()
        self._pool = ThreadPoolExecutor(self.AHEAD, thread_name_prefix="fi-convert-fetch")
        self._ahead: dict[tuple[str, int, int], Future] = {}
        self.waited = 0  # reads not asked ahead, made while the converter waited
        self._lock = threading.Lock()

    def _name(self, path: Path) -> str:
        rel = Path(path).resolve().relative_to(self.root)
        return rel.as_posix()

    def fd(self, path: Path) -> int:
        raise SourceError(
            f"{path}: a streamed shard holds no data on disk; this read must go through "
            "RemoteSourceFiles (an fi-convert bug: please report it)"
        )

    def _ask(self, name: str, offset: int, n: int) -> None:
        f = self.repo.files.get(name)
        if n <= 0 or (f is not None and offset + n > f.size):
            return
        key = (name, offset, n)
        with self._lock:
            if key in self._ahead:
                return
            while len(self._ahead) >= self.AHEAD:  # the oldest nobody took
                self._ahead.pop(next(iter(self._ahead))).cancel()
            self._ahead[key] = self._pool.submit(self.repo.read, name, offset, n)

    def _fill(self, name: str, offset: int, dst: torch.Tensor) -> None:
        mv = _as_bytes(dst)
        with self._lock:
            got = self._ahead.pop((name, offset, len(mv)), None)
        data = None
        if got is not None:
            try:
                data = got.result()
            except Exception:  # fetched again below, its error reported from here
                data = None
        if data is None:
            self.waited += 1
            self.repo.read_into(name, offset, mv)
        else:
            mv[:] = data

    def read_rows(self, info: TensorInfo, start: int, stop: int, dst: torch.Tensor) -> None:
        want = (stop - start) * info.row_bytes
        if dst.numel() * dst.element_size() != want:
            raise ValueError(f"{info.name}: buffer of wrong size for rows {start}:{stop}")
        self._fill(self._name(info.file), info.start + start * info.row_bytes, dst)

    def read_bytes(self, path: Path, offset: int, dst: torch.Tensor) -> None:
        self._fill(self._name(path), offset, dst)

    def prefetch_bytes(self, path: Path, offset: int, nbytes: int) -> None:
        self._ask(self._name(path), offset, nbytes)

    def prefetch(self, info: TensorInfo, start: int, count: int) -> None:
        offset = info.start + start * info.row_bytes
        self._ask(self._name(info.file), offset, count * info.row_bytes)

    def read(self, info: TensorInfo) -> torch.Tensor:
        t = torch.empty(info.shape, dtype=dtypes.to_torch(info.dtype), device="cpu")
        self._fill(self._name(info.file), info.start, t)
        return t

    def close(self) -> None:
        with self._lock:
            for f in self._ahead.values():
                f.cancel()
            self._ahead.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)


class RoutedFiles(SourceFiles):
    """Reads of files under several roots, each through its own reader (the output's mirror
    and the source's, for a remote verify); anything else is read from local files."""

    def __init__(self, routes: list[tuple[Path, SourceFiles]]) -> None:
        super().__init__()
        self.routes = [(root.resolve(), files) for root, files in routes]
        self.fallback = SourceFiles()
        self.local = False
        self.read_ahead = max(files.read_ahead for _, files in routes)

    def _for(self, path: Path) -> SourceFiles:
        p = Path(path).resolve()
        for root, files in self.routes:
            if p.is_relative_to(root):
                return files
        return self.fallback

    def fd(self, path: Path) -> int:
        return self._for(path).fd(path)

    def read_rows(self, info: TensorInfo, start: int, stop: int, dst: torch.Tensor) -> None:
        self._for(info.file).read_rows(info, start, stop, dst)

    def read_bytes(self, path: Path, offset: int, dst: torch.Tensor) -> None:
        self._for(path).read_bytes(path, offset, dst)

    def prefetch(self, info: TensorInfo, start: int, count: int) -> None:
        self._for(info.file).prefetch(info, start, count)

    def prefetch_bytes(self, path: Path, offset: int, nbytes: int) -> None:
        self._for(path).prefetch_bytes(path, offset, nbytes)

    def read(self, info: TensorInfo) -> torch.Tensor:
        return self._for(info.file).read(info)

    def close(self) -> None:
        self.fallback.close()
        for _, files in self.routes:
            files.close()

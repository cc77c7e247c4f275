"""A Hub repo id as the source: resolve it and download what a conversion reads into the
Hugging Face cache (or take it from there when offline).

Downloads take only what a conversion reads: the safetensors shards the index names (or the
top-level `*.safetensors` without an index) and the small files beside them; never pickles
(`*.bin`, `*.pt`, ...), other weight formats, or `original/`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import jsontext
from ..errors import HubError, SourceError
from ..format.names import INDEX_NAME
from ..paths import model_exists
from ..version import __version__
from .common import (
    LIBRARY,
    brief,
    cache_dir,
    endpoint,
    http_message,
    hub_url,
    is_offline,
    is_repo_id,
    literal,
    progress_bars,
    transport_errors,
)

# Never downloaded: pickles and other weight formats fi-convert does not read, and the
# `original/` folder some repos keep (consolidated checkpoints for other runtimes).
IGNORE_PATTERNS = [
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.pkl",
    "*.pickle",
    "*.h5",
    "*.msgpack",
    "*.onnx",
    "*.onnx_data",
    "*.gguf",
    "*.tflite",
    "*.ot",
    "*.npz",
    "*.npy",
    "original/*",
    ".gitattributes",
]


@dataclass
class Source:
    """Where a conversion reads from: a local folder, or a Hub repo's snapshot in the cache."""

    path: Path
    repo_id: str | None = None
    revision: str | None = None  # as asked (--revision); None: the default branch
    commit: str | None = None  # the commit the snapshot holds

    def summary(self) -> dict:
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit}


BytesFn = Callable[[int, int], None]  # (bytes done, bytes total so far)


def resolve_source(
    source: str | Path, *, revision: str | None = None, progress: bool | BytesFn | None = False
) -> Source:
    """A local folder as it is; a repo id (`org/name`, where no such local path exists) is
    downloaded into the Hugging Face cache first (or taken from it when offline)."""
    if is_local(source, revision):
        return Source(Path(source))
    return download(str(source), revision=revision, progress=progress)


def is_local(source: str | Path, revision: str | None = None) -> bool:
    """Whether `source` is a local model folder (else it is a Hub repo id); a SourceError when
    it is neither, or when a local folder is given a `revision`."""
    if model_exists(Path(source)):
        if revision is not None:
            raise SourceError(
                f"{source}: a local folder, and --revision applies only to a Hub repo id; "
                "drop --revision, or pass the repo id (org/name)"
            )
        return True
    if not is_repo_id(str(source)):
        raise SourceError(
            f"{source}: no such folder, and not a Hub repo id (org/name); pass a local model "
            "folder or a repo id"
        )
    return False


def download(
    repo_id: str, *, revision: str | None = None, progress: bool | BytesFn | None = False
) -> Source:
    """Download (or find in the cache) what converting `repo_id` needs; the snapshot folder.

    `progress`: True shows huggingface_hub's own bars; a function is called with the shards'
    bytes done and total instead, with huggingface_hub's (and hf_xet's) bars off, so that the
    caller's display is the only one."""
    offline = is_offline()
    kw: dict = {
        "repo_id": repo_id,
        "repo_type": "model",
        "endpoint": endpoint(),
        "local_files_only": offline,
        "library_name": LIBRARY,
        "library_version": __version__,
    }
    from huggingface_hub import snapshot_download

    report = progress if callable(progress) else None
    with progress_bars(progress is True), download_errors(repo_id, revision, offline):
        # 1. the small files (config, tokenizer, index, ...): no weights at all
        snap = Path(
            snapshot_download(
                revision=revision, ignore_patterns=[*IGNORE_PATTERNS, "*.safetensors"], **kw
            )
        )
        commit = snap.name
        # 2. the shards: those the index names, or the top-level ones without an index
        names = _index_shards(snap / INDEX_NAME)
        if names is None:
            allow, ignore = ["*.safetensors"], [*IGNORE_PATTERNS, "*/*"]
        else:
            allow, ignore = [literal(n) for n in names], IGNORE_PATTERNS
        if allow:
            snap = Path(
                snapshot_download(
                    revision=commit,
                    allow_patterns=allow,
                    ignore_patterns=ignore,
                    tqdm_class=_reporter(report) if report else None,
                    **kw,
                )
            )
    missing = [n for n in names or [] if not (snap / n).exists()]
    if missing:
        raise HubError(
            f"{repo_id}: {INDEX_NAME} at commit {commit[:12]} names {missing[0]}, which the "
            f"repo does not hold ({len(missing)} missing); the repo is incomplete - ask its "
            "owner, or pick a complete commit with --revision"
        )
    return Source(snap, repo_id, revision, commit)


def _reporter(report: BytesFn) -> type:
    """A tqdm class for snapshot_download that shows nothing and hands the download's bytes
    to `report`. snapshot_download makes one such bar for the bytes written ("Reconstructing
    ..."; its total grows as each file starts), one for the network bytes and one counting
    files; only the first is reported (files already in the cache are not counted)."""
    from tqdm import tqdm

    lock = threading.Lock()

    class Reporter(tqdm):
        def __init__(self, *args, **kwargs) -> None:
            self.what = str(kwargs.get("desc") or "")
            self.count = int(kwargs.get("initial") or 0)
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if self.what.startswith("Reconstructing"):
                with lock:
                    self.count += int(n or 0)
                    report(self.count, max(self.count, int(self.total or 0)))
            return None

    return Reporter


def _index_shards(index: Path) -> list[str] | None:
    """Shard names of the index, or None without an index (an unreadable index gives []: the
    checkpoint reader reports it)."""
    if not index.is_file():
        return None
    try:
        wm = jsontext.loads(index.read_text()).get("weight_map")
        names = sorted({v for v in wm.values() if isinstance(v, str)})
    except (OSError, ValueError, AttributeError):
        return []
    # names that leave the folder are refused by the checkpoint reader; never fetch them
    return [n for n in names if "/" not in n and "\\" not in n and n not in (".", "..")]


def _offline_fix(repo_id: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return f"run without HF_HUB_OFFLINE, or `hf download {repo_id}{rev}` first"


def _not_cached(repo_id: str, revision: str | None, cache: str) -> str:
    return (
        f"{repo_id}: no such local folder, and not in the Hugging Face cache ({cache}), "
        f"which HF_HUB_OFFLINE=1 keeps to; {_offline_fix(repo_id, revision)}"
    )


@contextmanager
def download_errors(
    repo_id: str, revision: str | None, offline: bool, cache: str | None = None
) -> Iterator[None]:
    """huggingface_hub's and the network's errors as one-line HubErrors naming `repo_id` and
    the fix; `cache`: the cache folder the download goes to (None: the user's)."""
    from huggingface_hub import errors as he

    incomplete = getattr(he, "IncompleteSnapshotError", None)
    cache = cache or cache_dir()
    try:
        yield
    except he.OfflineModeIsEnabled:
        raise HubError(_not_cached(repo_id, revision, cache)) from None
    except he.GatedRepoError:
        raise HubError(
            f"{repo_id}: a gated repo; accept its conditions at {hub_url(repo_id)} and log in "
            "with an account that has access (`hf auth login` or HF_TOKEN)"
        ) from None
    except he.RepositoryNotFoundError:
        raise HubError(
            f"{repo_id}: no such local folder, and no such model repo on the Hub (or it is "
            "private and your token cannot read it); check the name, or log in "
            "(`hf auth login` or HF_TOKEN)"
        ) from None
    except he.RevisionNotFoundError:
        raise HubError(
            f"{repo_id}: no revision {revision!r}; pass an existing branch, tag or commit "
            "with --revision"
        ) from None
    except he.LocalEntryNotFoundError as e:
        if offline and incomplete is not None and isinstance(e, incomplete):
            raise HubError(
                f"{repo_id}: the cached copy in {cache} is incomplete and HF_HUB_OFFLINE=1 "
                f"forbids downloading the rest; {_offline_fix(repo_id, revision)}"
            ) from None
        if offline:
            raise HubError(_not_cached(repo_id, revision, cache)) from None
        raise HubError(
            f"{repo_id}: no such local folder, and cannot reach the Hub at {hub_url(repo_id)} "
            f"({brief(e)}) to download it; check the network and proxy (or the path), then "
            "run again"
        ) from None
    except he.HfHubHTTPError as e:
        raise HubError(http_message(repo_id, e, "download")) from None
    except he.HFValidationError as e:
        raise HubError(f"{repo_id}: not a valid Hub repo id ({brief(e)})") from None
    except transport_errors() as e:
        raise HubError(
            f"{repo_id}: cannot reach the Hub at {hub_url(repo_id)} ({type(e).__name__}: "
            f"{brief(e)}); check the network and proxy, then run again - the files already "
            "downloaded stay in the cache"
        ) from None
    except OSError as e:
        raise HubError(
            f"{repo_id}: cannot store the download in {cache} ({e.strerror or brief(e)}); "
            "free disk space or point HF_HUB_CACHE elsewhere, then run again"
        ) from None

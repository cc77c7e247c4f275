"""What `fi-convert MODEL OUT` does, for a Python caller: the two ways to convert a model
whose source or target may be on the Hub.

- `convert_source`: a local folder, or a Hub repo id downloaded into the cache, converted into
  a folder (plan, provenance, the checks before any long work, the conversion), then
  optionally published (`push`);
- `stream_source`: a source converted straight into a Hub repo shard by shard within a disk
  budget (`stream`); a Hub source is read by byte ranges, never downloaded.

A `Listener` follows a run: it hears where the source is and the plan, gives the progress
callbacks of the long steps and runs the blocking network calls (the command line runs them
on a thread of their own, so that Ctrl-C stops at once). Without one, nothing is shown.

Like the rest of the Hub package, this module loads torch only once a function runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import FiConvertError
from .download import BytesFn, Source, is_local, resolve_source
from .preflight import check_target
from .push import PushResult, push

if TYPE_CHECKING:
    from ..pipeline import ProgressFn, Result
    from ..plan import Options, Plan
    from .stream import StreamResult

T = TypeVar("T")


class Listener(Protocol):
    """What a caller hears of a run of `convert_source` or `stream_source`."""

    def source(self, repo_id: str, commit: str | None, path: Path | None) -> None:
        """A Hub source was found: downloaded into `path`, or (None) read by byte ranges."""

    def planned(self, plan: Plan) -> None:
        """The plan is made and checked; no long work has started."""

    def downloading(self) -> contextlib.AbstractContextManager[BytesFn | None]:
        """The download of a Hub source: the (done, total) bytes callback, or None."""
        ...

    def converting(self) -> contextlib.AbstractContextManager[ProgressFn | None]:
        """The conversion: the pipeline's progress callback, or None."""
        ...

    def pushing(self, base_model: str | None) -> contextlib.AbstractContextManager[bool]:
        """The push after a conversion: whether huggingface_hub shows its own bars."""
        ...

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)`: a blocking network call (a download, an upload)."""
        ...


class Silent:
    """The listener of a caller that passes none: shows nothing."""

    def source(self, repo_id: str, commit: str | None, path: Path | None) -> None:
        pass

    def planned(self, plan: Plan) -> None:
        pass

    @contextlib.contextmanager
    def downloading(self) -> Iterator[BytesFn | None]:
        yield None

    @contextlib.contextmanager
    def converting(self) -> Iterator[ProgressFn | None]:
        yield None

    @contextlib.contextmanager
    def pushing(self, base_model: str | None) -> Iterator[bool]:
        yield False

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return fn(*args, **kwargs)


@dataclass
class Conversion:
    """What `convert_source` did: where the source came from, the plan, and (unless it was a
    dry run) the conversion's result and, with `push_to`, the push's."""

    source: Source
    plan: Plan
    result: Result | None = None
    pushed: PushResult | None = None


def convert_source(
    source: str | Path,
    out_dir: str | Path,
    options: Options | None = None,
    *,
    revision: str | None = None,
    push_to: str | None = None,
    private: bool = False,
    base_model: str | None = None,
    device: str = "auto",
    overwrite: bool = False,
    dry_run: bool = False,
    jobs: int = 0,
    fsync: bool = True,
    listener: Listener | None = None,
) -> Conversion:
    """Convert `source` (a model folder, or a Hub repo id at `revision`, downloaded into the
    cache) into `out_dir`, then publish it to `push_to` with a model card naming `base_model`
    (default: a repo-id source). `dry_run`: plan only. The target repo is checked first, and
    the plan before anything is written (see `pipeline.convert` for the other arguments)."""
    from .. import manifest
    from ..pipeline import preflight, run_plan
    from ..plan import Options, make_plan

    ear = listener or Silent()
    out = Path(out_dir)
    if push_to:  # fail in seconds, not after the conversion
        check_target(push_to)
    with ear.downloading() as progress:
        src = ear.call(resolve_source, source, revision=revision, progress=progress)
    if src.repo_id:
        ear.source(src.repo_id, src.commit, src.path)
    plan = make_plan(src.path, options or Options())
    plan.provenance = manifest.provenance(src.repo_id, src.commit, plan)
    if not dry_run:
        preflight(plan, out, device=device, overwrite=overwrite)
    ear.planned(plan)
    if dry_run:
        return Conversion(src, plan)
    with ear.converting() as progress:
        res = run_plan(
            plan, out, device=device, overwrite=overwrite, progress=progress, jobs=jobs, fsync=fsync
        )
    done = Conversion(src, plan, res)
    if push_to:
        base = base_model or src.repo_id
        done.pushed = _push_converted(out, push_to, private, base, src.commit, ear)
    return done


def _push_converted(
    out_dir: Path,
    repo_id: str,
    private: bool,
    base_model: str | None,
    base_revision: str | None,
    ear: Listener,
) -> PushResult:
    """`push` after a conversion; its error says that the conversion itself is complete."""
    with ear.pushing(base_model) as bars:
        try:
            return ear.call(
                push,
                out_dir,
                repo_id,
                private=private,
                base_model=base_model,
                base_revision=base_revision,
                progress=bars,
            )
        except FiConvertError as e:
            raise type(e)(
                f"{e} (the conversion in {out_dir} is complete: `fi-convert push {out_dir} "
                f"{repo_id}` publishes it)"
            ) from None


@dataclass
class Streamed:
    """What `stream_source` did: the plan, its summary (taken while the staging folder, a Hub
    source's mirror included, was there) and the stream's result."""

    plan: Plan
    summary: dict
    result: StreamResult


def stream_source(
    source: str | Path,
    staging_dir: str | Path,
    repo_id: str,
    options: Options | None = None,
    *,
    revision: str | None = None,
    private: bool = False,
    base_model: str | None = None,
    max_disk: int = 0,
    device: str = "auto",
    jobs: int = 0,
    part: tuple[int, int] | None = None,
    listener: Listener | None = None,
) -> Streamed:
    """Convert `source` (a model folder, or a Hub repo id at `revision`, read by byte ranges)
    shard by shard into the Hub repo `repo_id` (`stream.stream_to_hub`), staging at most
    `max_disk` bytes (0: `stream.DEFAULT_MAX_DISK`) in `staging_dir`. `part` (K, N): only part
    K of N of the shards."""
    from .. import manifest
    from ..plan import Options, make_plan
    from ..st_io import SourceFiles
    from . import remote, stream

    ear = listener or Silent()
    check_target(repo_id)
    local = is_local(source, revision)
    source_repo = commit = staging = None
    try:
        if local:
            root, files = Path(source), SourceFiles()
        else:
            repo = remote.RemoteRepo.open(str(source), revision)
            source_repo, commit = repo.repo_id, repo.commit
            ear.source(source_repo, commit, None)
            staging = stream.Staging.claim(Path(staging_dir), SourceFiles())
            # small files and shard headers only: huggingface_hub's bars stay off
            root = remote.mirror(repo, staging.root / ".source", progress=False)
            files = remote.RemoteSourceFiles(repo, root)
        plan = make_plan(root, options or Options())
        plan.provenance = manifest.provenance(source_repo, commit, plan)
        ear.planned(plan)
        summary = plan.summary()  # before the staging folder, the mirror in it included, goes
        with ear.converting() as progress:
            res = stream.stream_to_hub(
                plan,
                files,
                Path(staging_dir),
                repo_id,
                private=private,
                max_disk=max_disk or stream.DEFAULT_MAX_DISK,
                device=device,
                jobs=jobs,
                base_model=base_model or source_repo,
                base_revision=commit,
                progress=progress,
                part=part,
                staging=staging,
            )
    finally:
        if staging is not None:  # let go of it, whatever happened (a failed run's stays)
            staging.release()
    return Streamed(plan, summary, res)

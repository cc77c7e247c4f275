"""Publishing an output to a Hub repo, as `push` (a finished folder) and `stream` (shard by
shard) both do it: the target repo opened (created when missing, its branch too), the files
it holds, the model card and the manifest made for the upload, the files an older output left
there, and the last commit, which adds the card and the manifest so that a repo with a
manifest is a complete one; the errors of all of it as one-line `HubError`s."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import HubError
from ..format.names import MANIFEST_NAME
from ..version import __version__
from .card import CARD_NAME, model_card, upload_manifest
from .common import LIBRARY, brief, cause, endpoint, http_message, hub_url, transport_errors


@dataclass(frozen=True)
class RemoteFile:
    """A file the target holds: its git blob id, and its SHA-256 where it is an LFS file."""

    blob_id: str
    lfs_sha256: str | None


@dataclass
class TargetRepo:
    """The Hub repo an output goes to, at `revision`."""

    api: Any  # huggingface_hub.HfApi
    repo_id: str
    revision: str
    url: str

    @classmethod
    def open(cls, repo_id: str, *, private: bool, revision: str) -> TargetRepo:
        """The repo, created when missing (`private` applies to a new one only), and its
        branch `revision`, created when missing."""
        from huggingface_hub import HfApi

        api = HfApi(endpoint=endpoint(), library_name=LIBRARY, library_version=__version__)
        url = str(api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model"))
        if revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        return cls(api, repo_id, revision, url)

    def files(self) -> dict[str, RemoteFile]:
        """Every file of the repo at `revision`, by path."""
        from huggingface_hub.hf_api import RepoFile

        return {
            f.path: RemoteFile(f.blob_id, f.lfs.sha256 if f.lfs else None)
            for f in self.api.list_repo_tree(
                self.repo_id, revision=self.revision, repo_type="model", recursive=True
            )
            if isinstance(f, RepoFile)
        }

    def commit(self, operations: list, message: str):
        """One commit of `operations` on `revision`; huggingface_hub's `CommitInfo`."""
        return self.api.create_commit(
            repo_id=self.repo_id,
            repo_type="model",
            revision=self.revision,
            operations=operations,
            commit_message=message,
        )


def describe(m: dict) -> str:
    """The output of manifest `m` in a commit message: `bf16 (trtllm, TP 1)`."""
    return f"{m['scheme']} ({m['backend']}, TP {m['tp_size']})"


def card_and_manifest(
    m: dict,
    repo_id: str,
    *,
    base_model: str | None,
    base_revision: str | None,
    source_card: str | None,
) -> tuple[bytes, bytes]:
    """The model card of manifest `m` for `repo_id` (over the source's card, `source_card`)
    and the manifest as uploaded, which lists that card as README.md."""
    card = model_card(
        m,
        repo_id=repo_id,
        base_model=base_model,
        base_revision=base_revision,
        source_card=source_card,
    ).encode()
    return card, upload_manifest(m, card)


def stale_files(
    held: Iterable[str], keep: Collection[str], *, shards_only: bool = False
) -> list[str]:
    """The files an older output left on the target (`held`) that the new one (`keep`) does
    not have, sorted: every one but the hidden ones, which are the repo's own (`.gitattributes`,
    fi-convert's progress records); with `shards_only` (a push of a folder, which leaves a
    repo's other files alone), the `.safetensors` files only."""
    if shards_only:
        return sorted(p for p in held if p.endswith(".safetensors") and p not in keep)
    return sorted(p for p in held if p not in keep and not _hidden(p))


def _hidden(path: str) -> bool:
    return any(part.startswith(".") for part in path.split("/"))


def last_operations(
    card: bytes,
    manifest: bytes,
    *,
    record: tuple[str, bytes] | None = None,
    unchanged: Collection[str] = (),
) -> list:
    """The operations that end a publication: the model card, the run's progress `record`
    (path, bytes) where there is one, and the manifest, last; the files named in `unchanged`
    (which the target holds as they are) left out."""
    from huggingface_hub import CommitOperationAdd

    files = [(CARD_NAME, card), *([record] if record else []), (MANIFEST_NAME, manifest)]
    return [CommitOperationAdd(path, data) for path, data in files if path not in unchanged]


def commit_last(repo: TargetRepo, m: dict, operations: list, *, index: bool = False):
    """The last commit of the output of manifest `m`: `operations`, which add the manifest
    and the model card (and the index, with `index`) after whatever else must land with
    them. huggingface_hub's `CommitInfo`."""
    what = "manifest, index and model card" if index else "manifest and model card"
    return repo.commit(operations, f"Add the fi-convert {what} ({describe(m)})")


@contextmanager
def upload_errors(repo_id: str) -> Iterator[None]:
    """huggingface_hub's and the HTTP client's errors while publishing to `repo_id`, as
    one-line `HubError`s that name the fix."""
    from huggingface_hub import errors as he

    try:
        yield
    except Exception as exc:
        e = cause(exc)
        if isinstance(e, he.RepositoryNotFoundError):
            raise HubError(
                f"{repo_id}: the Hub has no such repo for this token and would not create it; "
                "check the name and use a token with write access to its namespace "
                "(`hf auth login` or HF_TOKEN)"
            ) from None
        if isinstance(e, he.RevisionNotFoundError):
            raise HubError(
                f"{repo_id}: no such branch and it could not be created; push to an existing "
                "branch with --revision"
            ) from None
        if isinstance(e, he.HfHubHTTPError):
            raise HubError(http_message(repo_id, e, "upload")) from None
        if isinstance(e, transport_errors()):
            raise HubError(
                f"{repo_id}: lost the connection to the Hub at {hub_url(repo_id)} "
                f"({type(e).__name__}: {brief(e)}); run the same push again - it resumes, "
                "skipping what is already uploaded"
            ) from None
        if isinstance(e, ValueError):
            raise HubError(f"{repo_id}: the Hub refused the upload ({brief(e)})") from None
        raise

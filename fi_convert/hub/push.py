"""Publishing a finished output folder: exactly the files the manifest lists, then, in a last
commit, the model card (README.md) and the manifest, so that a repo with a manifest is a
complete one, as on disk."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..errors import HubError, OutputError
from ..format import manifest as mf
from ..format.names import MANIFEST_NAME
from .card import CARD_NAME, model_card, upload_manifest
from .common import (
    LIBRARY,
    brief,
    cause,
    endpoint,
    http_message,
    hub_url,
    is_repo_id,
    progress_bars,
    transport_errors,
)
from .preflight import check_target


@dataclass
class PushResult:
    repo_id: str
    revision: str
    url: str
    commit: str | None  # None: the target held every file already (nothing was committed)
    files: int  # the files the target now holds for this output
    base_model: str | None
    uploaded: int = 0  # files sent by this push (the rest the target held with that hash)

    @property
    def up_to_date(self) -> bool:
        return self.commit is None

    def summary(self) -> dict:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "url": self.url,
            "commit": self.commit,
            "files": self.files,
            "uploaded_files": self.uploaded,
            "up_to_date": self.up_to_date,
            "base_model": self.base_model,
        }


def check_out_dir(out_dir: str | Path) -> dict:
    """The manifest of a finished output that `verify` accepts (files, index, shapes)."""
    from ..verify import verify  # verify imports the converter; keep hub light to import

    m = mf.read(out_dir)
    problems = verify(out_dir).problems
    if problems:
        raise OutputError(
            f"{out_dir}: {len(problems)} file(s) do not match {MANIFEST_NAME} (first: "
            f"{problems[0]}); not pushing - run `fi-convert verify {out_dir}` and convert again"
        )
    return m


def push(
    out_dir: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str = "main",
    base_model: str | None = None,
    base_revision: str | None = None,
    progress: bool = False,
) -> PushResult:
    """Publish a finished output folder to the Hub repo `repo_id` (created when missing).

    Refuses a folder without a manifest or one that `verify` fails (files against their
    SHA-256s, the index, the manifest's shapes). That check is the one pass over the bytes:
    the upload uses the SHA-256s it proved (the manifest's), so nothing is hashed again.
    Uploads the files the manifest lists that the target does not hold with that hash
    (resumable: run it again after an interruption and what is already there is skipped),
    then, in a last commit, the model card and the manifest. The uploaded manifest lists the
    card as README.md (in place of a README.md carried over from the source), so
    `fi-convert verify` passes on a download of the repo; the local folder is not changed.
    A push of what the target holds already commits nothing.
    """
    root = Path(out_dir)
    mf.read(root)  # a finished output at all: refused before any request
    check_target(repo_id)  # a repo id, online, a token that may write there: in seconds
    m = check_out_dir(root)  # then every byte against the manifest
    src = m.get("source", {})
    if base_model is None and src.get("repo_id"):  # converted from a Hub repo: that one
        base_model, base_revision = src["repo_id"], base_revision or src.get("revision")
    if base_model is not None and not is_repo_id(base_model):
        raise HubError(f"--base-model {base_model}: not a Hub repo id (org/name)")
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.utils.sha import git_hash

    source_card = root / CARD_NAME if CARD_NAME in m["files"] else None
    card = model_card(
        m,
        repo_id=repo_id,
        base_model=base_model,
        base_revision=base_revision,
        source_card=source_card.read_text(errors="replace") if source_card else None,
    ).encode()
    manifest = upload_manifest(m, card)
    names = [n for n in m["files"] if n not in (MANIFEST_NAME, CARD_NAME)]
    api = HfApi(endpoint=endpoint(), library_name=LIBRARY, library_version=__version__)
    with progress_bars(progress), push_errors(repo_id):
        url = str(api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model"))
        if revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        remote = _remote_top_level(api, repo_id, revision)
        adds = []
        for name in names:
            if not _held(remote.get(name), root / name, m["files"][name]["sha256"]):
                op = CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(root / name))
                op.upload_info.sha256 = bytes.fromhex(m["files"][name]["sha256"])  # proved
                adds.append(op)
        # a manifest from an earlier push goes in the same commit: it must not vouch for a
        # half-new repo
        stale = [p for p in remote if p.endswith(".safetensors") and p not in m["files"]]
        if MANIFEST_NAME in remote and remote[MANIFEST_NAME][0] != git_hash(manifest):
            stale.append(MANIFEST_NAME)
        what = f"{m['scheme']} ({m['backend']}, TP {m['tp_size']})"
        if adds or stale:
            api.create_commit(
                repo_id=repo_id,
                repo_type="model",
                revision=revision,
                operations=[*adds, *(CommitOperationDelete(p) for p in sorted(stale))],
                commit_message=f"Upload {what} weights, converted by fi-convert "
                f"{m['fi_convert_version']}",
            )
        last = [
            CommitOperationAdd(path_in_repo=name, path_or_fileobj=data)
            for name, data in ((CARD_NAME, card), (MANIFEST_NAME, manifest))
            if remote.get(name, ("",))[0] != git_hash(data) or name in stale
        ]
        commit = None
        if adds or stale or last:
            info = api.create_commit(
                repo_id=repo_id,
                repo_type="model",
                revision=revision,
                operations=last,
                commit_message=f"Add the fi-convert manifest and model card ({what})",
            )
            commit = info.oid
    uploaded = len(adds) + len(last)
    return PushResult(repo_id, revision, url, commit, len(names) + 2, base_model, uploaded)


def _held(remote: tuple[str, str | None] | None, path: Path, sha256: str) -> bool:
    """Whether the target holds the file `path` (of SHA-256 `sha256`) already: an LFS file
    by its SHA-256, a small one by its git blob id."""
    if remote is None:
        return False
    blob, lfs = remote
    if lfs is not None:
        return lfs == sha256
    from huggingface_hub.utils.sha import git_hash

    return path.stat().st_size < 10 << 20 and blob == git_hash(path.read_bytes())


def _remote_top_level(api, repo_id: str, revision: str) -> dict[str, tuple[str, str | None]]:
    """Top-level files of the repo at `revision`: path -> (git blob id, LFS SHA-256)."""
    from huggingface_hub.hf_api import RepoFile

    return {
        f.path: (f.blob_id, f.lfs.sha256 if f.lfs else None)
        for f in api.list_repo_tree(repo_id, revision=revision, repo_type="model", recursive=True)
        if isinstance(f, RepoFile)
    }


@contextmanager
def push_errors(repo_id: str) -> Iterator[None]:
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

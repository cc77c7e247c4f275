"""Publishing a finished output folder: exactly the files the manifest lists, then, in a last
commit, the model card (README.md) and the manifest, so that a repo with a manifest is a
complete one, as on disk."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import HubError, OutputError
from ..format import manifest as mf
from ..format.names import MANIFEST_NAME
from .card import CARD_NAME
from .common import is_repo_id, progress_bars
from .preflight import check_target
from .publish import (
    RemoteFile,
    TargetRepo,
    card_and_manifest,
    commit_last,
    describe,
    last_operations,
    stale_files,
    upload_errors,
)


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
    from huggingface_hub import CommitOperationDelete
    from huggingface_hub.utils.sha import git_hash

    source_card = root / CARD_NAME if CARD_NAME in m["files"] else None
    card, manifest = card_and_manifest(
        m,
        repo_id,
        base_model=base_model,
        base_revision=base_revision,
        source_card=source_card.read_text(errors="replace") if source_card else None,
    )
    names = [n for n in m["files"] if n not in (MANIFEST_NAME, CARD_NAME)]
    with progress_bars(progress), upload_errors(repo_id):
        repo = TargetRepo.open(repo_id, private=private, revision=revision)
        remote = repo.files()
        adds = _additions(root, m, names, remote)
        # a manifest from an earlier push goes in the same commit: it must not vouch for a
        # half-new repo
        stale = stale_files(remote, m["files"], shards_only=True)
        if MANIFEST_NAME in remote and remote[MANIFEST_NAME].blob_id != git_hash(manifest):
            stale = sorted([*stale, MANIFEST_NAME])
        if adds or stale:
            repo.commit(
                [*adds, *(CommitOperationDelete(p) for p in stale)],
                f"Upload {describe(m)} weights, converted by fi-convert {m['fi_convert_version']}",
            )
        unchanged = [
            name
            for name, data in ((CARD_NAME, card), (MANIFEST_NAME, manifest))
            if name in remote and remote[name].blob_id == git_hash(data) and name not in stale
        ]
        last = last_operations(card, manifest, unchanged=unchanged)
        commit = None
        if adds or stale or last:
            commit = commit_last(repo, m, last).oid
    uploaded = len(adds) + len(last)
    return PushResult(repo_id, revision, repo.url, commit, len(names) + 2, base_model, uploaded)


def _additions(root: Path, m: dict, names: list[str], remote: dict[str, RemoteFile]) -> list:
    """The files `names` of the folder `root` (manifest `m`) that the target lacks, to add:
    each with the SHA-256 that verify proved, so that huggingface_hub hashes none again."""
    from huggingface_hub import CommitOperationAdd

    adds = []
    for name in names:
        if not _held(remote.get(name), root / name, m["files"][name]["sha256"]):
            op = CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(root / name))
            op.upload_info.sha256 = bytes.fromhex(m["files"][name]["sha256"])  # proved
            adds.append(op)
    return adds


def _held(remote: RemoteFile | None, path: Path, sha256: str) -> bool:
    """Whether the target holds the file `path` (of SHA-256 `sha256`) already: an LFS file
    by its SHA-256, a small one by its git blob id."""
    if remote is None:
        return False
    if remote.lfs_sha256 is not None:
        return remote.lfs_sha256 == sha256
    from huggingface_hub.utils.sha import git_hash

    return path.stat().st_size < 10 << 20 and remote.blob_id == git_hash(path.read_bytes())

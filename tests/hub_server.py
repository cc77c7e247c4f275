"""A small Hugging Face Hub look-alike on loopback, for the tests of `fi_convert.hub`.

It implements only what the installed huggingface_hub (2.4) calls for a model repo, found by
reading its source, and answers as the Hub does:

- model info `GET /api/models/{repo}[/revision/{rev}]`, tree `GET /api/models/{repo}/tree/{rev}`
  (snapshot_download, upload_folder's deletions, fi_convert's listing);
- `HEAD`/`GET /{repo}/resolve/{rev}/{path}` with `ETag`, `X-Repo-Commit`, `Content-Length`; for
  LFS files a 302 to a "CDN" with `X-Linked-Etag` / `X-Linked-Size`, as the Hub does. The CDN
  is this server under the name `localhost` (the API is `127.0.0.1`): another origin, so the
  client treats it as the Hub's CDN (does not follow the HEAD redirect, drops the token);
- `POST /api/repos/create`, `POST /api/models/{repo}/branch/{branch}`, `POST /api/validate-yaml`;
- `POST /api/models/{repo}/preupload/{rev}` (upload modes and the remote oids that let a rerun
  skip unchanged files), `POST /{repo}.git/info/lfs/objects/batch` (no upload action for an
  object already stored: how a rerun skips uploaded files), the "S3" upload `PUT
  /lfs-upload/{sha256}` (also on `localhost`), `POST /api/models/{repo}/commit/{rev}` (NDJSON);
- `GET /api/whoami-v2` (the test token's account, `FakeHub.account`);
- `GET /api/agent-harnesses` (empty), in case a client builds a user agent with telemetry on.

Xet is not offered: resolve answers carry no Xet headers, and the tests set HF_HUB_DISABLE_XET=1
so that uploads take the LFS path (with hf_xet installed, huggingface_hub would otherwise
upload through a Xet CAS service, which this server does not imitate).

Errors carry `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) and a JSON
`error`, which huggingface_hub turns into its typed errors. Faults can be injected (`fail`) and
requests held (`hold`), to interrupt uploads.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "hf_fiConvertTestToken0123456789abcdefXYZ"
VALID_RELATIONS = {"adapter", "merge", "quantized", "finetune"}
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class File:
    """A file's bytes, never changed (a fault replaces the File); its hashes are computed
    once, as the Hub stores them, not on each request (hashing a shard on each listing made
    the fake's answers take as long as a download)."""

    data: bytes
    lfs: bool

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def pointer(self) -> bytes:
        return (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
            f"size {len(self.data)}\n"
        ).encode()

    @functools.cached_property
    def oid(self) -> str:
        """The git blob id (of the LFS pointer for LFS files), as the tree listing gives it."""
        return git_blob_id(self.pointer() if self.lfs else self.data)


@dataclass
class Repo:
    repo_id: str
    private: bool = False
    gated: bool = False
    commits: dict[str, dict[str, File]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    messages: list[tuple[str, str, list[str]]] = field(default_factory=list)  # oid, title, paths

    def resolve(self, rev: str) -> str | None:
        if rev in self.branches:
            return self.branches[rev]
        return rev if rev in self.commits else None


def is_lfs(path: str, data: bytes) -> bool:
    return path.endswith((".safetensors", ".bin")) or len(data) > 10_000_000 or b"\0" in data[:512]


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that hangs up mid-answer (it refused what it was sent, or was killed) is
        a normal event here, not one to print a traceback for."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


SMALL_MESSAGE = 16 << 10  # bytes: not paced (see FakeHub.pace)


@dataclass
class Rule:
    method: str
    pattern: re.Pattern
    status: int
    times: int
    after: int = 0  # matching requests let through before the first failure
    kind: str = "status"  # or "cut" (half the body, then the connection drops), "range"
    # (a 206 whose Content-Range names other bytes than those asked for)


class Hold:
    """Holds every matching request after the first `after` ones until `release()`: then
    each drops its connection unanswered, or, with `serve`, is answered as usual."""

    def __init__(self, method: str, pattern: str, after: int) -> None:
        self.method, self.pattern, self.after = method, re.compile(pattern), after
        self.seen = 0
        self.serve = False
        self.reached = threading.Event()
        self.released = threading.Event()

    def release(self, serve: bool = False) -> None:
        self.serve = serve
        self.released.set()


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.log: list[tuple[str, str]] = []
        self.puts: list[str] = []  # LFS objects stored by PUT, in order
        self.reads: list[tuple[str, str | None]] = []  # blobs served: (etag, Range header)
        # a link of this many bytes per second each way (0: unlimited), shared by all
        # connections, as a runner's network is (the Hub -> Hub bench)
        self.down_bps = 0
        self.up_bps = 0
        self._pace = {"down": [0.0, threading.Lock()], "up": [0.0, threading.Lock()]}
        # whose the test token is (GET /api/whoami-v2): a user who may write to "acme"
        self.account = {"name": "tester", "orgs": ["acme"], "role": "write"}
        self.tokens_seen: list[str | None] = []
        self.rules: list[Rule] = []
        self.holds: list[Hold] = []
        self.lock = threading.RLock()
        self._counter = 0
        self.server: ThreadingHTTPServer | None = None

    # ---- set-up and inspection, for the tests ----

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cdn = f"http://localhost:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def pace(self, way: str, nbytes: int, message: int | None = None) -> None:
        """Hold the caller until `nbytes` more fit the link's rate in direction `way`. The
        link is a queue of bulk bytes; a small message (an API call's JSON, a header) is not
        queued behind them, as TCP's fair sharing would not make it wait for other
        connections' megabytes. `message`: the size of the whole message `nbytes` are of."""
        bps = self.down_bps if way == "down" else self.up_bps
        if not bps or (message is not None and message < SMALL_MESSAGE):
            return
        slot = self._pace[way]
        with slot[1]:
            now = time.monotonic()
            start = max(now, slot[0])
            slot[0] = start + nbytes / bps
        time.sleep(max(0.0, slot[0] - now))

    def stop(self) -> None:
        for h in self.holds:
            h.release()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        private: bool = False,
        gated: bool = False,
        branch: str = "main",
    ) -> str:
        """Create (or add a commit to) a repo holding `files`; returns the commit id."""
        with self.lock:
            repo = self.repos.get(repo_id)
            if repo is None:
                repo = self.repos[repo_id] = Repo(repo_id, private, gated)
                self._commit(repo, "main", {".gitattributes": File(GITATTRIBUTES, False)}, "init")
            if not files and branch in repo.branches:
                return repo.branches[branch]
            base = dict(repo.commits[repo.branches.get(branch, repo.branches["main"])])
            for path, data in files.items():
                f = File(data, is_lfs(path, data))
                base[path] = f
                if f.lfs:
                    self.lfs[f.sha256] = data
            return self._commit(repo, branch, base, f"add {len(files)} files")

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        commit = repo.resolve(revision)
        assert commit is not None, revision
        return {p: f.data for p, f in repo.commits[commit].items()}

    def requests(self, method: str | None = None, pattern: str = "") -> list[str]:
        with self.lock:
            return [
                p
                for m, p in self.log
                if (method is None or m == method) and re.search(pattern, unquote(p))
            ]

    def fail(
        self, method: str, pattern: str, status: int = 500, times: int = 1, after: int = 0
    ) -> None:
        """Answer the next `times` matching requests with HTTP `status` (after letting
        `after` of them through)."""
        self.rules.append(Rule(method, re.compile(pattern), status, times, after))

    def fault(self, pattern: str, kind: str, times: int = 1, after: int = 0) -> None:
        """Spoil the next `times` GETs of a file's bytes matching `pattern` (after `after`):
        "cut" sends half the body and drops the connection, "range" answers a range request
        with a Content-Range for other bytes."""
        assert kind in ("cut", "range")
        self.rules.append(Rule("GET", re.compile(pattern), 0, times, after, kind))

    def hold(self, method: str, pattern: str, after: int) -> Hold:
        h = Hold(method, pattern, after)
        self.holds.append(h)
        return h

    def _commit(self, repo: Repo, branch: str, files: dict[str, File], title: str) -> str:
        self._counter += 1
        seed = json.dumps(
            [self._counter, repo.repo_id, sorted((p, f.oid) for p, f in files.items())]
        )
        oid = hashlib.sha1(seed.encode()).hexdigest()
        repo.commits[oid] = files
        repo.branches[branch] = oid
        return oid


class _Error(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, **extra: object) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"
    # headers and body go in separate writes: with Nagle's algorithm each answer with a body
    # would wait out the client's delayed ACK (40 ms here), which no real server makes it do
    disable_nagle_algorithm = True
    timeout = 30

    def log_message(self, format: str, *args) -> None:  # quiet
        pass

    # ---- plumbing ----

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def _serve(self, method: str) -> None:
        hub = self.hub
        url = urlsplit(self.path)
        with hub.lock:
            hub.log.append((method, self.path))
            hub.tokens_seen.append(self.headers.get("authorization"))
            rule = next(
                (
                    r
                    for r in hub.rules
                    if r.method == method and r.pattern.search(url.path) and r.times
                ),
                None,
            )
            if rule is not None and rule.after > 0:
                rule.after -= 1
                rule = None
            elif rule is not None:
                rule.times -= 1
            hold = next(
                (h for h in hub.holds if h.method == method and h.pattern.search(url.path)), None
            )
            held = False
            if hold is not None:
                hold.seen += 1
                held = hold.seen > hold.after
        if held:
            assert hold is not None
            hold.reached.set()
            hold.released.wait(60)
            if not hold.serve:
                self.close_connection = True
                return
        self.spoil = rule.kind if rule is not None and rule.kind != "status" else None
        try:
            if rule is not None and self.spoil is None:
                self._read_body()
                raise _Error(rule.status, f"injected failure {rule.status}")
            auth = self.headers.get("authorization")
            if auth is not None and not self._authed() and not url.path.startswith("/cdn/"):
                # the Hub refuses a token it does not know, whatever the repo
                raise _Error(401, "Invalid credentials in Authorization header")
            self._route(method, url.path, parse_qs(url.query))
        except _Error as e:
            body = json.dumps({"error": e.message, **e.extra}).encode()
            headers = {"Content-Type": "application/json", "X-Error-Message": e.message}
            if e.code:
                headers["X-Error-Code"] = e.code
            self._send(e.status, body, headers, method)
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def _send(self, status: int, body: bytes, headers: dict, method: str = "GET") -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, str(v))
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD" and body:
            for i in range(0, len(body), 1 << 18):
                self.hub.pace("down", len(body[i : i + (1 << 18)]), len(body))
                self.wfile.write(body[i : i + (1 << 18)])

    def _json(self, obj, status: int = 200) -> None:
        self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.hub.pace("up", size)
                self.rfile.readline()
        n = whole = int(self.headers.get("Content-Length") or 0)
        parts = []
        while n > 0:
            piece = self.rfile.read(min(n, 1 << 18))
            if not piece:
                break
            self.hub.pace("up", len(piece), whole)
            parts.append(piece)
            n -= len(piece)
        return b"".join(parts)

    def _authed(self) -> bool:
        return self.headers.get("authorization") == f"Bearer {TOKEN}"

    def _repo(self, repo_id: str, write: bool = False) -> Repo:
        if write and not self._authed():
            raise _Error(401, "Invalid username or password.")
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and not self._authed()):
            raise _Error(401 if not self._authed() else 404, "Repository not found", "RepoNotFound")
        return repo

    def _commit_of(self, repo: Repo, rev: str) -> str:
        commit = repo.resolve(rev)
        if commit is None:
            raise _Error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return commit

    # ---- routes ----

    def _route(self, method: str, path: str, query: dict) -> None:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if method == "GET" and parts[:2] == ["api", "agent-harnesses"]:
            return self._json({"standardEnvVars": [], "harnesses": {}})
        if method == "GET" and parts[:2] == ["api", "whoami-v2"]:
            return self._whoami()
        if method == "POST" and parts[:3] == ["api", "repos", "create"]:
            return self._create_repo()
        if method == "POST" and parts[:2] == ["api", "validate-yaml"]:
            return self._validate_yaml()
        if parts[:1] == ["cdn"] and method in ("GET", "HEAD"):
            return self._blob(self.hub.lfs.get(parts[1]), parts[1], method)
        if parts[:1] == ["lfs-upload"] and method == "PUT":
            return self._lfs_put(parts[1])
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id, rest = f"{parts[2]}/{parts[3]}", parts[4:]
            if method == "GET" and not rest:
                return self._model_info(repo_id, "main")
            if method == "GET" and rest[0] == "revision":
                return self._model_info(repo_id, rest[1])
            if method == "GET" and rest[0] == "tree":
                return self._tree(repo_id, rest[1], "/".join(rest[2:]), query)
            if method == "POST" and rest[0] == "preupload":
                return self._preupload(repo_id, rest[1])
            if method == "POST" and rest[0] == "commit":
                return self._commit(repo_id, rest[1], query)
            if method == "POST" and rest[0] == "branch":
                return self._branch(repo_id, rest[1])
        if len(parts) >= 5 and parts[2] == "resolve" and method in ("GET", "HEAD"):
            return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), method)
        if method == "POST" and len(parts) == 6 and path.endswith(".git/info/lfs/objects/batch"):
            return self._lfs_batch(f"{parts[0]}/{parts[1].removesuffix('.git')}")
        raise _Error(404, f"no route {method} {path}")

    def _whoami(self) -> None:
        if not self._authed():
            raise _Error(401, "Invalid credentials in Authorization header")
        a = self.hub.account
        self._json(
            {
                "type": "user",
                "name": a["name"],
                "orgs": [{"name": o, "roleInOrg": "write"} for o in a["orgs"]],
                "auth": {"type": "access_token", "accessToken": {"role": a["role"]}},
            }
        )

    def _model_info(self, repo_id: str, rev: str) -> None:
        repo = self._repo(repo_id)
        commit = self._commit_of(repo, rev)
        files = repo.commits[commit]
        self._json(
            {
                "id": repo_id,
                "modelId": repo_id,
                "sha": commit,
                "private": repo.private,
                "gated": "manual" if repo.gated else False,
                "disabled": False,
                "siblings": [{"rfilename": p} for p in sorted(files)],
            }
        )

    def _tree(self, repo_id: str, rev: str, under: str, query: dict) -> None:
        repo = self._repo(repo_id)
        files = repo.commits[self._commit_of(repo, rev)]
        recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
        prefix = f"{under}/" if under else ""
        if under and not any(p.startswith(prefix) for p in files):
            raise _Error(404, f"{under} does not exist", "EntryNotFound")
        out, dirs = [], set()
        for p in sorted(files):
            if not p.startswith(prefix):
                continue
            rel = p[len(prefix) :].split("/")
            for k in range(1, len(rel)):
                if recursive or k == 1:
                    dirs.add(prefix + "/".join(rel[:k]))
            if len(rel) > 1 and not recursive:
                continue
            f = files[p]
            entry = {"type": "file", "oid": f.oid, "size": len(f.data), "path": p}
            if f.lfs:
                entry["lfs"] = {
                    "oid": f.sha256,
                    "size": len(f.data),
                    "pointerSize": len(f.pointer()),
                }
            out.append(entry)
        for d in sorted(dirs):
            out.append({"type": "directory", "oid": git_blob_id(d.encode()), "size": 0, "path": d})
        self._json(out)

    def _resolve(self, repo_id: str, rev: str, path: str, method: str) -> None:
        repo = self._repo(repo_id)
        commit = self._commit_of(repo, rev)
        if repo.gated and not self._authed():
            raise _Error(401, "Access to this model is restricted", "GatedRepo")
        f = repo.commits[commit].get(path)
        if f is None:
            raise _Error(404, f"Entry not found: {path}", "EntryNotFound")
        if f.lfs:  # the Hub sends LFS files to its CDN
            self._send(
                302,
                b"",
                {
                    "Location": f"{self.hub.cdn}/cdn/{f.sha256}",
                    "X-Repo-Commit": commit,
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": len(f.data),
                    "ETag": f'"{f.oid}"',
                },
                method,
            )
            return
        self._blob(f.data, f.oid, method, {"X-Repo-Commit": commit})

    def _blob(self, data: bytes | None, etag: str, method: str, extra: dict | None = None) -> None:
        if data is None:
            raise _Error(404, "no such object")
        headers = {"ETag": f'"{etag}"', "Accept-Ranges": "bytes", **(extra or {})}
        status, body = 200, data
        if method == "GET":
            with self.hub.lock:
                self.hub.reads.append((etag, self.headers.get("Range")))
        m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if m:
            a = int(m[1])
            b = int(m[2]) if m[2] else len(data) - 1
            status, body = 206, data[a : b + 1]
            shift = 1 if self.spoil == "range" else 0
            headers["Content-Range"] = f"bytes {a + shift}-{a + shift + len(body) - 1}/{len(data)}"
        headers["Content-Length"] = len(body)
        if self.spoil == "cut" and method == "GET":  # the connection drops mid-body
            self._send(status, body[: len(body) // 2], headers, "HEAD")
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(status, body, headers, method)

    def _create_repo(self) -> None:
        if not self._authed():
            raise _Error(401, "Invalid username or password.")
        d = json.loads(self._read_body() or b"{}")
        repo_id = f"{d.get('organization')}/{d['name']}"
        if repo_id in self.hub.repos:
            url = f"{self.hub.url}/{repo_id}"  # the Hub says where the repo is
            raise _Error(409, "You already created this model repo", url=url)
        self.hub.add_repo(repo_id, {}, private=d.get("visibility") == "private")
        self._json({"url": f"{self.hub.url}/{repo_id}", "name": repo_id, "id": repo_id})

    def _branch(self, repo_id: str, branch: str) -> None:
        body = self._read_body()
        repo = self._repo(repo_id, write=True)
        if branch in repo.branches:
            raise _Error(409, "Reference already exists")
        start = (json.loads(body or b"{}")).get("startingPoint") or "main"
        repo.branches[branch] = self._commit_of(repo, start)
        self._json({})

    def _validate_yaml(self) -> None:
        content = json.loads(self._read_body()).get("content", "")
        m = re.match(r"^---\n(.*?)\n---", content, re.DOTALL)
        errors = []
        if m:
            import yaml

            try:
                meta = yaml.safe_load(m[1]) or {}
            except yaml.YAMLError as e:
                meta, errors = {}, [{"message": f"invalid YAML: {e}"}]
            rel = meta.get("base_model_relation")
            if rel is not None and rel not in VALID_RELATIONS:
                errors.append({"message": f"base_model_relation {rel!r} is not valid"})
            if rel is not None and not meta.get("base_model"):
                errors.append({"message": "base_model_relation needs base_model"})
            if not isinstance(meta.get("tags", []), list):
                errors.append({"message": "tags must be a list"})
        if errors:
            self._json({"errors": errors, "warnings": []}, 400)
        else:
            self._json({"errors": [], "warnings": []})

    def _preupload(self, repo_id: str, rev: str) -> None:
        body = json.loads(self._read_body())
        repo = self._repo(repo_id, write=True)
        files = repo.commits[self._commit_of(repo, rev)]
        out = []
        for f in body["files"]:
            sample = base64.b64decode(f["sample"])
            lfs = f["path"].endswith((".safetensors", ".bin")) or f["size"] > 10_000_000
            lfs = lfs or b"\0" in sample
            entry = {
                "path": f["path"],
                "uploadMode": "lfs" if lfs else "regular",
                "shouldIgnore": False,
            }
            old = files.get(f["path"])
            if old is not None:  # the oid the client compares its own with, to skip a no-op
                entry["oid"] = old.sha256 if old.lfs else git_blob_id(old.data)
            out.append(entry)
        self._json({"files": out, "commitOid": repo.resolve(rev)})

    def _lfs_batch(self, repo_id: str) -> None:
        body = json.loads(self._read_body())
        self._repo(repo_id, write=True)
        objects = []
        for o in body["objects"]:
            obj = {"oid": o["oid"], "size": o["size"], "authenticated": True}
            if o["oid"] not in self.hub.lfs:
                obj["actions"] = {
                    "upload": {"href": f"{self.hub.cdn}/lfs-upload/{o['oid']}", "header": {}}
                }
            objects.append(obj)
        self._json({"transfer": "basic", "objects": objects})

    def _lfs_put(self, oid: str) -> None:
        data = self._read_body()
        if hashlib.sha256(data).hexdigest() != oid:
            raise _Error(400, "sha256 mismatch")
        with self.hub.lock:
            self.hub.lfs[oid] = data
            self.hub.puts.append(oid)
        self._send(200, b"", {"ETag": f'"{oid}"'})

    def _commit(self, repo_id: str, rev: str, query: dict) -> None:
        lines = [json.loads(x) for x in self._read_body().splitlines() if x.strip()]
        repo = self._repo(repo_id, write=True)
        if query.get("create_pr"):
            raise _Error(400, "pull requests are not implemented here")
        if rev not in repo.branches:
            raise _Error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        with self.hub.lock:
            files = dict(repo.commits[repo.branches[rev]])
            title, paths = "", []
            for item in lines:
                key, v = item["key"], item["value"]
                if key == "header":
                    title = v["summary"]
                    if v.get("parentCommit") and v["parentCommit"] != repo.branches[rev]:
                        raise _Error(412, "parent commit is not the head")
                elif key == "file":
                    files[v["path"]] = File(base64.b64decode(v["content"]), False)
                    paths.append(v["path"])
                elif key == "lfsFile":
                    data = self.hub.lfs.get(v["oid"])
                    if data is None:
                        raise _Error(422, f"LFS object {v['oid']} was not uploaded")
                    files[v["path"]] = File(data, True)
                    paths.append(v["path"])
                elif key == "deletedFile":
                    if files.pop(v["path"], None) is None:
                        raise _Error(404, "A file with this name doesn't exist")
                    paths.append(f"-{v['path']}")
                elif key == "deletedFolder":
                    for p in [p for p in files if p.startswith(v["path"].rstrip("/") + "/")]:
                        del files[p]
                    paths.append(f"-{v['path']}/")
                else:
                    raise _Error(400, f"unknown key {key}")
            oid = self.hub._commit(repo, rev, files, title)
            repo.messages.append((oid, title, paths))
        self._json(
            {
                "success": True,
                "commitOid": oid,
                "commitUrl": f"{self.hub.url}/{repo_id}/commit/{oid}",
                "commitMessage": title,
                "hookOutput": "",
                "pullRequestUrl": None,
            }
        )


def loopback_only(setattr=setattr) -> None:
    """Refuse network connections and name lookups that would leave this machine.

    Called in the tests' own process (with monkeypatch.setattr, undone after each test) and at
    the start of the CLI subprocesses they run.
    """
    import socket

    allowed = {"127.0.0.1", "::1", "localhost"}
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def connect(self, address):
        if isinstance(address, tuple) and address[0] not in allowed:
            raise ConnectionRefusedError(f"test guard: no connections off loopback ({address[0]})")
        return real_connect(self, address)

    def getaddrinfo(host, *args, **kwargs):
        h = host.decode() if isinstance(host, bytes) else host
        if h is not None and h not in allowed:
            raise socket.gaierror(f"test guard: no name lookups off loopback ({h})")
        return real_getaddrinfo(host, *args, **kwargs)

    setattr(socket.socket, "connect", connect)
    setattr(socket, "getaddrinfo", getaddrinfo)


PROXIES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def hf_env(hub: FakeHub, home: Path) -> dict[str, str]:
    return {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_TOKEN": TOKEN,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "NO_PROXY": "127.0.0.1,localhost",
    }

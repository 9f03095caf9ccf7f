"""A local fake of the Hugging Face Hub HTTP API, for tests that run the real client code offline.

``FakeHub`` serves, on 127.0.0.1 and a free port, the part of the Hub API that
``huggingface_hub`` (written against 2.4.0) and ``datasets`` (5.2) use to resolve and download
repos. Point ``HF_ENDPOINT`` at ``hub.url`` with ``hub_env`` (below) and call the library as usual::

    with FakeHub() as hub:  # serves in a thread; closed (threads joined) on exit
        sha = hub.add_repo("org/tiny-model", folder)  # branch "main"; returns the commit sha
        sha2 = hub.add_repo("org/tiny-model", other_folder, revision="v2", tags=["v2.0"])
        hub.add_repo("org/math-ds", {"data/train.jsonl": b"..."}, repo_type="dataset")
        hub_env(monkeypatch, hub, tmp_path)
        path = snapshot_download("org/tiny-model")  # -> .../snapshots/<sha>
        hub.requests  # [(method, path), ...] received, e.g. ("GET", "/org/tiny-model/resolve/...")
        hub.offline = True  # connections are refused (httpx2.ConnectError) until set back to False
        hub.error_status = 503  # or: every request answered with this HTTP status (Hub down)

Repos and revisions
    Each ``add_repo`` call reads the files (a folder, skipping ``.git``, or a mapping of repo path
    to ``bytes``/``str``) into memory and makes one commit on the branch ``revision``, whose
    parent is that branch's previous head. A revision in a request may be a branch, a tag or a
    full 40-hex commit sha. Commit shas are deterministic (a hash of the repo, branch, parent and
    content).
    Files matching ``lfs_patterns`` (weights, parquet, ...) are presented as LFS files, as the Hub
    does: their tree entry has ``lfs`` metadata and their ETag is the content's sha256; other files
    have their git blob sha1 as ETag. No Xet metadata is ever sent (no ``X-Xet-Hash``, no
    ``xetHash``, no ``Link: xet-auth``), so the client always downloads over plain HTTP.

Endpoints served (``{type}`` is models, datasets or spaces; the path after ``/api/{type}s/`` is
the repo id; a revision in an API path is percent-quoted, e.g. ``refs%2Fpr%2F1``)
    ``GET /api/{type}s/{id}`` and ``GET /api/{type}s/{id}/revision/{rev}``
        repo info (``id``, ``sha``, ``siblings``, ...; ``?blobs=true`` adds sizes and LFS info).
        ``HfApi.repo_info``/``model_info``/``dataset_info``: ``snapshot_download`` (to resolve a
        branch or tag to a commit), ``HfFileSystem.resolve_path`` (repo/revision exists),
        ``datasets.load_dataset`` (when the repo has no README.md).
    ``GET /api/{type}s/{id}/tree/{rev}[/{path}]?recursive=&expand=&cursor=``
        folder listing, Link-header pagination (``tree_page_size`` entries a page, 50 with
        ``expand``). ``HfApi.list_repo_tree``/``list_repo_files``: ``snapshot_download`` (the files
        to fetch, recursive), ``HfFileSystem.ls``/``glob``/``find`` (``datasets`` data-file
        patterns).
    ``POST /api/{type}s/{id}/paths-info/{rev}`` (form or JSON: ``paths``, ``expand``)
        ``HfApi.get_paths_info``: ``HfFileSystem.info`` when the parent folder is not cached.
    ``GET /api/{type}s/{id}/refs`` and ``GET /api/{type}s/{id}/commits/{rev}``
        ``HfApi.list_repo_refs`` and ``list_repo_commits`` (``HfFileSystem.info`` of a repo root
        with ``expand_info``).
    ``HEAD``/``GET /{id}/resolve/{rev}/{path}`` (models), ``/datasets/{id}/resolve/...``,
    ``/spaces/{id}/resolve/...``
        file metadata and content: ``hf_hub_download`` (HEAD for ``X-Repo-Commit``, ``ETag``,
        ``Content-Length``, then GET), ``HfFileSystem.open`` (GET, with ``Range``). Headers:
        ``X-Repo-Commit``, ``ETag`` (quoted), ``Content-Length``, ``Accept-Ranges: bytes``, and for
        LFS files ``X-Linked-Etag``/``X-Linked-Size``. A single ``Range: bytes=a-b`` / ``a-`` /
        ``-n`` gets 206 and ``Content-Range``; an unsatisfiable one 416.
    Errors are 404s with the ``X-Error-Code`` header that ``hf_raise_for_status`` maps:
    ``RepoNotFound`` -> ``RepositoryNotFoundError``, ``RevisionNotFound`` ->
    ``RevisionNotFoundError``, ``EntryNotFound`` -> ``RemoteEntryNotFoundError`` (a 404 on a file
    also carries ``X-Repo-Commit``, so the client caches the absence under ``.no_exist/``). Any
    other path is a plain 404 (e.g. ``/api/agent-harnesses``, only asked for when telemetry is on).

What a test must patch (``hub_env`` does all of it with ``monkeypatch``)
    Both libraries read their settings once, at import, into module attributes, so setting the
    environment variables inside a test is not enough once they are imported:

    * ``huggingface_hub.constants.ENDPOINT`` and ``HUGGINGFACE_CO_URL_TEMPLATE`` (``hf_hub_url``
      builds file URLs from the template, not from ``ENDPOINT``), and the endpoint of the
      module-level ``huggingface_hub.hf_api.api`` (the ``HfApi`` behind the module-level functions
      such as ``huggingface_hub.list_repo_files``, built at import). ``HfApi()`` and
      ``HfFileSystem()`` created later read ``constants.ENDPOINT``.
    * ``constants.HF_HUB_OFFLINE`` (what ``is_offline_mode()`` returns; the request hook raises
      ``OfflineModeIsEnabled`` before anything is sent when it is true), the cache paths
      (``HF_HOME``, ``HF_HUB_CACHE``, ``HF_ASSETS_CACHE``, ``HF_XET_CACHE``, token paths, and the
      copies ``huggingface_hub.utils._cache_manager.HF_HUB_CACHE`` used by ``scan_cache_dir()`` and
      ``_cache_assets.HF_ASSETS_CACHE``), ``HF_HUB_DISABLE_XET`` (belt and braces: the server
      sends no Xet metadata anyway) and ``HF_HUB_DISABLE_TELEMETRY`` (otherwise the first
      ``build_hf_headers`` of the process asks ``{ENDPOINT}/api/agent-harnesses`` once, an extra
      request in ``hub.requests``). ``HF_TOKEN`` is unset and the token file moved into the cache
      dir, so no real credential is read or sent.
    * ``HfFileSystem``'s instance cache (instances and their directory listings are cached per
      endpoint and token): replaced by an empty one for the test.
    * ``datasets.config`` (patched only if ``datasets`` is already imported: import it before
      calling ``hub_env``): ``HF_ENDPOINT``, ``HUB_DATASETS_URL``, ``HF_HUB_OFFLINE`` and
      ``HF_DATASETS_OFFLINE``, ``HF_DATASETS_CACHE``, ``DOWNLOADED_DATASETS_PATH``,
      ``EXTRACTED_DATASETS_PATH``, and two switches that would otherwise reach other hosts:
      ``HF_UPDATE_DOWNLOAD_COUNTS`` (a HEAD to s3.amazonaws.com on every hub load) and
      ``USE_PARQUET_EXPORT`` (the dataset viewer at ``datasets-server.<endpoint host>``).
    * The environment variables of the same names are set too, for subprocesses.

    To flip ``HF_HUB_OFFLINE`` within a test, call ``hub_env`` again with ``offline=True``.

Client behaviour worth knowing (huggingface_hub 2.4.0)
    * ``snapshot_download`` with a branch or tag makes one repo-info GET (no retry), one recursive
      tree GET (cached on disk per commit under ``trees/<sha>.json``), then a HEAD and a GET per
      file. A second call makes only the repo-info GET: the tree listing comes from the disk
      cache and each file is found in ``snapshots/<sha>/`` before any HEAD. With a full commit
      sha (and the tree cached) it makes no request at all.
    * Network failure (``hub.offline = True``, or ``error_status`` 5xx) during the repo-info call:
      ``snapshot_download`` falls back to the cache (``refs/<revision>`` -> snapshot folder) if
      the cached tree listing shows the snapshot complete; it raises ``LocalEntryNotFoundError``
      when nothing is cached and ``IncompleteSnapshotError`` when the cached snapshot misses files.
      ``HF_HUB_OFFLINE=1`` behaves the same without sending anything (the error's cause is then
      ``OfflineModeIsEnabled``).
    * Calls that go through ``http_backoff`` (tree listing, paginated calls, and
      ``hf_hub_download``'s second HEAD attempt when the first failed and the file is not cached)
      retry on connection errors and 5xx, sleeping 1+2+4+8+8 s: a test of network failure should
      go through ``snapshot_download`` with a branch or tag (its repo-info call does not retry) or
      a file that is cached.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import http.server
import importlib
import json
import os
import socket
import socketserver
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

REPO_TYPES = ("model", "dataset", "space")
DEFAULT_LFS_PATTERNS = (
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.h5",
    "*.msgpack",
    "*.onnx",
    "*.gguf",
    "*.npz",
    "*.parquet",
    "*.arrow",
)
_EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)
_SHA_CHARS = frozenset("0123456789abcdef")
_API_VERBS = frozenset({"revision", "tree", "paths-info", "refs", "commits"})
_TRUE = frozenset({"1", "true", "yes", "on"})


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _is_sha(revision: str) -> bool:
    return len(revision) == 40 and set(revision) <= _SHA_CHARS


@dataclass(frozen=True)
class _Blob:
    data: bytes
    lfs: bool
    git_oid: str = field(init=False)  # the git blob sha1 (of the LFS pointer for an LFS file)
    sha256: str = field(init=False)
    pointer_size: int = field(init=False)

    def __post_init__(self) -> None:
        sha256 = hashlib.sha256(self.data).hexdigest()
        stored = self.data
        if self.lfs:
            stored = (
                "version https://git-lfs.github.com/spec/v1\n"
                f"oid sha256:{sha256}\nsize {len(self.data)}\n"
            ).encode()
        git_oid = hashlib.sha1(b"blob %d\0" % len(stored) + stored).hexdigest()
        object.__setattr__(self, "sha256", sha256)
        object.__setattr__(self, "git_oid", git_oid)
        object.__setattr__(self, "pointer_size", len(stored))

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid


@dataclass(frozen=True)
class _Commit:
    sha: str
    parent: str | None
    title: str
    date: str
    files: Mapping[str, _Blob]  # repo path -> blob

    def dirs(self) -> set[str]:
        out = set()
        for path in self.files:
            parts = path.split("/")[:-1]
            out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        return out

    def tree_oid(self, folder: str) -> str:
        prefix = folder + "/" if folder else ""
        h = hashlib.sha1(f"tree {folder}\n".encode())
        for path in sorted(p for p in self.files if p.startswith(prefix)):
            h.update(f"{path}\0{self.files[path].git_oid}\n".encode())
        return h.hexdigest()


@dataclass
class _Repo:
    repo_type: str
    repo_id: str
    created: str
    commits: dict[str, _Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> _Commit | None:
        sha = self.branches.get(revision) or self.tags.get(revision)
        if sha is None and _is_sha(revision.lower()):
            sha = revision.lower()
        return self.commits.get(sha) if sha else None

    @property
    def default_branch(self) -> str:
        return "main" if "main" in self.branches else next(iter(self.branches))


class _Handled(Exception):
    """An HTTP error answer (raised inside a handler, written by the dispatcher)."""

    def __init__(self, status: int, message: str, code: str | None = None, **headers: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.headers = {"X-Error-Message": message, **headers}
        if code is not None:
            self.headers["X-Error-Code"] = code


_Answer = tuple[int, bytes, dict[str, str]]  # status, body, headers


def _json(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> _Answer:
    headers = {"Content-Type": "application/json; charset=utf-8", **(headers or {})}
    return status, json.dumps(payload).encode(), headers


class _Server(http.server.HTTPServer):
    """HTTPServer that runs each connection in a daemon thread it tracks, so that ``stop`` can
    close every open (keep-alive) connection and join every handler thread."""

    def __init__(self, address: tuple[str, int], hub: FakeHub) -> None:
        self.hub = hub
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:  # skip HTTPServer's getfqdn(): a reverse DNS lookup
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request, client_address) -> None:
        thread = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address),
            name=f"FakeHub:{self.server_port}:connection",
            daemon=True,
        )
        with self._lock:
            self._connections.add(request)
            self._threads.add(thread)
        thread.start()

    def _serve_connection(self, request, client_address) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:
            pass  # the client went away, or stop() shut the connection
        finally:
            self.shutdown_request(request)
            with self._lock:
                self._connections.discard(request)
                self._threads.discard(threading.current_thread())

    def handle_error(self, request, client_address) -> None:
        pass

    def stop(self) -> None:
        """Stop accepting, close the open connections, join their threads, close the socket."""
        self.shutdown()  # returns once serve_forever has exited: no connection is accepted after
        with self._lock:
            connections, threads = list(self._connections), list(self._threads)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=30)
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx pools connections
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        hub = self.server.hub
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        hub._record(self.command, split.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        try:
            status = hub.error_status
            if status is not None:
                raise _Handled(status, f"FakeHub.error_status is {status}")
            with hub._lock:  # the answer is built under the lock, written without it
                status, content, headers = self._route(hub, split.path, query, body)
        except _Handled as err:
            status, content, headers = _json({"error": err.message}, err.status, err.headers)
        except Exception as err:  # a FakeHub bug or a request it cannot parse: say so, as a 500
            message = f"FakeHub failed on {self.command} {self.path}: {err!r}"
            status, content, headers = _json({"error": message}, 500, {"X-Error-Message": message})
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(content)

    def _route(self, hub: FakeHub, path: str, query: dict[str, str], body: bytes) -> _Answer:
        segments = path.strip("/").split("/")
        if segments[0] == "api" and len(segments) >= 3 and segments[1].endswith("s"):
            repo_type = segments[1][:-1]
            if repo_type in REPO_TYPES:
                return self._api(hub, repo_type, segments[2:], query, body)
        if segments[0] in ("datasets", "spaces"):
            repo_type, segments = segments[0][:-1], segments[1:]
        else:
            repo_type = "model"
        for i in (1, 2):  # "name/resolve/..." or "namespace/name/resolve/..."
            if len(segments) > i + 2 and segments[i] == "resolve" and self.command != "POST":
                repo = hub._repo(repo_type, "/".join(segments[:i]))
                commit = _commit(repo, unquote(segments[i + 1]))
                return self._file(commit, unquote("/".join(segments[i + 2 :])))
        raise _Handled(404, f"Not found: {path}")

    def _api(self, hub, repo_type, rest, query, body) -> _Answer:
        # The repo id is "namespace/name" (or a legacy single "name" followed by an API verb).
        if len(rest) >= 2 and rest[1] in _API_VERBS and (repo_type, rest[0]) in hub._repos:
            repo_id, rest = rest[0], rest[1:]
        else:
            repo_id, rest = "/".join(rest[:2]), rest[2:]
        repo = hub._repo(repo_type, repo_id)
        verb = rest[0] if rest else ""
        post = self.command == "POST"
        if verb == "" and not post:
            return _json(_repo_info(repo, _commit(repo, None), query))
        if verb == "revision" and len(rest) == 2 and not post:
            return _json(_repo_info(repo, _commit(repo, unquote(rest[1])), query))
        if verb == "tree" and len(rest) >= 2 and not post:
            commit = _commit(repo, unquote(rest[1]))
            folder = "/".join(unquote(s) for s in rest[2:]).strip("/")
            return self._tree(hub, repo, commit, folder, query)
        if verb == "paths-info" and len(rest) == 2 and post:
            return self._paths_info(repo, _commit(repo, unquote(rest[1])), body)
        if verb == "refs" and len(rest) == 1 and not post:
            return _json(_refs(repo))
        if verb == "commits" and len(rest) == 2 and not post:
            return _json(_history(repo, _commit(repo, unquote(rest[1]))))
        raise _Handled(404, f"Not found: {self.path}")

    def _tree(self, hub, repo, commit, folder, query) -> _Answer:
        dirs = commit.dirs()
        if folder and folder not in dirs:
            raise _Handled(404, f"{folder} does not exist on {commit.sha}", "EntryNotFound")
        recursive = query.get("recursive", "").lower() in _TRUE
        expand = query.get("expand", "").lower() in _TRUE
        prefix = folder + "/" if folder else ""
        paths = sorted(
            p
            for p in (*dirs, *commit.files)
            if p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :])
        )
        entries = [_entry(repo, commit, p, expand) for p in paths]
        page_size = 50 if expand else hub.tree_page_size
        start = int(query.get("cursor", "0"))
        headers = {}
        if start + page_size < len(entries):
            next_query = urlencode({**query, "cursor": start + page_size})
            headers["Link"] = f'<{hub.url}{urlsplit(self.path).path}?{next_query}>; rel="next"'
        return _json(entries[start : start + page_size], headers=headers)

    def _paths_info(self, repo, commit, body: bytes) -> _Answer:
        if self.headers.get("Content-Type", "").startswith("application/json"):
            data = json.loads(body or b"{}")
            paths, expand = data.get("paths", []), bool(data.get("expand"))
        else:
            form = parse_qs(body.decode())
            paths = form.get("paths", [])
            expand = form.get("expand", ["false"])[-1].lower() in _TRUE
        if isinstance(paths, str):
            paths = [paths]
        dirs = commit.dirs()
        wanted = [p.strip("/") for p in paths]
        return _json(
            [_entry(repo, commit, p, expand) for p in wanted if p in commit.files or p in dirs]
        )

    def _file(self, commit: _Commit, path: str) -> _Answer:
        blob = commit.files.get(path)
        if blob is None:
            raise _Handled(404, "Entry not found", "EntryNotFound", **{"X-Repo-Commit": commit.sha})
        size = len(blob.data)
        headers = {
            "X-Repo-Commit": commit.sha,
            "ETag": f'"{blob.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if blob.lfs:
            headers["X-Linked-Etag"] = f'"{blob.etag}"'
            headers["X-Linked-Size"] = str(size)
        byte_range = _parse_range(self.headers.get("Range"), size)
        if byte_range == "unsatisfiable":
            raise _Handled(416, "Range Not Satisfiable", **{"Content-Range": f"bytes */{size}"})
        if byte_range is None:
            return 200, blob.data, headers
        start, end = byte_range
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        return 206, blob.data[start:end], headers


def _commit(repo: _Repo, revision: str | None) -> _Commit:
    revision = repo.default_branch if revision is None else revision
    commit = repo.resolve(revision)
    if commit is None:
        raise _Handled(404, f"Invalid rev id: {revision}", "RevisionNotFound")
    return commit


def _parse_range(header: str | None, size: int):
    """(start, end) of a single ``bytes=`` range, None to serve it all, or "unsatisfiable"."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header[len("bytes=") :].strip().partition("-")
    try:
        if first == "":  # suffix: the last N bytes
            n = int(last)
            return (max(size - n, 0), size) if n > 0 and size > 0 else "unsatisfiable"
        start = int(first)
        end = min(int(last) + 1, size) if last else size
    except ValueError:
        return None
    if start >= size or end <= start:
        return "unsatisfiable"
    return start, end


def _last_commit(repo: _Repo, commit: _Commit, path: str) -> _Commit:
    """The oldest commit of the first-parent chain since which ``path`` has not changed."""

    def state(c: _Commit):
        blob = c.files.get(path)
        return blob.git_oid if blob else (c.tree_oid(path) if path in c.dirs() else None)

    current, here = commit, state(commit)
    while current.parent is not None:
        parent = repo.commits[current.parent]
        if state(parent) != here:
            break
        current = parent
    return current


def _entry(repo: _Repo, commit: _Commit, path: str, expand: bool) -> dict[str, Any]:
    blob = commit.files.get(path)
    if blob is None:
        entry: dict[str, Any] = {
            "type": "directory",
            "oid": commit.tree_oid(path),
            "size": 0,
            "path": path,
        }
    else:
        entry = {"type": "file", "oid": blob.git_oid, "size": len(blob.data), "path": path}
        if blob.lfs:
            entry["lfs"] = {
                "oid": blob.sha256,
                "size": len(blob.data),
                "pointerSize": blob.pointer_size,
            }
    if expand:
        last = _last_commit(repo, commit, path)
        entry["lastCommit"] = {"id": last.sha, "title": last.title, "date": last.date}
    return entry


def _repo_info(repo: _Repo, commit: _Commit, query: dict[str, str]) -> dict[str, Any]:
    blobs = query.get("blobs", "").lower() in _TRUE
    siblings = []
    for path, blob in sorted(commit.files.items()):
        sibling: dict[str, Any] = {"rfilename": path}
        if blobs:
            sibling.update(size=len(blob.data), blobId=blob.git_oid)
            if blob.lfs:
                sibling["lfs"] = {
                    "size": len(blob.data),
                    "sha256": blob.sha256,
                    "pointerSize": blob.pointer_size,
                }
        siblings.append(sibling)
    info: dict[str, Any] = {
        "_id": hashlib.sha1(f"{repo.repo_type}/{repo.repo_id}".encode()).hexdigest()[:24],
        "id": repo.repo_id,
        "author": repo.repo_id.split("/")[0] if "/" in repo.repo_id else None,
        "sha": commit.sha,
        "lastModified": commit.date,
        "createdAt": repo.created,
        "private": False,
        "gated": False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": siblings,
        "usedStorage": sum(len(b.data) for b in commit.files.values()),
    }
    if repo.repo_type == "model":
        info["modelId"] = repo.repo_id
    return info


def _refs(repo: _Repo) -> dict[str, Any]:
    def refs(names: Mapping[str, str], kind: str) -> list[dict[str, str]]:
        return [
            {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": sha}
            for name, sha in names.items()
        ]

    return {
        "branches": refs(repo.branches, "heads"),
        "tags": refs(repo.tags, "tags"),
        "converts": [],
        "pullRequests": [],
    }


def _history(repo: _Repo, commit: _Commit) -> list[dict[str, Any]]:
    out, current = [], commit
    while True:
        out.append(
            {
                "id": current.sha,
                "title": current.title,
                "message": "",
                "authors": [{"user": "fake-hub"}],
                "date": current.date,
            }
        )
        if current.parent is None:
            return out
        current = repo.commits[current.parent]


def _read_files(files: str | os.PathLike | Mapping[str, bytes | str]) -> dict[str, bytes]:
    if isinstance(files, Mapping):
        return {
            str(k).strip("/"): v.encode() if isinstance(v, str) else bytes(v)
            for k, v in files.items()
        }
    root = Path(files)
    if not root.is_dir():
        raise NotADirectoryError(root)
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and ".git" not in rel.parts:
            out[rel.as_posix()] = path.read_bytes()
    return out


class FakeHub:
    """A local Hub serving the repos added with ``add_repo``; see the module docstring."""

    def __init__(
        self,
        *,
        lfs_patterns: Iterable[str] = DEFAULT_LFS_PATTERNS,
        tree_page_size: int = 1000,
    ) -> None:
        self.lfs_patterns = tuple(lfs_patterns)
        self.tree_page_size = tree_page_size
        #: When set, every request is answered with this HTTP status (e.g. 503, the Hub down).
        self.error_status: int | None = None
        self._lock = threading.Lock()  # repos and the request log
        self._life = threading.Lock()  # start/stop/offline transitions
        self._repos: dict[tuple[str, str], _Repo] = {}
        self._requests: list[tuple[str, str]] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._placeholder: socket.socket | None = None
        self._port: int | None = None
        self._offline = False
        self._clock = 0

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeHub:
        with self._life:
            if self._server is None and self._placeholder is None:
                self._start_server(0)
        return self

    def close(self) -> None:
        with self._life:
            self._stop_server()
            if self._placeholder is not None:
                self._placeholder.close()
                self._placeholder = None
            self._offline = False

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _start_server(self, port: int) -> None:
        server = _Server(("127.0.0.1", port), self)
        self._port = server.server_address[1]
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},  # how soon shutdown() is noticed
            name=f"FakeHub:{self._port}",
            daemon=True,
        )
        thread.start()
        self._server, self._thread = server, thread

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop()
            assert self._thread is not None
            self._thread.join()
            self._server = self._thread = None

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("FakeHub is not started (use it as a context manager)")
        return f"http://127.0.0.1:{self._port}"

    @property
    def offline(self) -> bool:
        """True: the port refuses connections (the client gets ``httpx2.ConnectError``)."""
        return self._offline

    @offline.setter
    def offline(self, value: bool) -> None:
        value = bool(value)
        with self._life:
            if value == self._offline:
                return
            if self._port is None:
                raise RuntimeError("FakeHub is not started")
            if value:
                self._stop_server()  # also closes the client's pooled keep-alive connections
                # Hold the port, bound but not listening: connecting to it is refused.
                placeholder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                placeholder.bind(("127.0.0.1", self._port))
                self._placeholder = placeholder
            else:
                assert self._placeholder is not None
                self._placeholder.close()
                self._placeholder = None
                self._start_server(self._port)
            self._offline = value

    # --- content -----------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: str | os.PathLike | Mapping[str, bytes | str],
        *,
        repo_type: str = "model",
        revision: str = "main",
        tags: Iterable[str] = (),
        message: str | None = None,
    ) -> str:
        """Commit a snapshot of ``files`` (a folder, or repo path -> content) on branch
        ``revision`` of the repo (created if new), point ``tags`` at it; return its sha."""
        if repo_type not in REPO_TYPES:
            raise ValueError(f"repo_type must be one of {REPO_TYPES}, not {repo_type!r}")
        if _is_sha(revision):
            raise ValueError("revision is a branch name; commit shas are made by FakeHub")
        content = _read_files(files)
        blobs = {path: _Blob(data, self._is_lfs(path)) for path, data in sorted(content.items())}
        with self._lock:
            self._clock += 1
            date = _iso(_EPOCH + timedelta(minutes=self._clock))
            repo = self._repos.setdefault(
                (repo_type, repo_id), _Repo(repo_type, repo_id, created=date)
            )
            parent = repo.branches.get(revision)
            h = hashlib.sha1(f"{repo_type}\0{repo_id}\0{revision}\0{parent}\0".encode())
            h.update(str(len(repo.commits)).encode())
            for path, blob in blobs.items():
                h.update(f"{path}\0{blob.git_oid}\n".encode())
            sha = h.hexdigest()
            title = message or f"Upload {len(blobs)} files to {revision}"
            repo.commits[sha] = _Commit(sha, parent, title, date, blobs)
            repo.branches[revision] = sha
            for tag in tags:
                repo.tags[tag] = sha
        return sha

    def resolve(self, repo_id: str, revision: str = "main", *, repo_type: str = "model") -> str:
        """The commit sha a branch, tag or sha resolves to."""
        with self._lock:
            return _commit(self._repo(repo_type, repo_id), revision).sha

    def _is_lfs(self, path: str) -> bool:
        name = path.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatch(name, pattern) for pattern in self.lfs_patterns)

    def _repo(self, repo_type: str, repo_id: str) -> _Repo:  # call with self._lock held
        repo = self._repos.get((repo_type, repo_id))
        if repo is None:
            raise _Handled(404, "Repository not found", "RepoNotFound")
        return repo

    # --- request log -------------------------------------------------------------------------

    def _record(self, method: str, path: str) -> None:
        with self._lock:
            self._requests.append((method, path))

    @property
    def requests(self) -> list[tuple[str, str]]:
        """The (method, path) of each request received, in order (path as sent, no query)."""
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def file_requests(self, method: str = "GET") -> list[str]:
        """Paths of the ``/resolve/`` (file) requests made with ``method``."""
        return [p for m, p in self.requests if m == method and "/resolve/" in p]


def hub_env(monkeypatch, hub: FakeHub, cache_dir: str | os.PathLike, offline: bool = False):
    """Point huggingface_hub (and datasets, if imported) at ``hub``, with every cache under
    ``cache_dir``, offline mode (``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``) set to ``offline``.
    Everything is undone by ``monkeypatch`` at the end of the test. Returns the hub cache dir."""
    import huggingface_hub.constants as constants
    from huggingface_hub import HfFileSystem, hf_api
    from huggingface_hub.utils import _cache_assets, _cache_manager

    hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")  # the module, not the class

    root = Path(cache_dir)
    home = root / "hf_home"
    hub_cache, datasets_cache = home / "hub", home / "datasets"
    flag = "1" if offline else "0"
    env = {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(hub_cache),
        "HF_HUB_OFFLINE": flag,
        "HF_DATASETS_OFFLINE": flag,
        "HF_DATASETS_CACHE": str(datasets_cache),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_UPDATE_DOWNLOAD_COUNTS": "0",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "TRANSFORMERS_OFFLINE", "HF_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)

    patches = {
        "ENDPOINT": hub.url,
        "HUGGINGFACE_CO_URL_TEMPLATE": hub.url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_OFFLINE": offline,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(hub_cache),
        "HUGGINGFACE_HUB_CACHE": str(hub_cache),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_TELEMETRY": True,
    }
    for name, value in patches.items():
        monkeypatch.setattr(constants, name, value)
    monkeypatch.setattr(hf_api.api, "endpoint", hub.url)
    monkeypatch.setattr(_cache_manager, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(_cache_assets, "HF_ASSETS_CACHE", str(home / "assets"))
    monkeypatch.setattr(hub_tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    monkeypatch.setattr(HfFileSystem, "_cache", {})

    config = sys.modules.get("datasets.config")
    if config is not None:
        ds_patches = {
            "HF_ENDPOINT": hub.url,
            "HUB_DATASETS_URL": hub.url + "/datasets/{repo_id}/resolve/{revision}/{path}",
            "HF_HUB_OFFLINE": offline,
            "HF_DATASETS_OFFLINE": offline,
            "HF_DATASETS_CACHE": datasets_cache,
            "DOWNLOADED_DATASETS_PATH": datasets_cache / "downloads",
            "EXTRACTED_DATASETS_PATH": datasets_cache / "downloads" / "extracted",
            "HF_UPDATE_DOWNLOAD_COUNTS": False,
            "USE_PARQUET_EXPORT": False,
        }
        for name, value in ds_patches.items():
            monkeypatch.setattr(config, name, value)
    return hub_cache


__all__ = ["DEFAULT_LFS_PATTERNS", "FakeHub", "hub_env"]

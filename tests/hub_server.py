"""A local HTTP server speaking the Hugging Face Hub protocol, for the real `huggingface_hub` client
(point `HF_ENDPOINT` / `huggingface_hub.constants.ENDPOINT` at `HubServer.url`).

It serves repositories laid out on disk as `root/<org>/<name>/<files>` at one commit each, and
answers what huggingface_hub 2.x asks when it downloads:
- `GET /api/models/<org>/<name>[/revision/<rev>]` (`?blobs=true` adds sizes and LFS data): `sha`,
  `siblings`;
- `GET /api/models/<org>/<name>/tree/<rev>?recursive=...`: the file list (one page);
- `HEAD`/`GET /<org>/<name>/resolve/<rev>/<file>`: `X-Repo-Commit`, `ETag`, `X-Linked-Etag`,
  `X-Linked-Size`, `Content-Length`, `Range` (206);
- errors with `X-Error-Code`: `RepoNotFound`, `RevisionNotFound`, `EntryNotFound`, and `GatedRepo`
  (401 without a token, 403 with a wrong one) for a repository given a token in `gated`.
Fault knobs per file name (`faults`): "cut_once" sends half the body and drops the connection once
(the client resumes with a Range request), "cut_always" does it every time, "short" serves a
body shorter than the announced size with a matching Content-Length, "slow" sends the body in
small pieces with pauses. Every request is logged in `requests` as (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

_API = re.compile(r"^/api/models/([^/]+)/([^/]+)(?:/revision/([^/]+))?/?$")
_TREE = re.compile(r"^/api/models/([^/]+)/([^/]+)/tree/([^/]+)(?:/(.*))?$")
_RESOLVE = re.compile(r"^/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class HubServer:
    """Serves `root` on 127.0.0.1; `gated` maps a repo id to the token that opens it."""

    root: Path
    gated: dict[str, str] = field(default_factory=dict)
    faults: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    slow_pause_s: float = 0.05
    _cut: set[str] = field(default_factory=set)
    _server: ThreadingHTTPServer | None = None

    def __enter__(self) -> HubServer:
        hub = self

        class Handler(_Handler):
            server_hub = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def repo_requests(self) -> list[tuple[str, str, str]]:
        """The requests about repositories (not telemetry such as /api/agent-harnesses)."""
        return [r for r in self.requests if _RESOLVE.match(r[1]) or r[1].startswith("/api/models/")]

    def fetched(self) -> list[str]:
        """Names of the files whose bodies were requested (GET on resolve)."""
        gets = [path for verb, path, _ in self.requests if verb == "GET"]
        return [m.group(4) for path in gets if (m := _RESOLVE.match(path))]

    # -- repositories ------------------------------------------------------------------------
    def repo(self, org: str, name: str) -> Path | None:
        folder = self.root / org / name
        return folder if folder.is_dir() and ".." not in (org, name) else None

    def files(self, folder: Path) -> list[Path]:
        return sorted(p for p in folder.rglob("*") if p.is_file())

    def commit(self, folder: Path) -> str:
        digest = hashlib.sha1()
        for path in self.files(folder):
            stat = path.stat()
            digest.update(f"{path.relative_to(folder)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        return digest.hexdigest()

    @staticmethod
    def etag(path: Path) -> str:
        return hashlib.sha256(f"{path}:{path.stat().st_size}".encode()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    server_hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    # -- plumbing -----------------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, data: object, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self._send(200, body, {"Content-Type": "application/json", **(headers or {})})

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        headers = {"Content-Type": "application/json", "X-Error-Code": code}
        self._send(status, body, {**headers, "X-Error-Message": message})

    def _repo(self, org: str, name: str, revision: str | None) -> tuple[Path, str] | None:
        """The repository folder and its commit, or None after sending the error."""
        hub, repo_id = self.server_hub, f"{org}/{name}"
        folder = hub.repo(org, name)
        if folder is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        token = hub.gated.get(repo_id)
        if token is not None:
            presented = self.headers.get("Authorization", "")
            if presented != f"Bearer {token}":
                status = 403 if presented else 401
                message = f"Access to model {repo_id} is restricted; you must be authenticated"
                self._error(status, "GatedRepo", message)
                return None
        commit = hub.commit(folder)
        if revision not in (None, "main", commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return folder, commit

    # -- routes -------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def _route(self) -> None:
        hub = self.server_hub
        url = urlsplit(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        hub.requests.append((self.command, path, self.headers.get("Range", "")))
        if m := _TREE.match(path):
            self._tree(m.group(1), m.group(2), m.group(3), m.group(4) or "")
        elif m := _API.match(path):
            blobs = query.get("blobs", [""])[0].lower() in ("true", "1")
            self._info(m.group(1), m.group(2), m.group(3), blobs)
        elif m := _RESOLVE.match(path):
            self._resolve(m.group(1), m.group(2), m.group(3), m.group(4))
        else:
            self._error(404, "EntryNotFound", f"no route {path}")

    def _entry(self, folder: Path, path: Path, blobs: bool, tree: bool) -> dict:
        size, name = path.stat().st_size, str(path.relative_to(folder))
        lfs = {"oid": self.server_hub.etag(path), "size": size, "pointerSize": 134}
        if tree:
            oid = hashlib.sha1(name.encode()).hexdigest()
            return {"type": "file", "oid": oid, "size": size, "path": name, "lfs": lfs}
        entry: dict = {"rfilename": name}
        if blobs:
            lfs = {"sha256": lfs["oid"], "size": size, "pointerSize": 134}
            entry.update(size=size, blobId=hashlib.sha1(name.encode()).hexdigest(), lfs=lfs)
        return entry

    def _info(self, org: str, name: str, revision: str | None, blobs: bool) -> None:
        found = self._repo(org, name, revision)
        if found is None:
            return
        folder, commit = found
        files = self.server_hub.files(folder)
        siblings = [self._entry(folder, p, blobs, tree=False) for p in files]
        gated = f"{org}/{name}" in self.server_hub.gated
        self._json(
            {
                "_id": commit[:24],
                "id": f"{org}/{name}",
                "modelId": f"{org}/{name}",
                "sha": commit,
                "private": False,
                "gated": "manual" if gated else False,
                "disabled": False,
                "tags": [],
                "siblings": siblings,
            }
        )

    def _tree(self, org: str, name: str, revision: str, under: str) -> None:
        found = self._repo(org, name, revision)
        if found is None:
            return
        folder, _ = found
        entries = [
            self._entry(folder, p, blobs=True, tree=True)
            for p in self.server_hub.files(folder)
            if str(p.relative_to(folder)).startswith(under)
        ]
        self._json(entries)

    def _resolve(self, org: str, name: str, revision: str, filename: str) -> None:
        found = self._repo(org, name, revision)
        if found is None:
            return
        folder, commit = found
        path = folder / filename
        if ".." in Path(filename).parts or not path.is_file():
            self._error(404, "EntryNotFound", f"{filename} does not exist at {revision}")
            return
        size, etag = path.stat().st_size, self.server_hub.etag(path)
        headers = {
            "X-Repo-Commit": commit,
            "ETag": f'"{etag}"',
            "X-Linked-Etag": f'"{etag}"',
            "X-Linked-Size": str(size),
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if self.command == "HEAD":
            self.send_response(200)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            return
        start, status = 0, 200
        if m := _RANGE.match(self.headers.get("Range", "")):
            start, status = int(m.group(1)), 206
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        self._body(path, start, status, headers, filename)

    def _body(self, path: Path, start: int, status: int, headers: dict, filename: str) -> None:
        hub = self.server_hub
        data = path.read_bytes()[start:]
        fault = hub.faults.get(filename)
        cut = fault == "cut_always" or (fault == "cut_once" and filename not in hub._cut)
        if fault == "short":
            self._send(status, data[: len(data) // 2], headers)
            return
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if cut:
            hub._cut.add(filename)
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        step = 1 << 16 if fault == "slow" else len(data) or 1
        for offset in range(0, len(data), step):
            self.wfile.write(data[offset : offset + step])
            if fault == "slow":
                time.sleep(hub.slow_pause_s)

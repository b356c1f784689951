"""`parity serve`: the learners' page (ts_model/web/) and one fixture's files, on 127.0.0.1.

The page is bundled once at start (`run-browser.mts build`, esbuild) into a temporary directory.
The server (the standard library's http.server) answers a fixed table of URL paths, each mapped to
bytes held in memory: the page's three files and, under /fixture/, manifest.json and the files the
manifest lists. What it leaks is bounded by three rules:
- every file is read once, at start, and checked against the manifest's sha256 (the manifest
  against the one load_fixture validated and sealed); nothing is read from disk per request, so a
  file or symlink changed after start changes nothing served;
- a fixture file that is a symlink resolving outside the fixture directory is refused at start;
- only its own origin is answered: a `Host` other than `127.0.0.1:PORT` or `localhost:PORT` gets
  421 and nothing of the fixture (a DNS-rebinding page asks with its own host name).
A URL path is looked up in the table, never joined to a directory, so traversal forms are 404.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from parity_harness._backends.browser import driver as browser
from parity_harness._core.errors import BackendUnavailable, FixtureError, ParityError
from parity_harness._core.strict_json import StrictJSONError, loads_strict
from parity_harness._fixture.fixture import MANIFEST, load_fixture

PAGE_FILES = ("index.html", "main.js", "style.css")
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
}
REQUEST_TIMEOUT = 10.0  # seconds a connection may idle before the server drops it


@dataclass(frozen=True)
class Route:
    """One URL path's answer, read at start."""

    body: bytes
    content_type: str


def read_contained(path: Path, root: Path) -> bytes:
    """The bytes of `path`, a regular file whose real path is inside `root`; FixtureError otherwise."""
    real_root = root.resolve()
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise FixtureError(f"{path}: cannot resolve ({getattr(exc, 'strerror', None) or exc})") from None
    if not real.is_relative_to(real_root):
        raise FixtureError(f"{path}: a symlink to {real}, outside the fixture directory {real_root}; "
                           "parity serve does not follow links out of the fixture")
    try:  # O_NOFOLLOW: the resolved name must still not be a link when opened
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise FixtureError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise FixtureError(f"{path}: not a regular file")
        return f.read()


def _route(name: str, body: bytes) -> Route:
    return Route(body, CONTENT_TYPES.get(Path(name).suffix, "application/octet-stream"))


def fixture_routes(fixture_dir: Path) -> dict[str, Route]:
    """/fixture/NAME -> bytes: the manifest and the files it lists, read once and verified in memory."""
    fixture = load_fixture(fixture_dir)  # FixtureError (exit 2) for a broken fixture, before serving it
    root = fixture.root
    table: dict[str, Route] = {}
    manifest_bytes = read_contained(fixture.manifest_path, root)
    try:
        same = loads_strict(manifest_bytes.decode("utf-8")) == fixture.manifest
    except (UnicodeDecodeError, StrictJSONError):
        same = False
    if not same:  # changed between load_fixture's read and ours
        raise FixtureError(f"{fixture.manifest_path}: changed while parity serve was reading it; start again")
    table[f"/fixture/{MANIFEST}"] = _route(MANIFEST, manifest_bytes)
    for name, digest in fixture.manifest["sha256"].items():
        path = root / name  # a plain name: load_fixture checked it
        body = read_contained(path, root)
        actual = hashlib.sha256(body).hexdigest()
        if actual != digest:
            raise FixtureError(f"{path}: sha256 mismatch (manifest {str(digest)[:12]}..., file {actual[:12]}...); "
                               "the file changed since the manifest was written")
        table[f"/fixture/{name}"] = _route(name, body)
    return table


def page_routes(page_dir: Path) -> dict[str, Route]:
    """/NAME -> bytes: the bundled page (`/` is index.html), read once."""
    table = {f"/{name}": _route(name, read_contained(page_dir / name, page_dir)) for name in PAGE_FILES}
    table["/"] = table["/index.html"]
    return table


def routes(page_dir: Path, fixture_dir: Path) -> dict[str, Route]:
    """The whole table: the page (already built in `page_dir`) and the fixture (checked first)."""
    fixture = fixture_routes(fixture_dir)
    return {**page_routes(page_dir), **fixture}


def make_server(table: dict[str, Route], port: int) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:`port` (0: any free port) answering exactly the paths of `table`, to its own origin."""
    origins: set[str] = set()  # filled once the port is bound

    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT  # an idle or slow connection is dropped, not held

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            host = self.headers.get_all("Host") or []
            if len(host) != 1 or host[0].strip().lower() not in origins:
                self.send_error(HTTPStatus.MISDIRECTED_REQUEST, "this server answers only its own origin")
                return
            # the request target as sent (http.server turns a leading "//" into "/"), looked up exactly:
            # no decoding, no joining, no host part
            words = self.requestline.split()
            route = table.get(words[1].partition("?")[0]) if len(words) == 3 else None
            if route is None:
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", route.content_type)
            self.send_header("Content-Length", str(len(route.body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(route.body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: one line at start says where the page is

    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as exc:
        raise ParityError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None
    bound = server.server_address[1]
    origins.update({f"127.0.0.1:{bound}", f"localhost:{bound}"})
    if bound == 80:  # a browser leaves the default port out of Host
        origins.update({"127.0.0.1", "localhost"})
    return server


@contextmanager
def serving(fixture_dir: Path, port: int = 0) -> Iterator[str]:
    """Build the page, serve it in a background thread, yield its URL; stop and clean up after."""
    fixture = fixture_routes(fixture_dir)  # a broken fixture is refused before the page is built
    with tempfile.TemporaryDirectory(prefix="parity-page-") as tmp:
        page_dir = Path(tmp)
        build_page(page_dir)
        server = make_server({**page_routes(page_dir), **fixture}, port)
    thread = threading.Thread(target=server.serve_forever, name="parity-serve", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def build_page(out_dir: Path) -> None:
    """Bundle ts_model/web/ (model.ts from PARITY_TS_DIR or ts_model/) into `out_dir`."""
    missing = browser.missing(need_browser=False)
    if missing:
        raise BackendUnavailable(f"parity serve needs {', '.join(missing)}; install with: {browser.INSTALL_HINT}")
    browser.run_driver("parity serve", ["build", str(out_dir)], str(out_dir))


def serve_forever(fixture_dir: Path, port: int) -> None:
    """`parity serve`: serve until interrupted (a stop by Ctrl-C is the normal end)."""
    with serving(fixture_dir, port) as url:
        try:  # the line inside: a Ctrl-C right after it is printed (before the wait) is a stop too, not exit 130
            print(f"parity: serving the page for {fixture_dir} at {url} (Ctrl-C to stop)", flush=True)
            threading.Event().wait()
        except KeyboardInterrupt:
            print("parity: stopped", file=sys.stderr)

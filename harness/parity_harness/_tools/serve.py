"""`parity serve`: the learners' page (ts_model/web/) and one fixture's files, on 127.0.0.1.

The page is live (`LivePage`): bundled at start (`run-browser.mts build`, esbuild) into a temporary
directory and held in memory, then bundled again whenever its sources changed: on each request for
a page file, the sources (`model.ts` and the rest of PARITY_TS_DIR's or ts_model/'s model/, web/ and
browser/) are hashed, and a hash unlike the last build's rebuilds the page first. A learner who
edits model.ts and reloads sees the edited model's verdict; a model that no longer bundles gives a
page whose verdict is ERROR, naming the bundler's error, until it does again.
The server (the standard library's http.server) answers a fixed table of URL paths, each mapped to
bytes held in memory: the page's three files and, under /fixture/, manifest.json and the files the
manifest lists. What it leaks is bounded by three rules:
- every fixture file is read once, at start, and checked against the manifest's sha256 (the manifest
  against the one load_fixture validated and sealed); no fixture file is read from disk per request,
  so a file or symlink changed after start changes nothing served;
- a fixture file that is a symlink resolving outside the fixture directory is refused at start;
- only its own origin is answered: a `Host` other than `127.0.0.1:PORT` or `localhost:PORT` gets
  421 and nothing of the fixture (a DNS-rebinding page asks with its own host name).
A URL path is looked up in the table, never joined to a directory, so traversal forms are 404.
"""

from __future__ import annotations

import hashlib
import html
import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
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


PAGE_PATHS = frozenset({"/", *(f"/{name}" for name in PAGE_FILES)})
ERROR_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <link rel="icon" href="data:,">
  <link rel="stylesheet" href="style.css">
  <title>parity: the page does not build</title>
</head>
<body>
  <h1>parity in your browser</h1>
  <p id="verdict" class="verdict" data-verdict="ERROR">ERROR: the model changed and the page does not build: {error}</p>
  <p>Fix it and reload this page: <code>parity serve</code> builds the page again whenever
    <code>model.ts</code> (or another file of the page) changes.</p>
</body>
</html>
"""


def page_sources(override: str | None) -> list[Path]:
    """The files the page is bundled from: ts_model/'s web/, browser/ and model/, and `override`'s model/
    (PARITY_TS_DIR)."""
    ts_dir = browser.DRIVER.parent.parent
    dirs = [ts_dir / "web", ts_dir / "browser", ts_dir / "model"]
    if override:
        dirs.append(Path(override) / "model")
    return sorted(p for d in dirs if d.is_dir() for p in d.iterdir() if p.is_file())


def sources_hash(files: list[Path]) -> str:
    """One sha256 over the files' names and contents (an unreadable file counts as changed, not as an error)."""
    digest = hashlib.sha256()
    for path in files:
        try:
            body = path.read_bytes()
        except OSError as exc:
            body = f"unreadable: {exc}".encode()
        digest.update(f"{path}\0{len(body)}\0".encode() + body)
    return digest.hexdigest()


class LivePage:
    """The learners' page, bundled again when its sources change (checked on each request for a page file).

    The first build happens here: a failure is the caller's (exit 2, as before). A later failure is an
    error page (the verdict ERROR, the bundler's one line) until the sources change again; each rebuild
    says one line on stderr. The model is PARITY_TS_DIR's as it was when the page was made: a later
    change of the variable (a test serving two models from one process) does not switch the page.
    """

    def __init__(self, build: Callable[[Path], None] | None = None) -> None:
        self._build = build or build_page
        self._lock = threading.Lock()
        self._ts_dir = os.environ.get("PARITY_TS_DIR") or None
        self._stamp = sources_hash(page_sources(self._ts_dir))
        self._routes = self._bundle()

    def _bundle(self) -> dict[str, Route]:
        with tempfile.TemporaryDirectory(prefix="parity-page-") as tmp, _ts_dir_set(self._ts_dir):
            self._build(Path(tmp))
            return page_routes(Path(tmp))

    def route(self, path: str) -> Route | None:
        """The page file at `path` (`/`, `/index.html`, `/main.js`, `/style.css`), rebuilt first if its sources
        changed."""
        with self._lock:
            stamp = sources_hash(page_sources(self._ts_dir))
            if stamp != self._stamp:
                self._stamp = stamp
                started = time.monotonic()
                try:
                    self._routes = self._bundle()
                except ParityError as exc:
                    error = html.escape(str(exc))
                    page = _route("index.html", ERROR_PAGE.replace("{error}", error).encode())
                    self._routes = {**self._routes, "/": page, "/index.html": page}
                    print(f"parity: the page's sources changed and do not build: {exc}", file=sys.stderr, flush=True)
                else:
                    print(f"parity: the page's sources changed; built it again ({time.monotonic() - started:.1f} s)",
                          file=sys.stderr, flush=True)
            return self._routes.get(path)


_ENV_LOCK = threading.Lock()


@contextmanager
def _ts_dir_set(ts_dir: str | None) -> Iterator[None]:
    """PARITY_TS_DIR as `ts_dir` (None: unset) while the bundler runs (it reads the variable); as it was after.

    `parity serve` never changes the variable, so this changes nothing there; a process serving pages of two
    models (tests/backends/test_browser.py) gets each page's own."""
    with _ENV_LOCK:
        before = os.environ.get("PARITY_TS_DIR")
        if before == ts_dir:
            yield
            return
        if ts_dir is None:
            del os.environ["PARITY_TS_DIR"]
        else:
            os.environ["PARITY_TS_DIR"] = ts_dir
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("PARITY_TS_DIR", None)
            else:
                os.environ["PARITY_TS_DIR"] = before


def routes(page_dir: Path, fixture_dir: Path) -> dict[str, Route]:
    """The whole table: the page (already built in `page_dir`) and the fixture (checked first)."""
    fixture = fixture_routes(fixture_dir)
    return {**page_routes(page_dir), **fixture}


def make_server(table: Mapping[str, Route], port: int, page: LivePage | None = None) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:`port` (0: any free port) answering exactly the paths of `table`, to its own origin;
    with `page`, the page's paths come from it (rebuilt when its sources change)."""
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
            target = words[1].partition("?")[0] if len(words) == 3 else None
            if target is None:
                route = None
            elif page is not None and target in PAGE_PATHS:
                route = page.route(target)
            else:
                route = table.get(target)
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
    """Build the page, serve it (rebuilt when its sources change) in a background thread, yield its URL; stop and
    clean up after."""
    fixture = fixture_routes(fixture_dir)  # a broken fixture is refused before the page is built
    server = make_server(fixture, port, LivePage())
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

"""`parity serve`: the learners' page (ts_model/web/) and one fixture's files, on 127.0.0.1.

The page is bundled once at start (`run-browser.mts build`, esbuild) into a temporary directory.
The server (the standard library's http.server) answers a fixed table of URL paths, each mapped to
one file: the page's three files and, under /fixture/, manifest.json and the files the manifest
lists. A URL is looked up in that table, never joined to a directory, so nothing else can be read.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from harness import browser
from harness.errors import BackendUnavailable, ParityError
from harness.fixture import MANIFEST, load_fixture

PAGE_FILES = ("index.html", "main.js", "style.css")
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
}


def build_page(out_dir: Path) -> None:
    """Bundle ts_model/web/ (model.ts from PARITY_TS_DIR or ts_model/) into `out_dir`."""
    missing = browser.missing(need_browser=False)
    if missing:
        raise BackendUnavailable(f"parity serve needs {', '.join(missing)}; install with: {browser.INSTALL_HINT}")
    browser.run_driver("parity serve", ["build", str(out_dir)], str(out_dir))


def routes(page_dir: Path, fixture_dir: Path) -> dict[str, Path]:
    """URL path -> file: the page, and the fixture's manifest and listed files (checked by load_fixture)."""
    fixture = load_fixture(fixture_dir)  # FixtureError (exit 2) for a broken fixture, before serving it
    table = {f"/{name}": page_dir / name for name in PAGE_FILES}
    table["/"] = page_dir / "index.html"
    for name in [MANIFEST, *fixture.manifest["sha256"]]:
        table[f"/fixture/{name}"] = fixture.root / name
    return table


def make_server(table: dict[str, Path], port: int) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:`port` (0: any free port) answering exactly the paths of `table`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            path = table.get(urlsplit(self.path).path)
            if path is None or not path.is_file():
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            data = path.read_bytes()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", CONTENT_TYPES.get(path.suffix, "application/octet-stream"))
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: one line at start says where the page is

    try:
        return ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as exc:
        raise ParityError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None


@contextmanager
def serving(fixture_dir: Path, port: int = 0) -> Iterator[str]:
    """Build the page, serve it in a background thread, yield its URL; stop and clean up after."""
    with tempfile.TemporaryDirectory(prefix="parity-page-") as tmp:
        page_dir = Path(tmp)
        table = routes(page_dir, fixture_dir)
        build_page(page_dir)
        server = make_server(table, port)
        thread = threading.Thread(target=server.serve_forever, name="parity-serve", daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)


def serve_forever(fixture_dir: Path, port: int) -> int:
    """`parity serve`: serve until interrupted."""
    with serving(fixture_dir, port) as url:
        print(f"parity: serving the page for {fixture_dir} at {url} (Ctrl-C to stop)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("parity: stopped", file=sys.stderr)
    return 0

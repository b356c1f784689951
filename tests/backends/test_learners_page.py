"""The learners' page as a learner uses it, in a real Chromium (issue 37, items 5 and 10).

- `parity serve` is live: a learner edits model.ts (the variance divided by d - 1) and reloads, and the page
  says FAIL at the tap the bug is in; a model that does not bundle is an ERROR page naming the error; the
  model fixed again is PASS again. One Chromium, one page, reloaded (ts_model/browser/probe-page.mts).
- On a 375 px phone the page is no wider than the screen, and no number in its tables breaks over two lines.

Each browser's profile lives under the test's own TMPDIR; afterwards no process may still mention it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from parity_harness._backends.browser import driver as browser
from parity_harness._backends.node.runtime import find_node
from parity_harness._tools.mutants import by_name
from tests.helpers import REPO

PROBE = REPO / "ts_model" / "browser" / "probe-page.mts"
WATCHDOG_S = 240  # a hang guard for a whole test on a loaded machine, not a timing claim
PHONE = 375  # px: an iPhone's CSS width


@pytest.fixture
def browser_tmp(tmp_path: Path) -> Iterator[Path]:
    """TMPDIR for the test's processes (Chromium's profile goes there); afterwards none of them may still run."""
    missing = browser.missing()
    if missing:
        pytest.skip(f"the learners' page test needs {', '.join(missing)}: {browser.INSTALL_HINT}")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    yield tmp
    deadline = time.monotonic() + 30
    while (left := processes_mentioning(str(tmp))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left running: {left}"


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes (Linux /proc) that contain `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(cmdline.strip())
    return found


@contextmanager
def group_watchdog(proc: subprocess.Popen[str]) -> Iterator[None]:
    """Kill `proc`'s process group (it runs in its own) if the block takes longer than WATCHDOG_S."""
    timer = threading.Timer(WATCHDOG_S, lambda: _kill_group(proc))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _kill_group(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@contextmanager
def parity_serve(env: dict[str, str]) -> Iterator[tuple[str, list[str]]]:
    """`parity serve --port 0` on the toy as a user runs it; its URL, and (filled after Ctrl-C) its stderr lines."""
    proc = subprocess.Popen([sys.executable, "-m", "parity_harness", "serve", "--port", "0"], cwd=REPO,
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    stderr: list[str] = []
    with group_watchdog(proc):
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # "parity: serving the page for ... at http://127.0.0.1:PORT/ ..."
            assert " at http://127.0.0.1:" in line, line + (proc.communicate()[1] if proc.poll() is not None else "")
            yield line.split(" at ", 1)[1].split()[0], stderr
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=60)
            stderr.extend(err.splitlines())
            assert proc.returncode == 0, err
        finally:
            _kill_group(proc)
            proc.wait(timeout=60)


class Probe:
    """ts_model/browser/probe-page.mts on one URL: one JSON line per load of the page."""

    def __init__(self, url: str, width: int, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([find_node(), str(PROBE), url, "--width", str(width)], cwd=REPO,
                                     env={**os.environ, "PARITY_BROWSER_TIMEOUT": "180", **env},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)

    def seen(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=60)
            raise AssertionError(f"probe-page.mts ended (exit {self.proc.returncode}): "
                                 f"{self.proc.stderr.read() if self.proc.stderr else ''}")
        result: dict[str, Any] = json.loads(line)
        return result

    def reload(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("reload\n")
        self.proc.stdin.flush()
        return self.seen()

    def close(self) -> None:
        try:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.close()
            self.proc.wait(timeout=60)
        finally:
            _kill_group(self.proc)


@contextmanager
def probe(url: str, width: int, env: dict[str, str]) -> Iterator[Probe]:
    p = Probe(url, width, env)
    with group_watchdog(p.proc):
        try:
            yield p
        finally:
            p.close()


def test_an_edit_to_model_ts_shows_on_reload(browser_tmp: Path, tmp_path: Path) -> None:
    ts_dir = tmp_path / "ts_model"
    shutil.copytree(REPO / "ts_model", ts_dir, ignore=shutil.ignore_patterns("tests", "node_modules"))
    model = ts_dir / "model" / "model.ts"
    original = model.read_text(encoding="utf-8")
    [bug] = by_name(["ts-ln-unbiased-variance"])  # LayerNorm's variance divided by d - 1
    env = {"TMPDIR": str(browser_tmp), "PARITY_TS_DIR": str(ts_dir)}
    with parity_serve(env) as (url, serve_log), probe(url, 1000, env) as page:
        first = page.seen()
        assert first["verdict"] == "PASS", first

        bug.patch_file(ts_dir)
        assert model.read_text(encoding="utf-8") != original
        edited = page.reload()
        assert edited["verdict"] == "FAIL", edited
        assert edited["tap"] == bug.expected_tap == "blocks.0.ln1.hook_scale", edited
        assert f"first divergence at {bug.expected_tap}" in edited["text"]

        model.write_text(original + "\nexport const broken = ;\n", encoding="utf-8")
        broken = page.reload()
        assert broken["verdict"] == "ERROR", broken
        assert "does not build" in broken["text"] and "model.ts" in broken["text"], broken

        model.write_text(original, encoding="utf-8")
        fixed = page.reload()
        assert fixed["verdict"] == "PASS", fixed
    rebuilt = [line for line in serve_log if "sources changed" in line]
    assert len(rebuilt) == 3 and "do not build" in rebuilt[1], serve_log


def test_the_page_fits_a_375_px_phone(browser_tmp: Path) -> None:
    env = {"TMPDIR": str(browser_tmp)}
    with parity_serve(env) as (url, _log), probe(url, PHONE, env) as page:
        seen = page.seen()
    assert seen["verdict"] == "PASS", seen
    assert seen["scrollWidth"] <= PHONE, f"the page is {seen['scrollWidth']} px wide on a {PHONE} px screen"
    assert seen["width"] == PHONE, seen  # the layout viewport: a page wider than the screen widens it
    assert seen["numbers"] >= 86, seen  # the taps table's numbers (43 taps x 2 tiers) were measured
    assert seen["wrapped"] == [], f"numbers broken over two lines: {seen['wrapped']}"


def test_unit_the_live_page_is_built_again_only_when_a_source_changed(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """LivePage with a stand-in bundler (no Node): one build at start, one per change, an ERROR page on failure."""
    from parity_harness._core.errors import BackendFailed
    from parity_harness._tools.serve import LivePage

    (tmp_path / "ts" / "model").mkdir(parents=True)
    model = tmp_path / "ts" / "model" / "model.ts"
    model.write_text("export const version = 1;\n")
    monkeypatch.setenv("PARITY_TS_DIR", str(tmp_path / "ts"))
    builds: list[str] = []

    def build(out: Path) -> None:
        source = model.read_text()
        if "broken" in source:
            raise BackendFailed("parity serve: esbuild cannot bundle main.ts: model.ts:1: <unexpected> token")
        builds.append(source)
        for name in ("index.html", "main.js", "style.css"):
            (out / name).write_text(f"{name} of {source}")

    page = LivePage(build)
    assert len(builds) == 1
    first = page.route("/main.js")
    assert first is not None and b"version = 1" in first.body and page.route("/main.js") == first
    assert len(builds) == 1  # unchanged sources: no second build
    model.write_text("export const version = 2;\n")
    second = page.route("/main.js")
    assert second is not None and b"version = 2" in second.body and len(builds) == 2
    model.write_text("broken\n")
    error = page.route("/")
    assert error is not None and b'data-verdict="ERROR"' in error.body and b"&lt;unexpected&gt;" in error.body
    assert page.route("/index.html") == error and len(builds) == 2
    model.write_text("export const version = 3;\n")
    fixed = page.route("/")
    assert fixed is not None and b"version = 3" in fixed.body and len(builds) == 3

"""The browser backends and the learners' page, in a real headless Chrome (issue 17).

Every browser started here gets its profile under one session directory (TMPDIR), so the last
check can see that no Chrome was left running. One browser launch serves both page checks.
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
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from parity_harness._backends.browser import driver as browser
from parity_harness._backends.browser.typescript_browser_backend import TypeScriptBrowserBackend
from parity_harness._backends.node.runtime import find_node
from parity_harness._core.errors import FixtureError
from parity_harness._tools.mutants import Mutant, by_name
from parity_harness._tools.serve import make_server, routes, serving
from tests.helpers import REPO, run_cli

T = TypeVar("T")

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

BACKENDS = "typescript-browser,onnxruntime-web,onnxruntime-webgpu"  # onnxruntime-web-optimized: in test_parity_full.py
MUTANTS = ["ts-no-causal-mask", "ts-erf-polynomial"]  # both tiers fail / only the fp64 tier fails


@pytest.fixture(scope="module")
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """TMPDIR for every browser run of this module; afterwards no process may still refer to it."""
    missing = browser.missing(("onnxruntime-web",))
    if missing:
        pytest.skip(f"the browser backends need {', '.join(missing)}: {browser.INSTALL_HINT}")
    tmp = tmp_path_factory.mktemp("browser")
    yield tmp
    deadline = time.monotonic() + 30  # a bound on "eventually", not a timing claim
    while (left := processes_mentioning(str(tmp))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"browser processes left running: {left}"


def processes_mentioning(text: str, tmpdir: Path | None = None) -> list[str]:
    """Command lines of live processes that contain `text` (Linux /proc); with `tmpdir`, only those whose
    environment has TMPDIR=tmpdir: this test's own, not a browser run another xdist worker has going."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if tmpdir is not None and f"TMPDIR={tmpdir}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline[:120]}")
    return found


def mutant_dir(mutant: Mutant, root: Path) -> Path:
    dst = root / mutant.name
    if not dst.exists():
        shutil.copytree(REPO / "ts_model", dst, ignore=shutil.ignore_patterns("tests"))
        mutant.patch_file(dst)
    return dst


def env(tmp: Path, **extra: str) -> dict[str, str]:
    return {"TMPDIR": str(tmp), **extra}


def browser_profiles_seen_while(run: Callable[[], T], marker: str) -> tuple[T, set[str]]:
    """`run()`, and every browser profile directory (`--user-data-dir=...` containing `marker`) seen meanwhile."""
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for entry in Path("/proc").iterdir():
                try:
                    args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                except OSError:
                    continue
                seen.update(a.split("=", 1)[1] for a in args if a.startswith("--user-data-dir=") and marker in a)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        proc = run()
    finally:
        done.set()
        watcher.join()
    return proc, seen


def test_browser_backends_pass_on_the_toy_in_one_browser(toy_dir: Path, session_tmp: Path) -> None:
    out = session_tmp / "pass.json"
    proc, profiles = browser_profiles_seen_while(
        lambda: run_cli("run", "--fixture", str(toy_dir), "--backends", BACKENDS, "--json", str(out),
                        env=env(session_tmp)),
        str(session_tmp / "parity-chrome-"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert len(profiles) == 1, f"one Chromium for every browser backend of a run, saw {sorted(profiles)}"
    report = json.loads(out.read_text())
    ran = {(r["backend"], r["precision"]) for r in report["runs"] if r["status"] == "ran"}
    assert ran == {("typescript-browser", "fp64"), ("onnxruntime-web", "fp32"), ("onnxruntime-webgpu", "fp32")}
    checked = {(r["backend"], r["golden"]) for r in report["results"] if r["passed"] is True}
    assert ("typescript-browser", "fp64") in checked and ("typescript-browser", "fp32") in checked
    assert ("onnxruntime-webgpu", "fp32") in checked
    # WebGPU ran on an adapter (which one depends on the machine), the position table on the CPU provider.
    notes = [ln for ln in proc.stderr.splitlines() if ln.startswith("parity: onnxruntime-webgpu: WebGPU adapter ")]
    assert len(notes) == 1 and "the 18 nodes of the float64 position table" in notes[0], proc.stderr


def test_a_run_in_this_process_closes_its_browser_session_when_it_ends(toy_dir: Path, session_tmp: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The session (one driver, one Chromium) lives for one run: gone when `api.run` returns, pass or fail."""
    from parity_harness import api

    monkeypatch.setenv("TMPDIR", str(session_tmp))
    report, profiles = browser_profiles_seen_while(
        lambda: api.run(["typescript-browser", "onnxruntime-web-optimized"], toy_dir, decoding=False),
        str(session_tmp / "parity-chrome-"))
    assert report and len(profiles) == 1
    assert browser._session is None
    assert not processes_mentioning(str(browser.DRIVER), session_tmp)
    assert not processes_mentioning(str(session_tmp / "parity-chrome-"))


@pytest.mark.parametrize("name", MUTANTS)
def test_a_planted_bug_fails_first_at_the_same_tap_in_the_browser_and_in_node(
    name: str, toy_dir: Path, session_tmp: Path
) -> None:
    [mutant] = by_name([name])
    out = session_tmp / f"{name}.json"
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "typescript,typescript-browser",
                   "--json", str(out), "-q", env=env(session_tmp, PARITY_TS_DIR=str(mutant_dir(mutant, session_tmp))))
    assert proc.returncode == 1, proc.stderr
    divergences = json.loads(out.read_text())["first_divergence"]
    node = {(d["golden"], d["tap"]) for d in divergences["typescript"]}
    web = {(d["golden"], d["tap"]) for d in divergences["typescript-browser"]}
    assert web == node
    assert {tap for _, tap in web} == {mutant.expected_tap}
    assert {golden for golden, _ in web} == ({"fp64"} if mutant.fp64_only else {"fp64", "fp32"})


def run_in_own_group(args: list[str], timeout: float = 120) -> tuple[int, str, str]:
    """Run a command in its own process group; on a timeout the whole group (the browser too) is killed."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, stdout, stderr


@pytest.fixture(scope="module")
def page_verdicts(toy_dir: Path, session_tmp: Path) -> dict[str, dict[str, str]]:
    """The learners' page for the toy and for a planted bug, checked in one browser launch."""
    [mutant] = by_name(["ts-no-causal-mask"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(session_tmp))
        with serving(toy_dir) as good:
            mp.setenv("PARITY_TS_DIR", str(mutant_dir(mutant, session_tmp)))
            with serving(toy_dir) as bad:
                mp.delenv("PARITY_TS_DIR")
                code, stdout, stderr = run_in_own_group([find_node(), str(browser.DRIVER), "page", good, bad])
    assert code == 0, stderr
    lines = [json.loads(line) for line in stdout.splitlines()]
    return {"good": lines[0], "bad": lines[1]}


def test_the_page_says_pass_on_the_toy(page_verdicts: dict[str, dict[str, str]]) -> None:
    verdict = page_verdicts["good"]
    assert verdict["verdict"] == "PASS", verdict
    assert verdict["text"].startswith("PASS: all 86 checks agree")


def test_the_page_says_fail_at_the_planted_bugs_tap(page_verdicts: dict[str, dict[str, str]]) -> None:
    verdict = page_verdicts["bad"]
    assert verdict["verdict"] == "FAIL", verdict
    assert verdict["tap"] == by_name(["ts-no-causal-mask"])[0].expected_tap
    assert f"first divergence at {verdict['tap']}" in verdict["text"]


def test_the_webgpu_probe_prints_one_json_line_with_the_flags_it_used(session_tmp: Path) -> None:
    """`run-browser.mts webgpu` answers on any machine (an adapter or null: not asserted, it depends on the
    machine), with --enable-unsafe-webgpu unless told not to, and never with --disable-gpu."""
    answers = {}
    for extra in ([], ["--no-unsafe-webgpu"]):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TMPDIR", str(session_tmp))
            code, stdout, stderr = run_in_own_group([find_node(), str(browser.DRIVER), "webgpu", *extra])
        assert code == 0, stderr
        [line] = stdout.splitlines()
        answers[bool(extra)] = json.loads(line)
    for answer in answers.values():
        assert {"userAgent", "navigatorGpu", "browserFlags", "console"} <= set(answer), answer
        assert answer["navigatorGpu"] is False or {"adapter", "fallbackAdapter"} <= set(answer), answer
        assert "--disable-gpu" not in answer["browserFlags"]
    assert "--enable-unsafe-webgpu" in answers[False]["browserFlags"]
    assert "--enable-unsafe-webgpu" not in answers[True]["browserFlags"]


def test_serve_answers_only_the_page_and_the_fixture_files(toy_dir: Path, tmp_path: Path) -> None:
    for name in ("index.html", "main.js", "style.css"):
        (tmp_path / name).write_text(name)
    server = make_server(routes(tmp_path, toy_dir), 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(base + path, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        assert status("/") == 200 and status("/fixture/manifest.json") == 200
        assert status("/fixture/model.onnx") == 200
        for path in ("/fixture/../pyproject.toml", "/fixture/%2e%2e/pyproject.toml", "/pyproject.toml",
                     "/fixture/", "/fixture/manifest.json/..", "/..%2f..%2fetc/passwd"):
            assert status(path) == 404, path
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_serve_refuses_a_broken_fixture(fixture_copy: Path, tmp_path: Path) -> None:
    (fixture_copy / "weights.safetensors").write_bytes(b"changed")
    with pytest.raises(FixtureError, match="sha256 mismatch"):
        routes(tmp_path, fixture_copy)


# -- browser trouble: exit 2, one line, never a hang ------------------------------------------------

def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("parity: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return errors[0]


def fake_chrome(tmp: Path, body: str) -> Path:
    path = tmp / "fake-chrome"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_no_browser_is_exit_2_naming_parity_chrome(toy_dir: Path, session_tmp: Path) -> None:
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "typescript-browser",
                   env=env(session_tmp, PARITY_CHROME=str(session_tmp / "no-such-chrome")))
    assert "PARITY_CHROME=" in one_line_error(proc)


def test_missing_npm_packages_say_to_run_npm_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser, "package_dir", lambda name: None)
    monkeypatch.delenv("PARITY_CHROME", raising=False)
    missing = TypeScriptBrowserBackend().missing_dependencies()
    assert "node_modules/puppeteer-core" in missing and "node_modules/esbuild" in missing
    assert "npm ci" in TypeScriptBrowserBackend.install_hint


def test_a_browser_that_crashes_is_exit_2(toy_dir: Path, session_tmp: Path, tmp_path: Path) -> None:
    chrome = fake_chrome(tmp_path, 'echo "fake chrome: cannot open display" >&2; exit 3')
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "onnxruntime-web",
                   env=env(session_tmp, PARITY_CHROME=str(chrome)))
    line = one_line_error(proc)
    assert "exited with code 3" in line and "cannot open display" in line


def test_a_browser_that_hangs_is_a_timeout_and_is_killed(toy_dir: Path, session_tmp: Path, tmp_path: Path) -> None:
    marker = "31717"  # `sleep 31717`: findable among the processes afterwards
    chrome = fake_chrome(tmp_path, f"sleep {marker}")
    started = time.monotonic()
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "typescript-browser",
                   env=env(session_tmp, PARITY_CHROME=str(chrome), PARITY_BROWSER_TIMEOUT="1"), timeout=110)
    # Ended by the 1 s setting (+ the 15 s grace at most), not the default 120 s nor the fake's 31717 s: a
    # bound on which limit fired, generous for a loaded machine, not a claim about speed.
    assert time.monotonic() - started < 100
    assert "timed out after 1 s" in one_line_error(proc)
    time.sleep(0.2)
    assert not processes_mentioning(f"sleep {marker}")


def test_a_node_import_reached_from_the_page_is_exit_2(toy_dir: Path, session_tmp: Path, tmp_path: Path) -> None:
    """The bundle has no stand-ins for Node modules (the model needs none): a node: import cannot be bundled."""
    ts = tmp_path / "ts_model"
    shutil.copytree(REPO / "ts_model", ts, ignore=shutil.ignore_patterns("tests"))
    fixture_ts = ts / "model" / "fixture.ts"
    fixture_ts.write_text('import { readFileSync } from "node:fs";\nexport const probe = readFileSync;\n'
                          + fixture_ts.read_text())
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "typescript-browser",
                   env=env(session_tmp, PARITY_TS_DIR=str(ts)))
    line = one_line_error(proc)
    assert "node:fs imported by" in line and "fixture.ts" in line and "cannot import Node modules" in line, line


def test_an_error_on_the_pages_console_is_exit_2(toy_dir: Path, session_tmp: Path, tmp_path: Path) -> None:
    ts = tmp_path / "ts_model"
    shutil.copytree(REPO / "ts_model", ts, ignore=shutil.ignore_patterns("tests"))
    anchor = "export function runWithTaps(params: Params, config: GPTConfig, tokens: readonly number[]): Taps {\n"
    model = ts / "model" / "model.ts"
    source = model.read_text()
    assert source.count(anchor) == 1
    model.write_text(source.replace(anchor, anchor + '  console.error("planted console error");\n'))
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "typescript-browser",
                   env=env(session_tmp, PARITY_TS_DIR=str(ts)))
    assert "error on the page's console: planted console error" in one_line_error(proc)


def test_a_bad_timeout_setting_is_exit_2(toy_dir: Path, session_tmp: Path) -> None:
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "typescript-browser",
                   env=env(session_tmp, PARITY_BROWSER_TIMEOUT="soon"))
    assert "PARITY_BROWSER_TIMEOUT='soon'" in one_line_error(proc)


def test_killing_parity_mid_run_takes_the_browser_with_it(toy_dir: Path, session_tmp: Path, tmp_path: Path) -> None:
    marker = "31718"
    chrome = fake_chrome(tmp_path, f"sleep {marker}")
    parity = subprocess.Popen(
        [sys.executable, "-m", "parity_harness", "run", "--fixture", str(toy_dir), "--backends", "typescript-browser"],
        env={**os.environ, **env(session_tmp, PARITY_CHROME=str(chrome), PARITY_BROWSER_TIMEOUT="60")},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 120  # a bound on "eventually" (start-up on a loaded machine), not a timing claim
        while not processes_mentioning(f"sleep {marker}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_mentioning(f"sleep {marker}"), "the fake browser never started"
    finally:
        parity.kill()  # no cleanup on the Python side: the driver must notice on its own
        parity.wait(timeout=10)
    deadline = time.monotonic() + 30  # "eventually", generous for a loaded machine: the driver polls every 0.5 s
    while processes_mentioning(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_mentioning(f"sleep {marker}")
    assert not processes_mentioning(str(browser.DRIVER), session_tmp)

"""A browser or Node process killed by a signal is restarted once, and says so (issue 36, finding 15).

The packaged Chromium was once killed by SIGSEGV on a loaded machine and the run ended with exit 2: a gate
that fails on infrastructure flakes gets ignored. Here a stand-in executable (PARITY_NODE, PARITY_CHROME)
kills itself with SIGSEGV on its first N starts and then runs the real one: one kill is a restart, the
backend run again, a `restarted:` line in the terminal report and an entry in the JSON report's `restarts`;
a second kill is exit 2, one line naming the signal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity_harness._backends.browser import driver
from parity_harness._backends.node.runtime import find_node
from parity_harness._core.errors import BackendUnavailable
from tests.helpers import REQUIRE_ALL

REPO = Path(__file__).resolve().parents[2]
PARITY = Path(sys.executable).with_name("parity")


def real_node() -> str:
    try:
        return find_node()
    except BackendUnavailable as exc:
        if REQUIRE_ALL:
            raise
        pytest.skip(str(exc))


def crashing(tmp_path: Path, name: str, real: str, crashes: int) -> Path:
    """An executable that kills itself with SIGSEGV on its first `crashes` starts, then execs `real`."""
    counter = tmp_path / f"{name}.starts"
    script = tmp_path / name
    script.write_text("#!/bin/sh\n"
                      f'n=$(cat "{counter}" 2>/dev/null || echo 0)\n'
                      f'echo $((n + 1)) > "{counter}"\n'
                      f'if [ "$n" -lt {crashes} ]; then kill -SEGV $$; fi\n'
                      f'exec "{real}" "$@"\n')
    script.chmod(0o755)
    return script


def run_parity(backend: str, report: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("PARITY_NODE", "PARITY_CHROME")}
    full.update(env)
    return subprocess.run([str(PARITY), "run", "--backends", backend, "--precision", "fp64", "-q",
                           "--json", str(report)], capture_output=True, text=True, env=full, cwd=REPO, timeout=300)


def assert_restarted_once(proc: subprocess.CompletedProcess[str], report: Path, backend: str, what: str) -> None:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    note = f"{backend}: {what} was killed by SIGSEGV; restarted once and run again"
    assert f"restarted: {note}" in proc.stdout, proc.stdout[-2000:]
    assert "PASS" in proc.stdout
    assert json.loads(report.read_text())["restarts"] == [note]


def assert_second_kill_is_exit_2(proc: subprocess.CompletedProcess[str], report: Path, backend: str) -> None:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("parity: error:")]
    assert len(errors) == 1 and backend in errors[0] and "SIGSEGV again after one restart" in errors[0], proc.stderr
    assert json.loads(report.read_text())["passed"] is False


def test_a_node_killed_once_is_restarted_and_said(tmp_path: Path) -> None:
    node = crashing(tmp_path, "node", real_node(), crashes=1)
    proc = run_parity("typescript", tmp_path / "r.json", {"PARITY_NODE": str(node)})
    assert_restarted_once(proc, tmp_path / "r.json", "typescript", "run.ts (Node)")
    assert (tmp_path / "node.starts").read_text().strip() == "3"  # killed, run.ts again, run-decode.ts


def test_a_node_killed_twice_is_exit_2_naming_the_signal(tmp_path: Path) -> None:
    node = crashing(tmp_path, "node", real_node(), crashes=2)
    proc = run_parity("typescript", tmp_path / "r.json", {"PARITY_NODE": str(node)})
    assert_second_kill_is_exit_2(proc, tmp_path / "r.json", "typescript")


def browser_ready() -> None:
    missing = driver.missing()
    if missing:
        if REQUIRE_ALL:
            pytest.fail(f"the browser backends cannot run: {missing}")
        pytest.skip(f"the browser backends cannot run: {missing}")


def test_a_browser_driver_killed_once_is_restarted_and_said(tmp_path: Path) -> None:
    browser_ready()
    node = crashing(tmp_path, "node", real_node(), crashes=1)
    proc = run_parity("typescript-browser", tmp_path / "r.json", {"PARITY_NODE": str(node)})
    assert_restarted_once(proc, tmp_path / "r.json", "typescript-browser", "run-browser.mts (Node)")


def packaged_chromium() -> Path:
    found = sorted(REPO.glob("node_modules/.cache/parity/chromium-*/chromium"))
    if not found:
        pytest.skip("the packaged Chromium is not unpacked (node_modules/.cache/parity/)")
    return found[-1]


def test_a_browser_killed_once_is_restarted_and_said(tmp_path: Path) -> None:
    browser_ready()
    chrome = crashing(tmp_path, "chromium", str(os.environ.get("PARITY_CHROME") or packaged_chromium()), crashes=1)
    proc = run_parity("typescript-browser", tmp_path / "r.json", {"PARITY_CHROME": str(chrome)})
    assert_restarted_once(proc, tmp_path / "r.json", "typescript-browser", "the browser")


def test_a_browser_killed_twice_is_exit_2_naming_the_signal(tmp_path: Path) -> None:
    browser_ready()
    chrome = crashing(tmp_path, "chromium", str(os.environ.get("PARITY_CHROME") or packaged_chromium()), crashes=2)
    proc = run_parity("typescript-browser", tmp_path / "r.json", {"PARITY_CHROME": str(chrome)})
    assert_second_kill_is_exit_2(proc, tmp_path / "r.json", "typescript-browser")

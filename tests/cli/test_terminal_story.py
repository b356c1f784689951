"""Progress on stderr (parity_harness/_cli/progress.py): one line rewritten on a terminal; elsewhere a line only for
work that lasts over a second; and the default terminal report of a passing run is short and ends with its fixture."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from parity_harness._cli.progress import CLEAR_LINE, ProgressLine
from parity_harness._core.sanitize import SafeStream
from tests.helpers import REPO, run_cli


def test_outside_a_terminal_work_under_a_second_prints_nothing() -> None:
    out = io.StringIO()
    say = ProgressLine(out, tty=False, quiet_for=0.3)
    for k in range(50):
        say(f"parity: numpy fp32: case {k}/50")
    say.close()
    time.sleep(0.5)
    assert out.getvalue() == ""


def test_outside_a_terminal_slow_work_prints_its_line_once() -> None:
    out = io.StringIO()
    say = ProgressLine(out, tty=False, quiet_for=0.1)
    say("parity: running typescript-browser (fp64) ...")
    deadline = time.monotonic() + 5
    while not out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)
    say("parity: running numpy (fp32) ...")
    say.close()
    assert out.getvalue() == "parity: running typescript-browser (fp64) ...\n"


def test_on_a_terminal_one_line_is_rewritten_and_cleared_at_the_end() -> None:
    out = io.StringIO()
    say = ProgressLine(SafeStream(out), tty=True)  # type: ignore[arg-type]
    say("parity: running numpy (fp32) ...")
    say("parity: running evil\x1b[2J (fp32) ...")  # a plugin's name: made safe, never executed
    say.close()
    text = out.getvalue()
    assert "\n" not in text and text.count(CLEAR_LINE) == 3 and text.endswith(CLEAR_LINE)
    assert "\x1b[2J" not in text and "running numpy" in text


def test_progress_survives_a_backend_that_swaps_sys_stderr(monkeypatch: object) -> None:
    """Bound when made: a backend silencing third-party prints (swapping sys.stderr) cannot swallow it."""
    out = io.StringIO()
    say = ProgressLine(out, tty=True)
    saved = sys.stderr
    sys.stderr = io.StringIO()
    try:
        say("parity: running transformerlens (fp64) ...")
    finally:
        sys.stderr = saved
    assert "transformerlens" in out.getvalue()


@pytest.mark.parametrize("full_run", ["toy"], indirect=True)
def test_a_passing_run_prints_under_40_lines_ending_with_its_fixture(
    full_run: tuple[Path, subprocess.CompletedProcess[str], Any],
) -> None:
    """The suite's one run of every built-in backend on the toy (tests/conftest.py `full_run`): its terminal report."""
    _, proc, _ = full_run
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) <= 40, proc.stdout
    assert lines[-1].startswith("PASS: ") and lines[-1].endswith("; fixture fixtures/toy")
    assert sum(1 for ln in lines if ln.startswith("typescript ") and " vs " in ln) == 2  # one line per tier
    assert not any(" OK    max_abs" in ln for ln in lines)  # no per-tap rows without -v


def test_a_failing_run_ends_with_the_first_divergence_and_a_verdict_naming_its_tap(tmp_path: Path) -> None:
    """LayerNorm's variance over d - 1 in model.ts: the paragraph (not 160 downstream rows) sits above the verdict."""
    import shutil

    ts = tmp_path / "ts"
    shutil.copytree(REPO / "ts_model", ts, ignore=shutil.ignore_patterns("node_modules"))
    model = ts / "model" / "model.ts"
    text = model.read_text()
    assert text.count("Math.sqrt(sq / d + eps)") == 1
    model.write_text(text.replace("Math.sqrt(sq / d + eps)", "Math.sqrt(sq / (d - 1) + eps)"))
    proc = run_cli("run", "--backends", "numpy,typescript", env={"PARITY_TS_DIR": str(ts)})
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("FAIL: disagreement in typescript ")
    assert ", first at blocks.0.ln1.hook_scale" in lines[-1]
    assert lines[-2] == "" and lines[-3].startswith("typescript fp64 vs ") and \
        "first divergence at blocks.0.ln1.hook_scale" in lines[-3]
    assert not any(" FAIL  max_abs" in ln for ln in lines)  # no per-tap rows without -v
    assert len(lines) <= 40, proc.stdout

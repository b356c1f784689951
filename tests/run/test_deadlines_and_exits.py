"""No hang outlives its deadline, and the process ends with its verdict (issue 36, findings 5, 6, 8 and 10).

The backends are tests/deadline_plugin's, found by `parity` through its entry points (the directory on
PYTHONPATH), and run in a subprocess as a user runs them: a backend past PARITY_BACKEND_TIMEOUT is stopped
whatever it catches or masks (one line naming it, exit 2, --json marked unusable); a thread a backend
leaves running does not keep `parity` alive after its verdict; an out-of-range PARITY_BACKEND_TIMEOUT is
one line naming the variable; a backend that closes or replaces sys.stdout/sys.stderr is named.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "tests" / "deadline_plugin"
PARITY = Path(sys.executable).with_name("parity")


def run_parity(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The venv's `parity ARGS` with the deadline plugin discoverable; fails the test if it does not end."""
    path = os.pathsep.join(p for p in (str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")) if p)
    full = {k: v for k, v in os.environ.items() if k != "PARITY_BACKEND_TIMEOUT"}  # only the test's own
    full.update({"PYTHONPATH": path, **(env or {})})
    try:
        return subprocess.run([str(PARITY), *args], capture_output=True, text=True, env=full, timeout=timeout,
                              cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail(f"parity {' '.join(args)} did not end within {timeout:g} s")


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("parity: error:")]


@pytest.mark.parametrize("backend", ["deadline-catch-all", "deadline-cancels-alarm"])
def test_a_backend_that_swallows_or_masks_the_deadline_is_stopped(backend: str, tmp_path: Path) -> None:
    """Finding 5: `except BaseException: continue` around the work, or SIGALRM cancelled and ignored, used to
    run forever; now the run ends GRACE_S after the deadline with one line naming the backend, exit 2."""
    report = tmp_path / "report.json"
    start = time.monotonic()
    proc = run_parity("run", "--backends", backend, "--precision", "fp64", "-q", "--json", str(report),
                      env={"PARITY_BACKEND_TIMEOUT": "0.1"}, timeout=30)
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1 and backend in lines[0] and "PARITY_BACKEND_TIMEOUT" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    marker = json.loads(report.read_text())
    assert marker["usable"] is False and marker["exit_code"] == 2 and backend in marker["error"]
    assert took < 20, took  # 12 cases x 0.1 s, the 2 s grace, and the start-up


def test_a_swallowed_deadline_in_process_is_still_stopped() -> None:
    """The guard itself: a call that catches the alarm's exception meets it again in the grace, and one that
    catches everything is ended by the watchdog (checked in a child, since it ends its process)."""
    code = (
        "import os, time\n"
        "os.environ['PARITY_BACKEND_TIMEOUT'] = '0.2'\n"
        "from parity_harness._backends.guard import call_backend\n"
        "def once():\n"
        "    try:\n"
        "        time.sleep(5)\n"
        "    except BaseException:\n"
        "        pass\n"
        "    time.sleep(5)\n"
        "try:\n"
        "    call_backend('twice', 'run', once)\n"
        "except Exception as exc:\n"
        "    print('raised:', exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "raised: backend 'twice' did not return from run within 0.2 s" in proc.stdout, proc.stdout + proc.stderr


def test_a_thread_a_backend_leaves_running_does_not_keep_parity_alive() -> None:
    """Finding 6: a non-daemon thread sleeping for an hour kept `parity` alive after PASS."""
    start = time.monotonic()
    proc = run_parity("run", "--backends", "deadline-leaves-thread", "--precision", "fp64", "-q", timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "PASS" in proc.stdout
    assert "left-behind" in proc.stderr  # the note names the thread not waited for
    assert time.monotonic() - start < 20


@pytest.mark.parametrize("value", ["1e300", "1e10", "inf"])
def test_an_out_of_range_backend_timeout_is_an_environment_error(value: str) -> None:
    """Finding 8: PARITY_BACKEND_TIMEOUT=1e300 overflowed setitimer and was blamed on the backend."""
    proc = run_parity("run", "--backends", "deadline-control", "--precision", "fp64", "-q",
                      env={"PARITY_BACKEND_TIMEOUT": value})
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1 and "PARITY_BACKEND_TIMEOUT" in lines[0], proc.stderr
    assert "deadline-control" not in lines[0] and "crashed" not in lines[0]


def test_the_largest_backend_timeout_is_accepted() -> None:
    """The bound refuses only what no timer can hold: 1e7 s (116 days) runs, and the control passes."""
    proc = run_parity("run", "--backends", "deadline-control", "--precision", "fp64", "-q",
                      env={"PARITY_BACKEND_TIMEOUT": "1e7"})
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("backend", "stream", "how"), [("deadline-closes-stdout", "sys.stdout", "closed"),
                                                        ("deadline-replaces-stderr", "sys.stderr", "replaced")])
def test_a_backend_that_breaks_the_streams_is_named(backend: str, stream: str, how: str, tmp_path: Path) -> None:
    """Finding 10: a backend that closed sys.stdout gave "internal error" naming no backend."""
    report = tmp_path / "report.json"
    proc = run_parity("run", "--backends", backend, "--precision", "fp64", "-q", "--json", str(report))
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert backend in lines[0] and f"{how} {stream}" in lines[0] and "run (fp64)" in lines[0]
    assert "internal error" not in proc.stderr
    assert json.loads(report.read_text())["usable"] is False


def start_and_terminate(backend: str, report: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """`parity run --backends BACKEND`, SIGTERM once its run has begun: (the process, seconds from the signal)."""
    path = os.pathsep.join(p for p in (str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")) if p)
    env = {k: v for k, v in os.environ.items() if k != "PARITY_BACKEND_TIMEOUT"}
    env["PYTHONPATH"] = path
    proc = subprocess.Popen([str(PARITY), "run", "--backends", backend, "--precision", "fp64", "--json", str(report)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    assert proc.stderr is not None
    seen = ""
    for line in proc.stderr:  # the progress line says the backend's code runs
        seen += line
        if f"running {backend}" in line:
            break
    time.sleep(0.3)
    proc.send_signal(15)
    start = time.monotonic()
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{backend}: parity did not end within 30 s of SIGTERM")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, seen + err), time.monotonic() - start


@pytest.mark.parametrize("backend", ["deadline-catch-all", "deadline-swallows-once"])
def test_an_interrupt_a_backend_swallows_still_ends_the_run(backend: str, tmp_path: Path) -> None:
    """Finding 5, SIGTERM: a catch-all loop ignored it (only SIGKILL ended the run), and a backend that swallowed
    it and returned let the run go on to a verdict. Now: exit 130, --json marked unusable."""
    report = tmp_path / "report.json"
    proc, took = start_and_terminate(backend, report)
    assert proc.returncode == 130, proc.stderr
    assert "interrupted" in proc.stderr and "PASS" not in proc.stdout
    assert json.loads(report.read_text())["usable"] is False
    assert took < 10, took


def test_an_interrupt_inside_the_stream_swap_waits_for_it_and_leaves_stderr_put_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """interrupts.interrupts_held: an interrupt that comes while quiet.silenced swaps stderr is raised once the swap is
    whole, inside the try that puts it back, so the command's `parity: interrupted` line reaches the real stderr."""
    import signal
    from collections.abc import Iterator

    from parity_harness._backends import guard, interrupts, quiet

    real = sys.stderr
    with pytest.raises(KeyboardInterrupt), interrupts.interrupts_held():
        guard._on_sigint(signal.SIGTERM, None)  # held: recorded, not raised here
        assert interrupts._pending is not None
    assert interrupts._pending is None

    @contextlib.contextmanager
    def interrupt_while_held() -> Iterator[None]:
        with interrupts.interrupts_held():
            guard._on_sigint(signal.SIGTERM, None)  # the signal lands while the streams are being swapped
            yield

    monkeypatch.setattr(quiet, "interrupts_held", interrupt_while_held)
    with pytest.raises(KeyboardInterrupt), quiet.silenced():
        raise AssertionError("the held interrupt is raised before the body runs")
    assert sys.stderr is real and quiet._depth == 0 and not quiet._fds  # put back whole

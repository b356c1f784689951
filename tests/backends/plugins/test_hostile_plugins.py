"""Hostile and buggy backend plugins (tests/hostile_plugin): none gets exit 0 with wrong numbers.

The plugin package is registered the way any plugin is, through an entry-point file
(`tests/hostile_plugin/parity_hostile_plugin-0.1.0.dist-info/entry_points.txt`); putting its
directory on PYTHONPATH for a `python -m parity_harness` subprocess makes `importlib.metadata` find it,
with nothing installed. Each case is one backend misbehaving in one way; the test checks the exit
code, exactly one `parity: error:` line on stderr naming the backend, no traceback, and no PASS.
The case ids start with their class (exit, decl, state, output); docs/security.md has the command
that counts them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import HOSTILE_PLUGIN_DIR as PLUGIN_DIR
from tests.helpers import REPO, assert_exit_2_one_line, run_all, run_hostile

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)


# (backend, words the one stderr line must hold)
EXIT = [
    ("exit-run-sys-exit-0", ("'exit-run-sys-exit-0'", "crashed in run (fp64)", "SystemExit")),
    ("exit-run-systemexit-text", ("crashed", "SystemExit: all good")),
    ("exit-run-keyboardinterrupt", ("crashed", "KeyboardInterrupt")),
    ("exit-run-generatorexit", ("crashed", "GeneratorExit")),
    ("exit-run-custom-baseexception", ("crashed", "Boom: boom")),
    ("exit-run-parityerror-exit-code-0", ("failed in run", "PassingError: everything agrees")),
    ("exit-run-multiline-error", ("first line", "fake second line")),
    ("exit-run-unprintable-error", ("crashed", "Unprintable", "could not be printed")),
    ("exit-init-raises", ("crashed in __init__", "RuntimeError: cannot start")),
    ("exit-init-sys-exit-0", ("crashed in __init__", "SystemExit")),
    ("exit-missing-dependencies-sys-exit-0", ("crashed in missing_dependencies", "SystemExit")),
    ("exit-supported-taps-sys-exit-0", ("crashed in supported_taps", "SystemExit")),
    ("exit-import-sys-exit-0", ("crashed in import", "exit_at_import", "SystemExit")),
    ("exit-import-raises-baseexception", ("crashed in import", "ImportBoom")),
]
DECL = [
    ("decl-unknown-precision", ("unknown precision 'fp8'",)),
    ("decl-no-precisions", ("non-empty subset",)),
    ("decl-only-unknown-taps", ("only unknown taps", "blocks.7.hook_nothing")),
    ("decl-some-unknown-taps", ("1 unknown tap(s)", "hook_extra")),
    ("decl-supported-taps-none", ("supported_taps returned None",)),
    ("decl-supported-taps-string", ("supported_taps returned 'logits'",)),
    ("decl-supported-taps-empty", ("supported_taps is empty",)),
    ("decl-requires-missing-dotted-module", ("needs no_such_package_for_parity.submodule",)),
    ("decl-name-mismatch", ("registered as 'decl-name-mismatch' calls itself 'decl-some-other-name'",)),
    ("decl-not-a-backend", ("not a parity_harness._backends.base.Backend subclass",)),
]
OUTPUT = [
    ("output-extra-case-of-nan", ("unknown case 'ghost'",)),
    ("output-undeclared-tap-of-nan", ("returned tap 'probs'", "does not declare")),
    ("output-python-lists", ("returned list, expected numpy.ndarray",)),
    ("output-ndarray-subclass", ("returned AlwaysClose, expected numpy.ndarray",)),
    ("output-none", ("returned NoneType, expected a dict by case",)),
]


def test_the_control_passes_through_the_same_machinery() -> None:
    """The plugin is found and a correct backend from it passes: the failures below are not setup errors."""
    proc = run_hostile("run", "--backends", "hostile-control", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("PASS"), proc.stdout[-500:]
    assert "hostile-control 43/43" in proc.stdout.splitlines()[-1]


@pytest.fixture(scope="module")
def hostile_runs() -> dict[str, subprocess.CompletedProcess[str]]:
    """`parity run --backends NAME --precision fp64 -q` for every case below, run once, concurrently."""
    return run_all({b: ["run", "--backends", b, "--precision", "fp64", "-q"] for b, _ in EXIT + DECL + OUTPUT})


@pytest.mark.parametrize(("backend", "needles"), EXIT + DECL + OUTPUT, ids=[c[0] for c in EXIT + DECL + OUTPUT])
def test_hostile_backend_exits_2_with_one_line(
    hostile_runs: dict[str, subprocess.CompletedProcess[str]], backend: str, needles: tuple[str, ...]
) -> None:
    assert_exit_2_one_line(hostile_runs[backend], *needles)


@pytest.mark.parametrize("case", ["exit-import-sys-exit-0-in-parity-backends"])
def test_parity_backends_lists_broken_plugins_and_exits_2(case: str) -> None:
    """`parity backends` once exited 0 printing nothing when a plugin called sys.exit() at import."""
    proc = run_hostile("backends")
    assert_exit_2_one_line(proc, "registered backend(s) broken", "exit-import-sys-exit-0")
    rows = {ln.split()[0]: ln for ln in proc.stdout.splitlines() if ln.strip()}
    assert "broken" in rows["exit-import-sys-exit-0"] and "SystemExit" in rows["exit-import-sys-exit-0"]
    assert "broken" in rows["decl-unknown-precision"]
    assert "available" in rows["hostile-control"] and "available" in rows["numpy"]


@pytest.mark.parametrize("backend", ["state-writes-into-golden", "state-loosens-its-fixture"])
def test_state_a_backend_cannot_change_what_it_is_compared_with(backend: str, tmp_path: Path) -> None:
    """It wrote into its golden arrays / loosened its fixture's tolerances, then answered wrong: exit 1."""
    report = tmp_path / "r.json"
    proc = run_hostile("run", "--backends", backend, "--precision", "fp64", "-q", "--json", str(report))
    assert proc.returncode == 1, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert proc.stdout.splitlines()[-1].startswith("FAIL") and "Traceback" not in proc.stderr
    data = json.loads(report.read_text())
    assert data["tolerances"]["fp64"]["atol"] == 1e-12 and data["counts"]["passed"] == 0


@pytest.mark.parametrize("case", ["state-scales-weights-then-numpy"])
def test_state_a_backend_that_scales_its_weights_does_not_break_the_next_one(case: str) -> None:
    """state-scales-weights doubles the weights it got (in place where it can): numpy, next, still agrees."""
    proc = run_hostile("run", "-v", "--backends", "state-scales-weights,numpy", "-q")
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    numpy_rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("numpy ") and " vs " in ln]
    assert numpy_rows and all(" OK " in ln for ln in numpy_rows)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("case", ["exit-genuine-ctrl-c-is-130"])
def test_exit_a_genuine_ctrl_c_still_exits_130(case: str) -> None:
    """A real SIGINT is not a backend crash: 'parity: interrupted', exit 130."""
    path = os.pathsep.join(p for p in (str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "parity_harness", "run", "--backends", "exit-genuine-ctrl-c",
                             "--precision", "fp64"], cwd=REPO, env={**os.environ, "PYTHONPATH": path},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # "parity: running exit-genuine-ctrl-c (fp64) ..."
        assert "running exit-genuine-ctrl-c" in line, line
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert err.strip() == "parity: interrupted" and "Traceback" not in err

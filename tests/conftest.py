"""Shared pytest fixtures and hooks (the helper functions live in tests/helpers.py): the committed toy fixture,
writable copies of it, and the two expensive things several modules read, each made once per session (once per
xdist worker): a generated gpt2-mini with its ONNX graphs, and the full run of every built-in backend on each
committed fixture.

`nox -s tests` runs the tests marked neither `full` nor `slow`; `nox -s full` those marked `full` (pyproject.toml).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parity_harness._fixture.fixture import MANIFEST
from tests.helpers import REPO, REQUIRE_ALL, TOY, full_run_backends, run_cli


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """With PARITY_REQUIRE_ALL_BACKENDS=1, a skipped test is a failed test, its reason kept."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_ALL and report.skipped and call.when in ("setup", "call"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under PARITY_REQUIRE_ALL_BACKENDS=1 (CI must not skip): {reason}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests reading a full run go first: the run is the fast set's longest setup, and started first,
    the other tests fill the other core beside it (xdist's worksteal takes work from the end of a queue)."""
    def reads_a_full_run(item: pytest.Item) -> bool:
        callspec = getattr(item, "callspec", None)
        return callspec is not None and "full_run" in callspec.params

    items.sort(key=lambda item: not reads_a_full_run(item))  # stable: otherwise in collection order


def _session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory of this pytest session, shared by its xdist workers (each has a child of it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _once_across_workers(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock`: the xdist workers of one session take turns (a no-op without fcntl)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: each worker makes its own
        yield
        return
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session", autouse=True)
def no_browser_left_running() -> Iterator[None]:
    """After the suite, no browser started by it (its profile is named by PARITY_BROWSER_TAG) still runs."""
    tag = f"pytest{os.getpid()}"
    os.environ["PARITY_BROWSER_TAG"] = tag  # inherited by every backend and subprocess of this session
    yield
    marker = f"parity-chrome-{tag}-"
    left: list[str] = []
    for _ in range(50):  # a browser being closed may take a moment to exit
        left = [p.name for p in Path("/proc").glob("[0-9]*") if marker in _cmdline(p)]
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"browser processes left running after the test suite: pids {left}"


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.fixture(scope="session")
def toy_dir() -> Path:
    """The committed fixture (read-only: copy it before changing anything)."""
    assert (TOY / MANIFEST).is_file(), "fixtures/toy is missing: run `nox -s fixtures`"
    return TOY


@pytest.fixture(scope="session")
def local_toy(tmp_path_factory: pytest.TempPathFactory, toy_dir: Path) -> Path:
    """The toy's weights with goldens recomputed on this machine (read-only; copy it before changing it).

    For the tests that need exact agreement with the reference: the committed goldens were made on
    another platform, which rounds differently, so exactness is only a same-platform claim.
    """
    pytest.importorskip("torch")
    from parity_harness._authoring.export import write_fixture
    from parity_harness._fixture.fixture import load_fixture

    toy = load_fixture(toy_dir)
    root = tmp_path_factory.mktemp("local") / "toy"
    onnx = {kind: path for kind in ("all_taps", "logits") if (path := toy.onnx_path(kind)) is not None}
    from parity_harness._backends.onnx.decode import decode_graph

    write_fixture(root, toy.weights(), int(toy.manifest["provenance"]["seed"]),
                  int(toy.manifest["provenance"]["steps"]), with_onnx=onnx,  # type: ignore[arg-type]
                  progress=lambda _message: None, decode_onnx=decode_graph(toy))
    return root


@pytest.fixture(scope="session")
def gpt2_mini(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`parity export --preset gpt2-mini --seed 3` with both ONNX graphs (read-only: copy it before changing it).

    Made once per pytest session, across xdist workers too (as full_run is): its export (the ONNX graphs
    above all) is the slow step of every test reading it.
    """
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from parity_harness._authoring.presets import export_preset

    shared = _session_dir(tmp_path_factory)
    root, done = shared / "gpt2-mini", shared / "gpt2-mini.done"
    with _once_across_workers(shared / "gpt2-mini.lock"):
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)  # a worker's export that failed half-way
            export_preset(root, "gpt2-mini", seed=3, progress=lambda _m: None)
            done.touch()
    return root


@pytest.fixture(scope="session", params=["toy", pytest.param("toy-stress", marks=pytest.mark.full)])
def full_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, subprocess.CompletedProcess[str], Any]:
    """One `parity run` of every built-in backend on each committed fixture: its directory, process and JSON.

    Made once per pytest session, shared by every test that reads it, across xdist workers too (the first
    to need it runs it under a lock in the session's shared temporary directory; the others read its
    result). The toy's is in the fast set (every built-in backend the default `parity run` runs, but
    torch-compile: tests/helpers.py, `full_run_backends`); the stress fixture's is marked full and runs
    every built-in backend.
    """

    fixture = REPO / "fixtures" / request.param
    shared = _session_dir(tmp_path_factory)
    out, done = shared / f"full-run-{request.param}.json", shared / f"full-run-{request.param}.process.json"
    with _once_across_workers(shared / f"full-run-{request.param}.lock"):
        if not done.exists():
            names = ",".join(sorted(full_run_backends(request.param)))
            proc = run_cli("run", "--fixture", str(fixture), "--backends", names, "--json", str(out), "-q")
            done.write_text(json.dumps({"args": proc.args, "returncode": proc.returncode, "stdout": proc.stdout,
                                        "stderr": proc.stderr}))
    saved = json.loads(done.read_text())
    proc = subprocess.CompletedProcess(saved["args"], saved["returncode"], saved["stdout"], saved["stderr"])
    return fixture, proc, json.loads(out.read_text()) if out.exists() else {}


@pytest.fixture
def fixture_copy(tmp_path: Path, toy_dir: Path) -> Path:
    """A writable copy of the toy fixture."""
    dst = tmp_path / "toy"
    shutil.copytree(toy_dir, dst)
    return dst

"""Backends side by side (`parity run --jobs`, parity_harness/_run/lanes.py): the same report for any number of lanes.

In-process backends built from the toy's goldens, run through the public API (`parity_harness.api.run`), so the
runner, the boundary and the judge are the real ones. What must hold:
- a report does not depend on `jobs`: the same runs, checks and verdict, in the run's order;
- two `concurrent` backends do run at once with two lanes (a barrier only both together pass);
- a backend that is not `concurrent` runs on the main thread, alone: nothing runs beside it;
- a crash stops the run as it does one at a time: the backends before it keep their results, none after it does;
- PARITY_BACKEND_TIMEOUT (the hang guard, a main-thread alarm) puts every backend on the main thread;
- with two lanes, every concurrent backend makes its imports before it runs, never beside another's, and
  imports that fail are reported by their backend when it runs, in its place;
- `concurrent` and `out_of_process` are declared as bools, or the backend is refused in one line;
- without `jobs`, a small fixture's concurrent out-of-process backends run on a side lane and every other backend
  on the main thread, with the report of one lane; a large fixture, `jobs` given, or an out-of-process backend
  that is not concurrent keeps one lane;
- parity's own note from a backend that runs beside a silenced one still reaches the terminal.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest

from parity_harness import api
from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._core.errors import BackendMisbehaved, ParityError
from parity_harness._fixture.fixture import Fixture
from tests.helpers import run_cli

STARTED: list[tuple[str, str, frozenset[str]]] = []  # (backend, thread name, the backends running as it started)
_active: set[str] = set()
_lock = threading.Lock()


class _Golden(Backend):
    """A perfect float64 backend: the golden, copied; it records the thread it ran on and who ran beside it."""

    precisions: ClassVar[tuple[Precision, ...]] = ("fp64",)
    pause: ClassVar[float] = 0.05  # long enough for a second lane to start beside it

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        with _lock:
            beside = frozenset(_active)
            _active.add(self.name)
            STARTED.append((self.name, threading.current_thread().name, beside))
        try:
            self.work()
            out = {case: {tap: a.copy() for tap, a in taps.items()} for case, taps in fixture.golden(precision).items()}
            time.sleep(self.pause)
            return out
        finally:
            with _lock:
                _active.discard(self.name)

    def work(self) -> None:
        pass


def _golden(name: str, concurrent: bool, **attrs: object) -> Backend:
    cls = type(f"B_{name}", (_Golden,), {"name": name, "concurrent": concurrent, **attrs})
    return cls()  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    STARTED.clear()
    _active.clear()
    monkeypatch.delenv("PARITY_BACKEND_TIMEOUT", raising=False)


def _summary(report: api.Report) -> tuple[object, ...]:
    return (report.verdict, [(r.backend, r.precision, r.status) for r in report.runs],
            [(r.backend, r.precision, r.golden, r.case, r.tap, r.status, r.max_abs) for r in report.results])


def test_the_report_is_the_same_for_one_lane_and_two() -> None:
    def backends() -> list[Backend]:
        return [_golden("g-main-a", False), _golden("g-conc-b", True), _golden("g-main-c", False),
                _golden("g-conc-d", True), _golden("g-conc-e", True)]

    one = api.run(backends(), precisions="fp64", jobs=1)
    two = api.run(backends(), precisions="fp64", jobs=2)
    assert one.passed and two.passed
    assert _summary(one) == _summary(two)
    assert [r.backend for r in two.runs] == ["g-main-a", "g-conc-b", "g-main-c", "g-conc-d", "g-conc-e"]


def test_two_concurrent_backends_run_at_once() -> None:
    both = threading.Barrier(2, timeout=300)  # passed only when both backends are inside `run` together

    backends = [_golden(f"g-meet-{k}", True, work=lambda self: both.wait()) for k in "ab"]
    report = api.run(backends, precisions="fp64", jobs=2)
    assert report.passed
    assert sorted(thread for _, thread, _ in STARTED) == ["MainThread", "parity-lane-1"]


def test_a_backend_that_is_not_concurrent_runs_alone_on_the_main_thread() -> None:
    backends = [_golden("g-conc-a", True), _golden("g-alone-1", False, pause=0.2), _golden("g-conc-c", True),
                _golden("g-alone-2", False, pause=0.2), _golden("g-conc-e", True)]
    report = api.run(backends, precisions="fp64", jobs=2)
    assert report.passed
    alone = [s for s in STARTED if s[0].startswith("g-alone")]
    assert [thread for _, thread, _ in alone] == ["MainThread", "MainThread"]
    assert all(beside == frozenset() for _, _, beside in alone)  # nothing was running when one started
    assert all(not any(b.startswith("g-alone") for b in beside) for _, _, beside in STARTED)  # nor started beside


class _Crash(_Golden):
    def work(self) -> None:
        raise RuntimeError("boom")


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_crash_stops_the_run_as_it_does_one_at_a_time(jobs: int) -> None:
    crash = type("B_crash", (_Crash,), {"name": "g-crash", "concurrent": True})()
    backends = [_golden("g-before", False, pause=0.3), crash, _golden("g-after", True), _golden("g-last", True)]
    report = api.run(backends, precisions="fp64", jobs=jobs, keep_on_crash=True)
    assert report.crash is not None and "boom" in str(report.crash)
    assert [(r.backend, r.status.name) for r in report.runs] == [("g-before", "RAN"), ("g-crash", "CRASHED")]
    assert {r.backend for r in report.results} == {"g-before"}
    assert not report.passed
    with pytest.raises(ParityError, match=r"g-crash.*boom"):
        api.run([_golden("g-before", False), type("B_crash2", (_Crash,), {"name": "g-crash", "concurrent": True})()],
                precisions="fp64", jobs=jobs)


def test_the_hang_guard_puts_every_backend_on_the_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_BACKEND_TIMEOUT", "600")
    report = api.run([_golden("g-t-a", True), _golden("g-t-b", True), _golden("g-t-c", True)], precisions="fp64",
                     jobs=2)
    assert report.passed
    assert {thread for _, thread, _ in STARTED} == {"MainThread"}


IMPORTED: list[tuple[str, str, bool]] = []  # (backend, thread name, another backend importing at the time)
_importing: set[str] = set()


class _Imports(_Golden):
    def import_requirements(self) -> None:
        with _lock:
            IMPORTED.append((self.name, threading.current_thread().name, bool(_importing)))
            _importing.add(self.name)
        time.sleep(0.1)  # long enough for the other lane to try its own imports meanwhile
        with _lock:
            _importing.discard(self.name)


class _ImportFails(_Golden):
    def import_requirements(self) -> None:
        raise ImportError("no module named 'g_missing'")

    def work(self) -> None:
        raise ImportError("no module named 'g_missing' (at run)")


def test_two_lanes_import_each_concurrent_backend_before_it_runs_and_one_at_a_time() -> None:
    IMPORTED.clear()
    backends = [type(f"B_i{k}", (_Imports,), {"name": f"g-imp-{k}", "concurrent": c})()
                for k, c in (("a", True), ("b", False), ("c", True), ("d", True))]
    assert api.run(backends, precisions="fp64", jobs=2).passed
    assert sorted(name for name, _, _ in IMPORTED) == ["g-imp-a", "g-imp-c", "g-imp-d"]  # the concurrent ones
    assert not any(overlap for _, _, overlap in IMPORTED)  # never two backends' imports at once
    ran_on = {name: thread for name, thread, _ in STARTED}
    assert all(ran_on[name] == thread for name, thread, _ in IMPORTED)  # on the thread that runs it, before
    IMPORTED.clear()
    assert api.run(backends, precisions="fp64", jobs=1).passed
    assert IMPORTED == []  # one lane: each backend imports as it runs, as before


def test_imports_that_fail_are_reported_by_their_backend_in_its_place() -> None:
    failing = type("B_if", (_ImportFails,), {"name": "g-imp-fails", "concurrent": True})()
    backends = [_golden("g-imp-first", False, pause=0.2), failing, _golden("g-imp-after", True)]
    report = api.run(backends, precisions="fp64", jobs=2, keep_on_crash=True)
    assert [(r.backend, r.status.name) for r in report.runs] == [("g-imp-first", "RAN"), ("g-imp-fails", "CRASHED")]
    assert report.crash is not None and "(at run)" in str(report.crash)
    assert not report.passed


def test_concurrent_must_be_a_bool() -> None:
    with pytest.raises(BackendMisbehaved, match="concurrent must be True or False"):
        api.run([_golden("g-bad-decl", "yes")], precisions="fp64")  # type: ignore[arg-type]
    with pytest.raises(BackendMisbehaved, match="out_of_process must be True or False"):
        api.run([_golden("g-bad-oop", True, out_of_process=1)], precisions="fp64")


def _side_lane_backends() -> list[Backend]:
    return [_golden("g-in-a", True), _golden("g-out-b", True, out_of_process=True), _golden("g-alone-c", False),
            _golden("g-in-d", True), _golden("g-out-e", True, out_of_process=True),
            _golden("g-out-alone-f", False, out_of_process=True)]


def test_a_small_fixture_runs_its_out_of_process_backends_on_a_side_lane() -> None:
    """No `jobs`: the concurrent out-of-process backends on the side lane; in-process ones, concurrent or not,
    and an out-of-process one that is not concurrent, on the main thread. The report is that of one lane."""
    report = api.run(_side_lane_backends(), precisions="fp64")
    assert report.passed
    threads = {name: thread for name, thread, _ in STARTED}
    assert {n for n, t in threads.items() if t != "MainThread"} <= {"g-out-b", "g-out-e"}
    assert threads["g-out-e"] == "parity-lane-1"  # the side lane starts with the last it may take
    assert all(threads[n] == "MainThread" for n in ("g-in-a", "g-alone-c", "g-in-d", "g-out-alone-f"))
    alone = [beside for name, _, beside in STARTED if name in ("g-alone-c", "g-out-alone-f")]
    assert all(beside == frozenset() for beside in alone)  # nothing beside a backend that is not concurrent
    STARTED.clear()
    assert _summary(api.run(_side_lane_backends(), precisions="fp64", jobs=1)) == _summary(report)
    assert {thread for _, thread, _ in STARTED} == {"MainThread"}


@pytest.mark.parametrize("why", ["large fixture", "jobs given", "not concurrent"])
def test_no_side_lane_for_a_large_fixture_an_explicit_jobs_or_a_backend_that_is_not_concurrent(
    why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from parity_harness._run import runner

    backends = [_golden("g-n-a", True), _golden("g-n-b", why != "not concurrent", out_of_process=True)]
    if why == "large fixture":
        monkeypatch.setattr(Fixture, "parameter_count", lambda self: runner.RELEASE_PARAMETERS)
    assert api.run(backends, precisions="fp64", jobs=1 if why == "jobs given" else None).passed
    assert {thread for _, thread, _ in STARTED} == {"MainThread"}


def test_out_of_process_is_not_inherited() -> None:
    from parity_harness._backends.boundary import GuardedBackend
    from parity_harness._backends.node.typescript_backend import TypeScriptBackend

    class Child(TypeScriptBackend):
        name: ClassVar[str] = "typescript-child"

    assert GuardedBackend.wrap(TypeScriptBackend()).out_of_process is True
    assert GuardedBackend.wrap(Child()).out_of_process is False


def test_a_backends_own_note_is_printed_while_another_thread_is_silenced(capsys: pytest.CaptureFixture[str]) -> None:
    from parity_harness._backends.browser.driver import say_once
    from parity_harness._backends.quiet import silenced

    inside, said = threading.Event(), threading.Event()

    def silenced_backend() -> None:
        with silenced():
            inside.set()
            said.wait(120)

    thread = threading.Thread(target=silenced_backend)
    thread.start()
    inside.wait(120)
    say_once("a note from beside a silenced backend")
    said.set()
    thread.join(120)
    assert "parity: a note from beside a silenced backend" in capsys.readouterr().err


def test_jobs_zero_is_a_usage_error() -> None:
    proc = run_cli("run", "--jobs", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--jobs" in proc.stderr and "'0'" in proc.stderr
    with pytest.raises(ParityError, match="jobs"):
        api.run([_golden("g-j", True)], precisions="fp64", jobs=0)


def test_concurrent_is_not_inherited() -> None:
    """A subclass of a concurrent backend may patch a module its parent reads: it runs alone unless it says so."""
    from parity_harness._backends.boundary import GuardedBackend
    from parity_harness._backends.numpy_backend import NumpyBackend

    class PatchingNumpy(NumpyBackend):
        name: ClassVar[str] = "numpy-patched"

    class SaysSo(NumpyBackend):
        name: ClassVar[str] = "numpy-says-so"
        concurrent: ClassVar[bool] = True

    assert GuardedBackend.wrap(NumpyBackend()).concurrent is True
    assert GuardedBackend.wrap(PatchingNumpy()).concurrent is False
    assert GuardedBackend.wrap(SaysSo()).concurrent is True


def test_silenced_restores_everything_when_two_threads_leave_in_either_order() -> None:
    """Entered on one thread, then another; left in the first's order: the streams, the warnings filters and
    the log levels are those from before, never a sink left in place (which would hide the report)."""
    import logging
    import sys
    import warnings

    from parity_harness._backends.quiet import silenced

    before = (sys.stdout, sys.stderr, list(warnings.filters), logging.root.manager.disable,
              logging.getLogger("transformers").level)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[tuple[bool, int]] = []  # inside the second, after the first left: still silenced?

    def first() -> None:
        with silenced(("transformers",)):
            first_in.set()
            second_in.wait(120)
            print("dropped")  # into the sink, not the terminal
        first_out.set()

    def second() -> None:
        first_in.wait(120)
        with silenced():
            second_in.set()
            first_out.wait(120)
            seen.append((sys.stdout is not before[0], logging.getLogger("transformers").level))

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    after = (sys.stdout, sys.stderr, list(warnings.filters), logging.root.manager.disable,
             logging.getLogger("transformers").level)
    assert seen == [(True, logging.ERROR)]
    assert after == before


@pytest.mark.full  # three toy runs of ten real backends, ~35 s: `nox -s full`
def test_real_backends_side_by_side_give_the_report_of_one_at_a_time(tmp_path: Path) -> None:
    """`parity run --jobs 2`, and `parity run` without --jobs (the side lane), on the toy with real backends, all
    concurrent (typescript's and the browser's work is another process's, transformerlens silences its output,
    torch-compile patches inductor's configuration): the JSON report, timings aside, is the report of `--jobs 1`."""
    import json

    names = ("pytorch,numpy,onnxruntime,openvino,torch-compile,typescript,transformerlens,hf-transformers,"
             "typescript-browser,onnxruntime-web")
    reports = []
    for jobs in ("1", "2", None):
        path = tmp_path / f"jobs{jobs}.json"
        proc = run_cli("run", "--backends", names, *(["--jobs", jobs] if jobs else []), "--json", str(path))
        assert proc.returncode == 0, proc.stderr[-2000:]
        report = json.loads(path.read_text())
        for run in report["runs"] + report["decoding"]["runs"]:
            run.pop("seconds")
        reports.append(report)
    assert reports[0] == reports[1] == reports[2]

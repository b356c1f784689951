"""Run the backends of one run in lanes: the main thread and, with `jobs` > 1, worker threads beside it.

Most backends compute on one core (PyTorch and onnxruntime on one thread, for reproducible reductions),
and the typescript backend's work is Node's, in another process: run one after another, a 2-core machine
sits half idle. Here every lane takes the next backend in the run's order that it may take, runs it whole
(every precision, each case judged as it comes) into a result of its own, and takes the next:

- a worker thread takes the last backend left that declares `concurrent = True`: it changes no process-wide
  state (standard streams, warnings filters, logging, the environment, signal handlers, a module's globals),
  so it may run beside another such backend. The main thread takes the first backend left; one that is not
  concurrent (a plugin that patches a module while it runs, say) runs there alone: the main thread waits for
  the workers to finish what they run (running a concurrent backend itself meanwhile), and they start nothing
  while it runs. The two ends of the order meet in the middle, so a long backend late in the order
  (typescript, whose work is Node's) starts first;
- results are handed back in the run's order, whatever order the lanes finished in, so a report does not
  depend on `jobs`; the checks are the same, made by the same judge (runner.py's `run_one`);
- a backend that fails stops the run as it would one at a time: the backends before it in the run's order
  still run and keep their results, none after it is started, and what those had finished is dropped;
- with `PARITY_BACKEND_TIMEOUT` set, everything runs on the main thread: the hang guard is a SIGALRM timer,
  which only the main thread has (guard.py);
- with more than one lane, a concurrent backend first imports what it computes with
  (`Backend.import_requirements`, by default its `requires`), quietly, holding a lock no other backend's
  imports pass: imports happen one backend at a time, beside the other lane's compute. A library
  half-imported on one thread can be seen half-made from another: a run with hf-transformers and
  transformerlens side by side failed with "cannot import name 'AutoTokenizer' from 'transformers'" while both
  were importing it. A backend whose imports fail meets the same failure when it runs, and reports it there.

Unless `jobs` is given, a run of a small fixture (under 1 M parameters) has a side lane: one worker thread
that takes only the backends that are concurrent and `out_of_process` (typescript, the browser backends), whose
work is Node's or a browser's. Their wait, Chromium's start and the browser's compute then overlap the other
backends' imports and compute on the main thread, instead of adding to them; a concurrent backend that computes
in Python stays on the main thread, where it would compete for the GIL. On the toy the 13 backends of the
default run took 9.5 s in one lane against 8.0 s with the side lane (docs/performance.md). A large fixture
keeps one lane: there an out-of-process backend's working set (Node's copy of GPT-2's weights) would add to the
one beside it.

A worker thread is a daemon: on Ctrl-C the main thread leaves at once, and what a backend started outside
the process (Node) is ended by the run's closers (sessions.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

from parity_harness._backends.boundary import GuardedBackend
from parity_harness._backends.guard import TIMEOUT_VARIABLE
from parity_harness._backends.quiet import silenced
from parity_harness._core.errors import BackendFailed, ParityError

R = TypeVar("R")

# Lanes `parity run` uses unless told (--jobs): one. Two backends of GPT-2 size side by side hold both their
# working sets at once: the nine peak at 4.1 GB with two lanes against 2.8 GB with one (the memory target is
# 3 GB), for ~20% less wall time (46.0 s against 56.7 s, docs/performance.md); on the toy, where imports
# dominate, two lanes gain nothing measurable. So side by side is asked for, not assumed.
DEFAULT_JOBS = 1


class Lanes(NamedTuple):
    """How a run's backends are laid out: `total` lanes (the main thread and total - 1 workers); `side_only`:
    the worker takes only concurrent out-of-process backends (the side lane, module docstring)."""

    total: int
    side_only: bool = False


def lanes_for(jobs: int | None, backends: Sequence[GuardedBackend], small: bool = False) -> Lanes:
    """The lanes to run: `jobs` of them when given; else, on a `small` fixture with a concurrent out-of-process
    backend among two or more, the main thread and a side lane; else DEFAULT_JOBS. One whatever was asked when
    nothing may run beside the main thread (no backend is concurrent, or only one backend) and with the hang
    guard armed."""
    if jobs is not None and jobs < 1:
        raise ParityError(f"jobs: {jobs} lanes; give 1 or more")
    if os.environ.get(TIMEOUT_VARIABLE) or len(backends) < 2 or not any(b.concurrent for b in backends):
        return Lanes(1)
    if jobs is not None:
        return Lanes(jobs)
    if small and any(b.concurrent and b.out_of_process for b in backends):
        return Lanes(2, side_only=True)
    return Lanes(DEFAULT_JOBS)


class _Outcome(Generic[R]):
    """What running one backend gave: its result, or what it raised past `run_one` (None while it runs)."""

    def __init__(self) -> None:
        self.result: R | None = None
        self.error: BaseException | None = None


class _Schedule:
    """Which backend each lane takes next (module docstring), under one condition variable."""

    def __init__(self, backends: Sequence[GuardedBackend], side_only: bool) -> None:
        self.backends = backends
        self.side_only = side_only
        self.pending = list(range(len(backends)))
        self.stop = len(backends)  # no backend after this index is started: the first that failed (-1: interrupted)
        self.busy = 0  # backends running on worker threads
        self.alone = False  # the main thread runs a backend that is not concurrent: nothing runs beside it
        self.cond = threading.Condition()

    def take(self, main: bool) -> int | None:
        """The next backend for a lane, waiting while it may not start one; None when it has nothing left."""
        with self.cond:
            while True:
                left = [i for i in self.pending if i <= self.stop]
                concurrent = [i for i in left if self.backends[i].concurrent]
                if main:
                    if left and (left[0] in concurrent or self.busy == 0):
                        choice = left[0]
                        self.alone = choice not in concurrent
                    elif concurrent:  # the first needs the process to itself: run a concurrent one meanwhile
                        choice = concurrent[0]
                    elif not left:
                        return None
                    else:
                        self.cond.wait()
                        continue
                elif not (eligible := [i for i in concurrent if self.backends[i].out_of_process or not self.side_only]):
                    return None
                elif self.alone:
                    self.cond.wait()
                    continue
                else:
                    choice = eligible[-1]
                    self.busy += 1
                self.pending.remove(choice)
                return choice

    def done(self, i: int, main: bool, end: bool) -> None:
        """Backend `i` has run; `end`: it failed, so nothing after it starts."""
        with self.cond:
            if main:
                self.alone = False
            else:
                self.busy -= 1
            if end:
                self.stop = min(self.stop, i)
            self.cond.notify_all()

    def interrupt(self) -> None:
        with self.cond:
            self.stop = -1
            self.alone = False
            self.cond.notify_all()


_imports = threading.Lock()  # held while a backend imports its libraries: one backend's imports at a time


def import_requirements(backend: GuardedBackend) -> None:
    """A backend's imports (`Backend.import_requirements`), quietly, none beside another's. One that fails is
    skipped here: the backend meets the same failure when it runs, and reports it in its place."""
    with _imports, silenced(), contextlib.suppress(BackendFailed):
        backend.preload()


def run_in_lanes(
    backends: Sequence[GuardedBackend], run_one: Callable[[GuardedBackend], R], failed: Callable[[R], bool],
    lanes: Lanes,
) -> list[R]:
    """`run_one(backend)` for each backend, in `lanes`: the results in the backends' order, up to and
    including the first (in that order) that `failed`, after which nothing is started. An exception out of
    `run_one` (a harness bug; Ctrl-C on the main thread) is raised as it is, on the main thread."""
    outcomes: list[_Outcome[R]] = [_Outcome() for _ in backends]
    schedule = _Schedule(backends, lanes.side_only)

    def lane(main: bool) -> None:
        while (i := schedule.take(main)) is not None:
            end = True
            try:
                if lanes.total > 1 and backends[i].concurrent:
                    import_requirements(backends[i])
                result = outcomes[i].result = run_one(backends[i])
                end = failed(result)
            except BaseException as exc:  # kept for the main thread, which raises it at i's place in the order
                outcomes[i].error = exc
                if main:
                    raise  # Ctrl-C or a bug on the main thread: at once
            finally:
                schedule.done(i, main, end)

    workers = [threading.Thread(target=lane, args=(False,), name=f"parity-lane-{k}", daemon=True)
               for k in range(1, lanes.total)]
    try:
        for w in workers:
            w.start()
        lane(True)
        for w in workers:
            w.join()
    except BaseException:
        schedule.interrupt()  # the workers start nothing more
        raise
    results: list[R] = []
    for outcome in outcomes[:schedule.stop + 1]:
        if outcome.error is not None:
            raise outcome.error
        if outcome.result is None:  # cannot happen: every backend up to `stop` ran
            raise RuntimeError("a lane left a backend unrun")
        results.append(outcome.result)
    return results

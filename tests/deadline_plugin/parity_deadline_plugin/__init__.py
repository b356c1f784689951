"""Backends that outlive their deadline, leave a thread running or break sys.stdout/sys.stderr.

Registered through `parity_deadline_plugin-0.1.0.dist-info/entry_points.txt` beside this package: putting
`tests/deadline_plugin` on PYTHONPATH makes `parity` find them (tests/run/test_deadlines_and_exits.py). Each one
computes a perfect answer (a copy of the golden taps) or none at all, and misbehaves in exactly one way.
"""

from __future__ import annotations

import contextlib
import io
import signal
import sys
import threading
import time
from typing import ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._fixture.fixture import Fixture


def golden_copy(fixture: Fixture, precision: Precision) -> BackendOutput:
    """A perfect answer: private copies of the golden taps."""
    return {case: {tap: np.array(a, copy=True) for tap, a in taps.items()}
            for case, taps in fixture.golden(precision).items()}


class Perfect(Backend):
    """The control: a correct backend."""

    name: ClassVar[str] = "deadline-control"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp64",)

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return golden_copy(fixture, precision)


class CatchAllLoop(Perfect):
    """A retry loop that swallows every exception: the alarm's, SIGTERM's KeyboardInterrupt, anything."""

    name: ClassVar[str] = "deadline-catch-all"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        while True:
            try:
                time.sleep(0.05)
            except BaseException:  # the point of this backend: every stop swallowed
                continue


class CancelsAlarm(Perfect):
    """Cancels the timer and ignores SIGALRM, then hangs."""

    name: ClassVar[str] = "deadline-cancels-alarm"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(3600)
        return golden_copy(fixture, precision)


class LeavesThread(Perfect):
    """A perfect answer, and a non-daemon thread left sleeping for an hour."""

    name: ClassVar[str] = "deadline-leaves-thread"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        threading.Thread(target=time.sleep, args=(3600,), name="left-behind", daemon=False).start()
        return golden_copy(fixture, precision)


class ClosesStdout(Perfect):
    """A perfect answer, after closing sys.stdout."""

    name: ClassVar[str] = "deadline-closes-stdout"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        sys.stdout.close()
        return golden_copy(fixture, precision)


class ReplacesStderr(Perfect):
    """A perfect answer, leaving a StringIO in sys.stderr's place."""

    name: ClassVar[str] = "deadline-replaces-stderr"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        sys.stderr = io.StringIO()
        return golden_copy(fixture, precision)


class SwallowsOnce(Perfect):
    """Waits; the first exception that reaches it (a Ctrl-C's, SIGTERM's) is swallowed, then a perfect answer."""

    name: ClassVar[str] = "deadline-swallows-once"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        with contextlib.suppress(BaseException):  # the point of this backend: the interrupt swallowed
            time.sleep(3600)
        return golden_copy(fixture, precision)

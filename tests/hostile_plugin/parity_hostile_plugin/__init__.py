"""Hostile and buggy parity backends, one per way a backend once could fool or crash `parity run`.

Registered through `parity_hostile_plugin-0.1.0.dist-info/entry_points.txt` beside this package:
putting `tests/hostile_plugin` on PYTHONPATH is enough for `importlib.metadata` to find them, so
the tests drive them through the real entry-point discovery in a subprocess
(tests/backends/plugins/test_hostile_plugins.py). Every backend starts from a perfect answer (a copy of the golden
taps) and then misbehaves in exactly one way; the tests check that none of them gets exit 0
unless the numbers really were compared and agree, and that each failure is one line on stderr.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._core.errors import BackendFailed, ParityError
from parity_harness._fixture.fixture import Fixture


def golden_copy(fixture: Fixture, precision: Precision) -> dict[str, dict[str, np.ndarray]]:
    """A perfect answer: private copies of the golden taps."""
    return {case: {tap: np.array(a, copy=True) for tap, a in taps.items()}
            for case, taps in fixture.golden(precision).items()}


class Perfect(Backend):
    """The control: a correct backend (copies of the golden), fp32 and fp64."""

    name: ClassVar[str] = "hostile-control"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64")

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return golden_copy(fixture, precision)


# -- exit-code hijacks: whatever run/__init__/... raises must become one line, exit 2 -----------------


class RunSysExit0(Perfect):
    name: ClassVar[str] = "exit-run-sys-exit-0"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        sys.exit(0)


class RunSystemExitText(Perfect):
    name: ClassVar[str] = "exit-run-systemexit-text"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        raise SystemExit("all good, nothing to see")


class RunKeyboardInterrupt(Perfect):
    name: ClassVar[str] = "exit-run-keyboardinterrupt"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        raise KeyboardInterrupt  # raised by the backend itself, no Ctrl-C was pressed


class RunGeneratorExit(Perfect):
    name: ClassVar[str] = "exit-run-generatorexit"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        raise GeneratorExit


class Boom(BaseException):
    """Not an Exception: `except Exception` does not catch it."""


class RunCustomBaseException(Perfect):
    name: ClassVar[str] = "exit-run-custom-baseexception"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        raise Boom("boom")


class PassingError(ParityError):
    """A plugin's own ParityError subclass that tries to choose the exit code."""

    exit_code = 0


class RunParityErrorExit0(Perfect):
    name: ClassVar[str] = "exit-run-parityerror-exit-code-0"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        raise PassingError("everything agrees, trust me")


class RunMultilineError(Perfect):
    name: ClassVar[str] = "exit-run-multiline-error"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        raise BackendFailed("first line\nPASS: every backend agrees\u2028parity: error: fake second line\r\x1b[2K")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


class RunUnprintableError(Perfect):
    name: ClassVar[str] = "exit-run-unprintable-error"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        raise Unprintable()


class InitRaises(Perfect):
    name: ClassVar[str] = "exit-init-raises"

    def __init__(self) -> None:
        raise RuntimeError("cannot start")


class InitSysExit(Perfect):
    name: ClassVar[str] = "exit-init-sys-exit-0"

    def __init__(self) -> None:
        sys.exit(0)


class MissingDependenciesExit(Perfect):
    name: ClassVar[str] = "exit-missing-dependencies-sys-exit-0"

    def missing_dependencies(self) -> list[str]:
        sys.exit(0)


class SupportedTapsExit(Perfect):
    name: ClassVar[str] = "exit-supported-taps-sys-exit-0"

    def supported_taps(self, fixture: Fixture) -> list[str]:
        sys.exit(0)


# -- declarations: what a backend says it does must make sense ------------------------------------------


class UnknownPrecision(Perfect):
    name: ClassVar[str] = "decl-unknown-precision"
    precisions: ClassVar[tuple[Any, ...]] = ("fp8",)


class NoPrecisions(Perfect):
    name: ClassVar[str] = "decl-no-precisions"
    precisions: ClassVar[tuple[Precision, ...]] = ()


class OnlyUnknownTaps(Perfect):
    name: ClassVar[str] = "decl-only-unknown-taps"

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return ["blocks.7.hook_nothing"]


class SomeUnknownTaps(Perfect):
    name: ClassVar[str] = "decl-some-unknown-taps"

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return [*fixture.tap_names, "hook_extra"]


class TapsNone(Perfect):
    name: ClassVar[str] = "decl-supported-taps-none"

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return None  # type: ignore[return-value]  # the point


class TapsString(Perfect):
    name: ClassVar[str] = "decl-supported-taps-string"

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return "logits"  # type: ignore[return-value]  # a string is iterable: every letter a "tap"


class TapsEmpty(Perfect):
    name: ClassVar[str] = "decl-supported-taps-empty"

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return []


class RequiresMissingDotted(Perfect):
    name: ClassVar[str] = "decl-requires-missing-dotted-module"
    requires: ClassVar[tuple[str, ...]] = ("no_such_package_for_parity.submodule",)


class NameMismatch(Perfect):
    name: ClassVar[str] = "decl-some-other-name"


class NotABackend:
    name = "decl-not-a-backend"


# -- shared state: a backend must not be able to change what the harness compares with --------------------


class WritesIntoGolden(Perfect):
    """Writes zeros into the golden arrays it is given (trying to unlock them), then returns zeros."""

    name: ClassVar[str] = "state-writes-into-golden"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        golden = fixture.golden(precision)
        for taps in golden.values():
            for a in taps.values():
                with contextlib.suppress(ValueError):
                    a.flags.writeable = True
                with contextlib.suppress(ValueError):
                    a[...] = 0.0
        return {case: {tap: np.zeros_like(a) for tap, a in taps.items()} for case, taps in golden.items()}


class ScalesWeights(Perfect):
    """Scales the weights it is given in place (when it can) and zeroes the fixture's weight cache, then
    answers correctly: the next backend must not fail and get the blame."""

    name: ClassVar[str] = "state-scales-weights"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        weights = fixture.weights()
        for key in list(weights):
            try:
                weights[key] *= 2.0
            except ValueError:
                weights[key] = weights[key] * 2.0  # only its own dict changes
        cache = fixture._weights  # and the fixture's private cache, which is its own copy too
        if cache is not None:
            for key in list(cache):
                cache[key] = np.zeros_like(cache[key])
        return golden_copy(fixture, precision)


class LoosensItsFixture(Perfect):
    """Loosens the tolerances and swaps the golden of the fixture object it is given, then answers wrong."""

    name: ClassVar[str] = "state-loosens-its-fixture"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        from parity_harness._fixture.fixture import TierTolerances, Tolerance

        out = golden_copy(fixture, precision)
        wrong = {case: {tap: a + 1.0 for tap, a in taps.items()} for case, taps in out.items()}
        for tier in ("fp32", "fp64"):
            fixture.tolerances[tier] = TierTolerances(Tolerance(1e9, 1e9))  # type: ignore[index]
        fixture.manifest["tolerances"] = {"fp32": {"atol": 1e9, "rtol": 1e9}, "fp64": {"atol": 1e9, "rtol": 1e9}}
        fixture._golden[precision] = wrong
        return wrong


# -- outputs: run's result must be as strict as check-backend's ----------------------------------------------


class ExtraCase(Perfect):
    name: ClassVar[str] = "output-extra-case-of-nan"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        out = golden_copy(fixture, precision)
        out["ghost"] = {tap: np.full_like(a, np.nan) for tap, a in next(iter(out.values())).items()}
        return out


class ExtraTap(Perfect):
    name: ClassVar[str] = "output-undeclared-tap-of-nan"

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return ["logits"]

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        out = golden_copy(fixture, precision)
        for case, taps in out.items():
            out[case] = {"logits": taps["logits"], "probs": np.full_like(taps["probs"], np.nan)}
        return out  # probs: returned but not declared, full of NaN; must not be silently dropped


class PythonLists(Perfect):
    name: ClassVar[str] = "output-python-lists"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        out = golden_copy(fixture, precision)
        return {case: {tap: a.tolist() for tap, a in taps.items()} for case, taps in out.items()}  # type: ignore[misc]


class AlwaysClose(np.ndarray):
    """An ndarray subclass whose arithmetic says every difference is zero."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        base = np.zeros(np.broadcast_shapes(*(np.shape(x) for x in inputs)))
        return base if method == "__call__" else NotImplemented


class NdarraySubclass(Perfect):
    name: ClassVar[str] = "output-ndarray-subclass"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        out = golden_copy(fixture, precision)
        return {case: {tap: (a + 1.0).view(AlwaysClose) for tap, a in taps.items()} for case, taps in out.items()}


class ReturnsNone(Perfect):
    name: ClassVar[str] = "output-none"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return None  # type: ignore[return-value]  # the point


class Sleeps(Perfect):
    """Sleeps in run: the test sends a real SIGINT (Ctrl-C), which must still end parity with exit 130."""

    name: ClassVar[str] = "exit-genuine-ctrl-c"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        import time

        time.sleep(30)
        return golden_copy(fixture, precision)

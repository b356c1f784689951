"""The port under test: a parity backend (`parity_harness._backends.base.Backend`), here built on parity's NumPy one.

A real port replaces the body of `run` with its own forward pass: return `{case: {tap: array}}` for
every case of the fixture, each tap it declares in `supported_taps` (docs/adding-a-backend.md).
`LyingPort` is the same port with one tap off by 1e-3, to show what a divergence looks like.
"""

from __future__ import annotations

from parity_harness._backends.numpy_backend import (
    NumpyBackend,  # a built-in to start from; a real port subclasses Backend
)
from parity_harness.plugin import BackendOutput, Fixture, Precision


class MyPort(NumpyBackend):
    """The port: parity judges it by its own `run` (the most derived definition)."""

    name = "my-port"
    description = "an example port (parity's NumPy forward pass)"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return {case: taps for case, taps in self.run_cases(fixture, precision)}


class LyingPort(MyPort):
    """The same port, wrong on one tap (every case): the rest of the model is untouched."""

    name = "lying-port"
    tap = "blocks.1.hook_resid_mid"  # where it lies; parity must name this tap

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        out = super().run(fixture, precision)
        for taps in out.values():
            taps[self.tap] = taps[self.tap] + taps[self.tap].dtype.type(1e-3)
        return out

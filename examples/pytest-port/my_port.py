"""The port under test: a parity backend (`parity_harness.plugin.Backend`), here the reference NumPy forward pass.

A real port replaces the body of `run` with its own forward pass: return `{case: {tap: array}}` for
every case of the fixture, each tap it declares in `supported_taps` (docs/adding-a-backend.md). It
imports parity's public modules only: `parity_harness.plugin` (what a backend is made of) and
`parity_reference` (the reference model, here its plain-NumPy forward pass).
`LyingPort` is the same port with one tap off by 1e-3, to show what a divergence looks like.
"""

from __future__ import annotations

import numpy as np

from parity_harness.plugin import Backend, BackendOutput, Fixture, FixtureError, Precision
from parity_reference.numpy_model import forward


class MyPort(Backend):
    """The port: the reference model's forward pass in float32 or float64, case by case."""

    name = "my-port"
    description = "an example port (the reference NumPy forward pass)"
    precisions = ("fp32", "fp64")
    requires = ("numpy",)
    install_hint = "pip install numpy"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        dtype = np.float64 if precision == "fp64" else np.float32
        params = {name: w.astype(dtype) for name, w in fixture.weights().items()}  # read-only: cast, never in place
        taps = self.supported_taps(fixture)
        out: BackendOutput = {}
        for case in fixture.cases:
            if not all(0 <= t < fixture.config.vocab_size for t in case.tokens):
                raise FixtureError(f"case {case.name!r}: token id out of range")  # one line, exit 2
            result = forward(params, fixture.config, list(case.tokens), fixture.lens_rows())
            out[case.name] = {tap: result[tap].astype(dtype, copy=False) for tap in taps}
        return out


class LyingPort(MyPort):
    """The same port, wrong on one tap (every case): the rest of the model is untouched."""

    name = "lying-port"
    tap = "blocks.1.hook_resid_mid"  # where it lies; parity must name this tap

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        out = super().run(fixture, precision)
        for taps in out.values():
            taps[self.tap] = taps[self.tap] + taps[self.tap].dtype.type(1e-3)
        return out

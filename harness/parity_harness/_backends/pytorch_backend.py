"""The `pytorch` backend: the reference model itself (parity_reference/model.py), in fp32, fp64, fp16 and bf16.

In float64 the float32 weights are upcast and everything, the positional table included, is
computed in float64: this is what the fp64 golden file holds. In fp16 and bf16 (on the CPU) the
weights are rounded to torch.float16 / torch.bfloat16, every op computes in that dtype, and the taps
are widened to float32 arrays (exactly: the reduced precisions' container). It streams: one case at a
time. Decoding is checked in fp32 and fp64 only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._core.errors import FixtureError
from parity_harness._fixture.decoding import reference_decode
from parity_reference.run import reference_taps, torch_params

if TYPE_CHECKING:
    from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest
    from parity_harness._fixture.fixture import Fixture


class PyTorchBackend(Backend):
    name: ClassVar[str] = "pytorch"
    description: ClassVar[str] = "the PyTorch reference (parity_reference/model.py); fp16 and bf16 on the CPU"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64", "fp16", "bf16")
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    install_hint: ClassVar[str] = "pip install 'parity-harness[torch]'"

    streams: ClassVar[bool] = True  # one case at a time: memory bounded by one case

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return dict(self.run_cases(fixture, precision))

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        vocab_size = fixture.config.vocab_size
        for case in fixture.cases:  # torch's embedding would raise an IndexError (a crash) on a bad id
            bad = [t for t in case.tokens if not 0 <= t < vocab_size]
            if bad:
                raise FixtureError(f"case {case.name!r}: token id {bad[0]} out of range [0, {vocab_size})")
        weights = fixture.weights()
        fixture.release_weights()  # a GPT-2-sized fixture: only this dict holds the float32 copy now
        params = torch_params(weights, precision, consume=True)  # each float32 array freed once cast
        lens_rows = fixture.lens_rows()
        for case in fixture.cases:
            yield case.name, dict(reference_taps(params, fixture.config, [case], precision, lens_rows=lens_rows,
                                                 cast=False)[case.name])

    def supports_decoding(self, fixture: Fixture) -> bool:
        return True

    def decode(
        self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None
    ) -> DecodeOutput:
        from parity_reference import model

        return reference_decode(fixture, precision, requests, model.decode)

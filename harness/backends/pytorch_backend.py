"""The `pytorch` backend: the reference model itself (reference/model.py), in float32 and float64.

In float64 the float32 weights are upcast and everything, the positional table included, is
computed in float64: this is what the fp64 golden file holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from harness.backends.base import Backend, BackendOutput, Precision
from harness.decoding import reference_decode
from reference.run import reference_taps

if TYPE_CHECKING:
    from harness.decoding import DecodeOutput, DecodeRequest
    from harness.fixture import Fixture


class PyTorchBackend(Backend):
    name: ClassVar[str] = "pytorch"
    description: ClassVar[str] = "the PyTorch reference (reference/model.py)"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64")
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    install_hint: ClassVar[str] = "pip install 'parity[torch]'"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return reference_taps(fixture.weights(), fixture.config, fixture.cases, precision)

    def supports_decoding(self, fixture: Fixture) -> bool:
        return True

    def decode(
        self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None
    ) -> DecodeOutput:
        from reference import model

        return reference_decode(fixture, precision, requests, model.decode)

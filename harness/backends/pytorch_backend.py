"""The `pytorch` backend: the reference model itself (reference/model.py), in float32 and float64.

In float64 the float32 weights are upcast and everything, the positional table included, is
computed in float64: this is what the fp64 golden file holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from harness.backends.base import Backend, BackendOutput, Precision

if TYPE_CHECKING:
    from harness.fixture import Fixture


class PyTorchBackend(Backend):
    name: ClassVar[str] = "pytorch"
    description: ClassVar[str] = "the PyTorch reference (reference/model.py)"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64")
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    install_hint: ClassVar[str] = "pip install 'parity[torch]'"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        import numpy as np
        import torch

        from reference.model import run_with_taps

        dtype = torch.float32 if precision == "fp32" else torch.float64
        torch.set_num_threads(1)  # bit-reproducible reductions
        params = {k: torch.from_numpy(v.copy()).to(dtype) for k, v in fixture.weights().items()}
        out: BackendOutput = {}
        for case in fixture.cases:
            taps = run_with_taps(params, fixture.config, list(case.tokens))
            out[case.name] = {tap: np.ascontiguousarray(t.numpy()) for tap, t in taps.items()}
        return out

"""The `pytorch` backend: the reference model itself (reference/model.py), in float32 and float64.

In float64 the float32 weights are upcast and everything, the positional table included, is
computed in float64: this is what the fp64 golden file holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, TypeAlias

from harness.backends.base import Backend, BackendOutput, Precision

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    import numpy as np
    import torch

    from harness.decoding import DecodeOutput, DecodeRequest
    from harness.fixture import Case, Fixture
    from reference.config import GPTConfig

    # reference.model.run_with_taps, or a patched copy of it: (params, config, tokens) -> {tap: tensor}
    RunWithTaps: TypeAlias = Callable[[Mapping[str, torch.Tensor], GPTConfig, list[int]], dict[str, torch.Tensor]]


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


def reference_decode(
    fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None, decode: Callable[..., Any]
) -> DecodeOutput:
    """Every request through `decode` (reference.model.decode or a patched copy): {name: {"step{k}/{tap}": array}}."""
    import torch

    from harness.decoding import requests_for, steps_to_output

    dtype = torch.float32 if precision == "fp32" else torch.float64
    torch.set_num_threads(1)  # bit-reproducible reductions
    params = {k: torch.from_numpy(v.copy()).to(dtype) for k, v in fixture.weights().items()}
    out: DecodeOutput = {}
    for req in requests_for(fixture, requests):
        steps = decode(params, fixture.config, list(req.prompt), req.steps,
                       list(req.feed) if req.feed is not None else None)
        out[req.name] = steps_to_output(fixture.config.n_layer, [
            (logits.numpy(), [(k.numpy(), v.numpy()) for k, v in cache]) for logits, cache in steps
        ])
    return out


def reference_taps(
    weights: Mapping[str, np.ndarray], config: GPTConfig, cases: Sequence[Case], precision: Precision,
    run_with_taps: RunWithTaps | None = None,
) -> BackendOutput:
    """Every tap of every case from reference/model.py: {case: {tap: array}}; also what the golden files hold.

    `run_with_taps` replaces `reference.model.run_with_taps` (the self-test runs patched copies of it).
    """
    import torch

    from reference import model

    compute = run_with_taps or model.run_with_taps
    dtype = torch.float32 if precision == "fp32" else torch.float64
    torch.set_num_threads(1)  # bit-reproducible reductions
    params = {k: torch.from_numpy(v.copy()).to(dtype) for k, v in weights.items()}
    out: BackendOutput = {}
    for case in cases:
        taps = compute(params, config, list(case.tokens))  # contiguous copies, one per tap
        out[case.name] = {tap: t.numpy() for tap, t in taps.items()}
    return out

"""The `pytorch` backend: the reference model itself (reference/model.py), in float32 and float64.

In float64 the float32 weights are upcast and everything, the positional table included, is
computed in float64: this is what the fp64 golden file holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import numpy as np

from harness.backends.base import Backend, BackendOutput, Precision

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from harness.fixture import Case, Fixture
    from reference.config import GPTConfig

    # reference.model.run_with_taps, or a patched copy of it: (params, config, tokens) -> {tap: tensor}
    # (params, config, tokens[, lens_rows]) -> {tap: tensor}
    RunWithTaps: TypeAlias = Callable[..., dict[str, torch.Tensor]]


class PyTorchBackend(Backend):
    name: ClassVar[str] = "pytorch"
    description: ClassVar[str] = "the PyTorch reference (reference/model.py)"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64")
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    install_hint: ClassVar[str] = "pip install 'parity[torch]'"

    streams: ClassVar[bool] = True  # one case at a time: memory bounded by one case

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return dict(self.run_cases(fixture, precision))

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        weights = fixture.weights()
        fixture.release_weights()  # a GPT-2-sized fixture: only this dict holds the float32 copy now
        params = reference_params(weights, precision, consume=True)  # each float32 array freed once cast
        lens_rows = fixture.lens_rows()
        for case in fixture.cases:
            yield case.name, dict(reference_taps(params, fixture.config, [case], precision, lens_rows=lens_rows,
                                                 cast=False)[case.name])


def reference_params(
    weights: Mapping[str, np.ndarray], precision: Precision, consume: bool = False
) -> dict[str, torch.Tensor]:
    """The float32 weights as torch tensors of the precision's dtype (upcast once for fp64).

    `consume`: pop each array from `weights` (a dict) as it is converted, so the float32 and the
    converted copies of a GPT-2-sized model are never both whole in memory.
    """
    import torch

    dtype = torch.float32 if precision == "fp32" else torch.float64
    if consume and isinstance(weights, dict):
        return {k: torch.tensor(weights.pop(k), dtype=dtype) for k in list(weights)}
    return {k: torch.tensor(v, dtype=dtype) for k, v in weights.items()}  # one copy each, in the dtype


def reference_taps(
    weights: Mapping[str, Any], config: GPTConfig, cases: Sequence[Case], precision: Precision,
    run_with_taps: RunWithTaps | None = None, lens_rows: int | None = None, cast: bool = True,
) -> BackendOutput:
    """Every tap of every case from reference/model.py: {case: {tap: array}}; also what the golden files hold.

    `run_with_taps` replaces `reference.model.run_with_taps` (the self-test runs patched copies of it).
    `lens_rows`: probs and the logit lens for the last positions only. `cast=False`: `weights` are
    already torch tensors of the precision's dtype (`reference_params`).
    """
    import torch

    from reference import model

    compute = run_with_taps or model.run_with_taps
    torch.set_num_threads(1)  # bit-reproducible reductions
    params: Any = reference_params(weights, precision) if cast else weights
    out: BackendOutput = {}
    for case in cases:
        if lens_rows is None:
            taps = compute(params, config, list(case.tokens))  # contiguous copies, one per tap
        else:
            taps = compute(params, config, list(case.tokens), lens_rows)
        out[case.name] = {tap: t.numpy() for tap, t in taps.items()}
    return out

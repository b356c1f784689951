"""Run the reference model on NumPy weights: every tap of every case, as the golden files hold them.

`reference_taps` is what `parity export` writes into the golden files, what the `pytorch` backend
returns, and what the self-test runs with a patched copy of `run_with_taps`. In "fp64" the float32
weights are upcast and everything, the positional table included, is computed in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    import numpy as np
    import torch

    from reference.config import GPTConfig

    # reference.model.run_with_taps, or a patched copy of it: (params, config, tokens) -> {tap: tensor}
    RunWithTaps: TypeAlias = Callable[[Mapping[str, torch.Tensor], GPTConfig, list[int]], dict[str, torch.Tensor]]


class CaseLike(Protocol):
    """An input: a unique name and its token ids (harness.fixture.Case is one)."""

    @property
    def name(self) -> str: ...

    @property
    def tokens(self) -> Sequence[int]: ...


def torch_params(weights: Mapping[str, np.ndarray], precision: str) -> dict[str, torch.Tensor]:
    """The weights as torch tensors of the precision's dtype ("fp32" or "fp64"), on one thread (reproducible)."""
    import torch

    dtype = torch.float32 if precision == "fp32" else torch.float64
    torch.set_num_threads(1)  # bit-reproducible reductions
    return {k: torch.from_numpy(v.copy()).to(dtype) for k, v in weights.items()}


def reference_taps(
    weights: Mapping[str, np.ndarray], config: GPTConfig, cases: Sequence[CaseLike], precision: str,
    run_with_taps: RunWithTaps | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Every tap of every case from reference/model.py: {case: {tap: array}}.

    `run_with_taps` replaces `reference.model.run_with_taps` (the self-test runs patched copies of it).
    """
    from reference import model

    compute = run_with_taps or model.run_with_taps
    params = torch_params(weights, precision)
    out: dict[str, dict[str, np.ndarray]] = {}
    for case in cases:
        taps = compute(params, config, list(case.tokens))  # contiguous copies, one per tap
        out[case.name] = {tap: t.numpy() for tap, t in taps.items()}
    return out

"""Run the reference model on NumPy weights: every tap of every case, as the golden files hold them.

`reference_taps` is what `parity export` writes into the golden files, what the `pytorch` backend
returns, and what the self-test runs with a patched copy of `run_with_taps`. In "fp64" the float32
weights are upcast and everything, the positional table included, is computed in float64; in "fp16"
and "bf16" the weights are rounded to that dtype, every op computes in it, and the taps are widened
to float32 (exactly) on the way out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:
    import numpy as np
    import torch

    # parity_reference.model.run_with_taps, or a patched copy of it: (params, config, tokens[, lens_rows]) -> {tap:
    # tensor}
    RunWithTaps: TypeAlias = Callable[..., dict[str, torch.Tensor]]

    from parity_reference.config import GPTConfig


class CaseLike(Protocol):
    """An input: a unique name and its token ids (parity_harness._fixture.fixture.Case is one)."""

    @property
    def name(self) -> str: ...

    @property
    def tokens(self) -> Sequence[int]: ...


def torch_dtype(precision: str) -> torch.dtype:
    """The torch dtype a precision computes in: fp32, fp64, fp16 (float16) or bf16 (bfloat16)."""
    import torch

    dtypes = {"fp32": torch.float32, "fp64": torch.float64, "fp16": torch.float16, "bf16": torch.bfloat16}
    return dtypes[precision]


def torch_params(weights: Mapping[str, np.ndarray], precision: str, consume: bool = False) -> dict[str, torch.Tensor]:
    """The weights as torch tensors of the precision's dtype ("fp32", "fp64", "fp16" or "bf16"), on one thread
    (reproducible).

    `consume`: pop each array from `weights` (a dict) as it is converted, so that the float32 and the
    converted copies of a GPT-2-sized model are never both whole in memory.
    """
    import torch

    dtype = torch_dtype(precision)
    torch.set_num_threads(1)  # bit-reproducible reductions
    if consume and isinstance(weights, dict):
        return {k: torch.tensor(weights.pop(k), dtype=dtype) for k in list(weights)}
    return {k: torch.tensor(v, dtype=dtype) for k, v in weights.items()}  # one copy each, in the dtype


def reference_taps(
    weights: Mapping[str, Any], config: GPTConfig, cases: Sequence[CaseLike], precision: str,
    run_with_taps: RunWithTaps | None = None, lens_rows: int | None = None, cast: bool = True,
) -> dict[str, dict[str, np.ndarray]]:
    """Every tap of every case from parity_reference/model.py: {case: {tap: array}}.

    `run_with_taps` replaces `parity_reference.model.run_with_taps` (the self-test runs patched copies of it).
    `lens_rows`: probs and the logit lens for the last positions only. `cast=False`: `weights` are
    already torch tensors of the precision's dtype (`torch_params`).
    """
    import torch

    from parity_reference import model

    compute = run_with_taps or model.run_with_taps
    torch.set_num_threads(1)  # bit-reproducible reductions
    params: Any = torch_params(weights, precision) if cast else weights
    out: dict[str, dict[str, np.ndarray]] = {}
    for case in cases:
        if lens_rows is None:
            taps = compute(params, config, list(case.tokens))  # contiguous copies, one per tap
        else:
            taps = compute(params, config, list(case.tokens), lens_rows)
        # fp16 and bf16 taps leave as float32 arrays holding the same values (exact: a widening cast)
        out[case.name] = {tap: (t.to(torch.float32) if t.dtype in (torch.float16, torch.bfloat16) else t).numpy()
                          for tap, t in taps.items()}
    return out

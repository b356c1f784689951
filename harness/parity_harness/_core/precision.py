"""The plain types every layer shares: the precisions, their NumPy dtypes, and what a backend returns.

This module imports nothing of parity's, so the fixture reader, the comparison, the runner, the
views and the backends can all depend on it without depending on each other.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

Precision = Literal["fp32", "fp64"]  # what a backend computes in, and which golden tier
PRECISIONS: tuple[Precision, ...] = ("fp32", "fp64")
DTYPES: dict[Precision, type[np.floating[Any]]] = {"fp32": np.float32, "fp64": np.float64}
BackendOutput = dict[str, dict[str, np.ndarray]]  # {case name: {tap name: array}}


def tiers_for(precision: Precision) -> list[Precision]:
    """The golden files a result of `precision` is compared with, in report order: a float64 result
    against the float64 golden, and against the float32 one at the fp32 tolerance."""
    return ["fp32"] if precision == "fp32" else ["fp64", "fp32"]

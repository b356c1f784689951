"""The plain types every layer shares: the precisions, their NumPy dtypes, and what a backend returns.

This module imports nothing of parity's, so the fixture reader, the comparison, the runner, the
views and the backends can all depend on it without depending on each other.

Four precisions, two golden tiers, and four stored weight formats. `fp32` and `fp64` are also the golden
tiers (the fixture's two golden files). `fp16` and `bf16` are reduced precisions (docs/tolerances.md,
"Reduced precision"):
NumPy has no bfloat16, so a backend returns their results as **float32 arrays holding values exactly
representable in the precision** (the container, `DTYPES`), checked at the boundary (`unrepresentable`),
and they are judged against both golden tiers at the per-tap rule `c * eps * M_tap`.

The stored weight formats (`STORED`: "f16", "q8_0", "q4_0", "q4_k", parity_harness/_fixture/stored_weights.py) are
the weights as a GGUF file stores them, computed in float32: their golden is the float64 reference run on exactly
those weights (one tier, "fp64"), judged at the per-tap rule with `EPS` the spacing of what the runtime's kernels
round the activations to (fp16 for f16 weights, q8 blocks for the quantized ones), docs/tolerances.md
"Stored weights".
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

Precision = Literal["fp32", "fp64", "fp16", "bf16", "f16", "q8_0", "q4_0", "q4_k"]  # what a backend computes in
Tier = Literal["fp32", "fp64"]  # a golden file (and the precision that made it)
TIERS: tuple[Tier, ...] = ("fp32", "fp64")
REDUCED: tuple[Precision, ...] = ("fp16", "bf16")  # judged by the per-tap rule, in a float32 container
# Weights as a stored format holds them, computed in float32 (judged against the goldens of those weights).
STORED: tuple[Precision, ...] = ("f16", "q8_0", "q4_0", "q4_k")
PRECISIONS: tuple[Precision, ...] = (*TIERS, *REDUCED, *STORED)
DEFAULT_PRECISIONS: tuple[Precision, ...] = TIERS  # what `--precision all` (and no --precision) runs
# The dtype of the arrays a backend returns: fp16 and bf16 results come as float32 (exactly representable values).
DTYPES: dict[Precision, type[np.floating[Any]]] = {
    "fp32": np.float32, "fp64": np.float64, "fp16": np.float32, "bf16": np.float32,
    "f16": np.float32, "q8_0": np.float32, "q4_0": np.float32, "q4_k": np.float32}
# Machine epsilon: the spacing of numbers just above 1 (fp16 2^-10, bf16 2^-7: 10 and 7 stored mantissa bits).
# A stored format's: what the runtime rounds activations to before a product with its weights: fp16 for f16
# weights (ggml's F16 dot products), a q8 block (8-bit steps of the block's largest value) for quantized ones.
EPS: dict[Precision, float] = {"fp32": 2.0**-23, "fp64": 2.0**-52, "fp16": 2.0**-10, "bf16": 2.0**-7,
                               "f16": 2.0**-10, "q8_0": 2.0**-7, "q4_0": 2.0**-7, "q4_k": 2.0**-7}
# The largest finite value (bf16 keeps float32's exponent range).
MAX_FINITE: dict[Precision, float] = {p: float(np.finfo(np.float32).max) for p in ("fp32", "bf16")} | {
    "fp64": float(np.finfo(np.float64).max), "fp16": float(np.finfo(np.float16).max)}
BackendOutput = dict[str, dict[str, np.ndarray]]  # {case name: {tap name: array}}


def tiers_for(precision: Precision) -> list[Tier]:
    """The golden files a result of `precision` is compared with, in report order: a float64 result
    against the float64 golden, and against the float32 one at the fp32 tolerance; a reduced-precision
    result against both, at its own per-tap rule."""
    if precision in STORED:  # the goldens of the weights it was given: one tier, their float64 truth
        return ["fp64"]
    return ["fp32"] if precision == "fp32" else ["fp64", "fp32"]


def is_tier(precision: str) -> bool:
    """True for fp32 and fp64, the golden tiers: the only precisions decoding and the backward are checked in (fp16
    and bf16 are the forward pass only; a stored format's goldens are of the forward pass on its own weights)."""
    return precision in TIERS


def is_stored(precision: str) -> bool:
    """True for a stored weight format: f16, q8_0, q4_0, q4_k (float32 arithmetic on weights as the format holds)."""
    return precision in STORED


def is_reduced(precision: str) -> bool:
    """True for fp16 and bf16: the precisions judged by the per-tap rule, in a float32 container."""
    return precision in REDUCED


def on_grid(x: np.ndarray, grid: Precision) -> np.ndarray:
    """Which cells of a float32 array are finite values of `grid`: "bf16", the float32's low 16 bits zero;
    "fp16", x == f32(f16(x)) and |x| <= 65504 (a finite float32 beyond it would be inf in fp16)."""
    finite = np.isfinite(x)
    if grid == "bf16":
        low_zero: np.ndarray = (x.view(np.uint32) & np.uint32(0xFFFF)) == 0
        return np.asarray(finite & low_zero)
    with np.errstate(over="ignore", invalid="ignore"):
        exact: np.ndarray = (np.abs(x) <= MAX_FINITE["fp16"]) & (x.astype(np.float16).astype(np.float32) == x)
    return np.asarray(finite & exact)


def off_grid(x: np.ndarray, grid: Precision) -> np.ndarray:
    """Which cells of a float32 array are finite but not values of `grid`: `isfinite(x) & ~on_grid(x, grid)`,
    in fewer passes. bf16: a finite float32 with a low bit set; fp16: a finite x with f32(f16(x)) != x
    (a finite float32 beyond 65504 rounds to 65504 or inf in fp16, so it is not equal either)."""
    finite: np.ndarray = np.isfinite(x)
    if grid == "bf16":
        finite &= (x.view(np.uint32) & np.uint32(0xFFFF)) != 0
        return finite
    with np.errstate(over="ignore", invalid="ignore"):
        finite &= x.astype(np.float16).astype(np.float32) != x
    return finite


def unrepresentable(array: np.ndarray, precision: Precision) -> tuple[int, ...] | None:
    """The first finite cell of a float32 `array` that is not exactly representable in `precision`, or None.

    fp16: x == float32(float16(x)) (a finite float32 beyond 65504 is not: fp16 would hold inf);
    bf16: the low 16 bits of the float32 are zero (`on_grid`, `off_grid`). Non-finite cells are left to the judge.
    """
    if not is_reduced(precision) or array.dtype != np.float32 or array.size == 0:
        return None
    bad = off_grid(array, precision)
    if not bad.any():
        return None
    return tuple(int(i) for i in np.argwhere(bad)[0])

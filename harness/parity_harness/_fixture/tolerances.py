"""The tolerance ceilings: how loose a fixture's tolerances may be before parity refuses them.

A tolerance is part of the fixture (manifest.json, under its seal), so a fixture is also what
decides how much disagreement passes. `atol 1e9` passes anything; so the manifest's tolerances are
bounded here, per golden tier, and a fixture beyond a ceiling is refused (exit 2) unless the user
passes `--allow-loose-tolerances`, in which case every report says the run was loose. The numbers
and their reasons are in docs/tolerances.md ("Ceilings").

- A tier's default `atol` and `rtol` must be at most the tier's ceiling.
- A per-tap override's `rtol` must be at most the tier's rtol ceiling; its `atol` at most the
  tier's atol ceiling times M, the largest golden magnitude up to that tap (max |golden| over
  cases and finite cells, of that tap and every tap before it in dataflow order) when M > 1: an
  override exists to scale a tolerance with the magnitude (`c * eps * M`), round-off is carried
  downstream, and the bugs a tier must catch grow with the magnitude too.
- A bounded tap (`ModelSpec.value_range`, from the family's table: its values lie in a range known from
  the model alone, such as a
  softmax's [0, 1]) counts M only up to BOUNDED_SPAN times the width of its own range: whatever
  was carried from upstream, an atol comparable to the range would pass any numbers in the range
  (uniform probabilities among them).
- A reduced precision (fp16, bf16) has no tolerance of its own in the golden tiers: its atol is the
  per-tap rule `c * eps * M_tap` (`reduced_atol`), M_tap the fp32 golden's, rtol 0, the same in both
  tiers; c is `REDUCED_C` unless the manifest states its own (`tolerances.reduced`), at most
  `REDUCED_C_CEILING` (docs/tolerances.md, "Reduced precision").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from parity_harness._core.precision import EPS, Precision

# The defaults `parity export` writes (docs/tolerances.md: the measured budget behind each).
FP32_ATOL = 1e-5  # the lesson's gate
FP32_RTOL = 1e-5  # float32 round-off grows with the magnitude (4 ulp at 27.6 measured)
FP64_ATOL = 1e-12  # measured float64 round-off budget


# c of the per-tap rule atol = c * eps * M_tap for the reduced precisions, measured with the pytorch and
# numpy backends on the toy and gpt2-mini (docs/tolerances.md, "Reduced precision": the budget and the margin).
REDUCED_C: dict[Precision, float] = {"fp16": 32.0, "bf16": 32.0}
REDUCED_C_CEILING = 4.0  # a manifest's c may be at most this many times the default


# The aggregate rule's bound (docs/tolerances.md, "Systematic error"): a tap fails when its gain error or its
# offset over every case (`_compare/budget.py`, `SystematicRow`) exceeds this many of the precision's eps, per
# unit of the tap's allowance (its per-cell atol over the tier's default, at least 1). At least 3x the worst of
# every honest built-in backend measured on the toy, the stress fixture, gpt2-mini and gpt2-small (fp32 4.34,
# fp64 56.6, fp16 1.37, bf16 0.98), and at least 2x below the systematic errors the tiers must catch (fp16
# x 0.99: 10.6; bf16 x 0.95: 6.6; fp32 + 1e-5 on the toy's blocks.0.hook_resid_mid: 91).
SYSTEMATIC_BOUND: dict[Precision, float] = {"fp32": 16.0, "fp64": 200.0, "fp16": 4.5, "bf16": 3.0,
                                            "f16": 4.5, "q8_0": 3.0, "q4_0": 3.0, "q4_k": 3.0}

# A stored weight format's c in atol = c * eps * M_tap against the goldens of its own weights (stored_goldens.py;
# eps: what the runtime rounds activations to, precision.EPS), from the budget measured on llama.cpp
# (docs/tolerances.md, "Stored weights").
STORED_C: dict[Precision, float] = {"f16": 4.0, "q8_0": 12.0, "q4_0": 12.0, "q4_k": 16.0}


@dataclass(frozen=True)
class Ceiling:
    atol: float
    rtol: float


CEILINGS: dict[Precision, Ceiling] = {
    # 100x the toy's gate (1e-5), and below the smallest bug the fp32 tier exists to catch
    # (LayerNorm eps 1e-6: 1.5e-3; tanh GELU 5e-4 is caught by the fp64 tier as well).
    "fp32": Ceiling(atol=1e-3, rtol=1e-3),
    # 10,000x the toy's gate (1e-12), and below the smallest bug the fp64 tier exists to catch
    # (float32 positions: 3e-8; the erf polynomial: 1.5e-7).
    "fp64": Ceiling(atol=1e-8, rtol=1e-8),
}


# A bounded tap's carried magnitude counts up to this many widths of its range: the fp32 override
# ceiling of a probability is then 0.1 (1e-3 x 100), 3x the largest difference measured on the stress
# fixture (0.031) and 8x below the distance of uniform probabilities from the goldens (>= 0.86);
# docs/tolerances.md, "Bounded taps".
BOUNDED_SPAN = 100.0


def default_problems(precision: Precision, atol: float, rtol: float) -> list[str]:
    """Why a tier's default tolerance is beyond its ceiling (empty when it is within)."""
    c = CEILINGS[precision]
    out = []
    if atol > c.atol:
        out.append(f"tolerances.{precision}.atol {atol:g} is above the ceiling {c.atol:g}")
    if rtol > c.rtol:
        out.append(f"tolerances.{precision}.rtol {rtol:g} is above the ceiling {c.rtol:g}")
    return out


def override_atol_ceiling(precision: Precision, magnitude: float, bounds: tuple[float, float] | None) -> float:
    """The largest atol an override may have: the tier's atol ceiling x max(1, M), M counted up to
    BOUNDED_SPAN x the width of the tap's range when the tap is bounded (`ModelSpec.value_range`)."""
    carried = max(1.0, magnitude)
    if bounds is not None:
        carried = min(carried, max(1.0, BOUNDED_SPAN * (bounds[1] - bounds[0])))
    return CEILINGS[precision].atol * carried


def override_problems(
    precision: Precision, tap: str, atol: float, rtol: float, magnitude: float,
    bounds: tuple[float, float] | None = None,
) -> list[str]:
    """Why a per-tap override is beyond its ceiling, given the largest golden magnitude up to that tap
    and, for a bounded tap, the range its values lie in (`ModelSpec.value_range`)."""
    c = CEILINGS[precision]
    limit = override_atol_ceiling(precision, magnitude, bounds)
    out = []
    where = f"tolerances.{precision}.overrides[{tap!r}]"
    if atol > limit:
        why = f"{c.atol:g} x max(1, largest golden magnitude up to this tap {magnitude:.3g})"
        if bounds is not None and limit < c.atol * max(1.0, magnitude):
            why = (f"a tap in the range [{bounds[0]:.3g}, {bounds[1]:.3g}]: {c.atol:g} x {BOUNDED_SPAN:g} x its width, "
                   f"not x the magnitude {magnitude:.3g} carried from upstream")
        out.append(f"{where}.atol {atol:g} is above the ceiling {limit:.3g} ({why})")
    if rtol > c.rtol:
        out.append(f"{where}.rtol {rtol:g} is above the ceiling {c.rtol:g}")
    return out


def reduced_atol(precision: Precision, c: float, magnitude: float,
                 bounds: tuple[float, float] | None = None) -> float:
    """The per-tap atol of a reduced precision: c * eps * M_tap (M at least float32's tiny, so a tap of
    zeros gets an atol that only zeros pass).

    A bounded tap (`ModelSpec.value_range`) counts c only up to the measured default `REDUCED_C` and M only up to
    the width of its range: a re-sealed c exists for the magnitudes round-off carries from upstream, which
    a bounded tap's values do not grow with, and at the ceiling c (bf16: 128 x 2^-7 = 1) an atol of the
    whole range would pass any values in it, uniform probabilities among them (docs/tolerances.md,
    "Bounded taps"). At the default c this changes nothing: a bounded tap's M is within its width.
    """
    if bounds is not None:
        c = min(c, REDUCED_C[precision])
        magnitude = min(magnitude, bounds[1] - bounds[0])
    return c * EPS[precision] * max(magnitude, float(np.finfo(np.float32).tiny))


def reduced_c_problems(precision: Precision, c: float) -> list[str]:
    """Why a manifest's c for a reduced precision is beyond its ceiling (empty when it is within)."""
    limit = REDUCED_C_CEILING * REDUCED_C[precision]
    if c > limit:
        return [f"tolerances.reduced.{precision}.c {c:g} is above the ceiling {limit:g} "
                f"({REDUCED_C_CEILING:g} x the measured default {REDUCED_C[precision]:g})"]
    return []


def tap_magnitude(tensors: Iterable[np.ndarray]) -> float:
    """M: the largest |value| over the finite cells of a tap's tensors (0.0 when there are none)."""
    magnitude = 0.0
    for g in tensors:
        magnitude = max(magnitude, _largest_finite_abs(g))
    return magnitude


def _largest_finite_abs(g: np.ndarray) -> float:
    """max |x| over the finite cells of `g`, 0.0 when there are none.

    A float array whose smallest and largest values are finite has only finite cells, and then its
    largest |x| is the larger of |min| and |max|: two reductions, no temporary. Anything else (an
    infinity, a NaN, another dtype) takes the cells that are finite and their |x|, as it always did.
    """
    if g.size and g.dtype.kind == "f":
        low, high = float(g.min()), float(g.max())
        if math.isfinite(low) and math.isfinite(high):
            return max(abs(low), abs(high))
    finite = g[np.isfinite(g)]
    return float(np.abs(finite).max()) if finite.size else 0.0

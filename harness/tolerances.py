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
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.precision import Precision

# The defaults `parity export` writes (docs/tolerances.md: the measured budget behind each).
FP32_ATOL = 1e-5  # the lesson's gate
FP32_RTOL = 1e-5  # float32 round-off grows with the magnitude (4 ulp at 27.6 measured)
FP64_ATOL = 1e-12  # measured float64 round-off budget


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


def default_problems(precision: Precision, atol: float, rtol: float) -> list[str]:
    """Why a tier's default tolerance is beyond its ceiling (empty when it is within)."""
    c = CEILINGS[precision]
    out = []
    if atol > c.atol:
        out.append(f"tolerances.{precision}.atol {atol:g} is above the ceiling {c.atol:g}")
    if rtol > c.rtol:
        out.append(f"tolerances.{precision}.rtol {rtol:g} is above the ceiling {c.rtol:g}")
    return out


def override_problems(precision: Precision, tap: str, atol: float, rtol: float, magnitude: float) -> list[str]:
    """Why a per-tap override is beyond its ceiling, given the largest golden magnitude up to that tap."""
    c = CEILINGS[precision]
    limit = c.atol * max(1.0, magnitude)
    out = []
    where = f"tolerances.{precision}.overrides[{tap!r}]"
    if atol > limit:
        out.append(f"{where}.atol {atol:g} is above the ceiling {limit:.3g} "
                   f"({c.atol:g} x max(1, largest golden magnitude up to this tap {magnitude:.3g}))")
    if rtol > c.rtol:
        out.append(f"{where}.rtol {rtol:g} is above the ceiling {c.rtol:g}")
    return out

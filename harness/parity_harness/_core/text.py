"""How every view writes a number, a tier and a tolerance: one format for the terminal, Markdown and JUnit.

Imports nothing of parity's, so each view (report, markdown, junit, decode_report) uses it without
importing another view.
"""

from __future__ import annotations

import math


def num_text(x: float | None) -> str:
    """An error as the reports print it: '4.2e-03', 'inf' for a structural failure, '-' for none."""
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else f"{x:.1e}"


def tier_label(precision: str, golden: str) -> str:
    """What a backend computed in against which golden file: 'fp64 vs fp32'; a stored weight format against the
    float64 goldens of the weights it stores: 'q8_0 vs own fp64'."""
    from parity_harness._core.precision import is_stored

    return f"{precision} vs own {golden}" if is_stored(precision) else f"{precision} vs {golden}"


def tier_key(precision: str, golden: str) -> str:
    """The same, compact, where a column or a JSON list holds it: 'fp64/fp32' (the self-test's tiers)."""
    return f"{precision}/{golden}"


def tolerance_text(atol: float, rtol: float, rule: bool = False) -> str:
    """'atol 1e-05', or with an rtol 'atol 1e-05, rtol 1e-05' ('atol 1e-05 + rtol 1e-05 x |expected|')."""
    if not rtol:
        return f"atol {atol:g}"
    return f"atol {atol:g} + rtol {rtol:g} x |expected|" if rule else f"atol {atol:g}, rtol {rtol:g}"


def format_pair(actual: float, expected: float, digits: int = 9) -> tuple[str, str]:
    """Two values as 'got A, expected B' prints them: `digits` significant digits (9), more when the two would
    print the same but differ, up to repr precision (17), so an fp64 divergence of 7.8e-12 shows where."""
    if actual == expected or not (math.isfinite(actual) and math.isfinite(expected)):
        return f"{actual:.{digits}g}", f"{expected:.{digits}g}"
    for n in range(digits, 18):
        a, e = f"{actual:.{n}g}", f"{expected:.{n}g}"
        if a != e:
            return a, e
    return repr(float(actual)), repr(float(expected))

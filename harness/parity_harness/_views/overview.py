"""The terminal's default view of a run: one line per backend x tier, read in ten seconds.

Each line says how many taps the tier compared, the share of its tolerance its worst tap used (or, when it
fails, how many taps fail from which first one), its decoding check and its time. The per-tap table is
`-v` (parity_harness/_views/console.py). Renders `Report.tree` (parity_harness/_compare/tree.py) and
regroups nothing; the lines go through the console's one sink.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from parity_harness._core.status import GreedyStatus, RunStatus
from parity_harness._core.text import tier_label

if TYPE_CHECKING:
    from parity_harness._compare.report import Report
    from parity_harness._compare.tree import DecodingNode, TierNode


def share_text(used: float) -> str:
    """A share of the tolerance: '12%', '3.4x', 'inf' (a structural failure), '-' (nothing measured)."""
    if used < 0:
        return "-"
    if math.isinf(used):
        return "inf"
    if 0 < used < 0.005:
        return "<1%"  # measured, and far inside: not "0%", which reads as exact
    return f"{100 * used:.0f}%" if used < 10 else f"{used:.3g}x"


def _taps_cell(tier: TierNode) -> str:
    worst = tier.worst
    if tier.divergence is not None:
        n = tier.n_failed
        return (f"FAIL  {n} tap{'s' if n != 1 else ''} fail, first {tier.divergence.tap}"
                f" ({share_text(next(t.used for t in tier.taps if t.tap == tier.divergence.tap))} of tolerance)")
    if worst is None:
        return "n/a   not supported"
    return f"ok    worst {share_text(worst.used)} of tolerance ({worst.tap})"


def _decoding_cell(tier: TierNode, dec: DecodingNode | None) -> str:
    if dec is None or not dec.source.available or not dec.source.runs:
        return ""
    mine = next((t for t in dec.tiers if (t.backend, t.precision, t.golden)
                 == (tier.backend, tier.precision, tier.golden)), None)
    greedy = next((g for g in dec.greedy if (g.backend, g.precision) == (tier.backend, tier.precision)), None)
    if mine is None:
        return "-"
    if mine.divergence is not None:
        d = mine.divergence
        return f"FAIL at step {d.step or 0}, {d.tap}"
    rows = greedy.rows if greedy is not None and tier.golden == tier.precision else ()
    if any(g.status == GreedyStatus.FAIL for g in rows):
        return "FAIL (greedy tokens)"
    ties = sum(1 for g in rows if g.status == GreedyStatus.NEAR_TIE)
    worst = mine.worst
    text = f"ok, worst {share_text(worst.used) if worst else '-'}"
    return text + (f", {ties} near-tie{'s' if ties != 1 else ''}" if ties else "")


def overview_lines(report: Report) -> list[str]:
    """The table (a header, one line per backend x tier) and one line each for what was not run."""
    tree = report.tree
    rows = []
    for tier in tree.tiers:
        time = f"{tier.seconds:.2f} s" if tier.seconds else ""
        rows.append([tier.backend, tier_label(tier.precision, tier.golden),
                     f"{tier.n_compared}/{len(tier.taps)}", _taps_cell(tier), _decoding_cell(tier, tree.decoding),
                     time])
    lines: list[str] = []
    if rows:
        checked = tree.decoding is not None and tree.decoding.source.available and bool(tree.decoding.source.runs)
        header = ["backend", "tier", "taps", "verdict", "decoding" if checked else "", "time"]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    idle: dict[str, list[str]] = {}  # why -> the runs it kept from running
    for r in tree.runs:
        if r.status == RunStatus.NOT_SUPPORTED:
            idle.setdefault(r.message or "not supported", []).append(f"{r.backend} {r.precision}")
    if idle:
        lines.append("not run: " + "; ".join(f"{', '.join(runs)} ({why})" for why, runs in idle.items()))
    dec = tree.decoding.source if tree.decoding is not None else None
    if dec is not None and not dec.available:
        lines.append("decoding: not checked: the fixture has no decoding goldens (no files.decoding in its manifest)")
    elif dec is not None and not dec.runs:
        lines.append("decoding: not checked: no selected backend supports decoding")
    if dec is not None and dec.available and dec.not_supported:
        lines.append(f"decoding not supported by: {', '.join(dec.not_supported)}")
    for run in tree.runs:
        if run.status == RunStatus.CRASHED:
            lines.append(f"{run.backend} {run.precision}: CRASHED after {run.seconds:.2f} s: {run.message}")
    return lines


def first_tap_text(report: Report) -> str:
    """', first at TAP' for the verdict: the tap the first divergence names, or '' when none."""
    first = report.tree.first
    if first is None:
        return ""
    where = f"{first.tap}" if first.step is None else f"{first.tap} (decoding step {first.step})"
    return f", first at {where}"


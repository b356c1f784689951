"""A Markdown summary of a parity run (`parity run --markdown PATH`), for pull requests and CI pages.

One table row per backend x tier: taps passed / failed / not supported, the tap that used most of
its tolerance and its max error, then the first divergences; the decoding check, when the run made
one, as the same table for its taps, the greedy tokens and its first divergences; then the verdict. When the environment
variable GITHUB_STEP_SUMMARY is set (GitHub Actions), the same text is appended to that file too.
Every line goes through `parity_harness._core.sanitize.markdown_line` (table cells through `markdown_cell`), so
a string from outside cannot add a line, a column, a control character or raw HTML.
"""

from __future__ import annotations

import math
from pathlib import Path

from parity_harness._compare.judge import FAIL, NOT_SUPPORTED, OK, TapSummary
from parity_harness._compare.report import Report
from parity_harness._core.sanitize import markdown_cell, markdown_line
from parity_harness._core.text import num_text, tier_label, tolerance_text
from parity_harness._views.console import divergence_paragraph, loose_line, tolerances_line, verdict_line


def _used(s: TapSummary) -> float:
    """How much of its tolerance a tap used: min_atol / atol (> 1 fails); inf for a structural failure."""
    if s.min_atol is None:
        return -1.0
    if s.atol == 0:
        return math.inf if s.min_atol > 0 else 0.0
    return s.min_atol / s.atol


def summary_rows(summaries: list[TapSummary]) -> list[list[str]]:
    """The table body: one row per backend x precision x golden tier, in report order (forward taps or
    decoding taps: the same records)."""
    tiers: dict[tuple[str, str, str], list[TapSummary]] = {}
    for s in summaries:
        tiers.setdefault((s.backend, s.precision, s.golden), []).append(s)
    rows = []
    for (backend, precision, golden), group in tiers.items():
        measured = [s for s in group if s.status != NOT_SUPPORTED]
        n_ok = sum(1 for s in group if s.status == OK)
        n_fail = sum(1 for s in group if s.status == FAIL)
        verdict = "FAIL" if n_fail else "pass" if n_ok else "n/a"
        worst = max(measured, key=_used, default=None)
        if worst is None:
            worst_tap, worst_err, used = "-", "-", "-"
        else:
            u = _used(worst)
            worst_tap = f"`{worst.tap}`"
            worst_err = f"{num_text(worst.max_abs)} ({tolerance_text(worst.atol, worst.rtol)})"
            used = "inf" if math.isinf(u) else f"{100 * u:.0f}%" if u < 10 else f"{u:.2g}x"
        rows.append([backend, tier_label(precision, golden), verdict, str(n_ok), str(n_fail),
                     str(len(group) - len(measured)), worst_tap, worst_err, used])
    return rows


def markdown_summary(report: Report) -> str:
    """The whole summary as Markdown text."""
    header = ["backend", "tier", "verdict", "taps passed", "failed", "not supported", "worst tap", "max error",
              "tolerance used"]
    lines = ["## parity", "", f"Fixture `{report.fixture}`.", "", *_table(header, summary_rows(report.summaries))]
    if report.divergences:
        lines += ["", "### First divergences", ""]
        lines += [f"- {divergence_paragraph(d)}" for d in report.divergences]
    lines += _decoding_lines(report, header)
    lines += ["", tolerances_line(report)]
    if report.loose:
        lines += ["", f"**{loose_line(report)}**"]
    lines += ["", f"**{verdict_line(report)}**", ""]
    return "\n".join(markdown_line(line) for line in lines)  # the sink: no line holds a break, a control or raw HTML


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(markdown_cell(cell) for cell in row) + " |" for row in rows)]


def _decoding_lines(report: Report, header: list[str]) -> list[str]:
    """The decoding check: the same table for its taps, the greedy tokens, its first divergences."""
    from parity_harness._core.status import GreedyStatus
    from parity_harness._views.decoding import divergence_paragraph as decoding_paragraph

    dec = report.decoding
    if dec is None or not dec.available or not dec.runs:
        return []
    lines = ["", f"### Decoding ({len(dec.prompts)} prompts, prefill + {dec.steps} steps, against the full forward)",
             "", *_table(header, summary_rows(dec.summaries)), ""]
    differ = [g for g in dec.greedy if g.status != GreedyStatus.OK]
    lines.append(f"Greedy tokens: {len(dec.greedy) - len(differ)} of {len(dec.greedy)} backend x prompt runs equal "
                 "the golden's" + (f"; {dec.n_near_ties} near-tie(s)" if dec.n_near_ties else "") + ".")
    for d in dec.divergences:
        lines.append(f"- {decoding_paragraph(d, dec.sequences.get(d.case, []), dec.vocab)}")
    return lines


def write_markdown(report: Report, path: Path, step_summary: str | None) -> None:
    """Write the summary to `path`, and append it to `step_summary` ($GITHUB_STEP_SUMMARY as the command read it
    when it started, absolute) when that is set."""
    from parity_harness._core.output_paths import write_report_text

    text = markdown_summary(report)
    write_report_text(path, text, "Markdown summary")
    if step_summary:
        write_report_text(Path(step_summary), text + "\n", "$GITHUB_STEP_SUMMARY", append=True)

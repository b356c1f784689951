"""A Markdown summary of a parity run (`parity run --markdown PATH`), for pull requests and CI pages.

The verdict first, then one table row per backend x tier of the report's tree: taps passed / failed / not
supported, its first divergence, the tap that used most of its tolerance and its max error, then the first
divergences' paragraphs; the decoding check, when the run made
one, as the same table for its taps, the greedy tokens and its first divergences. When the environment
variable GITHUB_STEP_SUMMARY is set (GitHub Actions), the same text is appended to that file too.
Every line goes through `parity_harness._core.sanitize.markdown_line` (table cells through `markdown_cell`), so
a string from outside cannot add a line, a column, a control character or raw HTML.
"""

from __future__ import annotations

from pathlib import Path

from parity_harness._compare.report import Report
from parity_harness._compare.tree import TierNode
from parity_harness._core.sanitize import markdown_cell, markdown_line
from parity_harness._core.text import num_text, tier_label, tolerance_text
from parity_harness._views.console import (
    divergence_paragraph,
    fixture_text,
    loose_line,
    stale_hint,
    tolerances_line,
    verdict_line,
)
from parity_harness._views.overview import share_text


def summary_rows(tiers: tuple[TierNode, ...]) -> list[list[str]]:
    """The table body: one row per backend x precision x golden tier of the report's tree (forward taps or
    decoding taps: the same nodes)."""
    rows = []
    for tier in tiers:
        verdict = "FAIL" if tier.n_failed else "pass" if tier.n_ok else "n/a"
        worst = tier.worst
        if worst is None:
            worst_tap, worst_err, used = "-", "-", "-"
        else:
            s = worst.summary
            worst_tap = f"`{s.tap}`"
            worst_err = f"{num_text(s.max_abs)} ({tolerance_text(s.atol, s.rtol)})"
            used = share_text(worst.used)
        first = f"`{tier.divergence.tap}`" if tier.divergence is not None else "-"
        rows.append([tier.backend, tier_label(tier.precision, tier.golden), verdict, str(tier.n_ok),
                     str(tier.n_failed), str(tier.n_not_supported), first, worst_tap, worst_err, used])
    return rows


def markdown_summary(report: Report) -> str:
    """The whole summary as Markdown text."""
    tree = report.tree
    header = ["backend", "tier", "verdict", "taps passed", "failed", "not supported", "first divergence",
              "worst tap", "max error", "tolerance used"]
    lines = ["## parity", "", f"**{verdict_line(report)}**", "", f"Fixture `{fixture_text(report)}`.", "",
             *_table(header, summary_rows(tree.tiers))]
    forward = [t.divergence for t in tree.tiers if t.divergence is not None]
    if forward:
        lines += ["", "### First divergences", ""]
        lines += [f"- {divergence_paragraph(d)}" for d in forward]
    lines += _decoding_lines(report, header)
    lines += _grad_lines(report, header)
    hint = stale_hint(report)
    lines += ["", tolerances_line(report), *(["", hint] if hint else [])]
    if report.loose:
        lines += ["", f"**{loose_line(report)}**"]
    lines += [""]
    return "\n".join(markdown_line(line) for line in lines)  # the sink: no line holds a break, a control or raw HTML


def markdown_text(report: Report, verbose: int = 0) -> str:
    """The summary (the "markdown" view)."""
    return markdown_summary(report)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(markdown_cell(cell) for cell in row) + " |" for row in rows)]


def _decoding_lines(report: Report, header: list[str]) -> list[str]:
    """The decoding check: the same table for its taps, the greedy tokens, its first divergences."""
    from parity_harness._core.status import GreedyStatus
    from parity_harness._views.decoding import divergence_paragraph as decoding_paragraph

    node = report.tree.decoding
    if node is None or not node.source.available or not node.source.runs:
        return []
    dec = node.source
    lines = ["", f"### Decoding ({len(dec.prompts)} prompts, prefill + {dec.steps} steps, against the full forward)",
             "", *_table(header, summary_rows(node.tiers)), ""]
    differ = [g for g in dec.greedy if g.status != GreedyStatus.OK]
    lines.append(f"Greedy tokens: {len(dec.greedy) - len(differ)} of {len(dec.greedy)} backend x prompt runs equal "
                 "the golden's" + (f"; {dec.n_near_ties} near-tie(s)" if dec.n_near_ties else "") + ".")
    for d in node.divergences:
        lines.append(f"- {decoding_paragraph(d, dec.sequences.get(d.case, []), dec.vocab)}")
    return lines


def _grad_lines(report: Report, header: list[str]) -> list[str]:
    """The gradient check (`--grad`): the same table for the backward and the training steps, their divergences."""
    from parity_harness._views.gradients import divergence_paragraph as grad_paragraph

    node = report.tree.grad
    if node is None or not node.source.available:
        return []
    grad = node.source
    lines = ["", f"### Backward ({len(grad.cases)} cases, the loss and {len(grad.names) - 1} gradients, nearest the "
             f"loss first) and training ({grad.steps} AdamW steps)", ""]
    for title, tiers in (("Backward", node.tiers), ("Training steps", node.train_tiers)):
        if tiers:
            lines += [f"{title}:", "", *_table(header, summary_rows(tiers)), ""]
    if grad.not_supported:
        lines.append(f"Backward not supported by: {', '.join(grad.not_supported)}.")
    for d in node.divergences:
        lines.append(f"- {grad_paragraph(d, grad)}")
    return lines


def write_markdown(report: Report, path: Path, step_summary: str | None) -> None:
    """Write the summary to `path`, and append it to `step_summary` ($GITHUB_STEP_SUMMARY as the command read it
    when it started, absolute) when that is set."""
    from parity_harness._core.output_paths import write_report_text

    text = markdown_summary(report)
    write_report_text(path, text, "Markdown summary")
    if step_summary:
        write_report_text(Path(step_summary), text + "\n", "$GITHUB_STEP_SUMMARY", append=True)

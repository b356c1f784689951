"""Render the decoding check (parity_harness/_run/decode_check.py): terminal lines after the forward table, and JSON.

The lines hold outside strings (backend and prompt names, vocabulary words) as they are: they are
printed by `report.print_report`, whose one sink makes every line safe (parity_harness/_core/sanitize.py).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from parity_harness._compare.decoding import FAIL, NEAR_TIE, DecodingReport, GreedyCheck, step_name
from parity_harness._compare.judge import FirstDivergence
from parity_harness._core.status import GreedyStatus
from parity_harness._core.text import format_pair, num_text, tier_label, tolerance_text

if TYPE_CHECKING:
    from collections.abc import Sequence

    from parity_harness._compare.tree import DecodingNode


def _words(tokens: Sequence[int], vocab: Sequence[str]) -> str:
    """The words of token ids; the id itself where the vocabulary is unknown (a merged report)."""
    return " ".join(vocab[t] if 0 <= t < len(vocab) else str(t) for t in tokens)


def greedy_line(g: GreedyCheck, vocab: Sequence[str], names: int = 22) -> str:
    label = f"  {g.backend:<{names}} {g.precision:<12} greedy tokens"
    if g.status == GreedyStatus.OK:
        return f"{label}  OK    {g.prompt}: {_words(g.actual, vocab)}"
    k = g.first_step if g.first_step is not None else 0
    got, want = _words([g.actual[k]], vocab), _words([g.expected[k]], vocab)
    what = (f"{g.prompt} differs at {step_name(k)}: {got!r}, golden {want!r}, "
            f"the golden's top-2 logit margin there {num_text(g.margin)}")
    if g.status == NEAR_TIE:
        return f"{label}  NEAR-TIE  {what}: the logits agree within tolerance, a near-tie, not a bug"
    return f"{label}  FAIL  {what}: the logits there are out of tolerance"


def _cell(d: FirstDivergence, tokens: Sequence[int], vocab: Sequence[str]) -> str:
    if d.index is None:
        return ""
    if d.tap == "logits" and len(d.index) == 1:
        v = d.index[0]
        return f", word {v} ({_words([v], vocab)!r}) {d.index}"
    if len(d.index) == 3:
        h, t, e = d.index
        word = f" ({_words([tokens[t]], vocab)!r})" if t < len(tokens) else ""
        return f", head {h}, position {t}{word}, dim {e} {d.index}"
    return f" at {d.index}"


def divergence_paragraph(d: FirstDivergence, tokens: Sequence[int], vocab: Sequence[str]) -> str:
    """e.g. "typescript fp64 vs fp64 decoding: first divergence at step 1, blocks.1.attn.cache_k, ..."."""
    values = f": {d.message}" if d.message else ""
    if not d.message and d.actual is not None and d.expected is not None:
        got, want = format_pair(d.actual, d.expected)  # the digits that show the difference
        values = (f": got {got}, expected {want} "
                  f"(|diff| {num_text(d.max_abs)} > {tolerance_text(d.atol, d.rtol)})")
    step = d.step or 0
    agree = "exactly" if d.upstream_max_abs == 0 else f"within {num_text(d.upstream_max_abs)}"
    before = ("It is the first check of the prefill: nothing before it." if d.upstream_taps == 0
              else f"The checks before it (earlier steps, and earlier taps of this step) agree ({agree}).")
    return (f"{d.backend} decoding {tier_label(d.precision, d.golden)}: first divergence at {step_name(step)}, "
            f"{d.tap}, prompt {d.case}{_cell(d, tokens, vocab)}{values}. {before} "
            f"The golden's top-2 logit margin at that step: {num_text(d.margin)}."
            + (f" Likely cause: {d.cause}." if d.cause else ""))  # named from the numbers (_compare/diagnose.py)


def decoding_lines(dec: DecodingReport, node: DecodingNode) -> list[str]:
    """The decoding section (`-v`): one line per backend x tier x decoding tap, then greedy tokens. The paragraphs
    of its first divergences come with the forward tiers' (parity_harness/_views/console.py)."""
    vocab = dec.vocab
    if not dec.available:
        return ["decoding: not checked: the fixture has no decoding goldens (no files.decoding in its manifest)"]
    lines = [f"decoding: {len(dec.prompts)} prompts, prefill + {dec.steps} steps each, incremental "
             "(key/value cache [H, T, d_head] per block) against the full forward"]
    width = max((len(t) for t in dec.taps), default=10)
    names = max((len(t.backend) for t in node.tiers), default=7)
    for name in dec.prompts:
        seq = dec.sequences.get(name, [])
        if not seq:
            continue
        n_prompt = len(seq) - dec.steps - 1
        prompt, greedy = _words(seq[:n_prompt], vocab), _words(seq[n_prompt:], vocab)
        lines.append(f"  {name:<22} {prompt} | {greedy}  (golden, greedy)")
    for tier in node.tiers:
        for tap in tier.taps:
            s = tap.summary
            label = f"  {s.backend:<{names}} {tier_label(s.precision, s.golden):<12} {s.tap:<{width}}"
            line = (f"{label}  {'OK  ' if s.passed else 'FAIL'}  max_abs {num_text(s.max_abs)}  "
                    f"max_rel {num_text(s.max_rel)}  ({tolerance_text(s.atol, s.rtol)})")
            if not s.passed:
                line += f"  {s.n_failed}/{s.n_cases} prompt x step checks, worst {s.worst_case} step {s.worst_step}"
                if tap.after is not None:
                    line += f"  (downstream of {tap.after})"
            lines.append(line)
    for group in node.greedy:
        rows = group.rows
        bad = [g for g in rows if g.status != GreedyStatus.OK]
        n = sum(len(g.expected) for g in rows)
        same = sum(a == b for g in rows for a, b in zip(g.actual, g.expected, strict=True))
        if not bad:
            lines.append(f"  {group.backend:<{names}} {group.precision:<12} greedy tokens  OK    "
                         f"{same} of {n} equal the golden's")
        lines += [greedy_line(g, vocab, names) for g in bad]
    if dec.not_supported:
        lines.append(f"decoding not supported by: {', '.join(dec.not_supported)}")
    if not dec.runs:
        lines.append("decoding: not checked: no selected backend supports decoding")
    else:
        lines.append("decoded in: " + ", ".join(f"{r.backend} {r.precision} {r.seconds:.2f} s" for r in dec.runs))
        near = f", {dec.n_near_ties} near-tie(s) reported" if dec.n_near_ties else ""
        greedy_bad = sum(g.status == FAIL for g in dec.greedy)
        lines.append(f"decoding: {dec.n_passed} passed, {dec.n_failed - greedy_bad} failed (prompt x step x tap "
                     f"checks); greedy tokens: {greedy_bad} backend x prompt(s) differ{near}")
    return lines


def decoding_verdict(dec: DecodingReport | None) -> str:
    """'' when decoding passed or was not checked, else the failing backends and tiers."""
    if dec is None or not dec.n_failed:
        return ""
    names = sorted({f"{d.backend} {tier_label(d.precision, d.golden)}" for d in dec.divergences}
                   | {f"{g.backend} {g.precision} greedy" for g in dec.greedy if g.status == FAIL})
    return f"decoding disagreement in {', '.join(names)}"


def decoding_json(dec: DecodingReport | None) -> dict[str, Any] | None:
    if dec is None:
        return None
    return {
        "available": dec.available,
        "steps": dec.steps,
        "prompts": list(dec.prompts),
        "taps": list(dec.taps),
        "passed": dec.available and bool(dec.runs) and dec.n_failed == 0,
        "counts": {"passed": dec.n_passed, "failed": dec.n_failed, "near_ties": dec.n_near_ties},
        "results": [asdict(c) for c in dec.checks],
        "summaries": [asdict(s) for s in dec.summaries],
        "first_divergence": [asdict(d) for d in dec.divergences],
        "greedy": [asdict(g) for g in dec.greedy],
        "runs": [asdict(r) for r in dec.runs],
        "not_supported": list(dec.not_supported),
        "vocab": list(dec.vocab),
        "sequences": {k: list(v) for k, v in dec.sequences.items()},
    }

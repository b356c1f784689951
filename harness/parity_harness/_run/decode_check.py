"""The decoding check of `parity run`: incremental decoding against the full forward, and greedy tokens.

For every backend that supports decoding (`Backend.supports_decoding`), in every precision it
computes in and every tier that precision is judged in (as the forward taps): each step's cache
(keys and values of every block, [H, T, d_head]) and logits against the decoding goldens, made by
the full forward (parity_harness/_fixture/decoding.py), at the tier's tolerance; then the greedy tokens, the
argmax of each step's logits, against the golden's. Each step is fed the golden's token, so a
step compares like with like even after a backend would have picked another word.

A greedy token that differs where the backend's logits are within tolerance is a near-tie (the
golden's top-2 margin there is within what the tolerance allows): reported, with its margin, but
not a failure. Where the logits are out of tolerance, the logits check fails at that step.

Each step's check is the forward pass's: one `CheckResult` (with `step` set and the prompt as its case)
made by `parity_harness._compare.judge.judge_tensor`, folded by `parity_harness._compare.judge.fold`. Only the greedy
tokens, a
comparison of token ids, are a record of their own (`GreedyCheck`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from parity_harness._backends.base import Precision
from parity_harness._backends.boundary import AnyBackend, guarded
from parity_harness._compare.decoding import DecodeRun, DecodingReport, compare_decoding, greedy_checks
from parity_harness._compare.judge import NOT_SUPPORTED, CheckResult, fold
from parity_harness._fixture.decoding import DecodeOutput, golden_decoding, step_key, top2_margin

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

Progress = Callable[[str], None]


def run_decoding(
    fixture: Fixture, backends: Sequence[AnyBackend], precisions: list[Precision], progress: Progress | None = None
) -> DecodingReport:
    """Decode with every backend that supports it, in every wanted precision it computes in; compare."""
    from parity_harness._core.precision import is_tier, tiers_for

    say = progress or (lambda _msg: None)
    causes: dict[tuple[str, str, str, str, int | None, str], str] = {}
    decoding = fixture.decoding()
    if decoding is None:
        return DecodingReport(available=False)
    report = DecodingReport(True, decoding.steps, [p.name for p in decoding.prompts], list(decoding.taps))
    report.vocab = list(fixture.vocab)
    report.sequences = {p.name: [*p.tokens, *p.generated] for p in decoding.prompts}
    goldens = {p: golden_decoding(fixture, p) for p in ("fp32", "fp64")}
    for backend in [guarded(b) for b in backends]:
        if backend.declined(fixture) or not backend.decodes(fixture):  # a backend that declined the fixture: none
            report.not_supported.append(backend.name)
            continue
        for precision in precisions:
            if precision not in backend.precisions or not is_tier(precision):  # fp32, fp64 only
                continue
            say(f"parity: decoding with {backend.name} ({precision}) ...")
            start = time.perf_counter()
            output = backend.decoded(fixture, precision, decoding.requests())
            report.runs.append(DecodeRun(backend.name, precision, time.perf_counter() - start))
            for golden in tiers_for(precision):
                checks = compare_decoding(fixture, backend.name, precision, golden, output, goldens[golden])
                causes.update(step_causes(fixture, checks, output, goldens[golden]))
                report.checks += checks
            report.greedy += greedy_checks(fixture, backend.name, precision, output, goldens["fp64"], report.checks)
    report.summaries, report.divergences = fold(report.checks, report.taps)
    for d in report.divergences:  # how close the golden's greedy choice is to a tie at that step
        d.margin = top2_margin(goldens["fp64"][d.case][step_key(d.step or 0, "logits")])
        d.cause = causes.get((d.backend, d.precision, d.golden, d.case, d.step, d.tap), d.cause)
    return report


def step_causes(
    fixture: Fixture, checks: list[CheckResult], output: DecodeOutput, golden: DecodeOutput
) -> dict[tuple[str, str, str, str, int | None, str], str]:
    """The likely cause (_compare/diagnose.py, `diagnose_step`) at each prompt's first failing step and tap of one
    backend x precision x golden tier: the only place a decoding first divergence can be. Any family: the cache's
    layout patterns are the same for all; the one-step replays are the family's `causes` module's, where it has
    them (`step_replay`)."""
    from parity_harness._compare.diagnose import diagnose_step
    from parity_harness._compare.patterns import StepContext

    decoding = fixture.decoding()
    assert decoding is not None
    prompts = {p.name: p for p in decoding.prompts}
    out: dict[tuple[str, str, str, str, int | None, str], str] = {}
    done: set[str] = set()  # prompts diagnosed: at their first failing check (prompt, then step, then tap order)
    for c in checks:
        if c.passed is not False or c.step is None or c.case in done:
            continue
        done.add(c.case)
        key = (c.backend, c.precision, c.golden, c.case, c.step, c.tap)
        prompt, step = prompts[c.case], c.step
        previous = {t: golden[c.case][step_key(step - 1, t)] for t in decoding.taps} if step > 0 else {}
        context = StepContext(fixture.model.config, fixture.weights(), prompt.generated[step - 1] if step else -1,
                              len(prompt.tokens) + step - 1, previous, c.precision)
        causes = diagnose_step(output[c.case].get(step_key(step, c.tap)), golden[c.case][step_key(step, c.tap)],
                               c.tap, step, atol=c.atol, rtol=c.rtol, context=context)
        out[key] = "; ".join(causes)
    return {k: v for k, v in out.items() if v}


__all__ = ["NOT_SUPPORTED", "DecodingReport", "run_decoding"]

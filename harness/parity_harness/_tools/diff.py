"""`parity diff A B`: run two backends and show them side by side per tap (_compare/differential.py).

Both run in one precision (fp32 by default) through the usual runner, with the error budget and their
outputs kept (memory: both backends' taps of every case). The view is printed; the verdict is DISAGREE
when the differential rule flags a backend (exit 1), AGREE when it flags none (exit 0). Bad input (the
same backend twice, a backend that does not compute in the precision) is a ParityError (exit 2).
The tiers are judged as in `parity run`; when they disagree too, one line says so. The verdict line always
says how many of the fixture's taps were compared and which were not (`Differential.coverage`): a view of
the taps only one backend produces is not a comparison, and one with no tap in common is exit 2.
"""

from __future__ import annotations

from typing import TextIO

from parity_harness._backends.base import Precision
from parity_harness._backends.boundary import AnyBackend, guarded
from parity_harness._compare.differential import Differential, differential, format_differential
from parity_harness._core.errors import ParityError
from parity_harness._core.status import Verdict
from parity_harness._core.text import tier_label
from parity_harness._fixture.fixture import Fixture
from parity_harness._run.runner import Progress, run_parity


def run_diff(
    fixture: Fixture, backends: tuple[AnyBackend, AnyBackend], precision: Precision,
    progress: Progress | None = None,
) -> tuple[Differential, list[str]]:
    """The differential of two backends, and one note per tier that breaks its tolerance (what `parity run`
    would show): a note makes the verdict DISAGREE (`print_diff`), flagged or not."""
    a, b = guarded(backends[0]), guarded(backends[1])
    if a.name == b.name:
        raise ParityError(f"parity diff needs two different backends, got {a.name!r} twice")
    for backend in (a, b):
        if precision not in backend.precisions:
            raise ParityError(f"{backend.name} computes in {', '.join(backend.precisions)} only: "
                              f"it has no {precision} results to diff (--precision)")
        declined = backend.declined(fixture)
        if declined:
            raise ParityError(f"{backend.name} declines this fixture: {declined}")
    report = run_parity(fixture, [a, b], [precision], progress=progress, keep_outputs=True, decoding=False,
                        budget=True)
    diff = differential(fixture, report.budget, report.outputs, (a.name, b.name), precision)
    notes = [f"note: {d.backend} {tier_label(d.precision, d.golden)} also breaks tolerance, first at {d.tap} "
             "(`parity run` shows it)" for d in report.divergences]
    return diff, notes


def print_diff(diff: Differential, notes: list[str], out: TextIO) -> Verdict:
    """Print the view and its verdict line; return the verdict.

    Exit 0 means compared and agreeing: two backends that both break the fixture's tolerance are not flagged
    against each other (neither is worse than its peer), and still DISAGREE, as `parity run` says of them.
    """
    for line in [*format_differential(diff), *notes]:
        print(line, file=out)
    verdict, coverage = diff.verdict, diff.coverage
    partial = len(diff.compared) < len(diff.rows)
    if verdict == Verdict.NOTHING_COMPARED:
        print(f"ERROR: nothing was compared: no tap is produced by both backends ({coverage})", file=out)
        return verdict
    if verdict == Verdict.AGREE and notes:
        print(f"NOTHING FLAGGED between {diff.backends[0]} and {diff.backends[1]}, but {len(notes)} tier(s) break "
              f"the fixture's tolerance (the notes above): DISAGREE ({coverage})", file=out)
        return Verdict.DISAGREE
    if diff.flags:
        print(f"FLAGGED: {len(diff.flags)} tap(s) where a backend is worse than float32 rounding and its peer "
              f"is not ({coverage})", file=out)
    else:
        where = (f"on the {len(diff.compared)} of {len(diff.rows)} taps both produce (only those were compared)"
                 if partial else "on every tap")
        print(f"NOTHING FLAGGED {where}: neither {diff.backends[0]} nor {diff.backends[1]} exceeds the float32 "
              f"golden's own rounding where the other stays within it ({coverage})", file=out)
    return verdict

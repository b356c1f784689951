"""The aggregate rule's measured budget: every honest backend's systematic error per tier (docs/tolerances.md,
"Systematic error").

For each fixture, each backend and each precision it declares, the worst gain error and the worst offset over
the taps (`_compare/budget.py`, `SystematicRow`: in units of the precision's eps, against the float64 golden),
then the worst of each precision over everything measured, with the bound in force (`SYSTEMATIC_BOUND`).

    python benchmarks/aggregate_budget.py --fixture fixtures/toy --fixture fixtures/toy-stress [--backends numpy,...]
"""

from __future__ import annotations

import argparse

from parity_harness import api
from parity_harness._backends.registry import backend_entry_points
from parity_harness._compare.budget import SystematicRow
from parity_harness._compare.judge import SYSTEMATIC_CASE
from parity_harness._compare.report import Report
from parity_harness._core.precision import PRECISIONS
from parity_harness._fixture.tolerances import SYSTEMATIC_BOUND
from parity_harness._run import runner

ROWS: list[tuple[str, SystematicRow]] = []
_FIXTURE = [""]
EXCLUDED: set[tuple[str, str, str]] = set()  # (fixture, backend, precision) runs with a per-cell failure


class _Measuring(runner.CaseJudge):
    """The run's own judge, keeping every tap's systematic row (passing or not) for the table."""

    def finish(self, report: Report) -> None:
        ROWS.extend((_FIXTURE[0], row) for row in self.systematic.rows())
        super().finish(report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixture", action="append", required=True)
    parser.add_argument("--backends", default=None, help="comma-separated (default: every backend that runs here)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    args = parser.parse_args(argv)
    runner.CaseJudge = _Measuring  # type: ignore[misc]
    names = args.backends.split(",") if args.backends else list(backend_entry_points())
    print(f"{'fixture':<22} {'backend':<26} {'prec':<5} {'gain/allowance':>12} {'at tap':<26} "
          f"{'offset/allowance':>14} at tap")
    for fixture in args.fixture:
        _FIXTURE[0] = fixture
        for name in names:
            try:
                report = api.run([name], fixture, args.precisions.split(","), decoding=False)
            except Exception as exc:  # a backend that cannot run here, or crashes: said, and the others measured
                print(f"{fixture[-22:]:<22} {name:<26} not measured: {str(exc).splitlines()[0][:150]}")
                continue
            failed = sorted({(r.precision, r.tap) for r in report.results  # per cell: the aggregate's own are not
                             if r.passed is False and r.case != SYSTEMATIC_CASE})
            for precision in dict.fromkeys(r.precision for r in report.results):
                rows = [r for f, r in ROWS if (f, r.backend, r.precision) == (fixture, name, precision) and r.cells]
                if not rows:
                    continue
                g = max(rows, key=lambda r: r.gain_eps / r.allowance)
                o = max(rows, key=lambda r: r.offset_eps / r.allowance)
                bad = sum(1 for p, _ in failed if p == precision)
                note = f"  ({bad} taps fail per cell: not honest, left out of the worst)" if bad else ""
                if bad:
                    EXCLUDED.add((fixture, name, precision))
                print(f"{fixture[-22:]:<22} {name:<26} {precision:<5} {g.gain_eps / g.allowance:>10.3g} {g.tap:<26} "
                      f"{o.offset_eps / o.allowance:>12.3g} {o.tap}{note}", flush=True)
    print()
    for precision in PRECISIONS:
        rows = [r for f, r in ROWS
                if r.precision == precision and r.cells and (f, r.backend, r.precision) not in EXCLUDED]
        if rows:
            g = max(rows, key=lambda r: r.gain_eps / r.allowance)
            o = max(rows, key=lambda r: r.offset_eps / r.allowance)
            print(f"{precision}: worst gain {g.gain_eps / g.allowance:.3g} eps ({g.backend}, {g.tap}), worst offset "
                  f"{o.offset_eps / o.allowance:.3g} eps ({o.backend}, {o.tap}); bound {SYSTEMATIC_BOUND[precision]:g} "
                  f"eps (each per unit of the allowance magnitude)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

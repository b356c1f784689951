"""Check that one JSON report agrees with itself before `parity merge` trusts it.

A report's verdict (`passed`, `exit_code`, `counts`, `taps_compared`, `loose`, and the decoding's
`passed` and `counts`) is derived from its rows, and so are its tap summaries and first divergences.
`parity merge` recomputes all of them from the rows and refuses (exit 2, one line naming the file and
the field) a report where they disagree, a row whose verdict disagrees with its own numbers (an "ok"
row with cells out of tolerance, a greedy "ok" with other tokens), rows judged with other tolerances
than the report's, a run listed without results or results without a run, repeated rows, a tier
whose rows do not cover every case x tap of the report, and a report that compared nothing.

What it cannot see: a report forged consistently (every number rewritten as if it had passed). The
rows are claims; only running the backend (or `parity compare` of its dump) checks them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity_harness._compare.judge import (
    FAIL,
    NOT_SUPPORTED,
    OK,
    SYSTEMATIC_CASE,
    CheckResult,
    FirstDivergence,
    TapSummary,
    fold,
)
from parity_harness._compare.report import BackendRun, Report
from parity_harness._core.errors import ParityError
from parity_harness._core.precision import PRECISIONS, tiers_for
from parity_harness._core.status import GreedyStatus, RunStatus, Verdict

if TYPE_CHECKING:
    from parity_harness._compare.decoding import DecodingReport

RAN = (RunStatus.RAN, RunStatus.DUMP)  # run statuses that produce results
SLACK = 1e-12  # relative: the rounding between `|d| <= atol + rtol|e|` and `max(|d| - rtol|e|) <= atol`


class MergeError(ParityError):
    """Reports that cannot be merged (exit 2)."""


def _text(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _tier(backend: str, precision: str, golden: str) -> str:
    return f"{backend} {precision} vs {golden}"


def _refuse(path: Path, what: str) -> MergeError:
    return MergeError(f"{path}: {what}; not merged (a report must agree with its own rows)")


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def check_tolerances(path: Path, doc: dict[str, Any]) -> None:
    """The tolerances a report says it was judged with: both tiers, each a non-negative finite atol and rtol
    and a table of per-tap overrides of the same shape; a default beyond its ceiling (docs/tolerances.md)
    or an override's rtol beyond its ceiling only when the report's `tolerances_loose` is not empty, so the
    merge says LOOSE TOLERANCES. (An override's atol ceiling scales with the goldens' magnitudes, which a
    report does not carry: it was checked when the run loaded its fixture.)"""
    from parity_harness._fixture.tolerances import CEILINGS, default_problems

    tiers = doc.get("tolerances")
    loose = doc.get("tolerances_loose", [])
    if not isinstance(loose, list) or not all(isinstance(x, str) for x in loose):
        raise MergeError(f"{path}: malformed report: 'tolerances_loose' is {_text(loose)}, expected a list of strings")
    if not isinstance(tiers, dict) or set(tiers) != {"fp32", "fp64"}:
        raise MergeError(f"{path}: malformed report: 'tolerances' is {_text(tiers)}, expected the fp32 and fp64 "
                         "tiers; not merged")
    problems: list[str] = []
    for precision in ("fp32", "fp64"):
        tier = tiers[precision]
        where = f"tolerances.{precision}"
        if not isinstance(tier, dict) or not _number(tier.get("atol")) or not _number(tier.get("rtol")) \
                or not isinstance(tier.get("overrides"), dict):
            raise MergeError(f"{path}: malformed report: {where!r} is {_text(tier)}, expected a finite atol and rtol "
                             "(>= 0) and an 'overrides' table; not merged")
        problems += default_problems(precision, tier["atol"], tier["rtol"])  # type: ignore[arg-type]
        for tap, override in tier["overrides"].items():
            if not isinstance(override, dict) or not _number(override.get("atol")) \
                    or not _number(override.get("rtol")):
                raise MergeError(f"{path}: malformed report: {where}.overrides[{tap!r}] is {_text(override)}, "
                                 "expected a finite atol and rtol (>= 0); not merged")
            if override["rtol"] > CEILINGS[precision].rtol:  # type: ignore[index]
                problems.append(f"{where}.overrides[{tap!r}].rtol {override['rtol']:g} is above the ceiling "
                                f"{CEILINGS[precision].rtol:g}")  # type: ignore[index]
    if problems and not loose:  # listed (in any words), the merged report says LOOSE TOLERANCES: not a gate
        raise _refuse(path, f"it was judged at tolerances beyond their ceilings ({problems[0]}) but does not say "
                            "so in 'tolerances_loose'")


def check_report(path: Path, doc: dict[str, Any], shard: Report, derived: dict[str, Any]) -> None:
    """Every check of the module docstring; `derived` is `report_json(shard)`, the fields recomputed from the rows."""
    check_tolerances(path, doc)
    for key in ("counts", "taps_compared", "loose", "passed", "exit_code"):
        if doc.get(key) != derived[key]:
            raise _refuse(path, f"its {key!r} is {_text(doc.get(key))}, its rows give {_text(derived[key])}")
    check_rows(path, shard.results, shard.tolerances.get("tiers", {}))
    check_runs(path, shard.runs, shard.results)
    check_summaries(path, shard.results, shard.summaries)
    check_divergences(path, shard.results, shard.divergences)
    if shard.decoding is not None:
        check_decoding(path, doc["decoding"], shard.decoding, derived.get("decoding") or {},
                       shard.tolerances.get("tiers", {}))
    if shard.verdict == Verdict.NOTHING_COMPARED:
        raise MergeError(f"{path}: compared nothing (exit_code 2: every tap of every run 'not supported', or no run); "
                         "not merged")


def _strings(path: Path, row: object, names: Iterable[str], what: str) -> None:
    for name in names:
        if not isinstance(getattr(row, name), str):
            raise MergeError(f"{path}: malformed report: an entry of {what!r} has a {name!r} that is not a string")


def _tolerance(tiers: dict[str, Any], golden: str, tap: str) -> tuple[Any, Any] | None:
    """(atol, rtol) the report's tolerances give `tap` in tier `golden`; None if they are not in the known shape."""
    tier = tiers.get(golden)
    if not isinstance(tier, dict):
        return None
    overrides = tier.get("overrides")
    chosen = overrides[tap] if isinstance(overrides, dict) and isinstance(overrides.get(tap), dict) else tier
    return chosen.get("atol"), chosen.get("rtol")


def check_rows(path: Path, results: list[CheckResult], tiers: dict[str, Any]) -> None:
    """Each result row (a forward tap or a decoding step: one record): its verdict from its own numbers, its
    tolerance the report's; no repeats; full tiers."""
    seen: set[tuple[str, str, str, str, int | None, str]] = set()
    for r in results:
        _strings(path, r, ("backend", "precision", "golden", "case", "tap", "status", "message"), "results")
        step = "" if r.step is None else f" step {r.step}"
        kind = "decoding result" if step else "result"
        where = f"its {kind} {_tier(r.backend, r.precision, r.golden)} {r.case}{step}/{r.tap}"
        if r.precision not in PRECISIONS or r.golden not in tiers_for(r.precision):  # type: ignore[arg-type]
            raise _refuse(path, f"{where} is of no tier parity judges")
        key = (r.backend, r.precision, r.golden, r.case, r.step, r.tap)
        if key in seen:
            raise _refuse(path, f"{where} is there twice")
        seen.add(key)
        expected = {OK: True, FAIL: False, NOT_SUPPORTED: None}
        if r.status not in expected or r.passed is not expected[r.status] or type(r.n_bad) is not int:
            raise _refuse(path, f"{where} has status {str(r.status)!r}, passed {_text(r.passed)}, "
                                f"n_bad {_text(r.n_bad)}")
        if r.status == OK and not _passes(r):
            raise _refuse(path, f"{where} says 'ok' but its numbers fail (n_bad {r.n_bad}, min_atol "
                                f"{_text(r.min_atol)} against atol {_text(r.atol)}, message {r.message!r})")
        if r.status == FAIL and r.n_bad == 0 and not r.message:
            raise _refuse(path, f"{where} says 'fail' with no cell out of tolerance and no message")
        tolerance = _tolerance(tiers, r.golden, r.tap)
        if tolerance is not None and tolerance != (r.atol, r.rtol):
            raise _refuse(path, f"{where} was judged at atol {_text(r.atol)}, rtol {_text(r.rtol)}; the report's "
                                f"tolerances give {_text(tolerance[0])}, {_text(tolerance[1])}")
    _check_full_tiers(path, results)


def _passes(r: CheckResult) -> bool:
    """An 'ok' row's own numbers: no cell out of tolerance, no structural message, min_atol within atol."""
    if r.n_bad != 0 or r.message or not isinstance(r.min_atol, int | float) or not isinstance(r.atol, int | float):
        return False
    scale = max(abs(r.atol), abs(r.max_abs) if isinstance(r.max_abs, int | float) else 0.0)
    return math.isfinite(r.min_atol) and r.min_atol <= r.atol + SLACK * scale


def _check_full_tiers(path: Path, results: list[CheckResult]) -> None:
    """Every tier of every backend x precision holds one row per case (x step) x tap of the report; a tap that
    failed the aggregate rule has one more, case SYSTEMATIC_CASE (a failure with its message), not counted."""
    results = [r for r in results if not (r.case == SYSTEMATIC_CASE and r.status == FAIL and r.message)]
    cases = {(r.case, r.step) for r in results}
    taps = {r.tap for r in results}
    groups: dict[tuple[str, str, str], int] = {}
    for r in results:
        groups[(r.backend, r.precision, r.golden)] = groups.get((r.backend, r.precision, r.golden), 0) + 1
    for (backend, precision, golden), n in groups.items():
        if n != len(cases) * len(taps):
            raise _refuse(path, f"its results of {_tier(backend, precision, golden)} hold {n} rows, not one per "
                                f"case x tap ({len(cases)} x {len(taps)})")
    pairs = {(b, p) for b, p, _ in groups}
    for backend, precision in pairs:
        missing = [g for g in tiers_for(precision) if (backend, precision, g) not in groups]  # type: ignore[arg-type]
        if missing:
            raise _refuse(path, f"its results of {backend} {precision} lack the tier vs {missing[0]}")


def check_runs(path: Path, runs: list[BackendRun], results: list[CheckResult]) -> None:
    """`runs` and `results` name the same backend x precision pairs; each pair is run once."""
    with_rows = {(r.backend, r.precision) for r in results}
    seen: set[tuple[str, str]] = set()
    for run in runs:
        _strings(path, run, ("backend", "precision", "status", "message"), "runs")
        key = (run.backend, run.precision)
        if key in seen:
            raise _refuse(path, f"its runs list {run.backend} {run.precision} twice")
        seen.add(key)
        if run.status not in (*RAN, RunStatus.NOT_SUPPORTED):
            raise _refuse(path, f"its run {run.backend} {run.precision} has status {str(run.status)!r}")
        if run.status in RAN and key not in with_rows:
            raise _refuse(path, f"its runs list {run.backend} {run.precision} as {str(run.status)!r}, and it has no "
                                "results")
        if run.status == RunStatus.NOT_SUPPORTED and key in with_rows:
            raise _refuse(path, f"it has results of {run.backend} {run.precision}, whose run is 'not_supported'")
    ran = {(run.backend, run.precision) for run in runs if run.status in RAN}
    for backend, precision in sorted(with_rows - ran):
        raise _refuse(path, f"it has results of {backend} {precision}, and no run of it")


def _fold(results: list[CheckResult]) -> tuple[list[TapSummary], list[FirstDivergence]]:
    """The report's rows folded by the one fold of live runs (`compare.fold`), taps in the rows' own order
    (rows are written in dataflow order)."""
    return fold(results, list(dict.fromkeys(r.tap for r in results)))


def check_summaries(path: Path, results: list[CheckResult], summaries: list[TapSummary]) -> None:
    """Its `taps` entries are its results folded by tap (`compare.fold`), one each."""
    derived = {(d.backend, d.precision, d.golden, d.tap): d for d in _fold(results)[0]}
    claimed: set[tuple[str, str, str, str]] = set()
    for s in summaries:
        _strings(path, s, ("backend", "precision", "golden", "tap"), "taps")
        key = (s.backend, s.precision, s.golden, s.tap)
        where = f"its 'taps' entry {_tier(s.backend, s.precision, s.golden)} {s.tap}"
        if key in claimed:
            raise _refuse(path, f"{where} is there twice")
        claimed.add(key)
        if key not in derived:
            raise _refuse(path, f"{where} has no results")
        for name in ("status", "passed", "n_cases", "n_failed"):
            if getattr(s, name) != getattr(derived[key], name):
                raise _refuse(path, f"{where} says {name} {_text(getattr(s, name))}, its results give "
                                    f"{_text(getattr(derived[key], name))}")
    for backend, precision, golden, tap in derived.keys() - claimed:
        raise _refuse(path, f"it has results of {_tier(backend, precision, golden)} {tap} and no 'taps' entry")


def check_divergences(path: Path, results: list[CheckResult], divergences: list[FirstDivergence]) -> None:
    """One first divergence per failing tier, at the tap its results give; none for a tier that passes."""
    derived = {(d.backend, d.precision, d.golden): d for d in _fold(results)[1]}
    claimed: set[tuple[str, str, str]] = set()
    for d in divergences:
        key = (d.backend, d.precision, d.golden)
        where = f"its first_divergence of {_tier(*key)}"
        if key in claimed:
            raise _refuse(path, f"{where} is there twice")
        claimed.add(key)
        if key not in derived:
            raise _refuse(path, f"{where} names a tier whose results all pass (or that has none)")
        if d.tap != derived[key].tap:
            raise _refuse(path, f"{where} is at {d.tap!r}, its results first fail at {derived[key].tap!r}")
    for key in derived.keys() - claimed:
        raise _refuse(path, f"its results of {_tier(*key)} fail, and it has no first_divergence for them")


def check_decoding(path: Path, doc: dict[str, Any], dec: DecodingReport, derived: dict[str, Any],
                   tiers: dict[str, Any]) -> None:
    """The decoding section: its results, summaries and first divergences by the forward rows' checks (one
    record); greedy rows against their tokens; runs against rows; `passed` and `counts`."""
    check_rows(path, dec.checks, tiers)
    check_summaries(path, dec.checks, dec.summaries)
    check_divergences(path, dec.checks, dec.divergences)
    pairs = {(c.backend, c.precision) for c in dec.checks}
    for g in dec.greedy:
        where = f"its greedy tokens of {g.backend} {g.precision} {g.prompt}"
        if g.status not in tuple(GreedyStatus) or (g.status == GreedyStatus.OK) != (g.expected == g.actual):
            raise _refuse(path, f"{where} say {str(g.status)!r} for tokens {_text(g.actual)} "
                                f"against {_text(g.expected)}")
        pairs.add((g.backend, g.precision))
    runs = [(r.backend, r.precision) for r in dec.runs]
    if len(set(runs)) != len(runs):
        raise _refuse(path, "its decoding runs list a backend x precision twice")
    for backend, precision in sorted(set(runs) - pairs):
        raise _refuse(path, f"its decoding runs list {backend} {precision}, and it has no decoding results")
    for backend, precision in sorted(pairs - set(runs)):
        raise _refuse(path, f"it has decoding results of {backend} {precision}, and no decoding run of it")
    for field in ("counts", "passed"):
        if doc.get(field) != derived.get(field):
            raise _refuse(path, f"its 'decoding.{field}' is {_text(doc.get(field))}, its decoding rows give "
                                f"{_text(derived.get(field))}")

"""Render a parity report: the terminal table, the first divergences, the verdict, and the JSON file.

JSON schema (version 1), stable for CI scripts:

    {
      "schema": "parity-report", "schema_version": 1,
      "fixture": str, "passed": bool, "exit_code": 0 | 1 | 2,
      "counts": {"passed": int, "failed": int, "not_supported": int},
      "results": [ {"backend", "precision", "golden", "case", "tap", "status", "passed",
                    "max_abs", "max_rel", "min_atol", "atol", "rtol", "index", "actual",
                    "expected", "message"} ],            # one per backend x precision x golden x case x tap
      "taps": [ {"backend", "precision", "golden", "tap", "status", "passed", "n_cases", "n_failed",
                 "max_abs", "max_rel", "min_atol", "worst_case", "atol", "rtol", "message"} ],
      "first_divergence": {backend: [ {"precision", "golden", "tap", "case", "index", "actual",
                                      "expected", "max_abs", "atol", "message", "upstream_taps",
                                      "upstream_max_abs", "by_case"} ]},
      "runs": [ {"backend", "precision", "seconds", "status", "message"} ]
    }

`status` is "ok", "fail" or "not_supported"; `passed` is null when not supported. Infinite
errors (structural failures: shape, dtype, NaN, infinity mismatch) are written as null.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from harness.compare import NOT_SUPPORTED, FirstDivergence, TapSummary
from harness.runner import Report

SCHEMA_VERSION = 1


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.1e}"


def _finite(obj: Any) -> Any:
    """Replace infinities and NaN by None so the JSON is strict."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def tier_label(precision: str, golden: str) -> str:
    return f"{precision} vs {golden}"


def tap_line(s: TapSummary, width: int) -> str:
    label = f"{s.backend:<22} {tier_label(s.precision, s.golden):<12} {s.tap:<{width}}"
    if s.status == NOT_SUPPORTED:
        return f"{label}  n/a   not supported"
    verdict = "OK  " if s.passed else "FAIL"
    line = f"{label}  {verdict}  max_abs {_num(s.max_abs)}  max_rel {_num(s.max_rel)}  (atol {s.atol:g})"
    if not s.passed:
        line += f"  {s.n_failed}/{s.n_cases} cases, worst {s.worst_case}"
        if s.message:
            line += f": {s.message}"
    return line


def divergence_paragraph(d: FirstDivergence) -> str:
    where = f" at {d.index}" if d.index is not None else ""
    values = ""
    if d.actual is not None and d.expected is not None:
        values = f": got {d.actual:.9g}, expected {d.expected:.9g} (|diff| {_num(d.max_abs)} > atol {d.atol:g})"
    elif d.message:
        values = f": {d.message}"
    if d.upstream_taps == 0:
        upstream = "it is the first tap"
    else:
        upstream = f"the {d.upstream_taps} upstream taps agree within {_num(d.upstream_max_abs)}"
    others = {c: t for c, t in d.by_case.items() if t != d.tap}
    text = (f"{d.backend} {tier_label(d.precision, d.golden)}: first divergence at {d.tap}, "
            f"case {d.case}{where}{values}; {upstream}.")
    if others:
        text += " Other cases first diverge at: " + ", ".join(f"{c} -> {t}" for c, t in others.items()) + "."
    return text


def _not_supported_line(group: list[TapSummary]) -> str:
    s = group[0]
    taps = group[0].tap if len(group) == 1 else f"{len(group)} taps, {group[0].tap} .. {group[-1].tap}"
    return f"{s.backend:<22} {tier_label(s.precision, s.golden):<12} not supported: {taps}"


def print_report(report: Report, out: TextIO, verbose: bool = False) -> None:
    """One line per backend x precision x tap (worst over cases), consecutive unsupported taps folded."""
    width = max((len(s.tap) for s in report.summaries), default=10)
    pending: list[TapSummary] = []
    for s in [*report.summaries, None]:
        if s is not None and s.status == NOT_SUPPORTED and (
            not pending or (pending[0].backend, pending[0].precision, pending[0].golden)
            == (s.backend, s.precision, s.golden)
        ):
            pending.append(s)
            continue
        if pending:
            print(_not_supported_line(pending), file=out)
            pending = [s] if s is not None and s.status == NOT_SUPPORTED else []
            if pending:
                continue
        if s is None:
            break
        print(tap_line(s, width), file=out)
        if verbose and s.status != NOT_SUPPORTED:
            for r in report.results:
                if (r.backend, r.precision, r.golden, r.tap) == (s.backend, s.precision, s.golden, s.tap):
                    mark = "OK  " if r.passed else "FAIL"
                    print(f"    {r.case:<20} {mark}  max_abs {_num(r.max_abs)}  at {r.index}"
                          f"{'  ' + r.message if r.message else ''}", file=out)
    print(file=out)
    for run in report.runs:
        if run.status == "ran":
            print(f"{run.backend:<22} {run.precision}  ran in {run.seconds:.2f} s", file=out)
        elif run.status == NOT_SUPPORTED:
            print(f"{run.backend:<22} {run.precision}  not supported ({run.message})", file=out)
        else:
            print(f"{run.backend:<22} {run.precision}  ERROR: {run.message}", file=out)
    if report.divergences:
        print(file=out)
        for d in report.divergences:
            print(divergence_paragraph(d), file=out)
    print(file=out)
    print(verdict_line(report), file=out)


def verdict_line(report: Report) -> str:
    n_ns = sum(1 for r in report.results if r.status == NOT_SUPPORTED)
    counts = f"{report.n_passed} passed, {report.n_failed} failed, {n_ns} not supported"
    if report.errors:
        names = ", ".join(sorted({f"{e.backend} {e.precision}" for e in report.errors}))
        return f"ERROR: {len(report.errors)} backend run(s) could not complete ({names}); {counts}"
    if report.n_passed + report.n_failed == 0:
        return f"ERROR: nothing was compared; {counts}"
    if report.n_failed:
        names = ", ".join(sorted({f"{d.backend} {tier_label(d.precision, d.golden)}" for d in report.divergences}))
        return f"FAIL: disagreement in {names}; {counts} (tap x case checks)"
    return f"PASS: every backend agrees on every tap; {counts} (tap x case checks)"


def report_json(report: Report) -> dict[str, Any]:
    by_backend: dict[str, list[dict[str, Any]]] = {}
    for d in report.divergences:
        entry = asdict(d)
        by_backend.setdefault(entry.pop("backend"), []).append(entry)
    return _finite({  # type: ignore[no-any-return]
        "schema": "parity-report",
        "schema_version": SCHEMA_VERSION,
        "fixture": report.fixture,
        "passed": report.passed,
        "exit_code": report.exit_code,
        "counts": {
            "passed": report.n_passed,
            "failed": report.n_failed,
            "not_supported": sum(1 for r in report.results if r.status == NOT_SUPPORTED),
        },
        "results": [asdict(r) for r in report.results],
        "taps": [asdict(s) for s in report.summaries],
        "first_divergence": by_backend,
        "runs": [asdict(r) for r in report.runs],
    })


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps(report_json(report), indent=1) + "\n", encoding="utf-8")

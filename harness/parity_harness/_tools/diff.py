"""`parity diff A B`: two runs side by side per tap, with each other and the truth (_compare/differential.py).

Each of A and B is a backend name (run live) or a dump (`{backend}.{precision}.safetensors`, written by `parity
run --save-outputs DIR` or any writer of docs/dump-format.md; read with its checks, the fixture id among them):
an argument that ends in `.safetensors` or holds a path separator is a dump, anything else a backend name. Both
are in one precision: `precision` when given, else the dumps' own (fp32 for two live backends). The live ones run
through the usual runner with their outputs kept; every side is then judged against the goldens as `parity run`
and `parity compare` judge it (the Report that `--json` writes, and one note per tier that breaks its tolerance),
and measured against the other (the Differential, which decides the verdict).

Bad input is a ParityError (exit 2), one line: the same backend or the same dump twice, dumps of different
fixtures (the dump reader names the one that is not this fixture's), a dump of a precision other than the one
asked or than the other dump's, an unknown backend, a precision the differential has no golden for (a stored
weight format), a backend that does not compute in the precision or declines the fixture.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from parity_harness._backends.boundary import GuardedBackend
from parity_harness._compare.differential import Differential, Side, differential, format_differential
from parity_harness._compare.report import BackendRun, Report, read_from
from parity_harness._core.errors import ParityError
from parity_harness._core.precision import BackendOutput, Precision
from parity_harness._core.status import RunStatus, Verdict
from parity_harness._core.text import tier_label
from parity_harness._fixture.fixture import Fixture
from parity_harness._fixture.identity import fixture_id
from parity_harness._run.dump import Dump, DumpError, read_dump
from parity_harness._run.request import backend_from
from parity_harness._run.runner import Progress, add_output, finish_report, run_parity

DIFF_PRECISIONS: tuple[Precision, ...] = ("fp32", "fp64", "fp16", "bf16")  # those with a float64 truth to diff at


def per_tap_c(fixture: Fixture, precision: Precision) -> float:
    """c of the per-tap rule atol = c x eps x M_tap for `precision` (docs/tolerances.md): SCALED_C for fp32 and
    fp64 (what `parity export` writes for a scaled fixture), the fixture's own c (default REDUCED_C) for fp16 and
    bf16."""
    from parity_harness._authoring.presets import SCALED_C

    if precision in ("fp16", "bf16"):
        return float(fixture.spec.reduced_c[precision])
    return float(SCALED_C[precision])


def is_dump_argument(text: str) -> bool:
    """A dump when it ends in .safetensors or holds a path separator; a backend name otherwise."""
    return text.endswith(".safetensors") or "/" in text or os.sep in text


@dataclass
class _Side:
    side: Side
    live: GuardedBackend | None = None
    dump: Dump | None = None


def _resolve(spec: object, fixture: Fixture, fid: str, which: str) -> _Side:
    """One of A, B: a dump read and checked against the fixture, or a backend loaded (its dependencies present)."""
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and is_dump_argument(spec)):
        path = Path(os.fspath(spec))
        dump = read_dump(path, fixture, fid)
        return _Side(Side(dump.backend, dump.backend, "dump", os.fspath(spec)), dump=dump)
    if not isinstance(spec, (str, GuardedBackend)) and not _is_backend(spec):
        raise ParityError(f"diff: {which}: expected a backend name, a Backend instance or a dump's path, "
                          f"got a {type(spec).__name__}")
    backend = backend_from(spec)
    return _Side(Side(backend.name, backend.name, "live"), live=backend)


def _is_backend(spec: object) -> bool:
    from parity_harness._backends.base import Backend

    return isinstance(spec, Backend)


def _precision(sides: tuple[_Side, _Side], asked: object) -> Precision:
    """The precision both sides are in: the one asked, which every dump must hold; else the dumps' own."""
    if asked is not None and asked not in DIFF_PRECISIONS:
        raise ParityError(f"diff: precision {str(asked)[:40]!r}: expected one of {', '.join(DIFF_PRECISIONS)} "
                          "(a stored weight format has no float64 truth of the fixture's weights to diff at)")
    dumps = [s.dump for s in sides if s.dump is not None]
    if asked is not None:
        for d in dumps:
            if d.precision != asked:
                raise DumpError(f"{d.path}: a dump of {d.precision} results; parity diff was asked for {asked} "
                                "(--precision): both sides must be in the precision asked")
        return asked
    if len(dumps) == 2 and dumps[0].precision != dumps[1].precision:
        raise DumpError(f"{dumps[1].path}: a dump of {dumps[1].precision} results, and {dumps[0].path} of "
                        f"{dumps[0].precision}: both sides must be in one precision")
    precision = dumps[0].precision if dumps else "fp32"
    if precision not in DIFF_PRECISIONS:
        raise DumpError(f"{dumps[0].path}: a dump of the stored weight format {precision}: parity diff compares "
                        f"{', '.join(DIFF_PRECISIONS)} results (a stored format has no float64 truth of the "
                        "fixture's weights)")
    return precision


def _labels(a: _Side, b: _Side) -> None:
    """Two sides of one backend name: the same backend twice or the same dump twice is refused; otherwise each
    dump is labelled by its path."""
    if a.side.backend != b.side.backend:
        return
    if a.live is not None and b.live is not None:
        raise ParityError(f"diff names {a.side.backend!r} more than once: give two different backends, or a "
                          "backend and a dump")
    if a.dump is not None and b.dump is not None:
        same = False
        with contextlib.suppress(OSError):
            same = os.path.samefile(a.dump.path, b.dump.path)
        if same:
            raise DumpError(f"{b.dump.path}: the same dump twice (A and B): give two different runs")
    for s in (a, b):
        if s.dump is not None:
            s.side.label = s.side.path or s.side.label


def run_diff(
    fixture: Fixture, a: object, b: object, precision: object = None, progress: Progress | None = None,
) -> Differential:
    """The differential of A and B (each a backend name or instance, or a dump's path), with the Report of both
    sides judged against the goldens (`Differential.report`; its divergences are the differential's notes)."""
    fid = fixture_id(fixture)
    sides = (_resolve(a, fixture, fid, "A"), _resolve(b, fixture, fid, "B"))
    _labels(*sides)
    wanted = _precision(sides, precision)
    for s in sides:
        if s.live is not None:
            if wanted not in s.live.precisions:
                raise ParityError(f"{s.live.name} computes in {', '.join(s.live.precisions)} only: it has no "
                                  f"{wanted} results to diff (--precision)")
            declined = s.live.declined(fixture)
            if declined:
                raise ParityError(f"{s.live.name} declines this fixture: {declined}")
    live = [s.live for s in sides if s.live is not None]
    ran = (run_parity(fixture, live, [wanted], progress=progress, keep_outputs=True, decoding=False, budget=True)
           if live else None)
    report = Report(str(fixture.root), fixture_id=fid, tolerances=fixture.tolerance_summary(), measure_budget=True,
                    read_from=read_from([fixture.root], "the fixture directory")
                    | read_from([s.dump.path for s in sides if s.dump is not None], "a dump it compared"))
    outputs: dict[str, BackendOutput] = {}
    supported: dict[str, list[str]] = {}
    for s in sides:
        label = s.side.label
        if s.live is not None:
            assert ran is not None
            report.runs += [r for r in ran.runs if r.backend == s.live.name]
            outputs[label] = ran.outputs[(s.live.name, wanted)]
            supported[label] = list(ran.supported.get((s.live.name, wanted), []))
        else:
            assert s.dump is not None
            report.runs.append(BackendRun(label, wanted, 0.0, RunStatus.DUMP, str(s.dump.path)))
            outputs[label], supported[label] = s.dump.output, list(s.dump.supported)
        add_output(report, fixture, label, wanted, outputs[label], supported[label])
    finish_report(report, fixture)
    notes = [f"note: {d.backend} {tier_label(d.precision, d.golden)} breaks the fixture's tolerance, first at {d.tap} "
             "(`parity compare` of its dump, or `parity run`, shows it)" for d in report.divergences]
    diff = differential(fixture, outputs, supported, (sides[0].side, sides[1].side), wanted,
                        per_tap_c(fixture, wanted), notes)
    diff.report = report
    if diff.verdict == Verdict.NOTHING_COMPARED:
        raise ParityError(f"nothing was compared: no tap is produced by both sides ({diff.coverage})")
    return diff


def verdict_line(diff: Differential) -> str:
    """The last line: what was flagged, or why nothing was, and how many taps were compared."""
    coverage = diff.coverage
    a, b = diff.backends
    taps = diff.flagged_taps
    if taps:
        return (f"FLAGGED: {len(taps)} tap(s) where one side is far from the other or from the truth, first at "
                f"{taps[0]} ({coverage})")
    if diff.notes:
        return (f"NOTHING FLAGGED between {a} and {b}, but {len(diff.notes)} tier(s) break the fixture's tolerance "
                f"(the notes above): DISAGREE ({coverage})")
    partial = len(diff.compared) < len(diff.rows)
    where = (f"on the {len(diff.compared)} of {len(diff.rows)} taps both produce (only those were compared)"
             if partial else "on every tap")
    return (f"NOTHING FLAGGED {where}: {a} and {b} are within each tap's bound of each other (2c, c = {diff.c:g} or "
            f"the fixture's tolerance where larger), and neither is far worse than the other against the truth "
            f"({coverage})")


def print_diff(diff: Differential, out: TextIO) -> Verdict:
    """Print the view, the notes and the verdict line; return the verdict."""
    for line in [*format_differential(diff), *diff.notes, verdict_line(diff)]:
        print(line, file=out)
    return diff.verdict


def diff_report_json(diff: Differential, exit_code: int) -> dict[str, Any]:
    """The JSON `parity diff --json` writes: the report of both sides judged against the goldens (as `parity
    compare --json`), with the `diff` object (report.schema.json, `$defs/diff`)."""
    from parity_harness._compare.differential import diff_json
    from parity_harness._views.console import _finite, report_json

    assert diff.report is not None
    doc = report_json(diff.report)
    doc["diff"] = _finite(diff_json(diff, exit_code))
    return doc


def write_diff_json(diff: Differential, exit_code: int, path: Path) -> None:
    import json

    from parity_harness._core.output_paths import write_report_text

    text = json.dumps(diff_report_json(diff, exit_code), indent=1, allow_nan=False) + "\n"
    write_report_text(path, text, "JSON report")


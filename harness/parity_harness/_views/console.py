"""Render a parity report: the terminal table, the first divergences, the verdict, and the JSON file.

JSON schema (version 1), stable for CI scripts:

    {
      "schema": "parity-report", "schema_version": 1, "usable": true,
      "fixture": str, "fixture_id": str, "passed": bool, "exit_code": 0 | 1,
      "counts": {"passed": int, "failed": int, "not_supported": int},
      "results": [ {"backend", "precision", "golden", "case", "tap", "status", "passed",
                    "max_abs", "max_rel", "min_atol", "atol", "rtol", "index", "actual",
                    "expected", "message"} ],            # one per backend x precision x golden x case x tap
      "taps": [ {"backend", "precision", "golden", "tap", "status", "passed", "n_cases", "n_failed",
                 "max_abs", "max_rel", "min_atol", "worst_case", "atol", "rtol", "message"} ],
      "first_divergence": {backend: [ {"precision", "golden", "tap", "case", "index", "actual",
                                      "expected", "max_abs", "atol", "message", "upstream_taps",
                                      "upstream_max_abs", "by_case", "n_bad", "location", "axes",
                                      "previous_tap", "previous_max_abs", "cause", "op"} ]},
      "runs": [ {"backend", "precision", "seconds", "status", "message"} ],  # status "ran", "not_supported", "dump",
                                                                             # "crashed" (message: the error line)
      "skipped": [str],                                  # registered backends not run (missing dependencies)
      "broken": [str],       # registered backends whose plugin failed to load (exit 2; added in version 1)
      "restarts": [str],     # a browser or Node killed by a signal, restarted once and its backend run again
      "tolerances": {"fp32": {"atol", "rtol", "overrides": {tap: {"atol", "rtol"}}, "rows": {tap: int}},
                     "fp64": {...}},      # "rows" only when the fixture has taps with rows (the last N compared)
      "tolerances_loose": [str],   # tolerances beyond their ceiling (--allow-loose-tolerances); [] normally
      "loose": bool,               # true when tolerances_loose is not empty: not a gate
      "reduced_c": {"fp16": float, "bf16": float},  # c of each reduced precision's atol c * eps * M_tap
      "manifest_sha256": str,      # the fixture's seal: which manifest (tolerances included) was in force
      "taps_compared": {backend: {"compared": int, "of": int}},  # taps compared in any tier, of the fixture's
      "budget": [ {"backend", "precision", "tap", "status", "max_abs", "magnitude", "eps32_units",
                   "eps64_units", "case", "index", "message"} ]  # against golden.fp64; see
                   parity_harness/_compare/budget.py
    }

`location` names the worst cell by axis ("position 3 ('sleeps'), head 1, key position 0 ('.')"),
and `axes` gives the same as {"position": 3, "head": 1, "key_position": 0}; `results` rows carry
`n_bad`, the number of cells that break tolerance. The `budget` rows (added in version 1 without
breaking it) include the fixture's own float32 golden as backend "golden.fp32". Also added in
version 1: `fixture_id`, the fixture's content hash (parity_harness/_fixture/identity.py, docs/dump-format.md),
which `parity merge` uses to refuse reports of different fixtures; and the run status "dump"
(`parity compare`: the outputs were read from the dump file named in `message`, `seconds` is 0).
Also added in version 1: a first divergence's `op`, where inside the tap it starts (a graph's node, its inputs
and constants: `Backend.locate_op`, docs/onnx.md; "" when the backend cannot tell). And its `cause`, the likely
cause named from the numbers
("; "-joined pattern names, "" when none applies: parity_harness/_compare/diagnose.py, docs/diagnosis.md).

Also added in version 1: `decoding`, present when `parity run` attempted the decoding check
(absent in `parity compare` reports: dumps hold no decoding; `parity merge` merges it), after the
forward fields:

      "decoding": {"available": bool,                   # false: the fixture has no decoding goldens
                   "steps": int, "prompts": [str], "taps": [str],   # taps: blocks.{i}.attn.cache_k|cache_v, logits
                   "passed": bool, "counts": {"passed": int, "failed": int, "near_ties": int},
                   # results, summaries and first_divergence are the forward rows' records (one judge,
                   # parity_harness/_compare/judge.py): a decoding result's "case" is its prompt and "step" its step;
                   # a summary's n_cases counts prompt x step checks, worst_case/worst_step its worst one;
                   # a first divergence adds "step" and "margin" (upstream_* cover every check before it).
                   "results": [ {... the fields of "results" above, "step": int} ],
                   "summaries": [ {... the fields of "summaries" above, "worst_step": int} ],
                   "first_divergence": [ {... the fields of "first_divergence" above, "step": int,
                                          "margin": float} ],
                   "greedy": [ {"backend", "precision", "prompt", "expected", "actual", "status",
                                "first_step", "margin"} ],   # status "ok", "fail" or "near_tie"
                   "runs": [ {"backend", "precision", "seconds"} ],
                   "not_supported": [str],                # backends that do not decode
                   "vocab": [str], "sequences": {prompt: [int]}}   # each prompt + the golden's greedy tokens

Step 0 is the prefill; each step k >= 1 feeds one token. `margin` is the golden's top-2 logit margin at
that step. A decoding failure (a "fail" result or greedy row) makes `passed` false and the exit code 1;
a near-tie does not.

Also added in version 1: `grad`, present when the run was asked for the gradient check (`parity run --grad`,
docs/gradients.md):

      "grad": {"available": bool, "cases": [str], "steps": int,
               "names": [str],          # the backward's order: "loss", then gradients nearest the loss first
               "train_names": [str],    # a step's order: "loss", "grad_norm", then every parameter
               "spec": {...},           # the training section's optimizer (lr per step, betas, eps, decay, ...)
               "passed": bool, "counts": {"passed": int, "failed": int},
               "results": [...], "summaries": [...], "first_divergence": [...],                  # the backward
               "train_results": [...], "train_summaries": [...], "train_first_divergence": [...],  # "step" set
               "runs": [ {"backend", "precision", "seconds"} ],
               "not_supported": [str], "not_training": [str]}

Its records are the forward rows' (one judge). A failing gradient or training check makes `passed` false and the
exit code 1; a `--grad` run where no backend has a backward compared nothing: exit 2.

`status` is "ok", "fail" or "not_supported"; `passed` is null when not supported. JSON holds no
infinity or NaN: such a number (an infinite error of a structural failure: shape, dtype, NaN, infinity
mismatch; a -inf cell of a masked score) is written as null, and the object holding it names it in an
added member, `"nonfinite": {field: "inf" | "-inf" | "nan"}` (added in version 1: a reader that knows it
restores the value; an older reader sees the nulls it always saw). The whole schema is a file,
parity_harness/_views/report.schema.json, checked against real reports by tests/views/test_report_schema.py.

Also added in version 1: `usable`. A command that ends in an error (exit 2, or 130 when interrupted)
after its report paths were checked writes, instead of a report, a marker that `parity merge` refuses
(so a report left at that path by an earlier run cannot pass for this one):

    {"schema": "parity-report", "schema_version": 1, "usable": false, "passed": false,
     "exit_code": 2 | 130, "command": "run" | "compare" | "merge", "error": str, "fixture": str}

`error` is the one line the command printed after `parity: error: `; `fixture` is the fixture
argument ("" for merge). A report with `usable` true (or, written before it existed, absent) has
`exit_code` 0 or 1: a run that compared nothing exits 2 and leaves the marker. The one exception,
also added in version 1: a `parity run` a backend crashed in after another backend ran writes the
report of the runs so far, with the crashed run in `runs` (status "crashed", the error line in
`message`), `"passed": false` and `"exit_code": 2`; `parity merge` refuses it, naming the file.
(A crash before any backend ran leaves the marker.)
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from parity_harness._cli.exit_codes import for_verdict
from parity_harness._compare.judge import NOT_SUPPORTED, FirstDivergence, TapSummary
from parity_harness._compare.report import Report
from parity_harness._core.sanitize import safe_line
from parity_harness._core.status import RunStatus
from parity_harness._core.text import format_pair, num_text, tier_label, tolerance_text

SCHEMA_VERSION = 1
DUMP = RunStatus.DUMP  # a run's status when its outputs were read from a dump (`parity compare`)


NONFINITE = "nonfinite"  # the key that names, in an object, each of its numbers that JSON cannot hold


def _nonfinite_text(value: float) -> str:
    return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"


def _finite(obj: Any) -> Any:
    """The report as strict JSON, with every non-finite number made explicit.

    A number that is infinite or NaN is written as null, and the object that holds it gets a `"nonfinite"`
    member naming it: `{"max_abs": null, ..., "nonfinite": {"max_abs": "inf"}}` ("inf", "-inf" or "nan"). A
    null that `nonfinite` does not name is a value that is absent (a tap not supported). Inside a list of
    numbers (a cell index) there are none.
    """
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        out = {k: _finite(v) for k, v in obj.items()}
        named = {k: _nonfinite_text(v) for k, v in obj.items() if isinstance(v, float) and not math.isfinite(v)}
        if named:
            out[NONFINITE] = named
        return out
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def tap_line(s: TapSummary, width: int, names: int = 22) -> str:
    label = f"{s.backend:<{names}} {tier_label(s.precision, s.golden):<12} {s.tap:<{width}}"
    if s.status == NOT_SUPPORTED:
        return f"{label}  n/a   not supported"
    verdict = "OK  " if s.passed else "FAIL"
    tol = tolerance_text(s.atol, s.rtol)
    line = f"{label}  {verdict}  max_abs {num_text(s.max_abs)}  max_rel {num_text(s.max_rel)}  ({tol})"
    if not s.passed:
        line += f"  {s.n_failed}/{s.n_cases} cases, worst {s.worst_case}"
        if s.message:
            line += f": {s.message}"
    return line


def divergence_paragraph(d: FirstDivergence) -> str:
    """One short paragraph: where the tier first breaks tolerance, both values, and how upstream agrees.

    e.g. "pytorch fp32 vs fp32: first divergence at blocks.1.mlp.hook_pre, case grammar_2, position 4
    ('sees'), neuron 0 [4, 0]: got 0.51, expected 0.5 (|diff| 1.0e-03 > atol 1e-05; 5 cells break
    tolerance). Upstream agrees: the 29 taps before it are within 4.8e-07 (the last one,
    blocks.1.ln2.hook_normalized, within 2.4e-07). 8 of 9 cases first diverge here; ..."
    """
    where = ""
    if d.location:
        where = f", {d.location} {d.index}"
    elif d.index is not None:
        where = f" at {d.index}"
    values = ""
    if d.actual is not None and d.expected is not None and not d.message:
        cells = f"; {d.n_bad} cell{'s' if d.n_bad != 1 else ''} break tolerance" if d.n_bad else ""
        got, want = format_pair(d.actual, d.expected)  # the digits that show the difference
        values = (f": got {got}, expected {want} "
                  f"(|diff| {num_text(d.max_abs)} > {tolerance_text(d.atol, d.rtol, rule=True)}{cells})")
    elif d.message:
        values = f": {d.message}"
    if d.upstream_taps == 0:
        upstream = "It is the first tap compared: nothing upstream to check."
    else:
        def within(x: float | None) -> str:
            return "exactly" if x == 0 else f"within {num_text(x)}"

        upstream = (f"Upstream agrees: the {d.upstream_taps} tap{'s' if d.upstream_taps != 1 else ''} "
                    f"before it agree {within(d.upstream_max_abs)}")
        if d.previous_tap is not None and d.previous_max_abs is not None:
            upstream += f" (the last one, {d.previous_tap}, {within(d.previous_max_abs)})"
        upstream += "."
    here = sum(1 for t in d.by_case.values() if t == d.tap)
    others = {c: t for c, t in d.by_case.items() if t != d.tap}
    text = (f"{d.backend} {tier_label(d.precision, d.golden)}: first divergence at {d.tap}, "
            f"case {d.case}{where}{values}. {upstream}")
    if d.op:  # inside the tap: a graph's node (Backend.locate_op)
        text += f" Down to the op: {d.op}."
    if d.cause:  # named from the numbers (parity_harness/_compare/diagnose.py)
        text += f" Likely cause: {d.cause}."
    if d.by_case:
        text += f" {here} of the {len(d.by_case)} diverging case{'s' if len(d.by_case) != 1 else ''} first break here"
        if others:
            text += "; the others first at: " + ", ".join(f"{c} -> {t}" for c, t in others.items())
        text += "."
    return text


def _not_supported_line(group: list[TapSummary], names: int = 22) -> str:
    s = group[0]
    taps = group[0].tap if len(group) == 1 else f"{len(group)} taps, {group[0].tap} .. {group[-1].tap}"
    return f"{s.backend:<{names}} {tier_label(s.precision, s.golden):<12} not supported: {taps}"


def _emit(out: TextIO, line: str = "") -> None:
    """The terminal report's one sink: every line, whatever outside strings it holds, made safe (sanitize.py)."""
    print(safe_line(line), file=out)


def print_budget(report: Report, out: TextIO) -> None:
    """The error budget section (`parity run --budget`): every result against the float64 truth."""
    from parity_harness._compare.budget import format_budget

    fixture_taps = list(dict.fromkeys(r.tap for r in report.budget))
    _emit(out)
    for line in format_budget(report.budget, fixture_taps):
        _emit(out, line)


def tap_table(report: Report, out: TextIO, per_case: bool = False) -> None:
    """`-v`: one line per backend x precision x tap (worst over cases), consecutive unsupported taps folded; with
    `per_case` (`-vv`) one line per case under each compared tap. Then each run's time."""
    tree = report.tree
    width = max((len(t.tap) for tier in tree.tiers for t in tier.taps), default=10)
    names = max((len(tier.backend) for tier in tree.tiers), default=7)
    for tier in tree.tiers:
        pending: list[TapSummary] = []
        for node in [*tier.taps, None]:
            if node is not None and node.status == NOT_SUPPORTED:
                pending.append(node.summary)
                continue
            if pending:
                _emit(out, _not_supported_line(pending, names))
                pending = []
            if node is None:
                break
            line = tap_line(node.summary, width, names)
            if node.after is not None:  # failing downstream of the tier's first divergence: said, not repeated
                line += f"  (downstream of {node.after})"
            _emit(out, line)
            if per_case:
                for r in node.checks:
                    mark = "OK  " if r.passed else "FAIL"
                    _emit(out, f"    {r.case:<20} {mark}  max_abs {num_text(r.max_abs)}  at {r.index}"
                               f"{'  ' + r.message if r.message else ''}")
    _emit(out)
    for run in tree.runs:
        if run.status == RunStatus.RAN:
            _emit(out, f"{run.backend:<{names}} {run.precision}  ran in {run.seconds:.2f} s")
        elif run.status == DUMP:
            _emit(out, f"{run.backend:<{names}} {run.precision}  from dump {run.message}")
        elif run.status == RunStatus.CRASHED:
            _emit(out, f"{run.backend:<{names}} {run.precision}  CRASHED after {run.seconds:.2f} s: {run.message}")
        else:
            _emit(out, f"{run.backend:<{names}} {run.precision}  not supported ({run.message})")


def print_report(report: Report, out: TextIO, verbose: int | bool = 0, budget: bool = False) -> None:
    """The run's story in order: what ran (one line per backend x tier; with `-v` the per-tap table, with `-vv`
    every case too), the tolerances, every first divergence with its likely cause, and the verdict last.

    Builds the report's tree (`Report.tree`): from here on the Report is frozen.
    """
    from parity_harness._views.overview import overview_lines

    tree = report.tree
    level = int(verbose)
    if level:
        tap_table(report, out, per_case=level > 1)
        if report.decoding is not None and tree.decoding is not None:
            from parity_harness._views.decoding import decoding_lines

            _emit(out)
            for line in decoding_lines(report.decoding, tree.decoding):
                _emit(out, line)
    else:
        for line in overview_lines(report):
            _emit(out, line)
    if tree.grad is not None:  # asked for (--grad): always shown
        from parity_harness._views.gradients import grad_lines

        _emit(out)
        for line in grad_lines(tree.grad):
            _emit(out, line)
    if report.stored:  # a stored weight format: the verdict's number and the format's own cost
        from parity_harness._views.stored import stored_lines

        _emit(out)
        for line in stored_lines(report.stored, verbose=level > 0):
            _emit(out, line)
    for backend, build in report.builds.items():  # what a native backend says it computed with
        _emit(out, f"{backend}: {build}")
    for line in sources_lines(report, verbose=level > 0):  # a user's graph: which tensor stood for which tap
        _emit(out, line)
    for note in report.restarts:  # an infrastructure flake the run recovered from: said, never hidden
        _emit(out, f"restarted: {note}")
    if budget:
        print_budget(report, out)
    _emit(out)
    _emit(out, tolerances_line(report))
    if report.loose:
        _emit(out, loose_line(report))
    for line in divergence_lines(report):
        _emit(out)
        _emit(out, line)
    if tree.divergences:
        _emit(out)
    hint = stale_hint(report)
    if hint:
        _emit(out, hint)
    _emit(out, verdict_line(report))


def sources_lines(report: Report, verbose: bool = False) -> list[str]:
    """Per backend that says what stood for its taps: how many were found and how, the taps it does not compute;
    with `verbose`, one line per tap."""
    lines: list[str] = []
    for backend, sources in report.sources.items():
        missing = [t for t, text in sources.items() if not text]
        how: dict[str, int] = {}
        for text in sources.values():
            if text:
                kind = text.rsplit("; ", 1)[-1].rstrip(")")
                how[kind] = how.get(kind, 0) + 1
        found = ", ".join(f"{n} by {kind}" for kind, n in sorted(how.items()))
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        lines.append(f"{backend}: {len(sources) - len(missing)} of {len(sources)} taps found in the graph ({found}); "
                     f"not computed by it: {shown or 'none'}")
        if verbose:
            lines += [f"  {tap:<34} {text or 'not computed'}" for tap, text in sources.items()]
    return lines


def stale_hint(report: Report) -> str | None:
    """'Hint: ...' when only the backend that made the goldens disagrees (parity_harness/_compare/diagnose.py)."""
    if report.passed:
        return None
    from parity_harness._compare.diagnose import stale_golden_hint

    hint = stale_golden_hint(report)
    return f"Hint: {hint}" if hint else None


def divergence_lines(report: Report) -> list[str]:
    """Every first divergence as its paragraph: the decoding check's first, then the forward tiers', so the one
    just above the verdict is the forward pass's (where a decoding divergence usually starts)."""
    from parity_harness._views.decoding import divergence_paragraph as decoding_paragraph

    tree = report.tree
    lines = []
    if tree.decoding is not None:
        dec = tree.decoding.source
        lines += [decoding_paragraph(d, dec.sequences.get(d.case, []), dec.vocab) for d in tree.decoding.divergences]
    if tree.grad is not None:
        from parity_harness._views.gradients import divergence_paragraph as grad_paragraph

        lines += [grad_paragraph(d, tree.grad.source) for d in tree.grad.divergences]
    lines += [divergence_paragraph(t.divergence) for t in tree.tiers if t.divergence is not None]
    return lines


def tolerances_line(report: Report) -> str:
    """The tolerances in force: 'tolerances: fp32 atol 1e-05, rtol 1e-05; fp64 atol 1e-12; reduced atol c x eps x
    M_tap: fp16 c 32, bf16 c 32; manifest_sha256 ...' (every reduced precision's c, as sealed)."""
    tiers = report.tolerances.get("tiers", {})
    parts = []
    for tier, t in tiers.items():
        text = f"{tier} {tolerance_text(t['atol'], t['rtol'])}"
        if t["overrides"]:
            text += f" (+{len(t['overrides'])} per-tap override{'s' if len(t['overrides']) != 1 else ''})"
        parts.append(text)
    reduced = report.tolerances.get("reduced_c", {})
    if reduced:  # every reduced precision's c in force: its atol is c * eps * M_tap, rtol 0
        parts.append("reduced atol c x eps x M_tap: " + ", ".join(f"{p} c {c:g}" for p, c in reduced.items()))
    rows = next((t["rows"] for t in tiers.values() if t.get("rows")), None)
    if rows:
        parts.append(rows_text(rows))
    seal = str(report.tolerances.get("manifest_sha256", ""))[:16]
    return f"tolerances: {'; '.join(parts) or 'none'}; manifest_sha256 {seal}..."


def rows_text(rows: dict[str, int]) -> str:
    """'rows: last 1 position of 43 taps (hook_embed .. logit_lens.2)': the taps compared on their last rows only."""
    by_n: dict[int, list[str]] = {}
    for tap, n in rows.items():
        by_n.setdefault(int(n), []).append(tap)
    groups = []
    for n, taps in sorted(by_n.items()):
        names = ", ".join(taps) if len(taps) <= 3 else f"{taps[0]} .. {taps[-1]}"
        groups.append(f"last {n} position{'s' if n != 1 else ''} of {len(taps)} tap{'s' if len(taps) != 1 else ''} "
                      f"({names})")
    return "rows: " + ", ".join(groups)


def loose_line(report: Report) -> str:
    problems = report.tolerances.get("loose", [])
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"LOOSE TOLERANCES (--allow-loose-tolerances): {problems[0]}{more}; this run is not a gate"


def compared_text(report: Report) -> str:
    """'pytorch 43/43, onnxruntime-optimized 5/43': taps each backend was compared on, of the fixture's."""
    return ", ".join(f"{b} {n}/{total}" for b, (n, total) in report.taps_compared().items())


def fixture_text(report: Report) -> str:
    """The fixture as the verdict names it: parity's own by name (`fixtures/toy`, never the installation's path:
    _core/shown_path.py), a user's relative to the working directory when it is under it, else as given."""
    from parity_harness._core.shown_path import shown_fixture

    path = report.fixture
    if shown_fixture(path) != path:
        return shown_fixture(path)
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return rel if path and not rel.startswith("..") else path


def verdict_line(report: Report) -> str:
    """The last line: PASS, FAIL or ERROR, naming the fixture and, on a disagreement, the first diverging tap."""
    from parity_harness._views.decoding import decoding_verdict
    from parity_harness._views.gradients import grad_counts, grad_verdict
    from parity_harness._views.overview import first_tap_text

    n_ns = sum(1 for r in report.results if r.status == NOT_SUPPORTED)
    counts = f"{report.n_passed} passed, {report.n_failed} failed, {n_ns} not supported"
    fixture = f"; fixture {fixture_text(report)}"  # last: a line cut at the terminal's edge keeps the verdict
    crashed = report.crashed
    if crashed is not None:  # never a pass, whatever the runs before it found
        return (f"ERROR: backend {crashed.backend} crashed ({crashed.precision}), the run stopped there; "
                f"the runs before it: {counts}{fixture}")
    if report.broken:  # a registered plugin that failed to load: never a pass, whatever the others found
        names = ", ".join(line.split(":", 1)[0] for line in report.broken)
        return (f"ERROR: {len(report.broken)} registered backend(s) broken, not run: {names}; "
                f"the others: {counts}{fixture}")
    if report.n_passed + report.n_failed == 0:
        return f"ERROR: nothing was compared; {counts}{fixture}"
    if report.named_uncompared():  # the Report's verdict (NOTHING_COMPARED), never a PASS line
        return f"ERROR: {report.nothing_compared_reason()}; {counts} (tap x case checks){fixture}"
    decoding = decoding_verdict(report.decoding)
    gradients = grad_verdict(report.grad)
    extra = "".join(f"; {part}" for part in (decoding, gradients) if part)
    first = first_tap_text(report) if report.n_failed or decoding else ""  # the backward's is in `gradients`
    gcounts = f"; {grad_counts(report.grad)}" if report.grad is not None else ""
    if report.n_failed:
        names = ", ".join(sorted({f"{d.backend} {tier_label(d.precision, d.golden)}" for d in report.divergences}))
        return (f"FAIL: disagreement in {names}{first}{extra}; "
                f"{counts} (tap x case checks){gcounts}{fixture}")
    if decoding or gradients:
        return f"FAIL: {extra[2:]}{first}; {counts} (tap x case checks){gcounts}{fixture}"
    if report.grad_uncompared():
        return f"ERROR: {report.nothing_compared_reason()}; {counts} (tap x case checks){gcounts}{fixture}"
    skipped = f"; {len(report.skipped)} registered backend(s) skipped (missing dependencies)" if report.skipped else ""
    verdict = "PASS (LOOSE TOLERANCES)" if report.loose else "PASS"
    return (f"{verdict}: every backend agrees on every tap it was compared on (taps compared: "
            f"{compared_text(report)}); {counts} (tap x case checks){gcounts}{skipped}{fixture}")


def report_json(report: Report) -> dict[str, Any]:
    from parity_harness._core.shown_path import shown_fixture
    from parity_harness._views.decoding import decoding_json
    from parity_harness._views.gradients import grad_json
    from parity_harness._views.stored import stored_json

    by_backend: dict[str, list[dict[str, Any]]] = {}  # the tree's tiers in order; a backend's follow each other
    for tier in report.tree.tiers:
        if tier.divergence is not None:
            entry = asdict(tier.divergence)
            by_backend.setdefault(entry.pop("backend"), []).append(entry)
    return _finite({  # type: ignore[no-any-return]
        "schema": "parity-report",
        "schema_version": SCHEMA_VERSION,
        "usable": True,
        "fixture": shown_fixture(report.fixture),  # parity's own fixture by name, not its installation's path
        "fixture_id": report.fixture_id,
        "passed": report.passed,
        "exit_code": for_verdict(report.verdict),
        "counts": {
            "passed": report.n_passed,
            "failed": report.n_failed,
            "not_supported": sum(1 for r in report.results if r.status == NOT_SUPPORTED),
        },
        "results": [asdict(r) for r in report.results],
        "taps": [asdict(s) for s in report.summaries],
        "first_divergence": by_backend,
        "runs": [asdict(r) for r in report.runs],
        "skipped": list(report.skipped),
        "broken": list(report.broken),  # registered plugins that failed to load, one line each: exit 2
        "restarts": list(report.restarts),
        "budget": [asdict(b) for b in report.budget],
        "tolerances": report.tolerances.get("tiers", {}),
        "tolerances_loose": list(report.tolerances.get("loose", [])),
        "loose": report.loose,
        "reduced_c": dict(report.tolerances.get("reduced_c", {})),
        "manifest_sha256": report.tolerances.get("manifest_sha256", ""),
        "taps_compared": {b: {"compared": n, "of": total} for b, (n, total) in report.taps_compared().items()},
        **({"decoding": decoding_json(report.decoding)} if report.decoding is not None else {}),
        **({"grad": grad_json(report.grad)} if report.grad is not None else {}),
        **({"stored": stored_json(report.stored)} if report.stored else {}),
        **({"builds": dict(report.builds)} if report.builds else {}),
        **({"sources": {b: dict(s) for b, s in report.sources.items()}} if report.sources else {}),
    })


def report_text(report: Report, verbose: int = 0) -> str:
    """The terminal report as text (the "text" view: `api.render`), headed by the fixture line that marks a
    written file as parity's (parity_harness/_core/output_paths.py)."""
    import io

    out = io.StringIO()
    out.write(f"parity: fixture {fixture_text(report)}\n")
    print_report(report, out, verbose=verbose)
    return out.getvalue()


def report_json_text(report: Report, verbose: int = 0) -> str:
    """The JSON report as text (the "json" view)."""
    return json.dumps(report_json(report), indent=1, allow_nan=False) + "\n"


def write_json(report: Report, path: Path) -> None:
    from parity_harness._core.output_paths import write_report_text

    write_report_text(path, report_json_text(report), "JSON report")


def unusable_json(command: str, error: str, exit_code: int, fixture: str) -> dict[str, Any]:
    """The marker a command that ended in an error leaves at its --json path (schema above)."""
    return {"schema": "parity-report", "schema_version": SCHEMA_VERSION, "usable": False, "passed": False,
            "exit_code": exit_code, "command": command, "error": error, "fixture": fixture}


def write_unusable_json(path: Path, command: str, error: str, exit_code: int, fixture: str) -> None:
    """Write the unusable marker; ParityError (one line) if the system refuses."""
    from parity_harness._core.output_paths import write_report_text

    text = json.dumps(unusable_json(command, error, exit_code, fixture), indent=1, allow_nan=False) + "\n"
    write_report_text(path, text, "JSON report")

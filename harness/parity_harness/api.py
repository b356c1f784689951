"""parity's public Python API: load a fixture, run backends, judge dumps, render a report, assert agreement.

Everything a Python user (a test suite, a notebook, a CI script) needs is here, in one module::

    import parity_harness.api as parity

    report = parity.run(["numpy", MyBackend()], precisions="fp64")   # a Report: truthy when it passes
    print(parity.render(report))                                     # the terminal report, as a string
    parity.assert_agrees(MyBackend(), precision="fp64")              # ParityAssertionError naming the tap

The API is built on the same layers as the `parity` command (docs/architecture.md): every backend
goes through the one boundary (`GuardedBackend`), every check through the one judge, every text
through the existing views. It does not print and it never decides an exit code (the CLI does):
bad input, usage or environment is a `ParityError` (what the CLI turns into exit 2), a disagreement is
a falsy Report or, from `assert_agrees`, a `ParityAssertionError`. See docs/api.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias

from parity_harness._backends.base import Backend
from parity_harness._backends.boundary import GuardedBackend
from parity_harness._backends.guard import describe_exception, reraise_if_interrupt
from parity_harness._compare.report import Report
from parity_harness._core.errors import ParityError
from parity_harness._fixture.fixture import Fixture
from parity_harness._run.request import (
    RunPlan,
    check_flag,
    execute,
    fixture_from,
    guarded_callback,
    plan_run,
)

if TYPE_CHECKING:
    from parity_harness._compare.differential import Differential
    from parity_harness._compare.judge import FirstDivergence

__all__ = [
    "BackendLike",
    "Fixture",
    "ParityAssertionError",
    "ParityError",
    "Report",
    "RunPlan",
    "assert_agrees",
    "compare_dumps",
    "diff",
    "failure_message",
    "load",
    "merge",
    "plan",
    "render",
    "run",
]

BackendLike: TypeAlias = str | Backend | GuardedBackend  # a registered name, or an instance (yours or a built-in's)
FixtureLike: TypeAlias = Fixture | str | os.PathLike[str] | None  # a loaded fixture, a directory, or None: the toy
PrecisionLike: TypeAlias = str | Sequence[str]  # "fp32", "fp64", "fp16", "bf16", "all" (fp32, fp64), or a list
Format: TypeAlias = Literal["text", "json", "junit", "markdown"]
FORMATS: tuple[str, ...] = ("text", "json", "junit", "markdown")  # the keys of _views/registry.py VIEWS


class ParityAssertionError(AssertionError):
    """`assert_agrees` failed: a disagreement, or nothing was compared. The message's first line names the
    tap (or says nothing was compared); `report` is the whole Report, for a closer look."""

    def __init__(self, message: str, report: Report) -> None:
        super().__init__(message)
        self.report = report


# -- the gate ----------------------------------------------------------------------------------------


@contextmanager
def _gate() -> Iterator[None]:
    """What leaves the API: a ParityError (bad input, a crashed backend), a ParityAssertionError, or a genuine
    Ctrl-C. Anything else (a TypeError from a wrong argument, a SystemExit from a caller's callback, a bug in
    parity) is one `ParityError` naming it, as the CLI prints it: nothing escapes as something else."""
    try:
        yield
    except (ParityError, ParityAssertionError):
        raise
    except KeyboardInterrupt as exc:
        reraise_if_interrupt(exc)
        raise ParityError(f"internal error: {describe_exception(exc)}") from None
    except BaseException as exc:
        raise ParityError(f"internal error: {describe_exception(exc)}") from exc


# -- loading ---------------------------------------------------------------------------------------


def load(path: str | os.PathLike[str] | None = None, *, allow_loose_tolerances: bool = False) -> Fixture:
    """Read and validate a fixture directory (None: the toy fixture parity ships), goldens and weights
    included, before any backend runs; `FixtureError` (a `ParityError`) naming the file on any problem."""
    with _gate():
        if isinstance(path, Fixture):
            raise ParityError("load: give a directory (or None for the toy), not a Fixture")
        return fixture_from(path, check_flag("allow_loose_tolerances", allow_loose_tolerances))


# -- running ---------------------------------------------------------------------------------------


def plan(
    backends: BackendLike | Sequence[BackendLike] | None,
    fixture: FixtureLike = None,
    precisions: PrecisionLike = "all",
    *,
    no_skip: bool = False,
    allow_loose_tolerances: bool = False,
    save_outputs: str | os.PathLike[str] | None = None,
    onnx: str | os.PathLike[str] | None = None,
    onnx_map: str | os.PathLike[str] | Mapping[str, str] | None = None,
) -> RunPlan:
    """Check a run request without running anything: the `RunPlan` (fixture, backends, precisions, what the
    default selection skipped), or the `ParityError` that refuses it, the same one `run` raises.
    `backends=None`: every registered backend that runs by default (`parity run` without --backends); with `onnx`,
    that graph alone (`run`)."""
    with _gate():
        return plan_run(backends, fixture, precisions, no_skip=no_skip, allow_loose_tolerances=allow_loose_tolerances,
                        save_outputs=save_outputs, onnx=onnx, onnx_map=onnx_map)


def run(
    backends: BackendLike | Sequence[BackendLike] | None,
    fixture: FixtureLike = None,
    precisions: PrecisionLike = "all",
    *,
    decoding: bool = True,
    grad: bool = False,
    budget: bool = False,
    keep_outputs: bool = False,
    progress: Callable[[str], None] | None = None,
    keep_on_crash: bool = False,
    jobs: int | None = None,
    no_skip: bool = False,
    allow_loose_tolerances: bool = False,
    save_outputs: str | os.PathLike[str] | None = None,
    on_plan: Callable[[RunPlan], None] | None = None,
    onnx: str | os.PathLike[str] | None = None,
    onnx_map: str | os.PathLike[str] | Mapping[str, str] | None = None,
) -> Report:
    """Run each backend (a registered name or an instance; None: every registered backend that runs by default)
    in each requested precision it computes in, through the boundary, and compare every tap; then, unless
    `decoding` is False, check incremental decoding where the backend and the fixture support it; with `grad`, also
    the backward (every gradient of every training case) and the training steps of every backend that has a
    backward (docs/gradients.md; refused on a fixture without gradient goldens).

    Every rule that refuses a request or decides a verdict is applied below this call
    (parity_harness/_run/request.py), the same for `parity run` and the pytest plugin: a backend asked for by
    name that computes in none of `precisions` is refused, and one that compared nothing makes the verdict
    NOTHING_COMPARED.

    Returns the Report: truthy exactly when it passes (`report.passed`, `report.verdict` AGREE); falsy on a
    disagreement and when nothing was compared. `budget`: also measure the error budget (the JSON report's
    `budget`); `keep_outputs`: keep every output in `report.outputs`; `progress`: called with one line as each
    backend and precision starts (the CLI prints them); `keep_on_crash`: a backend that crashes ends the run
    with the report so far (`report.crash` holds the error, the report does not pass) instead of raising; `jobs`:
    how many backends may run at once (default one; a backend runs beside another only if it declares
    `concurrent = True`, docs/architecture.md), the report the same whatever it is; `no_skip`: with
    `backends=None`, a registered backend whose dependencies are missing is an error, not skipped;
    `allow_loose_tolerances`: for a fixture given as a directory; `save_outputs`: a directory to write each
    run's dump to (docs/dump-format.md), checked before any backend runs; `on_plan`: called with the checked
    `RunPlan` before any backend runs (the CLI prints its first lines); `onnx`: the path of any ONNX graph of the
    fixture's model, run by the `onnx-file` backend (alone when `backends` is None), its tensors matched to the
    taps by value or by `onnx_map` ({tap: tensor}, or a JSON file of it; docs/onnx.md). Raises `ParityError` for
    bad input (an unknown backend or precision, a broken fixture, missing dependencies, an option of the wrong
    type) and
    `BackendFailed` (also a `ParityError`) for a backend that crashed or returned something malformed.
    """
    with _gate():
        checked = plan(backends, fixture, precisions, no_skip=no_skip, allow_loose_tolerances=allow_loose_tolerances,
                       save_outputs=save_outputs, onnx=onnx, onnx_map=onnx_map)
        if on_plan is not None:
            guarded_callback("on_plan", on_plan)(checked)
        return execute(checked, progress=progress, keep_outputs=keep_outputs, decoding=decoding, budget=budget,
                       keep_on_crash=keep_on_crash, jobs=jobs, grad=grad)


def compare_dumps(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    fixture: FixtureLike = None,
    *,
    budget: bool = False,
) -> Report:
    """Judge saved outputs (dumps, docs/dump-format.md) like a live run: the same Report, truthy when it
    passes. Raises `ParityError` for an unreadable or malformed dump, or one made for another fixture."""
    from parity_harness._run.dump import compare_dumps as judge_dumps

    with _gate():
        items = _paths(paths, "dump file")
        return judge_dumps(fixture_from(fixture), items, budget=check_flag("budget", budget))


def diff(
    a: BackendLike | str | os.PathLike[str],
    b: BackendLike | str | os.PathLike[str],
    fixture: FixtureLike = None,
    precision: str | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Differential:
    """Two runs compared tap by tap with each other and with the float64 truth, no golden needed for the first
    (`parity diff A B`, docs/diagnosis.md): each of `a`, `b` is a backend (a registered name or an instance, run
    live) or a dump (a path: an `os.PathLike`, or a string ending in `.safetensors` or holding a path separator).
    `precision`: fp32, fp64, fp16 or bf16, which every dump must hold; None: the dumps' own (fp32 for two
    backends). Every number is in units of eps x M_tap of that precision.

    Returns the `Differential`: truthy exactly when nothing is flagged and both sides agree with the goldens;
    `.first` the first flagged tap (its worst cell named by axis in `.rows[i].cells`), `.flag_list` every flag
    with its rule, `.report` both sides judged against the goldens. Raises `ParityError` (one line, the CLI's
    exit 2) for the same backend or dump twice, a dump of another fixture or of a precision other than asked,
    an unknown backend, a backend that does not compute in the precision, and when no tap was compared.
    """
    from parity_harness._run.request import guarded_progress
    from parity_harness._tools.diff import run_diff

    with _gate():
        return run_diff(fixture_from(fixture), a, b, precision, progress=guarded_progress(progress))


def _paths(paths: object, what: str) -> list[Path]:
    """One path or a sequence of them (str or os.PathLike), at least one."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths) if isinstance(paths, Sequence) else None
    if items is None or not all(isinstance(p, (str, os.PathLike)) for p in items):
        raise ParityError(f"paths: expected a path or a list of paths (each a {what})")
    if not items:
        raise ParityError(f"paths: give at least one {what}")
    return [Path(p) for p in items]


def merge(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Report:
    """One Report from the JSON reports of sharded runs of one fixture (`parity merge`), each checked against
    its own rows first (docs/reports.md); `ParityError` naming the file for one that cannot be merged."""
    from parity_harness._run.merge import merge_reports

    with _gate():
        return merge_reports(_paths(paths, "JSON report"))


# -- rendering -------------------------------------------------------------------------------------


def render(report: Report, fmt: Format = "text", path: str | os.PathLike[str] | None = None, *,
           verbose: bool = False) -> str:
    """The report as text in one of the existing views: "text" (the terminal report after a first line
    "parity: fixture DIR", as `parity run` starts), "json" (the
    documented schema, parity_harness/_views/console.py), "junit" (XML) or "markdown". With `path`, also written
    there as `parity run` writes its reports (never inside the report's fixture directory; a temporary
    file in the same directory, then renamed over `path`); returns the text."""
    with _gate():
        if not isinstance(report, Report):
            raise ParityError(f"render: expected a Report, got a {type(report).__name__}")
        text = _render(report, fmt, check_flag("verbose", verbose))
        if path is not None:
            if not isinstance(path, (str, os.PathLike)):
                raise ParityError(f"render: path: expected a path, got a {type(path).__name__}")
            _write(report, os.fspath(path), text, fmt)
        return text


def _render(report: Report, fmt: object, verbose: bool) -> str:
    from parity_harness._views.registry import VIEWS, render_view

    if not isinstance(fmt, str) or fmt not in VIEWS:
        raise ParityError(f"fmt {str(fmt)[:40]!r}: expected one of {', '.join(FORMATS)}")
    return render_view(report, fmt, int(verbose))


def _write(report: Report, path: str, text: str, fmt: str) -> None:
    """`text` to `path` as the CLI writes its reports: checked first (never inside the report's fixture
    directory, writable), then a temporary file renamed over it (_core/output_paths.py, safe_write.py)."""
    from parity_harness._core.output_paths import check_output_paths, write_report_text

    protected: dict[str | Path, str] = {report.fixture: "the fixture directory"}
    protected.update(report.read_from)
    check_output_paths({"render path": path}, input_dirs=protected)
    from parity_harness._views.registry import VIEWS

    write_report_text(Path(path), text, VIEWS[fmt].label)


# -- asserting -------------------------------------------------------------------------------------


def assert_agrees(
    backend: BackendLike | Sequence[BackendLike] | Report | None,
    fixture: FixtureLike = None,
    precision: PrecisionLike = "all",
    *,
    decoding: bool = True,
    grad: bool = False,
    onnx: str | os.PathLike[str] | None = None,
    onnx_map: str | os.PathLike[str] | Mapping[str, str] | None = None,
) -> Report:
    """Run `backend` (see `run`; with `onnx`, that graph too, or alone when `backend` is None) and return the Report
    when every tap it was compared on agrees (with `grad`, every gradient and training step too).

    Raises `ParityAssertionError` (an AssertionError) when any tap or decoding step disagrees, its
    message's first line naming the first diverging tap, the case, the index, both values, the mismatch
    count and fraction and the allowed bound; and when nothing was compared (a backend that computes in
    fp64 only, asked for fp32). Bad input and crashing backends raise `ParityError`. Given a Report
    (`parity.assert_agrees(report)`, from `run`), it judges that report: the short failure of a test that
    ran first and looked at the report itself.
    """
    __tracebackhide__ = True  # pytest: show the caller's line, not this one
    report = backend if isinstance(backend, Report) else run(backend, fixture, precision, decoding=decoding, grad=grad,
                                                             onnx=onnx, onnx_map=onnx_map)
    if not report:
        raise ParityAssertionError(failure_message(report), report)
    return report


def failure_message(report: Report) -> str:
    """Why `report` does not pass, one line per fact; the first line names the first diverging tap.

    The lines after it are the terminal report's own paragraphs (parity_harness/_views/console.py,
    parity_harness/_views/decoding.py), then its verdict line. '' when the report passes.
    """
    from parity_harness._core.sanitize import safe_line
    from parity_harness._views.console import divergence_paragraph, verdict_line

    if report:
        return ""
    lines: list[str] = []
    if report.n_passed + report.n_failed == 0:
        why = [f"{r.backend} {r.precision}: {r.message}" for r in report.runs if r.message]
        lines.append("nothing was compared" + (f": {'; '.join(why)}" if why else ""))
    elif report.named_uncompared():
        lines.append(report.nothing_compared_reason())
    if report.n_passed + report.n_failed and report.divergences:
        order = {tap: i for i, tap in enumerate(dict.fromkeys(s.tap for s in report.summaries))}
        ranked = sorted(report.divergences, key=lambda d: order.get(d.tap, len(order)))
        lines.append(_headline(report, ranked[0]))
        lines += [divergence_paragraph(d) for d in ranked]
    if report.decoding is not None and report.decoding.n_failed:
        lines += _decoding_lines(report, headline=not lines)
    if report.grad is not None and (report.grad.n_failed or report.grad_uncompared()):
        from parity_harness._views.gradients import divergence_paragraph as grad_paragraph
        from parity_harness._views.gradients import grad_verdict

        if report.grad.n_failed:
            lines.append(grad_verdict(report.grad))
            lines += [grad_paragraph(d, report.grad) for d in (*report.grad.divergences,
                                                              *report.grad.train_divergences)]
        else:
            lines.append(report.nothing_compared_reason())
    if report.broken:  # registered plugins that failed to load: the others ran, never a pass
        lines.append(f"{len(report.broken)} registered plugin(s) broken, not run: {'; '.join(report.broken)}")
    verdict = verdict_line(report)
    if not (report.broken and verdict.startswith("PASS")):  # the others' PASS is not the report's verdict
        lines.append(verdict)
    return "\n".join(safe_line(line) for line in lines)  # this view's sink: outside strings made safe


def _headline(report: Report, d: FirstDivergence) -> str:
    """'first divergence at TAP: BACKEND fp32 vs fp32, case C, index [i, j]: got A, expected B (|diff| D, rel R >
    allowed L); N of M cells (P%) out of tolerance': the tap first, then what `torch.testing.assert_close` says
    (both values with the digits that tell them apart, the mismatch count and fraction, the allowed bound
    atol + rtol x |expected| at that cell as a number)."""
    from parity_harness._core.text import format_pair, num_text, tier_label

    index = f", index {d.index}" if d.index is not None else ""
    text = f"first divergence at {d.tap}: {d.backend} {tier_label(d.precision, d.golden)}, case {d.case}{index}"
    if d.actual is not None and d.expected is not None and not d.message:
        got, want = format_pair(d.actual, d.expected)
        diff = abs(d.actual - d.expected)
        rel = f", rel {num_text(diff / abs(d.expected))}" if d.expected else ""
        bound = d.atol + d.rtol * abs(d.expected)
        text += f": got {got}, expected {want} (|diff| {num_text(diff)}{rel} > allowed {num_text(bound)})"
    elif d.message:
        text += f": {d.message}"
    n_cells = next((r.n_cells for r in report.results if (r.backend, r.precision, r.golden, r.case, r.tap, r.step)
                    == (d.backend, d.precision, d.golden, d.case, d.tap, d.step)), 0)
    if d.n_bad and n_cells:
        text += f"; {d.n_bad} of {n_cells} cells ({100 * d.n_bad / n_cells:.3g}%) out of tolerance"
    elif d.n_bad:
        text += f"; {d.n_bad} cell{'s' if d.n_bad != 1 else ''} out of tolerance"
    return text


def _decoding_lines(report: Report, headline: bool) -> list[str]:
    from parity_harness._compare.decoding import FAIL, step_name
    from parity_harness._core.text import tier_label
    from parity_harness._views.decoding import divergence_paragraph, greedy_line

    dec = report.decoding
    assert dec is not None
    lines: list[str] = []
    if headline and dec.divergences:
        d = dec.divergences[0]
        lines.append(f"decoding: first divergence at {step_name(d.step or 0)}, {d.tap}: {d.backend} "
                     f"{tier_label(d.precision, d.golden)}, prompt {d.case}")
    lines += [divergence_paragraph(d, dec.sequences.get(d.case, []), dec.vocab) for d in dec.divergences]
    lines += [greedy_line(g, dec.vocab).strip() for g in dec.greedy if g.status == FAIL]
    return lines

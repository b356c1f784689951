"""The `parity` command: run, compare, merge, lens, generate, diff, attribute, backends, export, check-backend,
selftest, verify-ts, serve.

Exit codes: 0 everything agrees, 1 a numerical disagreement, 2 bad input, usage or environment.
User errors are one line on stderr, never a traceback. The exit code is decided here, never by an
exception: every ParityError is 2 (a plugin's subclass cannot choose 0), a genuine Ctrl-C is 130,
and anything unexpected is one line and 2 (PARITY_DEBUG=1 shows the traceback instead).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

from parity_harness._backends.base import Precision
from parity_harness._backends.guard import describe_exception, hard_stop_hook, one_line, sigint_handler
from parity_harness._backends.registry import backend_entry_points, load_backend
from parity_harness._cli.exit_codes import AGREE, BAD_INPUT, DISAGREE, INTERRUPTED, for_verdict
from parity_harness._cli.progress import ProgressLine
from parity_harness._core.errors import BackendMisbehaved, ParityError, is_own_error
from parity_harness._core.resources import stress_fixture_dir
from parity_harness._core.sanitize import safe_streams, safe_text
from parity_harness._core.status import Verdict
from parity_harness._fixture.fixture import default_fixture_dir, load_fixture
from parity_harness._run.request import RunPlan, fixture_from, parse_names, precisions_from, select_backends

if TYPE_CHECKING:
    from parity_harness._authoring.presets import CommittedPreset
    from parity_harness._compare.report import Report
    from parity_harness._fixture.fixture import Fixture


def _jobs(text: str) -> int:
    """argparse type of `run --jobs`: a whole number from 1 to 64, else its one-line error (exit 2)."""
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 64):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of backends from 1 to 64")
    return int(text)


def cmd_run(args: argparse.Namespace) -> int:
    _check_report_paths(args, input_dirs={args.fixture: "the fixture directory"}, dump_dir=args.save_outputs)
    with _unusable_json_on_error(args, "run"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Parsing, one API call (every rule is below it: parity_harness/_run/request.py) and rendering."""
    from parity_harness import api
    from parity_harness._views.console import print_report, write_json

    plans: list[RunPlan] = []

    def on_plan(plan: RunPlan) -> None:
        plans.append(plan)
        _print_plan(plan)

    progress = None if args.quiet else ProgressLine(sys.stderr)
    try:
        report = api.run(parse_names(args.backends), args.fixture, args.precision, no_skip=args.no_skip,
                         allow_loose_tolerances=args.allow_loose_tolerances, save_outputs=args.save_outputs,
                         progress=progress, on_plan=on_plan,
                         budget=args.budget or args.json is not None, keep_on_crash=True, jobs=args.jobs,
                         grad=args.grad, onnx=args.onnx, onnx_map=args.onnx_map)
    finally:
        if progress is not None:
            progress.close()
    print_report(report, sys.stdout, verbose=args.verbose, budget=args.budget)
    _write_extra_reports(args, report, plans[0].fixture)
    _refuse_nothing_compared(report)
    if args.json is not None:  # last: a run that fails before here (exit 2) leaves the unusable marker instead
        write_json(report, Path(args.json))  # a crash: the runs before it, "passed": false, exit_code 2
    if report.crash is not None:
        _print_error(report.crash, args.verbose > 0)
    for line in report.broken:  # a registered plugin that failed to load: the others ran, the verdict is exit 2
        print(f"parity: error: broken plugin, not run: {line}", file=sys.stderr)
    return for_verdict(report.verdict)


def _print_plan(plan: RunPlan) -> None:
    """The first lines of `parity run`: the fixture, the backends, what the default selection left out."""
    fixture = plan.fixture
    print(f"parity: fixture {_display(fixture.root)} ({len(fixture.cases)} cases, {len(fixture.tap_names)} taps); "
          f"backends: {', '.join(b.name for b in plan.backends) or 'none'}")
    if plan.named_only:
        print(f"parity: run only when named (--backends): {', '.join(plan.named_only)}")
    for line in plan.skipped:
        print(f"parity: skipped: {line}")


def _check_report_paths(args: argparse.Namespace, inputs: dict[str | Path, str] | None = None,
                        input_dirs: dict[str | Path, str] | None = None, dump_dir: str | None = None) -> None:
    """Every output path of run, compare and merge checked before any work (exit 2, one line): writable,
    not empty, not an input, not another output (parity_harness/_core/output_paths.py)."""
    from parity_harness._core.output_paths import check_output_paths

    check_output_paths({"--json": args.json, "--junit": args.junit, "--markdown": args.markdown,
                        "--plot": getattr(args, "plot", None)}, inputs, input_dirs, dump_dir)
    _check_plot(getattr(args, "plot", None))


def _check_plot(plot: str | None) -> None:
    """A picture type parity cannot draw, or no matplotlib: refused before any backend runs."""
    if plot is not None:
        from parity_harness._views.plots import check_plot_path, require_matplotlib

        check_plot_path(Path(plot))
        require_matplotlib()


@contextmanager
def _unusable_json_on_error(args: argparse.Namespace, command: str) -> Iterator[None]:
    """Once the report paths are checked: an error (exit 2) or a Ctrl-C (130) leaves --json marked unusable.

    The marker replaces whatever an earlier run left at that path, so `parity merge` cannot take a stale
    report for this run's (parity_harness/_views/console.py, docs/reports.md). A backend the deadline cannot
    stop in-process ends the process (`guard.hard_stop`), which marks it first.
    """

    def mark(line: str, code: int) -> None:
        if args.json is not None:
            from parity_harness._views.console import write_unusable_json

            write_unusable_json(Path(args.json), command, line, code, str(getattr(args, "fixture", "") or ""))

    try:
        with hard_stop_hook(mark):
            yield
    except BaseException as exc:
        if args.json is not None:
            from parity_harness._views.console import write_unusable_json

            interrupted = isinstance(exc, KeyboardInterrupt)
            error = ("interrupted" if interrupted else _message(exc) if isinstance(exc, ParityError)
                     else f"internal error: {describe_exception(exc)}")
            with contextlib.suppress(Exception):  # the error being raised is the one line to print
                write_unusable_json(Path(args.json), command, error, INTERRUPTED if interrupted else BAD_INPUT,
                                    str(getattr(args, "fixture", "") or ""))
        raise


def _refuse_nothing_compared(report: Report) -> None:
    """The verdict NOTHING_COMPARED (decided by the Report) printed as the one error line, exit 2."""
    if report.verdict == Verdict.NOTHING_COMPARED:
        raise ParityError(report.nothing_compared_reason())


def cmd_compare(args: argparse.Namespace) -> int:
    """Judge dumps (docs/dump-format.md) against the fixture's goldens, with `parity run`'s report and exit codes."""
    _check_report_paths(args, inputs={p: "a dump being compared" for p in args.dumps},
                        input_dirs={args.fixture: "the fixture directory"})
    with _unusable_json_on_error(args, "compare"):
        return _compare(args)


def _compare(args: argparse.Namespace) -> int:
    from parity_harness import api
    from parity_harness._views.console import print_report, write_json

    fixture = api.load(args.fixture)
    report = api.compare_dumps([Path(p) for p in args.dumps], fixture, budget=args.budget or args.json is not None)
    dumps = ", ".join(f"{run.backend} {run.precision}" for run in report.runs)
    print(f"parity: fixture {_display(fixture.root)} ({len(fixture.cases)} cases, {len(fixture.tap_names)} taps); "
          f"dumps: {dumps}")
    print_report(report, sys.stdout, verbose=args.verbose, budget=args.budget)
    _write_extra_reports(args, report, fixture)
    _refuse_nothing_compared(report)
    if args.json is not None:  # last, as for `parity run`
        write_json(report, Path(args.json))
    return for_verdict(report.verdict)


def cmd_merge(args: argparse.Namespace) -> int:
    """Merge the JSON reports of sharded runs into one report, verdict and exit code."""
    _check_report_paths(args, inputs={p: "a report being merged" for p in args.reports})
    with _unusable_json_on_error(args, "merge"):
        return _merge(args)


def _merge(args: argparse.Namespace) -> int:
    from parity_harness import api
    from parity_harness._views.console import print_report, write_json

    report = api.merge([Path(p) for p in args.reports])
    backends = ", ".join(dict.fromkeys(run.backend for run in report.runs))
    print(f"parity: merged {len(args.reports)} reports of fixture {report.fixture} ({report.fixture_id[:19]}...); "
          f"backends: {backends or 'none'}")
    for line in report.skipped:
        print(f"parity: skipped: {line}")
    print_report(report, sys.stdout, verbose=args.verbose, budget=args.budget)
    _write_extra_reports(args, report, None)  # no --plot: a picture needs the fixture (compare the dumps)
    _refuse_nothing_compared(report)
    if args.json is not None:  # last, as for `parity run`
        write_json(report, Path(args.json))
    return for_verdict(report.verdict)


def _write_extra_reports(args: argparse.Namespace, report: Report, fixture: Fixture | None) -> None:
    """--junit, --markdown (and $GITHUB_STEP_SUMMARY) and --plot, after the terminal report."""
    if args.junit is not None:
        from parity_harness._views.junit import write_junit

        write_junit(report, Path(args.junit))
    if args.markdown is not None:
        from parity_harness._views.markdown import write_markdown

        write_markdown(report, Path(args.markdown), args.step_summary)
    if fixture is not None and args.plot is not None:
        from parity_harness._views.plots import plot_error_ladder

        plot_error_ladder(report, fixture, Path(args.plot))


def cmd_lens(args: argparse.Namespace) -> int:
    from parity_harness._core.output_paths import check_output_paths
    from parity_harness._tools.lens import run_lens, select_lens_backends

    check_output_paths({"--plot": args.plot}, input_dirs={args.fixture: "the fixture directory"})
    _check_plot(args.plot)
    fixture = load_fixture(args.fixture)
    chosen = select_lens_backends(parse_names(args.backends), args.all_backends)  # every rule is below the CLI
    for line in chosen.skipped:
        print(f"parity: skipped: {line}", file=sys.stderr)
    return for_verdict(run_lens(fixture, args.case, chosen.backends,
                                Path(args.plot) if args.plot is not None else None,
                                default_selection=chosen.default, out=sys.stdout,
                                progress=None if args.quiet else _progress, precisions=chosen.precisions))


def cmd_attribute(args: argparse.Namespace) -> int:
    from parity_harness._tools.attribute import run_attribute

    fixture = load_fixture(args.fixture)
    backends, _, _ = select_backends(parse_names(args.backend, "--backend"))
    return for_verdict(run_attribute(fixture, backends[0], cast(Precision, args.precision), args.target, sys.stdout))


def cmd_diff(args: argparse.Namespace) -> int:
    """Parsing, one API call (`api.diff`: every rule is below it) and rendering; --json checked before any work."""
    from parity_harness import api
    from parity_harness._core.output_paths import check_output_paths
    from parity_harness._tools.diff import is_dump_argument, print_diff, write_diff_json

    dumps = {p: "a dump being compared" for p in (args.a, args.b) if is_dump_argument(p)}
    check_output_paths({"--json": args.json}, inputs=dumps, input_dirs={args.fixture: "the fixture directory"})
    with _unusable_json_on_error(args, "diff"):
        diff = api.diff(args.a, args.b, args.fixture, args.precision, progress=None if args.quiet else _progress)
        code = for_verdict(print_diff(diff, sys.stdout))
        if args.json is not None:
            write_diff_json(diff, code, Path(args.json))
        return code


def _display(path: Path) -> str:
    """A path relative to the working directory when it is inside it, else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_backends(args: argparse.Namespace) -> int:
    """The registered backends; a broken one is listed with its one-line error (a module of the previous layout
    names the new one), and makes the exit code 2 (docs/adding-a-backend.md)."""
    rows = []
    broken: list[str] = []
    for name in backend_entry_points():
        try:
            backend = load_backend(name)
            missing = backend.missing()
        except ParityError as exc:
            rows.append((name, "-", f"broken: {one_line(str(exc))}"))
            broken.append(name)
            continue
        status = "available" if not missing else f"missing {', '.join(missing)} ({backend.install_hint})"
        if not backend.by_default:
            status += ", runs only when named"
        rows.append((name, ",".join(backend.precisions), f"{status}  {backend.description}".rstrip()))
    width = max(len(r[0]) for r in rows) if rows else 10
    precisions_width = max(len(r[1]) for r in rows) if rows else 9
    for name, precisions, status in rows:
        print(f"{name:<{width}}  {precisions:<{precisions_width}}  {status}")
    if broken:
        raise ParityError(f"{len(broken)} registered backend(s) broken: {', '.join(broken)} (see above)")
    return AGREE


def cmd_export(args: argparse.Namespace) -> int:
    from parity_harness._authoring.export import check_fixture, export_fixture

    if args.decoding_only and (args.preset != "toy" or args.from_hf or args.check):
        other = "--check" if args.check else "--from-hf" if args.from_hf else f"--preset {args.preset}"
        raise ParityError(f"--decoding-only adds the decoding goldens to a toy fixture; it does not combine "
                          f"with {other}")
    if args.training_only:  # any fixture parity wrote, named by --fixture: no preset's path below applies
        return _add_training(args)
    if args.preset == "toy-stress":
        if args.from_hf:
            raise ParityError("give --preset or --from-hf, not both")
        from parity_harness._authoring.stress import check_stress_fixture, write_stress_fixture

        toy = Path(args.source) if args.source else default_fixture_dir()
        dest = Path(args.fixture) if args.fixture else toy.parent / "toy-stress"
        if args.check:
            return for_verdict(check_stress_fixture(dest, toy, progress=_progress))
        write_stress_fixture(dest, toy, progress=_progress)
        return AGREE
    committed = _committed_preset(args.preset)
    if committed is not None and not args.from_hf:  # another family's committed toy, written by its own code
        dest = Path(args.fixture) if args.fixture else default_fixture_dir().parent / committed.directory
        if args.check:
            return for_verdict(committed.check(dest, progress=_progress))
        committed.export(dest, seed=args.seed, progress=_progress)
        return AGREE
    if args.preset != "toy" or args.from_hf:
        return _export_scaled(args)
    fixture = Path(args.fixture) if args.fixture else default_fixture_dir()
    if args.check:
        if os.path.isfile(fixture / "manifest.json"):
            from parity_harness._authoring.stress import PRESET, is_stress

            if is_stress(load_fixture(fixture)):  # the toy's check is not the stress fixture's
                raise ParityError(f"{fixture} was made by `parity export --preset {PRESET}`: pass --preset {PRESET}")
        return for_verdict(check_fixture(fixture, progress=_progress, retrain=not args.no_retrain))
    if args.decoding_only:
        from parity_harness._authoring.decoding_writer import add_decoding
        from parity_harness._authoring.fixture_writer import fixture_kind

        kind = fixture_kind(load_fixture(fixture).manifest)
        if kind != "toy":
            raise ParityError(f"--decoding-only --fixture {fixture}: {f'a {kind} fixture' if kind else 'not a fixture'}"
                              f"{'' if kind else ' made by `parity export`'}; decoding goldens are added to toy "
                              "fixtures only (nothing was changed)")
        add_decoding(fixture, progress=lambda m: _progress(f"parity export: {m}"))
        _progress(f"parity export: added the decoding goldens and graph to {fixture}")
        return AGREE
    if args.steps < 1:
        raise ParityError(f"--steps must be a positive number of training steps, got {args.steps} "
                          "(0 or fewer would write an untrained fixture)")
    export_fixture(fixture, steps=args.steps, seed=args.seed, progress=_progress)
    return AGREE


def _export_scaled(args: argparse.Namespace) -> int:
    """`parity export --preset NAME` or `--from-hf DIR`: a new fixture in --fixture DIR (never the toy's)."""
    preset = args.preset if args.preset != "toy" else None
    what = f"--preset {preset}" if preset else "--from-hf"
    if preset and args.from_hf:
        raise ParityError("give --preset or --from-hf, not both")
    if args.check:
        raise ParityError(f"--check is for the committed toy fixture, not {what}")
    if args.fixture is None:
        raise ParityError(f"{what} needs --fixture DIR: where to write the fixture (hundreds of MB for gpt2-small)")
    target = Path(args.fixture)
    try:  # a name the system refuses (too long) is refused here, before the work
        busy = not os.path.isdir(target) or any(target.iterdir()) if os.lstat(target) else False
    except FileNotFoundError:
        busy = False
    except OSError as exc:
        raise ParityError(f"--fixture {target}: cannot read it ({exc.strerror or exc})") from None
    if busy:
        raise ParityError(f"--fixture {target}: exists and is not an empty directory; choose a new one")
    if preset:
        from parity_harness._authoring.presets import export_preset

        export_preset(target, preset, seed=args.seed, long=args.long, progress=_progress)
    else:
        from parity_harness._authoring.hf_import import export_from_hf

        export_from_hf(Path(args.from_hf), target, exact_gelu=args.exact_gelu, long=args.long, progress=_progress)
    print(f"parity export: wrote {target}; run it with `parity run --fixture {target}`")
    return AGREE


def _add_training(args: argparse.Namespace) -> int:
    """`parity export --training-only [--fixture DIR]`: the gradient goldens added to a fixture parity wrote; an option
    that would choose another fixture or another job is refused (usage, exit 2), not ignored."""
    from parity_harness._authoring.training_writer import add_training_to_fixture

    others = [flag for flag, given in (("--check", args.check), ("--from-hf", args.from_hf),
                                        ("--decoding-only", args.decoding_only),
                                        (f"--preset {args.preset}", args.preset != "toy")) if given]
    if others:
        raise ParityError(f"--training-only adds the gradient goldens to the fixture --fixture names; it does not "
                          f"combine with {others[0]}")
    fixture = Path(args.fixture) if args.fixture else default_fixture_dir()
    add_training_to_fixture(fixture, progress=lambda m: _progress(f"parity export: {m}"))
    _progress(f"parity export: added the gradient goldens to {fixture}")
    return AGREE


def _committed_preset(name: str) -> CommittedPreset | None:
    """The family's committed toy called `name` (`presets.committed_presets`), or None."""
    from parity_harness._authoring.presets import committed_presets

    return committed_presets().get(name)


def cmd_seal(args: argparse.Namespace) -> int:
    """Re-seal a fixture's manifest after a reviewed edit (parity_harness._authoring.fixture_writer.seal_manifest)."""
    from parity_harness._authoring.fixture_writer import seal_manifest

    seal = seal_manifest(Path(args.fixture), rehash_files=args.rehash_files,
                         allow_loose_tolerances=args.allow_loose_tolerances)
    print(f"parity seal: {_display(Path(args.fixture))}/manifest.json sealed, manifest_sha256 {seal}")
    return AGREE


def cmd_check_backend(args: argparse.Namespace) -> int:
    from parity_harness._tools.conformance import backend_to_check, check_backend

    fixture = load_fixture(args.fixture)
    results = check_backend(backend_to_check(args.name, args.onnx, args.onnx_map), fixture)
    for r in results:
        print(f"check-backend {args.name}: {'OK  ' if r.passed else 'FAIL'}  {r.name}"
              f"{'' if r.passed or not r.message else ': ' + r.message}")
    failed = sum(1 for r in results if not r.passed)
    print(f"{len(results) - failed} passed, {failed} failed")
    return for_verdict(Verdict.of(not failed))


def cmd_verify_ts(args: argparse.Namespace) -> int:
    """The Node-only check (ts_model/node/verify-forward.mts) run with the Node the typescript backend uses."""
    import subprocess

    from parity_harness._backends.node.runtime import find_node, timeout_seconds, ts_script

    node = find_node()
    script = ts_script("verify-forward.mts")
    if not script.is_file():
        raise ParityError(f"{script}: not found (set PARITY_TS_DIR to a directory holding node/verify-forward.mts)")
    # Every check `parity run` makes before a backend starts (the seal, strict JSON, the tolerances' ceilings,
    # every file's hash): the Node check reads the manifest's tolerances as they are, and `1e999` is Infinity.
    fixture_from(args.fixture)
    fixture = Path(args.fixture)
    try:
        proc = subprocess.run([node, str(script), str(fixture)], stdin=subprocess.DEVNULL, timeout=timeout_seconds(),
                              check=False, capture_output=True, text=True, errors="replace")
    except subprocess.TimeoutExpired:
        raise ParityError(f"verify-ts: {script.name} timed out") from None
    except OSError as exc:
        raise ParityError(f"verify-ts: cannot start {node}: {exc}") from None
    for line in proc.stdout.splitlines():  # line by line through the sanitizing streams: a name may hold escapes
        print(line)
    for line in proc.stderr.splitlines():
        print(line, file=sys.stderr)
    if proc.returncode in (AGREE, DISAGREE, BAD_INPUT):  # the child decides by the same table
        return proc.returncode
    raise ParityError(f"verify-ts: {script.name} ended with exit code {proc.returncode}")


def cmd_selftest(args: argparse.Namespace) -> int:
    """Run every mutant of _tools/mutants.py through the harness (see _tools/selftest.py)."""
    from parity_harness._core.output_paths import check_output_paths
    from parity_harness._tools.mutants import by_name
    from parity_harness._tools.selftest import print_selftest, run_selftest, write_json

    check_output_paths({"--json": args.json}, input_dirs={args.fixture: "the fixture directory",
                                                          args.stress_fixture: "the stress fixture directory"})
    fixture = load_fixture(args.fixture)
    mutants = by_name(parse_names(args.only, "--only", "mutant") if args.only is not None else None)
    # The stability mutants are caught on the stress fixture (and must pass on the toy).
    stress = load_fixture(args.stress_fixture) if any(m.caught_on == "stress" for m in mutants) else None
    result = run_selftest(fixture, mutants, progress=None if args.quiet else _progress, stress=stress)
    print_selftest(result)
    if args.json is not None:
        write_json(result, Path(args.json))
    return for_verdict(result.verdict)


def cmd_serve(args: argparse.Namespace) -> int:
    """The learners' page (ts_model/web/) and the fixture on 127.0.0.1 (see parity_harness/_tools/serve.py)."""
    from parity_harness._tools.serve import serve_forever

    serve_forever(Path(args.fixture), args.port)
    return AGREE  # stopped by Ctrl-C, its normal end


def cmd_generate(args: argparse.Namespace) -> int:
    """Greedy generation from one prompt on every backend that decodes, side by side (_tools/generate.py)."""
    from parity_harness._tools.generate import run_generate

    fixture = load_fixture(args.fixture)
    backends, skipped, _ = select_backends(parse_names(args.backends))
    for line in skipped:
        print(f"parity: skipped: {line}", file=sys.stderr)
    verdict = run_generate(fixture, args.prompt, args.steps, backends, precisions_from(args.precision), sys.stdout)
    return for_verdict(verdict)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as parity's one line on stderr (exit 2), naming the command and argument."""

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"parity: error: {self.prog}: {one_line(message)} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="parity",
        description="Prove, tap by tap, that several implementations of one transformer compute the same numbers.",
        epilog="Exit codes: 0 all agree, 1 a disagreement, 2 bad input, usage or environment.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fixture_help = "fixture directory (default: fixtures/toy)"

    run = sub.add_parser("run", help="run backends on a fixture and compare every tap")
    run.add_argument("--fixture", default=str(default_fixture_dir()), help=fixture_help)
    run.add_argument("--backends", help="comma-separated backend names (default: every available backend)")
    run.add_argument("--precision", default="all",
                     help="which computations to check: fp32, fp64, fp16, bf16, or weights stored as f16, q8_0, "
                          "q4_0, q4_k (judged against those weights' own goldens); comma-separated, or all "
                          "(fp32,fp64; the default)")
    run.add_argument("--no-skip", action="store_true",
                     help="exit 2 if any registered backend cannot run (default: skip it and say so)")
    run.add_argument("--onnx", metavar="FILE",
                     help="also (or, without --backends, only) run this ONNX graph of the fixture's model on "
                          "onnxruntime, with no plugin: its tensors are matched to the taps by value (docs/onnx.md)")
    run.add_argument("--onnx-map", metavar="MAP",
                     help="with --onnx: a JSON file {tap: tensor name} naming the graph's tensor for each tap, "
                          "instead of matching by value")
    run.add_argument("--grad", action="store_true",
                     help="also check the backward (every gradient of every training case, nearest the loss first) "
                          "and the training steps, on every backend with a backward (docs/gradients.md)")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    run.add_argument("--jobs", type=_jobs, default=None, metavar="N",
                     help="backends run at once: the main thread runs any, N-1 more threads those that declare "
                          "`concurrent`; the report is the same for any N. Default: 1, plus a side lane for the "
                          "out-of-process backends (typescript, the browser) on a fixture under 1 M parameters")
    _report_options(run)
    run.add_argument("--save-outputs", metavar="DIR",
                     help="write each backend x precision's taps to DIR/{backend}.{precision}.safetensors "
                          "(a dump: docs/dump-format.md)")
    run.add_argument("--allow-loose-tolerances", action="store_true",
                     help="run a fixture whose tolerances exceed the ceilings of docs/tolerances.md; "
                          "every report then says LOOSE TOLERANCES")
    run.set_defaults(func=cmd_run)

    compare = sub.add_parser("compare", help="judge dumps (saved outputs, from any language) against the goldens")
    compare.add_argument("dumps", nargs="+", metavar="DUMP", help="dump files (docs/dump-format.md)")
    compare.add_argument("--fixture", default=str(default_fixture_dir()), help=fixture_help)
    _report_options(compare)
    compare.set_defaults(func=cmd_compare)

    merge = sub.add_parser("merge", help="merge the JSON reports of sharded runs into one verdict")
    merge.add_argument("reports", nargs="+", metavar="REPORT", help="JSON reports (`parity run --json`)")
    _report_options(merge, plot=False)  # no --plot: a picture needs the fixture (compare the dumps)
    merge.set_defaults(func=cmd_merge)

    lens = sub.add_parser("lens", help="the logit lens of one case: each stream's top guess at each position")
    lens.add_argument("--case", required=True, help="case name (from the fixture's manifest)")
    lens.add_argument("--plot", metavar="PATH", help="draw the grid (PNG or SVG, by extension)")
    lens.add_argument("--fixture", default=str(default_fixture_dir()), help=fixture_help)
    lens.add_argument("--backends",
                      help="comma-separated backends to check against the golden, in every precision each computes "
                           "in (default: the reference backends, pytorch and numpy, in fp32 and fp64)")
    lens.add_argument("--all-backends", action="store_true",
                      help="check every available backend that produces logit_lens taps, in every precision")
    lens.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    lens.set_defaults(func=cmd_lens)

    generate = sub.add_parser("generate", help="greedy generation from a prompt on every backend that decodes, "
                                               "side by side (exit 1 when they differ)")
    generate.add_argument("--prompt", required=True, help='words of the vocabulary, e.g. "the cat" (the start '
                                                          'marker "." is put first when absent)')
    generate.add_argument("--steps", type=int, default=8, help="words to generate (default: 8)")
    generate.add_argument("--backends", help="comma-separated backend names (default: every available backend)")
    generate.add_argument("--precision", choices=["fp32", "fp64", "all"], default="all",
                          help="which computations to run (default: all)")
    generate.add_argument("--fixture", default=str(default_fixture_dir()), help=fixture_help)
    generate.set_defaults(func=cmd_generate)

    diff = sub.add_parser("diff", help="two runs, each a backend or a dump, compared tap by tap with each other and "
                                       "the float64 truth (exit 1 when a tap is flagged)")
    diff.add_argument("a", metavar="A", help="a backend name, or a dump (a path ending in .safetensors, or holding "
                                             "a '/': `parity run --save-outputs DIR` writes them)")
    diff.add_argument("b", metavar="B", help="another backend name or dump")
    diff.add_argument("--precision", choices=["fp32", "fp64", "fp16", "bf16"], default=None,
                      help="whose results to diff; every dump must hold it (default: the dumps' own, fp32 for two "
                           "backends)")
    diff.add_argument("--fixture", default=str(default_fixture_dir()), help=fixture_help)
    diff.add_argument("--json", metavar="PATH", help="write the report of both sides with the diff (the report "
                                                     "schema's `diff` object) as JSON")
    diff.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    diff.set_defaults(func=cmd_diff)

    attr = sub.add_parser("attribute", help="which layer loses fp16/bf16 precision, teacher-forced, and which to keep "
                                            "in fp32 (exit 1 when the free run's logits miss the target)")
    attr.add_argument("--backend", required=True, help="a backend that runs one layer (run_layer)")
    attr.add_argument("--precision", choices=["fp16", "bf16"], required=True)
    attr.add_argument("--fixture", default=str(default_fixture_dir()), help=fixture_help)
    attr.add_argument("--target", type=float, metavar="UNITS",
                      help="the logits error to meet, in eps units (default: the precision's c, the tolerance)")
    attr.set_defaults(func=cmd_attribute)

    backends = sub.add_parser("backends", help="list registered backends and whether they can run")
    backends.set_defaults(func=cmd_backends)

    export = sub.add_parser("export", help="retrain the toy and rewrite the fixture, or --check it")
    from parity_harness._authoring.presets import PRESETS, committed_presets

    committed, generated = committed_presets(), list(PRESETS)
    export.add_argument("--fixture", default=None,
                        help="fixture directory (default: fixtures/toy; with --preset toy-stress or a family's "
                             f"committed toy ({', '.join(committed)}), fixtures/NAME beside the toy; the other "
                             "presets and --from-hf need a new one)")
    export.add_argument("--preset", metavar="NAME", default="toy",
                        help="toy: train and write the toy (default); toy-stress: derive the stress fixture from the "
                             "toy's weights (_authoring/stress.py); "
                             + "".join(f"{name}: {c.what}; " for name, c in committed.items())
                             + f"{', '.join(generated)}: a fixture from seeded random weights "
                             "(parity_harness/_authoring/presets.py; gpt2-mini-gelu-new: GPT-2's tanh gelu_new)")
    export.add_argument("--from", dest="source", metavar="DIR",
                        help="with --preset toy-stress: the toy fixture to derive it from (default: fixtures/toy)")
    export.add_argument("--from-hf", metavar="CHECKPOINT_DIR",
                        help="write a fixture from a local Hugging Face checkpoint of a built-in family (GPT-2, or any "
                             "model_type a family's authoring module reads) "
                             "(config.json, model.safetensors); a GPT-2 one's gelu_new (tanh GELU) is kept as it is")
    export.add_argument("--exact-gelu", action="store_true",
                        help="with --from-hf: take a checkpoint made for a tanh GELU (gelu_new, gelu_fast, ...) "
                             "with the exact GELU instead: a different model, not the checkpoint's")
    export.add_argument("--long", action="store_true",
                        help="with --preset/--from-hf: add a case of the full context (1,024 tokens for gpt2-small)")
    export.add_argument("--check", action="store_true",
                        help="regenerate into a temporary directory and compare with the committed fixture")
    export.add_argument("--no-retrain", action="store_true",
                        help="with --check: check the golden files, manifest and ONNX graphs, but do not retrain")
    export.add_argument("--decoding-only", action="store_true",
                        help="add (or rewrite) only the decoding goldens and model.decode.onnx of an existing "
                             "fixture; no other file changes, nothing is retrained")
    export.add_argument("--training-only", action="store_true",
                        help="add (or rewrite) only the gradient goldens (the backward and the training step) of an "
                             "existing fixture parity wrote; no other file changes, nothing is retrained")
    export.add_argument("--steps", type=int, default=4000, help="training steps (default: 4000)")
    export.add_argument("--seed", type=_seed, default=0,
                        help="training seed, or the preset's weights seed (default: 0; 0 to 2**63 - 1)")
    export.set_defaults(func=cmd_export)

    seal = sub.add_parser("seal", help="re-seal a fixture's manifest after a reviewed edit (manifest_sha256)")
    seal.add_argument("--fixture", default=str(default_fixture_dir()), help=fixture_help)
    seal.add_argument("--rehash-files", action="store_true",
                      help="also rewrite the sha256 of every listed data file (after changing one on purpose)")
    seal.add_argument("--allow-loose-tolerances", action="store_true",
                      help="seal tolerances beyond the ceilings (runs then need --allow-loose-tolerances too)")
    seal.set_defaults(func=cmd_seal)

    check = sub.add_parser("check-backend", help="check a backend's contract (taps, shapes, dtypes, bad input)")
    check.add_argument("name", help="backend name")
    check.add_argument("--fixture", default=str(default_fixture_dir()), help=fixture_help)
    check.add_argument("--onnx", metavar="FILE", help="with onnx-file: the ONNX graph to check (docs/onnx.md)")
    check.add_argument("--onnx-map", metavar="MAP", help="with --onnx: a JSON file {tap: tensor name}")
    check.set_defaults(func=cmd_check_backend)

    verify_ts = sub.add_parser("verify-ts", help="the Node-only check of ts_model/ (verify-forward.mts), run with "
                                                 "the Node the typescript backend uses (pip's Node 24)")
    verify_ts.add_argument("--fixture", default=str(default_fixture_dir()), help=fixture_help)
    verify_ts.set_defaults(func=cmd_verify_ts)

    selftest = sub.add_parser("selftest", help="run the catalog of porting bugs (mutants) through the harness")
    selftest.add_argument("--fixture", default=str(default_fixture_dir()), help=fixture_help)
    selftest.add_argument("--stress-fixture", default=str(stress_fixture_dir()), metavar="DIR",
                          help="where the stability mutants must be caught (default: fixtures/toy-stress)")
    selftest.add_argument("--only", metavar="NAME,...", help="comma-separated mutant names (default: all)")
    selftest.add_argument("--json", metavar="PATH", help="write the per-mutant outcomes as JSON")
    selftest.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    selftest.set_defaults(func=cmd_selftest)

    serve = sub.add_parser("serve", help="serve the learners' page: model.ts checked in your browser")
    serve.add_argument("--fixture", default=str(default_fixture_dir()), help=fixture_help)
    serve.add_argument("--port", type=_port, default=8000, help="port on 127.0.0.1 (default: 8000; 0: any free port)")
    serve.set_defaults(func=cmd_serve)
    return parser


def _int_in(text: str, lo: int, hi: int, what: str) -> int:
    """An argparse type: an integer lo..hi; a one-line usage error (exit 2) naming the range otherwise."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{what} must be {lo} to {hi}, got {value}")
    return value


def _seed(text: str) -> int:
    return _int_in(text, 0, 2**63 - 1, "a seed")


def _port(text: str) -> int:
    return _int_in(text, 0, 65535, "a port")


def _report_options(parser: argparse.ArgumentParser, plot: bool = True) -> None:
    """The report options `parity run`, `parity compare` and `parity merge` share."""
    parser.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="the per-tap table (one line per backend x tier x tap); -vv adds one line per case")
    parser.add_argument("--budget", action="store_true",
                        help="add the error budget: every result against the float64 truth, in float32 epsilons")
    parser.add_argument("--junit", metavar="PATH", help="write JUnit XML: one testcase per backend x tier x tap")
    parser.add_argument("--markdown", metavar="PATH",
                        help="write a Markdown summary (appended to $GITHUB_STEP_SUMMARY too when it is set)")
    if plot:
        parser.add_argument("--plot", metavar="PATH", help="draw the error ladder (PNG or SVG, by extension)")


# The options that name a file or directory parity writes to, on any command.
OUTPUT_OPTIONS = ("json", "junit", "markdown", "plot", "save_outputs")


def _pin_output_paths(args: argparse.Namespace) -> None:
    """Every output path made absolute once, before any command starts, and $GITHUB_STEP_SUMMARY read once: a
    backend that changes the working directory (or the environment) cannot redirect a report onto a user's file."""
    for option in OUTPUT_OPTIONS:
        value = getattr(args, option, None)
        if isinstance(value, str) and value:
            setattr(args, option, os.path.abspath(value))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    args.step_summary = os.path.abspath(summary) if summary else None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _pin_output_paths(args)
    with sigint_handler(), safe_streams():  # everything printed goes through parity_harness/_core/sanitize.py
        try:
            code = args.func(args)
            return code if code in (AGREE, DISAGREE) else BAD_INPUT
        except ParityError as exc:  # parity's own classes and a plugin's subclass alike: always 2
            _print_error(exc, _verbose(args))
            return BAD_INPUT
        except KeyboardInterrupt:  # a genuine Ctrl-C (a backend's own KeyboardInterrupt is caught earlier)
            print("parity: interrupted", file=sys.stderr)
            return INTERRUPTED
        except BrokenPipeError:
            return BAD_INPUT
        except BaseException as exc:  # a bug in parity, or plugin code outside a backend call (a SystemExit(0)
            # from a metaclass property, a key's __eq__): one line and exit 2, never 0 and never 1
            if os.environ.get("PARITY_DEBUG") == "1":
                traceback.print_exc(file=sys.stderr)  # sanitized like every line (safe_streams)
            if isinstance(exc, OSError) and exc.filename is not None:  # the system refused a path given (too long)
                print(f"parity: error: {one_line(str(exc.filename))}: {exc.strerror or type(exc).__name__}",
                      file=sys.stderr)
                return BAD_INPUT
            print(f"parity: error: internal error: {describe_exception(exc)} "
                  "(PARITY_DEBUG=1 shows the traceback)", file=sys.stderr)
            return BAD_INPUT


def entry() -> NoReturn:
    """The `parity` command and `python -m parity_harness`: `main`, then an exit that skips the collector's
    passes over every object the imports made. Python's shutdown runs full collections while it clears the
    modules; with torch and transformers loaded they took 1.0-1.7 s of a run's wall time on a 2-core machine,
    to free memory the OS takes back at exit anyway. Here the garbage is collected once (its finalizers run)
    and what survives is frozen; atexit handlers and the streams' flushes still run. Only at this entry point:
    `main` is also called in-process (tests, a caller's script), where freezing would keep their garbage.

    The process ends with its verdict whatever threads a backend left running: Python's shutdown would wait
    for every non-daemon thread first (a CI job hung after PASS). With such a thread alive, the streams are
    flushed, the atexit handlers run (the browser and Node sessions close), a note names the threads on
    stderr, and `os._exit(code)` ends the process without waiting for them."""
    code = main()
    gc.collect()
    gc.freeze()
    stray = [t for t in threading.enumerate()
             if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not stray:
        sys.exit(code)
    import atexit

    names = ", ".join(one_line(t.name, 60) for t in stray[:3]) + (", ..." if len(stray) > 3 else "")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        print(f"parity: note: {len(stray)} thread(s) a backend left running ({names}) not waited for",
              file=sys.stderr, flush=True)
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _verbose(args: argparse.Namespace) -> bool:
    """-v given (a command without the option: False)."""
    level = getattr(args, "verbose", 0)
    return type(level) is int and level > 0


def _print_error(exc: ParityError, verbose: bool) -> None:
    """The one error line; for a backend crash (BackendMisbehaved.detail), its full traceback after it under -v
    (sanitized), else a hint that -v shows it. A plain user error never gets a traceback."""
    detail = getattr(exc, "detail", "") if isinstance(exc, BackendMisbehaved) else ""
    hint = " (-v shows its traceback)" if detail and not verbose else ""
    cause = exc.__cause__  # an unexpected error the API gate made one ParityError (api.py, `_gate`)
    if cause is not None and os.environ.get("PARITY_DEBUG") == "1" and _message(exc).startswith("internal error"):
        traceback.print_exception(cause, file=sys.stderr)  # sanitized like every line (safe_streams)
    print(f"parity: error: {_message(exc)}{hint}", file=sys.stderr)
    if detail and verbose:  # one print per line: the streams' backstop (SafeStream) makes a line feed in a print
        for line in safe_text(str(detail)).rstrip("\n").split("\n"):  # a space, which flattened the traceback
            print(line, file=sys.stderr)


OWN_MESSAGE_LIMIT = 4000  # characters of a message parity wrote itself (a long path must not cut off the hint)


def _message(exc: BaseException) -> str:
    """The error line: parity's own exception classes at up to OWN_MESSAGE_LIMIT characters (their text from
    outside was cut where it was put in), any other class (a plugin's ParityError subclass) at one_line's 400."""
    try:
        text = str(exc)
    except BaseException:
        return describe_exception(exc)
    if not isinstance(text, str):
        return describe_exception(exc)
    return one_line(text, OWN_MESSAGE_LIMIT) if is_own_error(exc) else one_line(text)


if __name__ == "__main__":
    sys.exit(main())

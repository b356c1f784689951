"""A run request, checked and carried out: the one place every rule that refuses a run or decides its verdict lives.

Every surface goes through here: `parity run` (the CLI parses its arguments and calls `api.run`), the Python
API and the pytest plugin (both `api.run`). A request the CLI refuses is refused by the API and the plugin with
the same one line, because there is no other path:

- the backends: registered names loaded, instances put behind the boundary, each given once, dependencies
  present when named; by default every registered backend with `by_default`, the unavailable ones skipped
  (an error under `no_skip`);
- the precisions: known names (the stored weight formats too), `all` meaning fp32 and fp64;
- a backend asked for by name that computes in none of the requested precisions: refused before any runs;
  one that ran and compared nothing (it declined the fixture, every tap 'not supported') makes the verdict
  NOTHING_COMPARED (`Report.named`, `Report.verdict`): never a pass, on any surface;
- the options' types: `jobs` a whole number 1..64 (not a bool), the flags bools, `progress` callable; what a
  `progress` callback raises (SystemExit included) is one ParityError, never an escape;
- `save_outputs`: the dumps' names and directory checked before any backend runs, written after a run that
  did not crash.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from parity_harness._backends.base import PRECISIONS, Backend, Precision
from parity_harness._backends.boundary import GuardedBackend, guarded
from parity_harness._backends.guard import describe_exception, one_line, reraise_if_interrupt
from parity_harness._core.errors import BackendUnavailable, ParityError
from parity_harness._core.precision import DEFAULT_PRECISIONS
from parity_harness._core.status import RunStatus
from parity_harness._fixture.fixture import Fixture, default_fixture_dir, load_fixture

if TYPE_CHECKING:
    from parity_harness._compare.report import Report

MAX_JOBS = 64


class Selection(NamedTuple):
    """The backends a command runs, and what the default selection left out (one line each)."""

    chosen: list[GuardedBackend]
    skipped: list[str]  # registered, dependencies missing (an error under no_skip)
    named_only: list[str]  # registered with `by_default = False`: run only when named


def parse_names(text: str | None, option: str = "--backends", what: str = "backend") -> list[str] | None:
    """A comma-separated list of names (None: not given); each name once, at least one."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ParityError(f"{option} needs at least one {what} name")
    _refuse_repeated(names, option, what)
    return names


def _refuse_repeated(names: list[str], option: str, what: str = "backend") -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ParityError(f"{option} names {', '.join(map(repr, repeated))} more than once "
                          f"(each {what} runs once; its checks would be counted twice)")


def select_backends(names: Sequence[str] | None, broken: list[str] | None = None) -> Selection:
    """Backends to run by name (None: every registered backend whose `by_default` is True, the reference first).

    Asked for by name, a backend with missing dependencies is an error (exit 2) with the install hint; by
    default it is skipped and reported. A registered plugin that cannot be loaded (its import, class or
    `__init__` fails, or its declarations do) refuses a run that named it. The default selection given a
    `broken` list runs the others and appends one line per such plugin to it ("NAME: its error"), which makes
    the run's verdict an error (exit 2: `Report.broken`), never a pass; without one, the first is the error.
    """
    from parity_harness._backends.registry import backend_entry_points, load_backend

    chosen: list[GuardedBackend] = []
    skipped: list[str] = []
    named_only: list[str] = []
    default = sorted(backend_entry_points(), key=lambda n: (n != "pytorch", n))
    for name in names if names is not None else default:
        try:
            backend = load_backend(name)
            by_default = backend.by_default
            why = backend.unavailable() if names is not None or by_default else None
        except ParityError as exc:
            if names is not None or broken is None:
                raise
            broken.append(f"{name}: {one_line(str(exc))}")
            continue
        if names is None and not by_default:
            named_only.append(name)
        elif why and names is not None:
            raise BackendUnavailable(why)
        elif why:
            skipped.append(why)
        else:
            chosen.append(backend)
    return Selection(chosen, skipped, named_only)


def backend_from(spec: object) -> GuardedBackend:
    """A backend behind the boundary: a registered name loaded, an instance wrapped; its dependencies present."""
    if isinstance(spec, str):
        return select_backends([spec]).chosen[0]
    if isinstance(spec, (Backend, GuardedBackend)):
        backend = guarded(spec)
    elif isinstance(spec, type) and issubclass(spec, Backend):
        raise ParityError(f"backend {spec.__name__}: pass an instance ({spec.__name__}()), not the class")
    else:
        kind = _type_name(spec).split(" ", 1)[1]
        raise ParityError(f"backend {kind}: expected a registered name or a Backend instance")
    why = backend.unavailable()
    if why:
        raise BackendUnavailable(why)
    return backend


def backends_from(specs: object) -> list[GuardedBackend]:
    """One backend or a sequence of them (names or instances), each once."""
    many = isinstance(specs, Sequence) and not isinstance(specs, str)
    items: list[object] = list(specs) if many else [specs]  # type: ignore[call-overload]
    if not items:
        raise ParityError("backends: give at least one backend (a registered name or a Backend instance)")
    chosen = [backend_from(s) for s in items]
    _refuse_repeated([b.name for b in chosen], "backends")
    return chosen


KNOWN = ", ".join(PRECISIONS)  # every precision and stored weight format, as the errors name them


def precisions_from(spec: object) -> list[Precision]:
    """"fp32", "fp64", "fp16", "bf16", a stored weight format ("f16", "q8_0", "q4_0", "q4_k"), "all" (fp32,
    fp64: the others only when named), a comma-separated string of them, or a sequence; each once, in order."""
    if isinstance(spec, str):
        asked: list[object] = [p.strip() for p in spec.split(",")]
    elif isinstance(spec, Sequence):
        asked = list(spec)
    else:
        raise ParityError(f"precisions {_type_name(spec)}: expected {KNOWN}, all or a list of them")
    if not asked:
        raise ParityError(f"precisions: give at least one of {KNOWN} or all")
    wanted: list[Precision] = []
    for p in asked:
        if p == "all":
            wanted += DEFAULT_PRECISIONS
        elif isinstance(p, str) and p in PRECISIONS:
            wanted.append(p)  # type: ignore[arg-type]
        else:
            raise ParityError(f"unknown precision {str(p)[:40]!r}: expected {KNOWN}, all (fp32, fp64) "
                              "or a comma-separated list (--precision)")
    return list(dict.fromkeys(wanted))


def check_flag(name: str, value: object) -> bool:
    """An option that is True or False: anything else ("no", 1, None) is refused, never read as truthy."""
    if type(value) is not bool:
        raise ParityError(f"{name}: expected True or False, got {_type_name(value)}")
    return value


def check_jobs(jobs: object) -> int | None:
    """`jobs`: None (the default lanes) or a whole number 1..MAX_JOBS; a bool or a float is refused."""
    if jobs is None:
        return None
    if type(jobs) is not int or not 1 <= jobs <= MAX_JOBS:
        got = repr(jobs)[:40] if type(jobs) in (int, float, bool) else _type_name(jobs)
        raise ParityError(f"jobs: expected a whole number of backends from 1 to {MAX_JOBS}, got {got}")
    return jobs


def _type_name(value: object) -> str:
    try:
        return f"a {type(value).__name__}"
    except BaseException:
        return "an object"


Progress = Callable[[str], None]


def guarded_callback(what: str, callback: object) -> Callable[[Any], None]:
    """A caller's callback, so that whatever it raises (SystemExit, an error of its own) is one ParityError
    naming it, never an escape through the run (a genuine Ctrl-C stays one)."""
    if not callable(callback):
        raise ParityError(f"{what}: expected a callable, got {_type_name(callback)}")

    def call(value: Any) -> None:
        try:
            callback(value)
        except ParityError:
            raise
        except BaseException as exc:
            reraise_if_interrupt(exc)
            raise ParityError(f"the {what} callback raised {describe_exception(exc)}") from None

    return call


def guarded_progress(progress: object) -> Progress | None:
    """The caller's progress callback (one line of text each call) behind `guarded_callback`; None stays None."""
    return None if progress is None else guarded_callback("progress", progress)


def fixture_from(spec: object, allow_loose_tolerances: bool = False) -> Fixture:
    """A loaded fixture (checked again: idempotent), a directory, or None (the toy parity ships); checked before
    any backend runs."""
    if isinstance(spec, Fixture):
        fixture = spec
    elif spec is None or isinstance(spec, (str, Path)) or hasattr(spec, "__fspath__"):
        fixture = load_fixture(Path(spec) if spec is not None else default_fixture_dir(),  # type: ignore[arg-type]
                               allow_loose_tolerances=allow_loose_tolerances)
    else:
        raise ParityError(f"fixture {_type_name(spec)}: expected a Fixture, a directory or None (the toy)")
    fixture.check_before_running()
    return fixture


@dataclass(frozen=True)
class RunPlan:
    """A run request after every check: what runs, on what, in which precisions; nothing has run yet."""

    fixture: Fixture
    backends: tuple[GuardedBackend, ...]
    precisions: tuple[Precision, ...]
    named: bool  # the backends were asked for by name (or as instances), not the default selection
    skipped: tuple[str, ...] = ()  # one line per registered backend skipped for missing dependencies
    named_only: tuple[str, ...] = ()  # registered backends that run only when named
    save_outputs: Path | None = None  # where the dumps go (`--save-outputs DIR`), checked already
    broken: tuple[str, ...] = ()  # registered plugins that failed to load, one line each ("NAME: error")


ONNX_FILE_BACKEND = "onnx-file"  # the registered backend `onnx` makes an instance of (`--onnx FILE`)
MAX_ONNX_MAP_BYTES = 1 << 20


def onnx_backend(onnx: object, onnx_map: object) -> GuardedBackend | None:
    """The backend for a user's ONNX graph (`parity run --onnx FILE [--onnx-map MAP]`), or None without one.

    `onnx`: a path to the .onnx file; `onnx_map`: None (match the tensors to the taps by value), a JSON file of
    {tap: tensor name}, or that mapping itself. One ParityError line for a missing file or a malformed map."""
    if onnx is None:
        if onnx_map is not None:
            raise ParityError("onnx_map: give it with onnx, the graph whose tensors it names (--onnx FILE)")
        return None
    if not isinstance(onnx, (str, os.PathLike)):
        raise ParityError(f"onnx: expected the path of an .onnx file, got {_type_name(onnx)}")
    path = Path(onnx)
    if not path.is_file():
        raise ParityError(f"{path}: no such ONNX file (--onnx)")
    name_map = _onnx_map(onnx_map)
    from parity_harness._backends.registry import backend_entry_points

    entry = backend_entry_points().get(ONNX_FILE_BACKEND)
    if entry is None:
        raise ParityError(f"--onnx needs the {ONNX_FILE_BACKEND!r} backend, which is not registered")
    return backend_from(entry.load()(path, name_map))


def _onnx_map(spec: object) -> dict[str, str] | None:
    """{tap: tensor} from a mapping or a JSON file; ParityError naming what is wrong."""
    if spec is None:
        return None
    if isinstance(spec, (str, os.PathLike)):
        from parity_harness._core.strict_json import load_json_object

        spec = load_json_object(Path(spec), "ONNX name map", MAX_ONNX_MAP_BYTES)
    if not isinstance(spec, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in spec.items()):
        raise ParityError("onnx_map: expected {tap: tensor name}, both strings (a dict or a JSON file of one)")
    if not spec:
        raise ParityError("onnx_map: it maps no tap (give at least one, or none to match by value)")
    return dict(spec)


def plan_run(backends: object, fixture: object = None, precisions: object = "all", *, no_skip: bool = False,
             allow_loose_tolerances: bool = False, save_outputs: object = None, onnx: object = None,
             onnx_map: object = None) -> RunPlan:
    """Check a run request and return its plan, or raise the one ParityError that refuses it.

    `backends`: None for the default selection (every registered backend with `by_default`; one whose
    dependencies are missing is skipped, or refused under `no_skip`), else a name, an instance or a sequence
    of them, each asked for by name. `onnx` (and `onnx_map`): a user's ONNX graph, run by the `onnx-file`
    backend (`onnx_backend`), alone when `backends` is None, else beside them.
    """
    check_flag("no_skip", no_skip)
    check_flag("allow_loose_tolerances", allow_loose_tolerances)
    wanted = precisions_from(precisions)
    fx = fixture_from(fixture, allow_loose_tolerances)
    graph = onnx_backend(onnx, onnx_map)
    if graph is not None:  # the graph is asked for by name: alone, or beside the backends named
        backends = [graph] if backends is None else [*backends_from(backends), graph]
    broken: list[str] = []
    if backends is None:
        chosen, skipped, named_only = select_backends(None, broken)
        if not chosen:
            first = broken[0] if broken else skipped[0] if skipped else "none is registered"
            raise BackendUnavailable(f"no backend can run: {first}")
        if skipped and no_skip:
            raise BackendUnavailable(f"{len(skipped)} backend(s) skipped and --no-skip was given: {skipped[0]}")
    else:
        chosen, skipped, named_only = backends_from(backends), [], []
    _refuse_nothing_to_compare(chosen, wanted, named=backends is not None)
    dumps = _check_dumps(save_outputs, chosen, wanted)
    return RunPlan(fx, tuple(chosen), tuple(wanted), backends is not None, tuple(skipped), tuple(named_only), dumps,
                   tuple(broken))


def _refuse_nothing_to_compare(backends: list[GuardedBackend], precisions: list[Precision], named: bool) -> None:
    """A backend asked for by name that computes in none of the requested precisions, or no backend that does:
    refused before anything runs (the verdict line would otherwise speak of a backend never compared)."""
    idle = [b for b in backends if not any(p in b.precisions for p in precisions)]
    if not idle or (not named and len(idle) < len(backends)):
        return
    detail = "; ".join(f"{b.name} computes in {', '.join(b.precisions)} only" for b in idle)
    asked = ", ".join(precisions)
    if len(idle) < len(backends):
        raise ParityError(f"nothing to compare for a backend asked for by name: {detail}, and precision {asked} "
                          "was asked (drop it, or ask for its precision)")
    raise ParityError(f"nothing to compare: {detail}, and --precision {asked} was asked")


def _check_dumps(directory: object, backends: list[GuardedBackend], precisions: list[Precision]) -> Path | None:
    """`save_outputs`: the dumps' directory, checked before any backend runs (two runs whose dumps would be one
    file, an unwritable directory)."""
    if directory is None:
        return None
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise ParityError("--save-outputs: give the directory to write the dumps to")
    from parity_harness._run.dump import check_dump_names, check_writable, dump_name

    runs: list[tuple[str, str]] = [(b.name, p) for b in backends for p in precisions if p in b.precisions]
    check_dump_names(runs)
    check_writable(Path(directory), [dump_name(b, p) for b, p in runs])
    return Path(directory)


def check_grad(fixture: Fixture) -> None:
    """The gradient check needs gradient goldens: ParityError (exit 2) naming the fixture when it has none."""
    if fixture.training() is None:
        raise ParityError(f"--grad: {fixture.manifest_path} has no gradient goldens (no 'training' section); add them "
                          f"with `parity export --training-only --fixture {fixture.root}`")


def execute(plan: RunPlan, *, progress: object = None, keep_outputs: bool = False, decoding: bool = True,
            budget: bool = False, keep_on_crash: bool = False, jobs: object = None, grad: bool = False) -> Report:
    """Run a plan and judge it: the Report, whose `verdict` the CLI maps to an exit code.

    A crash before any backend ran is raised (nothing to report); with `keep_on_crash` a later one is kept in
    the report (`report.crash`, verdict CRASHED). The dumps of `plan.save_outputs` are written after a run
    that did not crash. `grad`: also the backward and the training steps (refused, before any work, on a fixture
    without gradient goldens).
    """
    for name, value in (("keep_outputs", keep_outputs), ("decoding", decoding), ("budget", budget),
                        ("keep_on_crash", keep_on_crash), ("grad", grad)):
        check_flag(name, value)
    if grad:
        check_grad(plan.fixture)
    lanes = check_jobs(jobs)
    say = guarded_progress(progress)
    from parity_harness._run.runner import run_parity

    report = run_parity(plan.fixture, list(plan.backends), list(plan.precisions), progress=say,
                        keep_outputs=keep_outputs or plan.save_outputs is not None, decoding=decoding,
                        budget=budget, keep_on_crash=keep_on_crash, jobs=lanes, grad=grad)
    report.skipped = list(plan.skipped)
    report.broken = list(plan.broken)
    report.named = [b.name for b in plan.backends] if plan.named else []
    if report.crash is not None and not any(r.status == RunStatus.RAN for r in report.runs):
        raise report.crash  # no backend ran before it: the one line
    if plan.save_outputs is not None and report.crash is None:
        from parity_harness._run.dump import save_outputs

        save_outputs(report, plan.fixture, plan.save_outputs)
    return report


__all__ = ["MAX_JOBS", "RunPlan", "Selection", "backend_from", "backends_from", "check_flag", "check_jobs",
           "execute", "fixture_from", "guarded_callback", "guarded_progress", "parse_names", "plan_run",
           "precisions_from", "select_backends"]

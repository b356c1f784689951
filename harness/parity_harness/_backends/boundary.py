"""The one boundary between parity and backend code: `GuardedBackend`, a wrapper the harness owns.

No command calls a backend's methods itself. `parity_harness._backends.registry.load_backend` (and `GuardedBackend.wrap`
for the self-test's in-process backends) hands out a `GuardedBackend`, and every call into backend code,
`run`, `run_cases`, `decode`, `supports_decoding`, `run_layer`, `supports_layers`, `grad`, `train`,
`supports_grad`, `supports_training`, `supported_grads`,
`declines`, `supported_taps`, `missing_dependencies`,
goes through one of its methods. Every call:

- gets a private view of the fixture (`Fixture.for_backend()`: its own manifest, cases and tolerances,
  read-only arrays), made anew for that call: what the harness judges with (its own `Fixture`, read
  before the call) is never handed to backend code, so nothing a backend does can change it;
- runs under `parity_harness._backends.guard.call_backend`, with its deadline when PARITY_BACKEND_TIMEOUT
  is set (seconds per case: `run` gets one per case, each `run_cases` step one): anything it raises
  (every `BaseException`: `SystemExit`, a
  `KeyboardInterrupt` the user did not press, `GeneratorExit`, a custom class) becomes one line naming
  the backend and the call, exit 2;
- has its result validated and copied by the rules below, written once, here.

The rules of the contract (docs/adding-a-backend.md states them for authors):

- declarations: `name` is the name it is registered under; `precisions` a non-empty subset of
  fp32/fp64/fp16/bf16 without repeats; `requires` module names; `description` and `install_hint` strings;
  `runs_graph`, `by_default` and `concurrent` bools. They are
  read once, when the wrapper is made, and the wrapper keeps its own copy.
- `missing_dependencies()` returns a list of strings; `declines(fixture)` a reason (str) or None;
  `supported_taps(fixture)` a non-empty list of the fixture's taps without repeats;
  `supports_decoding(fixture)` a bool.
- the forward pass: which method runs is `forward_entry`: the most derived definition of `run` or
  `run_cases` in the backend's class, so a subclass that overrides `run` is judged by its `run`, even when
  its parent streams. Its output is a dict with exactly the fixture's cases (or, from `run_cases`, one
  `(case name, taps)` pair per case, in the fixture's order), each a dict of declared taps only, each a
  `numpy.ndarray` (not a subclass). A declared tap that is missing, or an array of the wrong shape, dtype
  or with NaN, is left to the comparison: a failed check (exit 1) at that tap. An fp16 or bf16 result is a
  float32 array (the precision's container, `DTYPES`) holding values exactly representable in that
  precision (`unrepresentable`): a float32 value that is not is a broken contract (exit 2, one line),
  since what was judged would not be what the precision computes.
- one layer (`parity attribute`): `supports_layers(fixture)` a bool; `run_layer` returns a dict of exactly
  that layer's taps (`fixture.model.layer_taps`), each a `numpy.ndarray` of the manifest's shape for the input's length
  and the precision's container dtype, its values of the precision: anything else is a broken contract
  (exit 2, one line), since the attribution has no comparison to leave a wrong tap to.
- decoding: `decode` returns a dict with exactly the requests' names, each a dict of `"step{k}/{tap}"`
  keys of the request's steps and the decoding taps only, each a `numpy.ndarray`. A missing key is left to
  the comparison, as for the forward pass.

- the backward (`parity run --grad`): `supports_grad`/`supports_training` bools; `supported_grads` the fixture's
  gradient names without repeats; `grad` a dict with exactly the training cases, each a dict of "loss" and
  declared gradients; `train` a dict of "step{s}/{name}" keys; every value a `numpy.ndarray`. A missing key is
  left to the comparison.

Arrays are copied as they cross the boundary, so a backend can neither change what is compared after
it returned nor see it change. What this cannot stop (code in parity's process can call `os._exit(0)`)
is in docs/security.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

import numpy as np

from parity_harness._backends.base import PRECISIONS, Backend, BackendOutput, Precision, layer_names
from parity_harness._backends.guard import call_backend, one_line
from parity_harness._core.errors import BackendMisbehaved
from parity_harness._core.precision import unrepresentable

if TYPE_CHECKING:
    from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest
    from parity_harness._fixture.fixture import Case, Fixture

T = TypeVar("T")
ForwardEntry = Literal["run", "run_cases"]
_END = object()


def forward_entry(cls: type[Backend]) -> ForwardEntry:
    """The method that computes the forward pass: the most derived definition of `run` or `run_cases`.

    Walking the class's MRO, the first class that defines either decides: `run_cases` if it defines only
    that, `run` if it defines only that; a class that defines both streams when it sets `streams = True`.
    So a subclass of a streaming backend that overrides `run` is judged by its `run`, and one that
    overrides `run_cases` by its `run_cases`.
    """
    for klass in cls.__mro__:
        own = vars(klass)
        if "run" in own and "run_cases" in own:
            return "run_cases" if own.get("streams", getattr(klass, "streams", False)) is True else "run"
        if "run_cases" in own:
            return "run_cases"
        if "run" in own:
            return "run"
    return "run"


class Declarations(NamedTuple):
    """What a backend declares, read once and checked: the wrapper keeps this copy."""

    name: str
    precisions: tuple[Precision, ...]
    requires: tuple[str, ...]
    description: str
    install_hint: str
    runs_graph: bool = False  # it computes from the fixture's ONNX graph, not weights.safetensors
    by_default: bool = True  # `parity run` without --backends runs it
    concurrent: bool = False  # it may run on a worker thread beside another backend (parity_harness/_run/lanes.py)
    out_of_process: bool = False  # its work is another process's: a side lane on a small fixture (lanes.py)
    families: tuple[str, ...] = ("gpt2",)  # the model families it implements; it declines any other's fixture


def read_declarations(backend: Backend, name: str) -> Declarations:
    """Name, precisions, requires, description and install_hint, each read once; BackendFailed saying which is
    wrong. `name` is what the backend is registered as (its declared name must be the same)."""
    declared, precisions, requires = backend.name, backend.precisions, backend.requires
    description, install_hint = backend.description, backend.install_hint
    if not isinstance(declared, str) or declared != name:
        raise BackendMisbehaved(f"backend registered as {name!r} calls itself {one_line(repr(declared))}")
    if not declared or not declared.isprintable() or any(c in declared for c in ", \t"):
        raise BackendMisbehaved(f"backend {one_line(repr(declared))}: a name must be non-empty, printable, without "
                                "a comma or a space (--backends takes a comma-separated list)")
    if not isinstance(precisions, tuple | list) or not all(isinstance(p, str) for p in precisions):
        raise BackendMisbehaved(f"backend {name!r}: precisions must be a tuple of {'/'.join(PRECISIONS)}, "
                            f"got {one_line(repr(precisions))[:80]}")
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise BackendMisbehaved(f"backend {name!r} declares unknown precision {one_line(unknown[0])!r} "
                            f"(known: {', '.join(PRECISIONS)})")
    if not precisions or len(set(precisions)) != len(precisions):
        raise BackendMisbehaved(f"backend {name!r}: precisions must be a non-empty subset of {PRECISIONS} "
                            f"without repeats, got {tuple(precisions)}")
    if not isinstance(requires, tuple | list) or not all(isinstance(m, str) and m for m in requires):
        raise BackendMisbehaved(f"backend {name!r}: requires must be a tuple of module names, "
                            f"got {one_line(repr(requires))[:80]}")
    for attr, value in (("description", description), ("install_hint", install_hint)):
        if not isinstance(value, str):
            raise BackendMisbehaved(f"backend {name!r}: {attr} must be a string")
    runs_graph = getattr(backend, "runs_graph", False)
    if type(runs_graph) is not bool:
        raise BackendMisbehaved(f"backend {name!r}: runs_graph must be True or False, got "
                                f"{one_line(repr(runs_graph))[:80]}")
    by_default = getattr(backend, "by_default", True)
    if type(by_default) is not bool:
        raise BackendMisbehaved(f"backend {name!r}: by_default must be True or False, got "
                                f"{one_line(repr(by_default))[:80]}")
    # Not inherited: only the class itself can say it changes no process-wide state. A subclass of a concurrent
    # backend may patch a module while it runs (tests/compare/test_differential.py's float32-positions numpy does).
    concurrent = vars(type(backend)).get("concurrent", False)
    out_of_process = vars(type(backend)).get("out_of_process", False)
    for attr, flag in (("concurrent", concurrent), ("out_of_process", out_of_process)):
        if type(flag) is not bool:
            raise BackendMisbehaved(f"backend {name!r}: {attr} must be True or False, got {one_line(repr(flag))[:80]}")
    families = getattr(backend, "families", ("gpt2",))
    if not isinstance(families, tuple | list) or not families or not all(type(f) is str and f for f in families):
        raise BackendMisbehaved(f"backend {name!r}: families must be a non-empty tuple of model family names, "
                                f"got {one_line(repr(families))[:80]}")
    return Declarations(str(declared), tuple(precisions), tuple(str(m) for m in requires),  # type: ignore[arg-type]
                        str(description), str(install_hint), runs_graph, by_default, concurrent, out_of_process,
                        tuple(families))


def checked_case_taps(name: str, case: str, taps: object, declared: set[str]) -> dict[str, np.ndarray]:
    """One case's {tap: array} from backend `name`: a dict of declared taps, each a numpy.ndarray; copied."""
    if not isinstance(taps, dict):
        raise BackendMisbehaved(f"backend {name!r}, case {case!r}: expected a dict by tap")
    copied: dict[str, np.ndarray] = {}
    for tap, array in dict.items(taps):  # the dict's own items, whatever a subclass overrides
        if tap not in declared:
            raise BackendMisbehaved(f"backend {name!r}, case {case!r}: returned tap "
                                f"{one_line(repr(tap))[:80]}, which it does not declare in supported_taps")
        if type(array) is not np.ndarray:
            raise BackendMisbehaved(f"backend {name!r}, {case}/{tap}: returned {type(array).__name__}, "
                                "expected numpy.ndarray")
        copied[tap] = np.array(array, copy=True)
    return copied


def check_representable(name: str, precision: Precision, case: str, taps: dict[str, np.ndarray]) -> None:
    """A reduced-precision case's float32 arrays hold only values of that precision; BackendMisbehaved otherwise."""
    for tap, array in taps.items():
        index = unrepresentable(array, precision)
        if index is not None:
            value = float(array[index]) if array.ndim else float(array)
            raise BackendMisbehaved(f"backend {name!r} ({precision}), {case}/{tap}: {value!r} at {list(index)} is not "
                                    f"a {precision} value ({precision} results are float32 arrays holding "
                                    f"{precision} values: round each tap to {precision} before returning it)")


def checked_output(name: str, fixture: Fixture, output: object, supported: list[str]) -> BackendOutput:
    """A whole forward output {case: {tap: array}}: exactly the fixture's cases, each `checked_case_taps`."""
    if not isinstance(output, dict):
        raise BackendMisbehaved(f"backend {name!r} returned {type(output).__name__}, expected a dict by case")
    cases = dict(dict.items(output))
    known = {c.name for c in fixture.cases}
    unknown = [c for c in cases if c not in known]
    if unknown:
        raise BackendMisbehaved(f"backend {name!r} returned an unknown case {one_line(repr(unknown[0]))[:80]} "
                            f"(the fixture's cases: {len(known)})")
    missing = [c.name for c in fixture.cases if c.name not in cases]
    if missing:
        raise BackendMisbehaved(f"backend {name!r} returned no result for case {missing[0]!r}")
    declared = set(supported)
    return {case.name: checked_case_taps(name, case.name, cases[case.name], declared) for case in fixture.cases}


def checked_decode_output(name: str, precision: Precision, output: object, requests: list[DecodeRequest],
                          taps: list[str]) -> DecodeOutput:
    """A decoding output {request: {"step{k}/{tap}": array}}: exactly the requests, known keys, ndarrays; copied."""
    from parity_harness._fixture.decoding import step_key

    if not isinstance(output, dict):
        raise BackendMisbehaved(f"backend {name!r} ({precision}): decode returned {type(output).__name__}, "
                            "expected a dict by prompt")
    given = dict(dict.items(output))
    wanted = {r.name: r for r in requests}
    unknown = [p for p in given if p not in wanted]
    if unknown:
        raise BackendMisbehaved(f"backend {name!r} ({precision}): decode returned an unknown prompt "
                            f"{one_line(repr(unknown[0]))[:80]}")
    copied: DecodeOutput = {}
    for req in requests:
        steps = given.get(req.name)
        if not isinstance(steps, dict):
            raise BackendMisbehaved(f"backend {name!r} ({precision}): decode returned no result for prompt "
                                f"{req.name!r}")
        keys = {step_key(k, tap) for k in range(req.steps + 1) for tap in taps}
        copied[req.name] = {}
        for key, array in dict.items(steps):
            if key not in keys:
                raise BackendMisbehaved(f"backend {name!r} ({precision}), prompt {req.name!r}: decode returned "
                                    f"{one_line(repr(key))[:80]}, not a step{{k}}/{{tap}} of this request")
            if type(array) is not np.ndarray:
                raise BackendMisbehaved(f"backend {name!r} ({precision}), prompt {req.name!r}, {key}: "
                                    f"returned {type(array).__name__}, expected numpy.ndarray")
            copied[req.name][key] = np.array(array, copy=True)
    return copied


def checked_keyed_output(name: str, what: str, output: object, groups: list[str],
                         keys: set[str]) -> dict[str, dict[str, np.ndarray]]:
    """{group: {key: array}} with exactly `groups`, keys among `keys`, plain ndarrays; copied. A missing key is left
    to the comparison (a failed check), as a missing forward tap is."""
    if not isinstance(output, dict):
        raise BackendMisbehaved(f"backend {name!r}: {what} returned {type(output).__name__}, expected a dict")
    given = dict(dict.items(output))
    unknown = [g for g in given if g not in groups]
    if unknown:
        raise BackendMisbehaved(f"backend {name!r}: {what} returned an unknown case {one_line(repr(unknown[0]))[:80]}")
    copied: dict[str, dict[str, np.ndarray]] = {}
    for group in groups:
        entries = given.get(group)
        if not isinstance(entries, dict):
            raise BackendMisbehaved(f"backend {name!r}: {what} returned no result for {group!r}")
        copied[group] = {}
        for key, array in dict.items(entries):
            if key not in keys:
                raise BackendMisbehaved(f"backend {name!r}: {what}, {group}: returned {one_line(repr(key))[:80]}, "
                                        "not one of its declared names")
            if type(array) is not np.ndarray:
                raise BackendMisbehaved(f"backend {name!r}: {what}, {group}/{key}: returned {type(array).__name__}, "
                                        "expected numpy.ndarray")
            copied[group][key] = np.array(array, copy=True)
    return copied


def output_problems(fixture: Fixture, output: BackendOutput, taps: list[str], precision: Precision) -> dict[str, str]:
    """What `parity check-backend` demands beyond what the run checks (the run leaves these to the comparison,
    as failed checks): every declared tap returned, with the manifest's shape and the precision's dtype, no NaN.
    {"taps" | "shapes" | "nan": the first problem, or ""}."""
    from parity_harness._core.precision import DTYPES

    dtype = np.dtype(DTYPES[precision])
    problems = {"taps": "", "shapes": "", "nan": ""}
    for case in fixture.cases:
        got = output[case.name]
        missing = [t for t in taps if t not in got]
        if missing and not problems["taps"]:
            problems["taps"] = f"case {case.name!r}: missing {missing[:3]}"
        for tap, arr in got.items():
            want = fixture.model.tap_shape(tap, len(case.tokens))
            if (arr.shape != want or arr.dtype != dtype) and not problems["shapes"]:
                problems["shapes"] = f"{case.name}/{tap}: {arr.dtype}{list(arr.shape)}, expected {dtype}{list(want)}"
            if arr.dtype.kind == "f" and np.isnan(arr).any() and not problems["nan"]:
                problems["nan"] = f"{case.name}/{tap} holds NaN"
    return problems


def decode_output_problems(fixture: Fixture, output: DecodeOutput, requests: list[DecodeRequest],
                           precision: Precision) -> dict[str, str]:
    """The same for a decoding output: every step's cache and logits, shapes [H, T, d_head] and [V], dtype, no NaN."""
    from parity_harness._core.precision import DTYPES
    from parity_harness._fixture.decoding import step_key

    dtype = np.dtype(DTYPES[precision])
    problems = {"taps": "", "shapes": "", "nan": ""}
    for req in requests:
        for k in range(req.steps + 1):
            for tap in fixture.model.decode_tap_names():
                key = step_key(k, tap)
                arr = output[req.name].get(key)
                if arr is None:
                    problems["taps"] = problems["taps"] or f"prompt {req.name!r}: missing {key}"
                    continue
                want = fixture.model.decode_tap_shape(tap, len(req.prompt) + k)
                if (arr.shape != want or arr.dtype != dtype) and not problems["shapes"]:
                    problems["shapes"] = (f"{req.name}/{key}: {arr.dtype}{list(arr.shape)}, "
                                          f"expected {dtype}{list(want)}")
                if arr.dtype.kind == "f" and np.isnan(arr).any() and not problems["nan"]:
                    problems["nan"] = f"{req.name}/{key} holds NaN"
    return problems


def guarded(backend: AnyBackend) -> GuardedBackend:
    """`backend` behind the boundary: a GuardedBackend as it is, a bare Backend (an API user's) wrapped."""
    return backend if isinstance(backend, GuardedBackend) else GuardedBackend.wrap(backend)


class GuardedBackend:
    """A backend as the harness sees it: its declarations, copied, and guarded calls into its code.

    Make one with `GuardedBackend.wrap(instance)`; `parity_harness._backends.registry.load_backend` does it for every
    registered backend. Its methods are named apart from the contract's (`taps` for `supported_taps`,
    `declined`, `decodes`, `decoded`, `missing`, `forward` and `outputs` for `run`/`run_cases`), so a
    call of a contract method anywhere outside parity_harness/_backends/ is a call past the boundary, and
    tests/backends/plugins/test_boundary.py looks for one.
    """

    def __init__(self, backend: Backend, declared: Declarations) -> None:
        self._backend = backend
        self.name = declared.name
        self.precisions = declared.precisions
        self.requires = declared.requires
        self.description = declared.description
        self.install_hint = declared.install_hint
        self.runs_graph = declared.runs_graph
        self.by_default = declared.by_default
        self.concurrent = declared.concurrent
        self.out_of_process = declared.out_of_process
        self.families = declared.families
        self.entry: ForwardEntry = forward_entry(type(backend))

    @classmethod
    def wrap(cls, backend: Backend, name: str | None = None) -> GuardedBackend:
        """Check `backend`'s declarations (under the guard) and wrap it; `name`: what it is registered as
        (by default its class's own `name`, for in-process backends such as the self-test's)."""
        own = getattr(type(backend), "name", "")
        label = name if name is not None else (one_line(own) if isinstance(own, str) and own else "?")
        if not isinstance(backend, Backend):
            raise BackendMisbehaved(f"backend {label!r}: its class did not make a Backend instance")
        declared = call_backend(label, "its declarations", lambda: read_declarations(backend, label))
        return cls(backend, declared)

    def __repr__(self) -> str:
        return f"GuardedBackend({self.name!r})"

    def _call(self, what: str, fn: Callable[[], T], work: int = 1) -> T:
        return call_backend(self.name, what, fn, work)

    # -- declarations that need code ----------------------------------------------------------

    def missing(self) -> list[str]:
        """What is missing to run it (empty when it can run): a list of strings, or BackendFailed."""
        missing = self._call("missing_dependencies", self._backend.missing_dependencies)
        if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
            raise BackendMisbehaved(f"backend {self.name!r}: missing_dependencies returned "
                                f"{one_line(repr(missing))[:80]}, expected a list of strings")
        return [one_line(m) for m in missing]

    def preload(self) -> None:
        """Its imports (`import_requirements`), done before backends run side by side; BackendFailed if they fail."""
        self._call("import_requirements", self._backend.import_requirements)

    def unavailable(self) -> str | None:
        """Why it cannot run here (its missing dependencies and how to install them, one line), or None."""
        missing = self.missing()
        if not missing:
            return None
        hint = f"; install with: {self.install_hint}" if self.install_hint else ""
        return f"backend {self.name!r} needs {', '.join(missing)}, which is not available{hint}"

    def declined(self, fixture: Fixture) -> str | None:
        """Why it does not run on `fixture` at all (one line), or None. A fixture of a model family the backend
        does not implement (`families`) is declined here, before any of its code sees the fixture."""
        if fixture.family not in self.families:
            return f"does not implement the {fixture.family} family (implements: {', '.join(self.families)})"
        view = fixture.for_backend()
        reason = self._call("declines", lambda: self._backend.declines(view))
        if reason is not None and not isinstance(reason, str):
            raise BackendMisbehaved(f"backend {self.name!r}: declines() returned {type(reason).__name__}, "
                                "expected a reason (str) or None")
        return one_line(reason) if reason is not None else None

    def tap_sources(self, fixture: Fixture) -> dict[str, str] | None:
        """What stood for each tap (`Backend.tap_sources`): {every tap of the fixture: one sanitized line, "" for a
        tap it does not compute}, or None."""
        view = fixture.for_backend()
        sources = self._call("tap_sources", lambda: self._backend.tap_sources(view))
        if sources is None:
            return None
        if not isinstance(sources, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in sources.items()):
            raise BackendMisbehaved(f"backend {self.name!r}: tap_sources() returned {type(sources).__name__}, "
                                    "expected {tap: str} or None")
        return {tap: one_line(sources[tap]) if tap in sources else "" for tap in fixture.tap_names}

    def locate_op(self, fixture: Fixture, precision: Precision, case: str, tap: str) -> str | None:
        """Where inside `tap` its divergence starts (`Backend.locate_op`), one sanitized line, or None."""
        view = fixture.for_backend()
        where = self._call("locate_op", lambda: self._backend.locate_op(view, precision, case, tap))
        if where is not None and not isinstance(where, str):
            raise BackendMisbehaved(f"backend {self.name!r}: locate_op() returned {type(where).__name__}, "
                                    "expected a line (str) or None")
        return one_line(where) if where else None

    def build_info(self) -> str | None:
        """What it says it computed with (`Backend.build_info`), as one sanitized line, or None."""
        info = self._call("build_info", self._backend.build_info)
        if info is not None and not isinstance(info, str):
            raise BackendMisbehaved(f"backend {self.name!r}: build_info() returned {type(info).__name__}, "
                                    "expected a line (str) or None")
        return one_line(info) if info else None

    def taps(self, fixture: Fixture) -> list[str]:
        """The taps it produces for `fixture`: a non-empty list of the fixture's taps, no repeats."""
        view = fixture.for_backend()
        taps = self._call("supported_taps", lambda: self._backend.supported_taps(view))
        if type(taps) is not list or not all(type(t) is str for t in taps):
            raise BackendMisbehaved(f"backend {self.name!r}: supported_taps returned {one_line(repr(taps))[:80]}, "
                                "expected a list of tap names")
        unknown = [t for t in taps if t not in fixture.tap_names]
        if unknown:
            only = "only unknown taps" if len(unknown) == len(taps) else f"{len(unknown)} unknown tap(s)"
            raise BackendMisbehaved(f"backend {self.name!r}: supported_taps declares {only}, e.g. "
                                f"{one_line(unknown[0])!r} (not a tap of this fixture)")
        if not taps:
            raise BackendMisbehaved(f"backend {self.name!r}: supported_taps is empty (nothing to compare)")
        if len(set(taps)) != len(taps):
            raise BackendMisbehaved(f"backend {self.name!r}: supported_taps repeats a tap")
        if [t for t in fixture.tap_names if t in taps] != taps:
            raise BackendMisbehaved(f"backend {self.name!r}: supported_taps is not in dataflow order "
                                    "(the manifest's order)")
        return list(taps)

    def decodes(self, fixture: Fixture) -> bool:
        """True when it decodes `fixture` incrementally; anything but a bool is BackendFailed."""
        view = fixture.for_backend()
        answer = self._call("supports_decoding", lambda: self._backend.supports_decoding(view))
        if type(answer) is not bool:
            raise BackendMisbehaved(f"backend {self.name!r}: supports_decoding returned "
                                f"{one_line(repr(answer))[:80]}, expected True or False")
        return answer

    # -- the forward pass ---------------------------------------------------------------------

    def forward(self, fixture: Fixture, precision: Precision, supported: list[str],
                clock: list[float] | None = None) -> Iterator[tuple[Case, dict[str, np.ndarray]]]:
        """Its checked output one case at a time, in the fixture's order; `clock[0]` adds the time in its code.

        `forward_entry` says which method runs. From `run_cases` only one case of its output is alive at
        a time; from `run` the whole output is checked first, then handed out case by case.
        """
        self._check_precision(precision)
        clock = clock if clock is not None else [0.0]
        view = fixture.for_backend()
        what = f"{self.entry} ({precision})"
        if self.entry == "run":
            start = time.perf_counter()
            output = self._call(what, lambda: self._backend.run(view, precision), len(fixture.cases))
            clock[0] += time.perf_counter() - start
            checked = checked_output(self.name, fixture, output, supported)
            del output
            for case in fixture.cases:
                taps = checked.pop(case.name)
                check_representable(self.name, precision, case.name, taps)
                yield case, taps
            return
        declared = set(supported)
        start = time.perf_counter()
        cases = self._call(what, lambda: iter(self._backend.run_cases(view, precision)))
        clock[0] += time.perf_counter() - start
        for case in fixture.cases:
            start = time.perf_counter()
            item: Any = self._call(what, lambda: next(cases, _END))
            clock[0] += time.perf_counter() - start
            if item is _END:
                raise BackendMisbehaved(f"backend {self.name!r} returned no result for case {case.name!r}")
            if type(item) is not tuple or len(item) != 2 or item[0] != case.name:
                got = one_line(repr(item[0] if isinstance(item, tuple) and item else item))[:80]
                raise BackendMisbehaved(f"backend {self.name!r}: run_cases yielded {got} where case {case.name!r} "
                                    "was due (one (case name, taps) pair per case, in the fixture's order)")
            taps = checked_case_taps(self.name, case.name, item[1], declared)
            del item  # the backend's own arrays: only the checked copy stays alive while it is compared
            check_representable(self.name, precision, case.name, taps)
            yield case, taps
            del taps
        extra = self._call(what, lambda: next(cases, _END))
        if extra is not _END:
            raise BackendMisbehaved(f"backend {self.name!r}: run_cases yielded more cases than the fixture has")

    def outputs(self, fixture: Fixture, precision: Precision,
                supported: list[str] | None = None) -> tuple[list[str], BackendOutput]:
        """Its declared taps (`supported`, when the caller already has them from `taps`) and its whole checked
        output {case: {tap: array}} (for the lens, check-backend)."""
        supported = self.taps(fixture) if supported is None else supported
        return supported, {case.name: taps for case, taps in self.forward(fixture, precision, supported)}

    # -- decoding -----------------------------------------------------------------------------

    def decoded(self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest]) -> DecodeOutput:
        """Prefill and decode every request: {request: {"step{k}/{tap}": array}}, checked and copied."""

        self._check_precision(precision)
        view = fixture.for_backend()
        asked = list(requests)  # the harness's own list: the backend gets a copy
        output = self._call(f"decode ({precision})", lambda: self._backend.decode(view, precision, list(asked)),
                            sum(1 + r.steps for r in asked))
        return checked_decode_output(self.name, precision, output, asked, fixture.model.decode_tap_names())

    # -- the backward and the training step (parity run --grad) ---------------------------------

    def _bool(self, what: str, fn: Callable[[], object]) -> bool:
        answer = self._call(what, fn)
        if type(answer) is not bool:
            raise BackendMisbehaved(f"backend {self.name!r}: {what} returned {one_line(repr(answer))[:80]}, "
                                    "expected True or False")
        return answer

    def has_backward(self, fixture: Fixture) -> bool:
        """True when it computes the fixture's gradients (`supports_grad`); anything but a bool is BackendFailed."""
        view = fixture.for_backend()
        return self._bool("supports_grad", lambda: self._backend.supports_grad(view))

    def trains(self, fixture: Fixture) -> bool:
        """True when it runs the fixture's training steps (`supports_training`)."""
        view = fixture.for_backend()
        return self._bool("supports_training", lambda: self._backend.supports_training(view))

    def grad_names(self, fixture: Fixture) -> list[str]:
        """The gradients it declares (`supported_grads`): the fixture's, without repeats, in backward order."""
        view = fixture.for_backend()
        names = self._call("supported_grads", lambda: self._backend.supported_grads(view))
        every = fixture.grad_names()
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BackendMisbehaved(f"backend {self.name!r}: supported_grads returned {one_line(repr(names))[:80]}, "
                                    "expected a list of gradient names")
        unknown = [n for n in names if n not in every]
        if unknown:
            raise BackendMisbehaved(f"backend {self.name!r}: supported_grads declares {one_line(unknown[0])!r}, not a "
                                    "gradient of this fixture")
        if len(set(names)) != len(names):
            raise BackendMisbehaved(f"backend {self.name!r}: supported_grads repeats a name")
        return [n for n in every if n in names]

    def gradients(self, fixture: Fixture, precision: Precision, names: list[str]) -> dict[str, dict[str, np.ndarray]]:
        """Every training case's loss and declared gradients: {case: {"loss" | name: array}}, checked and copied."""
        self._check_precision(precision)
        spec = fixture.training()
        assert spec is not None
        view = fixture.for_backend()
        output = self._call(f"grad ({precision})", lambda: self._backend.grad(view, precision), len(spec.cases))
        return checked_keyed_output(self.name, f"grad ({precision})", output, list(spec.cases), {"loss", *names})

    def trained(self, fixture: Fixture, precision: Precision) -> dict[str, np.ndarray]:
        """The training steps {"step{s}/{name}": array}, checked and copied."""
        from parity_reference.training import train_names

        self._check_precision(precision)
        spec = fixture.training()
        assert spec is not None
        view = fixture.for_backend()
        output = self._call(f"train ({precision})", lambda: self._backend.train(view, precision), spec.steps)
        keys = set(train_names(spec, list(fixture.model.param_shapes())))
        return checked_keyed_output(self.name, f"train ({precision})", {"train": output}, ["train"], keys)["train"]

    # -- one layer (parity attribute) -----------------------------------------------------------

    def runs_layers(self, fixture: Fixture) -> bool:
        """True when it computes one layer from a given input (`run_layer`); anything but a bool is BackendFailed."""
        view = fixture.for_backend()
        answer = self._call("supports_layers", lambda: self._backend.supports_layers(view))
        if type(answer) is not bool:
            raise BackendMisbehaved(f"backend {self.name!r}: supports_layers returned "
                                    f"{one_line(repr(answer))[:80]}, expected True or False")
        return answer

    def layer(self, fixture: Fixture, precision: Precision, layer: str, stream: np.ndarray) -> dict[str, np.ndarray]:
        """`layer` (`layer_names`) computed from `stream` [T, d]: {tap: array}, exactly its taps, checked and copied."""
        from parity_harness._core.precision import DTYPES

        self._check_precision(precision)
        if layer not in layer_names(fixture.model.config.n_layer) or stream.ndim != 2:  # the harness's own mistake
            raise BackendMisbehaved(f"no layer {layer!r} with a stream of shape {list(stream.shape)} in this fixture")
        view = fixture.for_backend()
        given = np.array(stream, dtype=DTYPES[precision], copy=True)
        given.setflags(write=False)
        output = self._call(f"run_layer ({precision}, {layer})",
                            lambda: self._backend.run_layer(view, precision, layer, given))
        taps = fixture.model.layer_taps(layer)
        if not isinstance(output, dict):
            raise BackendMisbehaved(f"backend {self.name!r}: run_layer returned {type(output).__name__}, "
                                    "expected a dict by tap")
        got = dict(dict.items(output))
        wrong = [t for t in got if t not in taps] or [t for t in taps if t not in got]
        if wrong:
            raise BackendMisbehaved(f"backend {self.name!r}, run_layer {layer}: returned {sorted(got)[:2]}..., "
                                    f"expected exactly {taps[0]} .. {taps[-1]} ({one_line(repr(wrong[0]))[:80]})")
        dtype = np.dtype(DTYPES[precision])
        copied: dict[str, np.ndarray] = {}
        for tap in taps:
            array = got[tap]
            want = fixture.model.tap_shape(tap, stream.shape[0])
            if type(array) is not np.ndarray or array.shape != want or array.dtype != dtype:
                what = f"{array.dtype}{list(array.shape)}" if isinstance(array, np.ndarray) else type(array).__name__
                raise BackendMisbehaved(f"backend {self.name!r}, run_layer {layer}: {tap} is {what}, "
                                        f"expected {dtype}{list(want)}")
            copied[tap] = np.array(array, copy=True)
        check_representable(self.name, precision, layer, copied)
        return copied

    def _check_precision(self, precision: Precision) -> None:
        if precision not in self.precisions:  # the harness's own mistake, never the backend's
            raise BackendMisbehaved(f"backend {self.name!r} computes in {', '.join(self.precisions)} only, "
                                f"asked for {precision}")


AnyBackend = GuardedBackend | Backend  # what the commands accept: a bare Backend is wrapped (`guarded`)

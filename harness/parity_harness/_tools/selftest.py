"""`parity selftest`: does the harness catch real porting bugs? Run every mutant through it.

Each mutant of `parity_harness._tools.mutants.CATALOG` patches a temporary copy of an implementation and is run
through `run_parity` like any backend: typescript mutants by the typescript backend with
`PARITY_TS_DIR` pointing at the patched copy (float64), reference mutants as a module loaded from
the patched torch reference of the fixture's family (parity_reference/model.py, llama_model.py: its table's `torch`),
computed like the pytorch backend in float32 and float64, numpy mutants as a module loaded from the patched NumPy
reference (llama_numpy.py: the table's `numpy`), computed by the numpy backend's own code
(`NumpyBackend.model_module` returns the copy) in float32 and float64.

Per mutant: caught (any comparison failed, or the run stopped with an error), the tiers that
caught it, the first diverging tap reported (the earliest, in dataflow order, over the tiers that
caught it), whether it is the catalog's expected tap (for a decoding mutant: the first failing
decoding step and its first tap, the forward pass agreeing), and whether it was caught only by the fp64
tier (float64 vs the float64 golden fails, every fp32-tolerance comparison passes). Before the
mutants, a control run checks that the unpatched copies pass. Exit 0 only when the control passes,
every mutant is caught, at least 90% are localized at their expected tap and at least 3 are
fp64-only; 1 otherwise.

The stability mutants (`caught_on == "stress"`) run twice: on the toy fixture, where they must
be invisible (every comparison passes: they compute the toy's numbers to round-off), and on the
stress fixture (parity_harness/_authoring/stress.py), where they must be caught at their expected tap. The pair is
the reason the stress fixture exists (docs/selftest.md). Controls run on both fixtures.

The reduced-precision mutants (`caught_on == "probe"`) run on the probe fixture (`parity export
--preset fp16-probe`, made in the temporary directory unless one is given): in their precision (fp16),
where they must be caught at their expected tap, and in fp32 and fp64, where every comparison must pass
(their bug lives in a half fast path). The probe's control runs the unpatched reference in fp16, bf16,
fp32 and fp64: honest reduced precision must pass there. The mutants caught on the fp16-stress fixture
(`caught_on == "fp16-stress"`, `parity export --preset fp16-stress`, made the same way) run the same way there, with
their own control; they are counted apart (`SelftestResult.fp16_stress`).

The other families' mutants (`caught_on == "family"`, e.g. the Llama family's, which patch
parity_reference/llama_model.py, target "reference", or its NumPy twin llama_numpy.py, target "numpy") run on their
family's own toy fixture (`family_fixtures[family]`, default: the toy's sibling directory named by the family's
mutants module, `FIXTURE`: fixtures/toy-llama) in float32 and float64: each must be caught at its expected tap with a
likely cause (the family's diagnose patterns). A control runs each unpatched file there. Nothing here names a family:
the family tables (parity_reference/families/) and their mutants modules say which there are.

The backward mutants (`caught_on` "grad" or "grad-stress", parity_harness/_tools/grad_mutants.py) patch the
hand-written NumPy backward (parity_reference/numpy_backward.py), run by the numpy backend's own `grad` and `train`
(`NumpyBackend.backward_module` returns the copy) through `run_parity(..., grad=True)` in float32 and float64, on
the toy ("grad") or on the stress fixture ("grad-stress", and on the toy too, where it must be invisible). Each
must be caught by the gradient check at its gradient (the backward's first divergence) or at its training step,
with the likely cause its catalog entry names (parity_harness/_compare/grad_causes.py, from the numbers), while the
forward checks of the same run pass (the forward is unpatched). A control runs the unpatched copy on each fixture
used. They are reported apart (`SelftestResult.backward`, JSON "backward"): the totals line counts the forward
catalog only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import ClassVar, TextIO

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.boundary import GuardedBackend
from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._backends.registry import load_backend
from parity_harness._cli.exit_codes import for_verdict
from parity_harness._compare.judge import FirstDivergence
from parity_harness._compare.report import Report
from parity_harness._core.errors import ParityError
from parity_harness._core.sanitize import safe_line
from parity_harness._core.status import Verdict
from parity_harness._core.text import tier_key
from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest, reference_decode
from parity_harness._fixture.fixture import Fixture
from parity_harness._run.runner import run_parity
from parity_harness._tools.mutants import TARGET_DIRS, TOY_FAMILY, Mutant, MutantAnchorError, Target, family_mutants
from parity_reference.families import family_names, load_family
from parity_reference.run import reference_taps

MIN_LOCALIZED = 0.90  # share of mutants whose first diverging tap is the expected one
MIN_FP64_ONLY = 3  # mutants only the fp64 tier can see

# Tier labels: "computed precision / golden file".
TIER_FP32 = tier_key("fp32", "fp32")
TIER_FP64 = tier_key("fp64", "fp64")
TIER_FP64_VS_FP32 = tier_key("fp64", "fp32")


class ReferenceModuleBackend(Backend):
    """A (possibly patched) copy of the fixture's family's torch reference (parity_reference/model.py,
    llama_model.py), computed like the pytorch backend (forward and decoding)."""

    name: ClassVar[str] = "reference-mutant"
    description: ClassVar[str] = "a patched copy of parity_reference/model.py (parity selftest)"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64", "fp16", "bf16")
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    families: ClassVar[tuple[str, ...]] = tuple(family_names())  # each family's torch file (`run_target`)

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        config = fixture.model.config  # the family's config: the module is the family's (`module_file`)
        return reference_taps(fixture.weights(), config, fixture.cases, precision,  # type: ignore[arg-type]
                              self.module.run_with_taps)

    def supports_decoding(self, fixture: Fixture) -> bool:
        return True  # reference_decode runs the module's decode with the family's config

    def decode(
        self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None
    ) -> DecodeOutput:
        return reference_decode(fixture, precision, requests, self.module.decode)


class NumpyModuleBackend(NumpyBackend):
    """A (possibly patched) copy of the fixture's family's NumPy reference (numpy_model.py, llama_numpy.py), computed
    by the numpy backend's own code: only the module it calls (`model_module`) is the copy's."""

    name: ClassVar[str] = "numpy-mutant"
    description: ClassVar[str] = "a patched copy of a family's NumPy model (parity selftest)"
    families: ClassVar[tuple[str, ...]] = tuple(family_names())  # each family's NumPy file (`run_target`)

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def model_module(self, fixture: Fixture) -> ModuleType:
        return self.module


class NumpyBackwardModuleBackend(NumpyBackend):
    """The numpy backend with a (possibly patched) copy of parity_reference/numpy_backward.py as its backward: its
    own `grad` and `train` call the copy's `backward` and `train` (`backward_module`); the forward is the numpy
    backend's, unpatched."""

    name: ClassVar[str] = "numpy-backward-mutant"
    description: ClassVar[str] = "the numpy backend with a patched copy of numpy_backward.py (parity selftest)"

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def backward_module(self, fixture: Fixture) -> ModuleType:
        return self.module


BACKWARD_FILE = "numpy_backward.py"  # what the backward mutants patch, in a copy of parity_reference/


def run_backward(fixture: Fixture, mutant: Mutant | None, workdir: Path, tag: str = "") -> Report:
    """One run of the forward and the gradient check (no decoding) on a copy of parity_reference/ whose
    numpy_backward.py is patched by `mutant` (unpatched if None), in float32 and float64."""
    label = (mutant.name if mutant is not None else "control-backward") + tag
    root = copy_target("numpy", workdir / label, mutant)
    module = load_module(root / BACKWARD_FILE, f"_parity_selftest_{label.replace('-', '_')}")
    backend = GuardedBackend.wrap(NumpyBackwardModuleBackend(module))
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # a mutant's inf and NaN are judged, not printed
        warnings.simplefilter("ignore", RuntimeWarning)
        return run_parity(fixture, [backend], ["fp32", "fp64"], progress=None, decoding=False, grad=True)


def module_file(family: str, target: str) -> str:
    """The file a family computes with for a target, from its table's code (parity_reference/families/): the torch
    reference (model.py, llama_model.py) for "reference", the NumPy one (numpy_model.py, llama_numpy.py) for
    "numpy"."""
    return load_family(family).code["numpy" if target == "numpy" else "torch"].rpartition(".")[2] + ".py"


def copy_target(target: Target, dest: Path, mutant: Mutant | None) -> Path:
    """Copy the target's directory to `dest` and apply the mutant's patches (none for the control)."""
    shutil.copytree(TARGET_DIRS[target], dest, ignore=shutil.ignore_patterns("__pycache__", "tests"))
    if mutant is not None:
        mutant.patch_file(dest)
    return dest


def load_module(path: Path, name: str) -> ModuleType:
    """Import a Python file under a private module name (registered while it executes)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ParityError(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def run_target(fixture: Fixture, target: Target, mutant: Mutant | None, workdir: Path, tag: str = "",
               precisions: list[Precision] | None = None) -> Report:
    """One run of the harness on a copy of `target`, patched by `mutant` (unpatched if None).

    `tag` tells apart two runs of the same copy on different fixtures (its own directory each).
    `precisions`: what the reference copy computes in (default fp32 and fp64; typescript: fp64 always).
    """
    label = (mutant.name if mutant is not None else f"control-{target}") + tag
    root = copy_target(target, workdir / label, mutant)
    if target == "typescript":
        with _env("PARITY_TS_DIR", str(root)):
            return run_parity(fixture, [load_backend("typescript")], ["fp64"], progress=None)
    module = load_module(root / module_file(fixture.family, target), f"_parity_selftest_{label.replace('-', '_')}")
    backend = NumpyModuleBackend(module) if target == "numpy" else ReferenceModuleBackend(module)
    return run_parity(fixture, [GuardedBackend.wrap(backend)], precisions or ["fp32", "fp64"], progress=None)


@dataclass
class Outcome:
    """What the harness reported for one mutant (or control run)."""

    name: str
    target: str
    description: str
    expected_tap: str
    expected_fp64_only: bool
    caught: bool = False
    tiers: list[str] = field(default_factory=list)  # the comparisons that failed, e.g. ["fp64/fp64"]
    first_tap: str | None = None  # earliest first-diverging tap over the failing tiers
    first_tier: str | None = None  # the tier that reported it
    error: str = ""  # the run stopped with an error (counts as caught, never as localized)
    blind_cases: list[str] = field(default_factory=list)  # fixture cases where no comparison failed
    max_abs: dict[str, float] = field(default_factory=dict)  # tier -> worst finite error over every tap and case
    seconds: float = 0.0
    expected_step: int | None = None  # a decoding mutant: the decoding step where it must first show
    first_step: int | None = None  # the first failing decoding step, when the forward pass agreed
    caught_on: str = "toy"  # the fixture judged above: "toy", "stress" (stability), "probe", "family" (its own toy)
    toy_tiers: list[str] = field(default_factory=list)  # stability mutants: comparisons that failed on the toy
    toy_error: str = ""  # stability mutants: the toy run stopped with an error
    precision: str | None = None  # reduced-precision mutants: the precision they are caught in (fp16)
    fp32_tiers: list[str] = field(default_factory=list)  # reduced mutants: comparisons that failed in fp32/fp64
    fp32_error: str = ""  # reduced mutants: the fp32/fp64 run stopped with an error
    first_message: str = ""  # the first divergence's message ("overflow: ...", "precision: ...", "" for tolerance)
    likely_cause: str = ""  # the first divergence's `Likely cause:` (_compare/diagnose.py), "" when none was named
    file: str = ""  # the patched file, in its target's directory: "model/model.ts", "llama_numpy.py", ...
    family: str = TOY_FAMILY  # the family whose implementation the mutant patches

    @property
    def localized(self) -> bool:
        return self.first_tap == self.expected_tap and self.first_step == self.expected_step

    @property
    def invisible_on_toy(self) -> bool | None:
        """Stability mutants: every comparison passed on the toy (None for the toy's own mutants)."""
        return (not self.toy_tiers and not self.toy_error) if self.caught_on == "stress" else None

    @property
    def invisible_in_fp32(self) -> bool | None:
        """Reduced-precision mutants: every fp32 and fp64 comparison passed on the probe (None for the others)."""
        return (not self.fp32_tiers and not self.fp32_error) if self.caught_on in REDUCED_ON else None

    @property
    def cause(self) -> str:
        """What named the first divergence: "overflow", "precision" (a coarser grid), else "tolerance"."""
        head = self.first_message.split(":", 1)[0]
        return head if head in ("overflow", "precision") else "tolerance"

    @property
    def fp64_only(self) -> bool:
        """Caught by float64 vs the float64 golden only: every fp32-tolerance comparison passed."""
        return self.tiers == [TIER_FP64]


def classify(mutant: Mutant, report: Report, fixture: Fixture, seconds: float) -> Outcome:
    order = {t: i for i, t in enumerate(fixture.tap_names)}
    out = Outcome(mutant.name, mutant.target, mutant.description, mutant.expected_tap, mutant.fp64_only,
                  seconds=seconds, expected_step=mutant.expected_step, caught_on=mutant.caught_on,
                  precision=mutant.precision, file=mutant.file, family=mutant.family)
    failed = {tier_key(r.precision, r.golden) for r in report.results if r.passed is False}
    decoding = report.decoding
    if decoding is not None:  # the decoding check's failing tiers count as well
        failed |= {tier_key(c.precision, c.golden) for c in decoding.checks if not c.passed}
    known = (TIER_FP32, TIER_FP64, TIER_FP64_VS_FP32)
    out.tiers = [t for t in known if t in failed] + sorted(failed - set(known))  # then fp16/fp64, fp16/fp32, ...
    out.caught = report.verdict != Verdict.AGREE
    seen = {r.case for r in report.results if r.passed is False}
    for r in report.results:
        if r.max_abs is not None and math.isfinite(r.max_abs):
            tier = tier_key(r.precision, r.golden)
            out.max_abs[tier] = max(out.max_abs.get(tier, 0.0), r.max_abs)
    out.blind_cases = [c.name for c in fixture.cases if c.name not in seen]
    if report.divergences:
        first = min(report.divergences, key=lambda d: order[d.tap])
        out.first_tap, out.first_tier = first.tap, tier_key(first.precision, first.golden)
        out.first_message = first.message
        out.likely_cause = _likely_cause(report.divergences, first.tap, None)
    elif decoding is not None and decoding.divergences:  # the forward pass agrees: where decoding first breaks
        taps = {t: i for i, t in enumerate(decoding.taps)}
        dec = min(decoding.divergences, key=lambda d: (d.step, taps[d.tap]))
        out.first_tap, out.first_step, out.first_tier = dec.tap, dec.step, tier_key(dec.precision, dec.golden)
        out.first_message = dec.message
        out.likely_cause = _likely_cause(decoding.divergences, dec.tap, dec.step)
    if mutant.expected_step is not None and decoding is not None:  # blind prompts, not blind cases
        hit = {c.case for c in decoding.checks if not c.passed}
        out.blind_cases = [p for p in decoding.prompts if p not in hit]
    return out


REDUCED_ON = ("probe", "fp16-stress")  # the reduced-precision mutants' `caught_on`: run in their precision there
BACKWARD_ON = ("grad", "grad-stress")  # the backward mutants' `caught_on`: the toy, the stress fixture


@dataclass
class BackwardOutcome:
    """What the gradient check reported for one backward mutant (and whether the forward checks alone saw it)."""

    name: str
    description: str
    fixture: str  # the fixture it is judged on ("toy", "toy-stress")
    expected_tap: str  # a gradient name (the backward's), or a training record at `expected_step`
    expected_step: int | None
    expected_cause: str  # what its likely cause must say (grad_mutants.CAUSE_CLASS)
    caught: bool = False  # a gradient or training comparison failed
    tiers: list[str] = field(default_factory=list)  # the gradient comparisons that failed
    first_tap: str | None = None  # the backward's first divergence (earliest over tiers), else the training's
    first_step: int | None = None  # the training step of `first_tap` (None: a gradient of the backward)
    likely_cause: str = ""  # the cause the gradient check named there (parity_harness/_compare/grad_causes.py)
    forward_caught: bool = False  # the forward checks of the same run failed (they must not: the forward is unpatched)
    error: str = ""  # the run stopped with an error
    toy_tiers: list[str] | None = None  # "grad-stress": gradient comparisons that failed on the toy (must be none)
    seconds: float = 0.0

    @property
    def localized(self) -> bool:
        return self.first_tap == self.expected_tap and self.first_step == self.expected_step

    @property
    def named(self) -> bool:
        """The likely cause says what the catalog expects (named from the numbers, not from the mutant)."""
        return bool(self.expected_cause) and self.expected_cause in self.likely_cause

    @property
    def ok(self) -> bool:
        return (self.caught and not self.error and self.localized and self.named and not self.forward_caught
                and not self.toy_tiers)


def classify_backward(mutant: Mutant, report: Report, fixture: str, expected_cause: str,
                      seconds: float) -> BackwardOutcome:
    """Where the gradient check caught a backward mutant (the backward first, then the training steps), and what."""
    out = BackwardOutcome(mutant.name, mutant.description, fixture, mutant.expected_tap, mutant.expected_step,
                          expected_cause, seconds=seconds)
    out.forward_caught = any(r.passed is False for r in report.results)
    grad = report.grad
    if grad is None:
        out.error = "the run has no gradient check"
        return out
    failed = {tier_key(r.precision, r.golden) for r in (*grad.checks, *grad.train_checks) if r.passed is False}
    known = (TIER_FP32, TIER_FP64, TIER_FP64_VS_FP32)
    out.tiers = [t for t in known if t in failed] + sorted(failed - set(known))
    out.caught = bool(failed)
    if grad.divergences:
        order = {n: i for i, n in enumerate(grad.names)}
        first = min(grad.divergences, key=lambda d: order[d.tap])
        out.first_tap, out.likely_cause = first.tap, _likely_cause(grad.divergences, first.tap, None)
    elif grad.train_divergences:
        place = {n: i for i, n in enumerate(grad.train_names)}
        first = min(grad.train_divergences, key=lambda d: (d.step or 0, place[d.tap]))
        out.first_tap, out.first_step = first.tap, first.step
        out.likely_cause = _likely_cause(grad.train_divergences, first.tap, first.step)
    return out


def _backward_control_message(report: Report) -> str:
    if report.verdict == Verdict.AGREE:
        return ""
    grad = report.grad
    for d in (*(grad.divergences if grad else []), *(grad.train_divergences if grad else [])):
        step = f"step {d.step}, " if d.step is not None else ""
        return f"{tier_key(d.precision, d.golden)} gradient check diverges at {step}{d.tap} (max_abs {d.max_abs:.3g})"
    return _control_message(report)


def _judge_backward(fixture: Fixture, mutant: Mutant, work: Path, tag: str, expected_cause: str) -> BackwardOutcome:
    start = time.perf_counter()
    try:
        report = run_backward(fixture, mutant, work, tag)
    except MutantAnchorError:
        raise
    except ParityError as exc:
        out = BackwardOutcome(mutant.name, mutant.description, fixture.root.name, mutant.expected_tap,
                              mutant.expected_step, expected_cause, caught=True, error=str(exc))
    else:
        out = classify_backward(mutant, report, fixture.root.name, expected_cause, 0.0)
    out.seconds = time.perf_counter() - start
    return out


def _run_backward_mutants(result: SelftestResult, toy: Fixture, stress: Fixture | None, mutants: list[Mutant],
                          work: Path, say: Callable[[str], None]) -> None:
    """The backward mutants' controls (the unpatched numpy_backward.py on each fixture used), then each mutant."""
    from parity_harness._tools.grad_mutants import CAUSE_CLASS

    on_stress = [m for m in mutants if m.caught_on == "grad-stress"]
    if on_stress and stress is None:
        from parity_harness._fixture.fixture import load_fixture

        root = toy.root.parent / "toy-stress"
        if not (root / "manifest.json").is_file():
            raise ParityError(f"the backward mutants {', '.join(m.name for m in on_stress)} need the stress fixture: "
                              "pass --stress-fixture DIR (made by `parity export --preset toy-stress`)")
        stress = load_fixture(root)
    used = [toy] if any(m.caught_on == "grad" for m in mutants) or on_stress else []
    used += [stress] if on_stress and stress is not None else []
    for fx in used:
        say(f"parity selftest: control run of the unpatched {BACKWARD_FILE} on {fx.root.name} (--grad)")
        try:
            result.backward_controls[fx.root.name] = _backward_control_message(
                run_backward(fx, None, work, f"-{fx.root.name}"))
        except ParityError as exc:
            result.backward_controls[fx.root.name] = str(exc)
    for mutant in mutants:
        say(f"parity selftest: {mutant.name} (--grad)")
        where = stress if mutant.caught_on == "grad-stress" and stress is not None else toy
        outcome = _judge_backward(where, mutant, work, f"-{where.root.name}", CAUSE_CLASS.get(mutant.name, ""))
        if where is not toy:  # the toy's spec does not decay: there the bug must be invisible
            on_toy = _judge_backward(toy, mutant, work, f"-{toy.root.name}", "")
            outcome.toy_tiers = on_toy.tiers + (["error"] if on_toy.error else [])
            outcome.seconds += on_toy.seconds
        result.backward.append(outcome)


def _family_ok(o: Outcome) -> bool:
    """Another family's mutant as it must be: caught at its expected tap, with a likely cause named."""
    return o.caught and o.localized and bool(o.likely_cause)


def _likely_cause(divergences: list[FirstDivergence], tap: str, step: int | None) -> str:
    """The cause named at the first diverging tap (and step), from the first tier that names one."""
    return next((d.cause for d in divergences if d.tap == tap and d.step == step and d.cause), "")


def cause_class(cause: str) -> str:
    """A likely cause's class: its text up to the first colon ("tanh GELU (GPT-2's gelu_new) ...: ..." -> the head)."""
    return cause.split(":", 1)[0] if cause else "-"


@dataclass
class FamilyRun:
    """Where another family's mutants ran: its own toy fixture and the controls of its unpatched files there."""

    title: str  # the family's display name, from its mutants module: "Llama"
    fixture: str
    controls: dict[str, str] = field(default_factory=dict)  # target -> "" if it passed on the family's fixture


@dataclass
class SelftestResult:
    fixture: str
    controls: dict[str, str] = field(default_factory=dict)  # target -> "" if it passed, else why not
    outcomes: list[Outcome] = field(default_factory=list)
    stress_fixture: str | None = None  # where the stability mutants are caught (None: none was run)
    stress_controls: dict[str, str] = field(default_factory=dict)  # target -> "" if it passed on the stress fixture
    probe_fixture: str | None = None  # where the reduced-precision mutants are caught (None: none was run)
    probe_controls: dict[str, str] = field(default_factory=dict)  # target -> "" if it passed on the probe
    fp16_stress_fixture: str | None = None  # where the fp16-stress mutants are caught (None: none was run)
    fp16_stress_controls: dict[str, str] = field(default_factory=dict)  # target -> "" if it passed on fp16-stress
    families: dict[str, FamilyRun] = field(default_factory=dict)  # family -> where its "family" mutants ran
    backward: list[BackwardOutcome] = field(default_factory=list)  # the backward mutants (gradient check)
    backward_controls: dict[str, str] = field(default_factory=dict)  # fixture -> "" if unpatched numpy_backward passed

    @property
    def stability(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.caught_on == "stress"]

    def family(self, name: str) -> list[Outcome]:
        """The family's own mutants (caught_on "family"), in catalog order."""
        return [o for o in self.outcomes if o.caught_on == "family" and o.family == name]

    def n_family_ok(self, name: str) -> int:
        """The family's mutants (of each of its files) caught at their tap with a likely cause."""
        return sum(map(_family_ok, self.family(name)))

    def _title(self, name: str) -> str:
        return self.families[name].title if name in self.families else name

    @property
    def reduced(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.caught_on == "probe"]

    @property
    def n_reduced_ok(self) -> int:
        """Reduced-precision mutants caught at their tap in their precision and invisible in fp32 and fp64."""
        return sum(bool(o.invisible_in_fp32) and o.caught and o.localized for o in self.reduced)

    @property
    def fp16_stress(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.caught_on == "fp16-stress"]

    @property
    def n_fp16_stress_ok(self) -> int:
        """fp16-stress mutants caught at their tap in their precision and invisible in fp32 and fp64."""
        return sum(bool(o.invisible_in_fp32) and o.caught and o.localized for o in self.fp16_stress)

    @property
    def n_pairs(self) -> int:
        """Stability mutants invisible on the toy and caught on the stress fixture."""
        return sum(bool(o.invisible_on_toy) and o.caught for o in self.stability)

    @property
    def n_caught(self) -> int:
        return sum(o.caught for o in self.outcomes)

    @property
    def n_localized(self) -> int:
        return sum(o.localized for o in self.outcomes)

    @property
    def n_fp64_only(self) -> int:
        return sum(o.fp64_only for o in self.outcomes)

    @property
    def control_passed(self) -> bool:
        return all(not why for why in (*self.controls.values(), *self.stress_controls.values(),
                                       *self.probe_controls.values(), *self.fp16_stress_controls.values(),
                                       *(why for run in self.families.values() for why in run.controls.values())))

    def failures(self) -> list[str]:
        """Why the selftest fails, one line each (empty when it passes)."""
        n = len(self.outcomes)
        why = [f"control run of the unpatched {t} failed: {m}" for t, m in self.controls.items() if m]
        why += [f"control run of the unpatched {t} failed on the stress fixture: {m}"
                for t, m in self.stress_controls.items() if m]
        why += [f"control run of the unpatched {t} failed on the probe fixture (fp16, bf16, fp32, fp64): {m}"
                for t, m in self.probe_controls.items() if m]
        why += [f"control run of the unpatched {t} failed on the fp16-stress fixture (fp16, bf16, fp32, fp64): {m}"
                for t, m in self.fp16_stress_controls.items() if m]
        why += [f"control run of the unpatched {t} failed on the {run.title} fixture: {m}"
                for run in self.families.values() for t, m in run.controls.items() if m]
        why += [f"control run of the unpatched {BACKWARD_FILE} failed on {fx} (--grad): {m}"
                for fx, m in self.backward_controls.items() if m]
        bad = [o.name for o in self.backward if not o.ok]
        if bad:
            why.append(f"{len(bad)} backward mutant(s) not caught by the gradient check alone at their gradient or "
                       f"step with their cause: {', '.join(bad)}")
        if n == 0 and self.backward:  # only backward mutants were selected: the forward catalog's rules do not apply
            return why
        if n == 0:
            why.append("no mutants were run")
        if self.n_caught < n:
            missed = [o.name for o in self.outcomes if not o.caught]
            why.append(f"{n - self.n_caught} mutant(s) not caught: {', '.join(missed)}")
        if n and self.n_localized < MIN_LOCALIZED * n:
            why.append(f"only {self.n_localized}/{n} localized at the expected tap (need {MIN_LOCALIZED:.0%})")
        if self.n_fp64_only < MIN_FP64_ONLY:
            why.append(f"only {self.n_fp64_only} mutant(s) caught by the fp64 tier alone (need {MIN_FP64_ONLY})")
        visible = [o.name for o in self.stability if not o.invisible_on_toy]
        if visible:
            why.append(f"{len(visible)} stability mutant(s) not invisible on the toy fixture (they must compute its "
                       f"numbers to round-off): {', '.join(visible)}")
        visible = [o.name for o in (*self.reduced, *self.fp16_stress) if not o.invisible_in_fp32]
        if visible:
            why.append(f"{len(visible)} reduced-precision mutant(s) not invisible in fp32 and fp64 (their bug must "
                       f"live in the half fast path only): {', '.join(visible)}")
        astray = [o.name for o in (*self.reduced, *self.fp16_stress) if o.caught and not o.localized]
        if astray:
            why.append(f"{len(astray)} reduced-precision mutant(s) not caught at their expected tap: "
                       f"{', '.join(astray)}")
        for name in dict.fromkeys(o.family for o in self.outcomes if o.caught_on == "family"):
            unnamed = [o.name for o in self.family(name) if o.caught and not _family_ok(o)]
            if unnamed:
                why.append(f"{len(unnamed)} {self._title(name)} mutant(s) not caught at their expected tap with a "
                           f"likely cause: {', '.join(unnamed)}")
        return why

    @property
    def verdict(self) -> Verdict:
        return Verdict.DISAGREE if self.failures() else Verdict.AGREE

    def totals_line(self) -> str:
        n = len(self.outcomes)
        pct = round(100 * self.n_localized / n) if n else 0
        return (f"mutants caught {self.n_caught}/{n}, localized {self.n_localized}/{n} ({pct}%), "
                f"fp64-only {self.n_fp64_only}")

    def to_json(self) -> dict[str, object]:
        return {
            "schema": "parity-selftest",  # first: how a later run knows the file is parity's (_core/output_paths.py)
            "fixture": self.fixture,
            "controls": self.controls,
            "stress_fixture": self.stress_fixture,
            "stress_controls": self.stress_controls,
            "probe_fixture": self.probe_fixture,
            "probe_controls": self.probe_controls,
            "fp16_stress_fixture": self.fp16_stress_fixture,
            "fp16_stress_controls": self.fp16_stress_controls,
            "families": {name: {"fixture": run.fixture, "controls": run.controls, "mutants": len(self.family(name)),
                                "caught_at_tap_with_cause": self.n_family_ok(name)}
                         for name, run in self.families.items()},
            "mutants": [{**asdict(o), "localized": o.localized, "fp64_only": o.fp64_only,
                         "invisible_on_toy": o.invisible_on_toy, "invisible_in_fp32": o.invisible_in_fp32,
                         "cause": o.cause} for o in self.outcomes],
            "totals": {"mutants": len(self.outcomes), "caught": self.n_caught, "localized": self.n_localized,
                       "fp64_only": self.n_fp64_only, "stability": len(self.stability),
                       "invisible_on_toy_caught_on_stress": self.n_pairs, "reduced": len(self.reduced),
                       "reduced_caught_at_tap_invisible_in_fp32": self.n_reduced_ok,
                       "fp16_stress": len(self.fp16_stress),
                       "fp16_stress_caught_at_tap_invisible_in_fp32": self.n_fp16_stress_ok},
            "backward": {"controls": self.backward_controls,
                         "mutants": [{**asdict(o), "localized": o.localized, "named": o.named, "ok": o.ok}
                                     for o in self.backward],
                         "caught_at_tap_with_cause": sum(o.ok for o in self.backward)},
            "exit_code": for_verdict(self.verdict),
            "failures": self.failures(),
        }


def _control_message(report: Report) -> str:
    if report.verdict == Verdict.AGREE:
        return ""
    if report.divergences:
        d = report.divergences[0]
        return f"{tier_key(d.precision, d.golden)} diverges at {d.tap} (max_abs {d.max_abs:.3g})"
    if report.decoding is not None and report.decoding.divergences:
        e = report.decoding.divergences[0]
        where = f"step {e.step}, {e.tap} (max_abs {e.max_abs:.3g})"
        return f"{tier_key(e.precision, e.golden)} decoding diverges at {where}"
    return f"exit code {for_verdict(report.verdict)}"


def _controls(fixture: Fixture, targets: list[Target], work: Path, tag: str,
              say: Callable[[str], None], precisions: list[Precision] | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    for target in targets:
        say(f"parity selftest: control run of the unpatched {target}{' on ' + fixture.root.name if tag else ''}")
        try:
            out[target] = _control_message(run_target(fixture, target, None, work, tag, precisions))
        except ParityError as exc:
            out[target] = str(exc)
    return out


def _judge(fixture: Fixture, mutant: Mutant, work: Path, tag: str = "",
           precisions: list[Precision] | None = None) -> Outcome:
    """Run one mutant on one fixture (in `precisions`, default fp32 and fp64) and classify what the harness reported."""
    start = time.perf_counter()
    try:
        report = run_target(fixture, mutant.target, mutant, work, tag, precisions)
    except MutantAnchorError:
        raise  # a rotten catalog is bad input (exit 2), not a caught mutant
    except ParityError as exc:  # the run stopped: the harness did not pass it, but localized nothing
        outcome = Outcome(mutant.name, mutant.target, mutant.description, mutant.expected_tap,
                          mutant.fp64_only, caught=True, error=str(exc), expected_step=mutant.expected_step,
                          caught_on=mutant.caught_on, precision=mutant.precision, file=mutant.file,
                          family=mutant.family)
    else:
        outcome = classify(mutant, report, fixture, time.perf_counter() - start)
    outcome.seconds = time.perf_counter() - start
    return outcome


def run_selftest(
    fixture: Fixture, mutants: list[Mutant], progress: Callable[[str], None] | None = None,
    stress: Fixture | None = None, probe: Fixture | None = None,
    family_fixtures: Mapping[str, Fixture] | None = None, fp16_stress: Fixture | None = None,
) -> SelftestResult:
    """The control runs (unpatched copies of each target used), then every mutant.

    `fixture` is the toy: the toy's mutants are judged there. The stability mutants (caught_on
    "stress") run on `fixture`, where they must pass, and on `stress`, where they must be caught;
    ParityError (exit 2) if any is selected without a stress fixture. The reduced-precision mutants
    (caught_on "probe") run on `probe` (None: `parity export --preset fp16-probe` in the temporary
    directory) in their precision, where they must be caught, and in fp32 and fp64, where they must pass;
    those caught_on "fp16-stress" the same way on `fp16_stress` (None: `parity export --preset fp16-stress` there).
    The other families' mutants (caught_on "family") run on their family's fixture, `family_fixtures[family]`
    (absent: the toy's sibling directory its mutants module names, e.g. toy-llama; ParityError, exit 2, if it is not
    there), where each must be caught at its tap with a likely cause.
    """
    say = progress or (lambda _msg: None)
    for mutant in mutants:  # a rotten anchor fails fast (exit 2), before any run
        mutant.apply((TARGET_DIRS[mutant.target] / mutant.file).read_text(encoding="utf-8"))
    stability = [m for m in mutants if m.caught_on == "stress"]
    if stability and stress is None:
        raise ParityError(f"the stability mutants ({', '.join(m.name for m in stability)}) need the stress fixture: "
                          "pass --stress-fixture DIR (made by `parity export --preset toy-stress`)")
    by_family: dict[str, list[Mutant]] = {}  # family -> its "family" mutants, in catalog order
    for mutant in mutants:
        if mutant.caught_on == "family":
            by_family.setdefault(mutant.family, []).append(mutant)
    given = dict(family_fixtures or {})
    own = {name: _family_fixture(fixture, name, group, given.get(name)) for name, group in by_family.items()}
    result = SelftestResult(str(fixture.root))
    with tempfile.TemporaryDirectory(prefix="parity-selftest-") as tmp:
        work = Path(tmp)
        backward = [m for m in mutants if m.caught_on in BACKWARD_ON]
        mutants = [m for m in mutants if m.caught_on not in BACKWARD_ON]
        result.controls = _controls(fixture, list(dict.fromkeys(m.target for m in mutants if m.caught_on != "family")),
                                    work, "", say)
        if stability and stress is not None:
            result.stress_fixture = str(stress.root)
            result.stress_controls = _controls(stress, list(dict.fromkeys(m.target for m in stability)), work,
                                               "-stress", say)
        reduced = [m for m in mutants if m.caught_on == "probe"]
        if reduced and probe is None:
            from parity_harness._authoring.presets import make_probe_fixture
            from parity_harness._fixture.fixture import load_fixture

            say("parity selftest: making the probe fixture (parity export --preset fp16-probe, seed 0)")
            make_probe_fixture(work / "fp16-probe")
            probe = load_fixture(work / "fp16-probe")
        if reduced and probe is not None:
            result.probe_fixture = str(probe.root) if probe.root.parent != work else "fp16-probe (seed 0, made here)"
            result.probe_controls = _controls(probe, list(dict.fromkeys(m.target for m in reduced)), work, "-probe",
                                              say, ["fp16", "bf16", "fp32", "fp64"])
        on_fp16_stress = [m for m in mutants if m.caught_on == "fp16-stress"]
        if on_fp16_stress and fp16_stress is None:
            from parity_harness._authoring.presets import export_preset
            from parity_harness._fixture.fixture import load_fixture

            say("parity selftest: making the fp16-stress fixture (parity export --preset fp16-stress, seed 0)")
            export_preset(work / "fp16-stress", "fp16-stress", progress=lambda _message: None, with_onnx=False)
            fp16_stress = load_fixture(work / "fp16-stress")
        if on_fp16_stress and fp16_stress is not None:
            result.fp16_stress_fixture = (str(fp16_stress.root) if fp16_stress.root.parent != work
                                          else "fp16-stress (seed 0, made here)")
            result.fp16_stress_controls = _controls(fp16_stress, list(dict.fromkeys(m.target for m in on_fp16_stress)),
                                                    work, "-fp16-stress", say, ["fp16", "bf16", "fp32", "fp64"])
        for name, group in by_family.items():
            result.families[name] = FamilyRun(
                family_mutants(name).title, str(own[name].root),
                _controls(own[name], list(dict.fromkeys(m.target for m in group)), work, f"-{name}", say))
        for mutant in mutants:
            say(f"parity selftest: {mutant.name}")
            if mutant.caught_on == "family":
                result.outcomes.append(_judge(own[mutant.family], mutant, work, f"-{mutant.family}"))
                continue
            reduced_on = probe if mutant.caught_on == "probe" else fp16_stress
            if mutant.caught_on in REDUCED_ON and reduced_on is not None:
                outcome = _judge(reduced_on, mutant, work, f"-{mutant.caught_on}", [mutant.precision or "fp16"])
                in_fp32 = _judge(reduced_on, mutant, work, f"-{mutant.caught_on}-fp32", ["fp32", "fp64"])
                outcome.fp32_tiers, outcome.fp32_error = in_fp32.tiers, in_fp32.error
                outcome.seconds += in_fp32.seconds
                result.outcomes.append(outcome)
                continue
            if mutant.caught_on != "stress" or stress is None:
                result.outcomes.append(_judge(fixture, mutant, work))
                continue
            outcome = _judge(stress, mutant, work, "-stress")
            on_toy = _judge(fixture, mutant, work, "-toy")
            outcome.toy_tiers, outcome.toy_error = on_toy.tiers, on_toy.error
            outcome.seconds += on_toy.seconds
            result.outcomes.append(outcome)
        if backward:
            _run_backward_mutants(result, fixture, stress, backward, work, say)
    return result


def _family_fixture(toy: Fixture, family: str, mutants: list[Mutant], given: Fixture | None) -> Fixture:
    """The family's own toy fixture: `given`, else the toy's sibling its mutants module names (fixtures/toy-llama);
    ParityError (exit 2) in one line when it is absent or of another family."""
    from parity_harness._fixture.fixture import load_fixture

    name = family_mutants(family).fixture
    where = f"{given.root.name}" if given is not None else f"{name} beside {toy.root.name}"
    if given is None:
        root = toy.root.parent / name
        if not (root / "manifest.json").is_file():
            raise ParityError(f"the {family} mutants ({', '.join(m.name for m in mutants)}) need the fixture {name} "
                              f"beside {toy.root.name}, not found: select others with --only")
        given = load_fixture(root)
    if given.family != family:
        raise ParityError(f"{where} is a {given.family} fixture, not a {family} one (the {family} mutants' fixture)")
    return given


def _by_file(outcomes: list[Outcome]) -> dict[str, list[Outcome]]:
    """Outcomes grouped by the file they patch, in catalog order."""
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o.file, []).append(o)
    return groups


def _tiers_cell(o: Outcome) -> str:
    tiers = ",".join(o.tiers) if o.tiers else ("error" if o.error else "-")
    return tiers + (" (fp64 only)" if o.fp64_only else "")


def _grid(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def format_table(result: SelftestResult) -> list[str]:
    """The table: mutant, caught, tiers that caught it, first diverging tap, expected tap, match.

    The stability mutants get a table of their own: invisible on the toy, caught on the stress fixture; so do the
    reduced-precision mutants (on the probe) and each other family's mutants (the Llama ones on toy-llama).
    """
    header: tuple[str, ...] = ("mutant", "caught", "tiers", "first diverging tap", "expected tap", "match")
    rows = [header]
    toy = [o for o in result.outcomes if o.caught_on == "toy"]
    for o in toy:
        first = o.first_tap or "-"
        if o.first_step is not None:
            first = f"step {o.first_step}: {first}"
        expected = o.expected_tap if o.expected_step is None else f"step {o.expected_step}: {o.expected_tap}"
        rows.append((o.name, "yes" if o.caught else "NO", _tiers_cell(o), first, expected,
                     "yes" if o.localized else "NO"))
    lines = _grid(rows) if toy else []
    if result.stability and result.stress_fixture is not None:
        lines.append(f"stability mutants: invisible on {Path(result.fixture).name}, caught on "
                     f"{Path(result.stress_fixture).name}")
        rows = [("mutant", "on toy", "on stress", "tiers (stress)", "first diverging tap", "expected tap", "match")]
        for o in result.stability:
            on_toy = "invisible" if o.invisible_on_toy else f"VISIBLE ({','.join(o.toy_tiers) or 'error'})"
            rows.append((o.name, on_toy, "caught" if o.caught else "NO", _tiers_cell(o), o.first_tap or "-",
                         o.expected_tap, "yes" if o.localized else "NO"))
        lines += _grid(rows)
    if result.reduced and result.probe_fixture is not None:
        lines.append("reduced-precision mutants: caught in fp16 on fp16-probe, invisible there in fp32 and fp64")
        rows = [("mutant", "in fp32/fp64", "caught", "tiers", "cause", "first diverging tap", "expected tap", "match")]
        for o in result.reduced:
            in_fp32 = "invisible" if o.invisible_in_fp32 else f"VISIBLE ({','.join(o.fp32_tiers) or 'error'})"
            rows.append((o.name, in_fp32, "yes" if o.caught else "NO", ",".join(o.tiers) or "-", o.cause,
                         o.first_tap or "-", o.expected_tap, "yes" if o.localized else "NO"))
        lines += _grid(rows)
    if result.fp16_stress and result.fp16_stress_fixture is not None:
        lines.append("fp16-stress mutants: caught in their precision on fp16-stress, invisible there in fp32 and fp64")
        rows = [("mutant", "precision", "in fp32/fp64", "caught", "tiers", "cause", "first diverging tap",
                 "expected tap", "match")]
        for o in result.fp16_stress:
            in_fp32 = "invisible" if o.invisible_in_fp32 else f"VISIBLE ({','.join(o.fp32_tiers) or 'error'})"
            rows.append((o.name, o.precision or "fp16", in_fp32, "yes" if o.caught else "NO", ",".join(o.tiers) or "-",
                         o.cause, o.first_tap or "-", o.expected_tap, "yes" if o.localized else "NO"))
        lines += _grid(rows)
    for name, run in result.families.items():
        if not result.family(name):
            continue
        lines.append(f"{run.title} mutants: caught on {Path(run.fixture).name} at their tap, with a likely cause")
        rows = [(header[0], "patches", *header[1:])]
        rows += [(o.name, o.file, "yes" if o.caught else "NO", _tiers_cell(o), o.first_tap or "-", o.expected_tap,
                  "yes" if o.localized else "NO") for o in result.family(name)]
        lines += _grid(rows)
    caught = [o for o in result.outcomes if o.caught and not o.error]
    if caught:
        lines.append("likely causes, named from the numbers at the first divergence (docs/diagnosis.md):")
        width = max(len(o.name) for o in caught)
        lines += [f"  {o.name.ljust(width)}  {cause_class(o.likely_cause)}" for o in caught]
    for o in result.outcomes:
        if o.error:
            lines.append(f"{o.name}: the run stopped with an error: {o.error}")
        elif o.caught and o.fp64_only != o.expected_fp64_only and o.caught_on not in REDUCED_ON:
            claim = "fp64 only" if o.expected_fp64_only else "by an fp32-tolerance comparison too"
            lines.append(f"{o.name}: the catalog says it is caught {claim}; it was caught by {', '.join(o.tiers)}")
    blind = [f"{o.name} ({', '.join(o.blind_cases)})" for o in toy if o.caught and o.blind_cases]
    if blind:
        lines.append(f"invisible in some cases: {'; '.join(blind)}")
    blind = [f"{o.name} ({', '.join(o.blind_cases)})" for o in result.stability if o.caught and o.blind_cases]
    if blind:
        lines.append(f"invisible in some stress cases: {'; '.join(blind)}")
    return lines


def format_backward(result: SelftestResult) -> list[str]:
    """The backward mutants' table: where the gradient check caught each, the cause it named, the forward alone."""
    if not result.backward:
        return []
    rows: list[tuple[str, ...]] = [("mutant", "fixture", "caught", "tiers", "caught at", "expected", "match", "cause",
                                    "forward alone")]
    for o in result.backward:
        at = o.first_tap or "-"
        at = at if o.first_step is None else f"step {o.first_step}: {at}"
        expected = o.expected_tap if o.expected_step is None else f"step {o.expected_step}: {o.expected_tap}"
        fixture = o.fixture + ("" if o.toy_tiers is None else
                               " (toy: invisible)" if not o.toy_tiers else f" (toy: VISIBLE {','.join(o.toy_tiers)})")
        rows.append((o.name, fixture, "yes" if o.caught else "NO", ",".join(o.tiers) or ("error" if o.error else "-"),
                     at, expected, "yes" if o.localized else "NO",
                     cause_class(o.likely_cause) if o.named else f"WRONG ({cause_class(o.likely_cause)})",
                     "CAUGHT" if o.forward_caught else "blind"))
    lines = ["backward mutants (numpy_backward.py): caught by the gradient check (--grad), forward checks blind"]
    lines += _grid(rows)
    lines += [f"{o.name}: the run stopped with an error: {o.error}" for o in result.backward if o.error]
    return lines


def print_selftest(result: SelftestResult, out: TextIO | None = None) -> None:
    stream = out if out is not None else sys.stdout

    def say(line: str) -> None:  # the sink: mutant, target and fixture names, error text, made safe
        print(safe_line(line), file=stream)

    for target, why in result.controls.items():
        say(f"control ({target}, unpatched): {'FAIL: ' + why if why else 'pass'}")
    for target, why in result.stress_controls.items():
        say(f"control ({target}, unpatched, {Path(result.stress_fixture or '').name}): "
            f"{'FAIL: ' + why if why else 'pass'}")
    for target, why in result.probe_controls.items():
        say(f"control ({target}, unpatched, fp16-probe, fp16/bf16/fp32/fp64): {'FAIL: ' + why if why else 'pass'}")
    for target, why in result.fp16_stress_controls.items():
        say(f"control ({target}, unpatched, fp16-stress, fp16/bf16/fp32/fp64): {'FAIL: ' + why if why else 'pass'}")
    for name, run in result.families.items():
        for target, why in run.controls.items():
            say(f"control ({target}, unpatched {module_file(name, target)}, {Path(run.fixture).name}): "
                f"{'FAIL: ' + why if why else 'pass'}")
    for fx, why in result.backward_controls.items():
        say(f"control (numpy, unpatched {BACKWARD_FILE}, {fx}, --grad): {'FAIL: ' + why if why else 'pass'}")
    for line in format_table(result):
        say(line)
    for line in format_backward(result):
        say(line)
    for why in result.failures():
        say(f"selftest FAIL: {why}")
    if result.stability:
        say(f"stability mutants invisible on toy, caught on stress: {result.n_pairs}/{len(result.stability)}")
    if result.reduced:
        say(f"reduced-precision mutants caught in fp16 at their tap, invisible in fp32 and fp64: "
            f"{result.n_reduced_ok}/{len(result.reduced)}")
    if result.fp16_stress:
        say(f"fp16-stress mutants caught in their precision at their tap, invisible in fp32 and fp64: "
            f"{result.n_fp16_stress_ok}/{len(result.fp16_stress)}")
    for name, run in result.families.items():
        own = result.family(name)
        if own:
            per_file = ", ".join(f"{file} {sum(map(_family_ok, group))}/{len(group)}"
                                 for file, group in _by_file(own).items())
            say(f"{run.title} mutants caught at their tap with a likely cause: {result.n_family_ok(name)}/{len(own)} "
                f"({per_file})")
    if result.backward:
        say(f"backward mutants caught by the gradient check at their gradient or step, with their cause, the forward "
            f"checks blind: {sum(o.ok for o in result.backward)}/{len(result.backward)}")
    say(result.totals_line())


def write_json(result: SelftestResult, path: Path) -> None:
    from parity_harness._core.safe_write import write_text_atomic

    write_text_atomic(path, json.dumps(result.to_json(), indent=1) + "\n", "selftest JSON")

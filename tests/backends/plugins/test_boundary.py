"""The one boundary (parity_harness/_backends/boundary.py): every path into backend code is guarded and judged.

Issue classes, each a case id prefix (docs/security.md counts them):
- `judged`: a subclass that overrides the documented method is judged by that method, for every
  built-in backend (in process) and through the real plugin discovery;
- `decode`: decoding under `parity run`, `parity generate` and `parity check-backend` is guarded like
  the forward pass: whatever a backend raises is one line, exit 2; what it returns is checked; what it
  does to its fixture cannot loosen the next backend's judgement;
- `nothing`: a command that prints a verdict exits 2 when nothing was compared (lens, generate).
Every subprocess case asserts the exit code, one stderr line, and no traceback.
"""

from __future__ import annotations

import json
import subprocess
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.boundary import GuardedBackend, forward_entry
from parity_harness._core.precision import DTYPES
from parity_harness._core.status import Verdict
from parity_harness._fixture.fixture import Fixture, default_fixture_dir, load_fixture
from parity_harness._run.runner import run_parity
from tests.helpers import BUILTIN_PRECISIONS, assert_exit_2_one_line, run_all, run_hostile

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)


@pytest.fixture(scope="module")
def toy() -> Fixture:
    return load_fixture(default_fixture_dir())


def builtin_class(name: str) -> type[Backend]:
    ep = next(ep for ep in entry_points(group="parity.backends") if ep.name == name)
    cls = ep.load()
    assert isinstance(cls, type) and issubclass(cls, Backend)
    return cls


def liar_of(parent: type[Backend]) -> type[Backend]:
    """`parent` with `run` overridden to return zeros of the right shapes and dtype: wrong at every tap."""

    class Liar(parent):  # type: ignore[misc, valid-type]
        def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
            taps = self.supported_taps(fixture)
            return {c.name: {t: np.zeros(fixture.golden_shape(t, c), DTYPES[precision]) for t in taps}
                    for c in fixture.cases}

    return Liar


@pytest.mark.parametrize("name", sorted(BUILTIN_PRECISIONS), ids=[f"judged-subclass-of-{n}" for n in
                                                                   sorted(BUILTIN_PRECISIONS)])
def test_judged_a_subclass_overriding_run_is_judged_by_its_run(toy: Fixture, name: str) -> None:
    """Once, a subclass of a streaming backend that overrode run() was judged by its parent's run_cases: PASS."""
    backend = GuardedBackend.wrap(liar_of(builtin_class(name))())
    missing = backend.missing()
    if missing:
        pytest.skip(f"{name} needs {', '.join(missing)}")
    assert backend.entry == "run"
    report = run_parity(toy, [backend], [backend.precisions[0]], decoding=False, budget=False)
    assert report.n_passed + report.n_failed > 0, "nothing was compared"
    assert report.verdict == Verdict.DISAGREE and not report.passed
    compared = [r for r in report.results if r.status != "not_supported"]
    assert compared and all(r.passed is False for r in compared)  # zeros are wrong at every tap


@pytest.mark.parametrize("case", ["judged-the-entry-rule"])
def test_judged_the_entry_rule(case: str) -> None:
    """The most derived definition of run or run_cases decides; a class defining both streams if it says so."""

    class Streams(Backend):
        streams = True

        def run(self, fixture: Any, precision: Any) -> Any: ...

        def run_cases(self, fixture: Any, precision: Any) -> Any: ...

    class OverridesRun(Streams):
        def run(self, fixture: Any, precision: Any) -> Any: ...

    class OverridesCases(OverridesRun):
        def run_cases(self, fixture: Any, precision: Any) -> Any: ...

    class BothNotStreaming(Backend):
        def run(self, fixture: Any, precision: Any) -> Any: ...

        def run_cases(self, fixture: Any, precision: Any) -> Any: ...

    assert forward_entry(Backend) == "run"
    assert forward_entry(Streams) == "run_cases"
    assert forward_entry(OverridesRun) == "run"
    assert forward_entry(OverridesCases) == "run_cases"
    assert forward_entry(BothNotStreaming) == "run"


def _fp64_run(backends: str, *extra: str) -> list[str]:
    return ["run", "--backends", backends, "--precision", "fp64", "-q", *extra]


# (case id, parity args, the words the one stderr line must hold)
EXIT_2 = [
    ("judged-plugin-overrides-run-sys-exit-0", _fp64_run("subclass-overrides-run-sys-exit-0"),
     ("crashed in run (fp64)", "SystemExit")),
    ("decode-run-sys-exit-0", _fp64_run("decode-sys-exit-0"), ("'decode-sys-exit-0'", "crashed in decode (fp64)",
                                                                "SystemExit")),
    ("decode-run-supports-decoding-sys-exit-0", _fp64_run("supports-decoding-sys-exit-0"),
     ("crashed in supports_decoding", "SystemExit")),
    ("decode-run-custom-baseexception", _fp64_run("decode-custom-baseexception"), ("crashed in decode", "Boom")),
    ("decode-run-lists", _fp64_run("decode-returns-lists"), ("returned list, expected numpy.ndarray",)),
    ("decode-run-supports-decoding-string", _fp64_run("supports-decoding-returns-string"),
     ("supports_decoding returned 'yes'",)),
    ("decode-run-unknown-key", _fp64_run("decode-unknown-key"), ("'step99/logits'",)),
    ("decode-generate-sys-exit-0", ["generate", "--prompt", "the cat", "--backends", "decode-sys-exit-0,numpy"],
     ("crashed in decode", "SystemExit")),
    ("decode-generate-custom-baseexception", ["generate", "--prompt", "the cat", "--backends",
                                              "numpy,decode-custom-baseexception"], ("crashed in decode", "Boom")),
    ("decode-generate-lists", ["generate", "--prompt", "the cat", "--backends", "numpy,decode-returns-lists"],
     ("expected numpy.ndarray",)),
    ("nothing-generate-single-run", ["generate", "--prompt", "the cat", "--backends", "numpy", "--precision", "fp64"],
     ("nothing compared", "only one run decodes (numpy fp64)")),
    ("nothing-lens-no-lens-taps", ["lens", "--case", "grammar_0", "--backends", "no-lens-taps"],
     ("nothing compared", "logit_lens")),
    ("nothing-lens-a-declining-backend-is-not-run", ["lens", "--case", "grammar_0", "--backends",
                                                     "declines-but-crashes"], ("nothing compared",)),
]
EXIT_1 = [
    ("judged-plugin-overrides-run-wrong", _fp64_run("subclass-overrides-run-wrong")),
    ("judged-plugin-overrides-run-cases-wrong", _fp64_run("subclass-overrides-run-cases-wrong")),
    ("decode-run-loosening-does-not-reach-the-next-backend", _fp64_run("decode-loosens-tolerances,decode-wrong")),
    ("decode-generate-nan-logits", ["generate", "--prompt", "the cat", "--backends", "decode-nan-logits,numpy",
                                    "--precision", "all"]),
]


@pytest.fixture(scope="module")
def runs() -> dict[str, subprocess.CompletedProcess[str]]:
    return run_all({case: args for case, args, *_ in EXIT_2 + EXIT_1})


@pytest.mark.parametrize(("case", "needles"), [(c, n) for c, _, n in EXIT_2], ids=[c for c, _, _ in EXIT_2])
def test_exits_2_with_one_line(runs: dict[str, subprocess.CompletedProcess[str]], case: str,
                               needles: tuple[str, ...]) -> None:
    proc = runs[case]
    assert_exit_2_one_line(proc, *needles)
    assert "AGREE" not in proc.stdout
    if "declining" in case:  # not run: said so, and its run (which would crash) never started
        assert "declines-but-crashes declines this fixture (too big for this test)" in proc.stdout


@pytest.mark.parametrize("case", [c for c, _ in EXIT_1], ids=[c for c, _ in EXIT_1])
def test_exits_1_on_a_wrong_answer(runs: dict[str, subprocess.CompletedProcess[str]], case: str) -> None:
    proc = runs[case]
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-1500:], proc.stderr[-1500:])
    assert "Traceback" not in proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(("FAIL", "DIFFER")), last


@pytest.mark.parametrize("case", ["decode-loosened-tolerances-stay-strict-in-the-report"])
def test_decode_loosened_tolerances_stay_strict_in_the_report(case: str, tmp_path: Path) -> None:
    """The decoding checks of the backend after the one that loosened its fixture use the strict tolerances."""
    report = tmp_path / "r.json"
    proc = run_hostile(*_fp64_run("decode-loosens-tolerances,decode-wrong", "--json", str(report)))
    assert proc.returncode == 1, proc.stdout[-1500:] + proc.stderr[-1500:]
    data = json.loads(report.read_text())
    checks = data["decoding"]["results"]
    wrong = [c for c in checks if c["backend"] == "decode-wrong" and c["tap"] == "logits"]
    assert wrong and all(not c["passed"] and c["atol"] <= 1e-5 for c in wrong)  # the strict tiers, not 1e9
    assert all(c["passed"] for c in checks if c["backend"] == "decode-loosens-tolerances")


@pytest.mark.parametrize("case", ["decode-check-backend-wrong-cache-shape"])
def test_decode_check_backend_covers_decoding(case: str) -> None:
    """check-backend runs decoding through the same boundary: a cache missing a position fails its check."""
    proc = run_hostile("check-backend", "decode-wrong-shape")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-1500:]
    failing = [ln for ln in proc.stdout.splitlines() if ": FAIL" in ln]
    assert failing and all("decoding: shapes and dtype" in ln for ln in failing), failing
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("case", ["decode-check-backend-sys-exit-0"])
def test_decode_check_backend_reports_a_decode_crash_as_a_failed_check(case: str) -> None:
    proc = run_hostile("check-backend", "decode-sys-exit-0")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-1500:]
    failing = [ln for ln in proc.stdout.splitlines() if ": FAIL" in ln]
    assert len(failing) == 2 and all("decoding: runs" in ln and "SystemExit" in ln for ln in failing), failing


CONTRACT_METHODS = {"run", "run_cases", "decode", "supports_decoding", "declines", "supported_taps",
                    "missing_dependencies", "import_requirements"}
NOT_BACKENDS = {"subprocess", "session", "evaluator", "nox", "api"}  # receivers whose .run() is not a backend's
# (`api.run`: the public API, which goes through the boundary itself)


def calls_past_the_boundary(path: Path) -> list[str]:
    """`X.METHOD(...)` calls of a contract method in `path`, where X is not a known non-backend object.

    `bytes.decode("utf-8")` is told apart from `Backend.decode(fixture, ...)` by its arguments.
    """
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in CONTRACT_METHODS:
            continue
        receiver = node.func.value
        if isinstance(receiver, ast.Name) and receiver.id in NOT_BACKENDS:
            continue
        if node.func.attr == "decode" and (not node.args or isinstance(node.args[0], ast.Constant)):
            continue
        found.append(f"{path}:{node.lineno}: .{node.func.attr}(...)")
    return found


@pytest.mark.parametrize("case", ["judged-no-call-past-the-boundary"])
def test_judged_no_command_calls_backend_code_past_the_boundary(case: str, tmp_path: Path) -> None:
    """Every call into backend code outside parity_harness/_backends/ goes through GuardedBackend, whose methods are
    named apart from the contract's: a `.run(` or `.decode(fixture, ...)` there is a bypass."""
    from tests.helpers import REPO

    sources = [p for p in sorted((REPO / "harness").rglob("*.py")) if "_backends" not in p.relative_to(REPO).parts]
    sources += sorted((REPO / "benchmarks").rglob("*.py"))
    assert len(sources) > 30
    assert [c for p in sources for c in calls_past_the_boundary(p)] == []
    # The scan sees a bypass where there is one.
    bypass = "def f(backend, fixture):\n    return backend.run(fixture, 'fp32'), b'x'.decode('utf-8')\n"
    probe = tmp_path / "bypass.py"
    probe.write_text(bypass, encoding="utf-8")
    assert [c.split(": ", 1)[1] for c in calls_past_the_boundary(probe)] == [".run(...)"]

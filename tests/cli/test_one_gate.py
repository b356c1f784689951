"""One gate: every request `parity run` refuses, the Python API and the pytest plugin refuse too, and the CLI holds
no rule of its own (issue 36, findings 1, 4 and 11).

Each refusal of REFUSALS runs through the three surfaces: `parity run` in-process (exit 2, one line), `api.run`
(ParityError, or a NOTHING_COMPARED report for a backend that ran and compared nothing) and the pytest plugin (the
test fails with parity's one line) in one pytest subprocess. The backends the refusals use are defined once, in
BACKENDS, and registered as entry points for the CLI.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from parity_harness import api
from parity_harness._compare.report import Report
from parity_harness._core.errors import ParityError
from parity_harness._core.status import Verdict
from tests.helpers import REPO, cli_with_backends, edit_manifest, plugin_args

# The test backends, as source: exec'd here (the CLI's and the API's) and written into the plugin's test file.
BACKENDS = '''
import os

from parity_harness._backends.numpy_backend import NumpyBackend


class GateFp64Only(NumpyBackend):
    name = "gate-fp64-only"
    precisions = ("fp64",)


class GateDeclines(NumpyBackend):
    name = "gate-declines"

    def declines(self, fixture):
        return "declines every fixture (a test backend)"


class GateChdir(NumpyBackend):
    """Moves the process into $GATE_CHDIR_TO while it runs, and stays there."""

    name = "gate-chdir"

    def run(self, fixture, precision):
        os.chdir(os.environ["GATE_CHDIR_TO"])
        return super().run(fixture, precision)
'''

_module = ModuleType("tests._one_gate_backends")
exec(compile(BACKENDS, "<one-gate backends>", "exec"), _module.__dict__)
sys.modules[_module.__name__] = _module
CLASSES = [_module.GateFp64Only, _module.GateDeclines, _module.GateChdir]
BY_NAME = {c.name: c for c in CLASSES}


def instance(name: str) -> Any:
    """A test backend by name as an instance, a built-in one by its registered name."""
    return BY_NAME[name]() if name in BY_NAME else name


# (id, backends, precision, fixture kind, words the one line must hold). Fixture kinds: "toy", "loose" (a
# tolerance beyond its ceiling, sealed), "broken" (no manifest).
REFUSALS: list[tuple[str, list[str], str, str, str]] = [
    ("unknown-backend", ["no-such-backend"], "fp64", "toy", "unknown backend 'no-such-backend'"),
    ("backend-twice", ["numpy", "numpy"], "fp64", "toy", "'numpy' more than once"),
    ("unknown-precision", ["numpy"], "fp8", "toy", "fp8"),
    ("named-backend-computes-in-no-precision-asked", ["numpy", "gate-fp64-only"], "fp32", "toy",
     "nothing to compare for a backend asked for by name: gate-fp64-only computes in fp64 only"),
    ("named-backend-declines", ["gate-declines", "numpy"], "fp64", "toy",
     "nothing was compared for backend(s) asked for by name: gate-declines"),
    ("only-backend-declines", ["gate-declines"], "fp64", "toy", "nothing was compared"),
    ("loose-tolerances", ["numpy"], "fp64", "loose", "ceiling"),
    ("broken-fixture", ["numpy"], "fp64", "broken", "manifest.json"),
]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory, toy_dir: Path) -> dict[str, Path]:
    import shutil

    root = tmp_path_factory.mktemp("one-gate")
    loose = root / "loose"
    shutil.copytree(toy_dir, loose)
    edit_manifest(loose, lambda m: m["tolerances"]["fp64"].update(atol=1e-3))
    broken = root / "broken"
    broken.mkdir()
    return {"toy": toy_dir, "loose": loose, "broken": broken}


@pytest.mark.parametrize(("case", "backends", "precision", "kind", "needle"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_the_cli_refuses(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                         fixtures: dict[str, Path], case: str, backends: list[str], precision: str, kind: str,
                         needle: str) -> None:
    cli = cli_with_backends(monkeypatch, capsys, _module.__name__, CLASSES)
    code, out, err = cli("run", "-q", "--fixture", str(fixtures[kind]), "--backends", ",".join(backends),
                         "--precision", precision)
    lines = err.strip().splitlines()
    assert code == 2, (code, out[-800:], err)
    assert len(lines) == 1 and lines[0].startswith("parity: error: ") and needle in lines[0], lines
    assert "PASS" not in out


@pytest.mark.parametrize(("case", "backends", "precision", "kind", "needle"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_the_api_refuses(fixtures: dict[str, Path], case: str, backends: list[str], precision: str, kind: str,
                         needle: str) -> None:
    try:
        report = api.run([instance(n) for n in backends], fixtures[kind], precision)
    except ParityError as exc:
        assert needle in str(exc) and "\n" not in str(exc), str(exc)
        return
    # a backend that ran and compared nothing: the same verdict the CLI exits 2 for, never a pass
    assert not report and report.verdict == Verdict.NOTHING_COMPARED
    assert needle in report.nothing_compared_reason()
    with pytest.raises(api.ParityAssertionError, match="nothing was compared"):
        api.assert_agrees([instance(n) for n in backends], fixtures[kind], precision)


PLUGIN_TEST = '''
import pytest

{backends}


def backend(name):
    classes = {{c.name: c for c in (GateFp64Only, GateDeclines)}}
    return classes[name]() if name in classes else name


@pytest.mark.parametrize("backends,precision", {cases!r}, ids={ids!r})
def test_refused(parity, backends, precision):
    parity.assert_agrees([backend(n) for n in backends], precision=precision)
'''


def test_the_pytest_plugin_refuses(tmp_path: Path, fixtures: dict[str, Path]) -> None:
    """Every refusal fails its test with parity's line: through the plugin's `parity` fixture, one pytest run per
    fixture kind (the fixture is the session's, `--parity-fixture`)."""
    seen: dict[str, str] = {}
    for kind in sorted({r[3] for r in REFUSALS}):
        rows = [r for r in REFUSALS if r[3] == kind]
        project = tmp_path / kind
        project.mkdir()
        (project / "test_gate.py").write_text(PLUGIN_TEST.format(
            backends=BACKENDS, cases=[(r[1], r[2]) for r in rows], ids=[r[0] for r in rows]))
        report = project / "junit.xml"
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-q",
                               "--parity-fixture", str(fixtures[kind]), "--junitxml", str(report)],
                              cwd=project, capture_output=True, text=True, timeout=300, check=False,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])})
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
        import xml.etree.ElementTree as ET

        for testcase in ET.parse(report).getroot().iter("testcase"):
            failure = testcase.find("failure") if testcase.find("failure") is not None else testcase.find("error")
            case = testcase.get("name", "").split("[", 1)[1].rstrip("]")
            seen[case] = "" if failure is None else failure.get("message", "")
    for case, _, _, _, needle in REFUSALS:
        assert case in seen, (case, sorted(seen))
        assert seen[case], f"{case}: the plugin passed a request the CLI refuses"
        assert needle in seen[case], (case, seen[case][:500])


# -- finding 11: the API lets nothing escape as something else, and takes no option of the wrong type ------


def _exit(line: str) -> None:
    sys.exit(0)


def _type_error(line: str) -> None:
    raise TypeError("a caller's bug")


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"jobs": True}, "jobs: expected a whole number"),
    ({"jobs": 2.0}, "jobs: expected a whole number"),
    ({"jobs": 0}, "jobs: expected a whole number"),
    ({"allow_loose_tolerances": "no"}, "allow_loose_tolerances: expected True or False"),
    ({"decoding": "no"}, "decoding: expected True or False"),
    ({"budget": 1}, "budget: expected True or False"),
    ({"precisions": 5}, "precisions a int"),
    ({"precisions": [None]}, "unknown precision 'None'"),
    ({"progress": _exit}, "the progress callback raised SystemExit"),
    ({"progress": _type_error}, "the progress callback raised TypeError: a caller's bug"),
    ({"progress": "loud"}, "progress: expected a callable"),
    ({"on_plan": _exit}, "the on_plan callback raised SystemExit"),
], ids=["jobs-true", "jobs-float", "jobs-zero", "loose-no", "decoding-no", "budget-1", "precisions-int",
        "precisions-none", "progress-sys-exit", "progress-type-error", "progress-not-callable", "on-plan-sys-exit"])
def test_the_api_raises_only_parity_errors(kwargs: dict[str, Any], needle: str) -> None:
    options = {"precisions": "fp64", "decoding": False, **kwargs}
    with pytest.raises(ParityError) as caught:
        api.run("numpy", None, **options)
    assert needle in str(caught.value), str(caught.value)


def test_the_api_never_reads_a_wrong_type_as_loose(fixtures: dict[str, Path]) -> None:
    """`allow_loose_tolerances="no"` once ran a loose fixture as allowed (a non-empty string is truthy)."""
    with pytest.raises(ParityError, match="allow_loose_tolerances"):
        api.run("numpy", fixtures["loose"], "fp64", allow_loose_tolerances="no")  # type: ignore[arg-type]
    with pytest.raises(ParityError, match="allow_loose_tolerances"):
        api.load(fixtures["loose"], allow_loose_tolerances="no")  # type: ignore[arg-type]


def test_a_render_of_a_wrong_report_is_a_parity_error() -> None:
    with pytest.raises(ParityError, match="expected a Report"):
        api.render("not a report")  # type: ignore[arg-type]
    with pytest.raises(ParityError, match="fmt"):
        api.render(Report("nowhere"), "yaml")  # type: ignore[arg-type]


# -- finding 4: a backend that changes the working directory cannot redirect a report -----------------------


def test_a_backend_that_changes_directory_cannot_redirect_a_report(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    thesis = elsewhere / "thesis.md"
    thesis.write_text("# my thesis\n")
    summary = elsewhere / "summary.md"
    summary.write_text("")
    monkeypatch.chdir(here)
    monkeypatch.setenv("GATE_CHDIR_TO", str(elsewhere))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", "summary.md")  # relative: read once, where the command started
    (here / "summary.md").write_text("")
    cli = cli_with_backends(monkeypatch, capsys, _module.__name__, CLASSES)
    code, out, err = cli("run", "-q", "--backends", "gate-chdir", "--precision", "fp64", "--markdown", "thesis.md",
                         "--json", "report.json", "--junit", "junit.xml")
    assert code == 0, (out[-500:], err)
    assert thesis.read_text() == "# my thesis\n"  # the user's file in the other directory is untouched
    assert summary.read_text() == ""
    assert not (elsewhere / "report.json").exists() and not (elsewhere / "junit.xml").exists()
    assert (here / "thesis.md").read_text().startswith("## parity")
    assert json.loads((here / "report.json").read_text())["passed"] is True
    assert (here / "junit.xml").exists() and (here / "summary.md").read_text().startswith("## parity")


# -- the CLI holds no rule: `_run` is parsing, one API call and rendering ----------------------------------

MAIN = REPO / "harness" / "parity_harness" / "_cli" / "main.py"
# What deciding a verdict or refusing a run reads: a backend's declarations, a report's counts, a fixture's checks.
RULE_WORDS = {"precisions", "unavailable", "declined", "declines", "check_before_running", "n_passed", "n_failed",
              "taps_compared", "named_uncompared", "status", "RunStatus", "by_default", "select_backends_rule"}


def rules_in(source: str, function: str | None = None) -> list[str]:
    """Where `source` (or one function of it) reads something a verdict or a refusal is decided from."""
    tree: ast.AST = ast.parse(source)
    if function is not None:
        tree = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in RULE_WORDS:
            found.append(f"line {node.lineno}: {node.attr}")
        elif isinstance(node, ast.Name) and node.id in RULE_WORDS:
            found.append(f"line {node.lineno}: {node.id}")
    return found


def test_the_cli_run_holds_no_rule() -> None:
    source = MAIN.read_text(encoding="utf-8")
    for function in ("cmd_run", "_run", "_print_plan", "_refuse_nothing_compared", "cmd_compare", "_compare",
                     "cmd_merge", "_merge"):
        assert rules_in(source, function) == [], function
    run = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "_run")
    api_calls = [n for n in ast.walk(run) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == "api"]
    assert len(api_calls) == 1, [ast.unparse(c)[:80] for c in api_calls]
    assert not [n for n in ast.walk(run) if isinstance(n, ast.Raise)]


def test_the_rule_scan_sees_a_rule() -> None:
    probe = textwrap.dedent('''
        def _run(args):
            backends = select(args)
            if any(p not in b.precisions for b in backends for p in args.precision):
                raise ParityError("nothing to compare")
            return api.run(backends)
    ''')
    assert rules_in(probe, "_run") == ["line 4: precisions"]


def test_one_definition_of_parity_s_own_error() -> None:
    from parity_harness._core.errors import FixtureError, is_own_error
    from parity_harness._run.dump import DumpError
    from parity_harness._run.report_check import MergeError

    class PluginError(ParityError):
        pass

    assert all(is_own_error(e("x")) for e in (ParityError, FixtureError, DumpError, MergeError))
    assert not is_own_error(PluginError("x")) and not is_own_error(ValueError("x"))


def test_a_backend_that_declines_the_fixture_is_not_decoded_either(toy_dir: Path) -> None:
    """Its forward pass is 'not supported'; decoding with it anyway counted checks for a backend that declined."""
    report = api.run([instance("gate-declines"), "numpy"], toy_dir, "fp64")
    assert report.decoding is not None and "gate-declines" in report.decoding.not_supported
    assert [r.backend for r in report.decoding.runs] == ["numpy"]

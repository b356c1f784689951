"""The public Python API (parity_harness/api.py) and the pytest plugin (parity_harness/pytest_plugin.py).

Classes of tests: the API's calls (`api-`), Report truthiness (`truth-`), the assertion's message
(`assert-`), the render formats (`render-`), the plugin run by pytest in a subprocess (`plugin-`), and
one real `pip install -e` of the checkout into a fresh virtualenv that runs the example project's
suite (examples/pytest-port/) through the plugin's entry point (`install-`).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from parity_harness import api
from parity_harness._backends.base import BackendOutput, Precision
from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._compare.report import Report
from parity_harness._core.errors import BackendFailed, BackendUnavailable, FixtureError, ParityError
from parity_harness._core.status import Verdict
from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest
from parity_harness._fixture.fixture import Fixture, default_fixture_dir
from parity_harness._views.console import divergence_paragraph, print_report, report_json, verdict_line
from tests.helpers import REPO, make_child_env, pip_install_command, plugin_args, run_pytest

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

EXAMPLE = REPO / "examples" / "pytest-port"
LYING_TAP = "blocks.1.hook_resid_mid"  # where examples/pytest-port/my_port.py's LyingPort lies


class LiesAt(NumpyBackend):
    """parity's NumPy forward pass with one tap off by `delta` in every case (judged by this `run`)."""

    name = "lies-at"

    def __init__(self, tap: str = LYING_TAP, delta: float = 1e-3) -> None:
        self.tap, self.delta = tap, delta

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        out = dict(self.run_cases(fixture, precision))
        for taps in out.values():
            taps[self.tap] = taps[self.tap] + taps[self.tap].dtype.type(self.delta)
        return out


class DecodesWrong(NumpyBackend):
    """A correct forward pass whose incremental decoding is off at step 2's logits."""

    name = "decodes-wrong"

    def decode(self, fixture: Fixture, precision: Precision,
               requests: list[DecodeRequest] | None = None) -> DecodeOutput:
        out = super().decode(fixture, precision, requests)
        for steps in out.values():
            if "step2/logits" in steps:
                steps["step2/logits"] = steps["step2/logits"] + steps["step2/logits"].dtype.type(1e-2)
        return out


class Fp64Only(NumpyBackend):
    name = "fp64-only"
    precisions = ("fp64",)  # type: ignore[assignment]  # NumpyBackend declares both


class Declines(NumpyBackend):
    name = "declines"

    def declines(self, fixture: Fixture) -> str | None:
        return "declines every fixture (a test backend)"


class NeedsAMissingModule(NumpyBackend):
    name = "needs-missing"
    requires = ("no_such_module_for_parity_api",)
    install_hint = "pip install no-such-module"


class Crashes(NumpyBackend):
    name = "crashes"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        raise RuntimeError("out of cheese")


@pytest.fixture(scope="module")
def toy() -> Fixture:
    return api.load()


# -- api: the calls --------------------------------------------------------------------------------


def test_api_load_defaults_to_the_toy_and_reads_a_path(toy: Fixture) -> None:
    assert toy.root == default_fixture_dir()
    assert api.load(str(default_fixture_dir())).manifest == toy.manifest
    assert toy.golden("fp64") and toy.golden("fp32")  # read and checked before any backend runs


def test_api_load_refuses_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(FixtureError, match="fixture directory not found") as caught:
        api.load(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(caught.value)


def test_api_run_by_name_and_by_instance(toy: Fixture) -> None:
    report = api.run(["numpy", LiesAt(delta=0.0)], toy, "fp64", decoding=False)
    assert report.passed and report.verdict == Verdict.AGREE
    assert [(r.backend, r.precision, r.status) for r in report.runs] == [("numpy", "fp64", "ran"),
                                                                          ("lies-at", "fp64", "ran")]
    assert report.taps_compared() == {"numpy": (43, 43), "lies-at": (43, 43)}
    assert report.decoding is None  # decoding=False


def test_api_run_a_liar_is_a_falsy_report_naming_its_tap(toy: Fixture) -> None:
    report = api.run(LiesAt(), toy, ["fp32"], decoding=False)
    assert report.verdict == Verdict.DISAGREE and not report.passed
    assert {d.tap for d in report.divergences} == {LYING_TAP}


def test_api_run_checks_decoding_unless_told_not_to(toy: Fixture) -> None:
    report = api.run(DecodesWrong(), toy, "fp64")
    assert report.n_failed == 0 and report.n_decoding_failed > 0 and report.verdict == Verdict.DISAGREE
    assert api.run(DecodesWrong(), toy, "fp64", decoding=False).verdict == Verdict.AGREE


@pytest.mark.parametrize(("backends", "precisions", "needle"), [
    ("no-such-backend", "all", "unknown backend 'no-such-backend'"),
    (["numpy", "numpy"], "all", "'numpy' more than once"),
    ([], "all", "give at least one backend"),
    (NumpyBackend, "all", "pass an instance (NumpyBackend()), not the class"),
    (42, "all", "backend int: expected a registered name or a Backend instance"),
    ("numpy", "fp8", "unknown precision 'fp8': expected fp32, fp64, fp16, bf16, f16, q8_0, q4_0, q4_k, all"),
    ("numpy", [], "give at least one of fp32, fp64, fp16, bf16, f16, q8_0, q4_0, q4_k or all"),
], ids=["api-unknown-name", "api-twice", "api-none", "api-a-class", "api-not-a-backend", "api-bad-precision",
        "api-no-precision"])
def test_api_bad_input_is_one_line_parityerror(toy: Fixture, backends: object, precisions: object,
                                               needle: str) -> None:
    with pytest.raises(ParityError) as caught:
        api.run(backends, toy, precisions)  # type: ignore[arg-type]
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_api_missing_dependencies_name_the_install(toy: Fixture) -> None:
    with pytest.raises(BackendUnavailable, match=r"needs no_such_module_for_parity_api.*pip install no-such-module"):
        api.run(NeedsAMissingModule(), toy)


def test_api_a_crashing_backend_is_backendfailed_not_an_assertion(toy: Fixture) -> None:
    with pytest.raises(BackendFailed, match="'crashes' crashed in run \\(fp32\\): RuntimeError: out of cheese"):
        api.assert_agrees(Crashes(), toy)


def test_api_compare_dumps_judges_saved_outputs_like_a_run(toy: Fixture, tmp_path: Path) -> None:
    from parity_harness._run.dump import save_outputs

    good = api.run("numpy", toy, "fp64", decoding=False, keep_outputs=True)
    bad = api.run(LiesAt(), toy, "fp64", decoding=False, keep_outputs=True)
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    [good_dump] = save_outputs(good, toy, tmp_path / "good")
    [bad_dump] = save_outputs(bad, toy, tmp_path / "bad")
    judged = api.compare_dumps(good_dump, toy)
    assert judged and judged.n_passed == good.n_passed
    judged_bad = api.compare_dumps([str(bad_dump)], toy)
    assert not judged_bad and {d.tap for d in judged_bad.divergences} == {LYING_TAP}
    with pytest.raises(ParityError, match="give at least one dump"):
        api.compare_dumps([], toy)


def test_api_is_reachable_from_the_package() -> None:
    proc = subprocess.run([sys.executable, "-c", "import parity_harness, sys; "
                           "assert 'parity_harness.api' not in sys.modules; "
                           "print(parity_harness.api.assert_agrees.__module__)"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "parity_harness.api", proc.stderr


# -- truth: a Report is truthy exactly when it passes ----------------------------------------------


def test_truth_a_report_is_truthy_exactly_when_it_passes(toy: Fixture) -> None:
    reports = {
        "pass": api.run("numpy", toy, "fp64"),
        "forward-fail": api.run(LiesAt(), toy, "fp64", decoding=False),
        "decoding-fail": api.run(DecodesWrong(), toy, "fp64"),
        "nothing-compared": api.run(Declines(), toy, "fp32"),
        "named-compared-nothing": api.run(["numpy", Declines()], toy, "fp64"),
        "empty": Report("nowhere"),
    }
    verdicts = {name: r.verdict for name, r in reports.items()}
    assert verdicts == {"pass": Verdict.AGREE, "forward-fail": Verdict.DISAGREE, "decoding-fail": Verdict.DISAGREE,
                        "nothing-compared": Verdict.NOTHING_COMPARED,
                        "named-compared-nothing": Verdict.NOTHING_COMPARED, "empty": Verdict.NOTHING_COMPARED}
    for name, report in reports.items():
        assert bool(report) is report.passed is (report.verdict == Verdict.AGREE), name


# -- assert: the assertion and its message ---------------------------------------------------------


def test_assert_agrees_returns_the_passing_report(toy: Fixture) -> None:
    report = api.assert_agrees("numpy", toy, "all")
    assert report and report.taps_compared() == {"numpy": (43, 43)}
    assert {(r.precision, r.golden) for r in report.results} == {("fp32", "fp32"), ("fp64", "fp64"),
                                                                 ("fp64", "fp32")}


@pytest.mark.parametrize(("tap", "precision"), [("hook_embed", "fp32"), ("blocks.0.attn.hook_pattern", "fp64"),
                                                ("logits", "all")],
                         ids=["assert-first-tap-fp32", "assert-attention-fp64", "assert-logits-all"])
def test_assert_message_names_the_first_diverging_tap(toy: Fixture, tap: str, precision: str) -> None:
    with pytest.raises(api.ParityAssertionError) as caught:
        api.assert_agrees(LiesAt(tap, 1e-3), toy, precision, decoding=False)
    assert isinstance(caught.value, AssertionError)
    report = caught.value.report
    assert not report and report.divergences
    lines = str(caught.value).splitlines()
    first = next(d for d in report.divergences if d.tap == tap)
    assert lines[0].startswith(f"first divergence at {tap}: lies-at {first.precision} vs {first.golden}, "
                               f"case {first.case}, index {first.index}: got "), lines[0]
    # the terminal report's own paragraph (got, expected, |diff| vs atol), one line per diverging tier
    assert lines[1:-1] == [divergence_paragraph(d) for d in report.divergences]
    assert "got " in lines[1] and "expected " in lines[1] and "> atol " in lines[1]
    assert lines[-1] == verdict_line(report) and lines[-1].startswith("FAIL")


def test_assert_headline_is_the_earliest_tap_over_tiers(toy: Fixture) -> None:
    """A 1e-9 error breaks only the fp64 tier's 1e-12: the fp64 vs fp32 tier agrees, the headline names fp64."""
    with pytest.raises(api.ParityAssertionError) as caught:
        api.assert_agrees(LiesAt("hook_pos_embed", 1e-9), toy, "fp64", decoding=False)
    assert str(caught.value).splitlines()[0].startswith("first divergence at hook_pos_embed: lies-at fp64 vs fp64,")
    assert [d.golden for d in caught.value.report.divergences] == ["fp64"]


def test_assert_a_decoding_only_failure_names_the_step_and_tap(toy: Fixture) -> None:
    with pytest.raises(api.ParityAssertionError) as caught:
        api.assert_agrees(DecodesWrong(), toy, "fp64")
    lines = str(caught.value).splitlines()
    assert lines[0].startswith("decoding: first divergence at step 2, logits: decodes-wrong fp64 vs fp64, prompt "), \
        lines[0]
    assert any(ln.startswith("decodes-wrong decoding fp64 vs fp64: first divergence at step 2, logits") for ln in lines)
    assert lines[-1].startswith("FAIL: decoding disagreement in decodes-wrong")


def test_assert_nothing_compared_is_an_assertion_too(toy: Fixture) -> None:
    with pytest.raises(api.ParityAssertionError) as caught:
        api.assert_agrees(Declines(), toy, "fp32")
    lines = str(caught.value).splitlines()
    assert lines[0] == "nothing was compared: declines fp32: declines every fixture (a test backend)"
    assert lines[-1].startswith("ERROR: nothing was compared")
    assert caught.value.report.verdict == Verdict.NOTHING_COMPARED


def test_assert_failure_message_is_empty_for_a_pass(toy: Fixture) -> None:
    assert api.failure_message(api.run("numpy", toy, "fp32", decoding=False)) == ""


# -- render: the existing views, as text or a file -------------------------------------------------


@pytest.fixture(scope="module")
def failing_report(toy: Fixture) -> Report:
    return api.run(["numpy", LiesAt()], toy, "fp32", decoding=False)


def test_render_text_is_the_terminal_report(failing_report: Report) -> None:
    out = io.StringIO()
    print_report(failing_report, out)
    # after a first line as `parity run`'s, which also marks a written file as parity's (_core/output_paths.py)
    from parity_harness._views.console import fixture_text

    # the first line names the fixture as every view does: parity's own by name, never its installation's path
    assert api.render(failing_report) == f"parity: fixture {fixture_text(failing_report)}\n" + out.getvalue()
    assert f"first divergence at {LYING_TAP}" in out.getvalue()


def test_render_json_is_the_documented_schema(failing_report: Report, tmp_path: Path) -> None:
    text = api.render(failing_report, "json", tmp_path / "r.json")
    assert json.loads(text) == json.loads(json.dumps(report_json(failing_report)))
    assert (tmp_path / "r.json").read_text() == text
    assert json.loads(text)["exit_code"] == 1


def test_render_junit_is_what_write_junit_writes(failing_report: Report, tmp_path: Path) -> None:
    from parity_harness._views.junit import write_junit

    write_junit(failing_report, tmp_path / "cli.xml")
    text = api.render(failing_report, "junit", tmp_path / "api.xml")
    assert (tmp_path / "api.xml").read_bytes() == (tmp_path / "cli.xml").read_bytes() == text.encode()
    failures = [tc for tc in ET.fromstring(text).iter("testcase") if tc.find("failure") is not None]
    assert {tc.get("name") for tc in failures} == {LYING_TAP}


def test_render_markdown_is_the_summary(failing_report: Report, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from parity_harness._views.markdown import markdown_summary

    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    text = api.render(failing_report, "markdown", tmp_path / "r.md")
    assert text == markdown_summary(failing_report) == (tmp_path / "r.md").read_text()
    assert not summary.exists()  # the API writes where it is told, nowhere else


def test_render_replaces_a_file_whole_and_leaves_no_temporary(failing_report: Report, tmp_path: Path) -> None:
    target = tmp_path / "r.txt"
    target.write_text("parity: fixture an earlier render\n")  # parity's own (its first line): replaced whole
    text = api.render(failing_report, "text", target)
    assert target.read_text() == text and text.startswith("parity: fixture fixtures/toy\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.txt"]


@pytest.mark.parametrize(("fmt", "where", "needle"), [
    ("html", None, "fmt 'html': expected one of text, json, junit, markdown"),
    ("json", "missing-dir/r.json", "cannot write the render path (No such file or directory)"),
    ("json", "", "render path: an empty path"),
], ids=["render-unknown-format", "render-unwritable-path", "render-empty-path"])
def test_render_bad_input_is_one_line_parityerror(failing_report: Report, tmp_path: Path, fmt: str,
                                                  where: str | None, needle: str) -> None:
    with pytest.raises(ParityError, match=re.escape(needle)) as caught:
        api.render(failing_report, fmt, None if where is None else str(tmp_path / where) if where else "")  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_render_never_writes_into_the_fixture_directory(tmp_path: Path) -> None:
    fixture = shutil.copytree(default_fixture_dir(), tmp_path / "toy")
    report = api.run("numpy", str(fixture), "fp32", decoding=False)
    before = sorted(p.name for p in fixture.iterdir())
    with pytest.raises(ParityError, match="is inside the fixture directory") as caught:
        api.render(report, "json", fixture / "manifest.json")
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in fixture.iterdir()) == before
    assert (fixture / "manifest.json").read_bytes() == (default_fixture_dir() / "manifest.json").read_bytes()


def test_assert_message_is_made_safe_at_its_sink(toy: Fixture) -> None:
    """A case name from outside with an escape sequence and a carriage return cannot fake a line."""
    report = api.run(LiesAt(), toy, "fp32", decoding=False)
    report.divergences[0].case = "evil\x1b[2K\rPASS"
    message = api.failure_message(report)
    assert "\x1b" not in message and "\r" not in message
    assert "evil\\x1b[2K PASS" in message.splitlines()[0]
    assert len(message.splitlines()) == 1 + len(report.divergences) + 1


# -- plugin: pytest with the `parity` fixture, in a subprocess -------------------------------------


def copy_example(dest: Path) -> Path:
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    return dest


def test_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"parity": "parity_harness.pytest_plugin"}


def test_plugin_import_is_cheap() -> None:
    code = ("import sys, parity_harness.pytest_plugin; heavy = [m for m in ('numpy', 'torch', 'onnx', 'onnxruntime', "
            "'safetensors', 'parity_harness.api', 'parity_harness._fixture.fixture') if m in sys.modules]; "
            "print(heavy)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_plugin_the_example_suite_passes(tmp_path: Path) -> None:
    proc = run_pytest(copy_example(tmp_path / "example"), *plugin_args(), "-q")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "5 passed" in proc.stdout


def test_plugin_a_lying_port_fails_naming_the_tap(tmp_path: Path) -> None:
    example = copy_example(tmp_path / "example")
    proc = run_pytest(example, *plugin_args(), "-q", "demo", "--junitxml", str(tmp_path / "junit.xml"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    shown = [ln for ln in proc.stdout.splitlines() if ln.startswith("E ") and "ParityAssertionError" in ln]
    assert len(shown) == 1, proc.stdout[-3000:]  # the message's first line, on pytest's "E" line
    assert shown[0].split(None, 1)[1].startswith(
        f"parity_harness.api.ParityAssertionError: first divergence at {LYING_TAP}: lying-port fp64 vs fp64"), shown
    assert "1 failed" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    failure = ET.parse(tmp_path / "junit.xml").getroot().find(".//testcase/failure")
    assert failure is not None
    assert LYING_TAP in failure.get("message", "").splitlines()[0]


PROBE = '''
from pathlib import Path


def test_which_fixture(parity):
    print("PARITY-FIXTURE", Path(parity.fixture.root).resolve())
'''


def test_plugin_fixture_selection_option_ini_default(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "test_probe.py").write_text(PROBE)
    stress = REPO / "fixtures" / "toy-stress"
    copy = shutil.copytree(stress, project / "sub" / "stress")

    def chosen(*args: str) -> str:
        proc = run_pytest(project, *plugin_args(), "-q", "-s", *args)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return next(ln for ln in proc.stdout.splitlines() if ln.startswith("PARITY-FIXTURE")).split(" ", 1)[1]

    (project / "pytest.ini").write_text("[pytest]\n")
    assert chosen() == str(default_fixture_dir().resolve())  # the toy
    (project / "pytest.ini").write_text("[pytest]\nparity_fixture = sub/stress\n")  # relative to the ini file
    assert chosen() == str(copy.resolve())
    assert chosen("--parity-fixture", str(stress)) == str(stress.resolve())  # the option wins over the ini


def test_plugin_a_broken_fixture_is_one_line_at_setup(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    proc = run_pytest(tmp_path, *plugin_args(), "-q", "--parity-fixture", "nowhere")
    assert proc.returncode == 1, proc.stdout[-2000:]
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("parity: error: ")]
    assert errors == [f"parity: error: {tmp_path / 'nowhere'}: fixture directory not found"], proc.stdout
    assert "1 error" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    assert "during handling" not in proc.stdout.lower()


def test_plugin_a_crashing_backend_fails_the_test_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "test_crash.py").write_text(
        "from parity_harness._backends.numpy_backend import NumpyBackend\n\n"
        "class Crashes(NumpyBackend):\n    name = 'crashes'\n\n"
        "    def run(self, fixture, precision):\n        raise RuntimeError('out of cheese')\n\n"
        "def test_crash(parity):\n    parity.assert_agrees(Crashes())\n")
    proc = run_pytest(tmp_path, *plugin_args(), "-q")
    assert proc.returncode == 1, proc.stdout[-2000:]
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("parity: error: ")]
    assert errors == ["parity: error: backend 'crashes' crashed in run (fp32): RuntimeError: out of cheese"], \
        proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


# -- install: a real pip install of the checkout, the example's suite through the entry point -------

INSTALLED = ("pyproject.toml", "README.md", "harness", "reference", "ts_model", "fixtures/toy", "fixtures/toy-stress")


@pytest.fixture(scope="module")
def installed_python(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A fresh virtualenv with a copy of the checkout `pip install -e`-ed (the source tree stays clean); numpy,
    torch and pytest come from this environment (a .pth file, tests/helpers.py's make_child_env).
    (python, checkout copy)."""
    work = tmp_path_factory.mktemp("api_env")
    src = work / "parity"
    for name in INSTALLED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    python = make_child_env(work / "venv")
    proc = subprocess.run(pip_install_command(python, "-e", str(src)), capture_output=True, text=True, timeout=300,
                          cwd=work, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]  # its time: no verdict (issue 26)
    return python, src


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PARITY_TS_DIR")}


def test_install_the_example_suite_passes_through_the_entry_point(installed_python: tuple[Path, Path],
                                                                 tmp_path: Path) -> None:
    python, src = installed_python
    example = copy_example(tmp_path / "example")
    where = subprocess.run([str(python), "-c", "import parity_harness, importlib.metadata as m; "
                            "print(parity_harness.__file__); "
                            "print(sorted(e.value for e in m.entry_points(group='pytest11') if e.name == 'parity'))"],
                           capture_output=True, text=True, cwd=example, env=child_env(), timeout=300, check=False)
    init = src / "harness" / "parity_harness" / "__init__.py"
    assert where.stdout.splitlines() == [str(init), "['parity_harness.pytest_plugin']"], \
        where.stdout + where.stderr
    proc = run_pytest(example, "-q", python=str(python), env=child_env())  # no -p: the entry point loads it
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "5 passed" in proc.stdout


def test_install_the_lying_example_fails_naming_the_tap(installed_python: tuple[Path, Path], tmp_path: Path) -> None:
    python, _ = installed_python
    proc = run_pytest(copy_example(tmp_path / "example"), "-q", "demo", python=str(python), env=child_env())
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"ParityAssertionError: first divergence at {LYING_TAP}: lying-port fp64 vs fp64" in proc.stdout

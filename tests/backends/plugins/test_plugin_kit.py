"""The plugin author's kit (issue 24, item 4): a crash's traceback under -v, the report of the runs before a
crash (refused by merge), per-case progress, the hang guard (PARITY_BACKEND_TIMEOUT), and check-backend
judging every built-in backend by the contract that applies to it.

The fakes are registered as `parity.backends` entry points in-process (as tests/backends/plugins/test_bad_backends.py
does) and driven through `parity_harness._cli.main.main`, the real `parity run` code path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import parity_harness._backends.registry
import parity_harness._cli.main
from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._core.errors import FixtureError
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._tools.conformance import check_backend
from tests.helpers import GIVEN_GRAPH, REPO, TOY, cli_with_backends

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

BUILT_INS = ["numpy", "pytorch", "onnxruntime", "onnxruntime-optimized", "onnx-reference", "typescript",
             "typescript-browser", "onnxruntime-web", "onnxruntime-web-optimized", "onnxruntime-webgpu",
             "hf-transformers", "openvino", "transformerlens", "torch-compile", "jax", "llama-cpp", "onnx-file"]


class Perfect(Backend):
    """The float64 golden, copied: agrees on every tap."""

    name: ClassVar[str] = "kit-perfect"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp64",)

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return {c: {t: a.copy() for t, a in taps.items()} for c, taps in fixture.golden(precision).items()}


class Crashes(Perfect):
    name: ClassVar[str] = "kit-crashes"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        def compile_graph() -> None:
            raise RuntimeError("C++ compile error\n  step 1\n  step 2\n  step 3\n  step 4\n"
                               "  the cause: \x1b[31mmissing header kit.h\x1b[0m")
        compile_graph()
        return {}


class RaisesParityError(Perfect):
    name: ClassVar[str] = "kit-bad-input"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        raise FixtureError("case 'x': token id 99 out of range [0, 12)")


class Streams(Perfect):
    name: ClassVar[str] = "kit-streams"
    streams: ClassVar[bool] = True
    delay: ClassVar[float] = 0.0

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        for case, taps in fixture.golden(precision).items():
            time.sleep(self.delay)
            yield case, {t: a.copy() for t, a in taps.items()}


class Hangs(Perfect):
    name: ClassVar[str] = "kit-hangs"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        time.sleep(600)
        return super().run(fixture, precision)


FAKES = [Perfect, Crashes, RaisesParityError, Streams, Hangs]


@pytest.fixture
def parity(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """`parity ARGS` in-process, with the fakes registered: (exit code, stdout, stderr)."""
    return cli_with_backends(monkeypatch, capsys, __name__, FAKES)


def errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("parity: error:")]


# -- 1. a crash's full traceback under -v ---------------------------------------------------------


def test_a_crash_is_one_line_and_its_traceback_shows_under_verbose(parity: Callable[..., tuple[int, str, str]]) -> None:
    code, _out, err = parity("run", "--backends", "kit-crashes", "-q")
    assert code == 2 and err.splitlines() == errors(err) and len(errors(err)) == 1, err
    assert "crashed in run (fp64): RuntimeError: C++ compile error (-v shows its traceback)" in err
    assert "the cause" not in err and "Traceback" not in err

    code, _out, err = parity("run", "--backends", "kit-crashes", "-q", "-v")
    assert code == 2 and len(errors(err)) == 1 and err.startswith("parity: error: "), err
    assert "-v shows" not in err
    assert "Traceback (most recent call last)" in err and "in compile_graph" in err
    assert "the cause: \\x1b[31mmissing header kit.h\\x1b[0m" in err  # the cause, six lines down, sanitized
    assert "\x1b" not in err


def test_a_parity_error_never_gets_a_traceback(parity: Callable[..., tuple[int, str, str]]) -> None:
    code, _out, err = parity("run", "--backends", "kit-bad-input", "-q", "-v")
    assert code == 2 and err.splitlines() == ["parity: error: case 'x': token id 99 out of range [0, 12)"], err


# -- 2. the report of the runs before a crash ----------------------------------------------------


def test_a_crash_keeps_the_report_of_the_backends_that_ran(parity: Callable[..., tuple[int, str, str]],
                                                           tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    code, out, err = parity("run", "--backends", "kit-perfect,kit-crashes", "-q", "--json", str(report))
    assert code == 2 and len(errors(err)) == 1 and "'kit-crashes' crashed" in err, err
    assert any(ln.startswith("kit-perfect ") and " ok " in ln for ln in out.splitlines())  # the backend that ran
    assert "kit-crashes fp64: CRASHED after" in out
    assert "ERROR: backend kit-crashes crashed (fp64)" in out and "PASS" not in out
    data = json.loads(report.read_text())
    assert data["usable"] is True and data["passed"] is False and data["exit_code"] == 2
    assert data["counts"]["passed"] > 0 and data["counts"]["failed"] == 0
    crashed = [r for r in data["runs"] if r["status"] == "crashed"]
    assert [(r["backend"], r["precision"]) for r in crashed] == [("kit-crashes", "fp64")]
    assert "RuntimeError: C++ compile error" in crashed[0]["message"]

    code, _out, err = parity("merge", str(report))
    assert code == 2 and err.splitlines() == errors(err) and len(errors(err)) == 1, err
    assert str(report) in err and "kit-crashes crashed (fp64)" in err and "not merged" in err


def test_a_report_edited_to_pass_is_still_refused_by_its_crashed_run(parity: Callable[..., tuple[int, str, str]],
                                                                     tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    parity("run", "--backends", "kit-perfect,kit-crashes", "-q", "--json", str(report))
    data = json.loads(report.read_text())
    data["passed"], data["exit_code"] = True, 0
    report.write_text(json.dumps(data))
    code, _out, err = parity("merge", str(report))
    assert code == 2 and "crashed" in err and "not merged" in err, err


def test_a_crash_before_any_backend_ran_leaves_the_unusable_marker(parity: Callable[..., tuple[int, str, str]],
                                                                   tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    code, out, err = parity("run", "--backends", "kit-crashes,kit-perfect", "-q", "--json", str(report))
    assert code == 2 and len(errors(err)) == 1 and "PASS" not in out, err
    data = json.loads(report.read_text())
    assert data["usable"] is False and "crashed" in data["error"]


# -- 3. progress and the hang guard -------------------------------------------------------------


def test_a_streaming_backend_reports_each_case(parity: Callable[..., tuple[int, str, str]]) -> None:
    n = len(load_fixture(TOY).cases)
    from parity_harness import api

    said: list[str] = []  # every progress message (the CLI prints only those of work over a second)
    assert api.run(["kit-streams", "kit-perfect"], TOY, progress=said.append).passed
    lines = [ln for ln in said if ln.startswith("parity: kit-streams fp64: case ")]
    assert [ln.split("case ")[1].split(" ")[0] for ln in lines] == [f"{k}/{n}" for k in range(1, n + 1)]
    assert not [ln for ln in said if ln.startswith("parity: kit-perfect fp64: case")]  # `run`: at once
    code, _out, err = parity("run", "--backends", "kit-streams", "-q")
    assert code == 0 and "case 1/" not in err


HANG_SCRIPT = """
import sys
from importlib.metadata import EntryPoint
import parity_harness._backends.registry as registry
import parity_harness._cli.main as cli
import tests.backends.plugins.test_plugin_kit as kit

real = registry.backend_entry_points()
registered = {**real, **{c.name: EntryPoint(c.name, f"tests.backends.plugins.test_plugin_kit:{c.__name__}",
                                             registry.GROUP)
                         for c in kit.FAKES}}
registry.backend_entry_points = lambda: registered
cli.backend_entry_points = lambda: registered
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_hung_backend_ends_the_run_in_one_line() -> None:
    """In a child process (the SIGALRM timer is the process's own): a call that never returns is stopped."""
    from tests.helpers import REPO

    env = {**os.environ, "PARITY_BACKEND_TIMEOUT": "0.2", "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", HANG_SCRIPT, "run", "--backends", "kit-hangs", "-q"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)
    err = proc.stderr
    assert proc.returncode == 2 and len(errors(err)) == 1 and err.splitlines() == errors(err), err
    assert "backend 'kit-hangs' did not return from run (fp64)" in err and "PARITY_BACKEND_TIMEOUT" in err


def test_the_deadline_scales_with_the_cases_a_call_computes(parity: Callable[..., tuple[int, str, str]],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline asked of the timer: PARITY_BACKEND_TIMEOUT x the cases a call computes (a `run` call of
    every case), once per streamed case. Read from the timer's arguments, so no verdict depends on timing."""
    import signal

    asked: list[float] = []
    real_setitimer = signal.setitimer

    def record(which: int, seconds: float, interval: float = 0.0) -> tuple[float, float]:
        if seconds:
            asked.append(seconds)
        return real_setitimer(which, 0, 0)  # never actually armed: the backends below return at once

    monkeypatch.setattr(signal, "setitimer", record)
    monkeypatch.setenv("PARITY_BACKEND_TIMEOUT", "7")
    n = len(load_fixture(TOY).cases)
    code, out, err = parity("run", "--backends", "kit-perfect", "--precision", "fp64", "-q")
    assert code == 0 and "PASS" in out, err
    assert 7.0 * n in asked, asked  # the one `run` call of every case
    asked.clear()
    code, out, err = parity("run", "--backends", "kit-streams", "--precision", "fp64", "-q")
    assert code == 0 and "PASS" in out, err
    assert asked.count(7.0) >= n and 7.0 * n not in asked, asked  # one deadline per streamed case


def test_a_bad_timeout_is_one_line(parity: Callable[..., tuple[int, str, str]],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_BACKEND_TIMEOUT", "soon")
    code, _out, err = parity("run", "--backends", "kit-perfect", "-q")
    assert code == 2 and err.splitlines() == ["parity: error: PARITY_BACKEND_TIMEOUT='soon' must be a positive "
                                              "number of seconds"], err


# -- 4. check-backend: the contract that applies -------------------------------------------------


def test_the_list_is_every_registered_built_in() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert sorted(project["entry-points"]["parity.backends"]) == sorted(BUILT_INS)


@pytest.mark.parametrize("name", BUILT_INS)
def test_every_built_in_backend_passes_its_own_kit(name: str) -> None:
    backend = parity_harness._backends.registry.load_backend(name)
    if name in GIVEN_GRAPH:  # a user's graph: the toy's own logits graph stands for one (check-backend --onnx)
        from parity_harness._run.request import onnx_backend

        backend = onnx_backend(TOY / "model.logits.onnx", None)  # type: ignore[assignment]
    why = backend.unavailable()
    if why:
        pytest.skip(why)
    results = check_backend(backend, load_fixture(TOY))
    assert {r.name: r.message for r in results if not r.passed} == {}
    assert len(results) > 10


class GraphPlugin(Backend):
    """A graph backend as a plugin author writes one: model.onnx on onnxruntime, never reading the weights."""

    name: ClassVar[str] = "kit-graph"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32",)
    runs_graph: ClassVar[bool] = True

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        from parity_harness.plugin import expected_outputs, ort_runner, run_cases

        path = fixture.onnx_path("all_taps")
        if path is None:
            raise FixtureError("no model.onnx")
        return run_cases(fixture, path, expected_outputs(fixture.tap_names, "all_taps"), ort_runner(path))


class GraphPluginUndeclared(GraphPlugin):
    runs_graph: ClassVar[bool] = False


def test_a_graph_backend_is_not_asked_to_read_weights() -> None:
    pytest.importorskip("onnxruntime")
    fixture = load_fixture(TOY)
    results = check_backend(GraphPlugin(), fixture)
    assert {r.name: r.message for r in results if not r.passed} == {}
    assert "rejects a fixture without its ONNX graph" in [r.name for r in results]
    # Without the declaration, it is judged as a weights reader, and it reads no weights:
    failed = {r.name for r in check_backend(GraphPluginUndeclared(), fixture) if not r.passed}
    assert failed == {"rejects a truncated weights file", "rejects weights missing a tensor (ln_f.bias)"}


def test_runs_graph_must_be_a_bool() -> None:
    class Odd(Perfect):
        runs_graph = "yes"  # type: ignore[assignment]

    results = check_backend(Odd(), load_fixture(TOY))
    assert not results[0].passed and "runs_graph must be True or False" in results[0].message

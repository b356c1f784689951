"""The JSON report against its schema file (parity_harness/_views/report.schema.json), and non-finite numbers.

Real reports (a passing run with decoding, a failing one with infinite errors, a dump comparison, a merge, the
unusable marker) must conform; documents that break it must not. An infinite error is written as null and named
in the row's `nonfinite` member, and `parity merge` reads the value back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from parity_harness import api
from parity_harness._backends.base import BackendOutput, Precision
from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._fixture.fixture import Fixture
from parity_harness._run.merge import merge_reports
from parity_harness._views.console import report_json, unusable_json
from parity_harness._views.report_schema import report_problems
from tests.helpers import run_cli

BROKEN_TAP = "blocks.0.hook_attn_out"


class WrongShape(NumpyBackend):
    """The NumPy forward pass with one tap of the wrong shape: a structural failure, infinite errors."""

    name = "wrong-shape"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        out = dict(self.run_cases(fixture, precision))
        for taps in out.values():
            taps[BROKEN_TAP] = np.zeros((1,), dtype=taps[BROKEN_TAP].dtype)
        return out


class Crashes(NumpyBackend):
    """A backend whose run raises: the report keeps what ran before it, and does not pass."""

    name = "crashes-in-run"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        raise RuntimeError("out of cheese")


@pytest.fixture(scope="module")
def passing() -> dict:  # type: ignore[type-arg]
    doc: dict = json.loads(api.render(api.run(NumpyBackend(), None, "all"), "json"))  # type: ignore[type-arg]
    return doc


@pytest.fixture(scope="module")
def failing() -> dict:  # type: ignore[type-arg]
    doc: dict = json.loads(api.render(api.run(WrongShape(), None, "fp32", decoding=False), "json"))  # type: ignore[type-arg]
    return doc


def test_a_passing_run_with_decoding_conforms(passing: dict) -> None:  # type: ignore[type-arg]
    assert passing["passed"] is True and "decoding" in passing
    assert report_problems(passing) == []


def test_a_failing_run_names_its_infinite_errors_and_conforms(failing: dict) -> None:  # type: ignore[type-arg]
    assert failing["passed"] is False and failing["exit_code"] == 1
    rows = [r for r in failing["results"] if r["tap"] == BROKEN_TAP]
    assert rows and all(r["max_abs"] is None and r["nonfinite"]["max_abs"] == "inf" for r in rows)
    finite_rows = [r for r in failing["results"] if r["tap"] != BROKEN_TAP]
    assert finite_rows and all("nonfinite" not in r for r in finite_rows)
    assert report_problems(failing) == []


def test_a_report_kept_after_a_crash_conforms() -> None:
    report = api.run([NumpyBackend(), Crashes()], None, "fp32", decoding=False, keep_on_crash=True)
    doc = json.loads(api.render(report, "json"))
    assert doc["passed"] is False and doc["exit_code"] == 2
    assert [r["status"] for r in doc["runs"]] == ["ran", "crashed"]
    assert report_problems(doc) == []


def test_merge_reads_an_infinity_back(failing: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    path = tmp_path / "failing.json"
    path.write_text(json.dumps(failing), encoding="utf-8")
    merged = merge_reports([path])
    rows = [r for r in merged.results if r.tap == BROKEN_TAP]
    assert rows and all(r.max_abs == math.inf for r in rows)
    assert report_problems(report_json(merged)) == []


def test_merge_refuses_a_nonfinite_that_contradicts_its_value(failing: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    doc = json.loads(json.dumps(failing))
    row = next(r for r in doc["results"] if r["tap"] == BROKEN_TAP)
    row["max_abs"] = 0.5  # a number, but nonfinite still says "inf"
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    proc = run_cli("merge", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "nonfinite names it 'inf'" in proc.stderr and str(path) in proc.stderr


def test_a_dump_comparison_and_the_unusable_marker_conform(tmp_path: Path, toy_dir: Path) -> None:
    dumps = tmp_path / "dumps"
    proc = run_cli("run", "--backends", "numpy", "--precision", "fp32", "-q", "--save-outputs", str(dumps))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "compare.json"
    proc = run_cli("compare", *[str(p) for p in sorted(dumps.glob("*.safetensors"))], "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report_problems(json.loads(out.read_text(encoding="utf-8"))) == []
    assert report_problems(unusable_json("run", "a one-line error", 2, str(toy_dir))) == []


@pytest.mark.parametrize(("what", "change"), [
    ("exit_code a string", lambda d: d.update(exit_code="0")),
    ("an unknown status", lambda d: d["results"][0].update(status="maybe")),
    ("a nonfinite of an unknown kind", lambda d: d["results"][0].update(nonfinite={"max_abs": "huge"})),
    ("no results", lambda d: d.pop("results")),
    ("an unusable marker that passed", lambda d: d.update(usable=False)),
])
def test_documents_that_break_the_schema_do_not_conform(passing: dict, what: str, change) -> None:  # type: ignore[no-untyped-def,type-arg]
    doc = json.loads(json.dumps(passing))
    change(doc)
    assert report_problems(doc), what

"""pytest failures as good as `torch.testing.assert_close`'s (issue 37, item 9; item 8's digits).

A failing `parity.assert_agrees` in a pytest subprocess: the short summary line leads with the tap (not with
`parity_harness.api.ParityAssertionError:`) and names the case, the index, both values, the mismatch count and
fraction and the allowed bound as a number; the failure is short. Values print with the digits that tell them
apart (`format_pair`).
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from parity_harness._compare.judge import FirstDivergence
from parity_harness._compare.report import Report
from tests.helpers import plugin_args, run_pytest

TAP = "blocks.1.hook_resid_mid"

SUITE = f'''
from parity_harness._backends.numpy_backend import NumpyBackend


class Lying(NumpyBackend):
    name = "lying-numpy"

    def run(self, fixture, precision):
        out = super().run(fixture, precision)
        for taps in out.values():
            taps["{TAP}"] = taps["{TAP}"] + 1e-3
        return out


def test_assert_agrees(parity):
    parity.assert_agrees(Lying(), precision="fp64", decoding=False)


def test_the_report_idiom(parity):
    report = parity.run(Lying(), precisions="fp64", decoding=False)
    parity.assert_agrees(report)
'''


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("suite")
    (root / "test_lying.py").write_text(textwrap.dedent(SUITE))
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER", "PYTEST_ADDOPTS")}
    env["COLUMNS"] = "80"  # a terminal 80 columns wide: pytest cuts the summary line there
    proc = run_pytest(root, *plugin_args(), "-rf", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc.stdout


def _summary_line(out: str, test: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith(f"FAILED test_lying.py::{test}")]
    assert len(lines) == 1, out
    return lines[0]


def _failure(out: str, test: str) -> str:
    """The test's failure section: from its '___ test ___' header to the next header or the summary."""
    sections = re.split(r"^_{3,} (\w+) _{3,}$", out, flags=re.M)
    return re.split(r"^={5,}", sections[sections.index(test) + 1], flags=re.M)[0].strip("\n")


@pytest.mark.parametrize("test", ["test_assert_agrees", "test_the_report_idiom"])
def test_the_summary_line_at_80_columns_leads_with_the_tap(failing_run: str, test: str) -> None:
    line = _summary_line(failing_run, test)
    assert len(line) <= 80 and "ParityAssertionError" not in line, line  # not the exception's dotted name
    assert line.split(" - ", 1)[1].startswith(f"{TAP}: "), line


@pytest.mark.parametrize("test", ["test_assert_agrees", "test_the_report_idiom"])
def test_the_first_line_says_what_assert_close_says(failing_run: str, test: str) -> None:
    shown = [ln for ln in _failure(failing_run, test).splitlines() if ln.startswith("E ")]
    head = shown[0].split(None, 1)[1]
    assert head.startswith(f"parity_harness.api.ParityAssertionError: first divergence at {TAP}: lying-numpy fp64 "
                           "vs fp64, case "), head
    assert re.search(r"case \w+, index \[\d+, \d+\]: ", head), head
    assert re.search(r"got -?[\d.e+-]+, expected -?[\d.e+-]+ ", head), head
    assert re.search(r"\(\|diff\| 1\.0e-03, rel \d\.\de[+-]\d\d > allowed \d\.\de-\d\d\)", head), head
    assert re.search(r"; \d+ of \d+ cells \([\d.]+%\) out of tolerance", head), head  # count and fraction


def test_the_report_idiom_fails_short_naming_the_tap(failing_run: str) -> None:
    """`parity.assert_agrees(report)` after `parity.run`: the message, not the whole report and its repr."""
    body = _failure(failing_run, "test_the_report_idiom")
    assert len(body.splitlines()) < 25, body
    assert "Report(" not in body and "Traceback" not in body, body  # no repr of the whole Report
    assert f"ParityAssertionError: first divergence at {TAP}: " in body, body


def test_format_pair_shows_the_digits_that_differ() -> None:
    from parity_harness._core.text import format_pair

    got, want = format_pair(-2.43359562123, -2.43359562123 + 7.8e-12)
    assert got != want and len(got.lstrip("-").replace(".", "")) >= 9
    assert format_pair(0.51, 0.5) == ("0.51", "0.5")  # at least 9 significant digits, no padding
    assert format_pair(1.0, 1.0 + 2**-52) == ("1", "1.0000000000000002")  # up to repr precision
    assert format_pair(2.0, 2.0) == ("2", "2")


def test_an_fp64_divergence_prints_digits_that_differ_in_the_failure_message() -> None:
    from parity_harness.api import failure_message

    d = FirstDivergence("my-port", "fp64", "fp64", TAP, "case_0", [0, 1], -2.43359562123 + 7.8e-12,
                        -2.43359562123, 7.8e-12, 1e-12, "", 0, 0.0, {"case_0": TAP}, 3)
    from parity_harness._compare.judge import CheckResult
    from parity_harness._core.status import Status

    row = CheckResult("my-port", "fp64", "fp64", "case_0", TAP, Status.FAIL, False, 1e-12, 0.0, 7.8e-12,
                      index=[0, 1], actual=d.actual, expected=d.expected, n_bad=3)
    report = Report(fixture=str(Path("toy")), results=[row], divergences=[d])
    first = failure_message(report).splitlines()[0]
    got = re.search(r"got (\S+), expected (\S+) ", first)
    assert got is not None and got.group(1) != got.group(2), first

"""JUnit and Markdown show the decoding check too, from the same records as the forward taps."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._compare.report import Report
from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest
from parity_harness._fixture.fixture import Fixture, default_fixture_dir, load_fixture
from parity_harness._run.runner import run_parity
from parity_harness._views.junit import junit_element
from parity_harness._views.markdown import markdown_summary


class WrongLogitsWhenDecoding(NumpyBackend):
    """The forward pass is right; every decoded logit is off by 0.5."""

    name = "wrong-decoding"

    def decode(self, fixture: Fixture, precision: Any, requests: list[DecodeRequest] | None = None) -> DecodeOutput:
        out = super().decode(fixture, precision, requests)
        return {p: {k: a + 0.5 if k.endswith("/logits") else a for k, a in s.items()} for p, s in out.items()}


@pytest.fixture(scope="module")
def reports() -> dict[str, Report]:
    fixture = load_fixture(default_fixture_dir())
    return {"good": run_parity(fixture, [NumpyBackend()], ["fp64"], progress=None, budget=False),
            "bad": run_parity(fixture, [WrongLogitsWhenDecoding()], ["fp64"], progress=None, budget=False)}


def suites(report: Report) -> dict[str, ET.Element]:
    return {s.get("name", ""): s for s in junit_element(report).iter("testsuite")}


def test_junit_has_a_suite_per_decoding_tier_and_for_greedy_tokens(reports: dict[str, Report]) -> None:
    good = suites(reports["good"])
    assert {"parity.numpy.fp64_vs_fp64.decoding", "parity.numpy.fp64_vs_fp32.decoding",
            "parity.numpy.fp64.greedy"} <= set(good)
    decoding = good["parity.numpy.fp64_vs_fp64.decoding"]
    assert {c.get("name") for c in decoding.iter("testcase")} == set(reports["good"].decoding.taps)  # type: ignore[union-attr]
    assert all(s.get("failures") == "0" for s in good.values())
    assert len(list(good["parity.numpy.fp64.greedy"].iter("testcase"))) == 4  # the toy's prompts


def test_junit_fails_the_decoding_tap_that_disagrees_and_counts_it(reports: dict[str, Report]) -> None:
    root = junit_element(reports["bad"])
    bad = suites(reports["bad"])
    forward = bad["parity.wrong-decoding.fp64_vs_fp64"]
    assert forward.get("failures") == "0"  # the forward pass is right
    decoding = bad["parity.wrong-decoding.fp64_vs_fp64.decoding"]
    failing = [c for c in decoding.iter("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failing] == ["logits"]
    failure = failing[0].find("failure")
    assert failure is not None and "prompt x step checks out of tolerance" in failure.get("message", "")
    assert failure.text is not None and "step 0" in failure.text
    assert int(root.get("failures", "0")) == sum(int(s.get("failures", "0")) for s in bad.values()) >= 2


def test_markdown_has_the_decoding_table_and_its_first_divergence(reports: dict[str, Report]) -> None:
    good, bad = markdown_summary(reports["good"]), markdown_summary(reports["bad"])
    assert "### Decoding (4 prompts, prefill + 6 steps" in good
    assert "Greedy tokens: 4 of 4 backend x prompt runs equal the golden's." in good
    assert "| wrong-decoding | fp64 vs fp64 | FAIL |" in bad
    assert "decoding fp64 vs fp64: first divergence at step 0 (prefill), logits" in bad

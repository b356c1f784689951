"""The example's suite: the port agrees with parity's goldens, and a lying port is caught at its tap."""

from __future__ import annotations

import pytest
from my_port import LyingPort, MyPort


def test_the_builtin_numpy_backend_agrees(parity):
    parity.assert_agrees("numpy", precision="all")  # a registered backend, by name


def test_my_port_agrees_in_float64(parity):
    report = parity.assert_agrees(MyPort(), precision="fp64")
    assert report  # truthy: it passed (and something was compared)


def test_a_lying_port_is_caught_at_the_tap_it_lies_on(parity):
    with pytest.raises(parity.ParityAssertionError) as caught:
        parity.assert_agrees(LyingPort(), precision="fp64")
    first_line = str(caught.value).splitlines()[0]
    assert first_line.startswith(f"first divergence at {LyingPort.tap}:"), first_line
    assert not caught.value.report  # the Report it failed on is attached, and falsy


def test_asking_for_a_precision_the_port_does_not_compute_in_is_not_a_pass(parity):
    class Fp64Only(MyPort):
        name = "fp64-only-port"
        precisions = ("fp64",)

    # refused before anything runs, as `parity run --backends fp64-only-port --precision fp32` refuses it
    with pytest.raises(pytest.fail.Exception, match=r"^parity: error: nothing to compare"):
        parity.assert_agrees(Fp64Only(), precision="fp32")


def test_several_backends_in_one_report_for_ci(parity, tmp_path):
    report = parity.run(["numpy", MyPort()], precisions="fp64", decoding=False)
    parity.assert_agrees(report)  # on failure, the first divergence in one paragraph (not the whole report)
    xml = parity.render(report, "junit", tmp_path / "parity.xml")  # one testcase per backend x tier x tap
    assert xml.count("<testcase ") == 2 * 2 * 43

"""Not part of the example's suite (testpaths): `pytest demo/` shows a real failure, naming the tap."""

from __future__ import annotations

from my_port import LyingPort


def test_the_lying_port_agrees(parity):
    parity.assert_agrees(LyingPort(), precision="fp64")

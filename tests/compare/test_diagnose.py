"""Diagnosis (parity_harness/_compare/diagnose.py): each pattern planted in real golden tensors is named, and
a near miss of it is not; then through `parity run`: a plugin that rounds one float64 tap through float32
is caught in the fp64 tier, and the divergence paragraph names the pattern.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import parity_harness._backends.registry
import parity_harness._cli.main
from parity_harness._backends.base import Precision
from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._compare.diagnose import (
    MISSING_MASK,
    NOT_CORRECTLY_ROUNDED,
    PREVIOUS_TAP,
    ROUNDED_F32,
    SHIFTED,
    SIGN_FLIPPED,
    diagnose,
)
from parity_harness._fixture.fixture import Fixture, default_fixture_dir, load_fixture
from parity_reference.numpy_model import sinusoidal_positions

CASE = "grammar_1"
FP64_ATOL, FP32_ATOL, FP32_RTOL = 1e-12, 1e-5, 1e-5


@pytest.fixture(scope="module")
def fx() -> Fixture:
    return load_fixture(default_fixture_dir())


def golden(fx: Fixture, tier: Precision, tap: str) -> np.ndarray:
    return np.array(fx.golden_case(tier, CASE)[tap])


def positions_in_float32(n_pos: int, d_model: int) -> np.ndarray:
    """The sinusoid table computed in float32 arithmetic throughout (what OpenVINO's CPU plugin does)."""
    pos = np.arange(n_pos, dtype=np.float32)[:, None]
    pair = np.arange(0, d_model, 2, dtype=np.float32)
    inv_freq = np.power(np.float32(10000.0), -pair / np.float32(d_model))
    angle = pos * inv_freq
    table = np.zeros((n_pos, d_model), dtype=np.float32)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle)
    return table


def test_rounded_to_float32_is_named_in_the_fp64_tier(fx: Fixture) -> None:
    expected = golden(fx, "fp64", "blocks.0.attn.hook_q")
    rounded = expected.astype(np.float32).astype(np.float64)
    assert ROUNDED_F32 in diagnose(rounded, expected, "fp64", atol=FP64_ATOL)
    # A near miss: off by as much, but not the rounded value.
    near = expected + np.where(rounded != expected, np.abs(rounded - expected), 0.0)
    assert ROUNDED_F32 not in diagnose(near, expected, "fp64", atol=FP64_ATOL)


def test_not_correctly_rounded_is_named_against_the_truth(fx: Fixture) -> None:
    truth, golden32 = golden(fx, "fp64", "hook_pos_embed"), golden(fx, "fp32", "hook_pos_embed")
    planted = positions_in_float32(*truth.shape).astype(np.float64)
    got = diagnose(planted, truth, "fp64", atol=FP64_ATOL, truth=truth, golden32=golden32)
    assert NOT_CORRECTLY_ROUNDED in got and ROUNDED_F32 not in got, got
    # The correctly rounded table is the other pattern; a wrong value (1% off) is not a rounding problem.
    correct = golden32.astype(np.float64)
    assert diagnose(correct, truth, "fp64", atol=FP64_ATOL, truth=truth, golden32=golden32) == [ROUNDED_F32]
    assert NOT_CORRECTLY_ROUNDED not in diagnose(truth * 1.01, truth, "fp64", atol=FP64_ATOL, truth=truth,
                                                 golden32=golden32)


def test_shifted_position_is_named(fx: Fixture) -> None:
    expected = golden(fx, "fp32", "hook_pos_embed")
    n_pos, d_model = expected.shape
    off_by_one = sinusoidal_positions(n_pos + 1, d_model, np.float32)[1:]  # positions 1..T instead of 0..T-1
    assert SHIFTED in diagnose(off_by_one, expected, "fp32", atol=FP32_ATOL, rtol=FP32_RTOL, position_axis=0)
    lagging = np.concatenate([expected[:1], expected[:-1]])  # position t holds t-1
    assert SHIFTED in diagnose(lagging, expected, "fp32", atol=FP32_ATOL, rtol=FP32_RTOL, position_axis=0)
    # Mostly unexplained: position 0 wrong in every dim, one cell of position 3 holding position 2's value.
    mostly_other = expected.copy()
    mostly_other[0] += np.float32(1.0)
    mostly_other[3, 0] = expected[2, 0]
    assert SHIFTED not in diagnose(mostly_other, expected, "fp32", atol=FP32_ATOL, rtol=FP32_RTOL, position_axis=0)
    reversed_ = expected[::-1].copy()  # wrong positions, but not by one
    assert SHIFTED not in diagnose(reversed_, expected, "fp32", atol=FP32_ATOL, rtol=FP32_RTOL, position_axis=0)


def test_sign_flip_is_named(fx: Fixture) -> None:
    expected = golden(fx, "fp32", "blocks.0.hook_attn_out")
    assert diagnose(-expected, expected, "fp32", atol=FP32_ATOL, rtol=FP32_RTOL) == [SIGN_FLIPPED]
    assert SIGN_FLIPPED not in diagnose(-0.5 * expected, expected, "fp32", atol=FP32_ATOL, rtol=FP32_RTOL)


def test_missing_mask_is_named(fx: Fixture) -> None:
    expected = golden(fx, "fp32", "blocks.0.attn.hook_attn_scores")
    assert np.isneginf(expected).any()
    unmasked = np.where(np.isneginf(expected), np.float32(0.5), expected)  # the scores a missing mask leaves
    assert MISSING_MASK in diagnose(unmasked, expected, "fp32", atol=FP32_ATOL, rtol=FP32_RTOL)
    wrong_elsewhere = np.where(np.isneginf(expected), expected, expected + np.float32(1.0))
    assert MISSING_MASK not in diagnose(wrong_elsewhere, expected, "fp32", atol=FP32_ATOL, rtol=FP32_RTOL)


def test_previous_tap_is_named(fx: Fixture) -> None:
    previous, expected = golden(fx, "fp32", "hook_embed"), golden(fx, "fp32", "hook_pos_embed")
    assert PREVIOUS_TAP in diagnose(previous, expected, "fp32", atol=FP32_ATOL, rtol=FP32_RTOL, previous=previous)
    # The same tap twice in the golden (resid_post of block 0 is resid_pre of block 1): not a cause.
    same = golden(fx, "fp32", "blocks.0.hook_resid_post")
    assert PREVIOUS_TAP not in diagnose(same, golden(fx, "fp32", "blocks.1.hook_resid_pre"), "fp32",
                                        atol=FP32_ATOL, rtol=FP32_RTOL, previous=same)
    assert PREVIOUS_TAP not in diagnose(previous + 1, expected, "fp32", atol=FP32_ATOL, rtol=FP32_RTOL,
                                        previous=previous)


# Through `parity run`: plugins registered as entry points, as tests/backends/plugins/test_bad_backends.py does.

class RoundsPositions(NumpyBackend):
    """The NumPy reference whose float64 `hook_pos_embed` went through float32 (TransformerLens' weights did)."""

    name: ClassVar[str] = "fake-rounds-positions"

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        for case, taps in super().run_cases(fixture, precision):
            if precision == "fp64":
                taps["hook_pos_embed"] = taps["hook_pos_embed"].astype(np.float32).astype(np.float64)
            yield case, taps


class NegatesAttnOut(NumpyBackend):
    name: ClassVar[str] = "fake-negates-attn-out"

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        for case, taps in super().run_cases(fixture, precision):
            taps["blocks.0.hook_attn_out"] = -taps["blocks.0.hook_attn_out"]
            yield case, taps


class PatternIsScores(NumpyBackend):
    """Returns the pre-softmax scores as the pattern: the previous tap's values."""

    name: ClassVar[str] = "fake-pattern-is-scores"

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        for case, taps in super().run_cases(fixture, precision):
            taps["blocks.1.attn.hook_pattern"] = taps["blocks.1.attn.hook_attn_scores"].copy()
            yield case, taps


class ScalesMlpOut(NumpyBackend):
    """A failure none of the patterns explains: the MLP's output 1% too large."""

    name: ClassVar[str] = "fake-scales-mlp-out"

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        for case, taps in super().run_cases(fixture, precision):
            out = taps["blocks.0.hook_mlp_out"]
            taps["blocks.0.hook_mlp_out"] = out * out.dtype.type(1.01)
            yield case, taps


FAKES = [RoundsPositions, NegatesAttnOut, PatternIsScores, ScalesMlpOut]


@pytest.fixture
def run_fake(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str]]:
    real = parity_harness._backends.registry.backend_entry_points()
    group = parity_harness._backends.registry.GROUP
    registered = {**real, **{c.name: EntryPoint(c.name, f"{__name__}:{c.__name__}", group) for c in FAKES}}
    monkeypatch.setattr(parity_harness._backends.registry, "backend_entry_points", lambda: registered)
    monkeypatch.setattr(parity_harness._cli.main, "backend_entry_points", lambda: registered)

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = parity_harness._cli.main.main(["run", "-q", *args])
        return code, capsys.readouterr().out

    return run


def divergence_line(out: str, backend: str, tier: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith(f"{backend} {tier}: first divergence at ")]
    assert len(lines) == 1, out[-3000:]
    return lines[0]


def test_a_plugin_rounding_a_float64_tap_is_caught_in_fp64_and_named(
    run_fake: Callable[..., tuple[int, str]], tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    code, out = run_fake("--backends", RoundsPositions.name, "--json", str(report))
    assert code == 1, out[-3000:]
    line = divergence_line(out, RoundsPositions.name, "fp64 vs fp64")
    assert "first divergence at hook_pos_embed" in line and f"Likely cause: {ROUNDED_F32}." in line, line
    assert f"{RoundsPositions.name} fp32 vs fp32: first divergence" not in out  # its float32 results agree
    doc = json.loads(report.read_text())
    (entry,) = doc["first_divergence"][RoundsPositions.name]
    assert (entry["tap"], entry["golden"], entry["cause"]) == ("hook_pos_embed", "fp64", ROUNDED_F32)


def test_the_runner_names_sign_flips_and_previous_taps(run_fake: Callable[..., tuple[int, str]]) -> None:
    code, out = run_fake("--backends", NegatesAttnOut.name, "--precision", "fp32")
    assert code == 1
    assert f"Likely cause: {SIGN_FLIPPED}." in divergence_line(out, NegatesAttnOut.name, "fp32 vs fp32")
    code, out = run_fake("--backends", PatternIsScores.name, "--precision", "fp32")
    assert code == 1
    line = divergence_line(out, PatternIsScores.name, "fp32 vs fp32")
    assert "at blocks.1.attn.hook_pattern" in line and f"Likely cause: {PREVIOUS_TAP}." in line, line


def test_an_agreeing_run_and_an_unexplained_failure_name_no_cause(
    run_fake: Callable[..., tuple[int, str]],
) -> None:
    code, out = run_fake("--backends", "numpy")
    assert code == 0 and "Likely cause" not in out
    code, out = run_fake("--backends", ScalesMlpOut.name, "--precision", "fp32")
    assert code == 1
    line = divergence_line(out, ScalesMlpOut.name, "fp32 vs fp32")
    assert "at blocks.0.hook_mlp_out" in line and "Likely cause" not in line, line

"""`parity diff A B` (parity_harness/_compare/differential.py, parity_harness/_tools/diff.py): a float32-only
backend that computes its positions in float32 passes the fp32 tier, and the differential view flags it at
`hook_pos_embed`; two faithful backends (numpy, pytorch) are flagged nowhere; bad input exits 2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar
from unittest import mock

import numpy as np
import pytest

import parity_reference.numpy_model
from parity_harness._backends.base import Precision
from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._fixture.fixture import Fixture, default_fixture_dir, load_fixture
from tests.helpers import assert_one_error_line, cli_with_backends


def positions_in_float32(n_pos: int, d_model: int, dtype: Any) -> np.ndarray:
    """The sinusoid table computed in float32 arithmetic throughout, as OpenVINO's CPU plugin does."""
    pos = np.arange(n_pos, dtype=np.float32)[:, None]
    pair = np.arange(0, d_model, 2, dtype=np.float32)
    angle = pos * np.power(np.float32(10000.0), -pair / np.float32(d_model))
    table = np.zeros((n_pos, d_model), dtype=np.float32)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle)
    return table.astype(dtype)


class Float32Positions(NumpyBackend):
    """The NumPy reference, float32 only, with its sinusoid table computed in float32."""

    name: ClassVar[str] = "fake-fp32-positions"
    precisions = ("fp32",)  # type: ignore[assignment]  # float32 only: the fp64 tier never sees it

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        with mock.patch.object(parity_reference.numpy_model, "sinusoidal_positions", positions_in_float32):
            yield from super().run_cases(fixture, precision)


class Float32PositionsToo(Float32Positions):
    name: ClassVar[str] = "fake-fp32-positions-too"


FAKES = [Float32Positions, Float32PositionsToo]


@pytest.fixture
def parity(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """`parity ARGS` in-process, with the fakes registered as entry points (as
    tests/backends/plugins/test_bad_backends.py does)."""
    return cli_with_backends(monkeypatch, capsys, __name__, FAKES)


def flagged(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("flagged: ")]


def row(out: str, tap: str) -> list[str]:
    (line,) = [ln for ln in out.splitlines() if ln.split()[:1] == [tap]]
    return line.split()


def test_float32_positions_pass_the_fp32_tier(parity: Callable[..., tuple[int, str, str]]) -> None:
    code, out, _ = parity("run", "-q", "--backends", Float32Positions.name)
    assert code == 0 and out.splitlines()[-1].startswith("PASS"), out[-2000:]


def test_the_diff_flags_float32_positions_at_hook_pos_embed(parity: Callable[..., tuple[int, str, str]]) -> None:
    code, out, err = parity("diff", Float32Positions.name, "numpy", "-q")
    assert code == 1, (out[-3000:], err)
    (line,) = flagged(out)
    assert line.startswith(f"flagged: {Float32Positions.name} at hook_pos_embed: "), line
    cells = row(out, "hook_pos_embed")  # tap, '=', golden.fp32, A, B, A - B
    assert cells[1] == "=" and cells[3].endswith("*") and not cells[4].endswith("*"), cells
    golden, mine, peer = float(cells[2]), float(cells[3].rstrip("*")), float(cells[4])
    assert mine > golden >= peer, cells
    assert out.splitlines()[-1].startswith("FLAGGED: 1 tap(s)"), out[-500:]


def test_the_diff_of_numpy_and_pytorch_flags_nothing(parity: Callable[..., tuple[int, str, str]]) -> None:
    code, out, err = parity("diff", "numpy", "pytorch", "-q")
    assert code == 0, (out[-3000:], err)
    assert flagged(out) == [] and out.splitlines()[-1].startswith("NOTHING FLAGGED"), out[-500:]
    for tap in load_fixture(default_fixture_dir()).tap_names:  # every tap measured for both, none starred
        cells = row(out, tap)[-4:]
        assert all(c not in ("n/a", "FAIL") and not c.endswith("*") for c in cells), (tap, cells)


def test_two_backends_with_the_same_shortcut_are_not_flagged(parity: Callable[..., tuple[int, str, str]]) -> None:
    """The rule asks for a peer at or below the golden's rounding: two float32 tables agree with each other."""
    code, out, _ = parity("diff", Float32Positions.name, Float32PositionsToo.name, "-q")
    assert code == 0 and flagged(out) == [], out[-3000:]
    cells = row(out, "hook_pos_embed")
    assert float(cells[3]) > float(cells[2]) and cells[5] == "0", cells


@pytest.mark.parametrize(("args", "needle"), [
    (("diff", "numpy", "no-such-backend"), "unknown backend 'no-such-backend'"),
    (("diff", "numpy", "numpy"), "more than once"),
    (("diff", Float32Positions.name, "numpy", "--precision", "fp64"),
     f"{Float32Positions.name} computes in fp32 only"),
])
def test_bad_input_is_one_line_and_exit_2(parity: Callable[..., tuple[int, str, str]], args: tuple[str, ...],
                                          needle: str) -> None:
    code, out, err = parity(*args, "-q")
    assert_one_error_line(code, out, err, needle)

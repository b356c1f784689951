"""The NumPy backend: every tap, float32 within 1e-5 of the golden, float64 at round-off.

Runs on a fixture of random weights (`tests.helpers.build_random_fixture`: torch needed,
seed 0, cases of T = 1, 5 and 16), and on fixtures/toy as well when it exists.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._core.errors import FixtureError
from parity_harness._fixture.fixture import Case, Fixture, load_fixture
from parity_reference.config import TOY
from parity_reference.numpy_model import gelu, sinusoidal_positions
from parity_reference.taps import tap_names
from tests.helpers import CASES, build_random_fixture, max_error

REPO = Path(__file__).resolve().parents[2]
TOY_FIXTURE = REPO / "fixtures" / "toy"


@pytest.fixture(scope="session")
def random_fixture(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    return load_fixture(build_random_fixture(tmp_path_factory.mktemp("random_fixture")))


def _fixtures(random_fixture: Fixture) -> list[Fixture]:
    extra = [load_fixture(TOY_FIXTURE)] if (TOY_FIXTURE / "manifest.json").is_file() else []
    return [random_fixture, *extra]


def test_fp32_within_1e5_of_golden_fp32(random_fixture: Fixture) -> None:
    for fixture in _fixtures(random_fixture):
        err, where = max_error(NumpyBackend().run(fixture, "fp32"), fixture.golden("fp32"))
        print(f"{fixture.root}: fp32 vs golden.fp32 max abs error {err:.3e} at {where}")
        assert err <= 1e-5, where


def test_fp64_at_roundoff_of_golden_fp64(random_fixture: Fixture) -> None:
    for fixture in _fixtures(random_fixture):
        err, where = max_error(NumpyBackend().run(fixture, "fp64"), fixture.golden("fp64"))
        print(f"{fixture.root}: fp64 vs golden.fp64 max abs error {err:.3e} at {where}")
        assert err <= fixture.tolerances["fp64"].default.atol, where
        assert err <= 1e-13, where  # measured 4.4e-16 on the random fixture: round-off


def test_fp64_within_1e5_of_golden_fp32(random_fixture: Fixture) -> None:
    for fixture in _fixtures(random_fixture):
        err, where = max_error(NumpyBackend().run(fixture, "fp64"), fixture.golden("fp32"))
        assert err <= 1e-5, where


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_every_tap_with_its_shape_and_dtype(random_fixture: Fixture, precision: str) -> None:
    backend = NumpyBackend()
    assert backend.supported_taps(random_fixture) == tap_names(random_fixture.config.n_layer)
    out = backend.run(random_fixture, precision)  # type: ignore[arg-type]
    dtype = np.float32 if precision == "fp32" else np.float64
    assert list(out) == [c.name for c in random_fixture.cases]
    for case in random_fixture.cases:
        assert list(out[case.name]) == random_fixture.tap_names  # every tap, in dataflow order
        for tap, arr in out[case.name].items():
            assert arr.dtype == dtype, (case.name, tap, arr.dtype)
            assert arr.shape == random_fixture.tap_shape(tap, case), (case.name, tap)
            assert not np.isnan(arr).any(), (case.name, tap)


def test_masked_scores_are_minus_infinity(random_fixture: Fixture) -> None:
    out = NumpyBackend().run(random_fixture, "fp64")
    scores = out["longest"]["blocks.0.attn.hook_attn_scores"]  # (H, T, T)
    T = scores.shape[-1]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    assert np.isneginf(scores[:, future]).all()
    assert np.isfinite(scores[:, ~future]).all()
    pattern = out["longest"]["blocks.0.attn.hook_pattern"]
    assert (pattern[:, future] == 0).all()
    np.testing.assert_allclose(pattern.sum(-1), 1.0, atol=1e-15)


def test_positions_are_float64_rounded_once() -> None:
    p64 = sinusoidal_positions(16, 8, np.float64)  # (16, 8)
    p32 = sinusoidal_positions(16, 8, np.float32)
    assert p32.dtype == np.float32
    assert np.array_equal(p32, p64.astype(np.float32))
    assert p64[3, 0] == math.sin(3.0) and p64[3, 1] == math.cos(3.0)  # pair 0: wavelength 2*pi
    assert p64[5, 6] == math.sin(5.0 * 10000.0 ** (-6 / 8))


def test_gelu_is_the_exact_one() -> None:
    x = np.array([-3.0, -1.0, 0.0, 0.5, 1.0, 2.0])
    expected = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    assert np.array_equal(gelu(x), expected)
    assert gelu(x.astype(np.float32)).dtype == np.float32
    tanh_approx = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert np.abs(gelu(x) - tanh_approx).max() > 1e-5  # not the tanh approximation


def test_learned_positions(tmp_path: Path) -> None:
    config = dataclasses.replace(TOY, positions="learned")
    fixture = load_fixture(build_random_fixture(tmp_path / "learned", config, CASES[:2]))
    out = NumpyBackend().run(fixture, "fp64")
    np.testing.assert_array_equal(
        out["short"]["hook_pos_embed"], fixture.weights()["wpe.weight"][:5].astype(np.float64)
    )
    err, where = max_error(out, fixture.golden("fp64"))
    assert err <= 1e-13, where


def test_bad_tokens_raise_fixture_error(random_fixture: Fixture, tmp_path: Path) -> None:
    fixture = load_fixture(random_fixture.root).for_backend()  # a backend's copy: its cases are replaced below
    fixture.cases = [Case("bad", (0, TOY.vocab_size))]
    with pytest.raises(FixtureError, match="token id 12 out of range"):
        NumpyBackend().run(fixture, "fp32")
    fixture.cases = [Case("negative", (-1,))]
    with pytest.raises(FixtureError, match="out of range"):
        NumpyBackend().run(fixture, "fp64")
    fixture.cases = [Case("too_long", (0,) * (TOY.n_ctx + 1))]
    with pytest.raises(FixtureError, match="tokens"):
        NumpyBackend().run(fixture, "fp64")


def test_registered_under_its_name() -> None:
    from parity_harness._backends.registry import load_backend

    backend = load_backend("numpy")
    assert backend.name == "numpy" and backend.entry == "run_cases"
    assert backend.precisions == ("fp32", "fp64", "fp16")
    assert backend.missing() == []

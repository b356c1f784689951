"""Determinism: every built-in backend, run twice on the fixture, gives bit-identical outputs.

A tolerance hides nondeterminism up to its size; this test allows none. Same cases, same taps,
same dtype and shape, and `np.array_equal(..., equal_nan=True)` for every case x tap x precision.
A backend whose dependencies are missing is skipped (and says so).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity_harness._backends.registry import backend_entry_points, load_backend
from parity_harness._fixture.fixture import Fixture, load_fixture
from tests.helpers import GIVEN_GRAPH

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

# onnx-file runs a graph given at run time (--onnx FILE): tests/backends/test_onnx_file.py runs it
BUILT_IN = sorted(name for name, ep in backend_entry_points().items()
                  if ep.value.startswith("parity_harness._backends.") and name not in GIVEN_GRAPH)


@pytest.fixture(scope="module")
def fixture(toy_dir: Path) -> Fixture:
    return load_fixture(toy_dir)


def test_every_built_in_backend_is_covered() -> None:
    assert {"pytorch", "numpy", "typescript"} <= set(BUILT_IN), BUILT_IN


@pytest.mark.parametrize("name", BUILT_IN)
def test_two_runs_are_bit_identical(fixture: Fixture, name: str) -> None:
    backend = load_backend(name)
    missing = backend.missing()
    if missing:
        pytest.skip(f"{name} needs {', '.join(missing)}")
    for precision in backend.precisions:
        _, first = backend.outputs(fixture, precision)
        _, second = backend.outputs(fixture, precision)
        assert list(first) == list(second) == [c.name for c in fixture.cases], (name, precision)
        for case in fixture.cases:
            taps = backend.taps(fixture)
            assert set(first[case.name]) >= set(taps), (name, precision, case.name)
            assert set(first[case.name]) == set(second[case.name]), (name, precision, case.name)
            for tap in first[case.name]:
                a, b = np.asarray(first[case.name][tap]), np.asarray(second[case.name][tap])
                where = f"{name} {precision} {case.name}/{tap}"
                assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape, b.shape)
                assert np.array_equal(a, b, equal_nan=True), f"{where}: the two runs differ"

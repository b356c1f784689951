"""The goldens of a stored weight format: the float64 reference run on exactly the weights the format stores.

A runtime given q8_0 weights is judged against the truth of q8_0 weights, not the fixture's: `StoredGoldens`
runs the family's NumPy reference (parity_reference's `numpy_model.py`, `llama_numpy.py`) in float64 on
`stored_weights(fixture, fmt)`, every case, once per fixture and format, and gives

- each case's golden taps (the fixture's taps, the rows the fixture keeps);
- the per-tap tolerance atol = c * eps * M_tap (`STORED_C`, `EPS`: what the runtime's kernels round the
  activations to; M_tap the largest |value| of the tap over the cases of these goldens), rtol 0;
- the format's own cost at a tap: how far these goldens are from the fixture's float64 golden, in the same
  units (eps * M_tap): informational, never part of a verdict.

Computed, not stored: a few seconds on the toys, the same for every backend of a run (cached by fixture seal
and format).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from parity_harness._core.precision import EPS, Precision
from parity_harness._fixture.manifest import Tolerance
from parity_harness._fixture.stored_weights import gguf_tensors, storage_summary, stored_weights
from parity_harness._fixture.tolerances import STORED_C

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture


class StoredGoldens:
    """One fixture's goldens for one stored format, computed on first use."""

    def __init__(self, fixture: Fixture, fmt: Precision) -> None:
        self.fixture, self.fmt = fixture, fmt
        self.storage = storage_summary(gguf_tensors(fixture, fmt))  # {"q8_0": 14, "f32": 5}: what the file holds
        self._cases: dict[str, dict[str, np.ndarray]] | None = None

    def _compute(self) -> dict[str, dict[str, np.ndarray]]:
        if self._cases is None:
            fixture = self.fixture
            params = {name: w.astype(np.float64) for name, w in stored_weights(fixture, self.fmt).items()}
            forward = fixture.model.family.module("numpy").forward
            lens_rows = fixture.lens_rows()
            cases: dict[str, dict[str, np.ndarray]] = {}
            for case in fixture.cases:
                taps = forward(params, fixture.model.config, list(case.tokens), lens_rows)
                cases[case.name] = {tap: np.asarray(taps[tap], dtype=np.float64) for tap in fixture.tap_names}
            self._cases = cases
        return self._cases

    def case(self, name: str) -> dict[str, np.ndarray]:
        """One case's golden taps {tap: float64 array}."""
        return self._compute()[name]

    @functools.cached_property
    def magnitudes(self) -> dict[str, float]:
        """M_tap: the largest finite |value| of each tap over every case (at least float32's tiniest normal)."""
        out: dict[str, float] = {}
        for taps in self._compute().values():
            for tap, value in taps.items():
                finite = np.abs(value[np.isfinite(value)])
                out[tap] = max(out.get(tap, 0.0), float(finite.max()) if finite.size else 0.0)
        return {tap: max(m, float(np.finfo(np.float32).tiny)) for tap, m in out.items()}

    def tolerance(self, tap: str) -> Tolerance:
        """atol = c * eps * M_tap, rtol 0 (docs/tolerances.md, "Stored weights")."""
        return Tolerance(STORED_C[self.fmt] * EPS[self.fmt] * self.magnitudes[tap], 0.0)

    def unit(self, tap: str) -> float:
        """One unit of the format's error at a tap: eps * M_tap."""
        return EPS[self.fmt] * self.magnitudes[tap]

    @functools.cached_property
    def format_cost(self) -> dict[str, float]:
        """{tap: the largest |these goldens - the fixture's float64 golden| over every case, in units (`unit`)}:
        what the format itself costs at each tap, whatever the runtime."""
        cost: dict[str, float] = {}
        for case in self.fixture.cases:
            original = self.fixture.golden_case("fp64", case.name, self.fixture.tap_names)
            for tap, value in self.case(case.name).items():
                both = np.isfinite(value) & np.isfinite(original[tap])
                gap = float(np.abs(value[both] - original[tap][both]).max()) if both.any() else 0.0
                cost[tap] = max(cost.get(tap, 0.0), gap / self.unit(tap))
        return cost


_MADE: dict[tuple[str, str, str], StoredGoldens] = {}
_KEEP = 4  # the goldens of this many (fixture, format) pairs kept


def stored_goldens(fixture: Fixture, fmt: Precision) -> StoredGoldens:
    """The fixture's goldens for `fmt`, made once per fixture (root and seal) and format."""
    key = (str(fixture.root), fixture.seal, fmt)
    if key not in _MADE:
        while len(_MADE) >= _KEEP:
            _MADE.pop(next(iter(_MADE)))
        _MADE[key] = StoredGoldens(fixture, fmt)
    return _MADE[key]

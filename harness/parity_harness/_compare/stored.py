"""A stored weight format's run, per tap: the runtime's error and the format's own cost, in the same units.

A backend run in a stored format (f16, q8_0, q4_0, q4_k: parity_harness/_fixture/stored_weights.py) is judged
against the goldens of the weights it was given (stored_goldens.py). Beside that verdict, the report shows per
tap two numbers in units of eps * M_tap (eps: what the runtime rounds activations to, `precision.EPS`):

- `runtime`: the run's largest error against those goldens (what the verdict judges, at c units);
- `format`: how far those goldens are from the fixture's own float64 golden, whatever the runtime: what the
  format itself costs. Informational: it never enters a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from parity_harness._compare.judge import NOT_SUPPORTED, CheckResult


@dataclass(frozen=True)
class StoredTap:
    """One tap of a stored-format run: the runtime's error and the format's cost, in units of eps * M_tap."""

    tap: str
    runtime: float | None  # None: not supported by the backend
    format: float
    passed: bool


@dataclass(frozen=True)
class StoredRun:
    """One backend x stored format: what the file held, c, and every tap's two numbers."""

    backend: str
    precision: str
    storage: dict[str, int]  # {"q8_0": 56, "f32": 17}: how many tensors each type holds
    c: float  # the tolerance in units: atol = c * eps * M_tap
    taps: list[StoredTap]

    @property
    def worst_runtime(self) -> StoredTap | None:
        judged = [t for t in self.taps if t.runtime is not None]
        return max(judged, key=lambda t: t.runtime or 0.0) if judged else None

    @property
    def worst_format(self) -> StoredTap | None:
        return max(self.taps, key=lambda t: t.format) if self.taps else None


def stored_run(backend: str, precision: str, storage: dict[str, int], c: float, results: list[CheckResult],
               units: dict[str, float], format_cost: dict[str, float], taps: list[str]) -> StoredRun:
    """The run's per-tap record from its check results (`units`: eps * M_tap per tap)."""
    runtime: dict[str, float] = {}
    failed: set[str] = set()
    for r in results:
        if r.status == NOT_SUPPORTED or r.tap not in units:
            continue
        if not r.passed:
            failed.add(r.tap)
        if r.max_abs is not None:
            runtime[r.tap] = max(runtime.get(r.tap, 0.0), r.max_abs / units[r.tap])
    return StoredRun(backend, precision, dict(storage), c,
                     [StoredTap(tap, runtime.get(tap), format_cost.get(tap, 0.0), tap not in failed) for tap in taps])

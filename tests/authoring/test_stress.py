"""The stress fixture (fixtures/toy-stress, parity_harness/_authoring/stress.py): hard by construction, honest,
measured.

- its weights are the toy's, transformed exactly as parity_harness/_authoring/stress.py says (bit for bit);
- it is numerically hard where the stability mutants need it to be (the properties are read off
  its own goldens: offsets at every LayerNorm, scores and masked gaps past 1e4, GELU's far tails,
  logits in the thousands), while its probabilities stay a softmax of meaningful logits;
- its float64 golden agrees with an independent 40-digit mpmath computation within the fp64
  tolerances, and its float32 golden within the fp32 ones (two cases, every tap: ~1 s);
- its tolerances are the ones `stress_tolerances` derives from the error budget in its manifest;
- `parity export --check --preset toy-stress` regenerates it: on another platform the goldens
  must hold within its own tolerances, and a tolerance that no longer matches its budget is reported.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from parity_harness._authoring.stress import (
    BUDGET_FACTOR,
    OFFSET,
    adversarial_cases,
    is_stress,
    masked_gap,
    stress_tolerances,
    stress_weights,
)
from parity_harness._fixture.fixture import Fixture, load_fixture
from tests.helpers import REPO, edit_manifest, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

STRESS = REPO / "fixtures" / "toy-stress"


@pytest.fixture(scope="module")
def stress() -> Fixture:
    return load_fixture(STRESS)


@pytest.fixture(scope="module")
def toy(toy_dir: Path) -> Fixture:
    return load_fixture(toy_dir)


def _finite_max(a: np.ndarray) -> float:
    return float(np.abs(a[np.isfinite(a)]).max())


def test_weights_are_the_toys_transformed(stress: Fixture, toy: Fixture) -> None:
    assert is_stress(stress) and not is_stress(toy)
    expected = stress_weights(toy.weights(), toy.config)
    assert set(expected) == set(stress.weights())
    for name, w in stress.weights().items():
        assert np.array_equal(w, expected[name]), name


def test_cases_are_the_toys_plus_the_adversarial_ones(stress: Fixture, toy: Fixture) -> None:
    assert stress.cases[: len(toy.cases)] == toy.cases
    found = adversarial_cases(stress.weights(), stress.config, stress.vocab, toy.cases)
    assert [(c.name, c.tokens) for c in found] == [(c.name, c.tokens) for c in stress.cases[len(toy.cases):]]


def test_the_fixture_is_hard_where_the_stability_mutants_need_it(stress: Fixture) -> None:
    g = stress.golden("fp64")
    cases = stress.cases
    # LayerNorm: |mean| >> std at every LayerNorm input (a one-pass variance cancels).
    for layer in range(stress.config.n_layer):
        for tap in (f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.hook_resid_mid"):
            for c in cases:
                x = g[c.name][tap]
                assert (np.abs(x.mean(axis=-1)) > 100 * x.std(axis=-1)).all(), (tap, c.name)
    # Softmax: scores past exp's float64 range (709.8); logits in the thousands.
    assert max(_finite_max(g[c.name]["blocks.0.attn.hook_attn_scores"]) for c in cases) > 1e4
    assert max(_finite_max(g[c.name]["logits"]) for c in cases) > 1000
    # The additive -1e4 mask: some masked score above its row's maximum by more than 1e4, in block 0.
    assert max(masked_gap(g[c.name], 0, stress.config.d_head) for c in cases) > 1e4
    # GELU's far tails: past |x| = 37.7, where the series of positive terms overflows in float64.
    assert max(_finite_max(g[c.name]["blocks.0.mlp.hook_pre"]) for c in cases) > 37.7
    # The toy is gentle on all of these (why its mutants pass there).
    toy = load_fixture(REPO / "fixtures" / "toy").golden("fp64")
    assert max(_finite_max(t["blocks.0.attn.hook_attn_scores"]) for t in toy.values()) < 100
    assert max(_finite_max(t["blocks.0.mlp.hook_pre"]) for t in toy.values()) < 13.3


def test_probabilities_are_a_meaningful_models(stress: Fixture, toy: Fixture) -> None:
    """The offset on wte shifts each row of logits by a constant, which softmax removes.

    So the logits reach the thousands while their spread within a row stays the toy's (at most ~21).
    """
    def spread(golden: dict[str, dict[str, np.ndarray]]) -> float:
        return max(float((t["logits"].max(axis=-1) - t["logits"].min(axis=-1)).max()) for t in golden.values())

    g = stress.golden("fp64")
    assert max(_finite_max(t["logits"]) for t in g.values()) > 1000
    assert spread(g) < 1.5 * spread(toy.golden("fp64"))
    for t in g.values():
        assert np.allclose(t["probs"].sum(axis=-1), 1.0, rtol=0, atol=1e-12)
        assert (t["probs"].max(axis=-1) < 1).all()  # not saturated: the softmax of differences of ~20


@pytest.mark.parametrize("case", ["grammar_1", "stress_max_mask_gap"])
def test_goldens_agree_with_the_mpmath_truth(stress: Fixture, case: str) -> None:
    from parity_harness._authoring.truth import truth_taps

    c = stress.case(case)
    truth = truth_taps(stress.weights(), stress.config, c.tokens)
    for precision in ("fp32", "fp64"):
        tol = stress.tolerances[precision]  # type: ignore[index]
        golden = stress.golden(precision)[case]  # type: ignore[arg-type]
        for tap in stress.tap_names:
            g, t = golden[tap].astype(np.float64), truth[tap]
            assert np.array_equal(np.isinf(g), np.isinf(t)), (precision, tap)
            finite = np.isfinite(t)
            err = np.abs(g[finite] - t[finite])
            allowed = tol.for_tap(tap).atol + tol.for_tap(tap).rtol * np.abs(t[finite])
            assert (err <= allowed).all(), (precision, tap, float(err.max()))


def test_tolerances_are_derived_from_the_recorded_budget(stress: Fixture) -> None:
    manifest = json.loads((STRESS / "manifest.json").read_text())
    budget = manifest["provenance"]["error_budget"]
    assert set(budget) == set(stress.tap_names)
    assert stress_tolerances(budget) == manifest["tolerances"]
    # Each override is BUDGET_FACTOR x the measured error (rounded up to 2 digits), above the toy's default.
    for tier in ("fp32", "fp64"):
        for tap, tol in manifest["tolerances"][tier]["overrides"].items():
            assert BUDGET_FACTOR * budget[tap][tier] <= tol["atol"] <= 1.1 * BUDGET_FACTOR * budget[tap][tier]
            assert tol["atol"] > manifest["tolerances"][tier]["atol"]
    assert manifest["provenance"]["preset"] == "toy-stress" and str(int(OFFSET)) in manifest["provenance"]["weights"]


def test_check_on_another_platform_uses_the_tolerances_and_finds_a_stale_one(
    tmp_path: Path, toy_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`parity export --check --preset toy-stress` off the platform that made the goldens.

    The goldens recomputed here must pass the fixture's own tolerances (the cross-platform rule); a
    tolerance edited by hand (x10) no longer matches the measured budget and is reported, alone.
    """
    pytest.importorskip("torch")
    from parity_harness._authoring.stress import check_stress_fixture
    from parity_harness._core.status import Verdict

    root = tmp_path / "stress"
    shutil.copytree(STRESS, root)

    def change(manifest: dict) -> None:  # type: ignore[type-arg]
        manifest["provenance"]["platform"] = {"system": "another"}
        manifest["tolerances"]["fp64"]["overrides"]["logits"]["atol"] *= 10

    edit_manifest(root, change)
    assert check_stress_fixture(root, toy_dir, progress=print) == Verdict.DISAGREE
    out = capsys.readouterr().out
    assert "made on another platform" in out
    assert "golden fp32: reproduced" in out and "golden fp64: reproduced" in out
    fails = [line for line in out.splitlines() if "FAIL" in line]
    assert len(fails) == 1 and "tolerance fp64 logits" in fails[0], fails


def test_export_without_the_preset_refuses_the_stress_fixture() -> None:
    """`parity export --fixture fixtures/toy-stress` would retrain the toy over it: exit 2, one line."""
    proc = run_cli("export", "--check", "--no-retrain", "--fixture", str(STRESS))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "made by `parity export --preset toy-stress`: pass --preset toy-stress" in proc.stderr

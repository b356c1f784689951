"""The backward mutants (issue 39, deliverable 5): bugs of a training port, each a patch of the hand-written NumPy
backward (parity_reference/numpy_backward.py), caught by the gradient check at their gradient or training step with
a cause named from the numbers (parity_harness/_compare/grad_causes.py), the forward checks alone blind.

The catalog is checked against the current source (every anchor once, in code); the selftest runs them (two in the
fast set, all eight in the full set); a cause is never named where no known bug fits (a random error of the same
size at each pattern's gradient or training record); and a mutant caught elsewhere than its catalog entry says fails
the selftest.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from parity_harness._compare.grad_causes import grad_cause
from parity_harness._compare.gradients import grad_tolerances
from parity_harness._compare.judge import FirstDivergence
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._fixture.training import golden_training
from parity_harness._tools.grad_mutants import CAUSE_CLASS, FILE, MUTANTS
from parity_harness._tools.mutants import CATALOG, TARGET_DIRS, backward_mutants, by_name
from parity_harness._tools.selftest import format_backward, print_selftest, run_selftest
from parity_reference.training import step_key
from tests.helpers import REPO, run_cli

FAST = ["np-grad-ln-no-mean-term", "np-grad-not-zeroed"]  # one of the backward, one of the training step


@pytest.fixture(scope="module")
def toy(toy_dir: Path) -> Fixture:
    return load_fixture(toy_dir)


@pytest.fixture(scope="module")
def stress() -> Fixture:
    return load_fixture(REPO / "fixtures" / "toy-stress")


# -- the catalog ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_every_anchor_matches_the_current_backward_once(mutant: object) -> None:
    assert isinstance(mutant, type(MUTANTS[0]))
    source = (TARGET_DIRS["numpy"] / FILE).read_text(encoding="utf-8")
    patched = mutant.apply(source)
    assert patched != source
    compile(patched, FILE, "exec")  # still Python
    assert mutant.target == "numpy" and mutant.file == FILE and mutant.family == "gpt2"
    assert mutant.caught_on in ("grad", "grad-stress") and not mutant.fp64_only
    assert CAUSE_CLASS[mutant.name]


def test_the_backward_mutants_are_kept_apart_from_the_forward_catalog(toy: Fixture) -> None:
    """Selected by name like any mutant; not in CATALOG, whose numbers (and the totals line) stay the forward's."""
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)) == 8 and set(CAUSE_CLASS) == set(names)
    assert backward_mutants() == MUTANTS and not set(names) & {m.name for m in CATALOG}
    assert [m.name for m in by_name(None)] == [*(m.name for m in CATALOG), *names]
    assert by_name(FAST) == [m for m in MUTANTS if m.name in FAST]
    grads, steps = toy.grad_names(), toy.training()
    assert steps is not None
    for m in MUTANTS:  # a gradient of the fixture, or a training record of one of its steps
        if m.expected_step is None:
            assert m.expected_tap in grads, m.name
        else:
            assert 1 <= m.expected_step <= steps.steps, m.name
            assert m.expected_tap in ("loss", "grad_norm", *toy.model.param_shapes()), m.name


# -- the selftest runs them -------------------------------------------------------------------------------------------


def _check(rows: list[dict[str, object]]) -> None:
    for row in rows:
        assert row["caught"] and not row["error"] and row["localized"], row
        assert row["forward_caught"] is False, row  # the forward checks alone pass: the forward is unpatched
        assert CAUSE_CLASS[str(row["name"])] in str(row["likely_cause"]), row
        assert row["ok"] and row["tiers"], row


@pytest.mark.full  # 10 s; the full set (CI) runs every backward mutant
def test_two_backward_mutants_caught_at_their_place_with_their_cause(toy: Fixture) -> None:
    result = run_selftest(toy, by_name(FAST))
    doc = result.to_json()
    backward = doc["backward"]
    assert isinstance(backward, dict)
    assert backward["controls"] == {"toy": ""} and backward["caught_at_tap_with_cause"] == 2
    rows = backward["mutants"]
    _check(rows)
    by = {r["name"]: r for r in rows}
    assert by["np-grad-ln-no-mean-term"]["first_tap"] == "blocks.1.hook_resid_post.grad"
    assert by["np-grad-ln-no-mean-term"]["first_step"] is None
    assert (by["np-grad-not-zeroed"]["first_step"], by["np-grad-not-zeroed"]["first_tap"]) == (2, "grad_norm")
    assert result.outcomes == [] and result.failures() == [] and doc["exit_code"] == 0
    lines = format_backward(result)
    assert any(line.startswith("np-grad-not-zeroed") and "step 2: grad_norm" in line and "blind" in line
               for line in lines), lines


@pytest.mark.full
def test_every_backward_mutant_caught_at_its_place_with_its_cause(tmp_path: Path) -> None:
    out = tmp_path / "selftest.json"
    proc = run_cli("selftest", "-q", "--only", ",".join(m.name for m in MUTANTS), "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "backward mutants caught by the gradient check at their gradient or step, with their cause, the forward " \
           "checks blind: 8/8" in proc.stdout
    assert "control (numpy, unpatched numpy_backward.py, toy, --grad): pass" in proc.stdout
    assert "control (numpy, unpatched numpy_backward.py, toy-stress, --grad): pass" in proc.stdout
    doc = json.loads(out.read_text())
    rows = doc["backward"]["mutants"]
    assert [r["name"] for r in rows] == [m.name for m in MUTANTS]
    _check(rows)
    for row, m in zip(rows, MUTANTS, strict=True):
        assert (row["first_step"], row["first_tap"]) == (m.expected_step, m.expected_tap), row
        assert row["fixture"] == ("toy-stress" if m.caught_on == "grad-stress" else "toy"), row
    decay = next(r for r in rows if r["name"] == "np-grad-decay-every-param")
    assert decay["toy_tiers"] == [], decay  # the toy's weight decay is 0.0: there the bug is invisible


@pytest.mark.full  # 7 s
def test_a_backward_mutant_caught_elsewhere_fails_the_selftest(toy: Fixture,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The catalog's place is checked: a mutant claimed at step 1 but caught at step 2 fails it (exit 1)."""
    wrong = dataclasses.replace(by_name(["np-grad-not-zeroed"])[0], expected_step=1)
    result = run_selftest(toy, [wrong])
    assert [o.localized for o in result.backward] == [False]
    assert any("backward mutant(s) not caught by the gradient check alone" in w and "np-grad-not-zeroed" in w
               for w in result.failures()), result.failures()
    assert result.to_json()["exit_code"] == 1
    print_selftest(result)
    assert "backward mutants caught by the gradient check at their gradient or step" in capsys.readouterr().out


# -- no cause where no known bug fits ---------------------------------------------------------------------------------


def _divergence(name: str, case: str, atol: float, step: int | None = None) -> FirstDivergence:
    return FirstDivergence("fake", "fp64", "fp64", name, case, None, None, None, None, atol, "", 0, 0.0, step=step)


@pytest.mark.parametrize("where", ["wte.weight.grad", "blocks.1.hook_resid_post.grad", "blocks.1.attn.hook_k.grad",
                                   "blocks.1.mlp.hook_pre.grad", "blocks.1.attn.hook_attn_scores.grad",
                                   "step2/grad_norm", "step1/wte.weight"])
def test_a_random_error_gets_no_cause(toy: Fixture, where: str) -> None:
    """Each pattern's gradient or record, off by a random error as large as a bug's: no known bug is named (the
    mutant tests above show each pattern naming its bug)."""
    goldens = {p: golden_training(toy, p) for p in ("fp32", "fp64")}
    tol = grad_tolerances(toy, *goldens["fp64"])
    grads64, train64 = goldens["fp64"]
    rng = np.random.default_rng(0)
    case = "end_markers"
    if where.startswith("step"):
        step = int(where[4])
        name = where.split("/", 1)[1]
        b = np.asarray(train64[step_key(step, name)], dtype=np.float64)
        d = _divergence(name, "train", tol.atol("fp64", step_key(step, name)), step)
    else:
        b = np.asarray(grads64[case][where], dtype=np.float64)
        d = _divergence(where, case, tol.atol("fp64", where))
    scale = 1e-3 * max(float(np.max(np.abs(b))), 1.0)
    noisy = b + rng.normal(0.0, scale, b.shape)
    assert grad_cause(toy, d, noisy, goldens["fp64"], tol) == ""
    assert grad_cause(toy, d, b.copy(), goldens["fp64"], tol) == ""  # nothing fails: nothing to name


@pytest.mark.full  # a selftest run (~4 s): the full set (CI) runs it
def test_only_the_first_divergences_arrays_are_kept(toy: Fixture, tmp_path: Path) -> None:
    """The gradient check keeps, per backend x precision x tier, the one array its first divergence is at (the worst
    case's), for the cause: what it keeps is exactly what the folded report's first divergences point to."""
    from parity_harness._backends.boundary import GuardedBackend
    from parity_harness._compare.grad_causes import Kept, keep_candidates
    from parity_harness._tools.selftest import NumpyBackwardModuleBackend, copy_target, load_module, run_backward

    mutant = by_name(["np-grad-attention-scale-missing"])[0]
    report = run_backward(toy, mutant, tmp_path)
    assert report.grad is not None and report.grad.divergences
    module = load_module(copy_target("numpy", tmp_path / "again", mutant) / FILE, "_test_keep_candidates")
    backend = GuardedBackend.wrap(NumpyBackwardModuleBackend(module))
    kept: Kept = {}
    for precision in ("fp32", "fp64"):
        grads = backend.gradients(toy, precision, toy.grad_names())
        keep_candidates(kept, report.grad, backend.name, precision, grads, backend.trained(toy, precision))
    firsts = {(d.precision, d.case, d.tap) for d in report.grad.divergences}
    firsts |= {(d.precision, "train", step_key(d.step or 0, d.tap)) for d in report.grad.train_divergences}
    assert {(p, *key) for (_, p), own in kept.items() for key in own} == firsts
    assert len(firsts) < 8  # a few arrays, not the run's outputs

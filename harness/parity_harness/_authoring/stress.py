"""`parity export --preset toy-stress`: the stress fixture, the toy made numerically hard.

The toy's activations are gentle (logits within +-16, scores within +-12, LayerNorm inputs of small
mean), so numerically unstable ports pass it. `fixtures/toy-stress` is the same architecture
with the toy's weights transformed, deterministically, so that magnitudes become extreme while the
function stays meaningful (docs/selftest.md, docs/tolerances.md):

- `OFFSET` added to every entry of `wte.weight`: the residual stream carries a common offset at
  every position, which every LayerNorm removes (|mean| >> std at every LayerNorm); with tied
  embeddings each row of logits shifts by OFFSET * sum(ln_f output), which softmax removes, so the
  logits reach the thousands and the probabilities are those of a meaningful model;
- q (the first d_model columns of each block's `c_attn`, weight and bias) times `Q_SCALE`: scores
  in the thousands, patterns one-hot, and masked scores up to ~1.4e4 above their row's maximum;
- `c_fc` (weight and bias) times `MLP_SCALE` and the MLP's `c_proj.weight` divided by it: GELU
  works in its far tails (|mlp.hook_pre| up to ~70) and the MLP's output keeps its size;
- the toy's 12 cases plus adversarial ones, chosen by a search over token pairs repeated to the
  full context: the largest masked-score gap, the largest score, the largest MLP input, the largest logit.

Its tolerances come from its own measured error budget, tap by tap (`stress_tolerances`): the
fp32 tier from |golden.fp32 - golden.fp64|, the fp64 tier from |golden.fp64 - truth|, the truth
computed with mpmath at 40 digits (parity_harness/_authoring/truth.py), each times `BUDGET_FACTOR` and never
below the toy's defaults. The table is kept in the manifest (`provenance.error_budget`).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_harness._core.precision import Precision
from parity_harness._core.status import Verdict
from parity_harness._fixture.fixture import Case, Fixture, load_fixture
from parity_harness._fixture.tolerances import tap_magnitude
from parity_reference.config import GPTConfig

if TYPE_CHECKING:
    from parity_reference.training import TrainingSpec

PRESET = "toy-stress"
OFFSET = 1000.0  # added to every entry of wte.weight
Q_SCALE = 1000.0  # multiplies the q columns of every c_attn (weight and bias)
MLP_SCALE = 8.0  # multiplies every c_fc (weight and bias); the MLP's c_proj.weight is divided by it
# Tolerance = BUDGET_FACTOR x the golden's measured error: a float32 implementation may be as far from
# the truth as the golden is, on the other side (2x), and another summation order or CPU gets 2x more.
BUDGET_FACTOR = 4.0
PAIR_REPEATS = 8  # an adversarial candidate is a token pair (a, b) repeated to 2 * 8 = 16 tokens

Progress = Callable[[str], None]
Golden = dict[str, dict[str, np.ndarray]]


def stress_weights(toy: Mapping[str, np.ndarray], config: GPTConfig) -> dict[str, np.ndarray]:
    """The toy's float32 weights transformed (in float64, rounded once to float32); see the module doc."""
    d = config.d_model
    w = {k: np.asarray(v, dtype=np.float64).copy() for k, v in toy.items()}
    w["wte.weight"] += OFFSET  # (V, d)
    for i in range(config.n_layer):
        p = f"h.{i}."
        w[p + "attn.c_attn.weight"][:, :d] *= Q_SCALE  # (d, 3d): the q columns
        w[p + "attn.c_attn.bias"][:d] *= Q_SCALE  # (3d,)
        w[p + "mlp.c_fc.weight"] *= MLP_SCALE  # (d, d_mlp)
        w[p + "mlp.c_fc.bias"] *= MLP_SCALE  # (d_mlp,)
        w[p + "mlp.c_proj.weight"] /= MLP_SCALE  # (d_mlp, d)
    return {k: v.astype(np.float32) for k, v in w.items()}


def masked_gap(taps: Mapping[str, np.ndarray], layer: int, d_head: int) -> float:
    """Largest (masked score - its row's max unmasked score) of one block: what an additive mask must beat."""
    q, k = taps[f"blocks.{layer}.attn.hook_q"], taps[f"blocks.{layer}.attn.hook_k"]  # (T, H, dh)
    raw = np.einsum("ihe,jhe->hij", q, k) / math.sqrt(d_head)  # (H, T, T) before the mask
    T = raw.shape[-1]
    gaps = [raw[h, i, i + 1:].max() - raw[h, i, :i + 1].max() for h in range(raw.shape[0]) for i in range(T - 1)]
    return float(max(gaps, default=-math.inf))


def adversarial_cases(weights: Mapping[str, np.ndarray], config: GPTConfig, vocab: Sequence[str],
                      taken: Sequence[Case]) -> list[Case]:
    """Four cases from the pairs (a, b) repeated to the full context, each the worst of its kind.

    Computed in float64 with the NumPy backend's forward pass (no torch): the largest gap between a
    masked score and its row's maximum in block 0, the largest |score|, the largest |mlp.hook_pre|,
    the largest |logit|. A sequence already chosen (or a toy case) is never chosen twice.
    """
    from parity_reference.numpy_model import forward

    params = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    reps = min(PAIR_REPEATS, config.n_ctx // 2)
    candidates = [(a, b) for a in range(config.vocab_size) for b in range(config.vocab_size)]
    taps = {pair: forward(params, config, list(pair) * reps) for pair in candidates}
    layers = range(config.n_layer)
    measures: list[tuple[str, str, Callable[[Mapping[str, np.ndarray]], float]]] = [
        ("max_mask_gap", "the largest masked score above its row's maximum (block 0)",
         lambda t: masked_gap(t, 0, config.d_head)),
        ("max_score", "the largest |attention score|",
         lambda t: tap_magnitude(t[f"blocks.{i}.attn.hook_attn_scores"] for i in layers)),
        ("max_mlp_pre", "the largest |mlp.hook_pre|",
         lambda t: tap_magnitude(t[f"blocks.{i}.mlp.hook_pre"] for i in layers)),
        ("max_logit", "the largest |logit|", lambda t: tap_magnitude([t["logits"]])),
    ]
    seen = {c.tokens for c in taken}
    out: list[Case] = []
    for name, why, measure in measures:
        ranked = sorted(candidates, key=lambda pair: (-measure(taps[pair]), pair))
        pair = next(p for p in ranked if tuple(p) * reps not in seen)
        tokens = tuple(pair) * reps
        seen.add(tokens)
        text = " ".join(vocab[t] for t in tokens)
        out.append(Case(f"stress_{name}", tokens, f"stress: {why} ({measure(taps[pair]):.4g})", text))
    return out


def _ceil2(x: float) -> float:
    """x rounded up to two significant digits (a tolerance a person can read)."""
    if x <= 0:
        return 0.0
    e = math.floor(math.log10(x)) - 1
    return float(f"{math.ceil(x / 10.0 ** e - 1e-9) * 10.0 ** e:.2g}")


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over the cells finite in b (masked scores are -inf in both)."""
    finite = np.isfinite(b)
    if not finite.any():
        return 0.0
    return float(np.abs(a[finite].astype(np.float64) - b[finite].astype(np.float64)).max())


def error_budget(cases: Sequence[Case], taps: Sequence[str], golden: Mapping[Precision, Golden],
                 truth: Golden) -> dict[str, dict[str, float]]:
    """Per tap, worst over cases: M = max |truth|, fp32 = |golden.fp32 - golden.fp64|, fp64 = |golden.fp64 - truth|."""
    table: dict[str, dict[str, float]] = {}
    for tap in taps:
        table[tap] = {
            "magnitude": tap_magnitude(truth[c.name][tap] for c in cases),
            "fp32": max(_max_diff(golden["fp32"][c.name][tap], golden["fp64"][c.name][tap]) for c in cases),
            "fp64": max(_max_diff(golden["fp64"][c.name][tap], truth[c.name][tap]) for c in cases),
        }
    return table


def stress_tolerances(budget: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """The manifest's tolerances: the toy's defaults, plus an override per tap where BUDGET_FACTOR x error is larger."""
    from parity_harness._authoring.fixture_writer import default_tolerances

    tol = default_tolerances()
    for tier in ("fp32", "fp64"):
        base = tol[tier]
        for tap, row in budget.items():
            atol = _ceil2(BUDGET_FACTOR * row[tier])
            if atol > base["atol"]:
                base["overrides"][tap] = {"atol": atol, "rtol": base["rtol"]}
    return tol


def stress_training(cases: Sequence[Case], config: GPTConfig) -> TrainingSpec:
    """The stress fixture's training step: the lesson's AdamW and schedule, with a weight decay on the matrices
    only (gains and biases excluded, as nanoGPT does), so that a decay applied where it is excluded (or the reverse)
    shows (`training_writer.decayed_spec`)."""
    from parity_harness._authoring.training_writer import decayed_spec
    from parity_reference.config import param_shapes

    return decayed_spec(cases, param_shapes(config))


def write_stress_fixture(root: Path, toy_root: Path, with_onnx: bool = True, progress: Progress = print) -> None:
    """Build the stress fixture from the toy at `toy_root` and write it to `root` (atomically: built beside
    it, checked, swapped in). `root` must be new, empty, or a stress fixture holding only its own files."""
    import torch

    from parity_harness._authoring.fixture_writer import owned_entries, write_fixture_files
    from parity_harness._authoring.training_writer import add_training
    from parity_harness._authoring.truth import DIGITS, truth_taps
    from parity_harness._core.safe_write import replace_directory, staging_directory
    from parity_harness._fixture.platforms import current_platform
    from parity_reference.run import reference_taps

    def say(message: str) -> None:
        progress(f"parity export --preset {PRESET}: {message}")

    start = time.perf_counter()
    owned_entries(root, PRESET)  # refused before the work, not after
    toy = load_fixture(toy_root)
    config = toy.config
    weights = stress_weights(toy.weights(), config)
    cases = [*toy.cases, *adversarial_cases(weights, config, toy.vocab, toy.cases)]
    golden: dict[Precision, Golden] = {}
    for precision in ("fp32", "fp64"):
        say(f"computing the {precision} goldens of {len(cases)} cases")
        golden[precision] = reference_taps(weights, config, cases, precision)
    say(f"the truth: mpmath at {DIGITS} digits, {len(cases)} cases")
    truth = {c.name: truth_taps(weights, config, c.tokens) for c in cases}
    # Rounded to 3 digits as recorded in the manifest; the tolerances are derived from the recorded numbers.
    budget = {tap: {k: float(f"{v:.3g}") for k, v in row.items()}
              for tap, row in error_budget(cases, toy.tap_names, golden, truth).items()}
    with staging_directory(root) as staging:
        write_fixture_files(
            staging, config=config, vocab=toy.vocab, cases=cases, weights=weights, golden=golden,
            onnx=with_onnx, tolerances=stress_tolerances(budget),
            provenance={
                "torch": torch.__version__.split("+")[0],
                "command": f"parity export --preset {PRESET}",
                "preset": PRESET,
                "weights": (f"the toy's weights (sha256 {toy.manifest['sha256'][toy.files['weights']][:16]}...) "
                            f"with wte + {OFFSET:g}, q columns of c_attn x {Q_SCALE:g}, c_fc x {MLP_SCALE:g}, "
                            f"MLP c_proj.weight / {MLP_SCALE:g} (harness/stress.py); golden: "
                            "reference.model.run_with_taps"),  # the names the committed fixture was made with: data
                "tolerances": (f"per tap, {BUDGET_FACTOR:g} x the measured error_budget, at least the toy's "
                               "defaults: fp32 from |golden.fp32 - golden.fp64|, fp64 from |golden.fp64 - truth| "
                               f"(mpmath, {DIGITS} digits)"),
                "error_budget": budget,
                "platform": current_platform(),
            },
            progress=say,
        )
        add_training(staging, weights, config, cases, stress_training(cases, config), progress=say)
        load_fixture(staging)  # validate what was written before replacing anything
        replace_directory(staging, root, owned_entries(root, PRESET))
    say(f"wrote {root} in {time.perf_counter() - start:.1f} s")


def check_stress_fixture(root: Path, toy_root: Path, progress: Progress = print) -> Verdict:
    """`parity export --check --preset toy-stress`: regenerate into a temporary directory and compare.

    The weights and cases must be identical (plain float64 arithmetic, rounded once: the same on
    every platform). The goldens bit for bit on the platform that made them; on another, within
    the fixture's own tolerances (its float64 errors are ~1e-9 on q, scores and logits, far above
    the toy's 64-epsilon cross-platform rule, which is why the tolerances were measured). The
    tolerances identical on that platform, within a factor 2 elsewhere; the ONNX graphs must
    reproduce the golden fp32 within them. Exit 0 when everything holds, 1 otherwise.
    """
    from parity_harness._authoring.onnx_export import check_onnx_against_golden
    from parity_harness._compare.judge import compare_tensors
    from parity_harness._core.errors import FixtureError
    from parity_harness._fixture.platforms import current_platform, describe, same_platform

    def say(message: str) -> None:
        progress(f"parity export --check --preset {PRESET}: {message}")

    fixture = load_fixture(root)
    if not is_stress(fixture):
        raise FixtureError(f"{fixture.manifest_path}: not a {PRESET} fixture (provenance.preset is not {PRESET!r})")
    recorded = fixture.manifest["provenance"].get("platform")
    same = same_platform(recorded, current_platform())
    say(f"goldens made on: {describe(recorded)}")
    say("rule: bit-identical (this is the platform that made them)" if same else
        "rule: made on another platform: goldens within the fixture's tolerances, tolerances within 2x")
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        write_stress_fixture(Path(tmp) / "stress", toy_root, with_onnx=False, progress=lambda _m: None)
        regen = load_fixture(Path(tmp) / "stress")
        if any(not np.array_equal(regen.weights()[k], v) for k, v in fixture.weights().items()):
            problems.append("weights differ from the toy's transformed")
        if regen.cases != fixture.cases:
            problems.append("cases differ (the adversarial search chose other sequences)")
        for precision in ("fp32", "fp64"):
            ours, theirs, tol = regen.golden(precision), fixture.golden(precision), fixture.tolerances[precision]
            bad = [f"{c.name}/{tap}" for c in fixture.cases if c.name in ours for tap in fixture.tap_names
                   if not (np.array_equal(ours[c.name][tap], theirs[c.name][tap]) if same else
                           compare_tensors(ours[c.name][tap], theirs[c.name][tap], tol.for_tap(tap).atol,
                                           tol.for_tap(tap).rtol).passed)]
            say(f"golden {precision}: {'reproduced' if not bad else f'{len(bad)} tensors differ, e.g. {bad[0]!r}'}")
            problems += [f"golden {precision}: {len(bad)} tensors differ, e.g. {bad[0]!r}"] if bad else []
            for tap in fixture.tap_names:
                a, b = regen.tolerances[precision].for_tap(tap).atol, tol.for_tap(tap).atol
                if (a != b) if same else not b / 2 <= a <= 2 * b:
                    problems.append(f"tolerance {precision} {tap}: measured {a:g} here, {b:g} in the manifest")
        from parity_harness._authoring.training_writer import check_training_goldens

        problems += check_training_goldens(fixture, regen, say)
    for line in check_onnx_against_golden(fixture):
        say(line)
    for problem in problems:
        print(f"parity export --check --preset {PRESET}: FAIL: {problem}")
    if problems:
        print(f"parity export --check --preset {PRESET}: the stress fixture is stale; regenerate it with "
              "`nox -s fixtures`")
        return Verdict.DISAGREE
    print(f"parity export --check --preset {PRESET}: OK, the stress fixture is reproducible")
    return Verdict.AGREE


def is_stress(fixture: Fixture) -> bool:
    """Whether a fixture was made by this preset."""
    prov = fixture.manifest.get("provenance")
    return isinstance(prov, dict) and prov.get("preset") == PRESET


__all__ = ["BUDGET_FACTOR", "MLP_SCALE", "OFFSET", "PRESET", "Q_SCALE", "adversarial_cases", "check_stress_fixture",
           "error_budget",
           "is_stress", "masked_gap", "stress_tolerances", "stress_weights", "write_stress_fixture"]

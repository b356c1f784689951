"""Training: batches, the loss definition, determinism, the CLI, and the full 4,000-step acceptance run."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from parity_reference.config import TOY
from parity_reference.grammar import entropy_per_word, sentences
from parity_reference.model import GPT, load_weights, run_with_taps
from parity_reference.train_tiny import (
    IGNORE,
    evaluate,
    heldout_sentences,
    main,
    make_batch,
    train,
    train_twins,
    training_sentences,
)

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)


def test_make_batch_pads_and_shifts() -> None:
    inputs, targets = make_batch([[1, 4, 9, 0], [2, 3, 5, 8, 1, 6, 0]], width=8)
    assert inputs.tolist() == [[0, 1, 4, 9, 0, 0, 0, 0], [0, 2, 3, 5, 8, 1, 6, 0]]
    assert targets.tolist() == [
        [1, 4, 9, 0, IGNORE, IGNORE, IGNORE, IGNORE],
        [2, 3, 5, 8, 1, 6, 0, IGNORE],
    ]
    short_in, short_tg = make_batch([[2, 3, 5, 8, 1, 6, 0]], width=3)  # truncated to width + 1 tokens
    assert short_in.tolist() == [[0, 2, 3]] and short_tg.tolist() == [[2, 3, 5]]


def test_heldout_differs_from_training() -> None:
    assert heldout_sentences(100, seed=0) != training_sentences(100, seed=0)
    assert heldout_sentences(100, seed=0) == heldout_sentences(100, seed=0)


def test_evaluate_is_mean_nll_per_predicted_token() -> None:
    """Sum of -ln p over every token after the start marker, over the count: computed by hand."""
    torch.manual_seed(5)
    model = GPT(TOY)
    sents = [list(s) for s, _ in sentences()[:7]]
    nll, count = 0.0, 0
    for s in sents:
        probs = run_with_taps(model.params(), TOY, [0, *s[:-1]])["probs"]  # (len(s), V)
        nll += sum(-math.log(float(probs[i, tok])) for i, tok in enumerate(s))
        count += len(s)
    assert evaluate(model, sents) == pytest.approx(nll / count, rel=1e-5)


def test_training_is_deterministic() -> None:
    a, b = train(TOY, seed=0, steps=50, progress=False), train(TOY, seed=0, steps=50, progress=False)
    c = train(TOY, seed=1, steps=50, progress=False)
    for name, value in a.params().items():
        assert torch.equal(value, b.params()[name]), name
    assert not torch.equal(a.params()["wte.weight"], c.params()["wte.weight"])


def test_twins_start_equal_and_worker_process_matches() -> None:
    twin = dataclasses.replace(TOY, causal=False)
    m0, u0 = train(TOY, seed=0, steps=0, progress=False), train(twin, seed=0, steps=0, progress=False)
    for name, value in m0.params().items():
        assert torch.equal(value, u0.params()[name]), name
    masked, unmasked, history = train_twins(seed=0, steps=30, progress=False, jobs=2)  # twin in a subprocess
    ref_unmasked = train(twin, seed=0, steps=30, progress=False)
    assert len(history) == 30
    for name, value in unmasked.params().items():
        assert torch.equal(value, ref_unmasked.params()[name]), name
    assert not torch.equal(masked.params()["wte.weight"], unmasked.params()["wte.weight"])


def test_bad_arguments() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--steps", "zero"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["--steps", "0"])
    assert exc.value.code == 2


@pytest.mark.slow
def test_acceptance_full_run(tmp_path: Path) -> None:
    """The lesson's experiment at full length: 4,000 steps per model (about 40 s on 2 cores).

    Its time is measured by `nox -s bench` (benchmarks/bench.py), not asserted here.
    """
    assert main(["--quiet", "--json", str(tmp_path / "r.json"), "--out", str(tmp_path / "w")]) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    h = entropy_per_word()
    assert r["grammar_entropy"] == pytest.approx(h)
    assert r["ln_vocab"] == pytest.approx(math.log(12))
    assert r["masked_eval_loss"] <= 1.03 * h
    assert r["unmasked_train_loss"] < 0.5 * h
    assert r["unmasked_causal_eval_loss"] > 2 * h
    weights = load_weights(tmp_path / "w" / "weights.safetensors", TOY)
    model = GPT(TOY)
    with torch.no_grad():
        for name, p in model.params().items():
            p.copy_(weights[name])
    assert evaluate(model, heldout_sentences()) == pytest.approx(r["masked_eval_loss"], rel=1e-6)

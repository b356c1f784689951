"""The toy grammar: vocabulary, exact enumeration, sampling, and the entropy computed two ways."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import pytest

from parity_reference.config import TOY
from parity_reference.grammar import (
    VOCAB,
    decode,
    encode,
    entropy_per_word,
    max_sentence_length,
    sample_sentences,
    sentences,
)


def test_vocabulary() -> None:
    assert len(VOCAB) == 12 == TOY.vocab_size
    assert VOCAB[0] == "."
    assert len(set(VOCAB)) == 12


def test_encode_decode() -> None:
    # the example of docs/fixture-format.md
    assert encode(". the cat eats the fish .") == [0, 1, 4, 7, 1, 6, 0]
    assert decode([0, 1, 4, 7, 1, 6, 0]) == ". the cat eats the fish ."
    assert encode(["a", "small", "bird"]) == [2, 10, 11]
    with pytest.raises(KeyError, match="unicorn"):
        encode("the unicorn")


def test_enumeration_is_a_distribution() -> None:
    table = sentences()
    assert abs(sum(p for _, p in table) - 1.0) < 1e-12
    assert all(p > 0 for _, p in table)
    seqs = [s for s, _ in table]
    assert len(set(seqs)) == len(seqs)  # one derivation per sentence
    for s in seqs:
        assert s[-1] == 0 and 0 not in s[:-1], s  # "." only at the end: no sentence prefixes another
        assert 4 <= len(s) <= max_sentence_length()
    assert max_sentence_length() + 1 <= TOY.n_ctx + 1  # [0] + sentence fits the context


def test_samples_are_in_the_enumeration_with_the_right_frequencies() -> None:
    table = dict(sentences())
    n = 50_000
    counts = Counter(tuple(s) for s in sample_sentences(n, seed=7))
    assert set(counts) <= set(table)
    for s, c in counts.most_common(20):  # frequencies within 5 standard deviations
        p = table[s]
        assert abs(c / n - p) < 5 * math.sqrt(p * (1 - p) / n), decode(s)


def test_sampling_is_seeded() -> None:
    assert sample_sentences(200, seed=3) == sample_sentences(200, seed=3)
    assert sample_sentences(200, seed=3) != sample_sentences(200, seed=4)


def test_entropy_by_the_chain_rule() -> None:
    """Independent of entropy_per_word: sum over prefixes of p(prefix) * H(next word | prefix)."""
    next_mass: dict[tuple[int, ...], dict[int, float]] = defaultdict(lambda: defaultdict(float))
    expected_len = 0.0
    for s, p in sentences():
        expected_len += p * len(s)
        for i in range(len(s)):
            next_mass[s[:i]][s[i]] += p
    total = 0.0
    for dist in next_mass.values():
        p_prefix = sum(dist.values())
        total += p_prefix * -sum(q / p_prefix * math.log(q / p_prefix) for q in dist.values())
    assert entropy_per_word() == pytest.approx(total / expected_len, abs=1e-12)
    assert 0.4 <= entropy_per_word() <= 0.9


def test_entropy_by_monte_carlo() -> None:
    """Sampled sentences' mean -ln p over mean length converges to the same number."""
    table = dict(sentences())
    sample = sample_sentences(100_000, seed=11)
    nll = sum(-math.log(table[tuple(s)]) for s in sample)
    words = sum(len(s) for s in sample)
    assert nll / words == pytest.approx(entropy_per_word(), abs=0.01)

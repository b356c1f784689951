"""The toy language: a small probabilistic grammar over exactly 12 words (pure Python, no torch).

Words (token ids in brackets; "." is id 0 and marks both the start and the end of a sentence):

    . [0]  the [1]  a [2]  big [3]  cat [4]  dog [5]  fish [6]  eats [7]  sees [8]  sleeps [9]
    small [10]  bird [11]

Rules (non-recursive, so the set of sentences is finite and can be enumerated exactly):

    S       -> NP_subj Verb NP_obj "."        (transitive verbs: eats, sees)
             | NP_subj "sleeps" "."
    NP      -> Det (Adj) Noun                 Det in {the, a}, Adj in {big, small}
    Verb    depends on the subject noun       (a cat mostly eats, a fish mostly sleeps, ...)
    Noun    depends on the adjective before it (big -> dog or cat, small -> cat, fish or bird)
    object  depends on the verb               (eats -> fish or bird, sees -> anything)

Every probability is skewed (see the tables below) so that a model has something to learn.

Sequences and entropy. A training or evaluation sequence is `[0] + sentence`, where the sentence
ends with its own "." (id 0); the leading "." is the start marker. The *predicted words* are every
token after the start marker: all words of the sentence and its final ".". The grammar's entropy
per predicted word is

    H = E[-ln p(sentence)] / E[len(sentence)]       (nats per predicted word, token-weighted)

which is what a loss averaged over all predicted tokens of many sentences (sum of NLL / number of
predicted tokens) converges to for a model that knows the grammar exactly. `parity_reference.train_tiny`
uses that same definition for every loss it reports.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

VOCAB: tuple[str, ...] = (
    ".",
    "the",
    "a",
    "big",
    "cat",
    "dog",
    "fish",
    "eats",
    "sees",
    "sleeps",
    "small",
    "bird",
)
END = 0  # "." : end of sentence, and the start marker of a sequence
_ID = {w: i for i, w in enumerate(VOCAB)}

# A conditional distribution: a tuple of (word, probability), probabilities summing to 1.
Dist = tuple[tuple[str, float], ...]

DET_SUBJ: Dist = (("the", 0.75), ("a", 0.25))
DET_OBJ: Dist = (("the", 0.6), ("a", 0.4))
ADJ: Dist = (("", 0.75), ("big", 0.15), ("small", 0.10))  # "" = no adjective
NOUN_GIVEN_ADJ: dict[str, Dist] = {
    "": (("cat", 0.45), ("dog", 0.35), ("fish", 0.1), ("bird", 0.1)),
    "big": (("dog", 0.7), ("cat", 0.3)),
    "small": (("cat", 0.4), ("bird", 0.4), ("fish", 0.2)),
}
VERB_GIVEN_SUBJ: dict[str, Dist] = {
    "cat": (("eats", 0.6), ("sees", 0.25), ("sleeps", 0.15)),
    "dog": (("sees", 0.6), ("sleeps", 0.3), ("eats", 0.1)),
    "fish": (("sleeps", 0.9), ("sees", 0.1)),
    "bird": (("sees", 0.5), ("eats", 0.5)),
}
OBJ_NOUN_GIVEN_VERB: dict[str, Dist] = {
    "eats": (("fish", 0.8), ("bird", 0.2)),
    "sees": (("cat", 0.4), ("dog", 0.3), ("bird", 0.2), ("fish", 0.1)),
}
OBJ_ADJ: Dist = (("", 0.85), ("big", 0.1), ("small", 0.05))
INTRANSITIVE = frozenset({"sleeps"})


def encode(words: str | Sequence[str]) -> list[int]:
    """Word(s) -> token ids; a string is split on whitespace. Unknown words raise KeyError."""
    seq = words.split() if isinstance(words, str) else list(words)
    try:
        return [_ID[w] for w in seq]
    except KeyError as exc:
        raise KeyError(f"unknown word {exc.args[0]!r}; the vocabulary is {VOCAB}") from None


def decode(ids: Sequence[int]) -> str:
    """Token ids -> the words joined by single spaces."""
    return " ".join(VOCAB[i] for i in ids)


def _derivations() -> Iterator[tuple[list[str], float]]:
    """Every derivation (words, probability) with non-zero probability; each sentence has exactly one."""
    for det, p_det in DET_SUBJ:
        for adj, p_adj in ADJ:
            for noun, p_noun in NOUN_GIVEN_ADJ[adj]:
                subj = [det, *([adj] if adj else []), noun]
                p_subj = p_det * p_adj * p_noun
                for verb, p_verb in VERB_GIVEN_SUBJ[noun]:
                    if verb in INTRANSITIVE:
                        yield [*subj, verb, "."], p_subj * p_verb
                        continue
                    for odet, p_odet in DET_OBJ:
                        for oadj, p_oadj in OBJ_ADJ:
                            for onoun, p_onoun in OBJ_NOUN_GIVEN_VERB[verb]:
                                obj = [odet, *([oadj] if oadj else []), onoun]
                                yield [*subj, verb, *obj, "."], p_subj * p_verb * p_odet * p_oadj * p_onoun


def sentences() -> list[tuple[tuple[int, ...], float]]:
    """Every sentence (token ids, ending with 0) with its exact probability; the probabilities sum to 1."""
    return [(tuple(encode(words)), p) for words, p in _derivations()]


def _pick(rng: random.Random, dist: Dist) -> str:
    u = rng.random()
    acc = 0.0
    for word, p in dist:
        acc += p
        if u < acc:
            return word
    return dist[-1][0]  # u within rounding of 1


def sample_sentences(n: int, seed: int) -> list[list[int]]:
    """`n` sentences (token ids, each ending with 0) drawn by walking the grammar; deterministic in `seed`."""
    rng = random.Random(seed)
    out: list[list[int]] = []
    for _ in range(n):
        det, adj = _pick(rng, DET_SUBJ), _pick(rng, ADJ)
        noun = _pick(rng, NOUN_GIVEN_ADJ[adj])
        verb = _pick(rng, VERB_GIVEN_SUBJ[noun])
        words = [det, *([adj] if adj else []), noun, verb]
        if verb not in INTRANSITIVE:
            odet, oadj = _pick(rng, DET_OBJ), _pick(rng, OBJ_ADJ)
            words += [odet, *([oadj] if oadj else []), _pick(rng, OBJ_NOUN_GIVEN_VERB[verb])]
        out.append([_ID[w] for w in words] + [END])
    return out


def max_sentence_length() -> int:
    """The longest sentence in tokens, its final "." included."""
    return max(len(s) for s, _ in sentences())


def entropy_per_word() -> float:
    """E[-ln p(sentence)] / E[len(sentence)], in nats per predicted word (see the module docstring)."""
    table = sentences()
    nll = sum(-p * math.log(p) for _, p in table)
    length = sum(p * len(s) for s, p in table)
    return nll / length

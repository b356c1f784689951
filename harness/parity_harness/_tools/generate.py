"""`parity generate`: greedy generation from one prompt on every backend that decodes, side by side.

Each backend prefills the prompt and decodes step by step from its own key/value cache, feeding
back its own greedy (argmax) token: the continuation a user of that implementation would see.
The words are printed one column per step, one line per backend x precision; exit 0 when every
line is the same, 1 when they differ, with the first differing step and the top-2 logit margin
there (a near-tie when the margin is within the float32 tolerance). One backend in two precisions
compares those two runs with each other (and says so); a single run compares nothing (exit 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

import numpy as np

from parity_harness._backends.boundary import AnyBackend, guarded
from parity_harness._compare.decoding import step_name
from parity_harness._core.errors import BackendFailed, ParityError
from parity_harness._core.status import Verdict
from parity_harness._fixture.decoding import DecodeRequest, encode_words, step_key, top2_margin

if TYPE_CHECKING:
    from parity_harness._backends.base import Precision
    from parity_harness._fixture.fixture import Fixture

REQUEST = "generate"


def run_generate(fixture: Fixture, prompt: str, steps: int, backends: Sequence[AnyBackend],
                 precisions: list[Precision], out: TextIO) -> Verdict:
    """Generate `steps` tokens after `prompt` (words) on each backend; print them side by side; the exit code."""
    tokens = encode_words(prompt, fixture.vocab)
    n_ctx = fixture.config.n_ctx
    if steps < 1:
        raise ParityError(f"--steps must be at least 1, got {steps}")
    if len(tokens) + steps - 1 > n_ctx:
        raise ParityError(f"--steps {steps} after a prompt of {len(tokens)} tokens needs {len(tokens) + steps - 1} "
                          f"positions, more than the context ({n_ctx}): at most {n_ctx + 1 - len(tokens)} steps")
    request = DecodeRequest(REQUEST, tokens, steps - 1, None)  # the prefill gives the first token
    rows: list[tuple[str, list[int], list[np.ndarray]]] = []
    unsupported: list[str] = []
    for backend in [guarded(b) for b in backends]:
        if not backend.decodes(fixture):
            unsupported.append(backend.name)
            continue
        for precision in precisions:
            if precision in backend.precisions:
                label = f"{backend.name} {precision}"
                logits = step_logits(label, backend.decoded(fixture, precision, [request])[REQUEST], steps,
                                     fixture.config.vocab_size)
                rows.append((label, [int(np.argmax(x)) for x in logits], logits))
    if not rows:
        raise ParityError("no selected backend decodes: nothing to generate "
                          f"(decoding not supported by {', '.join(unsupported) or 'any'})")
    if len(rows) < 2:  # one run agrees with itself: no comparison, never exit 0
        raise ParityError(f"parity generate: nothing compared: only one run decodes ({rows[0][0]}); select a "
                          "second backend, or both precisions of one (--precision all)")
    decoders = sorted({label.rsplit(" ", 1)[0] for label, _, _ in rows})
    vocab = fixture.vocab
    text = " ".join(vocab[t] for t in tokens)
    print(f"parity generate: prompt \"{text}\" ({len(tokens)} tokens), {steps} greedy steps", file=out)
    width = max(len(label) for label, _, _ in rows)
    cell = max(max(len(w) for w in vocab), len(f"{steps}")) + 1
    print(f"{'step':<{width}}  " + " ".join(f"{k + 1:<{cell}}" for k in range(steps)).rstrip(), file=out)
    for label, generated, _ in rows:
        print(f"{label:<{width}}  " + " ".join(f"{vocab[t]:<{cell}}" for t in generated).rstrip(), file=out)
    if unsupported:
        print(f"decoding not supported by: {', '.join(unsupported)}", file=out)
    if len(decoders) == 1:  # its precisions, compared with each other: a check of rounding, not of a port
        print(f"one backend decodes ({decoders[0]}): its {len(rows)} precisions are compared with each other, "
              "not with another implementation", file=out)
    broken = [(label, k) for label, _, logits in rows for k, x in enumerate(logits) if not np.isfinite(x).all()]
    if broken:
        label, k = broken[0]
        print(f"DIFFER: {label} gives non-finite logits (NaN or infinity) at {step_name(k)}", file=out)
        return Verdict.DISAGREE
    first = rows[0][1]
    differing = [k for k in range(steps) if any(g[k] != first[k] for _, g, _ in rows)]
    if not differing:
        words = " ".join(vocab[t] for t in first)
        print(f"AGREE: {len(rows)} backend x precision runs continue \"{text}\" with the same {steps} words: {words}",
              file=out)
        return Verdict.AGREE
    k = differing[0]
    tol = fixture.tolerances["fp32"].for_tap("logits")
    ref_label, _, ref_logits = rows[0]
    margin = top2_margin(ref_logits[k])
    limit = 2 * (tol.atol + tol.rtol * float(np.abs(ref_logits[k]).max()))
    words = ", ".join(f"{label} {vocab[g[k]]!r}" for label, g, _ in rows)
    verdict = ("a near-tie: within what the float32 tolerance lets two correct backends disagree on"
               if margin <= limit else "not a near-tie: a real disagreement")
    print(f"DIFFER: from word {k + 1} ({step_name(k)}): {words}; "
          f"top-2 logit margin there {margin:.1e} ({ref_label}), {verdict}", file=out)
    return Verdict.DISAGREE


def step_logits(label: str, result: dict[str, np.ndarray], steps: int, vocab_size: int) -> list[np.ndarray]:
    """Each step's logits [V] of one decoding result; BackendFailed (exit 2) for a missing or misshapen one."""
    logits: list[np.ndarray] = []
    for k in range(steps):
        x = result.get(step_key(k, "logits"))
        if x is None or x.shape != (vocab_size,):
            got = "nothing" if x is None else f"shape {list(x.shape)}"
            raise BackendFailed(f"{label}: decode returned {got} for {step_key(k, 'logits')}, "
                                f"expected logits of shape [{vocab_size}]")
        logits.append(x)
    return logits

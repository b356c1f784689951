"""The lesson's training objective and optimizer, as data and plain NumPy: what every backward is judged on.

Pure Python and NumPy, no torch: the spec a backend with a backward reads, the gradient goldens' names,
and the arithmetic every implementation must reproduce (parity_reference/backward.py computes the goldens
with torch autograd; parity_reference/numpy_backward.py by hand; both follow this module).

**The loss** of one case of T >= 2 tokens is `train_tiny.py`'s: the mean, over the T - 1 predicted cells
(position t predicts token t + 1), of the next-token cross-entropy -ln softmax(logits[t])[tokens[t + 1]].
A one-token case predicts nothing: it has no loss and no backward. The loss of a **batch** of cases is one
mean over all their cells (the sum of every case's cross-entropies over the total count), as the lesson's
padded batches compute it: a causal model sees no padding, so running the cases one by one is the same.

**Backward taps.** The gradient of a case's loss with respect to every forward tap on the loss's path,
named `"{tap}.grad"` (`blocks.1.hook_resid_mid.grad`), in the tap's shape: the adjoint of that node of the
reference's dataflow (`hook_scale`'s is the one through `normalized = centered / scale`). `probs` and the
logit lens are read-outs off the loss's path (their gradient is identically zero): they have none. Then
the gradient with respect to every parameter, `"{name}.grad"` under its Hugging Face name; a tied
embedding's gradient sums both uses (the lookup and the unembedding).

**Backward order** (`backward_names`): the first diverging gradient is the one nearest the loss. Tap
gradients come in reverse dataflow order (`logits.grad` first, `hook_embed.grad` last), then the
parameters' in reverse order: a parameter is a leaf, its gradient feeds nothing, so it is judged after
every tap gradient (a wrong parameter gradient with every tap gradient right is the parameter's own).

**The training step** (`TrainingSpec`): from the fixture's weights, `steps` steps of AdamW on the batch of
`cases`. Step s (1-based): zero the gradients; the batch loss and every parameter's gradient; the global
gradient norm sqrt(sum over all parameters of sum(g^2)); then, with lr = lr[s - 1] and t = s,

    p <- p * (1 - lr * weight_decay)          (parameters not in no_decay)
    m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
    p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

exactly torch.optim.AdamW's arithmetic. Recorded per step: `step{s}/loss` and `step{s}/grad_norm` (shape
[]) and every parameter after the update, `step{s}/{name}`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

GRAD_SUFFIX = ".grad"
OFF_PATH = ("probs", "logit_lens.")  # forward taps off the loss's path: no gradient


@dataclass(frozen=True)
class TrainingSpec:
    """The training step a fixture's goldens hold: AdamW from the fixture's weights on a fixed batch."""

    steps: int  # N >= 1 optimizer steps
    lr: tuple[float, ...]  # the learning rate of each step (the lesson's schedule at those steps)
    betas: tuple[float, float]  # (b1, b2)
    eps: float  # AdamW's epsilon, added to sqrt(v_hat)
    weight_decay: float  # decoupled: p <- p * (1 - lr * weight_decay)
    no_decay: tuple[str, ...]  # parameters excluded from weight decay (the lesson's one group: none)
    cases: tuple[str, ...]  # the batch: fixture case names, each of >= 2 tokens

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    def decays(self, param: str) -> bool:
        return self.weight_decay != 0.0 and param not in self.no_decay


def has_backward(tap: str) -> bool:
    """True when a forward tap is on the loss's path (every tap but `probs` and the logit lens)."""
    return not (tap == OFF_PATH[0] or tap.startswith(OFF_PATH[1]))


def grad_name(name: str) -> str:
    return name + GRAD_SUFFIX


def backward_names(forward_taps: Sequence[str], params: Sequence[str]) -> list[str]:
    """Every gradient a case's backward holds, in backward order: tap gradients from the loss back to the
    embedding, then the parameters' (leaves) in reverse order."""
    taps = [grad_name(t) for t in reversed(forward_taps) if has_backward(t)]
    return taps + [grad_name(p) for p in reversed(params)]


def step_key(step: int, name: str) -> str:
    """The key of step `step`'s (1-based) `name`: "loss", "grad_norm" or a parameter name."""
    return f"step{step}/{name}"


def train_names(spec: TrainingSpec, params: Sequence[str]) -> list[str]:
    """Every training record in judging order: per step, the loss, the gradient norm, then each parameter."""
    return [step_key(s, n) for s in range(1, spec.steps + 1) for n in ("loss", "grad_norm", *params)]


def predicted_cells(n_tokens: int) -> int:
    """How many cells a case of `n_tokens` predicts: n - 1 (position t predicts token t + 1)."""
    return max(0, n_tokens - 1)


def cross_entropy_sum(logits: np.ndarray, tokens: Sequence[int]) -> float:
    """Sum over the predicted cells of -ln softmax(logits[t])[tokens[t + 1]], in the logits' dtype."""
    z = logits[:-1]  # (T-1, V)
    shifted = z - z.max(axis=-1, keepdims=True)  # (T-1, V)
    lse = np.log(np.exp(shifted).sum(axis=-1))  # (T-1,)
    picked = shifted[np.arange(len(tokens) - 1), np.asarray(tokens[1:])]  # (T-1,)
    return float((lse - picked).sum())


def adam_bound(spec: TrainingSpec, step: int) -> float:
    """The most one AdamW update can move a parameter at `step` (1-based), in units of lr, whatever the
    gradients: |m_hat| / sqrt(v_hat) <= (1 - b1) / (1 - b1^t) * sqrt((1 - b2^t) / (1 - b2)) *
    sqrt(sum_k b1^(2(t-k)) / b2^(t-k)) (Cauchy-Schwarz; 1 at step 1)."""
    b1, b2 = spec.betas
    t = step
    weights = sum((b1 * b1 / b2) ** (t - k) for k in range(1, t + 1))
    return (1 - b1) / (1 - b1**t) * math.sqrt((1 - b2**t) / (1 - b2)) * math.sqrt(weights)


__all__ = [
    "GRAD_SUFFIX", "TrainingSpec", "adam_bound", "backward_names", "cross_entropy_sum", "grad_name", "has_backward",
    "predicted_cells", "step_key", "train_names",
]

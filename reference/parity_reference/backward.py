"""The backward and the training step of the reference, by torch autograd: what the gradient goldens hold.

Any family: the forward is the family's torch module (`families/*.json`, role `torch`), run with its taps
recorded and every parameter requiring a gradient; the gradients are `torch.autograd.grad` of the loss
(parity_reference/training.py) with respect to every tap on the loss's path and every parameter. The
training step is the lesson's own optimizer, `torch.optim.AdamW` (one tensor at a time, not fused),
with parameter groups for `no_decay`.

Every tensor is computed in the parameters' dtype: float32 for the fp32 golden, float64 (the float32
weights upcast) for the fp64 one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from parity_reference.families import family_of
from parity_reference.run import torch_dtype
from parity_reference.training import TrainingSpec, grad_name, has_backward, predicted_cells, step_key

if TYPE_CHECKING:
    from parity_reference.families import ModelConfig

# The lesson's schedule (train_tiny.py): its lr_at over its 4,000 steps, read at steps 0 .. N-1.
LESSON_STEPS = 4000


def lesson_spec(cases: Sequence[str], steps: int = 3, weight_decay: float = 0.0,
                no_decay: Sequence[str] = ()) -> TrainingSpec:
    """The lesson's AdamW (betas (0.9, 0.99), eps 1e-8, its warm-up) for `steps` steps on `cases`."""
    from parity_reference.train_tiny import WEIGHT_DECAY, lr_at

    del WEIGHT_DECAY  # the lesson's is 0.0: a fixture that decays states its own
    return TrainingSpec(steps, tuple(lr_at(s, LESSON_STEPS) for s in range(steps)), (0.9, 0.99), 1e-8,
                        weight_decay, tuple(no_decay), tuple(cases))


def default_threads() -> int:
    """torch's default intra-op thread count: OMP_NUM_THREADS if set, else the CPUs this process may run on."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@contextmanager
def _threads(threads: int | None) -> Iterator[None]:
    """torch on `threads` threads (None: torch's default count) for the block, the previous count restored after.
    One thread (the goldens' writer's): bit-reproducible reductions; more: faster, within tolerance only."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or default_threads())
    try:
        yield
    finally:
        if threads != 1:  # one thread stays set, as before this argument existed
            torch.set_num_threads(before)


def _leaf_params(weights: Mapping[str, Any], precision: str) -> dict[str, torch.Tensor]:
    dtype = torch_dtype(precision)
    return {k: torch.tensor(np.asarray(v), dtype=dtype).requires_grad_(True) for k, v in weights.items()}


def case_loss(logits: torch.Tensor, tokens: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The next-token cross-entropy of one case: logits (T, V), tokens (T,); mean or sum over T - 1 cells."""
    return torch.nn.functional.cross_entropy(logits[:-1], tokens[1:], reduction=reduction)  # ()


def case_gradients(weights: Mapping[str, Any], config: ModelConfig, tokens: Sequence[int],
                   precision: str, threads: int | None = 1, lens_rows: int | None = None) -> dict[str, np.ndarray]:
    """One case's loss (`"loss"`, shape []) and every gradient of training.backward_names, as arrays.
    `threads`: torch's thread count (None: its default); the goldens' one thread is bit-reproducible. `lens_rows`:
    the forward's `lens_rows` (None: every position): `probs` and the logit lens are off the loss's path, so the
    gradients are the same whatever it is; a GPT-2-sized vocabulary's [T, V] lens per stream costs seconds."""
    if predicted_cells(len(tokens)) < 1:
        raise ValueError(f"a case of {len(tokens)} token predicts nothing: it has no loss")
    with _threads(threads):
        return _case_gradients(weights, config, tokens, precision, lens_rows)


def _case_gradients(weights: Mapping[str, Any], config: ModelConfig, tokens: Sequence[int],
                    precision: str, lens_rows: int | None = None) -> dict[str, np.ndarray]:
    model = family_of(config).module("torch")
    params = _leaf_params(weights, precision)
    ids = torch.tensor(list(tokens), dtype=torch.int64)  # (T,)
    taps: dict[str, torch.Tensor] = {}
    logits = model.forward(params, config, ids, taps, lens_rows=lens_rows)  # (T, V)
    loss = case_loss(logits, ids)  # ()
    on_path = {name: t for name, t in taps.items() if has_backward(name) and t.requires_grad}
    unique = list({id(t): t for t in on_path.values()}.values())
    grads = torch.autograd.grad(loss, [*unique, *params.values()], allow_unused=True)
    by_id = {id(t): g for t, g in zip(unique, grads[: len(unique)], strict=True)}
    out: dict[str, np.ndarray] = {"loss": loss.detach().numpy().copy()}
    for name, t in taps.items():
        if not has_backward(name):
            continue
        if name in on_path:
            g = by_id[id(t)]
        elif name == "hook_pos_embed":  # a constant table added to the embedding: the same adjoint
            g = by_id[id(taps["hook_embed"])]
        else:
            raise ValueError(f"tap {name!r} is on the loss's path but does not depend on any parameter")
        out[grad_name(name)] = (torch.zeros_like(t) if g is None else g).detach().contiguous().numpy().copy()
    for (name, p), g in zip(params.items(), grads[len(unique):], strict=True):
        out[grad_name(name)] = (torch.zeros_like(p) if g is None else g).detach().contiguous().numpy().copy()
    return out


def batch_loss(params: Mapping[str, torch.Tensor], config: ModelConfig,
               batch: Sequence[Sequence[int]]) -> torch.Tensor:
    """One mean over every predicted cell of the batch: the sum of each case's cross-entropies over the count."""
    model = family_of(config).module("torch")
    total = sum(predicted_cells(len(t)) for t in batch)
    loss: torch.Tensor | None = None
    for tokens in batch:
        ids = torch.tensor(list(tokens), dtype=torch.int64)  # (T,)
        part = case_loss(model.forward(params, config, ids), ids, reduction="sum")  # ()
        loss = part if loss is None else loss + part
    assert loss is not None
    return loss / total  # ()


def train_steps(weights: Mapping[str, Any], config: ModelConfig, batch: Sequence[Sequence[int]],
                spec: TrainingSpec, precision: str, with_grads: bool = False,
                threads: int | None = 1) -> dict[str, np.ndarray]:
    """`spec.steps` steps of the lesson's AdamW: per step the loss, the gradient norm, every parameter after.

    `with_grads`: also each step's batch gradient of every parameter, `step{s}/{name}.grad` (what the goldens keep
    for the judge: an element whose gradient is zero there moves by AdamW's rounding-driven step). `threads`:
    torch's thread count (None: its default); the goldens' one thread is bit-reproducible."""
    with _threads(threads):
        params = _leaf_params(weights, precision)
        return adamw_steps(params, spec, lambda: batch_loss(params, config, batch), with_grads=with_grads)


def adamw_steps(params: Mapping[str, torch.Tensor], spec: TrainingSpec, loss_of_batch: Callable[[], torch.Tensor],
                backward: Callable[[torch.Tensor], None] | None = None,
                with_grads: bool = False) -> dict[str, np.ndarray]:
    """The training loop every torch backward shares: `spec.steps` steps of torch.optim.AdamW (one tensor at a time,
    a group without decay for `no_decay`) on `params` (leaf tensors requiring gradients), each step's loss from
    `loss_of_batch()` and its gradients from `backward(loss)` (default `loss.backward()`). Returns the training
    records (`step{s}/loss`, `step{s}/grad_norm`, `step{s}/{param}`; with `with_grads` also `step{s}/{param}.grad`)."""
    decay = [p for n, p in params.items() if spec.decays(n)]
    rest = [p for n, p in params.items() if not spec.decays(n)]
    groups: list[dict[str, Any]] = [{"params": rest, "weight_decay": 0.0}]
    if decay:
        groups.insert(0, {"params": decay, "weight_decay": spec.weight_decay})
    opt = torch.optim.AdamW(groups, lr=spec.lr[0], betas=spec.betas, eps=spec.eps, foreach=False, fused=False)
    out: dict[str, np.ndarray] = {}
    for s in range(1, spec.steps + 1):
        for group in opt.param_groups:
            group["lr"] = spec.lr[s - 1]
        opt.zero_grad(set_to_none=True)
        loss = loss_of_batch()  # ()
        if backward is None:
            loss.backward()  # type: ignore[no-untyped-call]
        else:
            backward(loss)
        with torch.no_grad():
            sq = torch.zeros((), dtype=loss.dtype)  # ()
            for p in params.values():
                assert p.grad is not None
                sq = sq + (p.grad * p.grad).sum()
            norm = torch.sqrt(sq)  # ()
        grads = {n: p.grad.clone() for n, p in params.items() if p.grad is not None} if with_grads else {}
        opt.step()
        out[step_key(s, "loss")] = loss.detach().numpy().copy()
        out[step_key(s, "grad_norm")] = norm.numpy().copy()
        for name, p in params.items():  # the last step's parameters are not copied: nothing moves them again
            value = p.detach().numpy()  # (a GPT-2-sized step's optimizer state is freed before a copy is taken)
            out[step_key(s, name)] = value if s == spec.steps else value.copy()
            if with_grads:
                out[step_key(s, grad_name(name))] = grads[name].numpy().copy()
    return out


__all__ = ["LESSON_STEPS", "adamw_steps", "batch_loss", "case_gradients", "case_loss", "default_threads", "lesson_spec",
           "train_steps"]

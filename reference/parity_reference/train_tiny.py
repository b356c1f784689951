"""Train the toy model on the grammar, with and without the causal mask (the lesson's experiment).

    python -m parity_reference.train_tiny [--steps 4000] [--seed 0] [--json PATH] [--out DIR] [--quiet]

Two identical models (same seed, same initial weights, same batches) are trained on CPU: the
masked TOY model and its unmasked twin (`causal=False`). Both are then scored on held-out
sentences drawn with a different seed. Every loss here is the grammar module's definition: the
sum of -ln p over the predicted tokens (every token after the start marker "."), divided by the
number of predicted tokens; padding is ignored.

`train(config, seed, steps)` and `heldout_sentences(n, seed)` are the API the fixture exporter uses.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import multiprocessing
import os
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from parity_reference.config import TOY, GPTConfig
from parity_reference.grammar import VOCAB, entropy_per_word, max_sentence_length, sample_sentences
from parity_reference.model import GPT, forward, save_weights

BATCH = 32  # sentences per step
LR = 1e-2  # peak learning rate (AdamW)
WARMUP = 100  # linear warm-up steps, then cosine decay to LR_MIN
LR_MIN = 1e-4
WEIGHT_DECAY = 0.0
IGNORE = -100  # target id of padding cells
HELDOUT_SEED_OFFSET = 1_000_003  # held-out sentences come from seed + this, never a training seed
N_HELDOUT = 4000
LESSON = {
    "grammar_entropy": 0.526,
    "masked_eval_loss": 0.527,
    "unmasked_train_loss": 0.059,
    "unmasked_causal_eval_loss": 3.088,
    "ln_vocab": math.log(12),
}


def heldout_sentences(n: int = N_HELDOUT, seed: int = 0) -> list[list[int]]:
    """Sentences for evaluation and fixtures, drawn with a seed no training run uses."""
    return sample_sentences(n, seed + HELDOUT_SEED_OFFSET)


def training_sentences(n: int, seed: int = 0) -> list[list[int]]:
    """The training stream of a run with this seed: step s uses sentences [s*BATCH, (s+1)*BATCH)."""
    return sample_sentences(n, seed)


def make_batch(sents: Sequence[Sequence[int]], width: int) -> tuple[Tensor, Tensor]:
    """Sequences `[0] + sentence`, truncated to width + 1, as inputs and next-token targets.

    Every row is padded to the same `width` (inputs with 0, targets with IGNORE), so that the
    unmasked model, which sees the padding, computes the same thing whatever the batch holds.
    """
    seqs = [[0, *sent][: width + 1] for sent in sents]
    lens = np.array([len(q) for q in seqs], dtype=np.int64)  # (N,)
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lens.sum()))  # (sum,)
    rows = np.repeat(np.arange(len(seqs)), lens)  # (sum,): row of each token
    starts = np.repeat(np.cumsum(lens) - lens, lens)  # (sum,): offset of each token's row in `flat`
    grid = np.full((len(seqs), width + 1), -1, dtype=np.int64)  # (N, W+1), -1 = padding
    grid[rows, np.arange(flat.size) - starts] = flat
    inputs = torch.from_numpy(np.where(grid[:, :-1] < 0, 0, grid[:, :-1]))  # (N, W)
    targets = torch.from_numpy(np.where(grid[:, 1:] < 0, IGNORE, grid[:, 1:]))  # (N, W)
    return inputs, targets


def nll_sum_count(logits: Tensor, targets: Tensor) -> tuple[Tensor, int]:
    """Sum of -ln p(target) over non-pad cells, and how many cells that is."""
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )  # ()
    return total, int((targets != IGNORE).sum())


def seq_width(config: GPTConfig) -> int:
    """Input width of every batch: the longest `[0] + sentence` minus its last token, within n_ctx."""
    return min(config.n_ctx, max_sentence_length())


def lr_at(step: int, steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    t = (step - WARMUP) / max(1, steps - WARMUP)
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1.0 + math.cos(math.pi * t))


class _Progress:
    """A one-line progress report on stderr, rewritten with a carriage return."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.start = time.perf_counter()

    def update(self, step: int, loss: float) -> None:
        if not self.enabled:
            return
        rate = step / max(time.perf_counter() - self.start, 1e-9)
        sys.stderr.write(f"\r{self.label}: step {step:5d}/{self.total}  loss {loss:.4f}  {rate:6.0f} it/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def train(
    config: GPTConfig,
    seed: int = 0,
    steps: int = 4000,
    progress: bool = True,
    history: list[float] | None = None,
) -> GPT:
    """Train a model of `config` on the grammar from `seed`; deterministic (bit-identical weights).

    The initial weights and the batches depend on `seed` only, not on `config.causal`: a masked
    model and its unmasked twin start from the same weights and see the same data. If `history`
    is given, the training loss of every step is appended to it.
    """
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = GPT(config)
    inputs, targets = make_batch(training_sentences(steps * BATCH, seed), seq_width(config))  # (S*B, W) each
    opt = torch.optim.AdamW(
        model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=WEIGHT_DECAY, fused=True
    )
    params = model.params()
    bar = _Progress(steps, "masked" if config.causal else "unmasked", progress)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps)
        rows = slice(step * BATCH, (step + 1) * BATCH)
        logits = forward(params, config, inputs[rows])  # (B, W, V)
        total, count = nll_sum_count(logits, targets[rows])
        loss = total / count  # mean NLL per predicted token
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        value = loss.item()
        if history is not None:
            history.append(value)
        if step % 50 == 0 or step == steps - 1:
            bar.update(step + 1, value)
    bar.close()
    return model


def _train_worker(
    config: dict[str, object], seed: int, steps: int
) -> tuple[dict[str, np.ndarray], list[float]]:
    """`train` in a worker process: the weights as NumPy arrays (bit-exact) and the loss history."""
    history: list[float] = []
    model = train(GPTConfig.from_dict(config), seed, steps, progress=False, history=history)
    return {k: v.detach().numpy().copy() for k, v in model.params().items()}, history


def train_twins(
    seed: int = 0, steps: int = 4000, progress: bool = True, jobs: int = 2
) -> tuple[GPT, GPT, list[float]]:
    """The masked TOY model and its unmasked twin, the twin in a second process when `jobs` is 2.

    Each process computes with one thread, so the weights are the same bit for bit either way.
    Returns (masked, unmasked, the unmasked model's per-step training losses).
    """
    twin = dataclasses.replace(TOY, causal=False)
    if jobs < 2:
        history: list[float] = []
        masked = train(TOY, seed, steps, progress)
        return masked, train(twin, seed, steps, progress, history), history
    ctx = multiprocessing.get_context("spawn")  # not fork: torch's thread pools do not survive a fork
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        future = pool.submit(_train_worker, twin.to_dict(), seed, steps)
        masked = train(TOY, seed, steps, progress)
        if progress:
            sys.stderr.write("waiting for the unmasked twin (second process)...\n")
        state, history = future.result()
    unmasked = GPT(twin)
    with torch.no_grad():
        for name, p in unmasked.params().items():
            p.copy_(torch.from_numpy(state[name]))
    return masked, unmasked, history


def evaluate(model: GPT, sents: Sequence[Sequence[int]], causal: bool | None = None) -> float:
    """Mean NLL per predicted token over `sents`; `causal` overrides the model's own mask setting."""
    config = model.config if causal is None else dataclasses.replace(model.config, causal=causal)
    inputs, targets = make_batch(sents, seq_width(config))  # (N, W) each
    with torch.no_grad():
        logits = forward(model.params(), config, inputs)  # (N, W, V)
        total, count = nll_sum_count(logits, targets)
    return float(total) / count


def run_experiment(
    seed: int = 0, steps: int = 4000, progress: bool = True, jobs: int = 2
) -> tuple[dict[str, float], GPT]:
    """Both models, trained and evaluated: the numbers of the lesson's table, and the masked model."""
    t0 = time.perf_counter()
    masked, unmasked, unmasked_history = train_twins(seed, steps, progress, jobs)
    train_seconds = time.perf_counter() - t0
    heldout = heldout_sentences(N_HELDOUT, seed)
    train_sample = training_sentences(N_HELDOUT, seed)  # the first 4,000 sentences the models trained on
    last = unmasked_history[-100:]
    results = {
        "grammar_entropy": entropy_per_word(),
        "masked_eval_loss": evaluate(masked, heldout),
        "unmasked_train_loss": evaluate(unmasked, train_sample),
        "unmasked_causal_eval_loss": evaluate(unmasked, heldout, causal=True),
        "ln_vocab": math.log(len(VOCAB)),
        "unmasked_train_loss_last100": sum(last) / len(last),
        "masked_train_loss_eval": evaluate(masked, train_sample),
        "unmasked_eval_loss_unmasked": evaluate(unmasked, heldout),
        "steps": float(steps),
        "seed": float(seed),
        "batch": float(BATCH),
        "train_seconds": train_seconds,
    }
    return results, masked


def format_table(r: dict[str, float]) -> str:
    rows = [
        ("grammar entropy (nats/word)", "grammar_entropy"),
        ("masked model, held-out loss", "masked_eval_loss"),
        ("unmasked model, training loss (*)", "unmasked_train_loss"),
        ("unmasked model used causally, held-out", "unmasked_causal_eval_loss"),
        ("uniform over 12 words, ln 12", "ln_vocab"),
    ]
    lines = [f"{'':42s} {'ours':>8s} {'lesson':>8s}"]
    lines += [f"{label:42s} {r[key]:8.3f} {LESSON[key]:8.3f}" for label, key in rows]
    lines.append(
        f"(*) full evaluation of the final weights on the first {N_HELDOUT:,} training sentences; "
        f"mean of the last 100 steps' batch losses: {r['unmasked_train_loss_last100']:.3f}"
    )
    e = r["grammar_entropy"]
    lines.append(
        f"masked / entropy = {r['masked_eval_loss'] / e:.4f} (<= 1.03), unmasked train / entropy = "
        f"{r['unmasked_train_loss'] / e:.4f} (< 0.5), unmasked causal / entropy = "
        f"{r['unmasked_causal_eval_loss'] / e:.3f} (> 2)"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m parity_reference.train_tiny", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=4000, help="training steps per model (default 4000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the data (default 0)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON here")
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="save the masked model to DIR/weights.safetensors"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--jobs", type=int, choices=(1, 2), default=2, help="2: train the unmasked twin in a second process"
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    problem = _output_problem(args.out, args.json)  # before minutes of training, never after
    if problem:
        parser.error(problem)
    t0 = time.perf_counter()
    results, masked = run_experiment(args.seed, args.steps, progress=not args.quiet, jobs=args.jobs)
    results["seconds"] = time.perf_counter() - t0
    print(format_table(results))
    print(f"{args.steps:,} steps x 2 models, seed {args.seed}, {results['seconds']:.1f} s")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        _write_atomic(args.out / "weights.safetensors", lambda tmp: save_weights(masked.params(), tmp))
        print(f"wrote {args.out / 'weights.safetensors'}")
    if args.json is not None:
        text = json.dumps(results, indent=2) + "\n"
        _write_atomic(args.json, lambda tmp: tmp.write_text(text))
        print(f"wrote {args.json}")
    return 0


def _output_problem(out: Path | None, json_path: Path | None) -> str | None:
    """Why `--out` or `--json` cannot be written (checked before training), or None.

    `--out` must not be a fixture directory: its weights are listed, hashed and sealed in its manifest, and
    only `parity export` rewrites a fixture (whole, atomically). `--json`'s directory must exist.
    """
    if out is not None and (out / "manifest.json").exists():
        return f"--out {out}: is a fixture directory (it has a manifest.json); rewrite a fixture with `parity export`"
    if out is not None and out.exists() and not out.is_dir():
        return f"--out {out}: not a directory"
    if json_path is not None:
        if json_path.is_dir():
            return f"--json {json_path}: is a directory"
        if not json_path.resolve().parent.is_dir():
            return f"--json {json_path}: its directory does not exist"
        if out is not None and json_path.resolve() == (out / "weights.safetensors").resolve():
            return f"--json {json_path}: is where --out writes the weights"
    return None


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` into a temporary file beside `path`, then renamed over it: never a half-written file."""
    real = Path(os.path.realpath(path))
    name = real.parent / f".{real.name}.{secrets.token_hex(4)}.tmp"
    try:
        write(name)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(name, 0o666 & ~umask)  # safetensors makes its file private; the umask decides, as for any file
        os.replace(name, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


if __name__ == "__main__":
    raise SystemExit(main())

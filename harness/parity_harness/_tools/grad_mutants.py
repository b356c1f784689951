"""The backward mutants: bugs of a training port, each a patch of the hand-written NumPy backward
(parity_reference/numpy_backward.py, the GPT-2 family's), judged by the gradient check (`parity run --grad`).

`MUTANTS`, in the order of issue 39: five bugs of the backward (each caught by the backward check at the gradient
nearest the loss that it breaks: `expected_tap` is a gradient name of `Fixture.grad_names()`), then three of the
training step (the per-case backward is right; the training check catches them at a step: `expected_step`, and
`expected_tap` is a training record, "loss", "grad_norm" or a parameter). None changes the forward pass: the forward
checks alone must pass every one. `caught_on` "grad" runs on the toy, "grad-stress" on fixtures/toy-stress (the
only committed GPT-2 fixture whose training spec decays some parameters and not others; the toy's weight decay is
0.0, so a decay bug is invisible there, which the selftest checks too).

Each one's cause must be named from the numbers at its first divergence (parity_harness/_compare/grad_causes.py
predicts every known bug from the goldens); `CAUSE_CLASS` is what that cause must say, checked by the selftest.
They are kept apart from the forward catalog (`mutants.CATALOG`): `mutants.by_name` selects from both, and the
selftest reports them in their own table and JSON section ("backward"), so the forward catalog's numbers stay.
"""

from __future__ import annotations

from parity_harness._tools.mutants import CaughtOn, Mutant

FAMILY = "gpt2"
FILE = "numpy_backward.py"  # patched in a copy of parity_reference/, run by the numpy backend's own grad and train


def _grad(name: str, patches: tuple[tuple[str, str], ...], description: str, tap: str, step: int | None = None,
          caught_on: CaughtOn = "grad") -> Mutant:
    return Mutant(name, "numpy", FILE, patches, description, tap, False, step, caught_on, family=FAMILY)


_NOT_ZEROED = ("for s in range(1, spec.steps + 1):\n"
               "        grads = {name: np.zeros_like(p) for name, p in current.items()}")

MUTANTS: tuple[Mutant, ...] = (
    _grad("np-grad-tied-embedding-one-use",
          (('grads[grad_name("wte.weight")] = dhead + dlookup', 'grads[grad_name("wte.weight")] = dhead'),),
          "the tied embedding's gradient from one use only (the unembedding's), the lookup's share dropped",
          "wte.weight.grad"),
    _grad("np-grad-ln-no-mean-term",
          (("dx = (dn - dn.mean(axis=-1, keepdims=True) - normalized", "dx = (dn - normalized"),),
          "LayerNorm's backward without the mean term: dx = (dn - n mean(dn n)) / s, the gradient through the mean "
          "dropped", "blocks.1.hook_resid_post.grad"),
    _grad("np-grad-softmax-from-input",
          (("dscores = softmax_backward(pattern, dpattern)",
            'dscores = softmax_backward(taps[f"{name}.hook_attn_scores"], dpattern)'),),
          "softmax's backward from its input (the scores, -inf at masked cells) instead of its output (the pattern)",
          "blocks.1.attn.hook_attn_scores.grad"),
    _grad("np-grad-gelu-tanh-derivative",
          (("out: np.ndarray = dout * (cdf + x * pdf)", "out: np.ndarray = gelu_new_backward(x, dout)"),),
          "the exact GELU's derivative taken from the tanh approximation (gelu_new's) while the forward is exact",
          "blocks.1.mlp.hook_pre.grad"),
    _grad("np-grad-attention-scale-missing",
          (("dqk = dscores / x.dtype.type(math.sqrt(dh))", "dqk = dscores"),),
          "the attention scale 1/sqrt(d_head) left out of the backward: the q and k gradients sqrt(d_head) x too big",
          "blocks.1.attn.hook_k.grad"),
    _grad("np-grad-not-zeroed",
          ((_NOT_ZEROED, "grads = {name: np.zeros_like(p) for name, p in current.items()}\n"
                         "    for s in range(1, spec.steps + 1):\n        grads = grads"),),
          "gradients not zeroed between training steps: step s updates with the sum of steps 1..s's gradients",
          "grad_norm", step=2),
    _grad("np-grad-adam-bias-correction-off-by-one",
          (("step_size = lr / (1.0 - b1**t)", "step_size = lr / (1.0 - b1**(t + 1))"),
           ("(1.0 - b2**t) ** 0.5", "(1.0 - b2**(t + 1)) ** 0.5")),
          "AdamW's bias correction one step ahead: 1 - b^(t+1) for 1 - b^t", "wte.weight", step=1),
    _grad("np-grad-decay-every-param",
          (("spec.lr[s - 1], spec, spec.decays(name))", "spec.lr[s - 1], spec, spec.weight_decay != 0.0)"),),
          "weight decay applied to every parameter, the gains and biases the spec excludes (no_decay) included",
          "h.0.ln_1.weight", step=1, caught_on="grad-stress"),
)

# What each mutant's cause (named from the numbers, grad_causes.py) must say: a substring of the likely cause.
CAUSE_CLASS: dict[str, str] = {
    "np-grad-tied-embedding-one-use": "tied embedding gradient from one use",
    "np-grad-ln-no-mean-term": "LayerNorm backward without the mean term",
    "np-grad-softmax-from-input": "softmax backward from its input",
    "np-grad-gelu-tanh-derivative": "GELU derivative of the tanh approximation",
    "np-grad-attention-scale-missing": "attention scale missing in the backward",
    "np-grad-not-zeroed": "gradients not zeroed between steps",
    "np-grad-adam-bias-correction-off-by-one": "AdamW bias correction off by one",
    "np-grad-decay-every-param": "weight decay on excluded parameters",
}
